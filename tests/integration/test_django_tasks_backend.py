"""django_xjobs.tasks.XJobsBackend beyond the ``django.tasks`` API: what a task becomes in
``x_jobs``, the options ``@task`` forwards to ``XJobsTask``, idempotency keys, cancellation,
bad input, settings and checks. Skipped on Django < 6.0, which has no ``django.tasks``."""

from __future__ import annotations

import math
from datetime import datetime, timedelta

import pytest

pytest.importorskip("django.tasks", reason="django.tasks (and this backend) need Django 6.0+")

from django.tasks import TaskResultStatus, task, task_backends
from django.tasks.exceptions import InvalidTask, InvalidTaskBackend, TaskResultDoesNotExist
from django.test import override_settings
from django.utils import timezone

from django_xjobs import api, registry, slots
from django_xjobs.exceptions import InvalidJobInput, JobCancelled, PayloadTooLarge
from django_xjobs.models import Job
from django_xjobs.tasks import XJobsBackend, XJobsTask, declarations
from django_xjobs.testing import drain
from tests.testapp import jobs as testapp_jobs
from tests.testapp import tasks as t
from tests.testapp.models import Effect

FAILED, READY = TaskResultStatus.FAILED, TaskResultStatus.READY
TASKS = {"default": {"BACKEND": "django_xjobs.tasks.XJobsBackend", "QUEUES": ["default"]}}


def module_level(x):
    """A module-level function of a module that is no installed app's."""
    return x


@pytest.fixture
def declare():
    """Declare tests.testapp.tasks.undeclared as a task with the given options; forget it
    afterwards, so no other test sees it."""
    path = "tests.testapp.tasks.undeclared"

    def make(**options):
        return XJobsTask(func=t.undeclared, **options)

    yield make
    declarations.forget(path)


# ------------------------------------------------------------------------- what is stored --


@pytest.mark.django_db
def test_a_task_is_a_job_named_by_its_path_with_its_call_as_input():
    result = t.add.using(priority=-42).enqueue(2, b=3)
    row = Job.objects.get(pk=result.id)
    assert row.name == "tests.testapp.tasks.add"
    assert row.input == {"args": [2], "kwargs": {"b": 3}, "backend": "default"}
    assert row.priority == -42  # the same scale: higher runs first
    assert row.queue == "default"
    assert row.max_attempts == 3  # XJOBS["MAX_ATTEMPTS"] in the test settings
    assert row.state == "ready" and row.worker_ids == []


@pytest.mark.django_db
def test_run_after_is_the_row_s_run_at_and_a_delayed_state():
    later = timezone.now() + timedelta(hours=2)
    result = t.add.using(run_after=later).enqueue(1, 2)
    row = Job.objects.get(pk=result.id)
    assert row.state == "delayed" and row.run_at == later
    assert row.input["run_after"] == later.isoformat()


@pytest.mark.django_db(transaction=True)
def test_an_enqueue_inside_a_rolled_back_transaction_leaves_no_task():
    from django.db import transaction

    with pytest.raises(RuntimeError), transaction.atomic():
        result = t.add.enqueue(1, 1)
        raise RuntimeError("roll back")
    with pytest.raises(TaskResultDoesNotExist):
        t.add.get_result(result.id)


@pytest.mark.django_db
def test_bad_arguments_raise_before_anything_is_written():
    with pytest.raises(TypeError):
        t.add.enqueue(object(), 1)
    with pytest.raises(InvalidJobInput, match="NaN"):
        t.add.enqueue(math.nan, 1)
    with pytest.raises(InvalidJobInput, match="non-string key"):
        t.add.enqueue({1: "a"}, 1)
    with override_settings(XJOBS={"MAX_PAYLOAD_BYTES": 100}), pytest.raises(PayloadTooLarge):
        t.add.enqueue("x" * 200, 1)
    with pytest.raises(InvalidTask, match="aware"):
        t.add.using(run_after=datetime(2030, 1, 1))
    assert Job.objects.count() == 0
    assert not Effect.objects.exists()  # no task_enqueued either


@pytest.mark.django_db
def test_a_job_row_is_not_a_task_result():
    handle = testapp_jobs.noop.enqueue()
    with pytest.raises(TaskResultDoesNotExist, match="not a task of this backend"):
        task_backends["default"].get_result(str(handle.id))


# -------------------------------------------------------------------------------- options --


