"""A worker's claims, and the fenced writes that end or park its runs: each matches the
run's :class:`Claim` (docs/design.md, "Fencing")."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


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


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimFloors:
    """Where a worker's claim starts its scans while the database's horizon is held
    (worker/floors.py; docs/performance.md, "Under a held horizon"). The due scans of the
    ``queues`` read only the priorities listed, as (queue, priority, floor) triples, each from
    its floor (None: from the start); ``lapsed``: per queue, the earliest lease expiry its
    rescue scan reads. Any other queue is scanned from the start, every priority found by the
    claim itself."""

    queues: frozenset[str] = frozenset()
    floor_queues: tuple[str, ...] = ()
    floor_priorities: tuple[int, ...] = ()
    floor_values: tuple[datetime | None, ...] = ()
    lapsed: Mapping[str, datetime] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DueScan:
    """What a claim's due scan took in one queue and priority: how many rows (before flow
    control held any back), the last one's run_at, and whether any carried a key."""

    queue: str
    priority: int
    found: int
    last: datetime
    keyed: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimScans:
    """What a claim's scans found, per queue, before flow control or a burial took anything
    out (the floors follow these, worker/floors.py): the queues scanned (a paused queue is
    not), the rows the rescue scan read (``lapsed``) and took (``taken``, which count against
    the queue's share), and the due scan's rows per priority."""

    queues: frozenset[str] = frozenset()
    lapsed: Mapping[str, int] = field(default_factory=dict)
    taken: Mapping[str, int] = field(default_factory=dict)
    due: tuple[DueScan, ...] = ()


class ClaimBatch(list[ClaimedJob]):
    """The jobs a claim took; ``held``: how many it held back by flow control (blocked, or due
    later for their rate budget); ``retry_at``: the earliest time a job it held back for its
    rate budget is due again (None when none was); ``now``: the database's clock at the claim,
    what ``retry_at`` is to be compared with (never the worker's wall clock); ``scans``: what
    its scans found (decoded when the engine is asked to)."""

    retry_at: datetime | None = None
    held: int = 0
    now: datetime | None = None
    scans: ClaimScans | None = None


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
    # Retry(max_attempts=n): the job's bound from this retry on (dead at attempt n), raised on
    # the row when it is higher; None keeps the row's.
    max_attempts: int | None = None


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
    # For a failed run's write (job_fail_if_owned) that it applied: the job's run_at, when its
    # next attempt is due if it was retried (the worker's retry line says it).
    run_at: Mapping[str, datetime] = field(default_factory=dict)

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
