"""``django.tasks`` tasks in real ``xjobs_worker`` subprocesses: results, signals sent by the
worker, one attempt per claim in ``worker_ids``, and rows naming code that is not a task of
this backend. Results are read through ``django.tasks``; what the worker's tasks and signal
receivers did, from the ``Effect`` rows they write (tests/testapp/tasks.py).
Skipped on Django < 6.0, which has no ``django.tasks``."""

from __future__ import annotations

import json
import os
import signal
import uuid

import pytest

pytest.importorskip("django.tasks", reason="django.tasks (and this backend) need Django 6.0+")

from django.tasks import TaskResultStatus, default_task_backend
from django.tasks.exceptions import TaskResultDoesNotExist

from tests.conftest import wait_until
from tests.leases import lapse_worker

from .conftest import SETTLE, effects, wait_effect, wait_given_back

pytestmark = pytest.mark.acceptance

FINISHED = ("done", "dead", "cancelled")
BACKEND = "django_xjobs.tasks.XJobsBackend"


def wait_finished(result, timeout: float = SETTLE):
    def finished():
        result.refresh()
        return result.is_finished

    wait_until(finished, timeout=timeout, interval=0.05,
               message=f"task {result.id} to finish")
    return result


def test_tasks_run_in_a_worker_process_which_sends_started_and_finished(start_worker):
    from tests.testapp import tasks as t

    worker = start_worker("tasks")
    added = t.add.enqueue(20, 22)
    awaited = t.async_add.enqueue(1, 2)
    contextual = t.with_context.enqueue("hello")
    failed = t.boom.enqueue("in a worker")

    for result in (added, awaited, contextual, failed):
        wait_finished(result)
        assert result.worker_ids == [worker.id]
        assert result.attempts == 1
    assert added.return_value == 42
    assert awaited.return_value == 3
    assert contextual.return_value["id"] == contextual.id
    assert contextual.return_value["worker_ids"] == [worker.id]
    assert failed.status == TaskResultStatus.FAILED
    assert failed.errors[0].exception_class is t.TaskBoom

    for result, outcome in ((added, "SUCCESSFUL|"), (awaited, "SUCCESSFUL|"),
                            (failed, "FAILED|tests.testapp.tasks.TaskBoom")):
        sent = [(e.kind, e.tag, e.pid, e.name) for e in effects(result.id)]
        # The enqueueing process sends task_enqueued once its enqueue has committed, and by
        # then the worker may have started the task already (as with Django's own database
        # backend): its effect is not ordered against the worker's two.
        enqueued = ("signal:enqueued", "READY|", os.getpid(), BACKEND)
        assert enqueued in sent  # the sender is the backend's class, as Django sends
        assert [e for e in sent if e != enqueued] == [
            ("signal:started", "RUNNING|", worker.pid, BACKEND),  # in the worker, in order
            ("signal:finished", outcome, worker.pid, BACKEND),
        ]


def test_a_task_raising_systemexit_or_keyboardinterrupt_is_finished_by_the_worker(start_worker):
    """``sys.exit()`` or a ``KeyboardInterrupt`` raised by a task's code fails the task: the
    worker sends ``task_finished`` (FAILED, with the exception's class), as Django's backends
    do for SystemExit, and goes on running other tasks."""
    from tests.testapp import tasks as t

    worker = start_worker("exits")
    failed = [(kind, declared.enqueue(f"{kind} in a worker")) for kind, declared in (
        ("builtins.SystemExit", t.exits), ("builtins.KeyboardInterrupt", t.interrupted),
        ("builtins.SystemExit", t.async_exits))]
    for kind, result in failed:
        wait_finished(result)
        assert result.status == TaskResultStatus.FAILED
        assert result.errors[0].exception_class_path == kind
        assert result.errors[0].traceback.endswith(f"{kind.split('.')[1]}: {kind} in a worker\n")
        finished = effects(result.id, "signal:finished")
        assert [(e.tag, e.pid, e.name) for e in finished] == [
            (f"FAILED|{kind}", worker.pid, BACKEND)]
    after = wait_finished(t.add.enqueue(1, 1))
    assert after.return_value == 2 and after.worker_ids == [worker.id]
    assert worker.proc.poll() is None


def test_a_task_whose_worker_was_killed_runs_again_and_counts_both_claims(start_worker):
    from tests.testapp import tasks as t

    a = start_worker("a")
    result = t.slow_first_attempt.enqueue()
    wait_effect(result.id, "start")
    result.refresh()
    assert result.status == TaskResultStatus.RUNNING
    assert result.worker_ids == [a.id]
    a.signal(signal.SIGKILL)
    a.wait()

    lapse_worker(a)
    b = start_worker("b")  # re-claims it, its lease lapsed
    wait_finished(result)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.worker_ids == [a.id, b.id]
    assert result.attempts == 2
    assert result.return_value == {"attempt": 2, "worker_ids": [a.id, b.id]}
    assert [e.attempt for e in effects(result.id, "start")] == [1, 2]


def test_a_row_naming_code_that_is_not_a_task_of_this_backend_never_runs(start_worker, tmp_path):
    """A hand-written row names ``os.system``, a plain function of an installed app, and a task
    of another backend: the worker looks names up among declared tasks only, so each row is
    given back as unknown (to wait for a worker that knows the name), and nothing is called."""
    from django.db import connection

    marker = tmp_path / f"called-{uuid.uuid4().hex}"
    rows = {}
    with connection.cursor() as cur:
        for name, args in [
            ("os.system", [f"touch {marker}"]),
            ("tests.testapp.tasks.plain_helper", [str(marker)]),
            ("tests.testapp.tasks.immediate_touch", [str(marker)]),
            ("tests.testapp.tasks.TaskBoom", [str(marker)]),
        ]:
            cur.execute(
                "insert into x_jobs (name, idempotency_key, input)"
                " values (%s, %s, %s::jsonb) returning id",
                [name, uuid.uuid4().hex, json.dumps({"args": args, "kwargs": {},
                                                     "backend": "default"})],
            )
            rows[name] = cur.fetchone()[0]
    worker = start_worker("guard")

    for name, job_id in rows.items():
        row = wait_given_back(job_id, tries=2)  # claimed, looked up, given back, twice
        assert row.state in ("ready", "delayed") and row.attempt == 0
        assert "UnknownJob" in row.last_error and repr(name) in row.last_error
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(str(job_id))
    assert not marker.exists()
    assert worker.proc.poll() is None