def test_task_forwards_xjobs_options_to_the_task_and_to_the_worker_s_definition():
    assert isinstance(t.flaky, XJobsTask)
    assert (t.flaky.max_attempts, t.flaky.retry_base, t.flaky.retry_cap) == (3, 0.01, 0.02)
    definition = registry.lookup("tests.testapp.tasks.flaky")
    assert definition is not None and definition.max_attempts == 3
    assert (definition.retry.base, definition.retry.cap) == (0.01, 0.02)
    assert registry.lookup("tests.testapp.tasks.async_add").is_async


@pytest.mark.parametrize(("timeout", "seconds"), [("2m", 120.0), (timedelta(seconds=3), 3.0),
                                                  (1.5, 1.5), ("250ms", 0.25)])
def test_a_timeout_is_read_like_job_s_and_applied_by_the_worker(declare, timeout, seconds):
    assert declare(timeout=timeout).timeout == seconds
    assert registry.lookup("tests.testapp.tasks.undeclared").timeout == seconds


@pytest.mark.parametrize(("options", "fragment"), [
    ({"max_attempts": 0}, "max_attempts"),
    ({"max_attempts": True}, "max_attempts"),
    ({"timeout": 0}, "timeout"),
    ({"timeout": "soon"}, "timeout"),
    ({"timeout": -1}, "timeout"),
    ({"retry_base": "10s", "retry_cap": "1s"}, "retry_cap"),
    ({"idempotency_key": 5}, "idempotency_key"),
    ({"idempotency_key": ""}, "idempotency_key"),
    ({"concurrency": "slots"}, "concurrency"),
])
def test_a_bad_option_is_an_invalid_task_at_decoration_time(declare, options, fragment):
    with pytest.raises(InvalidTask, match=fragment):
        declare(**options)
    assert declarations.declared("tests.testapp.tasks.undeclared") is None


def test_an_unknown_option_is_refused_by_the_decorator():
    with pytest.raises(TypeError, match="max_retries"):
        task(max_retries=3)(t.undeclared)


def test_a_task_outside_installed_apps_is_refused_at_decoration_time():
    with pytest.raises(InvalidTask, match="installed app"):
        task(module_level)
    assert registry.lookup(f"{__name__}.module_level") is None


def test_a_copy_cannot_change_what_the_worker_applies(declare):
    declared = declare(timeout=5)
    assert declared.using(priority=3, max_attempts=7).timeout == 5
    with pytest.raises(InvalidTask, match="already declared"):
        declare(timeout=6)


def test_concurrency_reaches_the_job_registry_s_extension(declare):
    seen = []
    registry.register_option("concurrency", seen.append)
    try:
        declared = declare(concurrency="user:{kwargs[user_id]}")
    finally:
        registry.register_option("concurrency", slots.check_option)
    assert declared.concurrency == "user:{kwargs[user_id]}"
    [definition] = [d for d in seen if d.name == "tests.testapp.tasks.undeclared"]
    assert definition.options["concurrency"] == "user:{kwargs[user_id]}"


@pytest.mark.django_db(transaction=True)
def test_max_attempts_per_enqueue_and_from_the_backend_options():
    once = t.fails_then_waits.using(max_attempts=1).enqueue("only once")
    drain()
    once.refresh()
    assert once.status == FAILED and once.attempts == 1

    with override_settings(TASKS={"default": {**TASKS["default"],
                                              "OPTIONS": {"MAX_ATTEMPTS": 1}}}):
        result = t.fails.enqueue("backend default")
        assert Job.objects.get(pk=result.id).max_attempts == 1
        declared = t.fails_then_waits.enqueue("declared wins")
        assert Job.objects.get(pk=declared.id).max_attempts == 2
        drain()
        result.refresh()
    assert result.status == FAILED and result.attempts == 1


@pytest.mark.parametrize("options", [{"NOPE": 1}, {"MAX_ATTEMPTS": 0}, {"MAX_ATTEMPTS": "3"},
                                     ["MAX_ATTEMPTS"]])
def test_bad_backend_options_are_refused_when_the_backend_is_built(options):
    with pytest.raises(InvalidTaskBackend, match="OPTIONS"):
        XJobsBackend("x", {"BACKEND": "django_xjobs.tasks.XJobsBackend", "OPTIONS": options})


def test_a_queue_name_that_cannot_be_a_job_queue_is_an_invalid_task():
    with override_settings(TASKS={"default": {**TASKS["default"], "QUEUES": []}}), \
            pytest.raises(InvalidTask, match="queue_name"):
        t.add.using(queue_name="no spaces")


# ------------------------------------------------------------------------ idempotency key --


