"""The run table: every run of a worker not yet settled, and the phases of one run.

A run (:class:`Run`) is one claim of one job, from the claim until its fenced write settles it.
The table keys runs by lease token, never by job id: Python cannot stop a thread, so a thread
that lost a job may still be executing it when this worker claims the same job again, and the
two runs of one job must not be taken for each other (docs/design.md, "Per-claim tracking in
the worker").

A run's phases, and who moves it on::

    queued ---> running ---> finished ---> settled
       |                        ^
       +------------------------+   stopped before it started

* **queued**: claimed and in the table (the loop), waiting for an executor thread; an async
  run is running as soon as it is dispatched, a job whose name is unknown here finished;
* **running**: an executor thread (or the event loop) started its code (worker/threads.py);
* **finished**: it has its outcome, recorded exactly once, under :attr:`Runs.lock`: the
  executor's when the code returned, or a stop's when that came first (the watchdog and the
  heartbeat's answers: worker/watchdog.py; a lease not proven: worker/threads.py; a shutdown:
  worker/loop.py). Whichever comes second is ignored: a stopped run's code may still be running
  on its abandoned thread, and what it returns is never written;
* **settled**: its fenced write is done (or found the job lost) and it left the table
  (worker/settle.py).

The lock guards the table and the phase changes that race: an executor thread starting a
queued run, an outcome recorded, a run settled. Only the loop thread adds runs (claim) and
removes them (settle), so it reads the table without the lock; other threads take it
(:meth:`Runs.snapshot`, :meth:`Runs.unsettled`). Finished runs wait in :attr:`Runs.finished`,
appended under the lock by whoever records an outcome and emptied by the loop's settle.
"""

from __future__ import annotations

import concurrent.futures
import threading
import weakref
from collections import Counter, deque
from collections.abc import Callable, Sequence
from typing import Any

from .. import clock, registry
from ..context import JobContext
from ..decorator import child_params
from ..engines import get_engine
from ..exceptions import SLOT_LOST, SlotLost
from ..records import ClaimedJob, RunOwner, SlotHold
from ..steps import AsyncSteps, Steps
from .executor import Discard, Done, Outcome, Retry
from .flow import Flow
from .liveness import Liveness

QUEUED, RUNNING, FINISHED, SETTLED = "queued", "running", "finished", "settled"
# A run starts a body (its job's, a step's) only while its last lease renewal that landed (or
# its claim) is younger than the lease minus this fraction of it: no body starts on a lease
# with less than a quarter of it left, and a run that missed one heartbeat round (a lease is
# at least three heartbeats) still starts its bodies (docs/guarantees.md).
LEASE_MARGIN = 0.25


class Run:
    """One claim of one job, from the claim until its fenced write settles it."""

    __slots__ = ("_ctx", "_ctx_ref", "abandoned", "budget", "busy_pause", "deadline",
                 "definition", "future", "held_since", "held_told", "job", "on_unproven",
                 "outcome", "parking", "phase", "renewed_at", "retry_at", "slot",
                 "slot_renewed_at", "slot_ttl")

    def __init__(self, job: ClaimedJob, definition: registry.JobDefinition | None, now: float, *,
                 budget: float, on_unproven: Callable[[Run, str], None]) -> None:
        self.job = job
        self.definition = definition
        self.phase = QUEUED
        self.outcome: Outcome | None = None
        self.renewed_at = now  # the claim itself set the lease
        # How old renewed_at may be when a body starts (the lease minus LEASE_MARGIN of it), and
        # what the worker does with a run that cannot prove its lease (worker/threads.py,
        # Executors.unproven).
        self.budget = budget
        self.on_unproven = on_unproven
        self.deadline: float | None = None
        self.future: concurrent.futures.Future[None] | None = None  # async runs only
        # Set when the run was stopped while its thread still executes it: that thread exits
        # when the code returns (a replacement thread already took its place).
        self.abandoned = False
        # Set by a step about to suspend the job: the job stops being `running` in the database
        # before the run ends here, and the heartbeat must not take that for a lost lease.
        self.parking = False
        # The concurrency slot this run holds (slots.py), from its acquire to its release, and
        # when the acquire or the last renewal that landed was SENT (monotonic).
        self.slot: SlotHold | None = None
        self.slot_renewed_at = now
        self.slot_ttl = 0.0  # SLOT_TTL, set with the slot
        # Since when another transaction has held its job's row (its lease kept beside it, its
        # settle set aside), None while the row is free; and, for a settle set aside, when to
        # write it again and the pause before that (docs/design.md, "Lock order").
        self.held_since: float | None = None
        self.held_told = False  # the hold was logged at INFO (worker/settle.py, watchdog.py)
        self.retry_at = 0.0
        self.busy_pause = 0.0
        self._ctx: JobContext | None = JobContext(
            job_id=job.id, run_id=job.run_id, name=job.name, queue=job.queue,
            attempt=job.attempt, max_attempts=job.max_attempts, tenant_id=job.tenant_id,
            traceparent=job.traceparent, step_factory=self._steps, lease_token=job.lease_token,
            lease_proof=self.prove_lease, progress_writer=self._write_progress,
        )
        self._ctx_ref: weakref.ref[JobContext] | None = None

    @property
    def ctx(self) -> JobContext:
        ctx = self._ctx
        if ctx is None:
            # Let go by let_go_of_ctx: whoever still reaches this run through its context
            # (the context's callbacks are its methods) holds that context.
            assert self._ctx_ref is not None
            ctx = self._ctx_ref()
            assert ctx is not None, "a settled run reached without its context"
        return ctx

    def let_go_of_ctx(self) -> None:
        """Once the run is settled and its code has returned: keep the context weakly.

        The context's lease proof, steps and progress writer are this run's methods, so the
        two refer to each other, and without this every run would wait for a full pass of the
        garbage collector to be freed (docs/performance.md, "Where a job's time goes"). A
        context its job's code kept still reaches this run, and this run still reaches it.
        """
        ctx = self._ctx
        if ctx is not None:
            self._ctx_ref = weakref.ref(ctx)
            self._ctx = None

    def prove_lease(self) -> None:
        """``ctx.prove_lease`` before the job's body and every step's body: one monotonic read.
        A run whose last renewal is too old to prove it still holds the lease is stopped and
        its job handed back (``JobContext.prove_lease`` then raises)."""
        if clock.monotonic() - self.renewed_at >= self.budget:
            self.on_unproven(self, "its code or its next step")

    def _write_progress(self, done: float, total: float | None, message: str | None) -> bool:
        """``ctx.progress``'s fenced write, on the calling thread's connection."""
        return get_engine().job_progress_if_owned(self.job.claim, done=done, total=total,
                                                  message=message)

    def _steps(self, ctx: JobContext) -> Any:
        def on_park() -> None:
            self.parking = True

        owner = RunOwner(claim=self.job.claim, run_id=self.job.run_id)
        steps = Steps(get_engine(), owner, ctx, on_park,
                      self._slot_guard if self.slot is not None else None,
                      child_params=child_params)
        return AsyncSteps(steps) if self.definition and self.definition.is_async else steps

    def _slot_guard(self) -> None:
        """Before a step write: the run must still be able to prove it holds its slot."""
        if self.slot is not None and clock.monotonic() - self.slot_renewed_at >= self.slot_ttl:
            raise SlotLost(f"{SLOT_LOST}: the run's slot may have lapsed; step not recorded")


