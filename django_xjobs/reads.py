"""The operations console's reads: what the admin pages and ``manage.py xjobs`` show.

One module serves both, so the browser and the command line never disagree (docs/console.md,
"The same from a terminal"): the admin renders these records as HTML, the command prints them
or dumps them as JSON. Everything here reads; the console's writes are the operator actions of
:mod:`api` (cancel, retry, run_now, delete_finished), which go through the engine's fenced
statements.

Where the numbers come from:

* the dashboard's per-queue live buckets are the engine's ``queue_depth`` (the live rows'
  partial indexes only, never the history); what each queue finished in the last 24 hours and
  the charts are the counters (:mod:`counters`), whose cost does not grow with the jobs table.
  The counters count every tenant's jobs, so under a tenant scope the finished counts are read
  from the rows instead (``x_jobs_finished_idx``, per state) and the charts are not shown;
* the health figures of the tables and of the server are the engine's monitoring statements
  (``tables_health``, ``xmin_horizon``); the rest are read-only ORM reads of the models;
* time is the database's: "expired", "due" and "recently" compare with ``now()`` of the server,
  the clock every lease is measured on.

Tenant scope (``XJOBS["ADMIN_TENANT_SCOPE"]``): a callable ``(request) -> set of tenant ids |
None``. With a set, every read here is filtered to those tenants' rows, and what has no tenant
column (events, slots, backfills, the scheduler, the database's own health) is not shown at all:
it may name other tenants' data (``tenant:acme`` slot keys) or the fleet's hosts.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, overload
from uuid import UUID

from django.conf import settings as django_settings
from django.db.models import (
    Count,
    DateTimeField,
    ExpressionWrapper,
    Q,
    Sum,
    TextField,
    Value,
)
from django.db.models.functions import Cast, Left, Length, Now
from django.utils import timezone
from django.utils.module_loading import import_string

from . import conf, counters, registry, scheduler, slots, versions
from .engines import get_engine
from .exceptions import ConfigurationError, JobNotFound
from .models import Backfill, Job, JobEvent, JobLease, JobStep, OutboxEntry, SchedulerLeader
from .records import (
    DEFAULT_MAX_STALL,
    TERMINAL_STATES,
    FleetRecord,
    HistoryTable,
    QueueDepth,
    TableHealth,
    UnknownWait,
    WorkerRecord,
    XminHolder,
    decode_stored_json,
)

TenantScope = frozenset[str] | None

# How far back "recently" reaches for rescues, and how many rows a panel lists.
# The dashboard's finished counts: the counters' "day" window (24 hourly buckets).
FINISHED_WINDOW = timedelta(hours=24)
RESCUE_WINDOW = timedelta(hours=1)
PANEL_ROWS = 10
LAPSED_ROWS = 50

# Health thresholds (docs/console.md, "The health panel", says what to do about each).
DEAD_RATIO_WARN, DEAD_RATIO_BAD = 0.2, 0.5
DEAD_TUPLES_MIN = 10_000  # below this, a high ratio is a small table between two vacuums
XID_AGE_WARN = 0.5  # of autovacuum_freeze_max_age
XID_AGE_BAD = 1.0
XACT_AGE_WARN, XACT_AGE_BAD = 300.0, 3600.0  # seconds
IDLE_IN_XACT_WARN = 60.0
OUTBOX_AGE_WARN = 60.0
# A worker reads as stalled after this long without a heartbeat, a round of its loop, or a
# claim while its queues had due jobs: the default of `manage.py xjobs health --max-stall`.
WORKER_MAX_STALL = DEFAULT_MAX_STALL

OK, WARN, BAD = "ok", "warn", "bad"


# ------------------------------------------------------------------------------ tenant scope --


def tenant_scope(request: Any) -> TenantScope:
    """The tenants this request may see and touch, or None for all of them.

    ``XJOBS["ADMIN_TENANT_SCOPE"]`` is a callable or its dotted path. It must return None or a
    collection of tenant id strings; anything else is a configuration error, raised (rather
    than read as "everything") so a broken scope never shows one tenant another's jobs.
    """
    scope_fn = _scope_callable()
    if scope_fn is None:
        return None
    value = scope_fn(request)
    if value is None:
        return None
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise ConfigurationError(
            f'XJOBS["ADMIN_TENANT_SCOPE"] returned {value!r}; it must return None (every '
            "tenant) or a set of tenant id strings"
        )
    tenants = frozenset(value)
    bad = [t for t in tenants if not isinstance(t, str)]
    if bad:
        raise ConfigurationError(
            f'XJOBS["ADMIN_TENANT_SCOPE"] returned non-string tenant ids {bad[:5]!r}'
        )
    return tenants


def _scope_callable() -> Callable[[Any], Any] | None:
    raw = conf.get().raw.get("ADMIN_TENANT_SCOPE")
    if raw is None:
        return None
    if callable(raw):
        return raw  # type: ignore[no-any-return]

    try:
        found = import_string(raw)
    except ImportError as exc:
        raise ConfigurationError(
            f'XJOBS["ADMIN_TENANT_SCOPE"] = {raw!r} cannot be imported: {exc}'
        ) from exc
    if not callable(found):
        raise ConfigurationError(f'XJOBS["ADMIN_TENANT_SCOPE"] = {raw!r} is not callable')
    return found  # type: ignore[no-any-return]


def scoped(queryset: Any, tenants: TenantScope, field_name: str = "tenant_id") -> Any:
    """``queryset`` restricted to the scope's tenants (unchanged without a scope)."""
    if tenants is None:
        return queryset
    return queryset.filter(**{f"{field_name}__in": sorted(tenants)})


def steps_scoped(queryset: Any, tenants: TenantScope) -> Any:
    """Steps have no tenant column: a step is in scope when its run's job is."""
    if tenants is None:
        return queryset

    return queryset.filter(run_id__in=Job.objects.filter(tenant_id__in=sorted(tenants))
                           .values("run_id"))


