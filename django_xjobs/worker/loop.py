"""THE CONTROL FLOW of a worker process. No SQL and no models: every database operation is an
engine call, every job outcome comes from ``executor``.

The loop, in the order one iteration runs it (``Worker._iterate``):

1. **Settle.** Finished runs are written back with fenced statements: every ``Done`` of the
   iteration in ONE ``jobs_complete_if_owned``, other outcomes one statement each. A write that
   matches no row means the run lost the job: logged, result discarded, never raised. A write
   whose connection died is retried as is; if the first try had committed, the fence check
   recognises it as already applied (the ambiguous commit). No write waits on a row lock: a
   run whose row another transaction holds is answered busy, set aside, and written again at a
   later settle (after BUSY_RETRY_FIRST, doubling up to BUSY_RETRY_MAX), while the heartbeat
   keeps its lease; the other runs of the batch settle at once (docs/design.md, "Lock order").
2. **Watch** (on a thread of its own, ``xjobs-watch``, which never touches the database: a loop
   stuck in a statement must not stop it). Runs past their ``timeout`` are stopped and failed
   with a timeout error. Runs that have gone a whole lease period without a renewal (the
   heartbeat connection hangs) are stopped and handed back: this worker can no longer prove it
   owns them (the self-fence). A heartbeat thread stuck in a statement for a lease period is
   replaced. Whatever it stops wakes the loop, which settles it.
3. **Claim.** Up to the free capacity (concurrency + prefetch - runs not yet settled), split over
   the queues, in ONE ``jobs_claim``; claimed runs go to the executor threads (sync jobs) or the
   event loop (async jobs). The split starts at the next queue each time (a rotation), so every
   queue makes progress even with fewer free slots than queues. The loop claims again at once
   if the last claim was full or held jobs back by flow control (they left the scan, and what
   was behind them may be claimable), or if it found nothing and some queue has not been asked since
   the sweep began (a sweep asks every queue once: one statement when the free slots cover the
   queues, ``ceil(queues / free)`` otherwise); then it waits for a NOTIFY, a freed slot after
   a full claim, or the poll interval. Burst mode ends only after a whole sweep found nothing.
   A run starts its job's code, and each step's function, only while it can prove its lease
   (``Run.prove_lease``, docs/guarantees.md): a prefetched run whose lease may have lapsed
   while it waited (the process was paused) is handed back unstarted.
4. **Wait** on the wake event: set by the LISTEN thread, by executors when the work queue runs
   low or enough results wait to be settled, and by the signal handler.

Flow control (``flow.py``; docs/flow-control.md) is decided by the claim itself: pauses, rate
budgets and concurrency slots hold jobs back in the database, so every claimed run may start,
and a slot-limited one arrives holding its slot. Held slots are renewed with the heartbeat and
released in ONE ``slots_release_if_held`` per settle (step 1), however the run ended, which
wakes the jobs blocked on their keys fleet-wide. A run that cannot prove it still holds its
slot (a refused renewal, or none for a whole SLOT_TTL) is stopped with ``X_JOB_SLOT_LOST`` and
its job handed back; its result is never written. Once per poll interval the loop also runs
``jobs_unblock``, the safety net for blocked jobs no release woke: before the claim, except in a
round a NOTIFY started, where the claim goes first (the pick-up of a job just enqueued does not
wait for it) and what it woke is claimed in the next round.

Burst mode (``--burst``, ``testing.drain``) runs until nothing is due: a sweep of every queue
found nothing, nothing is in flight, no run finished since that sweep began (a run may enqueue
or wake work in a queue the sweep had already asked), and every background duty had finished
its first pass before that sweep began (the scheduler's first round may fire late cron
occurrences). A burst that cannot claim (the database unreachable) stops with
:attr:`Worker.error` set.

Shutdown (first SIGTERM/SIGINT): stop claiming, hand queued runs back at once, let running ones
finish within ``shutdown_grace``, then stop them and hand their jobs back without spending an
attempt. In-flight runs are tracked per claim (lease token), never per job id: a thread that
lost a job may still be executing it when this worker claims the same job again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import logging
import os
import queue
import socket
import threading
import weakref
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from django.conf import settings as django_settings
from django.db import connections, reset_queries

from .. import clock, conf, faults, registry
from ..base import child_params
from ..context import BUSY_RETRY_FIRST, BUSY_RETRY_MAX, JobContext, busy_pause
from ..engines import get_engine
from ..exceptions import SLOT_LOST, ConfigurationError, JobCancelled, SlotLost, XJobsError
from ..records import ClaimedJob, Completion, Fence, Renewal, RunOwner, SlotHold
from ..steps import AsyncSteps, Steps
from . import duties, executor, reachability
from .executor import Discard, Done, GiveBack, Outcome, Retry
from .flow import Flow
from .heartbeat import Heartbeat
from .listener import WakeListener
from .liveness import Liveness
from .options import WorkerOptions, new_worker_id
from .settle import announce, announcing, write_outcome
from .shutdown import ShutdownSignals
from .unknown import UnknownNames

log = logging.getLogger("django_xjobs.worker")

QUEUED, RUNNING, FINISHED, SETTLED = "queued", "running", "finished", "settled"
# How often timeouts, the self-fence and the heartbeat thread are checked (seconds): the
# precision of a job timeout, and small next to any sane lease.
WATCH_EVERY = 0.05
# A run starts a body (its job's, a step's) only while its last lease renewal that landed (or
# its claim) is younger than the lease minus this fraction of it: no body starts on a lease
# with less than a quarter of it left, and a run that missed one heartbeat round (a lease is
# at least three heartbeats) still starts its bodies (docs/guarantees.md).
LEASE_MARGIN = 0.25
# Adaptive prefetch (XJOBS["PREFETCH"] = "auto"): keep about this many seconds of work claimed
# ahead of the threads, judged by the average run time, and never more than PREFETCH_MAX jobs.
# Short jobs get big batches (one claim and one ack statement per hundreds of jobs); long jobs
# get almost none, so they are not hoarded by one worker while others idle.
PREFETCH_WINDOW = 0.05
PREFETCH_MAX = 1000
# An executor thread idle for this long cleans up its Django connections before its next job
# too (they may have aged past CONN_MAX_AGE or been closed by the server meanwhile).
IDLE_RECHECK = 1.0
# How long a stopping worker waits for each background duty to finish its round and stop.
DUTY_STOP_TIMEOUT = 5.0
# Burst mode gives up (and the command exits non-zero) after this many claims in a row failed
# on a lost connection; at once on any other error.
BURST_CLAIM_TRIES = 3
# The pause after a failed database call doubles with each failure in a row, up to this
# (seconds); the first pause is the poll interval, at most half a second.
DB_RETRY_MAX = 5.0


class Run:
    """One claim of one job, from the claim until its fenced write settles it."""

    __slots__ = ("_ctx", "_ctx_ref", "abandoned", "budget", "busy_pause", "deadline",
                 "definition", "future", "held_since", "job", "on_unproven", "outcome", "parking",
                 "phase", "renewed_at", "retry_at", "slot", "slot_renewed_at", "slot_ttl")

    def __init__(self, job: ClaimedJob, definition: registry.JobDefinition | None, now: float, *,
                 budget: float, on_unproven: Callable[[Run, str], None]) -> None:
        self.job = job
        self.definition = definition
        self.phase = QUEUED
        self.outcome: Outcome | None = None
        self.renewed_at = now  # the claim itself set the lease
        # How old renewed_at may be when a body starts (the lease minus LEASE_MARGIN of it), and
        # what the worker does with a run that cannot prove its lease (Worker._unproven).
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


class Worker:
    def __init__(self, options: WorkerOptions) -> None:
        self.options = options
        self.settings = conf.get()
        self.engine = get_engine()
        faults.alias = self.engine.alias
        self.worker_id = options.worker_id or new_worker_id()
        self.lease_ms = round(options.lease * 1000)
        self._lease_budget = options.lease * (1 - LEASE_MARGIN)
        self.stats: Counter[str] = Counter()

        self._lock = threading.Lock()
        self._runs: dict[str, Run] = {}  # lease_token -> run, every run not yet settled
        self._finished: deque[Run] = deque()
        # Finished runs whose settle found their row held by another transaction: written
        # again at their retry_at, the loop going on meanwhile.
        self._busy: list[Run] = []
        self._work: queue.SimpleQueue[Run | None] = queue.SimpleQueue()
        self._queued = 0  # runs handed to executors but not started
        self._wake = threading.Event()
        self._stop_threads = threading.Event()
        self._stopping = False
        self._notified = False
        self._labelled = False
        self._drain_deadline: float | None = None
        self._stop_reason = ""
        self._more_likely = True
        self._last_claim = -1e9
        self._next_queue = 0  # where the next split of free slots over the queues starts
        self._unswept = set(options.queues)  # queues not asked since the sweep began
        self._dry = False  # the last sweep asked every queue and found nothing
        self._failed_claims = 0  # claims in a row that failed
        self._db_failures = 0  # database calls of the loop in a row that failed
        # Why a burst run stopped before it could finish (the command then exits non-zero).
        self.error: str | None = None
        self._threads: list[threading.Thread] = []
        self._thread_serial = 0
        self._heartbeat: Heartbeat | None = None
        self.heartbeat_generation = 0
        self._listener: WakeListener | None = None
        self._duties: list[tuple[duties.Duty, threading.Thread]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._avg_run: float | None = None  # EWMA of sync run durations (s), for auto prefetch
        self._low_water = 1  # wake the loop when no more than this many runs wait to start
        self._finished_since = 0.0  # when the oldest unsettled outcome was recorded
        self.liveness = Liveness(options.health_file)  # reported in x_workers
        self.started = threading.Event()  # test signal: threads up, first claim done
        self.idle = threading.Event()  # test signal: nothing in flight after a claim found none
        self.flow = Flow(engine=self.engine, settings=self.settings, worker_id=self.worker_id,
                         queues=options.queues, poll_interval=options.poll_interval,
                         stats=self.stats)
        self.unknown = UnknownNames(self.engine, self.settings.unknown_job_report_after)

    # ------------------------------------------------------------------------ public --
    def run(self) -> None:
        """Run until stopped (signal, :meth:`stop`, or burst mode running dry)."""
        signals = (ShutdownSignals(self.stop, repeat_exits=self.options.supervisor is None)
                   if self.options.install_signals else None)
        if signals:
            signals.install()
        frozen = False
        try:
            try:
                self._label()
            except ConfigurationError:
                raise
            except Exception as exc:  # the database is not there yet: the first claim labels
                log.debug("loop connection not set up: %s", exc)
            self._start_threads()
            # What exists now (Django, the app's modules, this worker's threads and connections)
            # lives as long as the worker: left out of the garbage collector's full passes,
            # which otherwise walk all of it again every few thousand jobs, since the runs in
            # flight keep being promoted to the oldest generation (docs/performance.md, "Where
            # a job's time goes"). Given back when the worker stops: an embedding process
            # (testing.drain) keeps its usual collection.
            gc.freeze()
            frozen = True
            log.info(
                "worker %s started: queues=%s concurrency=%d prefetch=%s lease=%gs "
                "heartbeat=%gs notify=%s",
                self.worker_id, ",".join(self.options.queues), self.options.concurrency,
                "auto" if self.options.prefetch is None else self.options.prefetch,
                self.options.lease, self.options.heartbeat, self.options.notify,
            )
            while self._iterate():
                pass
            self._shutdown()
        finally:
            if frozen:
                gc.unfreeze()
            if signals:
                signals.uninstall()
            self._stop_threads.set()
            connections.close_all()
            self.engine.forget_session_name()  # the calling thread may go on (testing.drain)
        log.info("worker %s stopped (%s): %s", self.worker_id, self._stop_reason or "done",
                 dict(self.stats))

    def stop(self, reason: str = "stop requested") -> None:
        """Ask for a graceful stop (thread-safe; the first signal calls this)."""
        if not self._stopping:
            self._stop_reason = reason
            log.info("worker %s stopping (%s): no new claims; %d runs in flight get %gs",
                     self.worker_id, reason, len(self._runs), self.options.shutdown_grace)
        self._stopping = True
        self._wake.set()

    @property
    def in_flight(self) -> int:
        return len(self._runs)

    # -------------------------------------------------------------------- threads --
    def _start_threads(self) -> None:
        try:
            self.seen()
        except Exception as exc:  # the first claim reports a database that is not there
            log.debug("worker row not written: %s", exc)
        for _ in range(self.options.concurrency):
            self._spawn_executor()
        self._start_heartbeat()
        threading.Thread(target=self._watch_main, name="xjobs-watch", daemon=True).start()
        if self.options.notify and self.engine.features.listen_notify:
            self._listener = WakeListener(
                engine=self.engine, label=f"xjobs:{self.worker_id}:listen",
                queues=self.options.queues, wake=self.notify, stop=self._stop_threads,
            )
            self._listener.start()
        self._duties = duties.start(self.options.duties, engine=self.engine,
                                    worker_id=self.worker_id, stop=self._stop_threads)

    def _spawn_executor(self) -> None:
        self._thread_serial += 1
        t = threading.Thread(
            target=self._executor_main, name=f"xjobs-exec-{self._thread_serial}", daemon=True
        )
        self._threads.append(t)
        t.start()

    def _start_heartbeat(self) -> None:
        self.heartbeat_generation += 1
        self._heartbeat = Heartbeat(
            worker=self, engine=self.engine, label=f"xjobs:{self.worker_id}:heartbeat",
            interval=self.options.heartbeat, lease_ms=self.lease_ms,
            slot_ttl_ms=self.flow.params.slot_ttl_ms, generation=self.heartbeat_generation,
            stop=self._stop_threads, seen_every=self.settings.worker_seen_interval,
        )
        self._heartbeat.start()

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            self._loop_thread = threading.Thread(
                target=loop.run_forever, name="xjobs-async", daemon=True
            )
            self._loop_thread.start()
            self._loop = loop
        return self._loop

    # ------------------------------------------------------------------ the iteration --
    def _iterate(self) -> bool:
        """One pass of the loop; False once the worker should leave it."""
        self._wake.clear()  # whatever sets it from here on ends the wait below
        notified, self._notified = self._notified, False
        self._settle()
        now = clock.monotonic()
        self.liveness.went_round(now)
        if self._stopping:
            return self._drain_step()
        claimed = None
        # Taken before the claim: what a duty's finished first pass enqueued, the claim sees.
        # Only burst mode asks (the loop's hot path does not pay for it otherwise).
        duties_ready = not self.options.burst or all(
            duty.started.is_set() for duty, _ in self._duties)
        due = self.options.burst or now - self._last_claim >= self.options.poll_interval
        if notified and not self.options.burst:
            # A job was just enqueued: claim it first, the safety net after (its statement
            # would delay the pick-up; what it wakes is claimed at once, on the next round).
            # A burst run keeps the safety net first: a claim that finds nothing may end it.
            claimed = self._claim()
            if self._unblock(now):
                self._more_likely = True
        else:
            self._unblock(now)  # once per poll interval, by its own clock: a busy loop claims
            if self._more_likely or due or self.flow.claim_due(now):
                claimed = self._claim()
        if self.options.burst and claimed == 0 and self._dry and not self._runs:
            if not duties_ready:  # their first pass may enqueue work: claim again after it
                self._wait_for_duties()
                return True
            self._stop_reason = "burst: nothing left to do"
            return False
        self.started.set()
        free = self._free()
        if self._more_likely and free > 0 and (free >= self._refill_at() or not self._queued):
            return True
        self._wake.wait(self._wait_timeout())
        return True

    def notify(self) -> None:
        """A NOTIFY named one of our queues: claim on the next iteration (LISTEN thread)."""
        self._notified = True
        self._wake.set()

    def _wait_timeout(self) -> float:
        now = clock.monotonic()
        timeout = max(0.0, self._last_claim + self.options.poll_interval - now)
        if self._finished:
            timeout = min(timeout, max(0.0, self._finished_since + self.settings.ack_interval
                                       - now))
        retry = min((r.retry_at for r in self._busy), default=None)
        release = self.flow.release_retry_at
        for at in (retry, release):
            if at is not None:
                timeout = min(timeout, max(0.0, at - now))
        rate_due = self.flow.wait_limit(now)
        return timeout if rate_due is None else min(timeout, rate_due)

    def prefetch(self) -> int:
        """Runs to hold claimed beyond the threads: fixed, or sized to PREFETCH_WINDOW of work."""
        if self.options.prefetch is not None:
            return self.options.prefetch
        avg = self._avg_run
        if avg is None:
            return self.options.concurrency
        return min(PREFETCH_MAX, int(self.options.concurrency * PREFETCH_WINDOW / max(avg, 1e-6)))

    def _free(self) -> int:
        return self.options.concurrency + self.prefetch() - len(self._runs)

    def _refill_at(self) -> int:
        # Claim again once a quarter of the capacity is free: batches stay big, and threads
        # still have queued work while the claim is on the wire.
        return max(1, (self.options.concurrency + self.prefetch()) // 4)

    # ----------------------------------------------------------------------- 3. claim --
    def _wants(self, free: int) -> dict[str, int]:
        """``free`` slots split over the queues that have room, starting at the queue after
        the last one that got a share the time before (the rotation)."""
        queues = self.options.queues
        start = self._next_queue % len(queues)
        order = queues[start:] + queues[:start]
        caps = self.options.queue_concurrency
        in_queue = Counter(r.job.queue for r in self._runs.values()) if caps else Counter()
        room = {q: caps[q] + self.prefetch() - in_queue[q] for q in order if q in caps}
        # A queue at its cap cannot be claimed from now: it counts as asked in this sweep.
        self._unswept.difference_update(q for q, n in room.items() if n <= 0)
        open_queues = [q for q in order if room.get(q, free) > 0]
        if not open_queues:
            return {}
        share, extra = divmod(free, len(open_queues))
        wants: dict[str, int] = {}
        for i, q in enumerate(open_queues):
            n = min(share + (1 if i < extra else 0), room.get(q, free))
            if n > 0:
                wants[q] = n
        # The next split starts after the last queue that got one more than the others.
        last = open_queues[extra - 1] if extra else open_queues[0]
        self._next_queue = (start + order.index(last) + 1) % len(queues)
        return wants

    def _swept(self, wants: dict[str, int], claimed: int) -> None:
        """After a claim: claim again at once while a sweep that found nothing so far has not
        asked every queue yet (docs/guide.md, "The worker")."""
        if claimed:
            self._new_sweep(dry=False)
            return
        self._unswept.difference_update(wants)
        if self._unswept:
            self._more_likely = True
            self._dry = False
        else:
            self._new_sweep(dry=True)

    def _new_sweep(self, *, dry: bool) -> None:
        """Every queue is to be asked again; ``dry``: the sweep just ended found nothing."""
        self._unswept = set(self.options.queues)
        self._dry = dry

    def _claim(self) -> int:
        free = self._free()
        if free <= 0:
            return 0
        wants = self._wants(free)
        # The lease starts when the database runs the claim, which is after this moment: the
        # worker's view of the lease (renewed_at) must never outlive the database's.
        sent_at = self._last_claim = clock.monotonic()
        if not wants:
            self._more_likely = False
            return 0
        try:
            if not self._labelled:
                self._label()
            claimed = self.flow.claim(wants, self.lease_ms)
        except Exception as exc:
            self._claim_failed(exc)
            self._more_likely = False
            return 0
        self._failed_claims = self._db_failures = 0
        reachability.database.reached()
        if claimed:
            self.liveness.claimed_at = sent_at
        per_queue = Counter(job.queue for job in claimed)
        runs = [Run(job, registry.lookup(job.name), sent_at, budget=self._lease_budget,
                    on_unproven=self._unproven) for job in claimed]
        for run in runs:
            if run.job.slot is not None:
                self.flow.attach(run, sent_at)
        self._dispatch(runs)
        # Jobs held back by flow control left the scan: what was behind them may be claimable.
        # A fair queue's claim caps each tenant's take, so a short answer there is not the
        # queue running dry: ask it again until it answers nothing.
        fair = self.flow.params.fair_queues
        self._more_likely = claimed.held > 0 or any(
            per_queue[q] >= n or (q in fair and per_queue[q] > 0) for q, n in wants.items())
        self._swept(wants, len(claimed) + claimed.held)
        self._low_water = max(1, (self.options.concurrency + self.prefetch()) // 2)
        self.stats["claimed"] += len(claimed)
        if not claimed and self._dry and not self._runs:
            self.idle.set()
        else:
            self.idle.clear()
        return len(claimed)

    def _label(self) -> None:
        """Set up the loop's connection (engine.session_label). Its statements must run at
        READ COMMITTED, the level every lock and snapshot of theirs is written for
        (docs/guarantees.md, "Isolation levels"): a database or role whose sessions default to
        another level stops the worker."""
        isolation = self.engine.session_label(f"xjobs:{self.worker_id}:loop")
        self._labelled = True
        if isolation != "read committed":
            raise ConfigurationError(
                f"the worker's database sessions run at {isolation.upper()} "
                "(default_transaction_isolation), and its statements need READ COMMITTED: set "
                "it for the worker's role (ALTER ROLE ... SET default_transaction_isolation = "
                "'read committed') or leave the server's default (docs/guarantees.md, "
                "\"Isolation levels\")")

    def _claim_failed(self, exc: Exception) -> None:
        """A claim that failed: retried, except by a burst run that cannot go on (it stops,
        with :attr:`error` saying why)."""
        self._failed_claims += 1
        self._dry = False
        lost = self.engine.is_connection_error(exc)
        if not self.options.burst or (lost and self._failed_claims < BURST_CLAIM_TRIES):
            self._db_error("claim", exc)
            return
        if lost:
            self.engine.reset_connection()
            self.error = (f"burst: the database cannot be reached ({self._failed_claims} "
                          f"claims failed): {str(exc).strip()}")
        else:
            self.error = f"burst: claiming jobs failed: {type(exc).__name__}: {exc}"
        log.error("%s", self.error, exc_info=not lost and not isinstance(exc, XJobsError))
        self.stop(self.error)

    def _wait_for_duties(self) -> None:
        for duty, _ in self._duties:
            if not duty.started.wait(self.options.poll_interval):
                return

    def _dispatch(self, runs: list[Run]) -> None:
        """Hand claimed runs to executors: sync ones to the thread queue, async ones to the
        event loop, unknown names straight to their outcome."""
        sync = [r for r in runs if r.definition is not None and not r.definition.is_async]
        with self._lock:
            for run in runs:
                self._runs[run.job.lease_token] = run
            self._queued += len(sync)
        for run in sync:
            self._work.put(run)
        if len(sync) == len(runs):
            return
        for run in runs:
            if run.definition is None:
                self._finish(run, executor.unknown_job(run.job, self.settings), from_phase=QUEUED)
            elif run.definition.is_async:
                run.phase = RUNNING
                if run.definition.timeout is not None:
                    run.deadline = clock.monotonic() + run.definition.timeout
                run.future = asyncio.run_coroutine_threadsafe(self._run_async(run),
                                                              self._event_loop())

    # -------------------------------------------------------------------- executors --
    def _executor_main(self) -> None:
        # Named when it connects: the job code's own statements, and its steps, run on it.
        self.engine.name_session(f"xjobs:{self.worker_id}:run")
        last_job_end = 0.0
        while True:
            held_slot = False
            run = self._work.get()
            if run is None:
                return
            unproven = None
            with self._lock:
                self._queued -= 1
                started = clock.monotonic()
                if run.phase != QUEUED:  # stopped before it started (lost, shutdown)
                    run = None
                elif started - run.renewed_at >= run.budget:
                    # Prefetched, and its lease may have lapsed meanwhile (the process was
                    # paused): never started, the job is handed back (docs/guarantees.md).
                    unproven, run = run, None
                else:
                    run.phase = RUNNING
                    if run.definition and run.definition.timeout is not None:
                        run.deadline = started + run.definition.timeout
            if unproven is not None:
                self._unproven(unproven, "the prefetched job")
            if run is not None:
                faults.hit("worker:job-start")
                if django_settings.DEBUG:
                    reset_queries()
                assert run.definition is not None
                try:
                    outcome = executor.execute(
                        run.definition, run.job, run.ctx, self.settings,
                        fresh_connections=started - last_job_end >= IDLE_RECHECK,
                    )
                except BaseException as exc:  # never lose the thread, or the run with it
                    log.exception("job %s (%s): no outcome", run.job.id, run.job.name)
                    outcome = executor.internal_error(exc, run.definition, run.job,
                                                      self.settings)
                ended = last_job_end = clock.monotonic()
                avg = self._avg_run
                self._avg_run = ended - started if avg is None else (
                    0.9 * avg + 0.1 * (ended - started)
                )
                held_slot = run.slot is not None
                self._finish(run, outcome, from_phase=RUNNING)
                if run.abandoned:
                    return  # a replacement took this thread's place while the code ran on
            else:
                ended = clock.monotonic()
            # Wake the loop only when it has something worth a round trip: runs to claim for
            # (the queue ran low), a full ack batch, an outcome that waited ack_interval, or a
            # run that holds a slot (its release lets the key's next job start, fleet-wide).
            # Not again while a wake-up is pending: the loop clears the event before it reads
            # what the executors left (_iterate), so this run's outcome, recorded above, is
            # seen by the round that event starts; setting it again costs a lock per job.
            if self._wake.is_set():
                continue
            finished = len(self._finished)
            if (held_slot or self._queued <= self._low_water
                    or finished >= self.settings.ack_batch
                    or (finished and ended - self._finished_since >= self.settings.ack_interval)):
                self._wake.set()

    async def _run_async(self, run: Run) -> None:
        assert run.definition is not None
        try:
            outcome = await executor.execute_async(run.definition, run.job, run.ctx,
                                                   self.settings)
        except BaseException as exc:  # never leave the run without an outcome
            log.exception("job %s (%s): no outcome", run.job.id, run.job.name)
            outcome = executor.internal_error(exc, run.definition, run.job, self.settings)
        self._finish(run, outcome, from_phase=RUNNING)
        self._wake.set()

    def _finish(self, run: Run, outcome: Outcome, *, from_phase: str) -> bool:
        """Record a run's outcome once; later outcomes of the same run are ignored."""
        with self._lock:
            if run.phase != from_phase:
                return False
            # Discard too: a step write the slot guard refused (Run._slot_guard) ends the run
            # with SlotLost, and the job must be handed back, not left to its lease.
            lost = (run.slot is not None and isinstance(outcome, Done | Retry | Discard)
                    and self.flow.slot_lapsed(run, clock.monotonic()))
            if lost:
                # The run ended after its slot may have lapsed (a worker frozen past the TTL
                # wakes up with its code finishing): it cannot prove it held the slot, so its
                # result is not written (slots.py).
                outcome = self.flow.lost("the run ended after its slot lapsed")
            self._record(run, outcome)
        if lost:
            self.flow.log_lost(run, "the run ended after its slot lapsed")
        return True

    def _record(self, run: Run, outcome: Outcome) -> None:
        # Caller holds self._lock.
        run.phase = FINISHED
        run.outcome = outcome
        self.liveness.finished += 1
        if not self._finished:
            self._finished_since = clock.monotonic()
        self._finished.append(run)

    def _unproven(self, run: Run, what: str) -> None:
        """A run could not prove its lease before starting a body (``Run.prove_lease``, or a
        prefetched run about to start): stop it and hand the job back, its attempt given back
        (a run that did lose the job is fenced off: the hand-back then changes nothing)."""
        age = clock.monotonic() - run.renewed_at
        lease = self.options.lease
        self.stats["lease_unproven"] += 1
        log.warning("job %s (%s) attempt %d: lease not proven, last renewal %.1fs ago (lease "
                    "%gs): not starting %s; handing the job back", run.job.id, run.job.name,
                    run.job.attempt, age, lease, what)
        self._stop_run(run, "lease not proven", GiveBack(
            delay=0, note=f"handed back: its worker could not prove its lease before starting "
                          f"{what} (last renewal {age:.1f}s ago, lease {lease:g}s)",
        ))
        run.ctx.stop("lease not proven")

    def _stop_run(self, run: Run, reason: str, outcome: Outcome,
                  error: type[JobCancelled] = JobCancelled) -> None:
        """Stop a queued or running run with ``outcome`` (settled by the next flush).

        A sync run's thread cannot be killed: it is marked abandoned (it exits once the code
        returns) and a replacement thread starts at once, so capacity is not lost.
        """
        with self._lock:
            previous = run.phase
            if previous not in (QUEUED, RUNNING):
                return
            self._record(run, outcome)
            run.abandoned = previous == RUNNING and run.future is None
        run.ctx.stop(reason, error)
        if run.future is not None:
            run.future.cancel()  # cancels the task on the event loop
        elif run.abandoned:
            self.stats["abandoned_threads"] += 1
            self._spawn_executor()

    # ----------------------------------------------------------------- 1. settle --
    def _settle(self) -> None:
        now = clock.monotonic()
        retried = [r for r in self._busy if r.retry_at <= now] if self._busy else []
        if not self._finished and not retried:
            if self.flow.release_due(now):
                self._release(())
            return
        if retried:
            self._busy = [r for r in self._busy if r.retry_at > now]
        if self.options.burst:
            # What finished may have enqueued or woken work (a job it enqueued, its children,
            # the parent its ack wakes) in a queue the current sweep already asked: the sweep
            # that may end a burst starts again from here.
            self._new_sweep(dry=False)
        batch: list[Run] = retried
        while self._finished:
            batch.append(self._finished.popleft())
        done = [r for r in batch if isinstance(r.outcome, Done)]
        others = [r for r in batch if not isinstance(r.outcome, Done)]
        unsettled: list[Run] = []
        # One statement for every Done, children of several parents included: it locks their
        # rows and their parents' step rows SKIP LOCKED, in one order, so no two batches (and
        # no batch and the heartbeat) ever wait on each other (docs/design.md, "Lock order").
        if done:
            unsettled.extend(self._acknowledge(done))
        for i, r in enumerate(others):
            try:
                fence, state = self._write_outcome(r)
            except Exception as exc:
                if self.engine.is_connection_error(exc):
                    # The others would fail the same way, each after a longer pause.
                    self._db_error("settle", exc)
                    unsettled.extend(others[i:])
                    break
                self._db_error("settle", exc)
                unsettled.append(r)
                continue
            if fence is Fence.BUSY:
                self._set_aside(r)
            else:
                self._settled(r, fence, state)
        if unsettled:
            with self._lock:
                self._finished.extendleft(reversed(unsettled))
        if self.flow.holding:
            self._release(r for r in batch if r.phase == SETTLED)

    def _release(self, settled: Iterable[Run]) -> None:
        """Release the slots of settled runs (and those a held row turned away before)."""
        try:
            self.flow.release(settled)
        except Exception as exc:
            self._db_error("slot release", exc)
        else:
            self._more_likely = True  # the release woke the jobs of its keys: claim them

    def _set_aside(self, run: Run) -> None:
        """A settle that found the run's row held by another transaction: nothing was written
        and nothing waited. Write it again at a later settle, the pause doubling up to
        BUSY_RETRY_MAX; the heartbeat keeps the run's lease meanwhile."""
        now = clock.monotonic()
        run.busy_pause = busy_pause(run.busy_pause)
        run.retry_at = now + run.busy_pause
        if run.held_since is None:
            run.held_since = now
        if run.busy_pause == BUSY_RETRY_FIRST:
            self.stats["settles_set_aside"] += 1
            log.info("job %s (%s) attempt %d: its row is held by another transaction; its "
                     "outcome is written once the row is free (tried again in %gs, then at most "
                     "every %gs)", run.job.id, run.job.name, run.job.attempt, run.busy_pause,
                     BUSY_RETRY_MAX)
        self._busy.append(run)

    def _acknowledge(self, done: list[Run]) -> list[Run]:
        """One ``jobs_complete_if_owned`` for these runs; returns them when it failed (a
        database error: the next settle writes them again), else nothing."""
        try:
            report = self.engine.jobs_complete_if_owned([
                Completion(claim=r.job.claim,
                           result_json=r.outcome.result_json)  # type: ignore[union-attr]
                for r in done
            ])
        except Exception as exc:
            self._db_error("acknowledge", exc)
            return done
        else:
            if (len(report.owned) == len(done) and not log.isEnabledFor(logging.DEBUG)
                    and not announcing()):
                # The usual case: every run still owned its job. Settle them in one go.
                with self._lock:
                    for r in done:
                        r.phase = SETTLED
                        del self._runs[r.job.lease_token]
                for r in done:
                    r.let_go_of_ctx()  # a Done run's code has returned
                self.stats["done"] += len(done)
            else:
                for r in done:
                    fence = report.outcome(r.job.lease_token)
                    if fence is Fence.BUSY:
                        self._set_aside(r)
                    else:
                        self._settled(r, fence, "done")
        return []

    def _write_outcome(self, run: Run) -> tuple[Fence, str]:
        assert run.outcome is not None
        return write_outcome(self.engine, run.job, run.outcome)

    def _settled(self, run: Run, fence: Fence, state: str) -> None:
        with self._lock:
            run.phase = SETTLED
            self._runs.pop(run.job.lease_token, None)
        job = run.job
        if run.held_since is not None:
            log.info("job %s (%s): settled %.1fs after another transaction first held its row",
                     job.id, job.name, clock.monotonic() - run.held_since)
        if announcing():
            assert run.outcome is not None
            announce(self.engine, job, run.definition or job.name, run.outcome, fence, state)
        if fence is Fence.LOST:
            self.stats["lost"] += 1
            reason = run.outcome.reason if isinstance(run.outcome, Discard) else (
                "the job was cancelled or re-claimed after its lease lapsed"
            )
            log.warning("job %s (%s) attempt %d: result discarded, this run no longer owns the "
                        "job: %s", job.id, job.name, job.attempt, reason)
            return
        if fence is Fence.ALREADY_APPLIED:
            self.stats["already_applied"] += 1
            log.info("job %s (%s): %s had already been recorded (the connection died after the "
                     "commit)", job.id, job.name, state)
        self.stats[state] += 1
        outcome = run.outcome
        if isinstance(outcome, executor.UnknownName):
            try:
                self.unknown.gave_back(job.name)
            except Exception as exc:  # a report is not worth failing the settle for
                log.warning("job %s (%s): the wait of its name not read: %s", job.id, job.name,
                            exc)
        if isinstance(outcome, Retry):
            # The error as recorded on the row: its class, then the traceback of the run (the
            # exception itself stayed with the executor thread that caught it).
            level = logging.ERROR if state == "dead" else logging.WARNING
            error = outcome.error.rstrip()
            log.log(level, "job %s (%s) attempt %d/%d failed -> %s: %s\n%s", job.id, job.name,
                    job.attempt, job.max_attempts, state, error.splitlines()[-1], error)
        elif log.isEnabledFor(logging.DEBUG):
            log.debug("job %s (%s) attempt %d -> %s", job.id, job.name, job.attempt, state)

    # ------------------------------------------------------------------ 2. watch --
    def _watch_main(self) -> None:
        """Step 2 every WATCH_EVERY, off the loop thread: the loop blocks in claims and settles,
        and a database that stops answering must not let a run outlive its lease or timeout."""
        while not self._stop_threads.wait(WATCH_EVERY):
            if faults.armed:
                faults.hit("worker:watch")
            try:
                if self._watch():
                    self._wake.set()
            except Exception:  # pragma: no cover - a bug here must not end the watch
                log.exception("watch failed")
            # A supervised worker whose supervisor died (its parent is now another process)
            # stops as if SIGTERMed: nobody is left to stop it, and a restarted supervisor
            # would start a full set beside it.
            supervisor = self.options.supervisor
            if supervisor is not None and not self._stopping and os.getppid() != supervisor:
                self.stop("its supervisor is gone")

    def _watch(self) -> bool:
        """Stop what must stop; whether anything was stopped (the loop then settles it)."""
        now = clock.monotonic()
        lease = self.options.lease
        stopped = False
        with self._lock:
            runs = list(self._runs.values())
        for run in runs:
            if run.phase not in (QUEUED, RUNNING):
                continue
            if run.deadline is not None and now >= run.deadline and run.phase == RUNNING:
                timeout = run.definition.timeout if run.definition else 0
                stopped = True
                self.stats["timeouts"] += 1
                self._stop_run(run, "timeout", Retry(
                    error=f"TimeoutError: {run.job.name} ran longer than its timeout "
                          f"({timeout:g}s); the run was stopped and its result will be discarded",
                    delay=executor.backoff_for(run.definition, run.job.attempt, self.settings),
                    outcome="timeout",
                ))
            elif self.flow.slot_lapsed(run, now):
                # The self-fence of a slot: a hung heartbeat cannot renew it, and past its TTL
                # another worker may take it.
                stopped = True
                self._slot_lost(run, f"no slot renewal for {now - run.slot_renewed_at:.1f}s "
                                     f"(SLOT_TTL {self.flow.slot_ttl:g}s)")
            elif now - run.renewed_at >= lease:
                stopped = True
                self.stats["self_fenced"] += 1
                log.error("job %s (%s): no lease renewal for %.1fs (lease %gs); stopping the run "
                          "and handing the job back", run.job.id, run.job.name,
                          now - run.renewed_at, lease)
                self._stop_run(run, "lease not renewed", GiveBack(
                    delay=0, note="handed back: its worker could not renew the lease "
                                  f"for a whole lease period ({lease:g}s)",
                ))
        hb = self._heartbeat
        if hb is not None and (
            (hb.in_call_since is not None and now - hb.in_call_since >= lease)
            or not hb.is_alive()
        ) and not self._stop_threads.is_set():
            log.error("heartbeat thread stuck in a statement for %gs: replacing it", lease)
            self.stats["heartbeat_replaced"] += 1
            self._start_heartbeat()
        return stopped

    def seen(self) -> None:
        """This worker is alive and serves its queues, and how its loop is doing (x_workers;
        the heartbeat calls it)."""
        with self._lock:
            running = sum(1 for r in self._runs.values() if r.phase == RUNNING)
        claimed_age, loop_age = self.liveness.ages()
        self.engine.worker_seen(
            self.worker_id, socket.gethostname(), os.getpid(), self.options.queues,
            version=conf.VERSION, concurrency=self.options.concurrency, running=running,
            finished=self.liveness.finished, claimed_age=claimed_age, loop_age=loop_age)

    def unsettled(self) -> list[Run]:
        with self._lock:
            return [r for r in self._runs.values() if r.phase != SETTLED]

    def on_renewed(self, runs: Sequence[Run], renewal: Renewal, sent_at: float) -> None:
        """Heartbeat answer (per lease token): runs whose lease was renewed, or kept beside a
        row another transaction holds, move their clock; the others lost the job."""
        for run in runs:
            token = run.job.lease_token
            if token in renewal.renewed:
                run.renewed_at = sent_at
                if run.held_since is not None and run.phase in (QUEUED, RUNNING):
                    log.info("job %s (%s): its row is free again after %.1fs", run.job.id,
                             run.job.name, sent_at - run.held_since)
                    run.held_since = None
                continue
            if token in renewal.kept:
                run.renewed_at = sent_at
                if run.held_since is None:
                    run.held_since = sent_at
                    self.stats["leases_kept"] += 1
                    log.info("job %s (%s) attempt %d: its row is held by another transaction; "
                             "the run goes on, its lease kept beside the row until it is free",
                             run.job.id, run.job.name, run.job.attempt)
                continue
            if run.phase in (QUEUED, RUNNING) and not run.parking:
                self.stats["lost_on_heartbeat"] += 1
                log.warning("job %s (%s) attempt %d: lease lost (cancelled, or re-claimed after "
                            "a lapse); stopping the run", run.job.id, run.job.name,
                            run.job.attempt)
                self._stop_run(run, "lease lost", Discard("lease lost at heartbeat"))
        self._wake.set()

    # ------------------------------------------------------------- flow control --
    def _unblock(self, now: float) -> int:
        """The safety net of blocked jobs, once per poll interval (flow.py); how many it woke."""
        try:
            return self.flow.unblock_due(now)
        except Exception as exc:
            self._db_error("unblock", exc)
            return 0

    def on_slots_renewed(self, runs: Sequence[Run], renewal: Renewal, sent_at: float) -> None:
        """Heartbeat answer for slots (per holder): a run whose slot was neither renewed nor
        held by another transaction this moment lost it (it lapsed, and may have been taken):
        stop it (X_JOB_SLOT_LOST)."""
        for run in self.flow.renewed(runs, renewal, sent_at):
            if run.phase in (QUEUED, RUNNING) and not run.parking:
                self._slot_lost(run, "the slot's renewal was refused: it lapsed (and may have "
                                     "been taken by another run)")
        self._wake.set()

    def _slot_lost(self, run: Run, why: str) -> None:
        if run.phase in (QUEUED, RUNNING):
            self.flow.log_lost(run, why)
            self._stop_run(run, f"{SLOT_LOST}: {why}", self.flow.lost(why), SlotLost)

    # --------------------------------------------------------------- shutdown --
    def _drain_step(self) -> bool:
        """One iteration while stopping; False when it is time to leave the loop."""
        if self._drain_deadline is None:
            self._drain_deadline = clock.monotonic() + self.options.shutdown_grace
            for run in list(self._runs.values()):
                if run.phase == QUEUED:
                    self._stop_run(run, "worker shutting down",
                                   GiveBack(delay=0, note=None))
        if not self._runs:
            return False
        if clock.monotonic() >= self._drain_deadline:
            for run in list(self._runs.values()):
                if run.phase in (QUEUED, RUNNING):
                    log.warning("job %s (%s) still running after the %gs grace period: "
                                "stopping it and handing it back", run.job.id, run.job.name,
                                self.options.shutdown_grace)
                    self._stop_run(run, "worker shutting down", GiveBack(
                        delay=0, note="handed back: its worker shut down before it finished",
                    ))
            self._settle()
            return bool(self._runs) and not self._settle_failed_too_long()
        self._wake.wait(WATCH_EVERY)
        return True

    def _settle_failed_too_long(self) -> bool:
        # Past the grace period the only thing left is writing outcomes back; if the database
        # stays unreachable for a lease, give up: the leases lapse and the jobs are re-claimed.
        assert self._drain_deadline is not None
        return clock.monotonic() >= self._drain_deadline + self.options.lease

    def _shutdown(self) -> None:
        self._settle()
        self._stop_threads.set()
        try:
            self.engine.worker_gone(self.worker_id)
        except Exception as exc:  # the row ages out of every read
            log.debug("worker row not deleted: %s", exc)
        for _, thread in self._duties:
            # A duty hands back what it holds when it stops (the scheduler resigns its lease,
            # so the next leader need not wait for it to lapse); a stuck one is left behind.
            thread.join(timeout=DUTY_STOP_TIMEOUT)
        for _ in self._threads:
            self._work.put(None)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)

    # ---------------------------------------------------------------------- errors --
    def _db_error(self, what: str, exc: BaseException) -> None:
        self.stats["db_errors"] += 1
        self._db_failures += 1
        lost = reachability.connection_error(exc, f"worker {what}", self.engine)
        if lost is not None:
            self._labelled = False
            if lost == reachability.LOST:
                log.info("%s: database connection lost (%s); reconnecting", what, exc)
        elif isinstance(exc, XJobsError):
            log.error("%s failed: %s", what, exc)
        else:
            log.exception("%s failed; retrying", what)
        # Do not spin against a database that is down (or a schema that is not there): back
        # off while the failures go on.
        if isinstance(exc, XJobsError):
            pause = 5.0
        else:
            first = min(self.options.poll_interval, 0.5)
            pause = min(DB_RETRY_MAX, first * 2 ** min(self._db_failures - 1, 16))
        self._wake.wait(pause)
