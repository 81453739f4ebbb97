"""The scheduler round (scheduler/runner.py) on PostgreSQL, driven by a fake wall clock.

The clock that decides what is due is injectable (clock.override); leases and fences run on
the database clock as in production.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.conf import settings as django_settings

from django_xjobs import clock, conf, faults
from django_xjobs.engines import get_engine
from django_xjobs.models import Job, SchedulerLeader, SchedulerState
from django_xjobs.scheduler import cron
from django_xjobs.scheduler.leadership import LeaseLeadership
from django_xjobs.scheduler.runner import Scheduler
from django_xjobs.scheduler.schedule import Task
from tests.conformance.conftest import closing_connections

PARIS = ZoneInfo("Europe/Paris")


class FakeClock:
    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> datetime:
        self.now += timedelta(**delta)
        return self.now


@pytest.fixture
def fake_clock() -> Iterator[FakeClock]:
    fake = FakeClock(datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC))
    with clock.override(now=fake):
        yield fake


@pytest.fixture(autouse=True)
def no_faults():
    faults.clear()
    yield
    faults.clear()


def task(name: str = "t", expression: str = "* * * * *", *, misfire: str = "all",
         timezone: str = "UTC", job: str = "testapp.noop", input: dict | None = None) -> Task:
    return Task(name=name, job=job, schedule=cron.parse(expression, timezone), misfire=misfire,
                input=input or {})


def settings_with(**overrides: object) -> conf.XJobsSettings:
    return conf.build({**django_settings.XJOBS, **overrides})


def leader(holder: str = "node-a", lease: float = 60.0) -> LeaseLeadership:
    leadership = LeaseLeadership(engine=get_engine(), holder=holder, lease=lease,
                                 renew=lease / 4)
    assert leadership.tick(), f"{holder} did not become the leader"
    return leadership


def scheduler(*tasks: Task, leadership: LeaseLeadership | None = None,
              **settings: object) -> Scheduler:
    return Scheduler(engine=get_engine(), leadership=leadership or leader(), tasks=tasks,
                     settings=settings_with(**{"CRON_MISFIRE_GRACE": "10s", **settings}))


def keys(name: str = "t") -> list[str]:
    return sorted(Job.objects.filter(enqueued_by=f"cron:{name}")
                  .values_list("idempotency_key", flat=True))


def key_of(name: str, at: datetime) -> str:
    return cron.occurrence_key(name, at)


def watermark(name: str = "t") -> datetime:
    return SchedulerState.objects.get(task_name=name).last_fired_at


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def set_watermark(name: str, at: datetime) -> None:
    """Simulate a downtime: put the task's watermark back (operators never can)."""
    SchedulerState.objects.update_or_create(task_name=name, defaults={"last_fired_at": at})


# --------------------------------------------------------------------------- the round --


@pytest.mark.django_db
def test_a_new_task_starts_from_now_and_fires_nothing_of_the_past(fake_clock):
    s = scheduler(task())

    report = s.round()

    assert report.total == 0 and keys() == []
    assert watermark() == fake_clock.now


@pytest.mark.django_db
def test_each_due_occurrence_is_enqueued_with_its_key_and_who_enqueued_it(fake_clock):
    s = scheduler(task(input={"tag": "nightly"}))
    s.round()
    fake_clock.advance(minutes=2)  # 12:01 and 12:02 are due, on time with a 3-minute grace

    report = s.round()

    assert report.fired == {"t": [utc(2026, 1, 1, 12, 1), utc(2026, 1, 1, 12, 2)]}
    assert keys() == [key_of("t", utc(2026, 1, 1, 12, 1)), key_of("t", utc(2026, 1, 1, 12, 2))]
    assert keys()[0] == "cron:t:2026-01-01T12:01:00+00:00"
    job = Job.objects.get(idempotency_key=keys()[0])
    assert (job.name, job.input, job.state, job.enqueued_by) == (
        "testapp.noop", {"tag": "nightly"}, "ready", "cron:t")
    assert watermark() == fake_clock.now


@pytest.mark.django_db
def test_a_round_with_nothing_due_sends_no_statement(fake_clock, django_assert_num_queries):
    s = scheduler(task())
    s.round()
    fake_clock.advance(seconds=10)  # the next occurrence (12:01) is still ahead

    with django_assert_num_queries(0):
        assert s.round().total == 0


@pytest.mark.django_db
def test_a_process_that_does_not_lead_fires_nothing(fake_clock):
    leader("node-a")
    follower = LeaseLeadership(engine=get_engine(), holder="node-b", lease=60, renew=15)
    assert follower.tick() is False
    s = scheduler(task(), leadership=follower)
    set_watermark("t", fake_clock.now - timedelta(minutes=5))

    report = s.round()

    assert report.stopped == "not the leader" and keys() == []


