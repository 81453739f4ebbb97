"""XJOBS["OUTBOX"] parsing, the outbox system checks and XJobsRouter's answers (no database)."""

from __future__ import annotations

import pytest
from django.core import checks
from django.test import override_settings

from django_xjobs import conf
from django_xjobs.exceptions import ConfigurationError
from django_xjobs.models import Job, JobStep, OutboxEntry
from django_xjobs.routers import XJobsRouter

ROUTER = "django_xjobs.routers.XJobsRouter"


def test_the_outbox_defaults_to_the_default_alias_and_the_poll_interval():
    settings = conf.build({"POLL_INTERVAL": "250ms"})
    assert settings.outbox == conf.OutboxSettings(databases=("default",), batch_size=500,
                                                  poll_interval=0.25)


def test_outbox_options_are_read():
    settings = conf.build({"OUTBOX": {"DATABASES": ["app", "other"], "BATCH_SIZE": 50,
                                      "POLL_INTERVAL": "2s"}})
    assert settings.outbox == conf.OutboxSettings(databases=("app", "other"), batch_size=50,
                                                  poll_interval=2.0)


@pytest.mark.parametrize(("outbox", "fragment"), [
    ("default", 'XJOBS["OUTBOX"] must be a dict'),
    ({"DATABASE": ["default"]}, "unknown key(s) ['DATABASE']"),
    ({"DATABASES": "default"}, "non-empty list"),
    ({"DATABASES": []}, "non-empty list"),
    ({"DATABASES": ["default", ""]}, "'' is not a database alias"),
    ({"DATABASES": ["a", "a"]}, "repeats an alias"),
    ({"BATCH_SIZE": 0}, '["BATCH_SIZE"] must be a positive integer'),
    ({"BATCH_SIZE": True}, '["BATCH_SIZE"] must be a positive integer'),
    ({"POLL_INTERVAL": "0s"}, "greater than zero"),
    ({"POLL_INTERVAL": "soon"}, "not a duration"),
])
def test_a_bad_outbox_option_is_a_configuration_error_naming_it(outbox, fragment):
    with pytest.raises(ConfigurationError) as info:
        conf.build({"OUTBOX": outbox})
    assert fragment in str(info.value)


def messages() -> list[checks.CheckMessage]:
    # W050 is the test app's backfills, which cannot run with the job tables on "jobs".
    return [m for m in checks.run_checks(tags=["django_xjobs"])
            if m.id.startswith("xjobs.") and m.id != "xjobs.W050"]


def test_an_outbox_alias_missing_from_databases_is_e020():
    with override_settings(XJOBS={"OUTBOX": {"DATABASES": ["default", "nowhere"]}}):
        found = messages()
    assert [m.id for m in found] == ["xjobs.E020"]
    assert "'nowhere'" in found[0].msg


def test_an_outbox_alias_that_is_not_postgresql_is_e021(monkeypatch):
    from django.db import connections

    monkeypatch.setitem(connections.settings, "lite",
                        {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"})
    with override_settings(XJOBS={"OUTBOX": {"DATABASES": ["lite"]}}):
        found = messages()
    assert [m.id for m in found] == ["xjobs.E021"]


def test_job_tables_on_another_alias_without_the_router_warn_w020():
    with override_settings(XJOBS={"DATABASE": "jobs"}, DATABASE_ROUTERS=[]):
        found = messages()
    assert [(m.id, m.level) for m in found] == [("xjobs.W020", checks.WARNING)]
    with override_settings(XJOBS={"DATABASE": "jobs"}, DATABASE_ROUTERS=[ROUTER]):
        assert messages() == []
    with override_settings(XJOBS={"DATABASE": "jobs"}, DATABASE_ROUTERS=[XJobsRouter()]):
        assert messages() == []


# ------------------------------------------------------------------------------- the router --


def test_the_router_routes_by_table_and_has_no_opinion_on_other_apps():
    router = XJobsRouter()
    with override_settings(XJOBS={"DATABASE": "jobs",
                                  "OUTBOX": {"DATABASES": ["app", "default"]}}):
        assert router.db_for_read(Job) == "jobs"
        assert router.db_for_write(JobStep) == "jobs"
        assert router.db_for_read(OutboxEntry) == "app"
        assert router.allow_migrate("app", "django_xjobs", model_name="outboxentry") is True
        assert router.allow_migrate("default", "django_xjobs", model_name="outboxentry") is True
        assert router.allow_migrate("jobs", "django_xjobs", model_name="outboxentry") is False
        assert router.allow_migrate("jobs", "django_xjobs", model_name="jobstep") is True
        assert router.allow_migrate("app", "django_xjobs", model_name="job") is False
        assert router.allow_migrate("app", "auth", model_name="user") is None
        assert router.allow_relation(Job(), OutboxEntry()) is None


def test_an_outbox_row_is_written_back_to_the_alias_it_was_read_from():
    router = XJobsRouter()
    entry = OutboxEntry()
    entry._state.db = "default"
    with override_settings(XJOBS={"OUTBOX": {"DATABASES": ["app", "default"]}}):
        assert router.db_for_write(OutboxEntry, instance=entry) == "default"
        entry._state.db = "elsewhere"  # not an outbox alias: the first outbox alias
        assert router.db_for_write(OutboxEntry, instance=entry) == "app"


def test_with_everything_on_default_the_router_sends_everything_there():
    router = XJobsRouter()
    with override_settings(XJOBS={}):
        assert router.db_for_read(Job) == router.db_for_read(OutboxEntry) == "default"
        assert router.allow_migrate("default", "django_xjobs", model_name="job") is True
        assert router.allow_migrate("default", "django_xjobs") is True
