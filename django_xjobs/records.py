"""Records that cross the engine seam: frozen, slotted, keyword-only dataclasses.

Engines decode rows into these and services pass these to engines; no dicts and no ORM model
instances travel across ``engines.base``. Standard library only.
"""

from __future__ import annotations

import enum
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal
from uuid import UUID


def decode_stored_json(text: str) -> tuple[Any, str | None]:
    """(value, None) for JSON text as the database stores it, or (None, why) for valid JSON
    that Python's json module refuses: it raises ValueError past
    ``sys.get_int_max_str_digits()`` digits in an integer and RecursionError on deep nesting
    (docs/console.md, "Big and undecodable JSON"). Every reader of stored JSON that must
    survive such a row (the engine's records, the console) decodes through here."""
    try:
        return json.loads(text), None
    except RecursionError:
        return None, "nested too deeply for Python's json module"
    except ValueError as exc:
        return None, str(exc).split(";")[0]


class JobState(enum.StrEnum):
    READY = "ready"
    DELAYED = "delayed"
    RUNNING = "running"
    SUSPENDED = "suspended"
    BLOCKED = "blocked"
    DONE = "done"
    DEAD = "dead"
    CANCELLED = "cancelled"


# The values of JobState as a type: what ``JobRecord.state`` holds (a plain str at run time, as
# read from the row; a type checker then refuses ``record.state == "finished"``).
JobStateName = Literal["ready", "delayed", "running", "suspended", "blocked", "done", "dead",
                       "cancelled"]

# ``blocked``: held back by flow control (a full concurrency key, a paused key) until a slot
# frees or the pause ends; live, so it keeps its idempotency key (docs/flow-control.md).
LIVE_STATES: tuple[str, ...] = ("ready", "delayed", "running", "suspended", "blocked")
TERMINAL_STATES: tuple[str, ...] = ("done", "dead", "cancelled")
ALL_STATES: tuple[str, ...] = LIVE_STATES + TERMINAL_STATES


def new_id() -> UUID:
    """A UUIDv7 (RFC 9562): 48-bit Unix milliseconds, then randomness.

    Time-ordered ids keep the primary-key b-tree append-mostly (a random uuid4 key touches a
    random leaf page per insert, which costs full-page writes on a busy queue table) and make
    "newest first" an index scan on the primary key.
    """
    return new_ids(1)[0]


