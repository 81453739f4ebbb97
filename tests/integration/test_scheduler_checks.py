"""System checks of the cron tasks: each kind of bad schedule stops start-up with its own id."""

from __future__ import annotations

from io import StringIO

import pytest
from django.conf import settings
from django.core import checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from django_xjobs import job, registry

GOOD = {"job": "testapp.noop", "cron": "*/5 * * * *", "timezone": "Europe/Paris"}


def messages(schedule: object) -> list[checks.CheckMessage]:
    with override_settings(XJOBS={**settings.XJOBS, "SCHEDULE": schedule}):
        return [m for m in checks.run_checks(tags=["django_xjobs"])
                if m.id.startswith("xjobs.")]


@pytest.fixture
def cron_job():
    @job(name="tests.every_minute", cron="* * * * *")
    def every_minute(ctx):
        return None

    yield every_minute
    registry.unregister("tests.every_minute")


def test_a_good_schedule_passes_the_checks():
    assert messages({"a": GOOD, "b": {"job": "testapp.record", "cron": "0 0 3 * * *",
                                      "input": {"tag": "x"}, "misfire": "all"}}) == []


@pytest.mark.parametrize(
    ("entry", "check_id", "fragment"),
    [
        ({**GOOD, "cron": "*/5 * * *"}, "xjobs.E010", "has 4 fields"),
        ({**GOOD, "cron": "0 25 * * *"}, "xjobs.E010", "not a valid cron expression"),
        ({**GOOD, "cron": "0 0 31 2 *"}, "xjobs.E010", "never fires"),
        ({**GOOD, "timezone": "Europe/Lutetia"}, "xjobs.E011", "unknown timezone"),
        ({**GOOD, "job": "testapp.does_not_exist"}, "xjobs.E012", "no job named"),
        ({**GOOD, "input": {"when": {1, 2}}}, "xjobs.E013", "not JSON-serialisable"),
        ({**GOOD, "input": {"blob": "x" * 2_000_000}}, "xjobs.E013", "MAX_PAYLOAD_BYTES"),
    ],
)
def test_each_kind_of_bad_schedule_entry_has_its_own_check_id(entry, check_id, fragment):
    found = messages({"nightly": entry})

    assert [m.id for m in found] == [check_id]
    assert found[0].level == checks.ERROR
    assert fragment in found[0].msg and "'nightly'" in found[0].msg


def test_a_task_name_taken_by_a_job_with_cron_is_reported(cron_job):
    found = messages({"tests.every_minute": GOOD})

    assert [m.id for m in found] == ["xjobs.E014"]
    assert "already declared by @job(cron=...)" in found[0].msg


def test_every_bad_entry_is_reported_not_only_the_first():
    found = messages({"a": {**GOOD, "cron": "nope"}, "b": {**GOOD, "timezone": "Nowhere"},
                      "c": GOOD})

    assert sorted(m.id for m in found) == ["xjobs.E010", "xjobs.E011"]


def test_a_malformed_entry_is_a_settings_error_e001_and_nothing_else():
    found = messages({"nightly": {"job": "testapp.noop"}})

    assert [m.id for m in found] == ["xjobs.E001"]
    assert 'needs a "cron"' in found[0].msg


def test_manage_py_check_stops_on_a_bad_schedule():
    with override_settings(XJOBS={**settings.XJOBS, "SCHEDULE": {
            "nightly": {**GOOD, "timezone": "Mars/Olympus"}}}):
        with pytest.raises(SystemCheckError, match=r"xjobs\.E011"):
            call_command("check", stdout=StringIO(), stderr=StringIO())
