"""The scheduler in real processes: two leaders-to-be on a seconds cron (and an interval beside
it), a leader frozen past its lease, a leader SIGKILLed mid-round, the dedicated
``xjobs_scheduler`` and the advisory mode.

The fired jobs are RUN by the workers as they come, so they finish and free their keys: a
second enqueue of an occurrence would make a second row, not be absorbed by the live-key index.
"Exactly once" is then checked against the task's own watermark: every second in
``(watermark at the start, watermark at the end]`` has exactly one job.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connections
from django.db.models.functions import Now

from django_xjobs.engines import get_engine
from django_xjobs.models import Job, SchedulerLeader, SchedulerState
from django_xjobs.scheduler import cron, interval
from tests.conftest import wait_until
from tests.leases import lapse_leader, lapse_worker

from .conftest import FAST, LEADER, SETTLE, STARTUP, backends, wait_exit, wait_log, wait_started

pytestmark = pytest.mark.acceptance

TICK = {"tick": {"job": "testapp.noop", "cron": "* * * * * *", "misfire": "all"}}
# A long leader lease, lapsed by the test when it freezes or kills the leader; misfire "all" so
# that the seconds a takeover takes are fired late rather than coalesced: every occurrence must
# fire.
SCHEDULED = {**FAST, **LEADER, "SCHEDULE": TICK, "MAINTENANCE_INTERVAL": None}
EVERY_SECOND = cron.parse("* * * * * *")
# An interval beside the cron task (docs/scheduling.md, "Intervals"): its grid, counted from
# the epoch, is the same for both leaders.
TOCK = {"tock": {"job": "testapp.noop", "every": 2, "misfire": "all"}}
EVERY_TWO_SECONDS = interval.parse(2)


def start_row(task: str = "tick") -> datetime:
    """The task 'ran before': its watermark is now, so what fires from here is exactly the
    seconds after it."""
    at = datetime.now(UTC)
    SchedulerState.objects.create(task_name=task, last_fired_at=at)
    return at


def watermark(task: str = "tick") -> datetime:
    return SchedulerState.objects.get(task_name=task).last_fired_at


def fired(task: str = "tick") -> list[str]:
    return list(Job.objects.filter(enqueued_by=f"cron:{task}")
                .values_list("idempotency_key", flat=True))


def wait_fired(count: int, task: str = "tick") -> None:
    wait_until(lambda: len(fired(task)) >= count, timeout=SETTLE, interval=0.1,
               message=f"{count} occurrences of {task} enqueued")


def kill_the_leader_inside_a_round(start_worker, settings: dict, count: Callable[[], int], *,
                                   more: int) -> None:
    """A leads and lingers in each round's transaction after the mark, before the commit; it is
    SIGKILLed there, after it enqueued and moved the watermark and before either is committed.
    Its leader lease and its jobs' leases lapse (tests/leases.py: ``settings`` has a long leader
    lease); B takes over, fires ``more`` occurrences (``count()`` counts them all) and stops
    cleanly."""
    a = start_worker("a", settings=settings,
                     faults="after:scheduler_states_mark_if_leading=sleep:0.3")
    wait_until(lambda: lease_holder() == a.id, timeout=SETTLE, message="A to lead")
    b = start_worker("b", settings=settings)
    wait_until(lambda: count() >= 3, timeout=SETTLE, interval=0.1, message="3 occurrences")

    label = f"xjobs:{a.id}:scheduler"
    wait_until(lambda: any(state == "idle in transaction" for _, state in backends(label)),
               timeout=SETTLE, interval=0.005, message="A inside a round's transaction")
    os.kill(a.pid, signal.SIGKILL)
    a.wait(timeout=30)
    lapse_leader(a)
    lapse_worker(a, none_ok=True)  # a run of the task it had claimed, if any
    before = count()
    wait_until(lambda: lease_holder() == b.id, timeout=SETTLE, interval=0.05,
               message="B to take over after A's lease")
    wait_until(lambda: count() >= before + more, timeout=SETTLE, interval=0.1,
               message=f"{more} more occurrences")
    b.signal(signal.SIGTERM)
    assert wait_exit(b) == 0


def lease_holder() -> str | None:
    return (SchedulerLeader.objects.filter(lock_key="scheduler", expires_at__gt=Now())
            .values_list("holder", flat=True).first())


def advisory_holder() -> str | None:
    record = get_engine().leader_advisory_holder("scheduler")
    return record.holder.split(":")[1] if record else None


class Sampler(threading.Thread):
    """Reads the watermark every few milliseconds, on a connection of its own."""

    def __init__(self, task: str = "tick") -> None:
        super().__init__(daemon=True)
        self.task = task
        self.values: list[datetime] = []
        self.halt = threading.Event()

    def run(self) -> None:
        try:
            while not self.halt.wait(0.02):
                self.values.append(watermark(self.task))
        finally:
            connections.close_all()

    def stop(self) -> list[datetime]:
        self.halt.set()
        self.join(10)
        return self.values


def assert_exactly_once(start: datetime, task: str = "tick",
                        schedule: cron.Occurrences = EVERY_SECOND) -> list[str]:
    keys = fired(task)
    doubled = {k: n for k, n in Counter(keys).items() if n > 1}
    assert doubled == {}, f"occurrences fired twice: {doubled}"
    expected = [cron.occurrence_key(task, o)
                for o in schedule.between(start, watermark(task))]
    missing = sorted(set(expected) - set(keys))
    extra = sorted(set(keys) - set(expected))
    assert (missing, extra) == ([], []), "every second fires once, inside the watermark"
    return keys


def assert_never_decreased(values: list[datetime]) -> None:
    assert len(values) > 20, "the sampler barely ran"
    backwards = [(a, b) for a, b in itertools.pairwise(values) if b < a]
    assert backwards == [], "the watermark went back"


# ----------------------------------------------------------------------------------------


def test_two_workers_fire_every_second_exactly_once_while_the_leader_is_frozen_and_replaced(
        start_worker):
    start, tock_start = start_row(), start_row("tock")
    sampler = Sampler()
    sampler.start()
    both = {**SCHEDULED, "SCHEDULE": {**TICK, **TOCK}}
    a, b = (start_worker(role, settings=both, wait=False) for role in ("a", "b"))
    for worker in (a, b):  # started side by side
        wait_started(worker)
    workers = {a.id: a, b.id: b}
    wait_fired(3)

    # Freeze the leader (a GC pause, a stopped VM) and lapse its lease: the other one is
    # elected, and the frozen one wakes up later still believing it leads, possibly mid-round.
    first = workers[wait_until(lease_holder, timeout=SETTLE, message="a leader")]
    second = next(w for w in workers.values() if w is not first)
    os.kill(first.pid, signal.SIGSTOP)
    try:
        lapse_leader(first)
        wait_until(lambda: lease_holder() == second.id, timeout=SETTLE, interval=0.05,
                   message="the other worker to take the leadership over")
    finally:
        os.kill(first.pid, signal.SIGCONT)
    wait_fired(len(fired()) + 4)

    for w in (a, b):
        w.signal(signal.SIGTERM)
    assert [wait_exit(w) for w in (a, b)] == [0, 0]
    values = sampler.stop()

    keys = assert_exactly_once(start)
    assert len(keys) >= 7  # what the waits above guarantee: the run was not trivially short
    assert len(assert_exactly_once(tock_start, "tock", EVERY_TWO_SECONDS)) >= 2
    assert_never_decreased(values)
    assert not SchedulerLeader.objects.exists(), "a worker stopping cleanly resigns its lease"
    assert Job.objects.filter(enqueued_by="cron:tick").exclude(state="done").count() <= 2


def test_a_leader_killed_mid_round_is_replaced_and_no_occurrence_is_missed_or_doubled(
        start_worker):
    start = start_row()
    sampler = Sampler()
    sampler.start()
    kill_the_leader_inside_a_round(start_worker, SCHEDULED, lambda: len(fired()), more=4)
    values = sampler.stop()

    keys = assert_exactly_once(start)
    assert len(keys) >= 7  # what the waits above guarantee: the run was not trivially short
    assert_never_decreased(values)


def test_xjobs_scheduler_leads_alone_and_hands_the_lease_back_on_sigterm(
        spawn_worker, start_worker):
    start = start_row()
    worker = start_worker("w", "--no-scheduler", settings=SCHEDULED)
    scheduler_id = f"sched-{uuid.uuid4().hex[:8]}"
    sched = spawn_worker("--id", scheduler_id, settings=SCHEDULED, command="xjobs_scheduler")
    wait_log(sched, " started: ", timeout=STARTUP)
    wait_until(lambda: lease_holder() == scheduler_id, timeout=SETTLE,
               message="the dedicated scheduler to lead")
    wait_until(lambda: Job.objects.filter(enqueued_by="cron:tick", state="done").count() >= 3,
               timeout=SETTLE, interval=0.1, message="fired jobs run by the worker")

    sched.signal(signal.SIGTERM)

    assert wait_exit(sched) == 0
    assert not SchedulerLeader.objects.exists()
    assert "resigned the leadership" in sched.log()
    assert "is now the leader" not in worker.log(), "--no-scheduler runs no scheduler"
    assert_exactly_once(start)


def test_advisory_leaders_on_dedicated_connections_fail_over_when_the_leader_dies(
        spawn_worker, start_worker):
    start = start_row()
    advisory = {**SCHEDULED, "LEADER": "advisory"}
    start_worker("w", "--no-scheduler", settings=SCHEDULED)  # runs the fired jobs
    ids = [f"adv{n}-{uuid.uuid4().hex[:6]}" for n in (1, 2)]
    procs = {i: spawn_worker("--id", i, settings=advisory, command="xjobs_scheduler")
             for i in ids}
    leader = wait_until(advisory_holder, timeout=STARTUP + SETTLE,
                        message="an advisory leader")
    wait_fired(3)

    os.kill(procs[leader].pid, signal.SIGKILL)  # its session ends, and the lock with it
    procs[leader].wait(timeout=30)
    survivor = next(i for i in ids if i != leader)
    wait_until(lambda: advisory_holder() == survivor, timeout=SETTLE, interval=0.05,
               message="the other scheduler to take the advisory lock")
    wait_fired(len(fired()) + 3)
    procs[survivor].signal(signal.SIGTERM)

    assert wait_exit(procs[survivor]) == 0
    assert advisory_holder() is None
    assert_exactly_once(start)
    assert watermark() - start > timedelta(seconds=4)
