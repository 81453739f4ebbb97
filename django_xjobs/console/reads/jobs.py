"""A job as the console reads it: in a panel, its diagnosis, the jobs list, one job's row,
its steps and its children; and the jobs a window finished."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.db.models import DateTimeField, ExpressionWrapper, Value
from django.db.models.functions import Now
from django.utils.html import conditional_escape, format_html

from ...exceptions import (
    ChildFailed,
    ConfigurationError,
    JobNotFound,
    class_path,
    split_recorded_error,
)
from ...models import Job, JobStep
from ...records import TERMINAL_STATES, WAITING_STATES, BlockedBy
from .json_columns import JSON_PAGE_CHARS, with_json_text
from .scope import TenantScope, scoped
from .search import filtered_jobs, newest_per_table
from .text import ago, as_uuid, error_summary, humanize_seconds, orm_time

# How many rows a panel lists (the dashboard's latest failures, the health panel's rescues
# and the sessions that hold VACUUM back).
PANEL_ROWS = 10


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


def _now_minus(delta: timedelta) -> Any:
    return ExpressionWrapper(Now() - Value(delta), output_field=DateTimeField())


def finished_since(window: timedelta, tenants: TenantScope) -> list[tuple[str, Any]]:
    """Jobs finished within ``window``, one queryset per finished state.

    One per state, not ``state in (done, dead, cancelled)``: that condition is the predicate of
    ``x_jobs_finished_idx`` (state, finished_at), so the planner drops it and walks the whole
    index for the time range (docs/performance.md, "What the simpler forms cost");
    ``state = 'done'`` is a range scan.
    """

    return [(state, scoped(Job.objects.filter(state=state,
                                              finished_at__gte=_now_minus(window)), tenants))
            for state in TERMINAL_STATES]


# ---------------------------------------------------------------------------------- a job --


def diagnose(job: Any, steps: Sequence[Any], now: datetime, *,
             reasons: Sequence[BlockedBy] = ()) -> list[str]:
    """Why the job is where it is and what an operator can do, in plain sentences.

    ``job`` is a Job model instance or a JobRecord; ``steps`` its run's steps (JobStep
    instances or StepRecords); ``now`` the database clock; ``reasons`` what holds it back now
    (``why.for_job``): a pause of its queue makes the advice about the pause, never about
    starting a worker, which a paused queue would not give the job to.
    """
    lines: list[str] = []
    state = job.state
    attempts = f"attempt {job.attempt} of {job.max_attempts}"
    error = error_summary(job.last_error)
    paused = next((r for r in reasons if r.kind == "queue_paused"), None)
    if paused is not None and state in WAITING_STATES:
        lines.append(_queue_paused(paused, job.queue, due=job.run_at <= now))
    if state == "ready" and job.run_at <= now:
        if paused is None:
            lines.append(
                f"Waiting for a worker: due {ago(job.run_at, now)} on queue '{job.queue}'. If "
                f"this keeps growing, no worker consumes that queue (start one with `manage.py "
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
        failed = failed_child(job)
        if job.last_error and job.last_error.startswith("lease lost"):
            lines.append("Dead: its worker died (or stopped renewing the lease) while running it "
                         "on its last attempt. Look for a crash or an out-of-memory kill on "
                         f"{job.claimed_by}.")
        elif failed is not None:
            lines.extend(_child_failed(failed, attempts, job.id))
        else:
            lines.append(f"Dead after {attempts}: {error or 'no error recorded'}")
        if failed is None:
            lines.append("Retry gives it a fresh set of attempts, due now; completed steps are "
                         "kept.")
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


def _queue_paused(pause: BlockedBy, queue: str, *, due: bool) -> str:
    """What a pause of the job's queue means for it, and how it ends: the resume, or its end."""
    held = "Due, but held" if due else "Held"
    ends = ("" if pause.until is None else
            f"; the pause ends by itself at {pause.until.isoformat(sep=' ', timespec='seconds')}")
    why = f" ({pause.reason})" if pause.reason else ""
    return (f"{held}: queue '{queue}' is paused{why}, and no claim takes a job of a paused "
            f"queue. Resuming it (`manage.py xjobs resume {queue}`, or Resume on the "
            f"console's dashboard) hands its jobs to the workers at once{ends}.")


@dataclass(frozen=True, slots=True, kw_only=True)
class FailedChild:
    """The failed step of a workflow that died of a ``ChildFailed`` (docs/durable.md,
    "Repairing a dead workflow"): the invoke or gather step and the child its outcome names."""

    step: str
    index: int
    child_id: str
    job: str | None  # the child's job name
    state: str  # dead, cancelled, timeout (still live at the step's timeout) or gone
    error: str | None  # the child's error, as the step recorded it


