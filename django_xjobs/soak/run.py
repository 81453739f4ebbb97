"""One soak from start to clean-up (docs/soak.md): set up, start the workers, produce under
chaos, drain, check, clean up. The command (management/commands/xjobs_soak.py) only parses its
arguments and prints what this returns."""

from __future__ import annotations

import random
import secrets
import shutil
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from django.db import connections

from .. import api
from ..console.reads.health import health
from ..models import Job, JobLease, OutboxEntry, RateUnit, Stat, StatDelta, WorkerRow
from ..records import LIVE_STATES
from ..worker.shutdown import ShutdownSignals
from . import chaos, invariants, tables, workload
from .invariants import Verdict
from .observe import Observer


@dataclass
class Options:
    duration: float = 60.0
    workers: int = 4
    concurrency: int = 2
    seed: int | None = None
    queue: str = "xjobs_soak"
    lease: float = 2.0
    per_second: float = 30.0
    chaos: bool = True
    hold_transaction: bool = False
    drain_timeout: float = 120.0
    keep: bool = False  # leave the rows for a look (no clean-up)
    log_dir: Path | None = None


@dataclass
class Report:
    seed: int
    soak: str
    verdicts: list[Verdict] = field(default_factory=list)
    faults: Counter[str] = field(default_factory=Counter)
    enqueued: int = 0
    timeline: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # producer errors, a drain that timed out
    notes: list[str] = field(default_factory=list)  # worth a look, not a failure
    log_dir: Path | None = None
    seconds: float = 0.0

    @property
    def held(self) -> bool:
        return not self.problems and all(v.held for v in self.verdicts)


class LiveQueue(Exception):
    """The soak's queue has live jobs that are not the soak's: another soak, or a real queue."""


def _live_jobs(queue: str) -> int:
    return Job.objects.using(tables.alias()).filter(queue=queue, state__in=LIVE_STATES).count()


class HeldTransaction(threading.Thread):
    """A REPEATABLE READ transaction held open for the whole run, as a long report or a
    forgotten shell would: VACUUM cannot remove what died after its snapshot. The soak checks
    that the health panel names it (docs/console.md, "The health panel")."""

    def __init__(self) -> None:
        super().__init__(name="xjobs-soak-held-transaction", daemon=True)
        self.ready = threading.Event()
        self.release = threading.Event()
        self.pid: int | None = None

    def run(self) -> None:
        conn = connections[tables.alias()]
        try:
            with conn.cursor() as cur:
                cur.execute("set application_name = 'xjobs_soak held transaction'")
                cur.execute("begin isolation level repeatable read")
                # The first statement takes the snapshot the transaction keeps (no table lock).
                cur.execute("select pg_backend_pid()")
                self.pid = cur.fetchone()[0]
            self.ready.set()
            self.release.wait()
            with conn.cursor() as cur:
                cur.execute("rollback")
        finally:
            self.ready.set()
            conn.close()


def _vacuum_verdict(pid: int | None) -> Verdict:
    rows = [r for r in health().holders if r.holder.pid == pid] if pid is not None else []
    if not rows:
        return Verdict("health names the long transaction", False,
                       f"the held transaction (pid {pid}) is not in the health panel")
    row = rows[0]
    return Verdict("health names the long transaction", True,
                   f"pid {pid}, {row.holder.state}, {row.holder.age_seconds:.0f}s: "
                   f"verdict {row.verdict}")


def run(options: Options, say: Callable[[str], None]) -> Report:
    """The soak; call it from the main thread. The first SIGTERM or SIGINT raises
    KeyboardInterrupt out of it once the workers are stopped and what it enqueued is cancelled
    and deleted; a second one exits at once (its workers then stop by themselves).

    Python runs a signal's handler in the main thread only, and a signal the kernel delivers to
    another thread (a producer waiting on its socket, say) does not cut the main thread's sleep
    short: a Ctrl-C could wait for the whole run. So the signals are read off a socket by a
    thread of their own (worker/shutdown.py), and the main thread waits on an event instead of
    sleeping."""
    interrupted = threading.Event()
    signals = ShutdownSignals(lambda _name: interrupted.set())
    signals.install()
    try:
        return _run(options, say, interrupted)
    finally:
        signals.uninstall()


