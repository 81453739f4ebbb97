"""How an ``x_jobs`` row reads as a ``django.tasks`` ``TaskResult`` (no database: rows are built
in memory). The table is in django_xjobs/tasks/mapping.py and docs/django-tasks.md.
Skipped on Django < 6.0, which has no ``django.tasks``."""

from __future__ import annotations

import traceback
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

pytest.importorskip("django.tasks", reason="django.tasks (and this backend) need Django 6.0+")

from django.tasks import TaskResultStatus

from django_xjobs import exceptions
from django_xjobs.records import ALL_STATES, JobRecord
from django_xjobs.tasks import status_of, task_error_of, to_task_result
from django_xjobs.tasks.mapping import exception_class_path
from django_xjobs.values import MAX_ERROR_CHARS, format_error, record_error
from django_xjobs.worker.executor import unknown_job
from tests.testapp import tasks as t

READY, RUNNING = TaskResultStatus.READY, TaskResultStatus.RUNNING
FAILED, SUCCESSFUL = TaskResultStatus.FAILED, TaskResultStatus.SUCCESSFUL
T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
JOB_FAILED = "django_xjobs.exceptions.JobFailed"


def row(state: str, **overrides: Any) -> JobRecord:
    values: dict[str, Any] = dict(
        id=uuid.uuid4(), name="tests.testapp.tasks.add", queue="default",
        input={"args": [2, 3], "kwargs": {}, "backend": "default"}, idempotency_key="k",
        run_id=uuid.uuid4(), attempt=0, max_attempts=3, state=state, run_at=T0,
        visible_at=None, claimed_by=None, last_error=None, tenant_id=None, traceparent=None,
        enqueued_by="tests", created_at=T0, updated_at=T0, priority=0, result=None,
        lease_token=None, concurrency_key=None, started_at=None, finished_at=None, rescues=0,
        worker_ids=[],
    )
    values.update(overrides)
    return JobRecord(**values)


def result_of(record: JobRecord):
    return to_task_result(record, t.add, default_backend="default")


def raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


# ------------------------------------------------------------------------------- status --


@pytest.mark.parametrize(("state", "status"), [
    ("ready", READY), ("delayed", READY), ("running", RUNNING), ("suspended", RUNNING),
    ("blocked", READY),
    ("done", SUCCESSFUL), ("dead", FAILED), ("cancelled", FAILED),
])
def test_every_state_maps_to_one_of_the_four_statuses(state, status):
    assert status_of(state) == status


def test_the_table_covers_every_state_and_nothing_else():
    assert {s for s in ALL_STATES if status_of(s)} == set(ALL_STATES)
    with pytest.raises(ValueError, match="not an x_jobs state"):
        status_of("paused")


def test_a_fresh_row_is_ready_with_no_attempt_no_error_and_no_times_but_enqueued_at():
    result = result_of(row("ready"))
    assert result.status == READY
    assert result.id and result.enqueued_at == T0
    assert result.started_at is result.last_attempted_at is result.finished_at is None
    assert result.errors == [] and result.worker_ids == [] and result.attempts == 0
    assert result.args == [2, 3] and result.kwargs == {} and result.backend == "default"


def test_a_retry_pending_after_a_failed_attempt_is_ready_with_that_attempts_error():
    text = format_error(raised(KeyError("gone")))
    result = result_of(row("delayed", attempt=1, last_error=text, started_at=T0,
                           worker_ids=["w1"], run_at=T0 + timedelta(seconds=30)))
    assert result.status == READY
    assert result.attempts == 1 and result.worker_ids == ["w1"]
    assert result.started_at == result.last_attempted_at == T0
    assert result.finished_at is None
    [error] = result.errors
    assert error.exception_class is KeyError and error.traceback == text


def test_a_running_row_is_running_without_a_finish_time():
    started = T0 + timedelta(seconds=1)
    result = result_of(row("running", attempt=1, started_at=started, worker_ids=["w1"],
                           finished_at=None))
    assert result.status == RUNNING
    assert result.started_at == started and result.finished_at is None
    with pytest.raises(ValueError, match="not finished"):
        _ = result.return_value


def test_a_done_row_is_successful_with_the_stored_value_and_times():
    finished = T0 + timedelta(seconds=2)
    result = result_of(row("done", attempt=2, result={"total": 5}, started_at=T0,
                           finished_at=finished, worker_ids=["w1", "w2"]))
    assert result.status == SUCCESSFUL
    assert result.return_value == {"total": 5}
    assert result.finished_at == finished
    assert result.attempts == 2


def test_a_done_row_returning_none_is_successful_with_none():
    assert result_of(row("done", result=None, finished_at=T0)).return_value is None