class Runs:
    """The run table of one worker (see the module docstring)."""

    def __init__(self, *, flow: Flow, liveness: Liveness) -> None:
        self.lock = threading.Lock()
        self._by_token: dict[str, Run] = {}  # lease_token -> run, every run not yet settled
        # Finished runs waiting for the loop to settle them, and when the oldest was recorded.
        self.finished: deque[Run] = deque()
        self.finished_since = 0.0
        # Finished runs whose settle found their row held by another transaction: written
        # again at their retry_at, the loop going on meanwhile (worker/settle.py).
        self.busy: list[Run] = []
        self.queued = 0  # runs handed to executor threads but not started
        self._flow = flow
        self._liveness = liveness  # counts the finished runs, for x_workers

    def __len__(self) -> int:
        return len(self._by_token)

    def add(self, runs: Sequence[Run], *, queued: int) -> None:
        """Claimed runs enter the table; ``queued`` of them go to the executor threads."""
        with self.lock:
            for run in runs:
                self._by_token[run.job.lease_token] = run
            self.queued += queued

    def snapshot(self) -> list[Run]:
        """Every run in the table (any thread)."""
        with self.lock:
            return list(self._by_token.values())

    def running(self) -> int:
        with self.lock:
            return sum(1 for r in self._by_token.values() if r.phase == RUNNING)

    def per_queue(self) -> Counter[str]:
        """Runs in the table per queue (the loop thread, which alone adds and removes runs)."""
        return Counter(r.job.queue for r in self._by_token.values())

    def finish(self, run: Run, outcome: Outcome, *, from_phase: str) -> bool:
        """Record a run's outcome once; later outcomes of the same run are ignored."""
        flow = self._flow
        with self.lock:
            if run.phase != from_phase:
                return False
            # Discard too: a step write the slot guard refused (Run._slot_guard) ends the run
            # with SlotLost, and the job must be handed back, not left to its lease.
            lost = (run.slot is not None and isinstance(outcome, Done | Retry | Discard)
                    and flow.slot_lapsed(run, clock.monotonic()))
            if lost:
                # The run ended after its slot may have lapsed (a worker frozen past the TTL
                # wakes up with its code finishing): it cannot prove it held the slot, so its
                # result is not written (slots.py).
                outcome = flow.lost("the run ended after its slot lapsed")
            self.record(run, outcome)
        if lost:
            flow.log_lost(run, "the run ended after its slot lapsed")
        return True

    def stop(self, run: Run, outcome: Outcome) -> bool:
        """Record ``outcome`` for a run still queued or running; whether it was. A run stopped
        while its thread executes it is marked abandoned (worker/threads.py)."""
        with self.lock:
            previous = run.phase
            if previous not in (QUEUED, RUNNING):
                return False
            self.record(run, outcome)
            run.abandoned = previous == RUNNING and run.future is None
        return True

    def record(self, run: Run, outcome: Outcome) -> None:
        # Caller holds self.lock.
        run.phase = FINISHED
        run.outcome = outcome
        self._liveness.finished += 1
        if not self.finished:
            self.finished_since = clock.monotonic()
        self.finished.append(run)

    def settled(self, run: Run) -> None:
        """``run``'s fenced write is done: it leaves the table."""
        with self.lock:
            run.phase = SETTLED
            self._by_token.pop(run.job.lease_token, None)

    def all_settled(self, runs: Sequence[Run]) -> None:
        """Every one of ``runs`` was acknowledged: they leave the table in one go."""
        with self.lock:
            for run in runs:
                run.phase = SETTLED
                del self._by_token[run.job.lease_token]
