"""System checks on XJOBS, and the migrations match the models."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core import checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings


def xjobs_messages() -> list[checks.CheckMessage]:
    return [m for m in checks.run_checks(tags=["django_xjobs"]) if m.id.startswith("xjobs.")]


def test_the_test_settings_pass_the_checks():
    assert xjobs_messages() == []


def test_no_xjobs_setting_at_all_passes_the_checks():
    with override_settings():
        from django.conf import settings

        del settings.XJOBS
        assert xjobs_messages() == []


def test_a_job_on_a_queue_the_queues_setting_leaves_out_is_a_warning_naming_it():
    with override_settings(XJOBS={"QUEUES": ["default"]}):
        messages = [m for m in xjobs_messages() if m.id == "xjobs.W010"]
    other = [m for m in messages if "'other'" in m.msg]
    assert len(other) == 1 and other[0].level == checks.WARNING
    assert "testapp.on_other_queue" in other[0].msg
    assert "--queue other" in other[0].hint


@pytest.mark.parametrize(
    ("xjobs", "fragment"),
    [
        ({"LEASE": "1s", "HEARTBEAT": "1s"}, 'XJOBS["LEASE"]'),
        ({"QUEUES": []}, "QUEUES"),
        ({"QUEUES": ["bad queue"]}, "'bad queue'"),
        ({"NOTIFY": "yes"}, "NOTIFY"),
        ({"LEASES": "30s"}, "LEASES"),
        ({"RETENTION": {"running": "1d"}}, "RETENTION"),
        ({"MAX_PAYLOAD_BYTES": 0}, "MAX_PAYLOAD_BYTES"),
    ],
)
def test_a_bad_xjobs_setting_is_reported_as_e001_naming_the_key(xjobs, fragment):
    with override_settings(XJOBS=xjobs):
        messages = xjobs_messages()
    assert [m.id for m in messages] == ["xjobs.E001"]
    assert messages[0].level == checks.ERROR
    assert fragment in messages[0].msg


@pytest.mark.parametrize("xjobs", ["emails", ["QUEUES"], 42])
def test_an_xjobs_setting_that_is_not_a_dict_is_reported_as_e001(xjobs):
    # The check must report it, not crash `manage.py check` (and runserver) with a traceback
    # from dict(...) deep inside conf.build.
    with override_settings(XJOBS=xjobs):
        messages = xjobs_messages()
    assert [m.id for m in messages] == ["xjobs.E001"]
    assert "XJOBS" in messages[0].msg


def test_an_unknown_database_alias_is_reported_as_e002():
    with override_settings(XJOBS={"DATABASE": "jobs_db"}):
        messages = xjobs_messages()
    assert [m.id for m in messages] == ["xjobs.E002"]
    assert "'jobs_db'" in messages[0].msg


def test_manage_py_check_stops_on_a_bad_setting():
    call_command("check", stdout=StringIO(), stderr=StringIO())  # fine as configured
    with override_settings(XJOBS={"LEASE": "10s", "HEARTBEAT": "5s"}):
        with pytest.raises(SystemCheckError, match=r"xjobs\.E001"):
            call_command("check", stdout=StringIO(), stderr=StringIO())


@pytest.mark.django_db
def test_the_migrations_match_the_models():
    out = StringIO()
    try:
        call_command("makemigrations", "django_xjobs", "--check", "--dry-run", stdout=out,
                     stderr=StringIO())
    except SystemExit:
        pytest.fail(f"django_xjobs has model changes without a migration:\n{out.getvalue()}")
    assert "No changes detected" in out.getvalue()
