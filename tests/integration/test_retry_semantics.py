"""What a job's code and its declaration decide about retries (docs/guide.md, "Retries"):
``raise Retry(delay)`` spends an attempt after its own delay, ``retry_on=`` retries only the
listed exceptions, and XJOBS["ROUTES"] picks the queue of a job that names none. Run by the
real worker loop on PostgreSQL."""

from __future__ import annotations

import logging
import sys
import types

import pytest
from django.test import override_settings

from django_xjobs import Retry, job, registry
from django_xjobs.apps import _discover_tasks_modules
from django_xjobs.exceptions import ConfigurationError
from django_xjobs.models import Job
from tests.integration.test_steps import running_worker, wait_state

pytestmark = pytest.mark.django_db(transaction=True)


class Busy(Exception):
    pass


@job(name="retrysem.partner", max_attempts=3)
def partner(ctx, answers_429_until: int):
    if ctx.attempt < answers_429_until:
        raise Retry(0) from Busy(f"429 on attempt {ctx.attempt}")
    return ctx.attempt


@job(name="retrysem.raised_bound", max_attempts=2)
def raised_bound(ctx):
    if ctx.attempt < 4:
        raise Retry(0, max_attempts=5)
    return ctx.attempt


@job(name="retrysem.bounded", max_attempts=10)
def bounded(ctx):
    raise Retry(0, max_attempts=2)


@job(name="retrysem.slow", timeout=0.2, retry_on=(KeyError,))
def slow(ctx):
    ctx.cancelled.wait(30)  # stopped at its timeout


@job(name="retrysem.listed", max_attempts=5, retry_on=(Busy,), retry_base=0.01,
     retry_cap=0.01)
def listed(ctx, error: str):
    raise (Busy if error == "busy" else KeyError)(f"{error} on attempt {ctx.attempt}")


def test_retry_spends_an_attempt_and_records_its_cause():
    ok = partner.enqueue(answers_429_until=3)
    forever = partner.enqueue(answers_429_until=99)
    with running_worker():
        done = wait_state(ok, "done")
        dead = wait_state(forever, "dead")
    assert (done.attempt, done.result) == (3, 3)
    assert dead.attempt == 3  # the job's max_attempts: a 429 for ever ends, unlike Snooze
    assert "Busy: 429 on attempt 3" in dead.last_error
    assert dead.last_error.startswith(f"exception-class: {__name__}.Busy")


def test_retry_with_its_own_bound_ends_the_job_at_that_attempt():
    handle = bounded.enqueue()
    with running_worker():
        dead = wait_state(handle, "dead")
    assert dead.attempt == 2


def test_retry_on_retries_only_the_listed_exceptions():
    busy = listed.enqueue(error="busy")
    other = listed.enqueue(error="other")
    with running_worker():
        busy_row = wait_state(busy, "dead")
        other_row = wait_state(other, "dead")
    assert busy_row.attempt == 5
    assert other_row.attempt == 1 and "KeyError" in other_row.last_error


def test_a_timeout_is_final_unless_retry_on_lists_timeout_error():
    handle = slow.enqueue()
    with running_worker():
        dead = wait_state(handle, "dead")
    assert dead.attempt == 1 and "TimeoutError" in dead.last_error


def test_retry_with_a_higher_bound_raises_the_jobs_own():
    handle = raised_bound.enqueue()
    with running_worker():
        done = wait_state(handle, "done")
    assert (done.attempt, done.max_attempts, done.result) == (4, 5, 4)


def test_retry_refuses_bad_arguments():
    with pytest.raises(TypeError):
        Retry("soon")
    with pytest.raises(ValueError):
        Retry(-1)
    with pytest.raises(TypeError):
        Retry(1, max_attempts=0)
    with pytest.raises(ConfigurationError, match="retry_on"):
        job(name="retrysem.bad_on", retry_on=("KeyError",))(lambda ctx: None)
    with pytest.raises(ConfigurationError, match="retry_jitter"):
        job(name="retrysem.bad_jitter", retry_jitter="no")(lambda ctx: None)


def test_routes_pick_the_queue_of_a_job_that_names_none():
    routed = job(name="reports.weekly")(lambda ctx: None)
    named = job(name="reports.daily", queue="own")(lambda ctx: None)
    try:
        with override_settings(XJOBS={"ROUTES": {"emails.*": "mail",
                                                 "reports.*": {"queue": "reports"}}}):
            assert (routed.queue, named.queue) == ("reports", "own")
            assert Job.objects.get(pk=routed.enqueue().id).queue == "reports"
            assert "reports" in registry.worked_queues()
        assert routed.queue == "default"
    finally:
        registry.unregister("reports.weekly")
        registry.unregister("reports.daily")


@pytest.mark.parametrize("routes, problem", [
    (["emails.*"], "must be a dict"),
    ({"emails.*": "bad queue!"}, "not valid"),
    ({"emails.*": {"queue": "mail", "exchange": "x"}}, "only the queue"),
    ({"": "mail"}, "non-empty"),
])
def test_bad_routes_are_refused_by_the_checks(routes, problem):
    from django_xjobs import conf

    with pytest.raises(ConfigurationError, match=problem):
        conf.build({"ROUTES": routes})


def test_tasks_modules_are_imported_and_another_queues_missing_package_is_skipped(
        caplog, monkeypatch, tmp_path):
    package = tmp_path / "celeryish"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "tasks.py").write_text("import celery  # noqa\n")
    (package / "apps.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    caplog.set_level(logging.WARNING, logger="django_xjobs")
    from django.apps import apps

    config = types.SimpleNamespace(name="celeryish", module=__import__("celeryish"))
    monkeypatch.setattr(apps, "get_app_configs", lambda: [config])
    monkeypatch.delitem(sys.modules, "celery", raising=False)
    _discover_tasks_modules()
    assert "skipped celeryish.tasks: it imports celery" in caplog.text
    (package / "tasks.py").write_text("import not_a_queue_package  # noqa\n")
    sys.modules.pop("celeryish.tasks", None)
    with pytest.raises(ModuleNotFoundError):
        _discover_tasks_modules()
