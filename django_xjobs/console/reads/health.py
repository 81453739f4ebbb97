"""The health panel: lapsed leases, rescues, the tables and what holds VACUUM back, the
history tables, the fleet's compatibility, jobs no worker knows, and the workers; each judged
ok, warn or bad (docs/console.md, "The health panel", says what to do about each).

Under a tenant scope only the tenant's jobs are shown: the tables, the server and the fleet are
no tenant's rows.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Q, Sum
from django.db.models.functions import Now

from ... import conf, registry, versions
from ...engines import get_engine
from ...models import Job
from ...records import (
    DEFAULT_MAX_STALL,
    FleetRecord,
    HistoryTable,
    TableHealth,
    UnknownWait,
    WorkerRecord,
    XminHolder,
)
from ...worker import floors
from .jobs import PANEL_ROWS, JobBrief, finished_since
from .json_columns import without_json
from .scope import TenantScope, scoped
from .text import db_now

# How far back "recently" reaches for rescues, and how many lapsed jobs the panel lists.
RESCUE_WINDOW = timedelta(hours=1)
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
    # What the oldest holder of the horizon costs the queue now (horizon_cost); "" for none.
    horizon_cost: str = ""

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


def fleet(tenants: TenantScope = None, *,
          max_stall: float = WORKER_MAX_STALL) -> list[WorkerRecord]:
    """The worker processes (``x_workers``, the engine's ``workers_list``), stalled ones first,
    each with why it is stalled (after ``max_stall`` seconds); none under a tenant scope: the
    fleet's hosts and queues are no tenant's rows."""
    if tenants is not None:
        return []
    found = get_engine().workers_list(max_stall=max_stall)
    return sorted(found, key=lambda w: (w.stalled is None, w.id))


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
    finished_groups = [qs.filter(rescues__gt=0) for _, qs in finished_since(RESCUE_WINDOW,
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


def horizon_cost(holders: list[HolderRow], tables: list[TableRow]) -> str:
    """What the holders of the horizon cost the queue now, once one of them is judged (a long
    or idle transaction, a slot, a prepared transaction) or is far enough back for the
    workers' claims to start from floors (docs/performance.md, "Under a held horizon"): the
    dead row versions of x_jobs VACUUM has not removed (all of them, whoever keeps them), and
    what the claims do about them. Empty otherwise."""
    oldest = max((h.holder.xmin_age or 0 for h in holders), default=0)
    if oldest < floors.HORIZON_XIDS and all(h.verdict == OK for h in holders):
        return ""
    dead = next((t.health.dead_tuples for t in tables if t.health.table == "x_jobs"), None)
    told = [] if dead is None else [
        f"x_jobs has {dead:,} dead row versions VACUUM has not removed (none younger than the "
        "oldest snapshot can be)"]
    if oldest >= floors.HORIZON_XIDS:
        told.append(
            f"the horizon is {oldest:,} transaction ids back, so the workers' claims start "
            f"from floors past the jobs claimed since, and a sweep every {floors.SWEEP:.0f} s "
            f"or more (at most {floors.SWEEP_SHARE:.0%} of a worker's time) still reads them "
            'all (docs/performance.md, "Under a held horizon")')
    return "; ".join(told)


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
    tables = [judge_table(t) for t in engine.tables_health()] if tenants is None else []
    return Health(
        now=now, tenants=tenants, lapsed_count=count, lapsed=lapsed,
        rescues=rescue_summary(tenants), tables=tables,
        horizon_cost=horizon_cost(holders, tables),
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
