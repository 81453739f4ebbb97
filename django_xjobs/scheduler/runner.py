"""THE ROUND: what the leading scheduler does at each occurrence, and the duty that runs it.

One round (``Scheduler.round``), one transaction for every task that is due:

1. **Self-check.** Stop if this process can no longer prove it leads
   (``Leadership.is_leader``: a monotonic deadline, no database call).
2. **Pick what is due.** A task whose next occurrence after its watermark (as this process last
   saw it) is still ahead costs nothing; a round with nothing due sends no statement.
3. **Lock** the due tasks' state rows and read their watermarks UNDER the lock
   (``scheduler_states_lock_if_leading``, fenced on leading, SKIP LOCKED). A round that
   overlaps with another leader's (a leader frozen past its lease, then resumed) serialises on
   these rows and sees what the other committed; rows another round holds are skipped, and
   those tasks retried shortly.
4. **Compute** each task's occurrences in ``(watermark, now]`` under its misfire policy
   (``cron.due``); a paused task fires nothing. Every job is built and validated before the
   first write; a task whose job cannot be built is left out (not marked: retried next round).
   **Overlap**: for the tasks with an overlap policy other than ``allow`` and something to
   fire, read their live runs (``cron_runs_live``; locked for buffer_one) and decide what each
   occurrence does: fire, wait behind the live run (buffer_one), cancel the live runs
   (cancel_previous) or nothing (skipped). Under the state-row lock of step 3, so two
   overlapping rounds decide one after the other (docs/scheduling.md, "Overlap").
5. **Self-check again, then cancel and enqueue**: cancel_previous's cancels first, then every
   occurrence in one statement per 1,000, each with the key ``cron:<task>:<occurrence ISO>``
   and ``enqueued_by = "cron:<task>"``; buffer_one's waiting run is then held (``blocked``)
   before anyone can see it, and the skips are counted on the state rows.
6. **Mark**: the watermarks move to the round's time with ``greatest`` (never back), fenced on
   still leading, as the last statement before the commit. Enqueue and mark commit together or
   not at all: a crash in between leaves neither, and the next leader fires those occurrences
   once. A fence that fails here rolls the round back; the process steps down.

What guards against double firing, and which guard covers which case:

* the watermark, read under the row lock and moved in the enqueue's transaction: one
  occurrence is enqueued by at most one committed round, even after its job has finished (when
  its key is free again);
* the idempotency key: two enqueues of one occurrence while the first job is live give one job
  (the live-key index), whatever path they took;
* the leader fence: a process that lost the leadership writes nothing, and stops the round.

One transaction per round rather than per task: the commit is the expensive part of a round
(one WAL flush), and the row locks are held for a few statements either way (bench W7).

Time: occurrences are computed on the database's clock, as the duty reads it now and then and
carries it forward on the monotonic clock (``clock.DatabaseClock``): a leader whose wall clock
is off fires at the database's seconds. A ``Scheduler`` built without one (the integration tests)
uses ``clock.now()``, injectable. The lease and the fences use the database clock too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import connections

from .. import api, clock, conf, faults, registry
from ..engines import Engine
from ..exceptions import InvalidJobInput, UnknownJob
from ..maintenance import pruner
from ..records import CronRun, EnqueueParams, EnqueueResult, LeaderFence
from ..worker import reachability
from ..worker.duties import Duty
from . import cron, leadership
from .schedule import Task, collect

log = logging.getLogger("django_xjobs.scheduler")

# How often the leader moves finished jobs into the history tables (docs/scheduling.md,
# "History tables").
ARCHIVE_TICK = 1.0

# A skipped task (its row held by another round) is looked at again this soon; a task whose
# job could not be built (logged as an error) this late.
RETRY_BUSY = 0.5
RETRY_FAILED = 5.0
# Rounds wake this long after an occurrence, so the occurrence is in the past when they run.
WAKE_AFTER = 0.005
ENQUEUE_BATCH = 1000  # jobs per enqueue statement, as api.enqueue_many


class LeadershipLost(Exception):
    """A fenced statement of the round matched nothing: another process leads now."""


@dataclass(slots=True)
class RoundReport:
    """What one round did, per task name (test signal and logs). ``fired`` is emptied when the
    round was rolled back: such a round fired nothing."""

    fired: dict[str, list[datetime]] = field(default_factory=dict)
    busy: list[str] = field(default_factory=list)
    paused: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    stopped: str = ""  # why the round ended early ("" = it did not)
    # Overlap (docs/scheduling.md, "Overlap"): occurrences not enqueued, occurrences enqueued
    # to wait behind the live run, and how many live runs were cancelled, per task.
    skipped: dict[str, list[datetime]] = field(default_factory=dict)
    held: dict[str, list[datetime]] = field(default_factory=dict)
    cancelled: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(len(v) for v in self.fired.values())


@dataclass(slots=True)
class _OverlapPlan:
    """What a round enqueues after the overlap policies (``Scheduler._overlap``): the
    occurrences to fire per task, the keys of those to hold behind their task's live run
    (buffer_one), and the live runs to cancel first, with the reason (cancel_previous)."""

    fire: dict[str, list[tuple[datetime, EnqueueParams]]]
    hold: set[str] = field(default_factory=set)
    release: list[str] = field(default_factory=list)  # buffered runs found alone: run them now
    cancel: dict[str, list[str]] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)


class Scheduler:
    """Runs rounds for ``tasks`` while ``leadership`` says this process leads."""

    def __init__(self, *, engine: Engine, leadership: leadership.Leadership,
                 tasks: Sequence[Task], settings: conf.XJobsSettings | None = None,
                 now: Callable[[], datetime] | None = None) -> None:
        self.engine = engine
        self._now = now or clock.now  # the time rounds compute occurrences at
        self.leadership = leadership
        self.tasks = list(tasks)
        self.settings = settings or conf.get()
        self.grace = timedelta(seconds=self.settings.cron_misfire_grace)
        # The next occurrence after each task's watermark as last seen; a task not in here is
        # looked at. Watermarks only move forward, so a stale entry errs towards looking.
        self._next_due: dict[str, datetime] = {}
        self._ensured_term = 0  # the leadership term whose rows were ensured
        self.rounds = 0

    # -------------------------------------------------------------------------- round --
    def round(self, now: datetime | None = None) -> RoundReport:
        now = now or self._now()
        report = RoundReport()
        self.rounds += 1
        if not self.leadership.is_leader():
            report.stopped = "not the leader"
            return report
        fence = self.leadership.fence()
        if self._ensured_term != self.leadership.terms:
            # A new task starts from now: its row is created with this round's time.
            self.engine.scheduler_states_ensure([t.name for t in self.tasks], now, fence)
            self._ensured_term = self.leadership.terms
            self._next_due.clear()  # another leader moved the watermarks meanwhile
        due = [t for t in self.tasks if self._next_due.get(t.name, now) <= now]
        if not due:
            return report
        try:
            self._round(due, now, fence, report)
        except LeadershipLost as exc:
            self.leadership.lost(str(exc))
            report.fired, report.stopped = {}, str(exc)
            report.skipped, report.held, report.cancelled = {}, {}, {}
            log.warning("scheduler round stopped and rolled back: %s", exc)
        return report

    def _round(self, due: list[Task], now: datetime, fence: LeaderFence,
               report: RoundReport) -> None:
        tasks = {t.name: t for t in due}
        with self.engine.atomic():
            locked = self.engine.scheduler_states_lock_if_leading(list(tasks), fence)
            if not locked.leading:
                raise LeadershipLost("the leader fence failed locking the due tasks")
            report.busy = [n for n in tasks if n not in locked.watermarks]
            built: dict[str, list[tuple[datetime, EnqueueParams]]] = {}
            for name, watermark in locked.watermarks.items():
                task = tasks[name]
                if name in locked.paused:
                    report.paused.append(name)
                    continue
                fire = self._occurrences(task, watermark, now)
                try:
                    definition = registry.get(task.job)
                    built[name] = [(occurrence, api.build_params(definition, task.input, {
                        **task.enqueue_options,
                        "idempotency_key": cron.occurrence_key(name, occurrence),
                        "enqueued_by": task.enqueued_by,
                    })) for occurrence in fire]
                except (InvalidJobInput, UnknownJob) as exc:
                    report.failed.append(name)
                    log.error("cron task %s cannot enqueue its job (%s); it is retried at the "
                              "next round", name, exc)
                    continue
            plan = self._overlap(tasks, built, report)
            jobs: list[EnqueueParams] = []
            for name, fired in plan.fire.items():
                if fired:
                    report.fired[name] = [occurrence for occurrence, _ in fired]
                    jobs += [params for _, params in fired]
            if not self.leadership.is_leader():
                raise LeadershipLost("the leadership deadline passed during the round")
            self.engine.cron_runs_release(plan.release)
            for name, ids in plan.cancel.items():
                # The runs' child jobs (a durable run's invoke/gather) first, then the runs: the
                # order of an operator's cancel (jobs_cancel_tree says why).
                # Skipping what another transaction holds (a child of a run held by a request
                # finishes on its own; the runs themselves are locked by this round).
                self.engine.jobs_cancel_tree(parents=ids, reason=plan.reasons[name], wait=False)
                report.cancelled[name] = self.engine.jobs_cancel_tree(
                    ids=ids, reason=plan.reasons[name], wait=False)
            results: list[EnqueueResult] = []
            for start in range(0, len(jobs), ENQUEUE_BATCH):
                results += self.engine.jobs_enqueue(jobs[start:start + ENQUEUE_BATCH])
            if plan.hold:
                self.engine.cron_runs_hold([str(r.id) for p, r in zip(jobs, results, strict=True)
                                            if r.created and p.idempotency_key in plan.hold])
            if report.skipped:
                skips = {n: (len(o), max(o)) for n, o in report.skipped.items()}
                noted = self.engine.scheduler_states_note_skips_if_leading(skips, fence)
                if len(noted) != len(skips):
                    raise LeadershipLost("the leader fence failed counting the skips")
            if faults.armed:
                faults.hit("scheduler:before-mark")
            names = [n for n in locked.watermarks
                     if n not in report.failed and n not in report.busy]
            marked = self.engine.scheduler_states_mark_if_leading(names, now, fence)
            if len(marked) != len(names):
                raise LeadershipLost("the leader fence failed marking the watermarks")
        for name, watermark in marked.items():
            self._next_due[name] = tasks[name].schedule.next_after(watermark)
        for name in report.failed:
            self._next_due[name] = now + timedelta(seconds=RETRY_FAILED)
        if report.busy:
            # Held by another round (or the row is gone: ensure it again on the next round).
            self._ensured_term = 0
            for name in report.busy:
                self._next_due[name] = now + timedelta(seconds=RETRY_BUSY)
        if report.fired:
            log.debug("scheduler round: enqueued %s", {n: len(f) for n, f in report.fired.items()})

    def _overlap(self, tasks: dict[str, Task],
                 built: dict[str, list[tuple[datetime, EnqueueParams]]],
                 report: RoundReport) -> _OverlapPlan:
        """What each occurrence does under its task's overlap policy (docs/scheduling.md,
        "Overlap"), given the task's live runs as this transaction reads them under the
        state-row lock. ``allow`` tasks, and tasks with nothing to fire, cost no statement."""
        plan = _OverlapPlan(fire=dict(built))
        policed = [n for n, fire in built.items() if fire and tasks[n].overlap != "allow"]
        if not policed:
            return plan
        live: dict[str, list[CronRun]] = {}
        # buffer_one and cancel_previous lock the live runs: a run finishing meanwhile then
        # finishes after this round committed (and its trigger sees the run buffered behind
        # it), and the runs to cancel are the round's until it commits (cron_runs_lock_live).
        for lock in (False, True):
            by = [tasks[n].enqueued_by for n in policed
                  if (tasks[n].overlap != "skip") is lock]
            for run in self.engine.cron_runs_live(by, lock=lock):
                live.setdefault(run.enqueued_by, []).append(run)
        for name in policed:
            task, fire = tasks[name], built[name]
            runs = live.get(task.enqueued_by, [])
            if any(r.held for r in runs):
                # Another transaction holds one of its runs (a request, an operator): the
                # round does not wait for it; the task fires at a later round, from the same
                # watermark, so nothing is lost (docs/design.md, "Lock order").
                report.busy.append(name)
                plan.fire[name] = []
                continue
            kept: list[tuple[datetime, EnqueueParams]] = []
            if task.overlap == "cancel_previous":
                # Each occurrence would cancel the one before it: only the newest is enqueued.
                kept = fire[-1:]
                if runs:
                    plan.cancel[name] = [r.id for r in runs]
                    plan.reasons[name] = (
                        f"cancelled by cron task {name} (overlap=cancel_previous): superseded by "
                        f"its occurrence at {fire[-1][0].isoformat()}"
                    )
            else:
                running = any(not r.buffered for r in runs)
                waiting = any(r.buffered for r in runs)
                if waiting and not running:
                    # The run it waited for finished and its release was missed: release it
                    # now, before anything newer, so the older occurrence runs first.
                    plan.release += [r.id for r in runs if r.buffered]
                    running, waiting = True, False
                for occurrence, params in fire:
                    if not running:
                        kept.append((occurrence, params))
                        running = True
                    elif task.overlap == "buffer_one" and not waiting:
                        kept.append((occurrence, params))
                        plan.hold.add(params.idempotency_key or "")
                        report.held.setdefault(name, []).append(occurrence)
                        waiting = True
            plan.fire[name] = kept
            enqueued = {k for k, _ in kept}
            skipped = [o for o, _ in fire if o not in enqueued]
            if skipped:
                report.skipped[name] = skipped
                if task.overlap == "cancel_previous":
                    why = f"superseded by {fire[-1][0].isoformat()}"
                else:
                    why = "run(s) still live: " + (", ".join(r.id for r in runs)
                                                   or "the one this round enqueued")
                log.info("cron task %s (overlap=%s): %d occurrence(s) up to %s not enqueued, "
                         "%s", name, task.overlap, len(skipped), skipped[-1].isoformat(), why)
        return plan

    def _occurrences(self, task: Task, watermark: datetime, now: datetime
                     ) -> tuple[datetime, ...]:
        due = cron.due(task.schedule, watermark=watermark, now=now, misfire=task.misfire,
                       grace=self.grace, max_catchup=self.settings.cron_max_catchup)
        if due.late or due.dropped:
            log.warning("cron task %s missed occurrences since %s (misfire=%s): %d late one(s) "
                        "fire now%s", task.name, watermark.isoformat(), task.misfire, due.late,
                        ", older ones are skipped" if due.dropped else "")
        return due.fire

    # --------------------------------------------------------------------- scheduling --
    def next_round_at(self, now: datetime) -> datetime | None:
        """When the next round is due: the earliest next occurrence, or retry, of any task."""
        return min((self._next_due.get(t.name, now) for t in self.tasks), default=None)


class SchedulerDuty(Duty):
    """The scheduler as a worker duty (worker/duties.py) or a process of its own
    (``manage.py xjobs_scheduler``): leader election, rounds, and maintenance on its own
    thread while this process leads."""

    name = "scheduler"

    def __init__(self, *, engine: Engine, worker_id: str, stop: threading.Event) -> None:
        super().__init__(engine=engine, worker_id=worker_id, stop=stop)
        self.settings = conf.get()
        self.leadership = leadership.build(
            engine=self.engine, holder=self.worker_id, mode=self.settings.leader,
            lease=self.settings.leader_lease, renew=self.settings.leader_renew,
        )
        # Cron occurrences follow the database's clock, never this machine's wall clock.
        self.db_clock = clock.DatabaseClock(self.engine.db_now)
        self.scheduler: Scheduler | None = None
        self.maintenance: Maintenance | None = None

    def _tasks(self) -> list[Task]:
        if self.settings.shards and self.engine.alias != self.settings.home_database:
            # The schedule is the project's, not a shard's: its occurrences fire once, on the
            # home shard; the other shards' leaders run their maintenance (docs/scaling.md,
            # "What does not cross shards").
            log.info("scheduler on shard %s: cron tasks fire on the home shard %s; this "
                     "leader runs the shard's maintenance", self.engine.alias,
                     self.settings.home_database)
            return []
        tasks, problems = collect()
        for problem in problems:  # the system checks stop a misconfigured worker first
            log.error("cron task %s is not scheduled: %s", problem.task, problem.message)
        return list(tasks.values())

    def run(self) -> None:
        self.scheduler = Scheduler(engine=self.engine, leadership=self.leadership,
                                   tasks=self._tasks(), settings=self.settings,
                                   now=self.db_clock.now)
        if self.settings.maintenance_interval is not None:
            self.maintenance = Maintenance(engine=self.engine, leadership=self.leadership,
                                           interval=self.settings.maintenance_interval,
                                           stop=self.stop,
                                           label=f"xjobs:{self.worker_id}:maintenance")
            self.maintenance.start()

        try:
            while not self.stop.is_set():
                try:
                    # A fresh connection (the first, or after a reset by this loop or by the
                    # leadership) gets its name, so operators and tests can find it.
                    if connections[self.engine.alias].connection is None:
                        self.engine.session_label(f"xjobs:{self.worker_id}:scheduler")
                    if self.leadership.tick():
                        self.db_clock.sync()  # a statement only once a minute
                        self.scheduler.round()
                except Exception as exc:
                    self._db_error(exc)
                self.started.set()
                self.stop.wait(self._wait())
        finally:
            try:
                self.leadership.resign()
            finally:
                self.leadership.close()
                if self.maintenance is not None:
                    self.maintenance.join(timeout=30)

    def _wait(self) -> float:
        wait = self.leadership.next_tick_in()
        if self.leadership.is_leader() and self.scheduler is not None:
            now = self.db_clock.now()
            at = self.scheduler.next_round_at(now)
            if at is not None:
                wait = min(wait, max(0.0, (at - now).total_seconds()) + WAKE_AFTER)
        return wait

    def _db_error(self, exc: BaseException) -> None:
        lost = reachability.connection_error(exc, "scheduler", self.engine)
        if lost == reachability.LOST:
            log.warning("scheduler: database connection lost (%s); retrying", exc)
        elif lost is None:
            log.exception("scheduler: round failed; retrying")
        self.stop.wait(min(self.settings.leader_renew, 1.0))


class Maintenance(threading.Thread):
    """Runs ``maintenance.pruner.run_once`` every ``interval`` while this process leads, on
    a thread (and connection) of its own, so a long purge never delays a cron round."""

    def __init__(self, *, engine: Engine, leadership: leadership.Leadership, interval: float,
                 stop: threading.Event, label: str = "xjobs:maintenance") -> None:
        super().__init__(name="xjobs-maintenance", daemon=True)
        self.engine = engine
        self.label = label
        self.leadership = leadership
        self.interval = interval
        self.stop = stop
        self.runs = 0
        # Where each finished state's archive pass starts, between two runs (pruner.archive).
        self.archive_floors: dict[str, datetime] = {}

    def run(self) -> None:


        try:
            # The first run waits one interval: a restarted fleet does not purge at start-up.
            # Between two runs, finished jobs move to the history tables every ARCHIVE_TICK,
            # so x_jobs holds about ARCHIVE_AFTER of them, not an interval's worth.
            # A process that does not lead, and a try that failed, wait a whole tick: once the
            # first interval was over, a wait until `due` was no wait at all, and a process
            # that did not lead spun a core on this loop (tests/unit/test_maintenance_loop.py).
            due = time.monotonic() + self.interval
            wait = min(ARCHIVE_TICK, self.interval)
            while not self.stop.wait(wait):
                wait = ARCHIVE_TICK
                if not self.leadership.is_leader():
                    continue
                full = time.monotonic() >= due
                try:
                    # A fresh connection (the first, or after a reset below) gets its name, as
                    # the scheduler's does: operators and tests find the archiving backend by it
                    # (tests/acceptance/test_history_fleet.py), and its statements run with JIT
                    # off like every other worker connection's (statement session_label).
                    if connections[self.engine.alias].connection is None:
                        self.engine.session_label(self.label)
                    if full:
                        due = time.monotonic() + self.interval
                        report = pruner.run_once(engine=self.engine,
                                                 keep_going=self.leadership.is_leader,
                                                 archive_floors=self.archive_floors)
                    else:
                        pruner.archive(engine=self.engine, keep_going=self.leadership.is_leader,
                                       floors=self.archive_floors)
                except Exception as exc:
                    # Could not connect: said once per outage, by reachability (not once a
                    # tick); a broken connection or another error is this thread's own line.
                    lost = reachability.connection_error(exc, "maintenance", self.engine)
                    if lost != reachability.UNREACHABLE:
                        log.warning("maintenance failed (%s); retrying", exc,
                                    exc_info=lost is None)
                    continue
                reachability.database.reached()
                if not full:
                    wait = min(ARCHIVE_TICK, max(due - time.monotonic(), 0.0))
                    continue
                self.runs += 1
                if report.total:
                    log.info("maintenance: %s", report.summary())
        finally:
            try:
                connections[self.engine.alias].close()
            except Exception:  # best effort: the connection may be broken already
                log.debug("maintenance: closing its connection failed", exc_info=True)
