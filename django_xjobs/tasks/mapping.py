"""Reading a task back: an ``x_jobs`` row as a ``django.tasks`` ``TaskResult`` (no database).

:meth:`~django_xjobs.tasks.XJobsBackend.get_result` reads the row and maps it here; a worker
maps the row it runs the same way, for the ``TaskContext`` and the signals.

Status mapping (pinned by tests/unit/test_django_tasks_mapping.py)
------------------------------------------------------------------
=====================================  ============  ==========================================
x_jobs row                             status        errors
=====================================  ============  ==========================================
ready / delayed, never attempted       READY         none
ready / delayed after a failed try     READY         the failed attempt's error (retry pending)
running                                RUNNING       an earlier attempt's error, if any
suspended (a durable sleep)            RUNNING       as running: started, not finished
blocked (held back by flow control)    READY         as ready / delayed
done                                   SUCCESSFUL    an earlier attempt's error, if any
dead                                   FAILED        the last attempt's error
cancelled                              FAILED        ``django_xjobs.exceptions.JobCancelled``
=====================================  ============  ==========================================

Typed values (docs/django-tasks.md, "Arguments and return values")
-----------------------------------------------------------------
A task's arguments and return value may hold what a job's input may: JSON values and the typed
values a row keeps exactly (``values.TYPED_TYPES``: datetime, date, time, UUID, Decimal).
:func:`normalize` is Django's ``normalize_json`` that keeps those; ``TaskResult.__post_init__``
runs ``normalize_json`` itself on ``args`` and ``kwargs``, which refuses them, so a result is
built (:func:`task_result`) and copied (:func:`replace_result`) with them set after it.
"""

from __future__ import annotations

import builtins
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from django.conf import settings
from django.tasks import Task, TaskResult, TaskResultStatus
from django.tasks.base import TaskError
from django.tasks.exceptions import InvalidTask, InvalidTaskBackend
from django.utils.json import normalize_json

from .. import exceptions, values
from ..records import JobRecord

_STATUS = {
    "ready": TaskResultStatus.READY,
    "delayed": TaskResultStatus.READY,
    "running": TaskResultStatus.RUNNING,
    "suspended": TaskResultStatus.RUNNING,
    "blocked": TaskResultStatus.READY,
    "done": TaskResultStatus.SUCCESSFUL,
    "dead": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,
}
CANCELLED_ERROR = f"{exceptions.JobCancelled.__module__}.{exceptions.JobCancelled.__qualname__}"
WORKER_ERROR = f"{exceptions.JobFailed.__module__}.{exceptions.JobFailed.__qualname__}"
# What values.format_error puts where it cut a long traceback.
_TRUNCATED = "[... traceback truncated ...]"
_TRACEBACK = "Traceback (most recent call last):"
_EXCEPTION_LINE = re.compile(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?::|$)")
# Requeue notes (worker/loop.py: shutdown; worker/watchdog.py: self-fence) share last_error
# with failures; a run handed back did not fail.
_NOT_A_FAILURE = ("handed back:",)


# What normalize() keeps as it is.
_KEPT = (str, int, float, *values.TYPED_TYPES)  # bool is an int


def normalize(value: Any) -> Any:
    """``django.utils.json.normalize_json`` (mappings to dicts, other sequences to lists, bytes
    to UTF-8 text), keeping the typed values a row stores exactly; its ``TypeError`` for the
    rest, naming what is accepted."""
    if value is None or isinstance(value, _KEPT):
        return value
    if isinstance(value, Mapping):
        return {normalize_json(k): normalize(v) for k, v in value.items()}
    if isinstance(value, bytes):
        return normalize_json(value)
    if isinstance(value, Sequence):
        return [normalize(v) for v in value]
    raise TypeError(f"Unsupported type: {type(value)} (arguments and return values of a task "
                    f"may hold JSON values and datetime, date, time, uuid.UUID, "
                    f"decimal.Decimal)")


def task_result(**fields: Any) -> TaskResult:
    """``TaskResult(**fields)`` whose ``args`` and ``kwargs`` may hold typed values."""
    args, kwargs = fields.pop("args"), fields.pop("kwargs")
    result = TaskResult(args=[], kwargs={}, **fields)
    object.__setattr__(result, "args", args)
    object.__setattr__(result, "kwargs", kwargs)
    return result


def replace_result(result: TaskResult, **changes: Any) -> TaskResult:
    """``dataclasses.replace(result, **changes)`` for a result whose arguments may hold typed
    values (the return value, not an init field, is not copied, as ``replace`` does)."""
    copy = replace(result, args=[], kwargs={}, **changes)
    object.__setattr__(copy, "args", result.args)
    object.__setattr__(copy, "kwargs", result.kwargs)
    return copy


