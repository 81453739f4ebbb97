"""THE SEAM: every database operation django-xjobs performs, one method each.

Services (api, worker, scheduler, ...) call these methods through :func:`engines.get_engine` and
never build SQL. An engine turns each method into one named statement of its wire format
(``engines/<engine>/statements/``) and decodes rows into :mod:`django_xjobs.records`.

Names are noun-first and carry their guard: ``jobs_complete_if_owned`` may only change rows whose
``lease_token`` is the caller's; a plural noun means the method takes a batch.

Every engine must pass ``tests/conformance/`` unchanged; behaviour an engine cannot offer is
declared in :class:`~django_xjobs.engines.features.Features` (``engines/features.py``), and
tests skip by flag, never by vendor.

Transactions: every method runs on the Django connection of the engine's alias *in the current
thread*, so inside ``transaction.atomic()`` it joins the caller's transaction, and outside one
it is its own (autocommit) transaction.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import LiteralString
from uuid import UUID

from ..records import (
    BackfillRecord,
    ChangeResult,
    ChildState,
    Claim,
    ClaimBatch,
    ClaimedJob,
    ClaimFloors,
    ClaimFlow,
    Completion,
    Counters,
    CronRun,
    EnqueueParams,
    EnqueueResult,
    EventRecord,
    Failure,
    FenceReport,
    FleetRecord,
    FlowFacts,
    HandOver,
    HistoryTable,
    InvokeStep,
    JobRecord,
    KeyPauseRequeue,
    LeaderFence,
    LeaderRecord,
    LockedStates,
    OutboxRow,
    OutboxStatus,
    ParkedStep,
    PauseRecord,
    QueueDepth,
    QueueStats,
    RateRequest,
    RateWindow,
    Renewal,
    Requeue,
    ResumeResult,
    RunOwner,
    SchedulerStateRecord,
    SlotHold,
    SlotRecord,
    SlotRelease,
    SlotRequest,
    SlotUsage,
    StepRecord,
    Suspension,
    TableHealth,
    UnknownGiveBack,
    UnknownWait,
    WorkerRecord,
    XminHolder,
)
from .features import Features
from .routines import Routine


@dataclass(frozen=True, slots=True)
class Statement:
    """One named statement of an engine's wire format.

    ``sql`` uses ``%(name)s`` placeholders (bound by the driver, never formatted into the text);
    ``why`` says why its filters exist, and is printed by ``manage.py xjobs_sql``.
    """

    name: str
    sql: LiteralString
    why: str


# A statement's placeholder (``%(name)s``), an escaped percent sign (``%%``), or any other
# use of ``%``, which no statement makes.
_PLACEHOLDER = re.compile(r"%(?:\((\w+)\)s|(%)|.|$)", re.DOTALL)


def numbered(sql: str) -> tuple[str, tuple[str, ...]]:
    """``sql`` with PostgreSQL's numbered placeholders, as PREPARE and the protocol take them,
    and the parameters' names in that order: ``%(name)s`` becomes ``$n``, one number per name
    in order of first use however often it appears, and ``%%`` becomes ``%``. Any other ``%``
    is refused (ValueError), as the driver would refuse it."""
    numbers: dict[str, int] = {}  # each name's number, in order of first use

    def number(match: re.Match[str]) -> str:
        name, percent = match.group(1), match.group(2)
        if percent:
            return "%"
        if name is None:
            raise ValueError(f"{match.group(0)!r} is not a placeholder: write %(name)s or %%")
        return f"${numbers.setdefault(name, len(numbers) + 1)}"

    return _PLACEHOLDER.sub(number, sql), tuple(numbers)


class Listener(abc.ABC):
    """A dedicated connection that receives enqueue wake-ups (the queue names)."""

    @abc.abstractmethod
    def wait(self, timeout: float) -> list[str]:
        """Block up to ``timeout`` seconds; return the queue names notified (may be empty).

        Raises :class:`ListenerLost` when the connection is gone; the caller reconnects.
        """

    @abc.abstractmethod
    def close(self) -> None: ...


class AdvisorySession(abc.ABC):
    """A dedicated, non-pooled connection holding the scheduler's session advisory lock
    (``XJOBS["LEADER"] = "advisory"``). The lock lives exactly as long as this session: behind
    a transaction pooler a session is not a client's, so this mode is unsafe there."""

    backend_pid: int

    @abc.abstractmethod
    def try_lock(self) -> bool:
        """Take the lock if free (never waits); True if this session holds it now."""

    @abc.abstractmethod
    def holds(self) -> bool:
        """Whether this session still holds the lock (raises SessionLost if the session is gone)."""

    @abc.abstractmethod
    def unlock(self) -> None: ...

    @abc.abstractmethod
    def close(self) -> None: ...