# -------------------------------------------------------------------------------- misfire --


@pytest.mark.django_db
@pytest.mark.parametrize(("misfire", "fired"), [("latest", 1), ("all", 3), ("skip", 0)])
def test_after_a_three_minute_downtime_each_misfire_policy_fires_its_share(
        fake_clock, misfire, fired):
    s = scheduler(task(misfire=misfire))
    s.round()
    fake_clock.advance(minutes=3, seconds=10)  # 12:03:40; 12:01-12:03 are 40 s+ late
    set_watermark("t", fake_clock.now - timedelta(minutes=3))

    report = s.round()

    assert len(keys()) == fired == report.total
    if misfire == "latest":
        assert keys() == [key_of("t", utc(2026, 1, 1, 12, 3))]
    assert watermark() == fake_clock.now  # whatever fired, the downtime is behind us


@pytest.mark.django_db
def test_misfire_all_is_bounded_by_max_catchup(fake_clock):
    scheduler(task(misfire="all")).round()
    set_watermark("t", fake_clock.now - timedelta(hours=2))
    restarted = scheduler(task(misfire="all"), CRON_MAX_CATCHUP=5)

    assert restarted.round().total == 5
    assert keys()[-1] == key_of("t", utc(2026, 1, 1, 12, 0))


# --------------------------------------------------------------------- operators' actions --


@pytest.mark.django_db
def test_a_paused_task_fires_nothing_and_its_watermark_keeps_moving(fake_clock):
    from django_xjobs import scheduler as operations

    s = scheduler(task())
    s.round()
    with _configured({"t": {"job": "testapp.noop", "cron": "* * * * *", "misfire": "all"}}):
        operations.pause("t")
    fake_clock.advance(minutes=5)

    report = s.round()

    assert report.paused == ["t"] and keys() == []
    assert watermark() == fake_clock.now


@pytest.mark.django_db
def test_resuming_does_not_replay_the_pause(fake_clock):
    from django_xjobs import scheduler as operations

    # Pause and resume move the watermark on the database's clock (which stands still in the
    # test's transaction): the rounds' fake clock starts half an hour before it.
    db_now = get_engine().db_now()
    fake_clock.now = db_now - timedelta(minutes=30)
    s = scheduler(task(misfire="all"))
    s.round()
    with _configured({"t": {"job": "testapp.noop", "cron": "* * * * *", "misfire": "all"}}):
        operations.pause("t")
        fake_clock.advance(minutes=30)  # no round ran meanwhile: the watermark stayed put
        operations.resume("t")
    assert watermark() == db_now
    fake_clock.advance(minutes=1)

    assert s.round().total == 1
    assert keys() == [key_of("t", db_now.replace(second=0, microsecond=0)
                             + timedelta(minutes=1))]


@pytest.mark.django_db
def test_trigger_enqueues_now_beside_the_schedule_and_leaves_the_watermark(fake_clock):
    from django_xjobs import scheduler as operations

    s = scheduler(task())
    s.round()
    before = watermark()
    with _configured({"t": {"job": "testapp.noop", "cron": "* * * * *"}}):
        handle = operations.trigger("t")

    job = Job.objects.get(id=handle.id)
    assert job.idempotency_key == "cron:t:trigger:2026-01-01T12:00:30+00:00"
    assert job.enqueued_by == "cron:t" and job.state == "ready"
    assert watermark() == before


def _configured(schedule: dict):
    from django.test import override_settings

    return override_settings(XJOBS={**django_settings.XJOBS, "SCHEDULE": schedule})


# ------------------------------------------------------------------- losing the leadership --


def steal_lease(holder: str = "node-b") -> None:
    """Another node takes the lease over (as if ours had lapsed)."""
    SchedulerLeader.objects.filter(lock_key="scheduler").update(holder=holder)


@pytest.mark.django_db
def test_a_leader_that_loses_its_lease_mid_round_writes_nothing_and_steps_down(fake_clock):
    first, second = task("first"), task("second")
    leadership = leader()
    s = scheduler(first, second, leadership=leadership)
    s.round()
    before = watermark("first"), watermark("second")
    fake_clock.advance(minutes=1)
    # Right after the round locked its tasks, the lease goes to another node.
    faults.inject_hook("after:scheduler_states_lock_if_leading", lambda _: steal_lease())

    report = s.round()

    assert report.total == 0 and "fence failed marking" in report.stopped
    assert keys("first") == keys("second") == []
    assert (watermark("first"), watermark("second")) == before
    assert not leadership.is_leader()


