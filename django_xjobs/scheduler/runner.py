"""THE ROUND: what the leading scheduler does at each occurrence, and the duty that runs it.

One round, for each configured task (``Scheduler.round``):

1. **Self-check.** Stop the round if this process can no longer prove it leads
   (``Leadership.is_leader``: a monotonic deadline, no database call).
2. **Skip what is not due.** A task whose next occurrence after the watermark this process last
   saw is still in the future costs no statement (watermarks only move forward, so a stale one
   errs towards looking).
3. **Open the task's transaction and lock its state row** (``scheduler_state_lock_if_leading``,
   fenced on leading, SKIP LOCKED). The watermark is read UNDER the lock: a round that
   overlapped with another leader's (a leader frozen past its lease, then resumed) serialises
   on this row and sees what the other committed. A row another round holds is skipped, and
   the task retried shortly.
4. **Compute** the occurrences in ``(watermark, now]`` under the task's misfire policy
   (``cron.due``); a paused task fires nothing.
5. **Enqueue** each occurrence with the key ``cron:<task>:<occurrence ISO>`` and
   ``enqueued_by = "cron:<task>"``, in the same transaction.
6. **Mark**: the watermark moves to the round's time with ``greatest`` (never back), fenced on
   still leading, as the last statement before the commit. Enqueue and mark commit together or
   not at all: a crash in between leaves neither, and the next leader fires those occurrences
   once. A fence that fails here rolls the whole task back and ends the round.

What guards against double firing, and which guard covers which case:

* the watermark, read under the row lock and moved in the enqueue's transaction: one
  occurrence is enqueued by at most one committed round, even after its job has finished (when
  its key is free again);
* the idempotency key: two enqueues of one occurrence while the first job is live give one job
  (the live-key index), whatever path they took;
* the leader fence: a process that lost the leadership writes nothing, and stops the round.

Time: occurrences are computed on the wall clock (``clock.now()``, injectable in tests); the
lease and the fences use the database clock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from .. import api, clock, conf, faults
from ..engines import Engine
from ..records import LeaderFence
from ..worker.duties import Duty
from . import cron, leadership
from .tasks import Task

log = logging.getLogger("django_xjobs.scheduler")

# A skipped task (its row held by another round) is looked at again this soon.
RETRY_BUSY = 0.5
# Rounds wake this long after an occurrence, so the occurrence is in the past when they run.
WAKE_AFTER = 0.005


class LeadershipLost(Exception):
    """A fenced statement of the round matched nothing: another process leads now."""


@dataclass(slots=True)
class RoundReport:
    """What one round did, per task name (test signal and logs)."""

    fired: dict[str, list[datetime]] = field(default_factory=dict)
    busy: list[str] = field(default_factory=list)
    paused: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    stopped: str = ""  # why the round ended early ("" = it did not)

    @property
    def total(self) -> int:
        return sum(len(v) for v in self.fired.values())


class Scheduler:
    """Runs rounds for ``tasks`` while ``leadership`` says this process leads."""

    def __init__(self, *, engine: Engine, leadership: leadership.Leadership,
                 tasks: Sequence[Task], settings: conf.XJobsSettings | None = None) -> None:
        self.engine = engine
        self.leadership = leadership
        self.tasks = list(tasks)
        self.settings = settings or conf.get()
        self.grace = timedelta(seconds=self.settings.cron_misfire_grace)
        self._watermarks: dict[str, datetime] = {}
        self._ensured_term = 0  # the leadership term whose rows were ensured
        self._retry_at: datetime | None = None
        self.rounds = 0

    # -------------------------------------------------------------------------- round --
    def round(self, now: datetime | None = None) -> RoundReport:
        now = now or clock.now()
        report = RoundReport()
        self.rounds += 1
        self._retry_at = None
        if not self.leadership.is_leader():
            report.stopped = "not the leader"
            return report
        fence = self.leadership.fence()
        if self._ensured_term != self.leadership.terms:
            # A new task starts from now: its row is created with this round's time.
            self.engine.scheduler_states_ensure([t.name for t in self.tasks], now, fence)
            self._ensured_term = self.leadership.terms
            self._watermarks.clear()  # another leader moved them meanwhile
        for task in self.tasks:
            if not self.leadership.is_leader():
                report.stopped = "leadership deadline passed during the round"
                break
            known = self._watermarks.get(task.name)
            if known is not None and task.schedule.next_after(known) > now:
                continue
            try:
                self._task_round(task, now, fence, report)
            except LeadershipLost as exc:
                self.leadership.lost(str(exc))
                report.stopped = str(exc)
                break
            except Exception as exc:
                if self.engine.is_connection_error(exc):
                    raise  # the duty resets the connection; the rest of the round would fail
                report.failed.append(task.name)
                log.exception("cron task %s: the round failed (%s); it is retried at the next "
                              "occurrence", task.name, exc)
        if report.stopped:
            log.warning("scheduler round stopped: %s", report.stopped)
        return report

    def _task_round(self, task: Task, now: datetime, fence: LeaderFence,
                    report: RoundReport) -> None:
        with self.engine.atomic():
            lock = self.engine.scheduler_state_lock_if_leading(task.name, fence)
            if not lock.leading:
                raise LeadershipLost(f"the leader fence failed locking task {task.name}")
            if lock.watermark is None:
                # Another round holds the row (or an operator deleted it: ensure it again).
                report.busy.append(task.name)
                self._ensured_term = 0
                self._retry_at = now + timedelta(seconds=RETRY_BUSY)
                return
            if lock.paused:
                fire: tuple[datetime, ...] = ()
                report.paused.append(task.name)
            else:
                due = cron.due(task.schedule, watermark=lock.watermark, now=now,
                               misfire=task.misfire, grace=self.grace,
                               max_catchup=self.settings.cron_max_catchup)
                fire = due.fire
                if due.late or due.dropped:
                    log.warning(
                        "cron task %s missed occurrences since %s (misfire=%s): %d late one(s) "
                        "fire now%s", task.name, lock.watermark.isoformat(), task.misfire,
                        due.late, ", older ones are skipped" if due.dropped else "")
            if fire:
                api.enqueue_many([
                    (task.job, task.input, {
                        "idempotency_key": cron.occurrence_key(task.name, occurrence),
                        "enqueued_by": task.enqueued_by,
                    })
                    for occurrence in fire
                ])
            if faults.armed:
                faults.hit("scheduler:before-mark")
            watermark = self.engine.scheduler_state_mark_if_leading(task.name, now, fence)
            if watermark is None:
                raise LeadershipLost(f"the leader fence failed marking task {task.name}")
        self._watermarks[task.name] = watermark
        if fire:
            report.fired[task.name] = list(fire)
            log.debug("cron task %s: enqueued %d occurrence(s), last %s", task.name, len(fire),
                      fire[-1].isoformat())

    # --------------------------------------------------------------------- scheduling --
    def next_round_at(self, now: datetime) -> datetime | None:
        """When the next occurrence of any task is (or a busy task's retry)."""
        candidates = [self._retry_at] if self._retry_at is not None else []
        candidates += [t.schedule.next_after(now) for t in self.tasks]
        return min(candidates) if candidates else None


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
        self.scheduler: Scheduler | None = None
        self.maintenance: Maintenance | None = None
        self.started = threading.Event()  # test signal: the first tick ran

    def _tasks(self) -> list[Task]:
        from .tasks import collect

        tasks, problems = collect()
        for problem in problems:  # the system checks stop a misconfigured worker first
            log.error("cron task %s is not scheduled: %s", problem.task, problem.message)
        return list(tasks.values())

    def run(self) -> None:
        self.scheduler = Scheduler(engine=self.engine, leadership=self.leadership,
                                   tasks=self._tasks(), settings=self.settings)
        if self.settings.maintenance_interval is not None:
            self.maintenance = Maintenance(engine=self.engine, leadership=self.leadership,
                                           interval=self.settings.maintenance_interval,
                                           stop=self.stop)
            self.maintenance.start()
        labelled = False
        try:
            while not self.stop.is_set():
                try:
                    if not labelled:
                        self.engine.session_label(f"xjobs:{self.worker_id}:scheduler")
                        labelled = True
                    if self.leadership.tick():
                        self.scheduler.round()
                except Exception as exc:
                    labelled = False
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
            now = clock.now()
            at = self.scheduler.next_round_at(now)
            if at is not None:
                wait = min(wait, max(0.0, (at - now).total_seconds()) + WAKE_AFTER)
        return wait

    def _db_error(self, exc: BaseException) -> None:
        if self.engine.is_connection_error(exc):
            self.engine.reset_connection()
            log.warning("scheduler: database connection lost (%s); retrying", exc)
        else:
            log.exception("scheduler: round failed; retrying")
        self.stop.wait(min(self.settings.leader_renew, 1.0))


class Maintenance(threading.Thread):
    """Runs ``maintenance.pruner.run_once`` every ``interval`` while this process leads, on
    a thread (and connection) of its own, so a long purge never delays a cron round."""

    def __init__(self, *, engine: Engine, leadership: leadership.Leadership, interval: float,
                 stop: threading.Event) -> None:
        super().__init__(name="xjobs-maintenance", daemon=True)
        self.engine = engine
        self.leadership = leadership
        self.interval = interval
        self.stop = stop
        self.runs = 0

    def run(self) -> None:
        from django.db import connections

        from ..maintenance import pruner

        try:
            # The first run waits one interval: a restarted fleet does not purge at start-up.
            while not self.stop.wait(self.interval):
                if not self.leadership.is_leader():
                    continue
                try:
                    report = pruner.run_once(engine=self.engine,
                                             keep_going=self.leadership.is_leader)
                except Exception as exc:
                    if self.engine.is_connection_error(exc):
                        self.engine.reset_connection()
                    log.warning("maintenance failed (%s); retrying at the next interval", exc)
                    continue
                self.runs += 1
                if report.total:
                    log.info("maintenance: %s", report.summary())
        finally:
            try:
                connections[self.engine.alias].close()
            except Exception:  # best effort: the connection may be broken already
                log.debug("maintenance: closing its connection failed", exc_info=True)
