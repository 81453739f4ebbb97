"""THE CONTROL FLOW of a worker process. No SQL and no models: every database operation is an
engine call, every job outcome comes from ``executor``.

A run's life is claim -> dispatch -> heartbeat -> fenced finish, and at the end shutdown. This
module keeps that order; the parts answer to it from rooms of their own: the run table
(runs.py), how much to claim and from which queues (capacity.py), flow control (flow.py), the
threads that run the jobs (threads.py), the heartbeat (heartbeat.py), what stops a run
(watchdog.py), the fenced writes (settle.py), and the background duties it is handed
(duties.py).

The loop, in the order one iteration runs it (``Worker._iterate``):

1. **Settle** (settle.py): every ``Done`` of the iteration in ONE ``jobs_complete_if_owned``
   (``jobs_complete_release_if_owned`` when some held slots: their release goes with it),
   other outcomes one fenced statement each, the slots of the other settled runs released in
   ONE ``slots_release_if_held``; a release hands each freed slot to the next job blocked on
   its key that this worker can start (the hand-over: leased to it in that statement, started
   here as a claimed run). A write that matches no row means the run lost the job: logged, result
   discarded, never raised; a row another transaction holds is written again later.
2. **Watch** (watchdog.py, on its own thread, ``xjobs-watch``, which never touches the
   database: a loop stuck in a statement must not stop it): runs past their ``timeout``, or
   that can no longer prove their lease or slot (the self-fence), are stopped; whatever it
   stops wakes the loop, which settles it.
3. **Claim and dispatch.** Up to the free capacity (capacity.py), split over the queues, in ONE
   ``jobs_claim``; claimed runs go to the executor threads (sync jobs) or the event loop (async
   jobs) (threads.py). The loop claims again at once if the last claim was full or held jobs
   back by flow control (they left the scan, and what was behind them may be claimable), or
   if it found nothing and some queue has not been asked since the sweep began. A run starts
   its job's code, and each step's function, only while it can prove its lease
   (``Run.prove_lease``, docs/guarantees.md).
4. **Wait** on the wake event (for a NOTIFY, a freed slot after a full claim, or the poll
   interval): set by the LISTEN thread, by executors when the work queue runs low or enough
   results wait to be settled, by the watchdog, and by the signal handler.

Flow control (flow.py; docs/flow-control.md) is decided by the claim itself, so every claimed
run may start. Once per poll interval the loop also runs ``jobs_unblock``, the safety net for
blocked jobs no slot release woke: before the claim, except in a round a NOTIFY started, where
the claim goes first (the pick-up of a job just enqueued does not wait for it) and what it woke
is claimed in the next round.

Burst mode (``--burst``, ``testing.drain``) runs until nothing is due: a sweep of every queue
found nothing, nothing is in flight, no run finished since that sweep began (a run may enqueue
or wake work in a queue the sweep had already asked), and every background duty had finished
its first pass before that sweep began (the scheduler's first round may fire late cron
occurrences). A burst that cannot claim (the database unreachable) stops with
:attr:`Worker.error` set.

Shutdown (first SIGTERM/SIGINT): stop claiming, hand queued runs back at once, let running ones
finish within ``shutdown_grace``, then stop them and hand their jobs back without spending an
attempt.

Recycling (``--max-jobs-per-process``, ``--max-memory``; worker/recycling.py): judged after each
settle; the worker then drains as on a shutdown, except that its running runs finish however
long they take (no grace period), and says why in :attr:`Worker.recycled`.
"""

from __future__ import annotations

import gc
import logging
import math
import threading
from collections import Counter

from django.db import connections

