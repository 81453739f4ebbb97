"""The ``django.tasks`` public API on django_xjobs.tasks.XJobsBackend, with real workers.

Only ``django.tasks`` is used to enqueue and to read results; tasks run in the real worker loop
in this process (``django_xjobs.testing.drain``). What the tasks and the signal receivers of
tests/testapp/tasks.py did is read from their ``Effect`` rows. A worker subprocess runs them in
tests/acceptance/test_django_tasks_worker.py; backend specifics are in
test_django_tasks_backend.py. Skipped on Django < 6.0, which has no ``django.tasks``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import timedelta

import pytest

pytest.importorskip("django.tasks", reason="django.tasks (and this backend) need Django 6.0+")

from django.tasks import TaskResultStatus, default_task_backend, task_backends
from django.tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
from django.utils import timezone

from django_xjobs.tasks import XJobsBackend
from django_xjobs.testing import drain
from tests.testapp import tasks as t
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)

READY, RUNNING = TaskResultStatus.READY, TaskResultStatus.RUNNING
FAILED, SUCCESSFUL = TaskResultStatus.FAILED, TaskResultStatus.SUCCESSFUL


def drain_until_finished(result, timeout: float = 30.0, **drain_options):
    """Drain (a retry may become due a moment later) until the task is finished."""
    deadline = time.monotonic() + timeout
    while True:
        drain(**drain_options)
        result.refresh()
        if result.is_finished:
            return result
        if time.monotonic() >= deadline:
            pytest.fail(f"task {result.id} is still {result.status} after {timeout}s")
        time.sleep(0.05)  # the poll interval: a retry may be due a moment later


def signals(result) -> list[tuple[str, str, int]]:
    """(signal, "STATUS|error classes", attempts) as the receivers saw them, in order."""
    rows = Effect.objects.filter(job_id=result.id, kind__startswith="signal:").order_by("id")
    return [(r.kind.removeprefix("signal:"), r.tag, r.attempt) for r in rows]


def calls() -> list[str]:
    return list(Effect.objects.filter(kind="task-call").order_by("id").values_list("tag",
                                                                                    flat=True))


# ------------------------------------------------------------------------------ backend --


def test_the_configured_backend_declares_what_it_supports():
    backend = task_backends["default"]
    assert isinstance(backend, XJobsBackend)
    assert backend.supports_defer and backend.supports_async_task
    assert backend.supports_get_result and backend.supports_priority


# ---------------------------------------------------------------------------- lifecycle --


def test_an_enqueued_task_is_ready_until_a_worker_runs_it_then_successful_with_its_value():
    result = t.add.enqueue(2, 3)
    assert result.status == READY
    assert not result.is_finished
    assert result.args == [2, 3] and result.kwargs == {}
    assert result.backend == "default"
    assert result.task.func is t.add.func
    with pytest.raises(ValueError, match="not finished"):
        _ = result.return_value

    fetched = t.add.get_result(result.id)
    assert fetched.id == result.id
    assert fetched.status == READY
    assert fetched.enqueued_at is not None
    assert fetched.started_at is None and fetched.finished_at is None
    assert fetched.attempts == 0 and fetched.worker_ids == []

    drain()
    result.refresh()
    assert result.status == SUCCESSFUL
    assert result.is_finished
    assert result.return_value == 5
    assert result.errors == []
    assert result.attempts == 1 and len(result.worker_ids) == 1
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.last_attempted_at == result.started_at


def test_a_task_that_raises_is_failed_with_the_exception_class_and_traceback():
    result = t.boom.enqueue("the flux capacitor broke")
    drain()
    result.refresh()
    assert result.status == FAILED
    assert result.is_finished and result.finished_at is not None
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value
    [error] = result.errors
    assert error.exception_class_path == "tests.testapp.tasks.TaskBoom"
    assert error.exception_class is t.TaskBoom
    assert error.traceback.startswith("Traceback (most recent call last):")
    assert "the flux capacitor broke" in error.traceback
    assert "in boom" in error.traceback
    assert result.attempts == 1


def test_a_failed_attempt_with_a_retry_pending_is_ready_again_and_carries_its_error():
    result = t.fails_then_waits.enqueue("first try")
    drain()  # the retry is 15-30 s away: this drain runs the first attempt only
    result.refresh()
    assert result.status == READY
    assert not result.is_finished and result.finished_at is None
    assert result.attempts == 1
    assert result.started_at is not None
    [error] = result.errors
    assert error.exception_class is RuntimeError
    assert "first try" in error.traceback


def test_a_task_retried_until_it_succeeds_counts_every_attempt():
    result = drain_until_finished(t.flaky.enqueue(fail_times=1))
    assert result.status == SUCCESSFUL
    assert result.return_value == {"succeeded_on": 2}
    assert result.attempts == 2
    # The failure of attempt 1 stays on record: errors are what running the task raised.
    assert [e.exception_class for e in result.errors] == [RuntimeError]


def test_a_return_value_json_cannot_hold_fails_the_task_for_good():
    result = t.bad_return.enqueue()
    drain()
    result.refresh()
    assert result.status == FAILED
    [error] = result.errors
    assert error.exception_class_path == "builtins.TypeError"  # normalize_json's, as Django's
    assert "Unsupported type" in error.traceback
    assert result.attempts == 1  # of 3: not retried


def test_arguments_are_stored_as_json_like_every_django_tasks_backend_does():
    result = t.with_context.enqueue((1, 2))
    assert result.args == [[1, 2]]
    drain()
    result.refresh()
    assert result.return_value["args"] == [[1, 2]]
    with pytest.raises(TypeError, match="Unsupported type"):
        t.add.enqueue(object(), 1)


# ----------------------------------------------------------------------------- ordering --


def test_higher_priority_runs_first():
    for priority, label in [(-100, "lowest"), (0, "middle"), (100, "highest"), (50, "high"),
                            (-5, "low")]:
        assert t.record.using(priority=priority).enqueue(label).task.priority == priority
    drain(concurrency=1, prefetch=0)  # one task claimed at a time: the claim order is visible
    assert calls() == ["highest", "high", "middle", "low", "lowest"]


def test_a_task_runs_no_earlier_than_its_run_after():
    later = timezone.now() + timedelta(hours=1)
    waiting = t.record.using(run_after=later).enqueue("later")
    soon = timezone.now() + timedelta(seconds=1)
    due_soon = t.add.using(run_after=soon).enqueue(1, 1)

    result = drain_until_finished(due_soon)
    assert result.return_value == 2
    assert result.started_at >= soon
    assert result.task.run_after == soon

    waiting.refresh()
    assert waiting.status == READY and waiting.started_at is None
    assert waiting.task.run_after == later
    assert "later" not in calls()


def test_a_task_runs_only_in_a_worker_of_its_queue():
    declared = t.on_other_queue.enqueue()
    moved = t.add.using(queue_name="other").enqueue(4, 4)
    drain(queues=["default"])
    assert t.on_other_queue.get_result(declared.id).status == READY
    assert t.add.get_result(moved.id).status == READY

    drain(queues=["other"])
    assert t.on_other_queue.get_result(declared.id).return_value == "other"
    moved.refresh()
    assert moved.return_value == 8
    assert moved.task.queue_name == "other"


# ------------------------------------------------------------------------ async, context --


def test_an_async_task_runs_and_returns_its_value():
    result = t.async_add.enqueue(20, 22)
    drain()
    result.refresh()
    assert result.status == SUCCESSFUL
    assert result.return_value == 42


def test_an_async_task_that_raises_is_failed_with_its_exception():
    result = t.async_boom.enqueue("async trouble")
    drain()
    result.refresh()
    assert result.status == FAILED
    [error] = result.errors
    assert error.exception_class is t.TaskBoom
    assert "async trouble on attempt 1" in error.traceback


def test_a_task_taking_context_sees_its_own_result_id_attempt_and_worker():
    result = t.with_context.enqueue(7)
    drain()
    result.refresh()
    seen = result.return_value
    assert seen["id"] == result.id
    assert seen["attempt"] == 1
    assert seen["worker_ids"] == result.worker_ids
    assert seen["status"] == RUNNING
    assert seen["x"] == 7 and seen["args"] == [7]


# ---------------------------------------------------------------------------- get_result --


def test_results_are_readable_through_the_backend_and_asynchronously():
    result = t.add.enqueue(1, 2)
    drain()
    by_backend = default_task_backend.get_result(result.id)
    assert by_backend.status == SUCCESSFUL and by_backend.return_value == 3

    fetched = asyncio.run(t.add.aget_result(result.id))
    assert fetched.status == SUCCESSFUL and fetched.return_value == 3
    assert fetched.worker_ids == by_backend.worker_ids
    assert fetched.finished_at == by_backend.finished_at

    stale = t.add.enqueue(5, 5)
    drain()
    asyncio.run(stale.arefresh())
    assert stale.return_value == 10


def test_a_task_can_be_enqueued_from_async_code():
    result = asyncio.run(t.add.aenqueue(3, 4))
    assert result.status == READY
    drain()
    assert t.add.get_result(result.id).return_value == 7


def test_an_unknown_result_id_does_not_exist():
    for result_id in (str(uuid.uuid4()), "not-a-uuid", ""):
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(result_id)
    with pytest.raises(TaskResultDoesNotExist):
        asyncio.run(t.add.aget_result(str(uuid.uuid4())))


def test_a_result_of_another_task_is_a_mismatch():
    result = t.add.enqueue(1, 1)
    with pytest.raises(TaskResultMismatch):
        t.record.get_result(result.id)


# ------------------------------------------------------------------------------- signals --


def test_enqueued_started_and_finished_are_sent_with_the_result_of_the_moment():
    result = t.add.enqueue(2, 2)
    assert signals(result) == [("enqueued", "READY|", 0)]
    drain()
    assert signals(result) == [
        ("enqueued", "READY|", 0), ("started", "RUNNING|", 1), ("finished", "SUCCESSFUL|", 1),
    ]


def test_a_failure_is_finished_once_when_no_attempt_is_left():
    failed = t.boom.enqueue("no")
    drain()
    assert signals(failed)[1:] == [
        ("started", "RUNNING|", 1), ("finished", "FAILED|tests.testapp.tasks.TaskBoom", 1),
    ]

    retried = drain_until_finished(t.flaky.enqueue(fail_times=1))
    # Attempt 1 failed with a retry left: the task was not finished, so no task_finished.
    assert signals(retried)[1:] == [
        ("started", "RUNNING|", 1),
        ("started", "RUNNING|builtins.RuntimeError", 2),
        ("finished", "SUCCESSFUL|builtins.RuntimeError", 2),
    ]

    pending = t.fails_then_waits.enqueue("again")
    drain()
    assert signals(pending)[1:] == [("started", "RUNNING|", 1)]


def test_an_async_task_sends_the_same_signals():
    result = t.async_add.enqueue(1, 1)
    failed = t.async_boom.enqueue("x")
    drain()
    assert [s[:2] for s in signals(result)] == [
        ("enqueued", "READY|"), ("started", "RUNNING|"), ("finished", "SUCCESSFUL|"),
    ]
    assert signals(failed)[-1] == ("finished", "FAILED|tests.testapp.tasks.TaskBoom", 1)


# ------------------------------------------------------------------------ enqueue_on_commit --


@pytest.mark.skipif(not hasattr(t.add, "enqueue_on_commit"),
                    reason="@task(...) builds the backend's task_class on Django 6.1+ only")
def test_a_task_enqueued_on_commit_exists_only_if_the_transaction_commits():
    from django.db import transaction

    with transaction.atomic():
        kept = t.add.enqueue_on_commit(20, 22)
        assert kept.status == READY and kept.args == [20, 22]
        assert signals(kept) == []  # enqueued is sent on commit, not before
    with pytest.raises(RuntimeError), transaction.atomic():
        dropped = t.add.enqueue_on_commit(1, 1)
        raise RuntimeError("roll back")
    assert signals(kept) == [("enqueued", "READY|", 0)]
    assert signals(dropped) == []
    # Committed, not relayed yet: the result is READY, read from the outbox.
    staged = default_task_backend.get_result(kept.id)
    assert staged.status == READY and staged.args == [20, 22]
    drain()
    kept.refresh()
    assert kept.status == SUCCESSFUL and kept.return_value == 42
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(dropped.id)