# ----------------------------------------------------------------------------------- records --


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueRow(QueueDepth):
    """One queue on the dashboard: its live buckets and the age of its oldest due job
    (``queue_depth``), and what it finished in the last 24 hours: the counters' day window, or
    under a tenant scope the finished rows of that window (the counters count every tenant's
    jobs). ``failed_24h`` counts failed runs (retried, or the one a job died of), which only
    the counters know: None under a tenant scope."""

    done_24h: int = 0
    failed_24h: int | None = 0
    dead_24h: int = 0
    cancelled_24h: int = 0

    @property
    def live(self) -> int:
        return self.ready + self.delayed + self.running + self.suspended + self.blocked


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaderRow:
    lock_key: str
    holder: str
    expires_at: datetime
    live: bool  # the lease has not expired: a scheduler leads right now


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleRow:
    """One cron task: its watermark (the last occurrence fired) and whether it is paused.

    ``next_fire_at`` is the next occurrence after the watermark (None: paused, or a state row
    of a task no longer declared).
    """

    task: str
    last_fired_at: datetime | None
    paused: bool
    updated_at: datetime | None
    next_fire_at: datetime | None = None
    configured: bool = False  # named in XJOBS["SCHEDULE"] / a @job(cron=...)
    # Its overlap policy and the occurrences that policy did not enqueue, with the latest
    # (docs/scheduling.md, "Overlap").
    overlap: str | None = None
    overlap_skipped: int = 0
    overlap_skipped_at: datetime | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class JobBrief:
    """A job in a panel: enough to recognise it and to open it."""

    id: Any
    name: str
    queue: str
    state: str
    attempt: int
    max_attempts: int
    tenant_id: str | None
    claimed_by: str | None
    at: datetime | None  # what "when" means depends on the panel (finished, lease expiry)
    rescues: int = 0
    error: str | None = None  # the last line of last_error

    @classmethod
    def of(cls, job: Any, at: datetime | None) -> JobBrief:
        return cls(id=job.id, name=job.name, queue=job.queue, state=job.state,
                   attempt=job.attempt, max_attempts=job.max_attempts, tenant_id=job.tenant_id,
                   claimed_by=job.claimed_by, at=at, rescues=job.rescues,
                   error=error_summary(job.last_error))


@dataclass(frozen=True, slots=True, kw_only=True)
class Dashboard:
    now: datetime
    tenants: TenantScope
    queues: list[QueueRow]
    outbox_pending: int
    outbox_oldest_seconds: float | None
    leaders: list[LeaderRow]  # empty under a tenant scope
    schedules: list[ScheduleRow]  # empty under a tenant scope
    workers: list[WorkerRecord]  # x_workers; empty under a tenant scope
    failures: list[JobBrief]

    @property
    def totals(self) -> QueueRow:
        sums: dict[str, Any] = {
            f.name: sum(getattr(q, f.name) or 0 for q in self.queues)
            for f in dataclasses.fields(QueueRow)
            if f.name not in ("queue", "oldest_ready_age", "failed_24h")}
        ages = [q.oldest_ready_age for q in self.queues if q.oldest_ready_age is not None]
        failed = [q.failed_24h for q in self.queues]
        return QueueRow(queue="all queues", oldest_ready_age=max(ages, default=None),
                        failed_24h=None if None in failed else sum(f or 0 for f in failed),
                        **sums)

    @property
    def outbox_verdict(self) -> str:
        age = self.outbox_oldest_seconds
        return WARN if age is not None and age > OUTBOX_AGE_WARN else OK


@dataclass(frozen=True, slots=True, kw_only=True)
class RescueSummary:
    """Jobs re-claimed after their worker stopped renewing the lease (``x_jobs.rescues``)."""

    live_jobs: int  # live jobs rescued at least once
    live_rescues: int
    finished_jobs: int  # jobs finished within RESCUE_WINDOW after at least one rescue
    finished_rescues: int
    lease_lost_dead: int  # of those, buried because the lease was lost on the last attempt
    by_name: list[tuple[str, int]] = field(default_factory=list)  # rescues per job name
    recent: list[JobBrief] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class TableRow:
    health: TableHealth
    verdict: str
    advice: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class HolderRow:
    holder: XminHolder
    verdict: str
    advice: str = ""
    query_hidden: bool = False  # holder.query is only the statement's first word (redact_query)


@dataclass(frozen=True, slots=True, kw_only=True)
class UnknownRow:
    """Jobs of one queue and name waiting for a worker that knows the name: ``bad`` once the
    oldest has waited ``XJOBS["UNKNOWN_JOB_REPORT_AFTER"]``; ``expected`` where its code was
    expected (registry.expected_home)."""

    wait: UnknownWait
    verdict: str
    expected: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Health:
    now: datetime
    tenants: TenantScope
    lapsed_count: int
    lapsed: list[JobBrief]  # running jobs whose lease expired, longest-expired first
    rescues: RescueSummary
    tables: list[TableRow]  # empty under a tenant scope
    holders: list[HolderRow]  # empty under a tenant scope
    workers: list[WorkerRecord] = field(default_factory=list)  # empty under a tenant scope
    query_text: bool = True  # False: the holders' SQL is redacted (see redact_query)
    # The history tables of finished jobs, newest day first (docs/scheduling.md, "History
    # tables"); empty under a tenant scope.
    history: list[HistoryTable] = field(default_factory=list)
    # The fleet's compatibility (x_fleet; docs/deployment.md, "Mixed versions"): what this
    # version holds back while older processes may share the tables. None under a tenant scope.
    compatibility: FleetRecord | None = None
    # Jobs waiting for a worker that knows their name (docs/deployment.md, "New job types
    # before their workers").
    unknown: list[UnknownRow] = field(default_factory=list)

    @property
    def stalled(self) -> list[WorkerRecord]:
        return [w for w in self.workers if w.stalled]

    @property
    def held_back(self) -> list[str]:
        """What this version does not write yet because the fleet is kept compatible with an
        older release; empty once the upgrade is finished."""
        return versions.held_back(self.compatibility) if self.compatibility else []

    @property
    def verdict(self) -> str:
        verdicts = [r.verdict for r in self.tables] + [h.verdict for h in self.holders]
        if self.stalled:
            verdicts.append(BAD)
        if self.lapsed_count or self.held_back:
            verdicts.append(WARN)
        verdicts += [u.verdict for u in self.unknown]
        return BAD if BAD in verdicts else WARN if WARN in verdicts else OK