@pytest.mark.django_db
def test_a_leader_whose_own_deadline_passes_mid_round_stops_before_enqueueing(fake_clock):
    import time

    jump = [0.0]
    enqueues: list[str] = []
    with clock.override(monotonic=lambda: time.monotonic() + jump[0]):
        s = scheduler(task())
        s.round()
        fake_clock.advance(minutes=1)
        # The process stalls after the lock for longer than its lease (a GC pause).
        faults.inject_hook("after:scheduler_states_lock_if_leading",
                           lambda _: jump.__setitem__(0, 3600.0))
        faults.inject_hook("before:jobs_enqueue", enqueues.append)

        report = s.round()

    assert "deadline passed" in report.stopped
    assert enqueues == [] and keys() == []


@pytest.mark.django_db
def test_a_fence_that_fails_at_the_mark_rolls_the_rounds_enqueue_back(fake_clock):
    s = scheduler(task())
    s.round()
    before = watermark()
    fake_clock.advance(minutes=1)
    # The lease is lost between the enqueue and the mark, inside the task's transaction.
    faults.inject_hook("scheduler:before-mark", lambda _: steal_lease())

    report = s.round()

    assert report.total == 0 and "fence failed marking" in report.stopped
    assert keys() == [] and watermark() == before


@pytest.mark.django_db(transaction=True)
def test_overlapping_rounds_of_two_leaders_fire_each_occurrence_once(fake_clock):
    """A leader frozen mid-round past its lease (A), its successor (B) running rounds, then A
    waking up: B skips the task A holds, A's mark is fenced out and rolled back, and B fires
    what A did not commit. Even an occurrence whose job already finished is not fired again."""
    t = task("t", misfire="all")
    a = scheduler(t, leadership=leader("node-a"))
    a.round()  # 12:00:30: the task starts from here
    fake_clock.advance(minutes=1)
    a.round()  # 12:01 fired and committed by A
    Job.objects.filter(idempotency_key=key_of("t", utc(2026, 1, 1, 12, 1))).update(
        state="done", finished_at=clock.now())  # its key is free again

    fake_clock.advance(minutes=1)
    frozen, resume = threading.Event(), threading.Event()

    def freeze(_: str) -> None:
        frozen.set()
        assert resume.wait(30)

    faults.inject_hook("scheduler:before-mark", freeze)
    with ThreadPoolExecutor(max_workers=1) as pool:
        a_round = pool.submit(closing_connections(a.round))  # enqueues 12:02, then freezes
        assert frozen.wait(30)
        # A's lease lapses; B is elected and runs its rounds while A is frozen.
        SchedulerLeader.objects.update(expires_at=get_engine().db_now() - timedelta(seconds=1))
        b = scheduler(t, leadership=leader("node-b"))
        b_first = b.round()
        assert b_first.busy == ["t"] and b_first.total == 0
        resume.set()
        a_report = a_round.result(30)

    assert a_report.total == 0 and "fence failed" in a_report.stopped
    assert b.round().fired == {"t": [utc(2026, 1, 1, 12, 2)]}
    assert keys() == [key_of("t", utc(2026, 1, 1, 12, 1)), key_of("t", utc(2026, 1, 1, 12, 2))]
    # A, back as a follower, finds nothing to do; B's next round neither.
    assert a.round().total == 0 and b.round().total == 0
    assert len(keys()) == len(set(keys())) == 2


# ------------------------------------------------------------- a wall clock that is off --


@pytest.mark.django_db
@pytest.mark.parametrize("hours", [1, -1])
def test_rounds_on_the_database_clock_ignore_a_wall_clock_an_hour_off(hours):
    """What the worker's scheduler duty does (SchedulerDuty: clock.DatabaseClock(db_now)): an
    hour ahead would fire the next hour's occurrences now (then stall the next leader an hour),
    an hour behind would fire nothing for an hour. tests/acceptance/test_worker_clock.py runs
    it in a worker whose clock is really shifted."""
    db_now = get_engine().db_now()  # the test's transaction: the database clock stands still
    set_watermark("t", db_now - timedelta(seconds=3))
    with clock.override(now=lambda: datetime.now(UTC) + timedelta(hours=hours)):
        db_clock = clock.DatabaseClock(get_engine().db_now)
        db_clock.sync()
        s = Scheduler(engine=get_engine(), leadership=leader(),
                      tasks=[task(expression="* * * * * *")],
                      settings=settings_with(CRON_MISFIRE_GRACE="10s"), now=db_clock.now)
        report = s.round()

    fired = report.fired["t"]
    assert len(fired) in (3, 4) and max(fired) <= db_clock.now() < db_now + timedelta(minutes=1)
    assert db_now - timedelta(seconds=3) < watermark() < db_now + timedelta(minutes=1)