@pytest.mark.django_db(transaction=True)
def test_an_idempotency_key_returns_the_live_task_instead_of_a_second_one():
    first = t.charge.enqueue(7)
    again = t.charge.enqueue(7)
    other = t.charge.enqueue(8)
    assert again.id == first.id and other.id != first.id
    assert Effect.objects.filter(kind="signal:enqueued").count() == 2  # not for the duplicate
    assert Job.objects.get(pk=first.id).idempotency_key == "order:7"
    drain()
    assert t.charge.get_result(first.id).return_value == {"charged": 7}
    # Finished, the key is free again: the same work can run again another day.
    assert t.charge.enqueue(7).id != first.id
    assert t.add.using(idempotency_key="k").enqueue(1, 1).id == \
        t.add.using(idempotency_key="k").enqueue(2, 2).id


@pytest.mark.django_db
def test_an_idempotency_key_function_must_return_a_string():
    with pytest.raises(InvalidJobInput, match="idempotency_key"):
        t.add.using(idempotency_key=lambda a, b: a + b).enqueue(1, 2)
    assert Job.objects.count() == 0


# ---------------------------------------------------------------------------- cancellation --


@pytest.mark.django_db(transaction=True)
def test_a_cancelled_task_is_failed_with_an_error_naming_the_cancellation():
    result = t.add.enqueue(1, 1)
    api.cancel(result.id, reason="customer left")
    drain()
    result.refresh()
    assert result.status == FAILED and result.is_finished
    [error] = result.errors
    assert error.exception_class is JobCancelled
    assert "customer left" in error.traceback
    assert result.attempts == 0  # it never ran


# --------------------------------------------------------------------------------- checks --


def test_the_backend_checks_the_app_the_queue_names_and_the_queues_workers_run():
    assert task_backends["default"].check() == []  # every queue a job names is worked
    with override_settings(XJOBS={"QUEUES": ["default"]}):
        messages = task_backends["default"].check()
    assert [m.id for m in messages] == ["xjobs.T003"]  # "other" is not in XJOBS["QUEUES"]
    assert "'other'" in messages[0].msg

    with override_settings(TASKS={"default": {**TASKS["default"], "QUEUES": ["default", "a b"]}}):
        assert [m.id for m in task_backends["default"].check()] == ["xjobs.T002"]
    with override_settings(XJOBS={"QUEUES": ["default", "other"]}):
        assert task_backends["default"].check() == []
    with override_settings(INSTALLED_APPS=["tests.testapp"]):
        assert "xjobs.T001" in [m.id for m in task_backends["default"].check()]


def test_every_backend_check_hint_says_the_fix_and_links_the_published_docs():
    from django_xjobs.conf import DOCS_URL

    found = []
    with override_settings(XJOBS={"QUEUES": ["default"]}):
        found += task_backends["default"].check()
    with override_settings(TASKS={"default": {**TASKS["default"], "QUEUES": ["default", "a b"]}}):
        found += task_backends["default"].check()
    with override_settings(INSTALLED_APPS=["tests.testapp"]):
        found += task_backends["default"].check()
    assert {m.id for m in found} == {"xjobs.T001", "xjobs.T002", "xjobs.T003"}
    for m in found:
        assert m.hint and m.hint.count(DOCS_URL + "django-tasks.md") == 1, m
        assert len(m.hint.partition(DOCS_URL)[0].split()) >= 6, m


def test_the_backend_is_built_and_declares_tasks_without_the_database(declare):
    # No django_db mark: pytest-django fails any query this test makes.
    backend = XJobsBackend("fresh", {"QUEUES": ["default"], "OPTIONS": {"MAX_ATTEMPTS": 2}})
    assert backend.max_attempts == 2 and backend.queues == {"default"}
    declare(max_attempts=2)
    assert declarations.declared("tests.testapp.tasks.undeclared") is not None


# ---------------------------------------------------------------------- early declarations --

EARLY = """
import django
from django.tasks import task
from django_xjobs import registry
from django_xjobs.tasks import declarations
import {module} as early_module

declared = task(early_module.early)  # the app registry is not ready: the declaration waits
assert declarations.declared("{module}.early") is None
django.setup()  # AppConfig.ready finishes it
assert declarations.declared("{module}.early") is declared, "not declared at ready()"
assert registry.lookup("{module}.early") is not None, "not registered for workers"
print("declared")
"""


@pytest.mark.parametrize(("module", "outcome"), [
    ("tests.testapp.early", "declared"),
    ("tests.outside_apps", "is not in an installed app's module"),
])
def test_a_task_declared_before_the_app_registry_is_ready_is_checked_at_startup(module, outcome):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-c", EARLY.format(module=module)], cwd=root,
                          env=env, capture_output=True, text=True, timeout=120)
    assert outcome in done.stdout + done.stderr, done.stdout + done.stderr