# ---------------------------------------------------------------------------------- helpers --


def error_summary(text: str | None, limit: int = 200) -> str | None:
    """The line of an error a person reads first: the last non-empty one of a traceback."""
    if not text:
        return None
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    line = lines[-1] if lines else text.strip()
    return line if len(line) <= limit else line[: limit - 1] + "…"


def db_now() -> datetime:
    """The database clock, in the ORM's form (:func:`orm_time`), so it compares with the
    times of the rows the console reads."""
    return orm_time(get_engine().db_now())


@overload
def orm_time(moment: datetime) -> datetime: ...
@overload
def orm_time(moment: None) -> None: ...
def orm_time(moment: datetime | None) -> datetime | None:
    """``moment`` as the ORM hands out times: aware with ``USE_TZ = True``; naive, in
    ``TIME_ZONE`` (the database session's zone), with ``USE_TZ = False``. The engine's own
    cursor may answer in the other form, and Python refuses to compare the two
    (tests/integration/test_console_time.py runs every page both ways)."""

    if moment is None:
        return None
    zone = timezone.get_default_timezone()
    if django_settings.USE_TZ:
        return moment if timezone.is_aware(moment) else timezone.make_aware(moment, zone)
    return timezone.make_naive(moment, zone) if timezone.is_aware(moment) else moment


def shown_time(moment: datetime | None) -> datetime | None:
    """``moment`` in the time zone a page shows: the current one (Django's ``localtime``) with
    ``USE_TZ``, ``TIME_ZONE`` without; always aware, so a format can name the zone."""

    moment = orm_time(moment)
    if moment is None:
        return None
    if timezone.is_naive(moment):
        return timezone.make_aware(moment, timezone.get_default_timezone())
    return timezone.localtime(moment)


def clock_text(moment: datetime | None) -> str:
    """``2026-12-02 18:58:44 CET``: to the second, in the page's time zone."""
    shown = shown_time(moment)
    return "-" if shown is None else shown.strftime("%Y-%m-%d %H:%M:%S %Z").strip()


def _now_minus(delta: timedelta) -> Any:
    return ExpressionWrapper(Now() - Value(delta), output_field=DateTimeField())


def seconds_between(start: datetime, end: datetime) -> float:
    """``end - start`` in seconds, whichever form (aware or naive) each comes in."""
    return (orm_time(end) - orm_time(start)).total_seconds()  # type: ignore[operator]


def duration_text(seconds: float | None) -> str:
    """A duration to the second (to the tenth below a minute): ``850 ms``, ``12.3 s``,
    ``4 min 12 s``, ``3 h 12 min``, ``2 d 3 h``. The job page's timings; humanize_seconds
    rounds harder, for "… ago"."""
    if seconds is None or math.isnan(seconds):
        return "-"
    s = abs(seconds)
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 59.95:
        return f"{s:.1f} s"
    whole = round(s)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    if whole < 86400:
        return f"{whole // 3600} h {whole % 3600 // 60} min"
    return f"{whole // 86400} d {whole % 86400 // 3600} h"


def humanize_seconds(seconds: float | None) -> str:
    if seconds is None or math.isnan(seconds):
        return "-"
    s = abs(seconds)
    if s < 1:
        text = f"{s * 1000:.0f} ms"
    elif s < 90:
        text = f"{s:.0f} s"
    elif s < 90 * 60:
        text = f"{s / 60:.0f} min"
    elif s < 48 * 3600:
        text = f"{s / 3600:.1f} h"
    else:
        text = f"{s / 86400:.1f} d"
    return text


