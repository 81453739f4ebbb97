"""Running a task: the job function a worker calls for a declared task.

A worker claims a task's row like any job; the claim appends the worker's id to
``worker_ids`` (``jobs_claim``), so ``TaskResult.attempts`` counts claims that ran. The runner
reads the row once (worker ids and timestamps for the context and the signals), sends
``task_started``, calls the function (with a ``TaskContext`` first when ``takes_context``),
and sends ``task_finished`` when this attempt ends the task: a success, or a failure on the
last attempt, ``SystemExit`` included (sent inside the ``except`` block, so Django's logger
gets ``exc_info``). A failure that will be retried sends nothing: the task is READY again, not
finished. The outcome itself is written by the worker's fenced statements, as for any job, just
after; a failure's record starts with the class of the exception raised
(``exceptions.error_class_line``).
"""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from inspect import iscoroutinefunction
from typing import Any

from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus
from django.tasks.base import TaskError
from django.tasks.signals import task_finished, task_started
from django.utils import timezone

from .. import api, conf, exceptions, values
from ..context import JobContext, in_thread
from ..exceptions import PermanentError
from ..records import JobRecord
from .mapping import normalize, replace_result, to_task_result

# The keys of a task's stored input (XJobsBackend.prepare writes them): a row with others is
# not a django.tasks call.
INPUT_KEYS = frozenset({"args", "kwargs", "backend", "run_after"})


def runner(task: Task) -> Callable[..., Any]:
    """The job function a worker calls for ``task``: ``runner(ctx, args=, kwargs=, ...)``."""
    run: Callable[..., Any]
    if iscoroutinefunction(task.func):
        async def run_async(ctx: JobContext, **stored: Any) -> Any:
            call = _stored_call(task, stored)
            record = await in_thread(api.get_job, ctx.job_id)
            started = _running_result(call, record)
            await in_thread(_send, task_started, started)
            try:
                value = await task.func(*_positional(call, started), **call.kwargs)
            except BaseException as exc:
                if _ends_task(exc, ctx):
                    await in_thread(_send_failure, started, exc)
                raise
            return await in_thread(_succeeded, ctx, started, value)

        run = run_async
    else:
        def run_sync(ctx: JobContext, **stored: Any) -> Any:
            call = _stored_call(task, stored)
            started = _running_result(call, api.get_job(ctx.job_id))
            _send(task_started, started)
            try:
                value = task.func(*_positional(call, started), **call.kwargs)
            except BaseException as exc:  # SystemExit too: the worker records it as a failure
                if _ends_task(exc, ctx):
                    _send(task_finished, _failed(started, exc))  # in the except: exc_info
                raise
            return _succeeded(ctx, started, value)

        run = run_sync
    # The registry tells two functions under one name apart by module and qualname.
    run.__module__ = task.func.__module__
    run.__qualname__ = run.__name__ = task.func.__qualname__
    return run


@dataclass(frozen=True, slots=True)
class _Call:
    task: Task  # the declared task
    args: list[Any]
    kwargs: dict[str, Any]
    backend: str
    run_after: datetime | None


def _stored_call(task: Task, stored: Mapping[str, Any]) -> _Call:
    args, kwargs = stored.get("args"), stored.get("kwargs")
    backend, run_after = stored.get("backend", task.backend), stored.get("run_after")
    if (set(stored) - INPUT_KEYS or not isinstance(args, list) or not isinstance(kwargs, dict)
            or not isinstance(backend, str)
            or not (run_after is None or isinstance(run_after, str))):
        raise PermanentError(
            f"the stored input of task {task.module_path} is not a django.tasks call "
            f"({{'args': [...], 'kwargs': {{...}}}}); its keys are {sorted(stored)}"
        )
    when = None
    if run_after is not None:
        try:
            when = datetime.fromisoformat(run_after)
        except ValueError:
            raise PermanentError(f"stored run_after {run_after!r} is not an ISO date") from None
    return _Call(task=task, args=args, kwargs=kwargs, backend=backend, run_after=when)


def _positional(call: _Call, started: TaskResult) -> list[Any]:
    if call.task.takes_context:
        return [TaskContext(task_result=started), *call.args]
    return call.args


def _running_result(call: _Call, record: JobRecord) -> TaskResult:
    result = to_task_result(record, call.task, default_backend=call.backend)
    # This worker runs it, whatever another session did to the row since the claim: the worker's
    # fenced writes decide, and a cancelled run is stopped at the next heartbeat.
    object.__setattr__(result, "status", TaskResultStatus.RUNNING)
    object.__setattr__(result, "finished_at", None)
    return result


def _ends_task(exc: BaseException, ctx: JobContext) -> bool:
    """Whether this failure finishes the task (FAILED) rather than leaving a retry pending.

    Any exception the code raises counts, ``SystemExit`` and ``KeyboardInterrupt`` included
    (the worker records them as the attempt's failure), except the ones by which the worker
    stops a run: a cancelled asyncio task (an async task's timeout), ``JobCancelled``.
    """
    if ctx.cancelled.is_set():
        return False  # the worker stopped this run and decides its outcome
    if isinstance(exc, exceptions.Snooze | exceptions.JobCancelled | asyncio.CancelledError
                  | GeneratorExit):
        return False
    return exceptions.is_permanent(exc) or ctx.is_last_attempt


def _succeeded(ctx: JobContext, started: TaskResult, value: Any) -> Any:
    if ctx.cancelled.is_set():
        return value  # stopped meanwhile (timeout, cancel, lost lease): the worker discards it
    try:
        normalised = normalize(value)
        values.encode_json(normalised, what=f"return value of {started.task.module_path}",
                        limit=conf.get().max_payload_bytes)
    except (TypeError, ValueError) as exc:
        # The encoder's own error, as Django's backends report it (normalize's TypeError, as
        # Django's normalize_json raises it),
        # or PayloadTooLarge, but for good: the task ran, and running it again cannot change
        # what it returns.
        exceptions.fail_for_good(exc)
        _send(task_finished, _failed(started, exc))  # in the except: exc_info
        raise
    finished = replace_result(started, status=TaskResultStatus.SUCCESSFUL,
                              finished_at=timezone.now())
    object.__setattr__(finished, "_return_value", normalised)
    _send(task_finished, finished)
    return normalised


def _failed(started: TaskResult, exc: BaseException) -> TaskResult:
    error = TaskError(exception_class_path=exceptions.class_path(type(exc)),
                      traceback="".join(traceback.format_exception(exc)))
    return replace_result(started, status=TaskResultStatus.FAILED, finished_at=timezone.now(),
                          errors=[error])


def _send_failure(started: TaskResult, exc: BaseException) -> None:
    """``task_finished`` for an async task's failure, from a thread: raised again here so that
    receivers (Django's logger) see it in ``sys.exc_info()``, as they do for a sync task."""
    tb = exc.__traceback__
    try:
        raise exc
    except BaseException:
        _send(task_finished, _failed(started, exc.with_traceback(tb)))
    finally:
        exc.with_traceback(tb)  # leave the stored traceback without this frame


def _send(signal: Any, result: TaskResult) -> None:
    signal.send(sender=type(result.task.get_backend()), task_result=result)