def new_ids(n: int) -> list[UUID]:
    """``n`` UUIDv7s from one read of the clock and one of the system's randomness (one
    syscall, not n).

    One clock read gives every id of the call the same millisecond: a job's id and run id are
    minted together, and the console finds a job by its run id within the primary-key range of
    that millisecond (``admin.run_id_match``). The standard library's ``uuid.uuid7()`` (Python
    3.14 on; we support 3.11) and the ``uuid6`` package take no timestamp, so a pair made with
    them can straddle a millisecond; ``uuid-utils`` takes one, but is a compiled dependency for
    these few lines. Their counter within a millisecond buys nothing here: nothing orders jobs
    by id within a millisecond (claims order by ``run_at``).
    """
    ms = (time.time_ns() // 1_000_000) & 0xFFFF_FFFF_FFFF
    return _v7([ms] * n)


def run_ids_for(ids: Sequence[UUID]) -> list[UUID]:
    """A fresh UUIDv7 in the millisecond of each of ``ids``: run ids for jobs whose ids were
    minted earlier (the outbox stages a job's id, the relay mints its run id later), so the
    console finds them by run id on the primary key like the API's jobs (``admin.run_id_match``;
    a run id in another millisecond puts its row in ``x_jobs_run_apart_idx``)."""
    return _v7([i.int >> 80 for i in ids])


def _v7(millis: Sequence[int]) -> list[UUID]:
    pool = os.urandom(10 * len(millis))
    ids = []
    for i, ms in enumerate(millis):
        head = (ms << 80) | (0x7 << 76) | (0b10 << 62)  # timestamp, version 7, RFC 4122 variant
        rand = int.from_bytes(pool[10 * i : 10 * i + 10], "big")
        # rand_a: 12 bits above the variant; rand_b: the 62 bits below it.
        rand_a, rand_b = (rand >> 62) & 0x0FFF, rand & 0x3FFF_FFFF_FFFF_FFFF
        ids.append(UUID(int=head | (rand_a << 64) | rand_b))
    return ids


# ------------------------------------------------------------------------------ enqueue --


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSpec:
    """One job as a caller asked for it: the fields an enqueue (:class:`EnqueueParams`) and an
    outbox staging (:class:`OutboxRow`) share. ``input_json`` is already validated and encoded
    by the API layer."""

    id: UUID
    name: str
    queue: str
    input_json: str
    idempotency_key: str | None  # None: the job's own id (never deduplicates)
    priority: int = 0
    run_at: datetime | None = None  # absolute, aware; None = now + delay_ms on the DB clock
    delay_ms: int = 0
    tenant_id: str | None = None
    traceparent: str | None = None
    enqueued_by: str | None = None
    concurrency_key: str | None = None
    rate_key: str | None = None  # ratelimits.py
    # The idempotency window in ms (docs/durable.md, "Idempotency windows"): None for none,
    # UNIQUE_FOREVER for a key that never frees.
    unique_for_ms: int | None = None


# JobSpec.unique_for_ms of ``unique_for="forever"``, as x_jobs.unique_for_ms stores it.
UNIQUE_FOREVER = -1


@dataclass(frozen=True, slots=True, kw_only=True)
class EnqueueParams(JobSpec):
    """One job to insert."""

    run_id: UUID
    max_attempts: int


@dataclass(frozen=True, slots=True, kw_only=True)
class EnqueueResult:
    """What enqueue tells the caller: the live job for the key, and whether this call made it."""

    id: UUID
    run_id: UUID
    created: bool
    # "purged" (and run_id the id) for an idempotency window's holder that retention deleted
    state: str


# ---------------------------------------------------------------------------- job rows --


# What reads why a job is not running (django_xjobs/why.py sets it when it is imported, which
# ``import django_xjobs`` does): this module is below the engines and cannot call them itself.
blocked_by_reader: Callable[[JobRecord], tuple[BlockedBy, ...]] | None = None

# States in which a job waits to run: only these can be held back by anything.
WAITING_STATES: tuple[str, ...] = ("ready", "delayed", "suspended", "blocked")


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptRecord:
    """One run of a job, as its attempt history keeps it (docs/observability.md, "Attempt
    history"): written by the statement that ended the run. ``outcome`` is one of
    ATTEMPT_OUTCOMES; ``error`` the recorded error (class line, message, traceback) or the note
    of a run handed back, else None."""

    attempt: int
    worker: str | None
    started_at: datetime | None
    finished_at: datetime | None
    outcome: str
    error: str | None = None

    @property
    def duration(self) -> float | None:
        """Seconds from start to end, when both are known."""
        if self.started_at is None or self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()


# How a run can end, in the attempt history: the job finished, or failed (retried or dead), or
# ran past its timeout; its lease lapsed (`lost`), it was cancelled, lost its concurrency slot,
# snoozed, parked by a durable step, or was handed back without spending an attempt.
ATTEMPT_OUTCOMES: tuple[str, ...] = (
    "done", "failed", "timeout", "lost", "cancelled", "slot_lost", "snoozed", "suspended",
    "handed_back", "unknown_job",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProgressRecord:
    """A run's last ``ctx.progress(done, total, message)`` and when it reached the database."""

    done: float
    total: float | None
    message: str | None
    at: datetime

    def eta(self, started_at: datetime | None) -> datetime | None:
        """When the run will be done at its pace since ``started_at``: None without a total,
        without progress yet, or without a start."""
        if self.total is None or started_at is None or self.done <= 0:
            return None
        elapsed = (self.at - started_at).total_seconds()
        if elapsed <= 0:
            return None
        left = max(self.total - self.done, 0) * elapsed / self.done
        return self.at + timedelta(seconds=left)

    @property
    def fraction(self) -> float | None:
        """Done as a share of the total, 0 to 1; None without a total."""
        if not self.total:
            return None
        return min(max(self.done / self.total, 0.0), 1.0)


def _parse_moment(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) else None


def attempt_history(entries: Any, *, state: str, attempt: int, worker: str | None,
                    started_at: datetime | None,
                    finished_at: datetime | None) -> list[AttemptRecord]:
    """A job's attempt history: the ``attempts`` column (a JSON list of entries; entries that
    are not objects, from a hand-edited row, are skipped rather than failing the read) and, for
    a ``done`` job, the run that finished it, which the row itself records (its attempt,
    ``claimed_by``, ``started_at``, ``finished_at``): the acknowledgement writes no entry of
    its own, the hot path's cheapest form (docs/observability.md, "Attempt history")."""
    history = _entries(entries)
    if state == "done":
        history.append(AttemptRecord(attempt=attempt, worker=worker, started_at=started_at,
                                     finished_at=finished_at, outcome="done"))
    return history


def _entries(entries: Any) -> list[AttemptRecord]:
    if not isinstance(entries, list):
        return []
    return [
        AttemptRecord(
            attempt=int(e.get("attempt") or 0), worker=e.get("worker"),
            started_at=_parse_moment(e.get("started_at")),
            finished_at=_parse_moment(e.get("finished_at")),
            outcome=str(e.get("outcome") or "?"), error=e.get("error"),
        )
        for e in entries if isinstance(e, dict)
    ]


def progress_from_json(value: Any) -> ProgressRecord | None:
    """The ``progress`` column as a record (None when the run never reported any)."""
    at = _parse_moment(value.get("at")) if isinstance(value, dict) else None
    if not isinstance(value, dict) or at is None:
        return None
    total = value.get("total")
    return ProgressRecord(done=float(value.get("done") or 0),
                          total=float(total) if total is not None else None,
                          message=value.get("message"), at=at)


class _BlocksLazily:
    """The ``blocked_by`` of a :class:`JobRecord`: read on first access, then kept.

    A slot of this plain base class, not a dataclass field: it is not part of the record's
    value (equality, ``dataclasses.fields``, JSON output), and reading a job
    (``get_job``, polled by ``JobHandle.wait()``) costs no statement more for it.
    """

    __slots__ = ("_blocked_by",)
    _blocked_by: tuple[BlockedBy, ...]

    @property
    def blocked_by(self) -> tuple[BlockedBy, ...]:
        """Every reason the job is not running now, most binding first (docs/flow-control.md,
        "Why is a job not running?"); empty for a running, finished or claimable job. Read on
        first access, on the database's state at that moment."""
        try:
            return self._blocked_by
        except AttributeError:
            pass
        record: JobRecord = self  # type: ignore[assignment]
        if record.state not in WAITING_STATES:
            value: tuple[BlockedBy, ...] = ()
        elif blocked_by_reader is None:
            raise RuntimeError("blocked_by needs django_xjobs.why, which `import django_xjobs` "
                               "loads; import the package before reading it")
        else:
            value = blocked_by_reader(record)
        object.__setattr__(self, "_blocked_by", value)
        return value


@dataclass(frozen=True, slots=True, kw_only=True)
class JobRecord(_BlocksLazily):
    """A whole ``x_jobs`` row, for inspection (CLI, admin actions, handles).

    ``input_error`` / ``result_error``: why Python's ``json`` module could not decode the stored
    input / result (valid ``jsonb`` it refuses: an integer past ``sys.get_int_max_str_digits()``
    digits, nesting deeper than its recursion limit). ``input`` is then ``{}`` and ``result``
    ``None``; the console and ``manage.py xjobs show`` print the stored text
    (docs/console.md, "Big and undecodable JSON").
    """

    id: UUID
    name: str
    queue: str
    input: dict[str, Any]  # the keyword arguments the function is called with
    idempotency_key: str  # the job's id when none was given
    run_id: UUID
    attempt: int
    max_attempts: int
    state: JobStateName
    run_at: datetime
    visible_at: datetime | None
    claimed_by: str | None
    last_error: str | None
    tenant_id: str | None
    traceparent: str | None
    enqueued_by: str | None
    created_at: datetime
    updated_at: datetime
    priority: int
    result: Any
    lease_token: UUID | None
    concurrency_key: str | None
    started_at: datetime | None
    finished_at: datetime | None
    rescues: int  # times a lapsed lease was taken over by another claim
    worker_ids: list[str] = field(default_factory=list)
    input_error: str | None = None
    result_error: str | None = None
    # Every run that ended, oldest first: the first and the newest 20 (docs/observability.md).
    attempts: list[AttemptRecord] = field(default_factory=list)
    progress: ProgressRecord | None = None
    # A child job's parent and the parent's step that waits for it (docs/durable.md).
    parent_id: UUID | None = None
    parent_step: str | None = None
    # The idempotency window it was enqueued with, in ms; -1 for "forever".
    unique_for_ms: int | None = None

    @property
    def is_live(self) -> bool:
        return self.state in LIVE_STATES

    @property
    def is_finished(self) -> bool:
        return self.state in TERMINAL_STATES


@dataclass(frozen=True, slots=True, kw_only=True)
class Claim:
    """One run's hold on a job: the job's id and the lease token its claim wrote.

    Every write a run makes is fenced on this pair (docs/design.md, "Fencing"), and it is how the
    pair travels: in the fenced writes below, the heartbeat's renewals, a step's owner and the
    wake-up of a job handed back. The token alone names the run (a claim writes a fresh one, never
    reused); the job id is what the statements' primary-key lookups need.
    """

    job_id: str
    lease_token: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimedJob:
    """A job this worker now owns under ``lease_token`` until the lease lapses.

    Ids and tokens stay strings on the hot path: they only travel back to the database.
    ``input_error``: why Python could not decode the stored input (``input`` is then None); the
    worker sends such a job to ``dead`` without running it (worker/executor.py).
    """

    id: str
    lease_token: str
    name: str
    queue: str
    input: Any
    run_id: str
    attempt: int
    max_attempts: int
    tenant_id: str | None
    traceparent: str | None
    concurrency_key: str | None
    # True when this claim resumed a suspended job: it did not spend an attempt, so handing it
    # back must not give one back either.
    resumed: bool
    input_error: str | None = None
    # The concurrency slot the claim took for this run (its key is concurrency_key), and the
    # limit it was taken under; None for a job without a key.
    slot: int | None = None
    slot_limit: int | None = None
    # A child job's parent (ctx.step.invoke / gather). The worker acknowledges children of
    # several parents in one statement (worker/settle.py says why that waits on no one).
    parent_id: str | None = None

    @property
    def claim(self) -> Claim:
        return Claim(job_id=self.id, lease_token=self.lease_token)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimFlow:
    """What a worker tells the claim about flow control (docs/flow-control.md), as parallel
    arrays: built once per worker from its job definitions and settings (worker/flow.py)."""

    slot_ttl_ms: int
    limit_names: tuple[str, ...] = ()  # job name -> its Concurrency(limit=...)
    limit_values: tuple[int, ...] = ()
    prefixes: tuple[str, ...] = ()  # XJOBS["CONCURRENCY_LIMITS"], any order
    prefix_limits: tuple[int, ...] = ()
    rate_names: tuple[str, ...] = ()  # job name -> its RateLimit
    rate_limits: tuple[int, ...] = ()
    rate_periods_ms: tuple[int, ...] = ()
    rate_costs: tuple[int, ...] = ()
    fair_queues: frozenset[str] = frozenset()  # queues shared between tenants
    weight_queues: tuple[str, ...] = ()  # (queue, tenant) -> weight; '' is the NULL tenant
    weight_tenants: tuple[str, ...] = ()
    weight_values: tuple[int, ...] = ()
    # Whether a job the claim holds back (no free slot, a paused key) is parked in `blocked`:
    # not while the fleet is kept compatible with a release that does not know that state
    # (x_fleet; docs/deployment.md, "Mixed versions"). Then it is due again hold_ms later.
    park: bool = True
    hold_ms: int = 1000


class ClaimBatch(list[ClaimedJob]):
    """The jobs a claim took; ``held``: how many it held back by flow control (blocked, or due
    later for their rate budget); ``retry_at``: the earliest time a job it held back for its
    rate budget is due again (None when none was); ``now``: the database's clock when it held
    jobs back, what ``retry_at`` is to be compared with (never the worker's wall clock)."""

    retry_at: datetime | None = None
    held: int = 0
    now: datetime | None = None


# ------------------------------------------------------------------------ fenced writes --


class Fence(enum.Enum):
    """How a fenced write ended."""

    OWNED = "owned"  # this call applied the write
    ALREADY_APPLIED = "already_applied"  # an earlier try of the same write committed (ambiguous)
    LOST = "lost"  # the run no longer owns the job: cancelled, re-claimed, or gone
    # Another transaction holds the job's row (a request, an operator, a report): nothing was
    # written and nothing was waited for; write again once the row is free (docs/design.md,
    # "Lock order").
    BUSY = "busy"


@dataclass(frozen=True, slots=True, kw_only=True)
class Completion:
    """A run that returned: mark done with its JSON result (``None`` for no result)."""

    claim: Claim
    result_json: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Failure:
    """A run that raised: retry after ``retry_delay_ms`` or go ``dead`` (attempts used up or
    ``permanent``). The engine decides which from the row, so the choice is made under the fence."""

    claim: Claim
    error: str
    retry_delay_ms: int
    permanent: bool = False
    outcome: str = "failed"  # the attempt history's: `failed` or `timeout`


@dataclass(frozen=True, slots=True, kw_only=True)
class Requeue:
    """Give the job back without spending an attempt: snooze, graceful shutdown, lost slot.

    ``spent_attempt`` is whether the claim counted one (not when it resumed a suspended job), so
    the attempt counter returns to where it was before the claim.
    """

    claim: Claim
    delay_ms: int
    spent_attempt: bool
    resumed: bool
    note: str | None = None
    outcome: str = "handed_back"  # the attempt history's: also `snoozed`, `slot_lost`


@dataclass(frozen=True, slots=True, kw_only=True)
class UnknownGiveBack:
    """Give back a job whose name the claiming worker does not know, without spending an
    attempt (job_give_back_unknown_if_owned): due again after the time it has waited so far
    (at least a second), at most ``max_delay_ms`` later; ``note`` is its last error."""

    claim: Claim
    spent_attempt: bool
    resumed: bool
    note: str
    max_delay_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class UnknownWait:
    """Jobs of one queue and name that wait for a worker knowing the name (jobs_unknown_waiting):
    how many, since when the oldest waits (and for how many seconds, on the database clock),
    and the cron tasks (XJOBS["SCHEDULE"] keys) that enqueued any of them."""

    queue: str
    name: str
    count: int
    since: datetime
    waited: float
    cron_tasks: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Suspension:
    """Park the job until ``wake_at`` (a durable sleep or an event wait); the resume is free."""

    claim: Claim
    wake_at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class FenceReport:
    """Outcome of a batch of fenced writes, per LEASE TOKEN (one per claim).

    Keyed by token, not job id: a worker may hold two runs of one job (a stale run still
    executing when the job was re-claimed), and they must never share an answer.
    """

    owned: frozenset[str] = frozenset()
    already_applied: frozenset[str] = frozenset()
    lost: frozenset[str] = frozenset()
    # Rows another transaction holds: not written, not lost; the caller writes them again later.
    busy: frozenset[str] = frozenset()
    # For already-applied writes: the state the earlier, committed try left the job in.
    states: Mapping[str, str] = field(default_factory=dict)

    def outcome(self, lease_token: str) -> Fence:
        if lease_token in self.owned:
            return Fence.OWNED
        if lease_token in self.busy:
            return Fence.BUSY
        if lease_token in self.already_applied:
            return Fence.ALREADY_APPLIED
        return Fence.LOST


@dataclass(frozen=True, slots=True, kw_only=True)
class Renewal:
    """A heartbeat's answer, per lease token: the leases it renewed on their rows, and those it
    kept beside a row another transaction holds (``x_lease_extensions``: no claim takes them
    over until the extension ends). Both hold for a whole lease from the moment it was sent;
    every other token lost its job."""

    renewed: frozenset[str] = frozenset()
    kept: frozenset[str] = frozenset()

    @property
    def held(self) -> frozenset[str]:
        return self.renewed | self.kept


# --------------------------------------------------------------------------- steps, events --


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOwner:
    """Whose step writes these are: the job, the claim (fence) and the run (step key)."""

    claim: Claim
    run_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRecord:
    """One row of ``x_job_steps``; ``due`` is ``wake_at <= now()`` on the database clock."""

    name: str
    status: str
    output: Any
    attempts: int
    error: str | None
    started_at: datetime | None
    completed_at: datetime | None
    wake_at: datetime | None
    event: str | None
    correlation_key: str | None
    event_id: int | None
    event_published_at: datetime | None
    due: bool = False
    # run, sleep, event, event_any, invoke; None on rows recorded before kinds were.
    kind: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class InvokeStep:
    """An invoke or gather step, opened or locked (docs/durable.md, "Child jobs"): its
    children's ids, whether this call opened it, whether its timeout has come, and when the
    parent is claimed again if no child wakes it first."""

    children: list[str]
    opened: bool
    due: bool
    park_at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class ChildState:
    """One child of an invoke or gather step as its parent reads it; ``state`` None: the child
    is gone (purged)."""

    id: UUID
    name: str | None
    state: str | None
    result: Any
    error: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ParkedStep:
    """A step that waits: since when, until when, and whether that moment has come."""

    started_at: datetime
    wake_at: datetime
    due: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class EventRecord:
    id: int
    name: str
    payload: Any
    correlation_key: str | None = None
    published_at: datetime
    expires_at: datetime | None = None


# ---------------------------------------------------------------------------- operations --


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueStats:
    """Six exclusive buckets (a live row is in exactly one) plus finished counts."""

    queue: str
    ready: int = 0
    delayed: int = 0
    running: int = 0
    suspended: int = 0
    dead: int = 0
    done: int = 0
    cancelled: int = 0
    blocked: int = 0  # held back by flow control (docs/flow-control.md)

    @property
    def live(self) -> int:
        return self.ready + self.delayed + self.running + self.suspended + self.blocked


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueDepth:
    """A queue's live buckets (exclusive, as in :class:`QueueStats`) and how long its oldest
    due job has waited, in seconds (None when none is due): read through the live rows' indexes,
    never the history (docs/observability.md)."""

    queue: str
    ready: int = 0
    delayed: int = 0
    running: int = 0
    suspended: int = 0
    blocked: int = 0
    oldest_ready_age: float | None = None


# Upper bounds (milliseconds) of the wait and run time histograms; a value v falls in the first
# bucket whose bound is >= v, the last bucket is unbounded (docs/observability.md, "Counters").
HISTOGRAM_BOUNDS_MS = (5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000,
                       60_000, 300_000, 900_000, 3_600_000)


@dataclass(frozen=True, slots=True, kw_only=True)
class Counters:
    """The counters of one queue (and job name, for all-time totals) over one time bucket
    (``at``; the epoch for all-time): docs/observability.md, "Counters". The histograms count
    the waits (due to start) and run times per bucket of :data:`HISTOGRAM_BOUNDS_MS`, the
    last bucket unbounded; not cumulative."""

    queue: str
    name: str | None = None
    at: datetime | None = None
    enqueued: int = 0
    started: int = 0
    done: int = 0
    failed: int = 0
    dead: int = 0
    cancelled: int = 0
    wait_ms_sum: int = 0
    run_ms_sum: int = 0
    wait_hist: tuple[int, ...] = ()
    run_hist: tuple[int, ...] = ()

    @property
    def mean_wait(self) -> float | None:
        """Mean wait from due to start, in seconds (None without starts)."""
        return self.wait_ms_sum / self.started / 1000 if self.started else None

    @property
    def mean_run(self) -> float | None:
        """Mean run time of the finished runs, in seconds (None without any)."""
        ended = self.done + self.failed
        return self.run_ms_sum / ended / 1000 if ended else None


@dataclass(frozen=True, slots=True, kw_only=True)
class ChangeResult:
    """An operator action on one job: the row after it, and whether this call changed it."""

    job: JobRecord | None
    changed: bool
    reason: str = ""


# ------------------------------------------------------------------------------ backfills --

# A pass is `pending` from `xjobs_backfill start` until a worker opens it, `running` while a
# worker (or a retry due soon) owns it, and ends `completed`, `failed` (cursor kept: a retry
# resumes there) or `cancelled` (also resumable). See django_xjobs/backfills.py.
BACKFILL_STATUSES: tuple[str, ...] = ("pending", "running", "completed", "failed", "cancelled")


@dataclass(frozen=True, slots=True, kw_only=True)
class BackfillRecord:
    """One ``x_backfills`` row: a pass of a backfill, keyed by the run_id of the job running it.

    ``job_state`` and ``job_attempt`` come from the pass's job row (None when the job is gone,
    or when the statement that returned this record does not read it).
    """

    run_id: UUID
    name: str
    status: str
    rows_processed: int
    last_cursor: Any
    checksum: str | None
    app_version: str | None
    started_at: datetime
    completed_at: datetime | None
    updated_at: datetime | None
    error: str | None
    job_id: UUID | None
    code_changes: list[dict[str, Any]] = field(default_factory=list)
    job_state: str | None = None
    job_attempt: int | None = None


# ---------------------------------------------------------------------------------- outbox --


@dataclass(frozen=True, slots=True, kw_only=True)
class OutboxRow(JobSpec):
    """One ``x_outbox`` row: a job staged by ``enqueue_on_commit``, not yet (or being) relayed.

    ``id`` is also the id the job gets when the relay publishes it (unless an idempotency key
    names a live job already). Staged with either ``run_at`` (absolute) or ``delay_ms``
    (counted from the staging); a claimed row carries the resolved ``run_at`` (None: due now)
    and ``delay_ms = 0``. ``enqueued_by`` is None when the stager knew nobody better than
    "outbox" (docs/transactional-enqueue.md).
    """

    max_attempts: int | None  # None: XJOBS["MAX_ATTEMPTS"] when the relay publishes it


@dataclass(frozen=True, slots=True, kw_only=True)
class OutboxStatus:
    """Where a staged row is: pending (``published_at`` None) or relayed into job ``job_id``."""

    id: UUID
    name: str
    staged_at: datetime
    published_at: datetime | None
    job_id: UUID | None
    input: Any = None  # the job's input as staged


# ------------------------------------------------------------------------------ rate limits --


@dataclass(frozen=True, slots=True)
class RateRequest:
    """One spending of a budget: ``cost`` units of ``key`` under ``limit`` per ``period_ms``."""

    key: str
    limit: int
    period_ms: int
    cost: int
# ------------------------------------------------------------- why a job is not running --

# Every kind of BlockedBy, in the order two reasons with the same end are listed: an operator's
# pause, then a missing worker, then a full key (django_xjobs/why.py sorts by the end first).
BLOCKED_KINDS: tuple[str, ...] = ("queue_paused", "key_paused", "no_worker", "unknown_job",
                                  "slot_full", "rate_limit", "backoff", "delayed")

BlockedKind = Literal["delayed", "backoff", "queue_paused", "key_paused", "slot_full",
                      "rate_limit", "no_worker", "unknown_job"]


def _moment(value: datetime | None) -> str:
    return value.isoformat(sep=" ", timespec="seconds") if value is not None else "?"


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockedBy:
    """One reason a job is not running now (django_xjobs/why.py), with its end where it has one.

    ``until``: when the reason ends by itself (a delay, a backoff, a timed pause, the rate
    budget's next room); None when it lasts until something happens (a resume, a slot freed,
    a worker started). ``key`` is the concurrency or rate-limit key, ``queue`` the queue;
    ``holders`` and ``limit`` describe a full concurrency key. ``unknown_job``: no worker that
    claimed job ``name`` knows it; ``workers`` are the last of them, ``since`` when its wait
    began, ``until`` its next try, ``reason`` where the name was expected.
    """

    kind: BlockedKind
    until: datetime | None = None
    key: str | None = None
    queue: str | None = None
    reason: str | None = None
    holders: tuple[str, ...] = ()
    limit: int | None = None
    name: str | None = None
    since: datetime | None = None
    workers: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        """The reason as a sentence for a person (the ``xjobs why`` line, the console)."""
        if self.kind == "delayed":
            return f"delayed until {_moment(self.until)}"
        if self.kind == "backoff":
            return f"retry backoff until {_moment(self.until)}"
        if self.kind in ("queue_paused", "key_paused"):
            what = f"queue {self.queue}" if self.kind == "queue_paused" else f"key {self.key}"
            until = f"until {_moment(self.until)}" if self.until else "until resumed"
            reason = f", {self.reason}" if self.reason else ""
            return f"{what} paused ({until}{reason})"
        if self.kind == "slot_full":
            return (f"slot full: key {self.key} has all {self.limit} slot(s) held "
                    f"({', '.join(self.holders)})")
        if self.kind == "rate_limit":
            if self.until is None:
                return f"rate limit of key {self.key}: its cost exceeds the whole limit"
            return f"rate limit of key {self.key} (next unit at {_moment(self.until)})"
        if self.kind == "unknown_job":
            who = f"workers {', '.join(self.workers)}" if self.workers else "the workers"
            hint = f"; {self.reason}" if self.reason else ""
            return (f"no worker that knows job {self.name!r} has claimed it: {who} do not "
                    "know it (deployed to web before the workers?); waiting since "
                    f"{_moment(self.since)}, next try at {_moment(self.until)}{hint}")
        return f"no worker serving queue {self.queue} in the last 5 minutes"


@dataclass(frozen=True, slots=True, kw_only=True)
class FlowFacts:
    """What holds one job back, read in one statement (``why_job``): the row's own fields as
    they are now, and the flow-control rows that concern it, on the database clock ``now``."""

    id: UUID
    name: str
    queue: str
    state: JobStateName
    run_at: datetime
    attempt: int
    last_error: str | None
    concurrency_key: str | None
    rate_key: str | None
    blocked_on: str | None
    now: datetime
    pauses: tuple[PauseRecord, ...]  # in force for its queue, its concurrency or rate key
    holders: tuple[str, ...]  # the live holders of its concurrency key's slots
    worker_seen: bool  # an x_workers row names its queue, seen in the last 5 minutes
    # Waiting for a worker that knows its name (job_give_back_unknown_if_owned): since when,
    # the last workers that gave it back, and the cron task that enqueued it ("cron:<task>").
    unknown_since: datetime | None = None
    unknown_workers: tuple[str, ...] = ()
    enqueued_by: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RateWindow:
    """A rate-limit key's spending over one period (``why_rate_window``): ``next_at`` is when
    enough units leave the window for ``cost`` more to fit (None: it fits now, or never does
    because the cost exceeds the limit)."""

    key: str
    spent: int
    next_at: datetime | None


# ------------------------------------------------------------------------ concurrency slots --


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotRequest:
    """One run asking for a slot of ``slot_key`` below ``limit`` (django_xjobs/slots.py).

    ``holder`` names the run and nothing else: it contains the claim's lease token, which no
    other run ever carries, so renewals and releases fenced on it touch this run's slot only.
    """

    slot_key: str
    limit: int
    holder: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotHold:
    """A slot a run was granted: what its renewals and its release are fenced on, and the
    limit it was granted under (its release wakes that many blocked jobs at most)."""

    slot_key: str
    slot: int
    holder: str
    limit: int = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotRecord:
    """A live ``x_job_leases`` row, for operators (``manage.py xjobs slots``)."""

    slot_key: str
    slot: int
    holder: str
    expires_at: datetime
    expires_in: float  # seconds, on the database clock


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotUsage:
    """How many slots of one key are held now (live rows only), for the stats."""

    slot_key: str
    held: int
    next_expiry: datetime


# ------------------------------------------------------------------------------ workers --


# How long a worker may go without a heartbeat, a round of its loop, or (with room and a due job)
# a claim before it reads as stalled, unless the reader says otherwise (seconds): the console,
# `manage.py xjobs workers / health` and the metrics judge alike. Longer than
# XJOBS["WORKER_SEEN_INTERVAL"] and XJOBS["POLL_INTERVAL"] (10 s and 1 s by default), or
# healthy workers read as stalled.
DEFAULT_MAX_STALL = 300.0


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerRecord:
    """An ``x_workers`` row: a worker process seen in the last day and what its heartbeat
    reported (``manage.py xjobs workers``, docs/observability.md, "Workers and health probes").
    The times are the database's. ``stalled`` says why the worker is stalled (no heartbeat, a
    wedged loop, no claim although its queues had due jobs), None when it is not."""

    id: str
    host: str
    pid: int
    queues: tuple[str, ...]
    version: str
    concurrency: int
    running: int  # runs in flight at its last heartbeat
    finished: int  # runs it finished since it started
    started_at: datetime
    seen_at: datetime  # its last heartbeat
    claimed_at: datetime | None  # when its loop last claimed a job (None: never)
    loop_at: datetime | None  # when its loop last went round
    stalled: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetRecord:
    """The ``x_fleet`` row (docs/deployment.md, "Mixed versions"): the oldest release series
    still allowed to share the tables (None: nothing older than this version), and when and by
    whom that was set (None and "" when no row was ever written)."""

    compatible_with: str | None = None
    changed_at: datetime | None = None
    changed_by: str = ""


# ------------------------------------------------------------------------------- pauses --


@dataclass(frozen=True, slots=True, kw_only=True)
class PauseRecord:
    """A pause in force (``x_flow_pauses``): of a queue (``kind="queue"``) or of a key
    (``kind="key"``), until ``until`` (None: until resumed). ``blocked``: how many jobs are
    blocked on the key now (0 for a queue). The reads of ``xjobs why`` leave ``paused_at`` and
    ``blocked`` out (None, 0)."""

    kind: str  # "queue" | "key"
    key: str
    until: datetime | None
    reason: str | None
    paused_at: datetime | None = None
    blocked: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyPauseRequeue:
    """A run that raised ``PauseKey``: give the job back due now without spending an attempt
    (as :class:`Requeue`) and pause ``key`` for ``for_ms``, in one fenced write."""

    claim: Claim
    key: str
    for_ms: int
    reason: str | None
    spent_attempt: bool
    resumed: bool
    note: str | None = None


# ----------------------------------------------------------------------------- scheduler --


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaderFence:
    """What a scheduler round's statements check to be sure it still leads (scheduler/).

    Lease mode: the lease row of ``lock_key`` names ``holder`` and has more than ``margin_ms``
    left on the database clock. Advisory mode (``advisory_pid`` set): the backend with that
    pid holds the session advisory lock of ``lock_key``.
    """

    lock_key: str
    holder: str
    margin_ms: int = 0
    advisory_pid: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaderRecord:
    """Who leads the scheduler now. ``holder`` is the worker id (lease mode) or the
    ``application_name`` of the backend holding the advisory lock."""

    lock_key: str
    mode: str  # "lease" | "advisory"
    holder: str
    expires_at: datetime | None = None  # lease mode only
    live: bool = True  # lease mode: expires_at > now() on the database clock
    pid: int | None = None  # advisory mode: the backend holding the lock


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerStateRecord:
    """One ``x_scheduler_state`` row: a task's watermark and whether it is paused."""

    task_name: str
    last_fired_at: datetime
    paused: bool
    updated_at: datetime
    # Occurrences its overlap policy did not enqueue, and the latest (docs/scheduling.md,
    # "Overlap").
    overlap_skipped: int = 0
    overlap_skipped_at: datetime | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LockedStates:
    """The state rows a round locked until its transaction ends.

    ``leading`` False: the fence failed, this process no longer leads (nothing was locked).
    A task missing from ``watermarks`` while leading: another round holds its row (skipped, not
    waited for), or it has none.
    """

    leading: bool
    watermarks: Mapping[str, datetime] = field(default_factory=dict)
    paused: frozenset[str] = frozenset()


# ---- cron overlap (docs/scheduling.md, "Overlap") ----


@dataclass(frozen=True, slots=True, kw_only=True)
class CronRun:
    """A live run of a cron task (``enqueued_by = "cron:<task>"``), as a round's overlap
    policy sees it. ``buffered``: a run held back by ``overlap="buffer_one"`` until the runs
    before it finish (blocked on its own ``enqueued_by``)."""

    enqueued_by: str
    id: str
    state: str
    blocked_on: str | None = None
    # Read locked (buffer_one, cancel_previous) but another transaction holds its row: the
    # round leaves the task for a later round rather than wait (cron_runs_lock_live).
    held: bool = False

    @property
    def buffered(self) -> bool:
        return self.state == "blocked" and self.blocked_on == self.enqueued_by

# ------------------------------------------------------------------------------ console --
# Monitoring reads for the operations console (django_xjobs/reads.py): the catalog figures
# that say whether PostgreSQL can still clean up after the queue.


@dataclass(frozen=True, slots=True, kw_only=True)
class HistoryTable:
    """One history table of finished jobs (``x_jobs_<state>_<yyyymmdd>``): the planner's
    estimate of its rows, and its size on disk with its indexes and its steps' table."""

    table: str
    rows: int
    size_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TableHealth:
    """Vacuum state of one ``x_`` table, from ``pg_stat_user_tables`` and ``pg_class``."""

    table: str
    live_tuples: int
    dead_tuples: int
    last_vacuum: datetime | None  # the later of the manual and the automatic one
    last_analyze: datetime | None
    xid_age: int  # age(relfrozenxid), of the table or its TOAST table, whichever is older
    freeze_max_age: int  # autovacuum_freeze_max_age: an anti-wraparound vacuum starts here
    size_bytes: int

    @property
    def dead_ratio(self) -> float:
        total = self.live_tuples + self.dead_tuples
        return self.dead_tuples / total if total else 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class XminHolder:
    """Something that keeps VACUUM from removing dead rows: an open transaction of this
    database, a replication slot, or a prepared transaction."""

    kind: str  # "transaction", "replication slot", "prepared transaction"
    name: str  # application name / user, slot name, or the prepared transaction's gid
    pid: int | None
    state: str | None  # "active", "idle in transaction", ... (slots: "active"/"inactive")
    started_at: datetime | None
    age_seconds: float | None
    xmin_age: int | None  # transactions since the snapshot it holds was taken
    query: str | None