def failed_child(job: Any) -> FailedChild | None:
    """The failed step of ``job`` when its recorded error is a ``ChildFailed``: the latest
    invoke or gather step whose outcome names a failed child (the step job_resume opens
    again). None otherwise."""
    recorded = split_recorded_error(job.last_error or "")
    if recorded is None or recorded[0] != class_path(ChildFailed):
        return None
    found = (JobStep.objects.filter(run_id=job.run_id, kind="invoke", status="completed",
                                    output__has_key="failed")
             .order_by("-id").values_list("name", "output__failed").first())
    if found is None or not isinstance(found[1], dict):
        return None
    step, failed = found
    return FailedChild(step=step, index=int(failed.get("index") or 0),
                       child_id=str(failed.get("id")), job=failed.get("job"),
                       state=str(failed.get("state")), error=failed.get("error"))


class ChildLine(str):
    """A line of a diagnosis that names a child job: plain text wherever a str goes (the
    terminal, ``--json``, a test), and on the job's page, which renders it through
    ``__html__``, the child's id is a link to the child's page (relative to the parent's:
    ``.../job/<parent>/change/`` -> ``.../job/<child>/change/``, in whichever admin site)."""

    child_id: str

    def __new__(cls, text: str, child_id: str) -> ChildLine:
        line = super().__new__(cls, text)
        line.child_id = child_id
        return line

    def __html__(self) -> str:
        before, found, after = self.partition(self.child_id)
        if not found:
            return str(conditional_escape(str(self)))
        return str(format_html('{}<a href="../../{}/change/" class="xjobs-child">{}</a>{}',
                               before, self.child_id, self.child_id, after))


def _child_failed(failed: FailedChild, attempts: str, job_id: Any) -> list[str]:
    """The diagnosis of a workflow dead of a ChildFailed: what failed, and how to resume."""
    how = {"timeout": "was still running when the step's timeout passed",
           "gone": "no longer exists"}.get(failed.state, f"ended {failed.state}")
    child_error = error_summary(failed.error)
    head = ChildLine(
        f"Dead after {attempts}: ChildFailed in step '{failed.step}': child {failed.index} "
        f"({failed.job} {failed.child_id}) {how}" + (f": {child_error}" if child_error else ""),
        failed.child_id)
    if failed.state == "gone":
        return [head, "That child no longer exists, so the workflow cannot wait for it again: "
                      "neither Resume workflow nor Retry can take it past this step (Retry "
                      "replays the recorded failure and ends dead again)."]
    return [head, (
        f"Fix what made the child fail, then Resume workflow (`manage.py xjobs resume "
        f"{job_id}`): the step's dead or cancelled children get a fresh set of attempts, "
        f"step '{failed.step}' waits for them again, and the workflow goes on past it once "
        "they succeed, its completed steps kept. Retry alone would replay the recorded "
        "failure and end dead again at once.")]


# ------------------------------------------------------------------------ lists (CLI parity) --

JOB_FILTERS = ("state", "queue", "name", "tenant_id", "worker", "error", "search")


def jobs(*, tenants: TenantScope = None, limit: int = 50, created_after: datetime | None = None,
         created_before: datetime | None = None, run_after: datetime | None = None,
         run_before: datetime | None = None, **filters: str | None) -> list[Any]:
    """The jobs list (newest first, by the UUIDv7 primary key), filtered like the console's:
    ``state``, ``queue``, ``name`` (or a pattern: ``shop.*``), ``tenant_id``, ``worker`` (an
    id or a host), ``error`` (words of the last error), ``search`` (what the console's search
    box takes: an id, a key, ``order_id=42``, words)."""

    unknown = set(filters) - set(JOB_FILTERS)
    if unknown:
        raise ConfigurationError(f"unknown job filter(s) {sorted(unknown)}")
    # The bounds come aware (the command requires a zone); with USE_TZ = False the ORM takes
    # naive times in TIME_ZONE only.
    created_after, created_before, run_after, run_before = (
        orm_time(t) for t in (created_after, created_before, run_after, run_before))
    by_name = {"tenant_id": "tenant", "search": "q"}
    qs, searched = filtered_jobs({by_name.get(k, k): v for k, v in filters.items()},
                                 tenants=tenants)
    for lookup, value in (("created_at__gte", created_after), ("created_at__lte", created_before),
                          ("run_at__gte", run_after), ("run_at__lte", run_before)):
        if value is not None:
            qs = qs.filter(**{lookup: value})
    if searched:
        qs = newest_per_table(qs, limit=limit)
    return list(with_json_text(qs, limit=None).order_by("-id")[:limit])


def job_row(job_id: Any, *, tenants: TenantScope = None,
            limit: int | None = JSON_PAGE_CHARS) -> Any:
    """One job as its page and ``xjobs show`` read it (JSON columns as text, see
    :func:`with_json_text`); :class:`JobNotFound` for an unknown, malformed or out-of-scope id,
    the same answer for all three."""

    uid = as_uuid(job_id)
    if uid is None:
        raise JobNotFound(f"no job with id {job_id}")
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