@pytest.mark.django_db
@pytest.mark.parametrize("hours", [1, -1])
def test_pause_and_resume_move_the_watermark_on_the_database_clock_not_the_operators(hours):
    """An operator whose wall clock is an hour off (``xjobs schedule pause|resume``, code
    calling scheduler.pause/resume): an hour ahead, a resume would skip the next hour's
    occurrences and a new task's row would start an hour late; an hour behind, a resume would
    replay the last hour of the pause. tests/acceptance/test_worker_clock.py runs the command
    with its clock really shifted."""
    from django_xjobs import scheduler as operations

    db_now = get_engine().db_now()  # the test's transaction: the database clock stands still
    schedule = {name: {"job": "testapp.noop", "cron": "* * * * *", "misfire": "all"}
                for name in ("t", "u")}
    with _configured(schedule), clock.override(
            now=lambda: datetime.now(UTC) + timedelta(hours=hours)):
        # A task that never ran: its row starts at the database's now.
        paused = operations.pause("t")
        assert (watermark("t"), paused.watermark, paused.paused) == (db_now, db_now, True)
        # Paused two hours ago by the database's clock, no round since: the resume moves the
        # watermark to the database's now, and the next fire is the next minute after it.
        set_watermark("t", db_now - timedelta(hours=2))
        resumed = operations.resume("t")
        overview = {info.name: info for info in operations.describe().tasks}

    assert (watermark("t"), resumed.watermark, resumed.paused) == (db_now, db_now, False)
    next_minute = db_now.replace(second=0, microsecond=0) + timedelta(minutes=1)
    assert resumed.next_fire_at == overview["t"].next_fire_at == next_minute
    # A task with no row yet is listed from the database's now too.
    assert overview["u"].next_fire_at == next_minute


# --------------------------------------------------------------------------------- DST --


def run_night(s: Scheduler, fake_clock: FakeClock, start: datetime, hours: int,
              step_minutes: int = 7) -> list[datetime]:
    """Rounds every few minutes of fake time across ``hours``; the watermark never goes back.

    The fake clock runs in UTC: arithmetic on an aware datetime of a DST zone is wall-clock
    arithmetic, and would skip or repeat the transition's hour."""
    fake_clock.now = start.astimezone(UTC)
    s.round()
    previous = watermark("daily")
    fired: list[datetime] = []
    for _ in range(hours * 60 // step_minutes):
        fake_clock.advance(minutes=step_minutes)
        report = s.round()
        fired += report.fired.get("daily", [])
        assert watermark("daily") >= previous
        previous = watermark("daily")
    return fired


@pytest.mark.django_db
def test_spring_forward_in_paris_fires_the_missing_0230_once_at_0300(fake_clock):
    daily = task("daily", "30 2 * * *", timezone="Europe/Paris", misfire="latest")
    every20 = task("every20", "*/20 * * * *", timezone="Europe/Paris", misfire="latest")
    s = scheduler(daily, every20)
    start = datetime(2026, 3, 29, 0, 30, tzinfo=PARIS)

    fired = run_night(s, fake_clock, start, hours=4)

    assert fired == [datetime(2026, 3, 29, 3, 0, tzinfo=PARIS)]
    assert keys("daily") == ["cron:daily:2026-03-29T01:00:00+00:00"]
    # 00:40 ... 01:40 CET, then 03:00 ... 05:20 CEST: the missing hour has no occurrence.
    expected = cron.parse("*/20 * * * *", "Europe/Paris").between(start, fake_clock.now)
    assert keys("every20") == sorted(key_of("every20", e) for e in expected)
    assert [e.astimezone(PARIS).strftime("%H:%M") for e in expected][3:5] == ["01:40", "03:00"]
    assert len(expected) == 12


@pytest.mark.django_db
def test_fall_back_in_paris_fires_each_pass_of_the_repeated_hour_as_its_own_instant(
        fake_clock):
    daily = task("daily", "30 2 * * *", timezone="Europe/Paris", misfire="latest")
    every20 = task("every20", "*/20 * * * *", timezone="Europe/Paris", misfire="latest")
    s = scheduler(daily, every20)
    start = datetime(2026, 10, 25, 1, 0, tzinfo=PARIS)

    fired = run_night(s, fake_clock, start, hours=4)

    # 02:30 CEST and 02:30 CET: croniter's behaviour, documented in docs/scheduling.md.
    assert fired == [utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 1, 30)]
    expected = cron.parse("*/20 * * * *", "Europe/Paris").between(start, fake_clock.now)
    assert keys("every20") == sorted(key_of("every20", e) for e in expected)
    # 01:20 ... 02:40 CEST, 02:00 ... 03:40 CET: both passes of 02:xx, 20 real minutes apart.
    assert [e.astimezone(PARIS).strftime("%H:%M%z") for e in expected][2:8] == [
        "02:00+0200", "02:20+0200", "02:40+0200", "02:00+0100", "02:20+0100", "02:40+0100"]
    assert len(expected) == 11