class Engine(abc.ABC):
    """The operations. See the module docstring for the transaction rule."""

    features: Features = Features()

    def __init__(self, alias: str) -> None:
        self.alias = alias

    # -------------------------------------------------------------------- statements --
    @abc.abstractmethod
    def statements(self) -> Mapping[str, Statement]:
        """Every statement of this engine by name (``manage.py xjobs_sql``, statement lint)."""

    @abc.abstractmethod
    def routines(self) -> tuple[Routine, ...]:
        """The functions, aggregates and triggers the migrations keep in this engine's database
        for its statements, as they are today, each before what calls it (``manage.py
        xjobs_sql`` prints them after the statements). No operation runs one by name: the
        statements call them."""

    # ----------------------------------------------------------------------- enqueue --
    @abc.abstractmethod
    def job_enqueue(self, params: EnqueueParams) -> EnqueueResult:
        """Insert one job, or return the live job holding ``(name, tenant, key)``."""

    @abc.abstractmethod
    def jobs_enqueue(self, batch: Sequence[EnqueueParams]) -> list[EnqueueResult]:
        """Insert many jobs in one statement; results in input order. Keys dedupe within the
        batch too: two items with one key give one job, and both results name it."""

    @abc.abstractmethod
    def job_find_live_by_key(
        self, name: str, tenant_id: str | None, idempotency_key: str
    ) -> EnqueueResult | None: ...

    @abc.abstractmethod
    def job_enqueue_debounced(self, params: EnqueueParams, *, debounce_ms: int,
                              max_wait_ms: int | None) -> EnqueueResult:
        """Debounce on the live key ``(name, tenant, params.idempotency_key)``
        (docs/flow-control.md, "Debounce"), in one transaction (the caller's, or its own).

        A pending live job takes ``params``' input and is due ``debounce_ms`` from now, but no
        later than ``max_wait_ms`` after its creation (``created`` False). A live job already
        under way keeps its input and leaves the key; ``params`` is inserted as its follow-up,
        due after ``debounce_ms``, as it is when no job is live (``created`` True).
        """

    # ----------------------------------------------------------- idempotency windows --
    # job_enqueue and jobs_enqueue take params.unique_for_ms (docs/durable.md, "Idempotency
    # windows"): a windowed enqueue returns the live job of the key, or the job that finished
    # less than its window ago, created False.
    @abc.abstractmethod
    def job_keys_purge_expired(self, *, batch_size: int = 1000) -> int:
        """Delete the idempotency-window rows whose window ended, in bounded batches; how
        many."""

    # ------------------------------------------------------------------ worker side --
    @abc.abstractmethod
    def jobs_claim(
        self, *, wants: Mapping[str, int], worker_id: str, lease_ms: int,
        flow: ClaimFlow | None = None, cursors: Mapping[str, str] | None = None,
        floors: ClaimFloors | None = None,
    ) -> ClaimBatch:
        """Lease up to ``wants[queue]`` due jobs of each queue, plus lapsed ``running`` jobs,
        under flow control (docs/flow-control.md): pauses, rate budgets (``flow``'s limits) and
        concurrency slots are decided here, and what they hold back is not claimed. A fair
        queue starts after ``cursors[queue]``, the last tenant this worker served there. A queue
        with ``floors`` is scanned from them (docs/performance.md, "Under a held horizon")."""

    # The fenced writes of runs never wait on a row another transaction holds (docs/design.md,
    # "Lock order"): such a run is answered busy in the report (nothing written), and the
    # worker writes it again later.
    @abc.abstractmethod
    def jobs_complete_if_owned(self, batch: Sequence[Completion]) -> FenceReport: ...

    @abc.abstractmethod
    def jobs_complete_release_if_owned(
        self, batch: Sequence[Completion], holds: Sequence[SlotHold],
        offer: HandOver | None = None,
    ) -> tuple[FenceReport, SlotRelease]:
        """:meth:`jobs_complete_if_owned` and :meth:`slots_release_hand_over` of ``holds`` (the
        slots of those runs) in one statement; a hold whose run's row another transaction
        holds (busy: not settled) is left out of the release, and stays its run's."""

    @abc.abstractmethod
    def job_fail_if_owned(self, failure: Failure) -> tuple[FenceReport, str | None]:
        """Retry or bury; returns the report (keyed by lease token) and the state the job went
        to, also when an earlier try had already applied it (None if lost)."""

    @abc.abstractmethod
    def job_requeue_if_owned(self, requeue: Requeue) -> FenceReport: ...

    @abc.abstractmethod
    def job_suspend_if_owned(self, suspension: Suspension) -> FenceReport: ...

    @abc.abstractmethod
    def job_give_back_unknown_if_owned(self, give_back: UnknownGiveBack) -> FenceReport:
        """Give back, without spending an attempt, a job whose name the worker does not know;
        due again after a backoff that grows with its wait (docs/deployment.md)."""

    @abc.abstractmethod
    def jobs_unknown_waiting(self, *, names: Iterable[str] | None = None,
                             tenant_ids: Iterable[str] | None = None) -> list[UnknownWait]:
        """Per queue and name, the jobs waiting for a worker that knows their name, the
        longest-waiting first."""

    @abc.abstractmethod
    def jobs_renew_if_owned(self, claims: Sequence[Claim], lease_ms: int) -> Renewal:
        """Extend every lease still owned, without waiting: the lease TOKENS renewed on their
        rows, and those kept beside a row another transaction holds (no claim takes them over
        meanwhile); a missing token = that run lost the job."""

    # ------------------------------------------------------------------------- steps --
    @abc.abstractmethod
    def atomic(self) -> AbstractContextManager[object]:
        """A transaction (or savepoint) on this thread's connection for the engine's alias."""

    @abc.abstractmethod
    def in_transaction(self) -> bool:
        """Whether this thread's connection for the engine's alias is inside a transaction
        that its caller opened (``transaction.atomic()``), which a suspension must not join."""

    @abc.abstractmethod
    def steps_of_run(self, run_id: str) -> list[StepRecord]: ...

    @abc.abstractmethod
    def step_complete_if_owned(
        self, owner: RunOwner, name: str, output_json: str | None, *,
        event: str | None = None, correlation_key: str | None = None,
        event_id: int | None = None, event_published_at: datetime | None = None,
        kind: str = "run",
    ) -> bool:
        """Record a step's output; False if the run no longer owns its job (nothing written)."""

    @abc.abstractmethod
    def step_fail_if_owned(self, owner: RunOwner, name: str, error: str) -> int | None:
        """Record a step's failure; the step's attempts, or None if the run lost its job."""

    @abc.abstractmethod
    def step_park_if_owned(
        self, owner: RunOwner, name: str, *, status: str, wake_at: datetime | None = None,
        duration_ms: int = 0, event: str | None = None, correlation_key: str | None = None,
        kind: str | None = None,
    ) -> ParkedStep | None:
        """Open (or find) a sleep or event wait; None if the run lost its job. ``kind`` (the
        deploy check's) defaults to ``sleep`` for a sleeping step, else ``event``."""

    @abc.abstractmethod
    def step_cancel_siblings(self, owner: RunOwner, prefix: str) -> None:
        """Close the open waits whose names start with ``prefix`` (wait_for_any's losers)."""

    # ------------------------------------------------------------------------- deploy check --
    # (docs/durable.md, "The deploy check"); both only read.
    @abc.abstractmethod
    def runs_suspended_list(self, *, name: str | None = None, after_id: str | None = None,
                            limit: int = 500) -> list[JobRecord]:
        """The jobs whose durable run waits (suspended, or blocked with its resume held back)
        and has recorded a step, ordered by id, after ``after_id``; only ``name``'s if given."""

    @abc.abstractmethod
    def steps_of_run_in_order(self, run_id: str) -> list[StepRecord]:
        """A run's steps in the order it recorded them, without wait_for_any's per-event
        rows."""

    # ----------------------------------------------------------------------- children --
    @abc.abstractmethod
    def step_invoke_open_if_owned(self, owner: RunOwner, name: str, *, children: Sequence[str],
                                  timeout_ms: int | None) -> InvokeStep | None:
        """Open an invoke or gather step with these children's ids, or lock the open one (its
        recorded ids win); None if the run lost its job. Call it first in the transaction that
        reads the children and parks the parent."""

    @abc.abstractmethod
    def step_invoke_pending_if_owned(self, owner: RunOwner, name: str, pending: int) -> bool:
        """Record how many of the open step's children are live; False if the run lost its
        job."""

    @abc.abstractmethod
    def jobs_enqueue_children(self, batch: Sequence[EnqueueParams], *, parent_id: UUID,
                              parent_step: str) -> None:
        """Insert the children of a parent's step (in the caller's transaction)."""

    @abc.abstractmethod
    def jobs_children(self, ids: Sequence[str]) -> list[ChildState]:
        """The children's states, results and errors, in the order of ``ids``, archived ones
        included."""

    @abc.abstractmethod
    def jobs_cancel_tree(self, *, ids: Sequence[str] = (), parents: Sequence[str] = (),
                         reason: str | None, wait: bool = True) -> int:
        """Cancel the live jobs ``ids`` and the live children of ``parents``, with their live
        descendants; how many were cancelled. ``wait`` False (a worker's cancel): a job held
        by another transaction is left live rather than waited for."""

    # ------------------------------------------------------------------------ events --
    @abc.abstractmethod
    def event_lock(self, names: Sequence[str]) -> None:
        """Take the event rendezvous lock(s) until the end of the current transaction."""

    @abc.abstractmethod
    def event_publish(
        self, name: str, payload_json: str, correlation_key: str | None, ttl_ms: int
    ) -> EventRecord: ...

    @abc.abstractmethod
    def event_wake_waiters(self, name: str, correlation_key: str | None) -> int:
        """Make suspended jobs waiting for this event due now; how many were woken."""

    @abc.abstractmethod
    def event_next(
        self, names: Sequence[str], correlation_key: str | None, after_at: datetime,
        after_id: int,
    ) -> EventRecord | None: ...

    @abc.abstractmethod
    def events_list(self, name: str | None = None, limit: int = 100) -> list[EventRecord]: ...

    @abc.abstractmethod
    def events_purge(self, batch_size: int = 1000) -> int:
        """Delete expired events in bounded batches; how many."""

    # ------------------------------------------------------------------- operators --
    @abc.abstractmethod
    def job_get(self, job_id: str, *, tenant_ids: Iterable[str] | None = None) -> JobRecord | None:
        ...

    @abc.abstractmethod
    def job_cancel(
        self, job_id: str, *, reason: str | None, tenant_ids: Iterable[str] | None = None
    ) -> ChangeResult:
        """Any state but ``done``/``cancelled`` becomes ``cancelled``."""

    @abc.abstractmethod
    def job_retry(self, job_id: str, *, tenant_ids: Iterable[str] | None = None,
                  enqueued_by: str | None = None) -> ChangeResult:
        """``dead``/``cancelled`` -> ``ready`` with a fresh attempt budget, same run_id;
        ``enqueued_by``, when given, records who retried it.

        Raises :class:`~django_xjobs.exceptions.LiveJobExists` when another live job holds the
        key."""

    @abc.abstractmethod
    def job_resume(self, job_id: str, *, tenant_ids: Iterable[str] | None = None,
                   enqueued_by: str | None = None) -> ResumeResult:
        """A ``dead`` workflow resumed (docs/durable.md, "Repairing a dead workflow"), in one
        transaction: when it died of a ChildFailed, its failed invoke or gather step is opened
        again and that step's dead or cancelled children retried (a child that is a dead
        workflow itself is resumed likewise); the workflow becomes ``ready`` with a fresh
        attempt budget and the same run_id, as :meth:`job_retry` makes it. Unchanged, with the
        reason, for a job that is not a dead workflow (or whose family changed meanwhile).

        Raises :class:`~django_xjobs.exceptions.LiveJobExists` when another live job holds the
        key."""

    @abc.abstractmethod
    def jobs_retry_many(self, ids: Sequence[str], *, tenant_ids: Iterable[str] | None = None,
                        enqueued_by: str | None = None) -> list[str]:
        """:meth:`job_retry` for a batch, set-based: the ids retried. A job another live job's
        key holds, or a row another transaction holds, is skipped (not an error)."""

    @abc.abstractmethod
    def job_run_now(self, job_id: str, *, tenant_ids: Iterable[str] | None = None) -> ChangeResult:
        """A ``delayed`` or ``suspended`` job (or a ready one due later) becomes due now."""

    @abc.abstractmethod
    def jobs_purge(
        self, *, states: Sequence[str], finished_before: datetime, batch_size: int = 1000,
        history: bool = False,
    ) -> int:
        """Delete finished jobs (and their steps) in bounded batches; return how many. Only
        those still in the hot table, unless ``history``: then those of the history tables too
        (an operator's purge; retention drops whole days with :meth:`history_drop`)."""

    @abc.abstractmethod
    def jobs_archive(self, *, state: str, finished_before: datetime, batch_size: int = 1000,
                     finished_from: datetime | None = None,
                     keep_going: Callable[[], bool] = lambda: True) -> int:
        """Move the jobs of a finished state that finished before the cutoff (and their runs'
        steps) out of the hot table into the history table of their day, in bounded batches
        while ``keep_going()``; return how many moved. ``finished_from``: only those finished
        at or after it (where an earlier complete pass ended; none when None)."""

    @abc.abstractmethod
    def history_drop(self, *, state: str, finished_before: datetime) -> list[str]:
        """Drop the history tables of a finished state whose whole day ended before the
        cutoff; return the names dropped (a table a reader holds is left for the next run)."""

    @abc.abstractmethod
    def history_tables(self) -> list[HistoryTable]:
        """The history tables of finished jobs, newest day first."""

    @abc.abstractmethod
    def queue_stats(self, *, tenant_ids: Iterable[str] | None = None) -> list[QueueStats]: ...

    @abc.abstractmethod
    def outbox_pending(
        self, *, tenant_ids: Iterable[str] | None = None
    ) -> tuple[int, float | None]:
        """Staged outbox rows not yet relayed, and the age in seconds of the oldest."""

    # ------------------------------------------------------------------ observability --
    # docs/observability.md: the counters and the live depth, each read costing the same
    # whatever the size of the history.

    @abc.abstractmethod
    def queue_depth(self, *, tenant_ids: Iterable[str] | None = None) -> list[QueueDepth]:
        """Per queue, the live buckets and the oldest due job's age, read from live rows only."""

    @abc.abstractmethod
    def job_progress_if_owned(self, claim: Claim, *, done: float, total: float | None,
                              message: str | None) -> bool:
        """Record a run's progress, fenced; False when the run no longer owns its job."""

    @abc.abstractmethod
    def stats_rollup(self, batch_size: int = 10_000, *,
                     after_id: int = 0) -> tuple[int, int | None]:
        """Fold up to ``batch_size`` counter deltas past id ``after_id`` into their buckets;
        how many were folded (0 also while another session's rollup runs) and the last one's
        id (None when none was)."""

    @abc.abstractmethod
    def stats_prune(self, *, minute_keep: float, hour_keep: float, day_keep: float,
                    batch_size: int = 1000) -> int:
        """Delete buckets older than their grain's retention (seconds), in bounded batches."""

    @abc.abstractmethod
    def stats_series(self, grain: str, since: datetime, *,
                     queue: str | None = None) -> list[Counters]:
        """The counters of each queue per ``grain`` bucket (minute, hour, day) from ``since``."""

    @abc.abstractmethod
    def stats_totals(self) -> list[Counters]:
        """The all-time counters per queue and job name."""

    # -------------------------------------------------------- why a job is not running --
    # Reads only (django_xjobs/why.py decides from them; docs/flow-control.md, "Why is a job
    # not running?").
    @abc.abstractmethod
    def why_job(self, job_id: str, *, tenant_ids: Iterable[str] | None = None) -> FlowFacts | None:
        """The job's row now and the pauses, slot holders and workers that concern it; None
        when there is no such job (or it is another tenant's)."""

    @abc.abstractmethod
    def why_rate_window(self, key: str, *, limit: int, period_ms: int, cost: int) -> RateWindow:
        """``key``'s spending over the last ``period_ms`` and when ``cost`` more fits."""

    # ------------------------------------------------------------------ backfills --
    # A pass's progress row (``x_backfills``), keyed by its job's run_id. Worker writes are
    # fenced on the job's ownership (``_if_owned``: None/False = the run lost its job, nothing
    # was written) and meant to run inside the batch's transaction (``atomic()``), so the
    # user's writes and the progress commit together. See django_xjobs/backfills/passes.py.
    @abc.abstractmethod
    def backfill_create(self, *, run_id: str, name: str, job_id: str, checksum: str,
                        app_version: str) -> bool:
        """Record a pass as ``pending`` (with the enqueue of its job); False if it exists."""

    @abc.abstractmethod
    def backfill_start_if_owned(self, owner: RunOwner, *, name: str, checksum: str,
                                app_version: str) -> BackfillRecord | None:
        """Open or adopt the pass of ``owner.run_id``: ``running`` (progress kept), or
        ``completed`` left as it is. None if the run does not own its job."""

    @abc.abstractmethod
    def backfill_progress_if_owned(self, owner: RunOwner, *, processed: int,
                                   cursor_json: str) -> int | None:
        """Add ``processed`` rows and store the cursor; rows_processed after, or None."""

    @abc.abstractmethod
    def backfill_complete_if_owned(self, owner: RunOwner, *, processed: int) -> int | None:
        """The final batch: add ``processed``, ``completed``, cursor cleared; or None."""

    @abc.abstractmethod
    def backfill_fail_if_owned(self, owner: RunOwner, *, error: str) -> bool:
        """``failed`` with ``error``, cursor kept; False if the run does not own its job."""

    @abc.abstractmethod
    def backfill_cancel(self, run_id: str) -> BackfillRecord | None:
        """A pending, running or failed pass becomes ``cancelled`` (cursor kept); None if
        there is no such pass or it is completed or cancelled already. Cancel the job first,
        in the same transaction."""

    @abc.abstractmethod
    def backfills_list(self, *, name: str | None = None, status: str | None = None,
                       run_id: str | None = None, limit: int = 50) -> list[BackfillRecord]:
        """Passes newest first, each with its job's state; every filter optional. A run_id
        that is not a uuid matches nothing."""

    @abc.abstractmethod
    def backfill_get(self, run_id: str) -> BackfillRecord | None:
        """One pass with its job's state, or None (also for a run_id that is not a uuid)."""

    # -------------------------------------------------------------------------- outbox --
    # x_outbox lives on the app's alias and x_jobs on XJOBS["DATABASE"]: the outbox methods
    # are called on the engine of the alias that holds x_outbox, jobs_find_by_ids on the jobs'.

    @abc.abstractmethod
    def outbox_stage(self, row: OutboxRow) -> None:
        """Insert a staged job in the current transaction and, on its commit, wake the relays."""

    @abc.abstractmethod
    def outbox_claim(self, batch_size: int) -> list[OutboxRow]:
        """Lock up to ``batch_size`` pending rows, oldest first, skipping rows other relays
        hold, until the current transaction ends (call it inside :meth:`atomic`)."""

    @abc.abstractmethod
    def outbox_mark_published(self, published: Mapping[UUID, UUID]) -> int:
        """Mark rows (outbox id -> job id) published; how many were still pending."""

    @abc.abstractmethod
    def outbox_status(self, outbox_id: UUID | str) -> OutboxStatus | None: ...

    @abc.abstractmethod
    def jobs_find_by_ids(self, ids: Sequence[UUID]) -> list[EnqueueResult]:
        """The jobs, in any state, whose id is among ``ids`` (``created`` False)."""

    @abc.abstractmethod
    def outbox_listener(self, channel_label: str) -> Listener:
        """Open a dedicated connection that receives staging wake-ups (``wait`` returns a
        non-empty list when something was staged)."""

    # ----------------------------------------------------------- concurrency slots --
    # The protocol is in django_xjobs/slots.py. A slot is free when its row is missing or
    # lapsed; every write below is fenced on the holder, and a renewal on expiry as well.
    @abc.abstractmethod
    def slots_acquire(self, requests: Sequence[SlotRequest], ttl_ms: int) -> list[SlotHold]:
        """Grant each request the lowest free slot of its key below its own limit, or nothing;
        the slots granted (a missing holder = refused). Never grants a live slot twice, also
        to two requests of one batch or to two concurrent callers."""

    @abc.abstractmethod
    def slots_renew_if_held(self, holds: Sequence[SlotHold], ttl_ms: int) -> Renewal:
        """Extend each slot still held by its holder AND not yet expired, without waiting: the
        holders renewed, and those whose row another transaction holds this moment (``kept``:
        not renewed, not lost); a missing holder = that run lost its slot (a lapsed slot is
        never revived)."""

    @abc.abstractmethod
    def slots_release_if_held(self, holds: Sequence[SlotHold]) -> tuple[int, list[SlotHold]]:
        """Free each slot its holder still has (lapsed or not), and wake as many jobs blocked
        on each key as it has free slots under the hold's limit (a NOTIFY of their queues):
        how many slot rows went, and the holds whose row another transaction holds this moment
        (not waited for; release them again later)."""

    @abc.abstractmethod
    def slots_release_hand_over(self, holds: Sequence[SlotHold],
                                offer: HandOver | None = None) -> SlotRelease:
        """:meth:`slots_release_if_held`, and in the same statement hand each freed slot to the
        next job blocked on its key that ``offer`` may start (up to ``offer.take``: of its
        queues, no rate budget to spend, not a resume, under its own limit), leased to the
        releasing worker as a claim leases it; the rest are woken as the release wakes them."""

    @abc.abstractmethod
    def slots_list(self, *, slot_key: str | None = None, limit: int = 1000) -> list[SlotRecord]:
        """Live slots (of one key), by key then slot."""

    @abc.abstractmethod
    def slots_usage(self, limit: int = 1000) -> list[SlotUsage]:
        """Live slots per key, busiest key first."""

    @abc.abstractmethod
    def horizon_age(self) -> int:
        """How many transaction ids back this database's horizon is held (the oldest snapshot
        of a backend, a replica's feedback, a replication slot or a prepared transaction):
        row versions younger than it cannot be removed yet (docs/performance.md, "Under a held
        horizon")."""

    @abc.abstractmethod
    def worker_seen(self, worker_id: str, host: str, pid: int, queues: Sequence[str], *,
                    version: str, concurrency: int, running: int, finished: int,
                    claimed_age: float | None, loop_age: float | None) -> None:
        """Record that this worker process is alive and serves ``queues`` (x_workers), with
        what it reports: its package version, its concurrency, the runs in flight and
        finished, and how long ago (seconds, its monotonic clock; None: never) its loop last
        claimed a job and last went round. The engine turns those ages into times on the
        database clock."""

    @abc.abstractmethod
    def workers_list(self, *, max_stall: float) -> list[WorkerRecord]:
        """The workers seen in the last day, each with ``stalled`` (the reason, see
        :func:`~django_xjobs.records.stall_reason`) when, for ``max_stall`` seconds on the
        database clock, it sent no heartbeat, or its loop did not go round, or it claimed
        nothing although it had room and one of its queues had a job due
        (docs/observability.md, "Workers and health probes")."""

    @abc.abstractmethod
    def worker_gone(self, worker_id: str, stale_after: float = 86_400.0) -> None:
        """Delete this worker's row (it stops), and rows not seen for ``stale_after`` s."""

    # ----------------------------------------------------------------------- fleet --
    @abc.abstractmethod
    def fleet_get(self) -> FleetRecord:
        """The fleet's compatibility (x_fleet; docs/deployment.md, "Mixed versions"): an empty
        record when no row was ever written."""

    @abc.abstractmethod
    def fleet_set(self, *, compatible_with: str | None, changed_by: str) -> FleetRecord:
        """Record the oldest release series still allowed to share the tables (None: every
        process runs this version); the record as written."""

    # ---------------------------------------------------------------- flow control --
    @abc.abstractmethod
    def jobs_unblock(self, flow: ClaimFlow, batch: int = 1000) -> int:
        """Wake the blocked jobs whose key has room again or whose key pause ended, although
        no release woke them (a worker runs this once per poll interval); how many."""

    @abc.abstractmethod
    def rate_take(self, requests: Sequence[RateRequest]) -> list[datetime | None]:
        """Spend each request's cost from its key's budget, in order: None where granted,
        else the time its budget has room (ratelimits.py)."""

    @abc.abstractmethod
    def jobs_wake_refused(self, refused: Sequence[Claim]) -> int:
        """Make due now each job still waiting after the refusal of the claim ``lease_token``
        (no claim since); how many were woken."""

    @abc.abstractmethod
    def jobs_requeue_if_owned(self, batch: Sequence[Requeue]) -> FenceReport:
        """:meth:`job_requeue_if_owned` for many runs in one statement."""

    # ---------------------------------------------------------------------- pauses --
    # docs/flow-control.md, "Pause and circuit breakers". A pause is in force while its end is
    # unset or later than the database's now(); the claim reads them, these write them.
    @abc.abstractmethod
    def pause_upsert(self, kind: str, key: str, *, until: datetime | None, for_ms: int | None,
                     reason: str | None) -> PauseRecord | None:
        """Pause a queue or key until ``until``, for ``for_ms``, or (both None) until resumed,
        or change its pause; the pause, or None (nothing written) when ``until`` is not in the
        future on the database clock."""

    @abc.abstractmethod
    def pause_resume_queue(self, queue: str) -> bool:
        """End a queue's pause and wake its workers; whether a pause was in force."""

    @abc.abstractmethod
    def pause_resume_key(self, key: str) -> tuple[bool, int]:
        """End a key's pause and hand back the jobs blocked on it, in one statement; whether a
        pause was in force, and how many jobs were handed back."""

    @abc.abstractmethod
    def pauses_list(self, *, kind: str | None = None, limit: int = 1000) -> list[PauseRecord]:
        """The pauses in force (of one kind), by kind then key."""

    @abc.abstractmethod
    def job_pause_key_if_owned(self, requeue: KeyPauseRequeue) -> tuple[FenceReport,
                                                                         datetime | None]:
        """Give a run's job back (no attempt spent) and pause its key, fenced: a lost run
        pauses nothing. The report, and the end of the key's pause when this call wrote it."""

    # ------------------------------------------------------------------ scheduler --
    # Leader election and the cron watermark (django_xjobs/scheduler/, docs/scheduling.md).
    @abc.abstractmethod
    def leader_attempt_elect(self, lock_key: str, holder: str, lease_ms: int) -> datetime | None:
        """Acquire the lease of ``lock_key`` if unheld or expired, or renew it if ``holder``
        holds it, in one statement; the new expiry, or None if another holder's lease is live."""

    @abc.abstractmethod
    def leader_resign(self, lock_key: str, holder: str) -> bool:
        """Release the lease, only if ``holder`` holds it; whether it did."""

    @abc.abstractmethod
    def leader_get(self, lock_key: str) -> LeaderRecord | None:
        """The lease row of ``lock_key`` (live or not), or None."""

    @abc.abstractmethod
    def leader_advisory_session(self, lock_key: str, label: str) -> AdvisorySession:
        """Open a dedicated connection for the session advisory lock of ``lock_key``.

        Raises :class:`SessionLost` when it cannot connect."""

    @abc.abstractmethod
    def leader_advisory_holder(self, lock_key: str) -> LeaderRecord | None:
        """The backend holding the advisory lock of ``lock_key``, or None."""

    @abc.abstractmethod
    def scheduler_states_ensure(self, names: Sequence[str], at: datetime,
                                fence: LeaderFence) -> int:
        """Create the missing state rows with watermark ``at`` (a new task starts from now),
        fenced on still leading; how many were created."""

    @abc.abstractmethod
    def scheduler_states_lock_if_leading(self, names: Sequence[str],
                                         fence: LeaderFence) -> LockedStates:
        """Lock the state rows of ``names`` until the end of the current transaction, fenced
        on still leading; rows another transaction holds are skipped, not waited for."""

    @abc.abstractmethod
    def scheduler_states_mark_if_leading(self, names: Sequence[str], at: datetime,
                                         fence: LeaderFence) -> dict[str, datetime]:
        """Move the watermarks of ``names`` forward to ``at`` (never back: ``greatest``),
        fenced on still leading; the watermarks now by task, or {} if the fence failed."""

    @abc.abstractmethod
    def scheduler_states_list(self) -> list[SchedulerStateRecord]: ...

    @abc.abstractmethod
    def scheduler_state_set_paused(self, name: str, paused: bool) -> SchedulerStateRecord:
        """Pause or resume a task (an operator's act, not fenced). Resuming moves the
        watermark to at least the database's now, so the paused stretch is never replayed; a
        task without a row gets one starting there. The record's ``updated_at`` is that now.
        The database's clock, not the caller's: the rounds run on it."""

    # --------------------------------------------------------------- cron overlap --
    # A cron task's live runs, which its overlap policy reads and acts on inside the round's
    # transaction, after the round locked the task's state row (docs/scheduling.md, "Overlap").
    @abc.abstractmethod
    def cron_runs_live(self, enqueued_by: Sequence[str], *, lock: bool) -> list[CronRun]:
        """The live runs (any live state) whose ``enqueued_by`` is one of ``enqueued_by``
        (each ``cron:<task>``), by id; with ``lock``, locked until the end of the current
        transaction."""

    @abc.abstractmethod
    def cron_runs_release(self, ids: Sequence[str]) -> list[str]:
        """Release buffered runs (blocked on their own ``enqueued_by``) now, in the caller's
        transaction; the ids released."""

    @abc.abstractmethod
    def cron_runs_hold(self, ids: Sequence[str]) -> list[str]:
        """Hold back runs this transaction enqueued (still ready or delayed) behind their
        task's live run: blocked on their own ``enqueued_by``, released when the task's other
        live runs have finished. The ids held."""

    @abc.abstractmethod
    def scheduler_states_note_skips_if_leading(
        self, skips: Mapping[str, tuple[int, datetime]], fence: LeaderFence
    ) -> list[str]:
        """Add to each task's count of occurrences its overlap policy did not enqueue, and
        keep the latest (``{task: (count, latest occurrence)}``), fenced on still leading; the
        tasks noted ([] if the fence failed)."""

    # ---------------------------------------------------------------- maintenance --
    @abc.abstractmethod
    def outbox_purge_published(self, *, published_before: datetime,
                               batch_size: int = 1000) -> int:
        """Delete relayed outbox rows published before the cutoff, in bounded batches."""

    @abc.abstractmethod
    def slots_purge_expired(self, *, grace_ms: int, batch_size: int = 1000) -> int:
        """Delete concurrency slot rows expired for longer than ``grace_ms``, in bounded
        batches."""

    @abc.abstractmethod
    def lease_extensions_purge(self, *, batch_size: int = 1000) -> int:
        """Delete the leases kept beside held rows that ended (jobs_renew_if_owned), in
        bounded batches."""
    # ----------------------------------------------------------------------- console --
    @abc.abstractmethod
    def jobs_delete_finished(
        self, ids: Sequence[str], *, tenant_ids: Iterable[str] | None = None
    ) -> int:
        """Delete these jobs (and their steps) if finished; live or locked ones are skipped.
        Returns how many were deleted."""

    @abc.abstractmethod
    def tables_health(self) -> list[TableHealth]:
        """Dead tuples and transaction-id age of the job tables."""

    @abc.abstractmethod
    def xmin_horizon(self, limit: int = 10) -> list[XminHolder]:
        """What keeps VACUUM from removing dead rows, the oldest holder first."""

    # --------------------------------------------------------------- test support --
    # django_xjobs.testing (docs/testing.md). On the caller's connection like every method, so
    # they work inside a TestCase's transaction.
    @abc.abstractmethod
    def job_claim_if_due(self, job_id: str, *, worker_id: str,
                         lease_ms: int) -> ClaimedJob | None:
        """Claim this one job, writing what :meth:`jobs_claim` writes, if it is waiting and due;
        None if it is not due, not waiting, or locked by another session (skipped)."""

    @abc.abstractmethod
    def jobs_shift_due(self, shift_ms: int) -> int:
        """Make every waiting job (ready, delayed, suspended), and the open sleeps and event
        waits of its run, due ``shift_ms`` earlier, as if that much time had passed; how many
        jobs. Running jobs keep their leases."""

    @abc.abstractmethod
    def jobs_list(self, *, name: str | None = None, queue: str | None = None,
                  states: Sequence[str] | None = None, tenant_id: str | None = None,
                  limit: int | None = None) -> list[JobRecord]:
        """Jobs in any state, oldest first; each filter optional (None: any)."""

    # ---------------------------------------------------------------- connections --
    @abc.abstractmethod
    def name_session(self, label: str) -> bool:
        """Name this thread's connection (``application_name``, set when it connects, so a
        pooler hands the name to every server connection it lends this one) so operators and
        fault tests can find it in ``pg_stat_activity``; False when it cannot be named at
        connect (session_label then names the session)."""

    @abc.abstractmethod
    def forget_session_name(self) -> None:
        """Undo name_session for this thread's connection, from its next connect."""

    @abc.abstractmethod
    def session_label(self, label: str) -> str:
        """name_session, and set up the session of a worker's own thread (its loop, heartbeat,
        duties); the isolation level its statements run at by default."""

    @abc.abstractmethod
    def listener(self, channel_label: str) -> Listener:
        """Open a dedicated connection that receives enqueue wake-ups."""

    @abc.abstractmethod
    def db_now(self) -> datetime: ...

    @abc.abstractmethod
    def reset_connection(self) -> None:
        """Drop this thread's connection after an error so the next call reconnects."""

    @abc.abstractmethod
    def is_connection_error(self, exc: BaseException) -> bool:
        """Whether ``exc`` means the connection is gone (the outcome of the call is unknown)."""

    @abc.abstractmethod
    def connection_refused(self, exc: BaseException) -> bool:
        """Whether ``exc``, raised because no connection could be opened, is the server turning
        this client away (authentication, a role or a database that does not exist): a
        configuration to fix, where any other failure to connect (refused, unresolved,
        timed out, a server starting up or full) is an outage that may end by itself."""
