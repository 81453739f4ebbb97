"""The watchdog: what stops a run before its code returns (a shutdown aside: worker/loop.py), and
the heartbeat it keeps going.

The database is authoritative for ownership: a run owns its job while its lease holds, and the
worker must stop acting on a job before the database's lease ends, not after
(docs/design.md, "The lease proof and the self-fence"). A run is stopped, its outcome recorded
in place of its code's (worker/runs.py: the first outcome wins), when

* **its timeout passed**: failed with a timeout error, its backoff drawn as for any error;
* **the heartbeat's answer left its lease out** (cancelled, or re-claimed after a lapse): its
  result is discarded (:meth:`Watchdog.on_renewed`); a row another transaction holds keeps its
  lease beside it and is not lost (worker/heartbeat.py);
* **no renewal landed for a whole lease period** (the heartbeat connection hangs): the job is
  handed back, this worker can no longer prove it owns it (the self-fence). A renewal counts
  from when its statement was SENT, so the worker's view of a lease never outlives the
  database's (worker/heartbeat.py);
* **it cannot prove its slot** (the slot's renewal was refused, or none landed for a whole
  SLOT_TTL): handed back with ``X_JOB_SLOT_LOST`` (worker/flow.py, django_xjobs/slots.py).

A run that cannot prove its lease before a body starts is stopped by the thread about to start
it (worker/threads.py, ``Executors.unproven``).

The checks run every WATCH_EVERY on a thread of their own (``xjobs-watch``), which never touches
the database: a loop stuck in a statement must not stop it. Whatever it stops wakes the loop,
which settles it. The same thread replaces a heartbeat thread stuck in a statement for a lease
period (``heartbeat_generation`` goes up, so the old thread's late answer is ignored), and stops
the worker, as a first SIGTERM would, once the supervisor that started it is gone
(``WorkerOptions.supervisor``): nobody would be left to stop it, and a restarted supervisor
would start a full set beside it.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections import Counter
from collections.abc import Callable, Sequence

from .. import clock, conf, faults
from ..conf import XJobsSettings
from ..context import log_extra, log_prefix
from ..engines import Engine
from ..exceptions import SLOT_LOST, SlotLost
from ..records import Renewal
from . import executor
from .executor import Discard, GiveBack, Retry
from .flow import Flow
from .heartbeat import Heartbeat
from .liveness import Liveness
from .options import WorkerOptions
from .runs import QUEUED, RUNNING, Run, Runs
from .threads import Executors

log = logging.getLogger("django_xjobs.worker")

# How often timeouts, the self-fence and the heartbeat thread are checked (seconds): the
# precision of a job timeout, and small next to any sane lease.
WATCH_EVERY = 0.05


class Watchdog:
    """Stops the runs of one worker that must stop, and keeps its heartbeat going; the worker
    as its heartbeat sees it (``heartbeat.Renewer``)."""

    def __init__(self, *, engine: Engine, worker_id: str, settings: XJobsSettings,
                 options: WorkerOptions, lease_ms: int, runs: Runs, flow: Flow,
                 executors: Executors, liveness: Liveness, stats: Counter[str],
                 wake: threading.Event, stop_threads: threading.Event,
                 stop_worker: Callable[[str], None], stopping: Callable[[], bool]) -> None:
        self.engine = engine
        self.worker_id = worker_id
        self.settings = settings
        self.options = options
        self.lease_ms = lease_ms
        self.runs = runs
        self.flow = flow
        self.executors = executors
        self.liveness = liveness
        self.stats = stats
        self.wake = wake  # the loop's wake event
        self._stop_threads = stop_threads  # the worker's threads stop
        self._stop_worker = stop_worker  # Worker.stop: a graceful stop
        self._stopping = stopping  # whether the worker is stopping already
        self._heartbeat: Heartbeat | None = None
        self.heartbeat_generation = 0
        self._horizon_unread = False  # warned once that HORIZON_AGE failed (floors.py)

    def start(self) -> None:
        """Start the heartbeat, then the watch thread."""
        self.start_heartbeat()
        threading.Thread(target=self._main, name="xjobs-watch", daemon=True).start()

    def start_heartbeat(self) -> None:
        self.heartbeat_generation += 1
        self._heartbeat = Heartbeat(
            worker=self, engine=self.engine, label=f"xjobs:{self.worker_id}:heartbeat",
            interval=self.options.heartbeat, lease_ms=self.lease_ms,
            slot_ttl_ms=self.flow.params.slot_ttl_ms, generation=self.heartbeat_generation,
            stop=self._stop_threads, seen_every=self.settings.worker_seen_interval,
        )
        self._heartbeat.start()

    # ------------------------------------------------------------------- the watch --
    def _main(self) -> None:
        """The checks every WATCH_EVERY, off the loop thread: the loop blocks in claims and
        settles, and a database that stops answering must not let a run outlive its lease or
        timeout."""
        while not self._stop_threads.wait(WATCH_EVERY):
            if faults.armed:
                faults.hit("worker:watch")
            try:
                if self.check():
                    self.wake.set()
            except Exception:  # pragma: no cover - a bug here must not end the watch
                log.exception("watch failed")
            # A supervised worker whose supervisor died (its parent is now another process)
            # stops as if SIGTERMed (see the module docstring).
            supervisor = self.options.supervisor
            if supervisor is not None and not self._stopping() and os.getppid() != supervisor:
                self._stop_worker("its supervisor is gone")

    def check(self) -> bool:
        """Stop what must stop; whether anything was stopped (the loop then settles it)."""
        now = clock.monotonic()
        lease = self.options.lease
        stopped = False
        for run in self.runs.snapshot():
            if run.phase not in (QUEUED, RUNNING):
                continue
            if run.deadline is not None and now >= run.deadline and run.phase == RUNNING:
                timeout = run.definition.timeout if run.definition else 0
                stopped = True
                self.stats["timeouts"] += 1
                self.executors.stop_run(run, "timeout", Retry(
                    error=f"TimeoutError: {run.job.name} ran longer than its timeout "
                          f"({timeout:g}s); the run was stopped and its result will be discarded",
                    delay=executor.backoff_for(run.definition, run.job.attempt, self.settings),
                    outcome="timeout", permanent=executor.timeout_is_final(run.definition),
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
                log.error("%s: no lease renewal for %.1fs (lease %gs); stopping the run and "
                          "handing the job back", _about(run), now - run.renewed_at, lease,
                          extra=_extra(run))
                self.executors.stop_run(run, "lease not renewed", GiveBack(
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
            self.start_heartbeat()
        return stopped

    # ------------------------------------------------------- the heartbeat's answers --
    def seen(self) -> None:
        """This worker is alive and serves its queues, and how its loop is doing (x_workers;
        the heartbeat calls it); and how far back the database's horizon is held, which
        decides whether its claims start from floors (floors.py)."""
        running = self.runs.running()
        claimed_age, loop_age = self.liveness.ages()
        self.engine.worker_seen(
            self.worker_id, socket.gethostname(), os.getpid(), self.options.queues,
            version=conf.VERSION, concurrency=self.options.concurrency, running=running,
            finished=self.liveness.finished, claimed_age=claimed_age, loop_age=loop_age)
        floors = self.flow.floors
        if floors is None:
            return
        try:
            age = self.engine.horizon_age()
        except Exception as exc:
            if self.engine.is_connection_error(exc):
                raise  # the lease renewal that follows says so
            if not self._horizon_unread:
                log.warning("the database's horizon could not be read (%s): claims scan from "
                            "the start while it cannot", exc)
            self._horizon_unread = True
            age = 0
        floors.horizon(age)

    def unsettled(self) -> list[Run]:
        # A run leaves the table as it settles (Runs.settled, Runs.all_settled).
        return self.runs.snapshot()

    def on_renewed(self, runs: Sequence[Run], renewal: Renewal, sent_at: float) -> None:
        """Heartbeat answer (per lease token): runs whose lease was renewed, or kept beside a
        row another transaction holds, move their clock; the others lost the job."""
        for run in runs:
            token = run.job.lease_token
            if token in renewal.renewed:
                run.renewed_at = sent_at
                if run.held_since is not None:
                    # Free again, whatever the run's phase: a later hold is timed, and told,
                    # on its own.
                    if run.held_told:
                        log.info("%s: its row is free again after %.1fs", _about(run),
                                 sent_at - run.held_since, extra=_extra(run))
                    run.held_since, run.held_told = None, False
                continue
            if token in renewal.kept:
                run.renewed_at = sent_at
                if run.held_since is None:
                    run.held_since = sent_at
                    self.stats["leases_kept"] += 1
                    if run.phase in (QUEUED, RUNNING):
                        run.held_told = True
                        log.info("%s: its row is held by another transaction; the run goes "
                                 "on, its lease kept beside the row until it is free",
                                 _about(run), extra=_extra(run))
                    else:
                        # Its code has returned: the holder is most likely this worker's own
                        # settle of it, under way. A hold that outlasts it, the settle logs
                        # (worker/settle.py, BUSY_NOTICE).
                        log.debug("%s: its row is held while its outcome is written",
                                  _about(run), extra=_extra(run))
                continue
            if run.phase in (QUEUED, RUNNING) and not run.parking:
                self.stats["lost_on_heartbeat"] += 1
                # Its one line comes with the settle, which reads the row to tell an
                # operator's cancel (INFO) from a lapsed lease (WARNING): worker/settle.py.
                log.debug("%s: lease not renewed (cancelled, or re-claimed after a lapse); "
                          "stopping the run", _about(run), extra=_extra(run))
                self.executors.stop_run(run, "lease lost", Discard("lease lost at heartbeat"))
        self.wake.set()

    def on_slots_renewed(self, runs: Sequence[Run], renewal: Renewal, sent_at: float) -> None:
        """Heartbeat answer for slots (per holder): a run whose slot was neither renewed nor
        held by another transaction this moment lost it (it lapsed, and may have been taken):
        stop it (X_JOB_SLOT_LOST)."""
        for run in self.flow.renewed(runs, renewal, sent_at):
            if run.phase in (QUEUED, RUNNING) and not run.parking:
                self._slot_lost(run, "the slot's renewal was refused: it lapsed (and may have "
                                     "been taken by another run)")
        self.wake.set()

    def _slot_lost(self, run: Run, why: str) -> None:
        if run.phase in (QUEUED, RUNNING):
            self.flow.log_lost(run, why)
            self.executors.stop_run(run, f"{SLOT_LOST}: {why}", self.flow.lost(why), SlotLost)


def _about(run: Run) -> str:
    return log_prefix(run.job.id, run.job.name, run.job.attempt)


def _extra(run: Run) -> dict[str, object]:
    return log_extra(run.job.id, run.job.name, run.job.attempt)
