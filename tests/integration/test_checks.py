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


def test_a_listen_database_that_is_no_alias_or_not_postgresql_is_an_error(monkeypatch):
    from django.db import connections

    with override_settings(XJOBS={"LISTEN_DATABASE": "direct_db"}):
        messages = xjobs_messages()
    assert [m.id for m in messages] == ["xjobs.E005"]
    assert "'direct_db'" in messages[0].msg
    monkeypatch.setitem(connections.settings, "lite",
                        {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"})
    with override_settings(XJOBS={"LISTEN_DATABASE": "lite"}):
        messages = xjobs_messages()
    assert [m.id for m in messages] == ["xjobs.E006"]
    assert "sqlite3" in messages[0].msg
    with override_settings(XJOBS={"LISTEN_DATABASE": "default"}):
        assert xjobs_messages() == []


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


def test_manage_py_check_lists_every_bad_xjobs_key():
    three_bad = {"LEASE": "soon", "NOTIFY": "yes", "QUEUES": []}
    with override_settings(XJOBS=three_bad):
        messages = xjobs_messages()
        with pytest.raises(SystemCheckError) as info:
            call_command("check", stdout=StringIO(), stderr=StringIO())
    assert [m.id for m in messages] == ["xjobs.E001"] * 3
    assert str(info.value).count("xjobs.E001") == 3
    for key in ("LEASE", "NOTIFY", "QUEUES"):
        assert len([m for m in messages if f'XJOBS["{key}"]' in m.msg]) == 1


# ------------------------------------------------------------------ the console's rangefilter --


def without(app: str) -> list[str]:
    from django.conf import settings

    return [a for a in settings.INSTALLED_APPS if a != app]


def test_rangefilter_missing_from_installed_apps_is_an_error_saying_the_fix():
    # Without it the console's jobs list fails with TemplateDoesNotExist at the first visit.
    with override_settings(INSTALLED_APPS=without("rangefilter")):
        messages = [m for m in checks.run_checks() if m.id == "xjobs.E004"]
        with pytest.raises(SystemCheckError, match=r"xjobs\.E004"):
            call_command("check", stdout=StringIO(), stderr=StringIO())
    assert len(messages) == 1 and messages[0].level == checks.ERROR
    assert '"rangefilter" is not in INSTALLED_APPS' in messages[0].msg
    assert 'INSTALLED_APPS += ["rangefilter", "django_xjobs"]' in messages[0].hint


def test_rangefilter_is_not_asked_for_without_the_admin_nor_by_the_worker():
    with override_settings(INSTALLED_APPS=[a for a in without("rangefilter")
                                           if a != "django.contrib.admin"]):
        assert [m for m in checks.run_checks() if m.id == "xjobs.E004"] == []
    with override_settings(INSTALLED_APPS=without("rangefilter")):
        # The worker runs the django_xjobs checks only: it renders no admin page.
        assert [m for m in xjobs_messages() if m.id == "xjobs.E004"] == []


# ------------------------------------------------------------------------------- hints --

# Every check of checks.py: the hint of each must say the fix and link the published docs.
CHECK_IDS = {
    "xjobs.E001", "xjobs.E002", "xjobs.E003", "xjobs.E004", "xjobs.E005", "xjobs.E006",
    "xjobs.E010", "xjobs.E011",
    "xjobs.E012", "xjobs.E013", "xjobs.E014", "xjobs.E020", "xjobs.E021", "xjobs.E040",
    "xjobs.W010", "xjobs.W020", "xjobs.W050",
}


def every_kind_of_check_message(monkeypatch) -> list[checks.CheckMessage]:
    from django.db import connections

    from django_xjobs import Concurrency, job, registry

    monkeypatch.setitem(connections.settings, "lite",
                        {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"})

    @job(name="t.hint_unlimited", concurrency=Concurrency(key="acct:{n}"))
    def unlimited(ctx, n):
        return n

    @job(name="t.hint_nightly", cron="0 3 * * *")
    def nightly(ctx):
        return None

    found: list[checks.CheckMessage] = []
    try:
        for xjobs in (
            {"LEASES": "30s", "NOTIFY": "yes"},
            {"DATABASE": "nowhere", "LISTEN_DATABASE": "nowhere"},
            {"DATABASE": "lite", "QUEUES": ["default"], "LISTEN_DATABASE": "lite",
             "OUTBOX": {"DATABASES": ["default", "lite", "nowhere"]},
             "SCHEDULE": {
                 "bad-cron": {"job": "testapp.noop", "cron": "every day"},
                 "bad-zone": {"job": "testapp.noop", "cron": "0 3 * * *",
                              "timezone": "Mars/Olympus"},
                 "no-job": {"job": "testapp.missing", "cron": "0 3 * * *"},
                 "bad-input": {"job": "testapp.noop", "cron": "0 3 * * *",
                               "input": {"x": float("nan")}},
                 "t.hint_nightly": {"job": "testapp.noop", "cron": "0 4 * * *"},
             }},
        ):
            with override_settings(XJOBS=xjobs):
                found += checks.run_checks(tags=["django_xjobs"])
        with override_settings(INSTALLED_APPS=without("rangefilter")):
            found += checks.run_checks(tags=[checks.Tags.admin])
    finally:
        registry.unregister("t.hint_unlimited")
        registry.unregister("t.hint_nightly")
    # xjobs.T*: the django.tasks backend's own checks (tasks/__init__.py), not this module's.
    return [m for m in found if m.id.startswith("xjobs.") and not m.id.startswith("xjobs.T")]


def test_every_hint_says_the_fix_and_links_the_published_docs(monkeypatch):
    from django_xjobs.conf import DOCS_URL
    from tests.unit.test_package_metadata import published_page_exists

    messages = every_kind_of_check_message(monkeypatch)
    assert {m.id for m in messages} == CHECK_IDS
    for m in messages:
        assert m.hint, m
        # A pip user has no docs/ directory: a page is named by its published address only.
        assert m.hint.count("docs/") == m.hint.count(DOCS_URL) == 1, m
        fix, _, page = m.hint.partition(DOCS_URL)
        assert len(fix.split()) >= 6, m  # words that say what to do, not only "see <link>"
        assert published_page_exists(DOCS_URL + page.split()[0].rstrip(".")), m
