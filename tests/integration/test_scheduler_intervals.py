"""Interval tasks (``every``) on PostgreSQL: the round (scheduler/runner.py) fires each
occurrence of the epoch's grid once, through a leader change, under the misfire and overlap
policies; the settings entry (``args``, ``queue``, ``priority``, a Celery beat schedule
imported) as the round and the checks read it; what ``manage.py xjobs schedule``, the read API
and the console show.

The clock that decides what is due is faked (clock.override); leases and fences run on the
database clock, as in production."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.conf import settings as django_settings
from django.core import checks
from django.core.management import call_command
from django.test import override_settings

from django_xjobs import clock, conf, scheduler
from django_xjobs.console.reads.dashboard import schedule_rows
from django_xjobs.engines import get_engine
from django_xjobs.models import Job, SchedulerLeader, SchedulerState
from django_xjobs.scheduler import cron, crontab, from_celery_beat, interval
from django_xjobs.scheduler.leadership import LeaseLeadership
from django_xjobs.scheduler.runner import Scheduler
from django_xjobs.scheduler.schedule import Task, collect
from tests.integration.test_scheduler_round import FakeClock

pytestmark = pytest.mark.django_db

START = datetime(2026, 1, 1, 12, 0, 10, tzinfo=UTC)


@pytest.fixture
def fake_clock() -> Iterator[FakeClock]:
    fake = FakeClock(START)
    with clock.override(now=fake):
        yield fake


def configured(schedule: dict):
    return override_settings(XJOBS={**django_settings.XJOBS, "SCHEDULE": schedule})


def every_task(name: str = "poll", every: str = "45s", *, misfire: str = "all",
               overlap: str = "allow") -> Task:
    return Task(name=name, job="testapp.noop", schedule=interval.parse(every), misfire=misfire,
                overlap=overlap)


def leader(holder: str = "node-a") -> LeaseLeadership:
    leadership = LeaseLeadership(engine=get_engine(), holder=holder, lease=60, renew=15)
    assert leadership.tick(), f"{holder} did not become the leader"
    return leadership


def scheduler_of(*tasks: Task, leadership: LeaseLeadership | None = None) -> Scheduler:
    return Scheduler(engine=get_engine(), leadership=leadership or leader(), tasks=tasks,
                     settings=conf.build({**django_settings.XJOBS, "CRON_MISFIRE_GRACE": "10s"}))


def keys(name: str = "poll") -> list[str]:
    return sorted(Job.objects.filter(enqueued_by=f"cron:{name}")
                  .values_list("idempotency_key", flat=True))


def grid(name: str, every: str, start: datetime, end: datetime) -> list[str]:
    """The keys of the occurrences of ``every`` in ``(start, end]``."""
    return [cron.occurrence_key(name, o) for o in interval.parse(every).between(start, end)]


def watermark(name: str = "poll") -> datetime:
    return SchedulerState.objects.get(task_name=name).last_fired_at


# ----------------------------------------------------------------------------- the round --


def test_an_interval_task_starts_from_now_then_fires_each_point_of_the_grid_once(fake_clock):
    s = scheduler_of(every_task())
    assert s.round().total == 0 and watermark() == START  # nothing of the past

    fake_clock.advance(seconds=100)  # 12:00:10 -> 12:01:50: 12:00:45 and 12:01:30 are due
    report = s.round()

    assert report.fired == {"poll": [datetime(2026, 1, 1, 12, 0, 45, tzinfo=UTC),
                                     datetime(2026, 1, 1, 12, 1, 30, tzinfo=UTC)]}
    assert keys() == ["cron:poll:2026-01-01T12:00:45+00:00", "cron:poll:2026-01-01T12:01:30+00:00"]
    job = Job.objects.get(idempotency_key=keys()[0])
    assert (job.name, job.enqueued_by, job.state) == ("testapp.noop", "cron:poll", "ready")
    assert watermark() == fake_clock.now
    # The next round is due at the next point of the grid, and not before.
    assert s.next_round_at(fake_clock.now) == datetime(2026, 1, 1, 12, 2, 15, tzinfo=UTC)
    fake_clock.advance(seconds=20)
    assert s.round().total == 0


def test_a_round_with_no_interval_occurrence_due_sends_no_statement(
        fake_clock, django_assert_num_queries):
    s = scheduler_of(every_task())
    s.round()
    fake_clock.advance(seconds=30)  # 12:00:40: the next occurrence, 12:00:45, is ahead

    with django_assert_num_queries(0):
        assert s.round().total == 0


def test_a_new_leader_fires_the_same_grid_from_the_old_ones_watermark_exactly_once(fake_clock):
    # A fires for a while, then its lease lapses (a crash); B, elected at an instant of its
    # own that is on no point of the grid, carries on from A's watermark: every occurrence in
    # the whole stretch is fired once, by one of them, whatever B's start.
    a = scheduler_of(every_task(every="7s"), leadership=leader("node-a"))
    a.round()
    for _ in range(5):
        fake_clock.advance(seconds=3.3)
        a.round()
    by_a = keys()
    SchedulerLeader.objects.update(expires_at=get_engine().db_now() - timedelta(seconds=1))
    fake_clock.advance(seconds=5.123)  # the handover takes a while (within the grace)
    b = scheduler_of(every_task(every="7s"), leadership=leader("node-b"))
    for _ in range(6):
        b.round()
        fake_clock.advance(seconds=4.1)
    b.round()

    assert by_a and len(keys()) > len(by_a)
    assert keys() == sorted(grid("poll", "7s", START, watermark()))
    assert not a.round().total  # A, back, is no leader any more


@pytest.mark.parametrize(("misfire", "fired"), [
    ("latest", ["12:04:30"]), ("all", ["12:00:45", "12:01:30", "12:02:15", "12:03:00",
                                       "12:03:45", "12:04:30"]), ("skip", [])])
def test_after_a_downtime_each_misfire_policy_fires_its_share(fake_clock, misfire, fired):
    s = scheduler_of(every_task(misfire=misfire))
    s.round()
    fake_clock.advance(minutes=4, seconds=32)  # 12:04:42, the grace 10 s: all were missed

    s.round()

    assert keys() == [f"cron:poll:2026-01-01T{at}+00:00" for at in fired]
    assert watermark() == fake_clock.now


def test_overlap_skip_enqueues_no_occurrence_while_a_run_is_live_and_counts_the_skips(
        fake_clock):
    s = scheduler_of(every_task(overlap="skip"))
    s.round()
    fake_clock.advance(seconds=40)  # 12:00:45
    assert s.round().total == 1
    fake_clock.advance(seconds=90)  # 12:01:30 and 12:02:15 while the first run is still ready

    report = s.round()

    assert report.total == 0 and len(report.skipped["poll"]) == 2
    assert keys() == ["cron:poll:2026-01-01T12:00:45+00:00"]
    state = SchedulerState.objects.get(task_name="poll")
    assert state.overlap_skipped == 2
    assert state.overlap_skipped_at == datetime(2026, 1, 1, 12, 2, 15, tzinfo=UTC)


# ------------------------------------------------------------------ the settings entry --

ENTRY = {"job": "testapp.record", "every": "45s", "args": ["from-args"], "queue": "polls",
         "priority": 9, "misfire": "all"}


def test_an_entry_fires_its_args_as_named_input_in_its_own_queue_and_priority(fake_clock):
    with configured({"poll": ENTRY}):
        tasks, problems = collect()
    assert problems == []
    s = scheduler_of(*tasks.values())
    s.round()
    fake_clock.advance(seconds=40)

    s.round()

    job = Job.objects.get(enqueued_by="cron:poll")
    assert (job.name, job.input, job.queue, job.priority) == (
        "testapp.record", {"tag": "from-args"}, "polls", 9)
    assert job.idempotency_key == "cron:poll:2026-01-01T12:00:45+00:00"


def test_trigger_enqueues_an_entrys_job_with_its_args_queue_and_priority(fake_clock):
    with configured({"poll": ENTRY}):
        handle = scheduler.trigger("poll")

    job = Job.objects.get(id=handle.id)
    assert (job.input, job.queue, job.priority) == ({"tag": "from-args"}, "polls", 9)


def messages(schedule: dict) -> list[checks.CheckMessage]:
    with configured(schedule):
        return [m for m in checks.run_checks(tags=["django_xjobs"]) if m.id.startswith("xjobs.")]


@pytest.mark.parametrize(("entry", "check_id", "fragment"), [
    ({"job": "testapp.noop", "every": "500ms"}, "xjobs.E015",
     "XJOBS[\"SCHEDULE\"]['poll']: every: 500ms is shorter than the shortest interval, 1s"),
    ({"job": "testapp.noop", "every": 0}, "xjobs.E015", "shorter than the shortest interval"),
    ({"job": "testapp.noop", "every": "400d"}, "xjobs.E015", "longer than the longest interval"),
    ({"job": "testapp.noop", "every": "45s", "args": [1]}, "xjobs.E013",
     "XJOBS[\"SCHEDULE\"]['poll']['args']: input of testapp.noop: noop(ctx, **kwargs) takes 0 "
     "argument(s) by position after ctx, got 1"),
    ({"job": "testapp.record", "every": "45s", "args": ["a"], "input": {"tag": "b"}},
     "xjobs.E013", "got multiple values for argument(s) 'tag'"),
    ({"job": "testapp.record", "every": "45s", "args": [{1, 2}]}, "xjobs.E013",
     "not JSON-serialisable"),
    ({"job": "testapp.does_not_exist", "every": "45s", "args": [1]}, "xjobs.E012",
     "no job named 'testapp.does_not_exist'"),
    ({"job": "testapp.noop", "every": "45s", "timezone": "UTC"}, "xjobs.E001",
     '["timezone"] goes with "cron" only'),
    ({"job": "testapp.noop", "every": "45s", "cron": "* * * * *"}, "xjobs.E001", "not both"),
])
def test_each_kind_of_bad_interval_entry_has_its_check_id_and_names_the_entry(
        entry, check_id, fragment):
    found = messages({"poll": entry})

    assert [m.id for m in found] == [check_id]
    assert fragment in found[0].msg and "'poll'" in found[0].msg


def test_a_task_name_taken_by_a_job_with_every_is_reported():
    from django_xjobs import job, registry

    @job(name="tests.every_ten_seconds", every="10s")
    def every_ten_seconds(ctx):
        return None

    try:
        found = messages({"tests.every_ten_seconds": {"job": "testapp.noop", "every": "1m"}})
    finally:
        registry.unregister("tests.every_ten_seconds")

    assert [m.id for m in found] == ["xjobs.E014"]
    assert "already declared by @job(every=...)" in found[0].msg


def test_an_imported_celery_beat_schedule_passes_the_checks_and_fires_its_args(fake_clock):
    beat = {
        "poll inbox": {"task": "testapp.record", "schedule": 45.0, "args": ("celery",),
                       "options": {"queue": "polls"}},
        "nightly": {"task": "testapp.record", "schedule": crontab(minute=0, hour=3),
                    "kwargs": {"tag": "night"}},
    }
    schedule = from_celery_beat(beat, timezone="Europe/Paris")
    assert messages(schedule) == []
    with configured(schedule):
        tasks, _ = collect()
    s = scheduler_of(*tasks.values())
    s.round()
    fake_clock.advance(seconds=40)

    s.round()

    job = Job.objects.get(enqueued_by="cron:poll-inbox")
    assert (job.input, job.queue) == ({"tag": "celery"}, "polls")
    assert tasks["nightly"].schedule == cron.parse("0 3 * * *", "Europe/Paris")
    assert tasks["nightly"].input == {"tag": "night"}


# ------------------------------------------------------------------ what operators see --

SHOWN = {"poll": {"job": "testapp.noop", "every": "45s"},
         "nightly": {"job": "testapp.noop", "cron": "0 3 * * *", "timezone": "Europe/Paris"}}


def test_describe_gives_an_interval_task_its_period_its_text_and_no_cron_nor_timezone():
    now = datetime(2026, 5, 4, 10, 7, 30, tzinfo=UTC)
    with configured(SHOWN):
        tasks = {t.name: t for t in scheduler.describe(now=now).tasks}

    poll, nightly = tasks["poll"], tasks["nightly"]
    assert (poll.cron, poll.timezone, poll.every, poll.schedule) == (None, None, 45.0,
                                                                     "every 45s")
    assert poll.next_fire_at == datetime(2026, 5, 4, 10, 8, 15, tzinfo=UTC)
    assert (nightly.cron, nightly.timezone, nightly.every, nightly.schedule) == (
        "0 3 * * *", "Europe/Paris", None, "0 3 * * *")


def xjobs(*args: str) -> str:
    out = StringIO()
    call_command("xjobs", *args, stdout=out)
    return out.getvalue()


def test_xjobs_schedule_shows_every_45s_beside_a_cron_expression():
    with configured(SHOWN):
        lines = xjobs("schedule").splitlines()
        data = json.loads(xjobs("schedule", "--json"))

    assert lines[0].split()[:4] == ["task", "job", "schedule", "timezone"]
    poll = next(line for line in lines if line.startswith("poll"))
    assert poll.split()[:5] == ["poll", "testapp.noop", "every", "45s", "-"]
    nightly = next(line for line in lines if line.startswith("nightly"))
    assert "0 3 * * *" in nightly and "Europe/Paris" in nightly
    by_name = {t["name"]: t for t in data["tasks"]}
    assert (by_name["poll"]["every"], by_name["poll"]["schedule"], by_name["poll"]["cron"]) == (
        45.0, "every 45s", None)


def test_the_console_shows_an_interval_task_as_every_45s():
    SchedulerState.objects.create(task_name="retired", last_fired_at=START)
    with configured(SHOWN):
        rows = {r.task: r for r in schedule_rows()}
        text = xjobs("dashboard")

    assert rows["poll"].schedule == "every 45s" and rows["nightly"].schedule == "0 3 * * *"
    assert rows["retired"].schedule is None
    assert "every 45s" in text