def test_a_dead_row_is_failed_with_its_last_error():
    text = format_error(raised(t.TaskBoom("kaput")))
    result = result_of(row("dead", attempt=3, last_error=text, finished_at=T0))
    assert result.status == FAILED
    [error] = result.errors
    assert error.exception_class_path == "tests.testapp.tasks.TaskBoom"
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value


def test_a_cancelled_row_is_failed_with_an_error_naming_the_cancellation():
    result = result_of(row("cancelled", last_error="cancelled: customer left", finished_at=T0))
    assert result.status == FAILED
    [error] = result.errors
    assert error.exception_class is exceptions.JobCancelled
    assert error.traceback == "cancelled: customer left"


def test_a_cancelled_row_that_had_failed_before_names_the_cancellation_not_the_failure():
    [error] = result_of(row("cancelled", last_error=None, finished_at=T0)).errors
    assert error.exception_class is exceptions.JobCancelled


def test_a_hand_back_note_is_not_an_error():
    note = "handed back: its worker shut down before it finished"
    assert task_error_of(row("ready", last_error=note)) is None
    assert result_of(row("ready", last_error=note)).errors == []


def test_finish_time_is_reported_for_finished_rows_only():
    # A row handed back keeps no finish time either way; a stray value is not reported.
    assert result_of(row("ready", finished_at=T0)).finished_at is None


def test_the_result_task_carries_the_queue_priority_backend_and_run_after_of_the_enqueue():
    later = T0 + timedelta(hours=1)
    result = result_of(row("delayed", queue="other", priority=-7, input={
        "args": [1, 1], "kwargs": {}, "backend": "default", "run_after": later.isoformat()}))
    assert result.task.func is t.add.func
    assert (result.task.queue_name, result.task.priority) == ("other", -7)
    assert result.task.run_after == later


def test_a_row_of_unexpected_shape_still_reads_as_a_result():
    result = result_of(row("ready", input={"tag": "x"}))
    assert result.args == [] and result.kwargs == {}


# ------------------------------------------------------------------------------- errors --


class Outer(Exception):
    pass


def chained() -> BaseException:
    try:
        try:
            raise KeyError("inner")
        except KeyError as inner:
            raise Outer("outer") from inner
    except Outer as exc:
        return exc


def during_handling() -> BaseException:
    try:
        try:
            raise KeyError("first")
        except KeyError:
            {}["missing"]
    except KeyError as exc:
        return exc
    raise AssertionError("unreachable")


def with_note() -> BaseException:
    exc = raised(t.TaskBoom("noted"))
    exc.add_note("Outer: this note looks like an exception line")
    return exc


def ping(n: int) -> None:
    if n == 0:
        raise t.TaskBoom("deep down")
    pong(n - 1)


def pong(n: int) -> None:
    # Alternating frames: Python folds identical consecutive ones, which would keep it short.
    ping(n - 1)


def truncated() -> BaseException:
    try:
        ping(200)
    except t.TaskBoom as exc:
        return exc
    raise AssertionError("unreachable")


# Rows recorded before the worker wrote the class on a first line of its own, and the worker's
# own messages, are read back from the text.
@pytest.mark.parametrize(("make", "path"), [
    (lambda: raised(ValueError("bad")), "builtins.ValueError"),
    (lambda: raised(ValueError()), "builtins.ValueError"),
    (lambda: raised(t.TaskBoom("line one\nline two\nNotAClass: line three")),
     "tests.testapp.tasks.TaskBoom"),
    (lambda: raised(exceptions.PermanentError("stop")), "django_xjobs.exceptions.PermanentError"),
    (chained, f"{__name__}.Outer"),
    (during_handling, "builtins.KeyError"),
    (with_note, "tests.testapp.tasks.TaskBoom"),
    (truncated, "tests.testapp.tasks.TaskBoom"),
    (lambda: raised(SyntaxError("bad syntax", ("f.py", 1, 5, "x = = 1", 1, 6))),
     "builtins.SyntaxError"),
], ids=["builtin", "no-message", "multiline-message", "ours", "chained", "during-handling",
        "note", "truncated", "syntax-error"])
def test_the_exception_class_is_read_back_from_a_recorded_traceback(make, path):
    exc = make()
    text = format_error(exc)
    assert exception_class_path(text) == path
    expected = type(exc)
    assert task_error_of(row("dead", last_error=text)).exception_class is expected


def test_a_traceback_cut_in_the_middle_is_still_read():
    text = format_error(truncated())
    # The case is real: the recorded text lost its middle, the last header included.
    assert len(text) < MAX_ERROR_CHARS + 100 and "traceback truncated" in text
    assert text.count("Traceback (most recent call last):") == 1
    assert exception_class_path(text) == "tests.testapp.tasks.TaskBoom"


