"""What ``django.tasks`` asks of a backend, point by point, checked on XJobsBackend.

The contract is Django's own code (``django/tasks/base.py``, ``backends/base.py`` and the
``ImmediateBackend`` it ships, whose results these tests expect wherever a worker can give the
same) and its documentation: Task and TaskResult attributes, validation, the four statuses,
errors, signals and their sender, the async variants, ``takes_context``, missing results and the
``supports_*`` flags. Tasks run in the real worker loop in this process (``drain``); signal
receivers are connected here, so the objects they were sent are compared directly. The same
signals from a worker subprocess are in tests/acceptance/test_django_tasks_worker.py.
Skipped on Django < 6.0, which has no ``django.tasks``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import pickle
import threading
import uuid
from datetime import datetime, timedelta

import pytest

pytest.importorskip("django.tasks", reason="django.tasks (and this backend) need Django 6.0+")

from django.db import transaction
from django.tasks import (
    DEFAULT_TASK_BACKEND_ALIAS,
    DEFAULT_TASK_QUEUE_NAME,
    Task,
    TaskContext,
    TaskResult,
    TaskResultStatus,
    default_task_backend,
    task,
    task_backends,
)
from django.tasks.exceptions import (
    InvalidTask,
    InvalidTaskBackend,
    TaskResultDoesNotExist,
    TaskResultMismatch,
)
from django.tasks.signals import task_enqueued, task_finished, task_started
from django.test import override_settings
from django.utils import timezone

from django_xjobs.models import Job
from django_xjobs.tasks import XJobsBackend, XJobsTask, declarations
from django_xjobs.testing import drain
from tests.testapp import tasks as t
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)

READY, RUNNING = TaskResultStatus.READY, TaskResultStatus.RUNNING
FAILED, SUCCESSFUL = TaskResultStatus.FAILED, TaskResultStatus.SUCCESSFUL
TASKS = {"default": {"BACKEND": "django_xjobs.tasks.XJobsBackend",
                     "QUEUES": ["default", "other"]}}


class Sent:
    """The (signal, sender, task_result) of every task signal about a task of tests.testapp,
    in the order sent, whichever thread sent it (the worker's threads, during ``drain``)."""

    def __init__(self) -> None:
        self.items: list[tuple[str, type, TaskResult]] = []
        self._lock = threading.Lock()
        self._receivers = []
        for name, signal in (("enqueued", task_enqueued), ("started", task_started),
                             ("finished", task_finished)):
            def receive(sender, task_result, _name=name, **kwargs):
                if task_result.task.func.__module__ == t.__name__:
                    with self._lock:
                        self.items.append((_name, sender, task_result))

            signal.connect(receive, weak=False)
            self._receivers.append((signal, receive))

    def of(self, result: TaskResult) -> list[tuple[str, type, TaskResult]]:
        with self._lock:
            return [item for item in self.items if item[2].id == result.id]

    def names(self, result: TaskResult) -> list[str]:
        return [name for name, _, _ in self.of(result)]

    def disconnect(self) -> None:
        for signal, receive in self._receivers:
            signal.disconnect(receive)


@pytest.fixture
def sent():
    recorder = Sent()
    yield recorder
    recorder.disconnect()


def ran(result: TaskResult) -> TaskResult:
    """``result`` after a worker ran every due task (one attempt: the tasks used here either
    succeed or have no attempt left when they fail)."""
    drain()
    result.refresh()
    return result


def same_error(sent_errors, stored_errors) -> bool:
    """The error a signal carried is the one get_result() reports: the same class, and the
    same traceback, but for the worker's frames above the task's (the signal is sent from the
    task's runner; the worker records the exception once it reached the worker)."""
    [sent], [stored] = sent_errors, stored_errors
    header = "Traceback (most recent call last):\n"
    return (sent.exception_class_path == stored.exception_class_path
            and sent.traceback.startswith(header) and stored.traceback.startswith(header)
            and stored.traceback.endswith(sent.traceback.removeprefix(header)))


# ------------------------------------------------------------------------------- backend --


def test_the_backend_supports_defer_async_get_result_and_priority():
    backend = task_backends[DEFAULT_TASK_BACKEND_ALIAS]
    assert type(backend) is XJobsBackend
    assert default_task_backend == backend  # the proxy of the default alias
    assert backend.alias == "default"
    assert backend.options == {}
    assert backend.queues == {"default", "other"}
    assert backend.task_class is XJobsTask
    assert (backend.supports_defer, backend.supports_async_task, backend.supports_get_result,
            backend.supports_priority) == (True, True, True, True)


# ---------------------------------------------------------------------------- the Task --


def test_a_task_has_the_attributes_django_documents():
    assert isinstance(t.add, Task) and isinstance(t.async_add, Task)
    assert t.add.func.__name__ == "add" and t.add.name == "add"
    assert t.add.module_path == "tests.testapp.tasks.add"
    assert (t.add.priority, t.add.queue_name, t.add.backend) == (0, DEFAULT_TASK_QUEUE_NAME,
                                                                 DEFAULT_TASK_BACKEND_ALIAS)
    assert t.add.run_after is None and t.add.takes_context is False
    assert t.with_context.takes_context is True
    assert t.add.get_backend() is task_backends["default"]
    assert t.add.call(2, 3) == 5
    assert asyncio.run(t.add.acall(2, 3)) == 5
    assert t.async_add.call(2, 3) == 5


def test_using_makes_a_new_task_and_leaves_the_original_alone():
    later = timezone.now() + timedelta(hours=1)
    copy = t.add.using()
    assert copy == t.add and copy is not t.add
    chained = t.add.using(run_after=later).using(priority=10).using(queue_name="other")
    assert (chained.run_after, chained.priority, chained.queue_name) == (later, 10, "other")
    assert (t.add.run_after, t.add.priority, t.add.queue_name) == (None, 0, "default")
    assert t.add.using(backend="immediate").get_backend() is task_backends["immediate"]


@pytest.mark.parametrize("priority", [-101, 101, 3.1])
def test_a_priority_outside_minus_100_to_100_or_not_whole_is_an_invalid_task(priority):
    with pytest.raises(InvalidTask, match="priority must be a whole number between -100 and 100"):
        t.add.using(priority=priority)
    for fine in (-100, 0, 100):
        assert t.add.using(priority=fine).priority == fine


def test_a_queue_the_backend_does_not_list_is_an_invalid_task():
    with pytest.raises(InvalidTask, match="Queue 'elsewhere' is not valid for backend"):
        t.add.using(queue_name="elsewhere")
    assert t.add.using(queue_name="other").queue_name == "other"


def test_run_after_must_be_aware_and_cannot_be_given_to_the_decorator():
    with pytest.raises(InvalidTask, match="run_after must be an aware datetime"):
        t.add.using(run_after=datetime(2030, 1, 1))
    aware = timezone.now() + timedelta(minutes=1)
    assert t.add.using(run_after=aware).run_after == aware
    with pytest.raises(TypeError, match="run_after cannot be defined statically"):
        task(run_after=aware)(t.undeclared)


def test_a_function_that_is_not_module_level_is_an_invalid_task():
    def nested(x):
        return x

    for function in (nested, lambda x: x, any):
        with pytest.raises(InvalidTask, match="Task function must be defined at a module level"):
            task(function)


def test_takes_context_needs_a_first_argument_named_context():
    with pytest.raises(InvalidTask, match="first argument of 'context'"):
        task(takes_context=True)(t.undeclared)
    assert declarations.declared("tests.testapp.tasks.undeclared") is None


def test_an_unknown_backend_is_an_invalid_task_backend():
    with pytest.raises(InvalidTaskBackend, match="'nowhere' doesn't exist"):
        t.add.using(backend="nowhere")


def test_enqueue_validates_the_task_again_and_writes_nothing_when_it_is_invalid(sent):
    on_other = t.add.using(queue_name="other")
    with override_settings(TASKS={"default": {**TASKS["default"], "QUEUES": ["default"]}}):
        with pytest.raises(InvalidTask, match="Queue 'other' is not valid for backend"):
            on_other.enqueue(1, 2)
        with pytest.raises(InvalidTask, match="Queue 'other' is not valid for backend"):
            asyncio.run(on_other.aenqueue(1, 2))
    assert Job.objects.count() == 0
    assert sent.items == []


def test_arguments_json_cannot_hold_raise_typeerror_and_write_nothing(sent):
    # A datetime, date, time, UUID or Decimal is accepted and kept exactly (docs/django-tasks.md;
    # tests/integration/test_typed_values.py); a set is not.
    with pytest.raises(TypeError, match="Unsupported type"):
        t.noop.enqueue({1, 2})
    with pytest.raises(TypeError, match="Unsupported type"):
        asyncio.run(t.noop.aenqueue({1, 2}))
    assert Job.objects.count() == 0
    assert sent.items == []


# ---------------------------------------------------------------------- the TaskResult --


def test_enqueue_returns_a_ready_result_equal_to_the_stored_one(sent):
    result = t.noop.enqueue(1, two=(3, 4))
    assert isinstance(result, TaskResult)
    assert isinstance(result.id, str) and uuid.UUID(result.id)
    assert result.task == t.noop
    assert result.status == READY and not result.is_finished
    assert result.args == [1] and result.kwargs == {"two": [3, 4]}
    assert result.backend == "default"
    assert result.started_at is result.last_attempted_at is result.finished_at is None
    assert result.errors == [] and result.worker_ids == [] and result.attempts == 0
    with pytest.raises(ValueError, match="Task has not finished yet"):
        _ = result.return_value
    # enqueued_at is the stored time, so the result is the one get_result() reads back.
    assert result.enqueued_at == Job.objects.get(pk=result.id).created_at
    assert t.noop.get_result(result.id) == result
    assert default_task_backend.get_result(result.id) == result
    assert asyncio.run(t.noop.aget_result(result.id)) == result


def test_refreshing_a_result_nothing_changed_changes_nothing():
    result = t.noop.enqueue()
    before = dataclasses.asdict(result)
    result.refresh()
    assert dataclasses.asdict(result) == before
    asyncio.run(result.arefresh())
    assert dataclasses.asdict(result) == before


def test_aenqueue_returns_the_stored_result_too():
    result = asyncio.run(t.noop.aenqueue(5))
    assert result.status == READY and result.args == [5] and result.task == t.noop
    assert asyncio.run(default_task_backend.aget_result(result.id)) == result
    before = dataclasses.asdict(result)
    asyncio.run(result.arefresh())
    assert dataclasses.asdict(result) == before


def test_a_copy_made_by_using_comes_back_from_get_result_with_its_options():
    later = timezone.now() + timedelta(hours=1)
    copy = t.add.using(priority=7, queue_name="other", run_after=later)
    result = copy.enqueue(1, 2)
    assert result.task == copy
    fetched = t.add.get_result(result.id)
    assert fetched.task == copy
    assert fetched == result


@pytest.mark.skipif(not hasattr(t.add, "enqueue_on_commit"),
                    reason="@task(...) builds the backend's task_class on Django 6.1+ only")
def test_enqueue_on_commit_returns_the_stored_result_too():
    with transaction.atomic():
        result = t.add.enqueue_on_commit(1, 2)
        inside = default_task_backend.get_result(result.id)
    assert result.enqueued_at is not None
    assert inside == result
    assert default_task_backend.get_result(result.id) == result
    before = dataclasses.asdict(result)
    result.refresh()
    assert dataclasses.asdict(result) == before

    later = timezone.now() + timedelta(hours=1)
    deferred = t.add.using(run_after=later).enqueue_on_commit(3, 4)
    assert deferred.task.run_after == later
    assert default_task_backend.get_result(deferred.id) == deferred


def test_tasks_and_results_survive_pickling():
    for declared in (t.add, t.flaky, t.add.using(priority=3, queue_name="other")):
        assert pickle.loads(pickle.dumps(declared)) == declared
    result = t.add.enqueue(1, 2)
    assert pickle.loads(pickle.dumps(result)) == result


def test_a_run_goes_ready_running_successful_with_its_times_and_value(sent):
    result = t.add.enqueue(20, 22)
    enqueued_at = result.enqueued_at
    ran(result)
    assert result.status == SUCCESSFUL and result.is_finished
    assert result.return_value == 42
    assert result.errors == [] and result.attempts == 1 and len(result.worker_ids) == 1
    assert result.enqueued_at == enqueued_at
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.last_attempted_at == result.started_at
    [(_, _, started), (_, _, finished)] = sent.of(result)[1:]
    assert started.status == RUNNING and started.started_at == result.started_at
    assert started.finished_at is None and started.worker_ids == result.worker_ids
    assert finished.status == SUCCESSFUL and finished.return_value == 42


def test_a_task_returning_none_is_successful_with_none():
    result = ran(t.noop.enqueue())
    assert result.status == SUCCESSFUL and result.return_value is None


def test_an_async_task_runs_like_a_sync_one():
    result = ran(t.async_add.enqueue(1, 2))
    assert result.status == SUCCESSFUL and result.return_value == 3 and result.attempts == 1


# --------------------------------------------------------------------------------- errors --


def test_a_failure_records_the_exception_class_and_the_whole_traceback():
    result = ran(t.boom.enqueue("the flux capacitor broke"))
    assert result.status == FAILED and result.is_finished
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value
    assert result.enqueued_at <= result.started_at <= result.finished_at
    [error] = result.errors
    assert error.exception_class_path == "tests.testapp.tasks.TaskBoom"
    assert error.exception_class is t.TaskBoom
    # As Django's backends keep it: "".join(traceback.format_exception(exc)), final newline
    # included.
    assert error.traceback.startswith("Traceback (most recent call last):\n")
    assert error.traceback.endswith("tests.testapp.tasks.TaskBoom: the flux capacitor broke\n")


@pytest.mark.parametrize(("declared", "kind", "ending"), [
    (t.exits, SystemExit, "SystemExit: goodbye\n"),
    (t.interrupted, KeyboardInterrupt, "KeyboardInterrupt: goodbye\n"),
    (t.async_exits, SystemExit, "SystemExit: goodbye\n"),
], ids=["system-exit", "keyboard-interrupt", "async-system-exit"])
def test_systemexit_and_keyboardinterrupt_fail_the_task_and_finish_it(sent, declared, kind,
                                                                      ending):
    result = ran(declared.enqueue("goodbye"))
    assert result.status == FAILED
    [error] = result.errors
    assert error.exception_class is kind
    assert error.traceback.startswith("Traceback (most recent call last):\n")
    assert error.traceback.endswith(ending)
    assert sent.names(result) == ["enqueued", "started", "finished"]
    _, sender, finished = sent.of(result)[-1]
    assert sender is XJobsBackend
    assert finished.status == FAILED
    assert [e.exception_class for e in finished.errors] == [kind]


def test_an_exception_group_is_recorded_as_its_own_class():
    result = ran(t.raises_group.enqueue("several things broke"))
    [error] = result.errors
    assert error.exception_class is ExceptionGroup
    assert "several things broke (2 sub-exceptions)" in error.traceback
    assert "TaskBoom: inside the group" in error.traceback


def test_a_message_holding_another_traceback_does_not_change_the_class():
    result = ran(t.raises_traceback_text.enqueue("quoted"))
    [error] = result.errors
    assert error.exception_class is t.TaskBoom
    assert error.traceback.endswith("KeyError: not the class raised\n")


def test_an_exception_wrapping_an_exception_is_recorded_as_the_outer_class():
    result = ran(t.raises_nested.enqueue("This task failed"))
    [error] = result.errors
    assert error.exception_class is ValueError
    assert "ValueError(ValueError(message))" in error.traceback
    assert error.traceback.endswith("ValueError: This task failed\n")


def test_a_return_value_json_cannot_hold_is_the_encoder_s_typeerror_and_is_not_retried(sent):
    result = ran(t.bad_return.enqueue())
    assert result.status == FAILED
    [error] = result.errors
    assert error.exception_class is TypeError
    assert "Unsupported type" in error.traceback
    assert error.traceback.endswith("\n")
    # The task ran; running it again cannot change what it returns.
    assert result.attempts == 1 and Job.objects.get(pk=result.id).max_attempts == 3
    _, _, finished = sent.of(result)[-1]
    assert finished.status == FAILED
    assert same_error(finished.errors, result.errors)


def test_a_return_value_over_the_payload_limit_fails_the_task_for_good(sent, settings):
    result = t.add.enqueue("x" * 600, "y" * 600)
    settings.XJOBS = {**settings.XJOBS, "MAX_PAYLOAD_BYTES": 1000}
    result = ran(result)
    assert result.status == FAILED
    [error] = result.errors
    assert error.exception_class_path == "django_xjobs.exceptions.PayloadTooLarge"
    assert ("return value of tests.testapp.tasks.add is 1202 bytes as JSON, over "
            "XJOBS['MAX_PAYLOAD_BYTES'] = 1000") in error.traceback
    assert result.attempts == 1 and Job.objects.get(pk=result.id).result is None
    _, _, finished = sent.of(result)[-1]
    assert finished.status == FAILED
    assert same_error(finished.errors, result.errors)


# -------------------------------------------------------------------------------- signals --


def test_each_signal_is_sent_once_by_the_backend_class_with_the_result_of_the_moment(sent):
    result = t.add.enqueue(2, 2)
    [(name, sender, enqueued)] = sent.of(result)
    assert (name, sender) == ("enqueued", XJobsBackend)
    assert enqueued == result
    ran(result)
    assert sent.names(result) == ["enqueued", "started", "finished"]
    assert {sender for _, sender, _ in sent.of(result)} == {XJobsBackend}
    [_, (_, _, started), (_, _, finished)] = sent.of(result)
    assert (started.status, started.attempts) == (RUNNING, 1)
    assert (finished.status, finished.attempts) == (SUCCESSFUL, 1)
    assert finished.finished_at is not None


def test_a_failure_finishes_the_task_with_its_error_in_the_signal(sent):
    result = ran(t.boom.enqueue("no"))
    _, sender, finished = sent.of(result)[-1]
    assert sender is XJobsBackend
    assert finished.status == FAILED
    assert same_error(finished.errors, result.errors)


def test_django_s_task_logger_records_enqueue_start_and_failure_with_the_exception(caplog):
    caplog.set_level(logging.DEBUG, logger="django.tasks")
    result = ran(t.boom.enqueue("logged"))
    lines = [r for r in caplog.records if r.name == "django.tasks" and result.id in r.getMessage()]
    assert ["enqueued" in lines[0].getMessage(), "state=RUNNING" in lines[1].getMessage(),
            "state=FAILED" in lines[2].getMessage()] == [True, True, True]
    assert lines[2].levelno == logging.ERROR
    assert lines[2].exc_info and lines[2].exc_info[0] is t.TaskBoom


# ---------------------------------------------------------------------------- the context --


def test_a_task_taking_context_gets_a_task_context_first():
    result = ran(t.with_context.enqueue(7))
    seen = result.return_value
    assert seen["id"] == result.id and seen["attempt"] == 1
    assert seen["status"] == RUNNING and seen["worker_ids"] == result.worker_ids
    assert seen["x"] == 7 and seen["args"] == [7]
    assert TaskContext(task_result=result).attempt == result.attempts


# ------------------------------------------------------------------------------- results --


def test_an_unknown_result_id_does_not_exist_sync_or_async():
    for result_id in (str(uuid.uuid4()), "123", ""):
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(result_id)
        with pytest.raises(TaskResultDoesNotExist):
            asyncio.run(default_task_backend.aget_result(result_id))
        with pytest.raises(TaskResultDoesNotExist):
            t.add.get_result(result_id)


def test_the_result_of_another_task_is_a_mismatch_sync_or_async():
    result = t.async_add.enqueue(1, 1)
    with pytest.raises(TaskResultMismatch, match="Task does not match"):
        t.add.get_result(result.id)
    with pytest.raises(TaskResultMismatch, match="Task does not match"):
        asyncio.run(t.add.aget_result(result.id))


def test_a_stale_result_is_brought_up_to_date_by_refresh_and_arefresh():
    first, second = t.add.enqueue(1, 1), t.add.enqueue(2, 2)
    drain()
    first.refresh()
    asyncio.run(second.arefresh())
    assert (first.status, first.return_value) == (SUCCESSFUL, 2)
    assert (second.status, second.return_value) == (SUCCESSFUL, 4)
    assert Effect.objects.filter(kind="signal:finished").count() == 2
