"""The threads that run a worker's jobs: ``concurrency`` executor threads (``xjobs-exec-N``) for
sync jobs, one event loop thread (``xjobs-async``, started with the first async job) for async
ones, and how a run is stopped wherever it runs.

* The loop puts a claimed sync run on the work queue (worker/loop.py, dispatch). An executor
  thread takes it and starts it only if it is still queued (a run stopped meanwhile is skipped)
  and can still prove its lease: a prefetched run whose lease may have lapsed while it waited
  (the process was paused) is handed back unstarted (:meth:`Executors.unproven`;
  docs/guarantees.md). The run's code proves its lease again before its body and each step's
  (``Run.prove_lease``, worker/runs.py).
* The outcome goes to the run table, once (``Runs.finish``); the thread wakes the loop only when
  that is worth a round trip (see ``_main``).
* A thread cannot be killed. A sync run stopped while it runs (``stop_run``: the watchdog, the
  heartbeat's answer, a shutdown) is marked abandoned, and a replacement thread starts at once so
  capacity is not lost; the abandoned thread exits when the code returns, its outcome ignored.
  An async run's task is cancelled.
* An executor thread idle for IDLE_RECHECK cleans up its Django connections before its next job.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import queue
import threading
from collections import Counter
from collections.abc import Iterable

from django.conf import settings as django_settings
from django.db import reset_queries

from .. import clock, faults
from ..conf import XJobsSettings
from ..context import log_extra, log_prefix
from ..engines import Engine
from ..exceptions import JobCancelled
from . import executor
from .capacity import Capacity
from .executor import GiveBack, Outcome
from .options import WorkerOptions
from .runs import QUEUED, RUNNING, Run, Runs

log = logging.getLogger("django_xjobs.worker")

# An executor thread idle for this long cleans up its Django connections before its next job
# too (they may have aged past CONN_MAX_AGE or been closed by the server meanwhile).
IDLE_RECHECK = 1.0


class Executors:
    """The executor threads and the event loop of one worker (see the module docstring)."""

    def __init__(self, *, engine: Engine, worker_id: str, settings: XJobsSettings,
                 options: WorkerOptions, runs: Runs, capacity: Capacity,
                 wake: threading.Event, stats: Counter[str]) -> None:
        self.engine = engine
        self.worker_id = worker_id
        self.settings = settings
        self.lease = options.lease
        self.runs = runs
        self.capacity = capacity
        self.wake = wake  # the loop's wake event
        self.stats = stats
        self._work: queue.SimpleQueue[Run | None] = queue.SimpleQueue()
        self.threads: list[threading.Thread] = []  # every executor thread started, abandoned too
        self._serial = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        # The context the worker was made in: its threads run in copies of it, so that a job's
        # statements go to the jobs alias the worker serves (a worker started inside
        # conf.using_database, as testing.drain can be; docs/scaling.md).
        self._context = contextvars.copy_context()

    def start(self, count: int) -> None:
        for _ in range(count):
            self.spawn()

    def spawn(self) -> None:
        self._serial += 1
        t = threading.Thread(
            target=self._context.copy().run, args=(self._main,),
            name=f"xjobs-exec-{self._serial}", daemon=True
        )
        self.threads.append(t)
        t.start()

    def submit(self, runs: Iterable[Run]) -> None:
        """Queued sync runs, already counted in ``Runs.queued``, go to the executor threads."""
        for run in runs:
            self._work.put(run)

    def submit_async(self, run: Run) -> None:
        """An async run starts on the event loop."""
        assert run.definition is not None
        run.phase = RUNNING
        if run.definition.timeout is not None:
            run.deadline = clock.monotonic() + run.definition.timeout
        run.future = asyncio.run_coroutine_threadsafe(self._run_async(run), self._event_loop())

    def close(self) -> None:
        """Every executor thread exits after its current job; the event loop stops."""
        for _ in self.threads:
            self._work.put(None)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            self._loop_thread = threading.Thread(
                target=self._context.copy().run, args=(loop.run_forever,),
                name="xjobs-async", daemon=True
            )
            self._loop_thread.start()
            self._loop = loop
        return self._loop

    # ------------------------------------------------------------------ the threads --
    def _main(self) -> None:
        # Named when it connects: the job code's own statements, and its steps, run on it.
        self.engine.name_session(f"xjobs:{self.worker_id}:run")
        runs, capacity, wake, settings = self.runs, self.capacity, self.wake, self.settings
        last_job_end = 0.0
        while True:
            held_slot = False
            run = self._work.get()
            if run is None:
                return
            unproven = None
            with runs.lock:
                runs.queued -= 1
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
                self.unproven(unproven, "the prefetched job")
            if run is not None:
                faults.hit("worker:job-start")
                if django_settings.DEBUG:
                    reset_queries()
                assert run.definition is not None
                try:
                    outcome = executor.execute(
                        run.definition, run.job, run.ctx, settings,
                        fresh_connections=started - last_job_end >= IDLE_RECHECK,
                    )
                except BaseException as exc:  # never lose the thread, or the run with it
                    log.exception("%s: no outcome", _about(run), extra=_extra(run))
                    outcome = executor.internal_error(exc, run.definition, run.job, settings)
                ended = last_job_end = clock.monotonic()
                capacity.ran(ended - started)
                held_slot = run.slot is not None
                runs.finish(run, outcome, from_phase=RUNNING)
                if run.abandoned:
                    return  # a replacement took this thread's place while the code ran on
            else:
                ended = clock.monotonic()
            # Wake the loop only when it has something worth a round trip: runs to claim for
            # (the queue ran low), a full ack batch, an outcome that waited ack_interval, or a
            # run that holds a slot (its release lets the key's next job start, fleet-wide).
            # Not again while a wake-up is pending: the loop clears the event before it reads
            # what the executors left (Worker._iterate), so this run's outcome, recorded above,
            # is seen by the round that event starts; setting it again costs a lock per job.
            if wake.is_set():
                continue
            finished = len(runs.finished)
            if (held_slot or runs.queued <= capacity.low_water
                    or finished >= settings.ack_batch
                    or (finished and ended - runs.finished_since >= settings.ack_interval)):
                wake.set()

    async def _run_async(self, run: Run) -> None:
        assert run.definition is not None
        try:
            outcome = await executor.execute_async(run.definition, run.job, run.ctx,
                                                   self.settings)
        except BaseException as exc:  # never leave the run without an outcome
            log.exception("%s: no outcome", _about(run), extra=_extra(run))
            outcome = executor.internal_error(exc, run.definition, run.job, self.settings)
        self.runs.finish(run, outcome, from_phase=RUNNING)
        self.wake.set()

    # -------------------------------------------------------------------- stopping --
    def unproven(self, run: Run, what: str) -> None:
        """A run could not prove its lease before starting a body (``Run.prove_lease``, or a
        prefetched run about to start): stop it and hand the job back, its attempt given back
        (a run that did lose the job is fenced off: the hand-back then changes nothing)."""
        age = clock.monotonic() - run.renewed_at
        lease = self.lease
        self.stats["lease_unproven"] += 1
        log.warning("%s: lease not proven, last renewal %.1fs ago (lease %gs): not starting "
                    "%s; handing the job back", _about(run), age, lease, what, extra=_extra(run))
        self.stop_run(run, "lease not proven", GiveBack(
            delay=0, note=f"handed back: its worker could not prove its lease before starting "
                          f"{what} (last renewal {age:.1f}s ago, lease {lease:g}s)",
        ))
        run.ctx.stop("lease not proven")

    def stop_run(self, run: Run, reason: str, outcome: Outcome,
                 error: type[JobCancelled] = JobCancelled) -> None:
        """Stop a queued or running run with ``outcome`` (settled by the next flush).

        A sync run's thread cannot be killed: it is marked abandoned (it exits once the code
        returns) and a replacement thread starts at once, so capacity is not lost.
        """
        if not self.runs.stop(run, outcome):
            return
        run.ctx.stop(reason, error)
        if run.future is not None:
            run.future.cancel()  # cancels the task on the event loop
        elif run.abandoned:
            self.stats["abandoned_threads"] += 1
            self.spawn()


def _about(run: Run) -> str:
    return log_prefix(run.job.id, run.job.name, run.job.attempt)


def _extra(run: Run) -> dict[str, object]:
    return log_extra(run.job.id, run.job.name, run.job.attempt)