def test_the_worker_s_own_messages_name_a_real_exception_class():
    from django_xjobs import conf
    from django_xjobs.records import ClaimedJob

    claimed = ClaimedJob(id=str(uuid.uuid4()), lease_token="t", name="os.system",
                         queue="default", input={}, run_id="r", attempt=1, max_attempts=3,
                         tenant_id=None, traceparent=None, concurrency_key=None, resumed=False)
    unknown = unknown_job(claimed, conf.get()).note
    assert exception_class_path(unknown) == "django_xjobs.exceptions.UnknownJob"
    timeout = ("TimeoutError: tests.testapp.tasks.add ran longer than its timeout (1s); the run"
               " was stopped and its result will be discarded")
    assert exception_class_path(timeout) == "builtins.TimeoutError"
    buried = ("lease lost 3 times: the worker running attempt 3 of 3 (w) stopped renewing it"
              " (killed or crashed?)")
    assert exception_class_path(buried) == JOB_FAILED


@pytest.mark.parametrize("text", ["", "\n\n", "   indented only", "Nameless: but unknown",
                                  "[weird] text"])
def test_text_naming_no_known_exception_names_jobfailed(text):
    assert exception_class_path(text) == JOB_FAILED
    if text:
        assert task_error_of(row("dead", last_error=text)).exception_class is exceptions.JobFailed


def test_main_module_exceptions_are_unknown_names():
    # Python writes classes of __main__ without a module; they are not importable by path.
    assert exception_class_path("Traceback (most recent call last):\n  File \"x\", line 1\n"
                                "LocalError: x") == JOB_FAILED


# ------------------------------------------------------------ the class, recorded when raised --


def group() -> BaseException:
    return raised(ExceptionGroup("several", [t.TaskBoom("one"), KeyError("two")]))


def quoting() -> BaseException:
    return raised(t.TaskBoom("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
                             "KeyError: quoted, not raised"))


def local_class() -> BaseException:
    class Local(Exception):
        pass

    return raised(Local("defined in a function"))


@pytest.mark.parametrize(("make", "path"), [
    (lambda: raised(ValueError("bad")), "builtins.ValueError"),
    (lambda: raised(SystemExit("bye")), "builtins.SystemExit"),
    (lambda: raised(KeyboardInterrupt()), "builtins.KeyboardInterrupt"),
    (group, "builtins.ExceptionGroup"),
    (quoting, "tests.testapp.tasks.TaskBoom"),
    (chained, f"{__name__}.Outer"),
    (during_handling, "builtins.KeyError"),
    (with_note, "tests.testapp.tasks.TaskBoom"),
    (lambda: ValueError("never raised"), "builtins.ValueError"),
    (local_class, f"{__name__}.local_class.<locals>.Local"),
], ids=["builtin", "system-exit", "keyboard-interrupt", "exception-group", "quoted-traceback",
        "chained", "during-handling", "note", "never-raised", "local-class"])
def test_the_class_recorded_with_the_error_is_the_class_raised(make, path):
    exc = make()
    [error] = result_of(row("dead", attempt=1, last_error=record_error(exc),
                            finished_at=T0)).errors
    # What Django's own backends store: the class path and the whole traceback, as formatted.
    assert error.exception_class_path == path
    assert error.traceback == "".join(traceback.format_exception(exc))
    if "<locals>" in path:  # no importable path, as with Django's own backends
        with pytest.raises(ImportError):
            _ = error.exception_class
    else:
        assert error.exception_class is type(exc)


def test_the_recorded_class_survives_a_traceback_cut_in_the_middle():
    text = record_error(truncated())
    assert "traceback truncated" in text
    [error] = result_of(row("dead", attempt=1, last_error=text, finished_at=T0)).errors
    assert error.exception_class is t.TaskBoom
    assert error.traceback.startswith("Traceback (most recent call last):\n")
    assert error.traceback.endswith("tests.testapp.tasks.TaskBoom: deep down\n")


@pytest.mark.parametrize("text", [
    "Traceback (most recent call last):\n  File \"x\", line 1\nValueError: x",
    "UnknownJob: no job named 'x' is registered in this worker",
    "exception-class:\nValueError: an empty class line is not a recorded class",
    "exception-class: two words\nValueError: a class path has no spaces",
])
def test_a_text_without_a_recorded_class_line_is_read_as_before(text):
    [error] = result_of(row("dead", attempt=1, last_error=text, finished_at=T0)).errors
    assert error.traceback == text
    assert error.exception_class_path == exception_class_path(text)