def status_of(state: str) -> TaskResultStatus:
    """The ``TaskResultStatus`` of an ``x_jobs`` state (table in the module docstring)."""
    try:
        return _STATUS[state]
    except KeyError:
        raise ValueError(f"{state!r} is not an x_jobs state") from None


def exception_class_path(text: str) -> str:
    """The dotted path of the exception a recorded error without a class line names.

    ``text`` is one of the worker's own messages (``UnknownJob: ...``, ``TimeoutError: ...``)
    or a traceback recorded before the worker wrote the class on a first line of its own
    (``traceback.format_exception``, maybe cut in the middle). The exception line is the first
    unindented line of the LAST traceback (the exception that was raised; the others are its
    causes): every frame line is indented. Python writes builtins without a module
    (``ValueError``), everything else as ``module.qualname``. Anything unreadable names
    :class:`~django_xjobs.exceptions.JobFailed`.
    """
    lines = text.splitlines()
    start = 0
    for n, line in enumerate(lines):
        if line == _TRACEBACK:
            start = n + 1
        elif line == _TRUNCATED:
            start = n + 2  # the line after the cut is the end of some line, not a whole one
    for line in lines[start:]:
        if not line.strip() or line[0].isspace():
            continue
        match = _EXCEPTION_LINE.match(line)
        return _qualified(match.group(1)) if match else WORKER_ERROR
    return WORKER_ERROR


def _qualified(name: str) -> str:
    if "." in name:
        return name
    for module in (builtins, exceptions):
        candidate = getattr(module, name, None)
        if isinstance(candidate, type) and issubclass(candidate, BaseException):
            return f"{module.__name__}.{name}"
    return WORKER_ERROR


def task_error_of(record: JobRecord) -> TaskError | None:
    """The ``TaskError`` a row records, or None: its cancellation, else its last failure.

    A failure the task's code raised was recorded with its class on a first line of its own
    (``exceptions.error_class_line``, written by the worker from the exception object): that is
    the class, and the rest is the traceback, as Django's backends keep it. Any other text (the
    worker's own messages, rows recorded before that line existed) is read by
    ``exception_class_path()`` and kept whole.
    """
    if record.state == "cancelled":
        return TaskError(exception_class_path=CANCELLED_ERROR,
                         traceback=record.last_error or "cancelled")
    text = record.last_error
    if not text or text.startswith(_NOT_A_FAILURE):
        return None
    recorded = exceptions.split_recorded_error(text)
    if recorded is not None:
        path, rest = recorded
        return TaskError(exception_class_path=path, traceback=rest)
    return TaskError(exception_class_path=exception_class_path(text), traceback=text)


def to_task_result(record: JobRecord, task: Task, *, default_backend: str) -> TaskResult:
    """A ``TaskResult`` from an ``x_jobs`` row of ``task`` (no database access).

    ``started_at`` and ``last_attempted_at`` are both the start of the latest attempt: the row
    keeps one start time. ``finished_at`` is set for finished rows only.
    """
    stored = record.input if isinstance(record.input, dict) else {}
    backend = stored.get("backend")
    backend = backend if isinstance(backend, str) else default_backend
    args = stored.get("args")
    kwargs = stored.get("kwargs")
    status = status_of(record.state)
    error = task_error_of(record)
    result = task_result(
        task=as_enqueued(task, backend, stored.get("run_after"), queue=record.queue,
                          priority=record.priority),
        id=str(record.id),
        status=status,
        enqueued_at=record.created_at,
        started_at=record.started_at,
        last_attempted_at=record.started_at,
        finished_at=record.finished_at if record.is_finished else None,
        args=args if isinstance(args, list) else [],
        kwargs=kwargs if isinstance(kwargs, dict) else {},
        backend=backend,
        errors=[error] if error is not None else [],
        worker_ids=[str(w) for w in record.worker_ids],
    )
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", record.result)
    return result


def as_enqueued(task: Task, backend: str, run_after: Any, *, queue: str | None = None,
                 priority: int | None = None) -> Task:
    """The declared task with the queue, priority, backend and run_after of this enqueue (the
    queue and priority as declared when not given: an outbox row does not report them)."""
    changes: dict[str, Any] = {}
    if queue is not None and queue != task.queue_name:
        changes["queue_name"] = queue
    if priority is not None and priority != task.priority:
        changes["priority"] = priority
    if backend != task.backend and backend in settings.TASKS:
        changes["backend"] = backend
    if isinstance(run_after, str):
        try:
            changes["run_after"] = datetime.fromisoformat(run_after)
        except ValueError:
            pass
    if not changes:
        return task
    try:
        return replace(task, **changes)
    except (InvalidTask, InvalidTaskBackend):
        return task  # settings changed since the enqueue (a queue no longer allowed)