def ago(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return "never"
    delta = seconds_between(moment, now)
    return f"{humanize_seconds(delta)} ago" if delta >= 0 else f"in {humanize_seconds(delta)}"


# ----------------------------------------------------------------------------- JSON columns --

# A page shows at most this many characters of a JSON column and links to the whole value
# beyond: a 512 KiB input rendered whole is a page of megabytes, pretty-printed more. The
# database sends the page this much of the value (plus one character, to tell that there is
# more), never the rest.
JSON_PAGE_CHARS = 10_000
# The JSON columns of each console model: the console reads them as text (with_json_text) and
# decodes them itself (shown_json), never through JSONField, which raises on valid jsonb that
# Python's json cannot load (an integer of more than 4,300 digits, arrays nested thousands
# deep) and would take the page down with it (tests/integration/test_console_rows.py).
JSON_FIELDS: dict[str, tuple[str, ...]] = {
    "job": ("input", "result", "worker_ids"),
    "jobstep": ("output",),
    "jobevent": ("payload",),
    "outboxentry": ("input",),
    "backfill": ("last_cursor", "code_changes"),
}
_TEXT, _CHARS = "_xjobs_text_", "_xjobs_chars_"


def json_fields(model: Any) -> tuple[str, ...]:
    return JSON_FIELDS.get(model._meta.model_name, ())


# Columns no list shows that can be big: a job's attempt history holds up to 21 errors with
# their tracebacks. Left out of every list; a job's page reads it when it shows it (one query).
LIST_DEFERRED: dict[str, tuple[str, ...]] = {"job": ("attempts",)}


def without_json(queryset: Any) -> Any:
    """``queryset`` without its JSON columns: for reads that show none of them (lists, panels),
    which then cost neither the transfer of a big value nor a decode that can fail."""
    return queryset.defer(*json_fields(queryset.model),
                          *LIST_DEFERRED.get(queryset.model._meta.model_name, ()))


def with_json_text(queryset: Any, limit: int | None = JSON_PAGE_CHARS) -> Any:
    """``queryset`` with its JSON columns read as text: the first ``limit`` characters (all of
    them with ``None``) and the length, for :func:`shown_json`. The columns themselves are
    deferred: touching ``obj.input`` would decode it through JSONField."""

    names = json_fields(queryset.model)
    annotations: dict[str, Any] = {}
    for name in names:
        text = Cast(name, TextField())
        annotations[_TEXT + name] = text if limit is None else Left(text, limit + 1)
        annotations[_CHARS + name] = Length(text)
    return queryset.defer(*names).annotate(**annotations)


@dataclass(frozen=True, slots=True, kw_only=True)
class ShownJson:
    """A JSON column as the console shows it.

    ``text`` is what to print: indented JSON when Python could decode the value, else the
    stored text as it is (``problem`` says why it could not be decoded). ``truncated``: only
    the first :data:`JSON_PAGE_CHARS` characters of ``text`` are there; the page links to the
    whole value, which the database serves as stored text (the console decodes nothing to do
    that). ``value`` is the decoded value (whole values only), for ``--json``.
    """

    text: str | None  # None: SQL NULL (a job with no result yet)
    chars: int  # length of the stored text, the whole value
    truncated: bool = False
    problem: str | None = None
    value: Any = None

    @property
    def decoded(self) -> bool:
        return self.problem is None

    def as_json(self) -> Any:
        """The value for ``--json``: itself, or (when Python cannot decode it, or only a part
        was read) a mapping that says so and carries the stored text."""
        if self.text is None:
            return None
        if self.decoded and not self.truncated:
            return self.value
        why = {"undecodable": self.problem} if self.problem else {"truncated": True}
        return {**why, "chars": self.chars, "text": self.text}


def json_text(obj: Any, name: str) -> str | None:
    """Column ``name`` of ``obj`` (read by :func:`with_json_text`) as the database stores it."""
    return getattr(obj, _TEXT + name)  # type: ignore[no-any-return]


def shown_json(obj: Any, name: str, *, limit: int | None = JSON_PAGE_CHARS) -> ShownJson:
    """Column ``name`` of ``obj``, read by :func:`with_json_text`, as a page (or, with
    ``limit=None``, a command) shows it."""

    text = json_text(obj, name)
    chars = getattr(obj, _CHARS + name)
    if text is None:
        return ShownJson(text=None, chars=0)
    if chars > len(text):  # a prefix: not decodable as such, shown as stored
        return ShownJson(text=text[:limit], chars=chars, truncated=True)
    value, problem = decode_stored_json(text)
    if problem is not None:
        cut = limit is not None and len(text) > limit
        return ShownJson(text=text[:limit], chars=chars, truncated=cut, problem=problem)
    try:
        pretty = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
    except (ValueError, RecursionError):  # loads accepted what dumps refuses: show it stored
        pretty = text
    cut = limit is not None and len(pretty) > limit
    return ShownJson(text=pretty[:limit] if cut else pretty, chars=chars, truncated=cut,
                     value=value)


# -------------------------------------------------------------------------------- dashboard --


def _finished_since(window: timedelta, tenants: TenantScope) -> list[tuple[str, Any]]:
    """Jobs finished within ``window``, one queryset per finished state.

    One per state, not ``state in (done, dead, cancelled)``: that condition is the predicate of
    ``x_jobs_finished_idx`` (state, finished_at), so the planner drops it and walks the whole
    index for the time range (docs/performance.md, "What the simpler forms cost");
    ``state = 'done'`` is a range scan.
    """

    return [(state, scoped(Job.objects.filter(state=state,
                                              finished_at__gte=_now_minus(window)), tenants))
            for state in TERMINAL_STATES]


def queue_rows(tenants: TenantScope = None) -> list[QueueRow]:
    """The dashboard's queues: live buckets from ``queue_depth``, finished counts of the last
    24 hours from the counters (from the rows under a tenant scope: see :class:`QueueRow`).
    No read here scans ``x_jobs`` (tests/integration/test_console_site.py checks the plans)."""

    depth: dict[str, QueueDepth] = {
        d.queue: d for d in get_engine().queue_depth(tenant_ids=tenants)
    }
    finished: dict[str, dict[str, Any]] = {}
    if tenants is None:
        day = counters.chart("day")
        for q in day.series:
            t = day.total(q)
            finished[q] = {"done_24h": t.done, "failed_24h": t.failed, "dead_24h": t.dead,
                           "cancelled_24h": t.cancelled}
    else:
        for state, rows in _finished_since(FINISHED_WINDOW, tenants):
            for row in rows.order_by().values("queue").annotate(n=Count("id")):
                counts = finished.setdefault(row["queue"], {"failed_24h": None})
                counts[f"{state}_24h"] = row["n"]
    queues = sorted(set(depth) | set(finished) | set(
        registry.worked_queues() if tenants is None else ()))
    rows = []
    for q in queues:
        d = depth.get(q) or QueueDepth(queue=q)
        rows.append(QueueRow(
            queue=q, ready=d.ready, delayed=d.delayed, running=d.running,
            suspended=d.suspended, blocked=d.blocked, oldest_ready_age=d.oldest_ready_age,
            **finished.get(q, {"failed_24h": None if tenants is not None else 0}),
        ))
    return rows


def queue_chart(window: str, queue: str | None = None) -> counters.Chart:
    """The counters of ``window`` (``hour``, ``day``, ``week``) for the console's charts, of
    one queue or all. Never under a tenant scope: the counters count every tenant's jobs."""
    return counters.chart(window, queue=queue)


def scheduler_leaders(now: datetime) -> list[LeaderRow]:
    return [LeaderRow(lock_key=r.lock_key, holder=r.holder, expires_at=r.expires_at,
                      live=r.expires_at > now)
            for r in SchedulerLeader.objects.order_by("lock_key")]


def schedule_rows() -> list[ScheduleRow]:
    """Every cron task the console knows of, as the scheduler describes it (``manage.py xjobs
    schedule`` shows the same): configured tasks (``@job(cron=...)`` and ``XJOBS["SCHEDULE"]``)
    and state rows of tasks no longer declared, with the watermark and the next fire time.

    The scheduler computes on the engine's clock in the engine's form; its answers are turned
    into the ORM's form here (:func:`orm_time`), like every time the console shows."""

    return [ScheduleRow(task=t.name, last_fired_at=orm_time(t.watermark), paused=t.paused,
                        updated_at=orm_time(t.updated_at), next_fire_at=orm_time(t.next_fire_at),
                        configured=t.configured, overlap=t.overlap,
                        overlap_skipped=t.overlap_skipped,
                        overlap_skipped_at=orm_time(t.overlap_skipped_at))
            for t in scheduler.describe(now=get_engine().db_now()).tasks]


def fleet(tenants: TenantScope = None, *,
          max_stall: float = WORKER_MAX_STALL) -> list[WorkerRecord]:
    """The worker processes (``x_workers``, the engine's ``workers_list``), stalled ones first,
    each with why it is stalled (after ``max_stall`` seconds); none under a tenant scope: the
    fleet's hosts and queues are no tenant's rows."""
    if tenants is not None:
        return []
    found = get_engine().workers_list(max_stall=max_stall)
    return sorted(found, key=lambda w: (w.stalled is None, w.id))


def latest_failures(tenants: TenantScope = None, limit: int = PANEL_ROWS) -> list[JobBrief]:
    dead = without_json(scoped(Job.objects.filter(state="dead"), tenants))
    dead = dead.order_by("-finished_at")[:limit]
    return [JobBrief.of(j, j.finished_at) for j in dead]


def dashboard(tenants: TenantScope = None) -> Dashboard:
    now = db_now()
    pending, oldest = get_engine().outbox_pending(tenant_ids=tenants)
    return Dashboard(
        now=now, tenants=tenants, queues=queue_rows(tenants), outbox_pending=pending,
        outbox_oldest_seconds=oldest,
        leaders=scheduler_leaders(now) if tenants is None else [],
        schedules=schedule_rows() if tenants is None else [],
        workers=fleet(tenants), failures=latest_failures(tenants),
    )


# ----------------------------------------------------------------------------------- health --


def lapsed_jobs(tenants: TenantScope = None,
                limit: int = LAPSED_ROWS) -> tuple[int, list[JobBrief]]:
    """Running jobs whose lease expired (served by ``x_jobs_lapsed_idx``): the worker stopped
    renewing, and the next claim of their queue rescues them."""


    lapsed = without_json(scoped(Job.objects.filter(state="running", visible_at__lte=Now()),
                                 tenants))
    rows = [JobBrief.of(j, j.visible_at) for j in lapsed.order_by("visible_at")[:limit]]
    count = len(rows) if len(rows) < limit else lapsed.count()
    return count, rows


def rescue_summary(tenants: TenantScope = None) -> RescueSummary:
    """Rescued jobs among the live ones and those finished within :data:`RESCUE_WINDOW`.

    Each state group is read on its own partial index (running: ``x_jobs_lapsed_idx``; ready,
    delayed, suspended: ``x_jobs_claim_idx``; each finished state: ``x_jobs_finished_idx``):
    ``rescues`` has no index, and a condition over all states would scan the table.
    """


    live_groups = [
        scoped(Job.objects.filter(state="running", rescues__gt=0), tenants),
        scoped(Job.objects.filter(state__in=("ready", "delayed", "suspended"), rescues__gt=0),
               tenants),
    ]
    finished_groups = [qs.filter(rescues__gt=0) for _, qs in _finished_since(RESCUE_WINDOW,
                                                                             tenants)]
    totals = {"live": [0, 0], "finished": [0, 0]}
    lost = 0
    by_name: dict[str, int] = {}
    recent: list[Any] = []
    for kind, groups in (("live", live_groups), ("finished", finished_groups)):
        for qs in groups:
            agg = qs.aggregate(n=Count("id"), r=Sum("rescues"),
                               lost=Count("id", filter=Q(state="dead",
                                                        last_error__startswith="lease lost")))
            totals[kind][0] += agg["n"] or 0
            totals[kind][1] += agg["r"] or 0
            lost += agg["lost"] or 0
            if agg["n"]:
                for row in qs.order_by().values("name").annotate(r=Sum("rescues")):
                    by_name[row["name"]] = by_name.get(row["name"], 0) + (row["r"] or 0)
                recent += list(without_json(qs).order_by("-updated_at")[:PANEL_ROWS])
    recent.sort(key=lambda j: j.updated_at, reverse=True)
    return RescueSummary(
        live_jobs=totals["live"][0], live_rescues=totals["live"][1],
        finished_jobs=totals["finished"][0], finished_rescues=totals["finished"][1],
        lease_lost_dead=lost,
        by_name=sorted(by_name.items(), key=lambda kv: (-kv[1], kv[0]))[:PANEL_ROWS],
        recent=[JobBrief.of(j, j.finished_at or j.updated_at) for j in recent[:PANEL_ROWS]],
    )


def judge_table(t: TableHealth) -> TableRow:
    verdict, advice = OK, ""
    if t.dead_tuples >= DEAD_TUPLES_MIN and t.dead_ratio >= DEAD_RATIO_WARN:
        verdict = BAD if t.dead_ratio >= DEAD_RATIO_BAD else WARN
        advice = ("dead row versions pile up: look below for an old transaction or slot that "
                  "holds VACUUM back; if none, autovacuum is too slow for this table")
    share = t.xid_age / t.freeze_max_age if t.freeze_max_age else 0.0
    if share >= XID_AGE_WARN:
        verdict = BAD if share >= XID_AGE_BAD else (WARN if verdict == OK else verdict)
        advice = (f"transaction-id age {t.xid_age:,} is {share:.0%} of "
                  "autovacuum_freeze_max_age: let the anti-wraparound vacuum finish (do not "
                  "cancel it); an old transaction below keeps it from freezing")
    return TableRow(health=t, verdict=verdict, advice=advice)


def judge_holder(h: XminHolder) -> HolderRow:
    age = h.age_seconds
    verdict, advice = OK, ""
    if h.kind == "replication slot":
        if h.state == "inactive":
            verdict, advice = BAD, ("an inactive slot holds the xmin horizon for ever: drop it "
                                    "(pg_drop_replication_slot) if its consumer is gone")
    elif h.kind == "prepared transaction":
        verdict, advice = BAD, ("a forgotten prepared transaction: COMMIT PREPARED or ROLLBACK "
                                "PREPARED it")
    elif age is not None:
        if h.state and h.state.startswith("idle in transaction") and age >= IDLE_IN_XACT_WARN:
            verdict = BAD if age >= XACT_AGE_WARN else WARN
            advice = (f"a session sits idle inside a transaction: fix the application, or end it "
                      f"with pg_terminate_backend({h.pid})")
        elif age >= XACT_AGE_WARN:
            verdict = BAD if age >= XACT_AGE_BAD else WARN
            advice = (f"a long transaction: while it runs, VACUUM cannot remove rows that died "
                      f"after it started; cancel it with pg_cancel_backend({h.pid}) if it is "
                      "not needed")
    return HolderRow(holder=h, verdict=verdict, advice=advice)


# The first word of a statement, which every viewer of the health panel may see: it tells a
# long report (select) from a stuck migration (alter) or an idle session (commit) without
# showing a literal. Anything else, including a first word not in this list, is withheld.
SQL_COMMANDS = frozenset({
    "abort", "alter", "analyze", "begin", "call", "checkpoint", "close", "cluster", "comment",
    "commit", "copy", "create", "deallocate", "declare", "delete", "discard", "do", "drop",
    "end", "execute", "explain", "fetch", "grant", "import", "insert", "listen", "load", "lock",
    "merge", "move", "notify", "prepare", "refresh", "reindex", "release", "reset", "revoke",
    "rollback", "savepoint", "security", "select", "set", "show", "start", "table", "truncate",
    "unlisten", "update", "vacuum", "values", "with",
})


def redact_query(query: str | None) -> str | None:
    """Another session's SQL for a viewer without ``django_xjobs.view_query_text``: its first
    word (when it is an SQL command), never the rest. pg_stat_activity shows statements with
    their literals (a password in ALTER ROLE, a customer's e-mail in a WHERE), so stripping
    literals would not be enough: an unquoted SET value, a comment or an identifier can carry
    the same secret. tests/integration/test_console_security.py pins it."""
    if not query:
        return query

    match = re.match(r"\s*([A-Za-z]+)(?![A-Za-z0-9_$])", query)
    word = match.group(1).lower() if match else ""
    return f"{word.upper()} …" if word in SQL_COMMANDS else "…"


def health(tenants: TenantScope = None, *, query_text: bool = True,
           max_stall: float = WORKER_MAX_STALL) -> Health:
    """The health panel. ``query_text=False`` (a console user without
    ``django_xjobs.view_query_text``) redacts the SQL of the sessions that hold VACUUM back
    before it leaves this function (:func:`redact_query`); ``max_stall``: when a worker reads
    as stalled (``xjobs health --max-stall``)."""
    now = db_now()
    count, lapsed = lapsed_jobs(tenants)
    engine = get_engine()
    holders = [judge_holder(h) for h in engine.xmin_horizon(PANEL_ROWS)] if tenants is None \
        else []
    if not query_text:
        holders = [dataclasses.replace(row, holder=dataclasses.replace(
            row.holder, query=redact_query(row.holder.query)), query_hidden=True)
            for row in holders]
    return Health(
        now=now, tenants=tenants, lapsed_count=count, lapsed=lapsed,
        rescues=rescue_summary(tenants),
        tables=[judge_table(t) for t in engine.tables_health()] if tenants is None else [],
        holders=holders, workers=fleet(tenants, max_stall=max_stall), query_text=query_text,
        history=engine.history_tables() if tenants is None else [],
        compatibility=engine.fleet_get() if tenants is None else None,
        unknown=unknown_jobs(tenants),
    )


def unknown_jobs(tenants: TenantScope = None) -> list[UnknownRow]:
    """The jobs waiting for a worker that knows their name, longest-waiting first: ``bad``
    past ``XJOBS["UNKNOWN_JOB_REPORT_AFTER"]``, ``ok`` before (a rolling deploy under way)."""
    bound = conf.get().unknown_job_report_after
    return [
        UnknownRow(wait=w, verdict=BAD if w.waited >= bound else OK,
                   expected=registry.expected_home(
                       w.name, f"cron:{w.cron_tasks[0]}" if w.cron_tasks else None))
        for w in get_engine().jobs_unknown_waiting(tenant_ids=tenants)
    ]


# ---------------------------------------------------------------------------------- a job --


def diagnose(job: Any, steps: Sequence[Any], now: datetime) -> list[str]:
    """Why the job is where it is and what an operator can do, in plain sentences.

    ``job`` is a Job model instance or a JobRecord; ``steps`` its run's steps (JobStep
    instances or StepRecords); ``now`` the database clock.
    """
    lines: list[str] = []
    state = job.state
    attempts = f"attempt {job.attempt} of {job.max_attempts}"
    error = error_summary(job.last_error)
    if state == "ready" and job.run_at <= now:
        lines.append(
            f"Waiting for a worker: due {ago(job.run_at, now)} on queue '{job.queue}'. If this "
            f"keeps growing, no worker consumes that queue (start one with `manage.py "
            f"xjobs_worker --queue {job.queue}`), or every worker is busy."
        )
    elif state in ("ready", "delayed"):
        when = job.run_at.isoformat(sep=" ", timespec="seconds")
        lines.append(f"Not due yet: it becomes due {ago(job.run_at, now)} ({when}). Run now "
                     "makes it due at once.")
        if error and job.attempt > 0:
            lines.append(f"It is waiting to retry after a failure ({attempts}): {error}")
    elif state == "running":
        if job.visible_at is not None and job.visible_at <= now:
            last = job.attempt >= job.max_attempts
            lines.append(
                f"Its lease expired {ago(job.visible_at, now)}: worker {job.claimed_by} stopped "
                "renewing it (killed, crashed, or stuck without its heartbeat). The next claim "
                f"on queue '{job.queue}' rescues it"
                + (" — and as this was the last attempt, buries it as dead." if last else
                   f" and starts attempt {job.attempt + 1} of {job.max_attempts}.")
                + " Cancel it to stop it for good."
            )
        else:
            lines.append(
                f"Running on {job.claimed_by} since {ago(job.started_at, now)} ({attempts}); "
                f"its lease is renewed until {ago(job.visible_at, now)}. Cancel stops it at the "
                "worker's next heartbeat."
            )
    elif state == "suspended":
        open_steps = [s for s in steps if s.status in ("sleeping", "waiting", "invoking")]
        for s in open_steps:
            if s.status == "invoking":
                timeout = f"; it times out {ago(s.wake_at, now)}" if s.wake_at else ""
                lines.append(
                    f"Suspended waiting for {s.pending} child job(s) of step '{s.name}' (listed "
                    f"under children){timeout}. The last one to finish resumes it at once; "
                    "no worker thread is held.")
            elif s.status == "sleeping":
                lines.append(f"Suspended in a durable sleep (step '{s.name}') until "
                             f"{ago(s.wake_at, now)}; no worker thread is held.")
            else:
                key = f" with correlation key '{s.correlation_key}'" if s.correlation_key else ""
                lines.append(
                    f"Suspended waiting for event '{s.event}'{key} (step '{s.name}'); it times "
                    f"out {ago(s.wake_at, now)}. Publishing that event resumes it at once."
                )
        if not open_steps:
            lines.append(f"Suspended until {ago(job.run_at, now)}.")
        lines.append("Run now resumes it at once and ends its open wait (a wait ended so "
                     "returns None to the job).")
    elif state == "blocked":
        key = getattr(job, "blocked_on", None) or job.concurrency_key
        lines.append(
            f"Held back by flow control on key '{key}' before it could run (waiting spends no "
            f"attempt; {attempts} so far). A slot of that key freed anywhere, or the end or "
            "resume of the key's pause, sends it back to its queue at once; the reasons are "
            "listed under \"Why it is not running\". Cancel it to stop it for good."
        )
    elif state == "dead":
        if job.last_error and job.last_error.startswith("lease lost"):
            lines.append("Dead: its worker died (or stopped renewing the lease) while running it "
                         "on its last attempt. Look for a crash or an out-of-memory kill on "
                         f"{job.claimed_by}.")
        else:
            lines.append(f"Dead after {attempts}: {error or 'no error recorded'}")
        lines.append("Retry gives it a fresh set of attempts, due now; completed steps are kept.")
    elif state == "cancelled":
        lines.append(f"Cancelled {ago(job.finished_at, now)}: {job.last_error or 'no reason'}. "
                     "Retry puts it back on the queue.")
    elif state == "done":
        took = ""
        if job.started_at and job.finished_at:
            seconds = (job.finished_at - job.started_at).total_seconds()
            took = f"; the last run took {humanize_seconds(seconds)}"
        lines.append(f"Done {ago(job.finished_at, now)} after {job.attempt} attempt(s){took}.")
    if job.rescues:
        lines.append(f"Rescued {job.rescues} time(s): a worker lost its lease on it mid-run, "
                     "and another claim took it over.")
    if job.concurrency_key and state in ("ready", "delayed"):
        lines.append(f"Runs under concurrency key '{job.concurrency_key}': it waits while that "
                     "key's slots are taken (see Concurrency slots).")
    return lines


# ------------------------------------------------------------------------ lists (CLI parity) --

JOB_FILTERS = ("state", "queue", "name", "tenant_id")


def jobs(*, tenants: TenantScope = None, limit: int = 50, created_after: datetime | None = None,
         created_before: datetime | None = None, run_after: datetime | None = None,
         run_before: datetime | None = None, **filters: str | None) -> list[Any]:
    """The jobs list (newest first, by the UUIDv7 primary key), filtered like the console's."""

    unknown = set(filters) - set(JOB_FILTERS)
    if unknown:
        raise ConfigurationError(f"unknown job filter(s) {sorted(unknown)}")
    # The bounds come aware (the command requires a zone); with USE_TZ = False the ORM takes
    # naive times in TIME_ZONE only.
    created_after, created_before, run_after, run_before = (
        orm_time(t) for t in (created_after, created_before, run_after, run_before))
    qs = with_json_text(scoped(Job.objects.all(), tenants), limit=None).filter(
        **{k: v for k, v in filters.items() if v is not None})
    for lookup, value in (("created_at__gte", created_after), ("created_at__lte", created_before),
                          ("run_at__gte", run_after), ("run_at__lte", run_before)):
        if value is not None:
            qs = qs.filter(**{lookup: value})
    return list(qs.order_by("-id")[:limit])


def job_row(job_id: Any, *, tenants: TenantScope = None,
            limit: int | None = JSON_PAGE_CHARS) -> Any:
    """One job as its page and ``xjobs show`` read it (JSON columns as text, see
    :func:`with_json_text`); :class:`JobNotFound` for an unknown, malformed or out-of-scope id,
    the same answer for all three."""


    try:
        uid = UUID(str(job_id).strip())
    except ValueError:
        raise JobNotFound(f"no job with id {job_id}") from None
    found = with_json_text(scoped(Job.objects.filter(id=uid), tenants), limit).first()
    if found is None:
        raise JobNotFound(f"no job with id {job_id}")
    return found


def run_steps(run_id: Any, *, limit: int | None = JSON_PAGE_CHARS) -> list[Any]:
    """The durable steps of one run, in the order they started (JSON columns as text)."""

    return list(with_json_text(JobStep.objects.filter(run_id=run_id), limit)
                .order_by("started_at", "id"))


@dataclass(frozen=True, slots=True)
class Children:
    """A parent's child jobs as the console and ``xjobs show`` list them: the first ``shown``
    (step name and job row, in the steps' order) of ``total``."""

    shown: list[tuple[str, Any]]
    total: int


def run_children(run_id: Any, *, tenants: TenantScope = None, limit: int = 50) -> Children:
    """The child jobs of a run's invoke and gather steps (docs/durable.md, "Child jobs"), read
    from the ids the steps recorded: primary-key lookups, archived children included."""

    ids = [(step, UUID(child)) for step, output in JobStep.objects.filter(
               run_id=run_id, kind="invoke").order_by("started_at", "id")
               .values_list("name", "output")
           for child in (output or {}).get("children", ())]
    if tenants is not None:  # another tenant's child is neither shown nor counted
        visible = set(scoped(Job.objects.filter(pk__in=[c for _, c in ids]), tenants)
                      .values_list("pk", flat=True))
        ids = [(step, c) for step, c in ids if c in visible]
    wanted = ids[:limit]
    rows = {j.pk: j for j in Job.objects.filter(pk__in=[c for _, c in wanted])
            .only("id", "name", "state", "parent_step")}
    return Children(shown=[(step, rows[c]) for step, c in wanted if c in rows], total=len(ids))


def event_rows(*, name: str | None = None, limit: int = 50) -> list[Any]:
    """Published events, newest first (the order of the engine's ``events_list``), payloads
    as text."""

    qs = JobEvent.objects.all() if name is None else JobEvent.objects.filter(name=name)
    return list(with_json_text(qs, limit=None).order_by("-published_at", "-id")[:limit])


def outbox_entries(*, tenants: TenantScope = None, pending: bool | None = None,
                   limit: int = 50) -> list[Any]:

    qs = with_json_text(scoped(OutboxEntry.objects.all(), tenants), limit=None)
    if pending is True:
        return list(qs.filter(published_at=None).order_by("staged_at")[:limit])
    if pending is False:
        qs = qs.exclude(published_at=None)
    return list(qs.order_by("-staged_at")[:limit])


def slot_limits(held: Iterable[tuple[str, str]]) -> dict[tuple[str, str], int | None]:
    """The limit each held slot was asked under, per ``(key, holder)``: the one a run of the
    holder's job asks for (:func:`slots.limit_for`: ``XJOBS["CONCURRENCY_LIMITS"]`` first,
    else the job's own ``Concurrency(limit=...)``). The holder names the job by id; a holder
    whose job is gone (or was never a job) gets the settings limit, or None."""


    pairs = list(held)
    job_ids: dict[str, UUID] = {}
    for _, holder in pairs:
        job_id = slots.parse_holder(holder)[0]
        try:
            job_ids[job_id] = UUID(job_id)
        except ValueError:
            continue
    names = {str(i): n for i, n in Job.objects.filter(id__in=job_ids.values())
             .values_list("id", "name")}
    settings = conf.get()
    return {(key, holder): slots.limit_for(
                key, registry.lookup(names.get(slots.parse_holder(holder)[0], "")), settings)
            for key, holder in pairs}


def key_limits(keys: Iterable[str]) -> dict[str, list[int]]:
    """The limits that apply to the live slots of each key, smallest first (several when jobs
    with different limits share a key; none when no holder's limit is known)."""


    keys = list(keys)
    live = JobLease.objects.filter(lease_key__in=keys, expires_at__gt=Now())
    found: dict[str, set[int]] = {k: set() for k in keys}
    for (key, _), limit in slot_limits(live.values_list("lease_key", "holder")).items():
        if limit is not None:
            found[key].add(limit)
    return {k: sorted(v) for k, v in found.items()}


def backfill_rows(limit: int = 100) -> list[Any]:
    return list(with_json_text(Backfill.objects.all(), limit=None).order_by("-started_at")[:limit])


def backfill_rate(b: Any, now: datetime) -> float | None:
    """Rows per second over the pass so far (to its end, for a finished one)."""
    end = b.completed_at or now
    seconds = (end - b.started_at).total_seconds() if b.started_at else 0
    return b.rows_processed / seconds if seconds > 0 else None


# ------------------------------------------------------------------------------- JSON form --


def as_json(value: Any) -> Any:
    """Records, model instances and their fields as JSON-ready values (``xjobs ... --json``)."""

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {f.name: as_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
        for extra in ("live", "last_seen_at", "dead_ratio", "verdict", "outbox_verdict",
                      "held_back"):
            if hasattr(type(value), extra) and isinstance(getattr(type(value), extra), property):
                out[extra] = as_json(getattr(value, extra))
        return out
    if hasattr(value, "_meta") and hasattr(value, "pk"):  # a model instance
        out = {}
        for f in value._meta.concrete_fields:
            if hasattr(value, _TEXT + f.attname):  # read by with_json_text: never decoded here
                out[f.attname] = shown_json(value, f.attname, limit=None).as_json()
            else:
                out[f.attname] = as_json(getattr(value, f.attname))
        return out
    if isinstance(value, ShownJson):
        return value.as_json()
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): as_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value) if isinstance(value, set | frozenset) else value
        return [as_json(v) for v in items]
    return value