from .. import clock, conf, faults, registry
from ..context import log_extra, log_prefix
from ..engines import get_engine
from ..exceptions import ConfigurationError, XJobsError
from ..records import ClaimedJob
from . import duties, executor, reachability
from .capacity import Capacity
from .executor import GiveBack
from .floors import Floors
from .flow import Flow
from .listener import WakeListener
from .liveness import Liveness
from .options import WorkerOptions, new_worker_id
from .recycling import Recycling
from .runs import LEASE_MARGIN, QUEUED, RUNNING, Run, Runs
from .settle import Settler
from .shutdown import ShutdownSignals
from .threads import Executors
from .unknown import UnknownNames
from .watchdog import WATCH_EVERY, Watchdog

log = logging.getLogger("django_xjobs.worker")

# How long a stopping worker waits for each background duty to finish its round and stop.
DUTY_STOP_TIMEOUT = 5.0
# Burst mode gives up (and the command exits non-zero) after this many claims in a row failed
# on a lost connection; at once on any other error.
BURST_CLAIM_TRIES = 3
# The pause after a failed database call doubles with each failure in a row, up to this
# (seconds); the first pause is the poll interval, at most half a second.
DB_RETRY_MAX = 5.0


class Worker:
    """One worker: the loop, run on the calling thread by :meth:`run`, and the parts it drives
    (see the module docstring)."""

    def __init__(self, options: WorkerOptions) -> None:
        self.options = options
        self.settings = conf.get()
        self.engine = get_engine()
        faults.alias = self.engine.alias
        self.worker_id = options.worker_id or new_worker_id()
        self.lease_ms = round(options.lease * 1000)
        self._lease_budget = options.lease * (1 - LEASE_MARGIN)
        self.stats: Counter[str] = Counter()

        self._wake = threading.Event()
        self._stop_threads = threading.Event()
        self._stopping = False
        self._notified = False
        self._labelled = False
        self._drain_deadline: float | None = None
        self._stop_reason = ""
        self._more_likely = True
        self._claim_first = True  # this round claims: no hand-over (_hand_over_room)
        self._leaving = False  # out of the loop: what a release hands over would never run
        self._last_claim = -1e9
        self._failed_claims = 0  # claims in a row that failed
        self._db_failures = 0  # database calls of the loop in a row that failed
        # Why a burst run stopped before it could finish (the command then exits non-zero).
        self.error: str | None = None
        # Why it left for a fresh process to take its place (worker/recycling.py), None if it
        # did not: xjobs_worker then exits with EXIT_RECYCLED.
        self.recycled: str | None = None
        self._recycling = False  # draining for a recycle: no grace period
        self._stop_lock = threading.Lock()  # a stop and a recycle: one decides
        self.recycling = (Recycling(max_jobs=options.max_jobs_per_process,
                                    max_memory=options.max_memory)
                          if options.max_jobs_per_process or options.max_memory else None)
        self._listener: WakeListener | None = None
        self._duties: list[tuple[duties.Duty, threading.Thread]] = []
        self.liveness = Liveness(options.health_file)  # reported in x_workers
        self.started = threading.Event()  # test signal: threads up, first claim done
        self.idle = threading.Event()  # test signal: nothing in flight after a claim found none
        self.flow = Flow(engine=self.engine, settings=self.settings, worker_id=self.worker_id,
                         queues=options.queues, poll_interval=options.poll_interval,
                         stats=self.stats)
        if not options.burst:
            self.flow.floors = Floors(
                priorities={d.priority for d in registry.all_jobs().values()},
                fair=self.flow.params.fair_queues)
        self.runs = Runs(flow=self.flow, liveness=self.liveness)
        self.capacity = Capacity(options, self.runs, self.recycling)
        self.flow.offer, self.flow.lease_ms = self._hand_over_room, self.lease_ms
        self.executors = Executors(
            engine=self.engine, worker_id=self.worker_id, settings=self.settings,
            options=options, runs=self.runs, capacity=self.capacity, wake=self._wake,
            stats=self.stats)
        self.watchdog = Watchdog(
            engine=self.engine, worker_id=self.worker_id, settings=self.settings,
            options=options, lease_ms=self.lease_ms, runs=self.runs, flow=self.flow,
            executors=self.executors, liveness=self.liveness, stats=self.stats,
            wake=self._wake, stop_threads=self._stop_threads, stop_worker=self.stop,
            stopping=lambda: self._stopping)
        self.settler = Settler(
            engine=self.engine, runs=self.runs, flow=self.flow, stats=self.stats,
            unknown=UnknownNames(self.engine, self.settings.unknown_job_report_after),
            db_error=self._db_error)

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
            self.executors.start(self.options.concurrency)
            # The heartbeat and the watch before the first claim: a run it takes is renewed
            # on the heartbeat's schedule from its claim on, however long the rest takes.
            self.watchdog.start()
            log.info(
                "worker %s started: queues=%s concurrency=%d prefetch=%s lease=%gs "
                "heartbeat=%gs notify=%s%s",
                self.worker_id, ",".join(self.options.queues), self.options.concurrency,
                "auto" if self.options.prefetch is None else self.options.prefetch,
                self.options.lease, self.options.heartbeat, self.options.notify,
                f" shard={self.engine.alias}" if conf.get().shards else "",
            )
            if self.recycling is not None:
                self.recycling.starting(self.worker_id)
            if self._labelled and not self.options.burst:
                # The first claim goes before the rest of the start-up (the worker's row, the
                # listener's and the duties' connections, the safety net): its jobs start
                # while those are set up, not after (docs/performance.md, "Worker start-up").
                # A burst run keeps its first round's order (the safety net first).
                self._claim()
            self._start_threads()
            # What exists now (Django, the app's modules, this worker's threads and connections)
            # lives as long as the worker: left out of the garbage collector's full passes,
            # which otherwise walk all of it again every few thousand jobs, since the runs in
            # flight keep being promoted to the oldest generation (docs/performance.md, "Where
            # a job's time goes"). Given back when the worker stops: an embedding process
            # (testing.drain) keeps its usual collection.
            gc.freeze()
            frozen = True
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
        """Ask for a graceful stop (thread-safe; the first signal calls this). During a
        recycle's drain it becomes that stop: the runs still running get the grace period from
        now, and the worker no longer counts as recycled."""
        with self._stop_lock:
            if not self._stopping or self._recycling:
                self._recycling = False
                self.recycled = None
                self._stop_reason = reason
                log.info("worker %s stopping (%s): no new claims; %d runs in flight get %gs",
                         self.worker_id, reason, len(self.runs), self.options.shutdown_grace)
            self._stopping = True
        self._wake.set()

    def _recycle(self, reason: str) -> None:
        """Leave for a fresh process (the loop thread, after a settle): drain as on a stop,
        without a grace period (worker/recycling.py)."""
        with self._stop_lock:
            if self._stopping:  # a stop came first
                return
            self._recycling = True
            self.recycled = self._stop_reason = reason
            self._stopping = True
            log.info("worker %s stopping (%s): no new claims; %d runs in flight finish first",
                     self.worker_id, reason, len(self.runs))
        self._wake.set()

    def notify(self) -> None:
        """A NOTIFY named one of our queues: claim on the next iteration (LISTEN thread)."""
        self._notified = True
        self._wake.set()

    def _start_threads(self) -> None:
        try:
            self.watchdog.seen()
        except Exception as exc:  # the first claim reports a database that is not there
            log.debug("worker row not written: %s", exc)
        if self.options.notify and self.engine.features.listen_notify:
            self._listener = WakeListener(
                engine=self.engine, label=f"xjobs:{self.worker_id}:listen",
                queues=self.options.queues, wake=self.notify, stop=self._stop_threads,
            )
            self._listener.start()
        self._duties = duties.start(self.options.duties, engine=self.engine,
                                    worker_id=self.worker_id, stop=self._stop_threads)

    # ------------------------------------------------------------------ the iteration --
    def _iterate(self) -> bool:
        """One pass of the loop; False once the worker should leave it."""
        self._wake.clear()  # whatever sets it from here on ends the wait below
        notified, self._notified = self._notified, False
        now = clock.monotonic()
        # A round whose claim is due hands no slot over: the release wakes the keys' next jobs
        # and the claim takes them in claim order with everything else (_hand_over_room).
        retry_at = self.flow.retry_at
        self._claim_first = (notified or self._more_likely
                             or now - self._last_claim >= self.options.poll_interval
                             or (retry_at is not None and now >= retry_at))
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
        if self.options.burst and claimed == 0 and self.capacity.dry and not self.runs:
            if not duties_ready:  # their first pass may enqueue work: claim again after it
                self._wait_for_duties()
                return True
            self._stop_reason = "burst: nothing left to do"
            return False
        self.started.set()
        free = self.capacity.free()
        if self._more_likely and free > 0 and (free >= self.capacity.refill_at()
                                               or not self.runs.queued):
            return True
        self._wake.wait(self._wait_timeout())
        return True

    def _wait_timeout(self) -> float:
        now = clock.monotonic()
        timeout = max(0.0, self._last_claim + self.options.poll_interval - now)
        runs = self.runs
        if runs.finished:
            timeout = min(timeout, max(0.0, runs.finished_since + self.settings.ack_interval
                                       - now))
        retry = min((r.retry_at for r in runs.busy), default=None)
        release = self.flow.release_retry_at
        for at in (retry, release):
            if at is not None:
                timeout = min(timeout, max(0.0, at - now))
        rate_due = self.flow.wait_limit(now)
        return timeout if rate_due is None else min(timeout, rate_due)

    # ----------------------------------------------------------------- 1. settle --
    def _settle(self) -> None:
        now = clock.monotonic()
        batch = self.settler.due(now)
        if not batch and not self.flow.release_due(now):
            return
        if batch and self.options.burst:
            # What finished may have enqueued or woken work (a job it enqueued, its children,
            # the parent its ack wakes) in a queue the current sweep already asked: the sweep
            # that may end a burst starts again from here.
            self.capacity.new_sweep(dry=False)
        sent_at = clock.monotonic()  # before the release, which may lease jobs to this worker
        if self.settler.settle(batch):
            self._more_likely = True  # the release woke the jobs of its keys: claim them
        started = self.flow.take_started()
        if started:  # the release handed this worker the slots it freed, with their jobs
            self.liveness.claimed_at = sent_at
            self._start(started, sent_at)
        if self.recycling is not None and batch and not self._stopping:
            reason = self.recycling.settled(batch)
            if reason is not None:
                self._recycle(reason)

    # ------------------------------------------------------- 3. claim and dispatch --
    def _claim(self) -> int:
        free = self.capacity.free()
        if free <= 0:
            return 0
        wants = self.capacity.wants(free)
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
        self._start(claimed, sent_at)
        # Jobs held back by flow control left the scan: what was behind them may be claimable.
        # A fair queue's claim caps each tenant's take, so a short answer there is not the
        # queue running dry: ask it again until it answers nothing.
        fair = self.flow.params.fair_queues
        self._more_likely = claimed.held > 0 or any(
            per_queue[q] >= n or (q in fair and per_queue[q] > 0) for q, n in wants.items())
        # A sweep that found nothing so far claims again at once until it asked every queue.
        if self.capacity.swept(wants, len(claimed) + claimed.held):
            self._more_likely = True
        self.capacity.claimed()
        self.stats["claimed"] += len(claimed)
        if not claimed and self.capacity.dry and not self.runs:
            self.idle.set()
        else:
            self.idle.clear()
        return len(claimed)

    def _start(self, claimed: list[ClaimedJob], sent_at: float) -> None:
        """Start the runs of jobs leased to this worker by a statement sent at ``sent_at`` (a
        claim, or a release's hand-over), each holding its slot from then."""
        runs = [Run(job, registry.lookup(job.name), sent_at, budget=self._lease_budget,
                    on_unproven=self.executors.unproven) for job in claimed]
        for run in runs:
            if run.job.slot is not None:
                self.flow.attach(run, sent_at)
        self._dispatch(runs)

    def _hand_over_room(self, freeing: int) -> int:
        """How many jobs a release may hand this worker now: its free capacity (and the
        ``freeing`` places of the runs the release's statement settles), unless a claim
        is due this round (a NOTIFY, the poll interval, a rate-limited job due again, a claim
        that may find more) or the worker is leaving. Handed over round after round, the keys'
        backlogs would otherwise fill the capacity for good, and the claim, which takes jobs in
        claim order across the queues and rescues lapsed leases, would never run."""
        if self._stopping or self._leaving or self._claim_first:
            return 0
        room = self.capacity.free() + freeing
        # The runs it settles count towards --max-jobs-per-process: they free no budget.
        budget = self.capacity.budget_room()
        return room if budget is None else min(room, budget)

    def _dispatch(self, runs: list[Run]) -> None:
        """Hand claimed runs to executors: sync ones to the thread queue, async ones to the
        event loop, unknown names straight to their outcome."""
        sync = [r for r in runs if r.definition is not None and not r.definition.is_async]
        self.runs.add(runs, queued=len(sync))
        self.executors.submit(sync)
        if len(sync) == len(runs):
            return
        for run in runs:
            if run.definition is None:
                self.runs.finish(run, executor.unknown_job(run.job, self.settings),
                                 from_phase=QUEUED)
            elif run.definition.is_async:
                self.executors.submit_async(run)

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
        self.capacity.dry = False
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

    def _unblock(self, now: float) -> int:
        """The safety net of blocked jobs, once per poll interval (flow.py); how many it woke."""
        try:
            return self.flow.unblock_due(now)
        except Exception as exc:
            self._db_error("unblock", exc)
            return 0

    # --------------------------------------------------------------- shutdown --
    def _drain_step(self) -> bool:
        """One iteration while stopping; False when it is time to leave the loop."""
        if self._drain_deadline is None:
            # A recycle lets its running runs finish however long they take; a stop that
            # comes during it sets the grace period from then (below).
            grace = math.inf if self._recycling else self.options.shutdown_grace
            self._drain_deadline = clock.monotonic() + grace
            for run in self.runs.snapshot():
                if run.phase == QUEUED:
                    self.executors.stop_run(run, "worker shutting down",
                                            GiveBack(delay=0, note=None))
        elif self._drain_deadline == math.inf and not self._recycling:
            self._drain_deadline = clock.monotonic() + self.options.shutdown_grace
        if not self.runs:
            return False
        if clock.monotonic() >= self._drain_deadline:
            for run in self.runs.snapshot():
                if run.phase in (QUEUED, RUNNING):
                    job = run.job
                    log.warning("%s: still running after the %gs grace period: stopping it "
                                "and handing it back", log_prefix(job.id, job.name, job.attempt),
                                self.options.shutdown_grace,
                                extra=log_extra(job.id, job.name, job.attempt))
                    self.executors.stop_run(run, "worker shutting down", GiveBack(
                        delay=0, note="handed back: its worker shut down before it finished",
                    ))
            self._settle()
            return bool(self.runs) and not self._settle_failed_too_long()
        self._wake.wait(WATCH_EVERY)
        return True

    def _settle_failed_too_long(self) -> bool:
        # Past the grace period the only thing left is writing outcomes back; if the database
        # stays unreachable for a lease, give up: the leases lapse and the jobs are re-claimed.
        assert self._drain_deadline is not None
        return clock.monotonic() >= self._drain_deadline + self.options.lease

    def _shutdown(self) -> None:
        self._leaving = True
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
        self.executors.close()

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