def _pause(interrupted: threading.Event, seconds: float) -> None:
    """Sleep ``seconds``, or raise KeyboardInterrupt as soon as the soak is interrupted."""
    if interrupted.wait(seconds):
        raise KeyboardInterrupt


def _run(options: Options, say: Callable[[str], None], interrupted: threading.Event) -> Report:
    seed = options.seed if options.seed is not None else random.randrange(1, 2**31)
    soak = f"soak{seed}x{secrets.token_hex(2)}"
    tables.name_session(soak, "main")
    report = Report(seed=seed, soak=soak)
    if _live_jobs(options.queue):
        raise LiveQueue(
            f"queue {options.queue!r} has live jobs: another soak is running on it, or it is a "
            f"real queue. Pick another with --queue (the soak must have its queue to itself)."
        )
    tables.create()
    log_dir = options.log_dir or Path(tempfile.mkdtemp(prefix="xjobs-soak-"))
    report.log_dir = log_dir
    transitions_before = invariants.terminal_transitions(options.queue)
    heartbeat = options.lease / 4
    timings = chaos.Timings(lease=options.lease, heartbeat=heartbeat, poll=0.2,
                            grace=max(1.0, options.lease), concurrency=options.concurrency)
    pool = chaos.Pool(soak=soak, queue=options.queue, size=options.workers, timings=timings,
                      log_dir=log_dir)
    started = time.monotonic()
    held = HeldTransaction() if options.hold_transaction else None
    if held is not None:
        held.start()
        held.ready.wait(30)
    observing, supervising = threading.Event(), threading.Event()
    observer = Observer(soak, options.queue, options.lease, observing,
                        excused=lambda worker_id: pool.stopped_lately(worker_id,
                                                                      3 * options.lease))
    work = workload.Workload(soak=soak, queue=options.queue, per_second=options.per_second,
                             on_commit=workload.outbox_usable())
    supervisor = chaos.Chaos(pool, seed,
                             chaos_until=started + (0.75 * options.duration
                                                    if options.chaos else 0.0),
                             stop=supervising)
    try:
        pool.start()
        observer.start()
        supervisor.start()
        producers = workload.start(work, seed)
        say(f"seed {seed}: {options.workers} workers x {options.concurrency} threads, lease "
            f"{options.lease:g}s, {options.duration:g}s on queue {options.queue!r} "
            f"(logs in {log_dir})")
        _pause(interrupted, 0.7 * options.duration)
        work.stop.set()
        for p in producers:
            p.join()
        say(f"{work.enqueued} enqueue calls; draining")
        remaining = max(0.0, options.duration - (time.monotonic() - started))
        _pause(interrupted, remaining)
        drained = _drain(options.queue, soak, options.drain_timeout, interrupted)
        if not drained:
            report.problems.append(f"not drained {options.drain_timeout:g}s after the run: "
                                   f"{_live_jobs(options.queue)} jobs still live")
        if held is not None:
            report.verdicts.append(_vacuum_verdict(held.pid))
    except BaseException:
        # Interrupted (Ctrl-C, an error of its own): stop everything, and unless --keep, cancel
        # and delete what it enqueued, so the next soak on this queue does not refuse to start.
        work.stop.set()
        _stop(supervisor, supervising, pool, timings, observer, observing, held)
        if not options.keep:
            abandon(soak, options.queue)
        raise
    stop_complaints = _stop(supervisor, supervising, pool, timings, observer, observing, held)

    report.seconds = time.monotonic() - started
    report.enqueued = work.enqueued
    report.problems += work.errors
    if work.connections_lost:
        report.notes.append(f"the producers lost their connection {work.connections_lost} "
                            f"time(s) to the chaos (behind a pooler, a terminated server "
                            f"session may be one a producer was using); each lost enqueue "
                            f"committed or rolled back whole, with its ledger row")
    # Seen once, under a loaded machine, on a worker's relay LISTEN session: the session, which
    # runs nothing but LISTEN in autocommit, in a transaction for half a minute. Not explained
    # yet, so reported rather than failed (docs/soak.md).
    report.notes += observer.seen.listen_transactions()
    if supervisor.error is not None:
        report.problems.append(f"chaos: {supervisor.error!r}")
    report.faults = pool.done
    report.timeline = pool.timeline
    evidence = invariants.Evidence.gather(soak, options.queue, transitions_before,
                                          observer.seen)
    report.verdicts = invariants.check_all(evidence, stop_complaints) + report.verdicts
    if not options.keep:
        clean_up(soak, options.queue, evidence.rows)
    if report.held and options.log_dir is None:  # a temp dir of its own: kept only to look into
        shutil.rmtree(log_dir, ignore_errors=True)
        report.log_dir = None
    return report


