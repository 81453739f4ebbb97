"""``manage.py xjobs schedule [pause|resume|trigger NAME]`` and the read API behind it
(``django_xjobs.scheduler.describe``).

The wall clock is faked to a fixed moment (``NOW``, the trigger's key); the next fires and the
watermarks of pause and resume follow the database's clock, which stands still in each test's
transaction (:func:`db_now`)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_xjobs import clock, scheduler
from django_xjobs.engines import get_engine
from django_xjobs.exceptions import UnknownTask
from django_xjobs.models import Job, SchedulerState
from django_xjobs.scheduler import cron

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 5, 4, 10, 7, 30, tzinfo=UTC)
SCHEDULE = {
    "nightly": {"job": "testapp.record", "cron": "0 3 * * *", "timezone": "Europe/Paris",
                "input": {"tag": "nightly"}},
    "ticker": {"job": "testapp.noop", "cron": "*/10 * * * * *", "misfire": "all"},
}


@pytest.fixture(autouse=True)
def configured():
    with override_settings(XJOBS={**settings.XJOBS, "SCHEDULE": SCHEDULE}), \
            clock.override(now=lambda: NOW):
        yield


def db_now() -> datetime:
    return get_engine().db_now()


def next_fire(name: str) -> str:
    """When task ``name`` of SCHEDULE fires next after the database's now, as the command
    prints it."""
    task = SCHEDULE[name]
    at = cron.parse(task["cron"], task.get("timezone", "UTC")).next_after(db_now())
    return at.astimezone(UTC).isoformat(timespec="seconds")


def xjobs(*args: str) -> str:
    out = StringIO()
    call_command("xjobs", *args, stdout=out)
    return out.getvalue()


def test_describe_lists_each_task_with_its_next_fire_time_and_no_leader():
    overview = scheduler.describe(now=NOW)

    assert overview.leader is None and overview.mode == "lease"
    by_name = {t.name: t for t in overview.tasks}
    assert sorted(by_name) == ["nightly", "ticker"]
    nightly = by_name["nightly"]
    assert (nightly.job, nightly.cron, nightly.timezone, nightly.misfire, nightly.source) == (
        "testapp.record", "0 3 * * *", "Europe/Paris", "latest", "settings")
    assert nightly.next_fire_at == datetime(2026, 5, 5, 1, 0, tzinfo=UTC)  # 03:00 CEST
    assert nightly.watermark is None and not nightly.paused and nightly.configured
    assert by_name["ticker"].next_fire_at == datetime(2026, 5, 4, 10, 7, 40, tzinfo=UTC)
    # Without a moment: the database's now, not this machine's wall clock (faked to NOW).
    assert scheduler.describe().now == db_now()


def test_describe_shows_the_watermark_the_leader_and_tasks_no_longer_configured():
    engine = get_engine()
    engine.leader_attempt_elect("scheduler", "worker-9", 60_000)
    SchedulerState.objects.create(task_name="ticker", last_fired_at=NOW - timedelta(seconds=5))
    SchedulerState.objects.create(task_name="retired", last_fired_at=NOW - timedelta(days=1))

    overview = scheduler.describe()

    assert overview.leader is not None and overview.leader.holder == "worker-9"
    by_name = {t.name: t for t in overview.tasks}
    assert by_name["ticker"].watermark == NOW - timedelta(seconds=5)
    retired = by_name["retired"]
    assert not retired.configured and retired.job is None and retired.next_fire_at is None


def test_xjobs_schedule_prints_a_table_and_the_leader():
    get_engine().leader_attempt_elect("scheduler", "worker-9", 60_000)

    out = xjobs("schedule")

    lines = out.splitlines()
    assert lines[0].split() == ["task", "job", "schedule", "timezone", "misfire", "overlap",
                                "state", "watermark", "next", "fire", "skipped", "(last)"]
    nightly = next(line for line in lines if line.startswith("nightly"))
    assert "testapp.record" in nightly and "Europe/Paris" in nightly and "active" in nightly
    assert next_fire("nightly") in nightly
    # Elected for 60 s in this transaction, whose now() stands still; the wall clock (NOW,
    # months earlier) has no say.
    assert "leader (lease): worker-9 (lease expires in 60.0s)" in out


def test_xjobs_schedule_json_has_every_field():
    data = json.loads(xjobs("schedule", "--json"))

    assert data["mode"] == "lease" and data["leader"] is None
    assert [t["name"] for t in data["tasks"]] == ["nightly", "ticker"]
    assert data["tasks"][1]["next_fire_at"] == next_fire("ticker")
    assert set(data["tasks"][0]) >= {"name", "job", "cron", "timezone", "misfire", "paused",
                                     "watermark", "next_fire_at", "configured"}
    assert json.loads(xjobs("--json", "schedule")) == data


def test_pause_and_resume_from_the_command_line():
    paused = json.loads(xjobs("schedule", "pause", "ticker", "--json"))
    assert paused["action"] == "pause" and paused["task"]["paused"] is True
    assert paused["task"]["next_fire_at"] is None
    assert SchedulerState.objects.get(task_name="ticker").paused

    text = xjobs("schedule", "resume", "ticker")
    assert text.strip() == f"resume: task ticker is now active; next fire {next_fire('ticker')}"
    state = SchedulerState.objects.get(task_name="ticker")
    assert not state.paused and state.last_fired_at == db_now()


def test_trigger_from_the_command_line_enqueues_the_tasks_job_with_its_input():
    data = json.loads(xjobs("schedule", "trigger", "nightly", "--json"))

    job = Job.objects.get(id=data["job_id"])
    assert (job.name, job.input, job.enqueued_by) == ("testapp.record", {"tag": "nightly"},
                                                      "cron:nightly")
    assert job.idempotency_key == "cron:nightly:trigger:2026-05-04T10:07:30+00:00"
    assert xjobs("schedule", "trigger", "nightly").startswith("trigger: task nightly enqueued")


@pytest.mark.parametrize("action", ["pause", "resume", "trigger"])
def test_an_unknown_task_is_a_command_error_naming_the_configured_ones(action):
    with pytest.raises(CommandError, match=r"no cron task named 'nope'.*nightly"):
        xjobs("schedule", action, "nope")
    assert not SchedulerState.objects.exists() and not Job.objects.exists()


def test_the_read_api_raises_unknown_task():
    with pytest.raises(UnknownTask):
        scheduler.pause("nope")