def _stop(supervisor: chaos.Chaos, supervising: threading.Event, pool: chaos.Pool,
          timings: chaos.Timings, observer: Observer, observing: threading.Event,
          held: HeldTransaction | None) -> list[str]:
    """Stop the faults, then the workers (SIGTERM: they must stop cleanly), then the sampling
    and the held transaction; return what went wrong stopping the workers."""
    supervising.set()
    if supervisor.is_alive():
        supervisor.join()
    complaints = pool.stop_all(timeout=timings.grace + 20)
    observing.set()
    if observer.is_alive():
        observer.join()
    if held is not None:
        held.release.set()
        if held.is_alive():
            held.join()
    return complaints


def abandon(soak: str, queue: str) -> None:
    """After an interrupted soak: cancel what it left live, then clean up."""
    alias = tables.alias()
    live = Job.objects.using(alias).filter(queue=queue, input__soak=soak, state__in=LIVE_STATES)
    for job_id in live.values_list("id", flat=True):
        api.cancel(job_id, reason="xjobs_soak interrupted")
    rows = {str(i): None for i in Job.objects.using(alias).filter(queue=queue, input__soak=soak)
            .values_list("id", flat=True)}
    clean_up(soak, queue, rows)


def _drain(queue: str, soak: str, timeout: float, interrupted: threading.Event) -> bool:
    """Until nothing of the soak is live or waiting in the outbox."""
    deadline = time.monotonic() + timeout
    alias = tables.alias()
    while time.monotonic() < deadline:
        pending = OutboxEntry.objects.using(alias).filter(
            queue=queue, published_at__isnull=True, input__soak=soak).exists()
        if not pending and not _live_jobs(queue):
            return True
        _pause(interrupted, 0.5)
    return False


def clean_up(soak: str, queue: str, job_ids: Iterable[str]) -> None:
    """Delete what the soak wrote: its jobs (``job_ids``, all finished) with their steps, its
    outbox rows, its workers' rows, its slots and rate grants, its queue's counters, its ledger
    and effects."""
    alias = tables.alias()
    ids = list(job_ids)
    for i in range(0, len(ids), 1000):
        api.delete_finished(ids[i:i + 1000])
    OutboxEntry.objects.using(alias).filter(queue=queue, input__soak=soak).delete()
    WorkerRow.objects.using(alias).filter(id__startswith=f"{soak}-").delete()
    JobLease.objects.using(alias).filter(lease_key__startswith=f"xjobs_soak:{soak}:").delete()
    RateUnit.objects.using(alias).filter(key__startswith=f"xjobs_soak:{soak}:").delete()
    if not _live_jobs(queue):
        StatDelta.objects.using(alias).filter(queue=queue).delete()
        Stat.objects.using(alias).filter(queue=queue).delete()
    tables.drop_unless_used(soak)
