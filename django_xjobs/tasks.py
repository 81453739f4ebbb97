"""A ``django.tasks`` backend (Django 6+): ``@task`` functions become ``x_jobs`` rows and run in
``manage.py xjobs_worker``, with the retries, leases and fencing of every other job::

    TASKS = {"default": {"BACKEND": "django_xjobs.tasks.XJobsBackend",
                         "QUEUES": ["default"], "OPTIONS": {"MAX_ATTEMPTS": 3}}}

How a task travels (docs/django-tasks.md has the user's view)
--------------------------------------------------------------
1. **Declare.** ``@task`` builds an :class:`XJobsTask` (the backend's ``task_class``), whose
   construction runs :meth:`XJobsBackend.validate_task`. That is where the task is registered in
   the job registry, under its ``module_path``, with a runner function as the job's code. It
   happens when the task's MODULE is imported, so every process that imports the module knows
   the task: installed apps' ``tasks.py`` are imported at startup (:func:`ready`, like ``jobs.py``).
2. **Enqueue.** :meth:`XJobsBackend.enqueue` goes through ``base.BoundJob.enqueue``, the very path
   ``my_job.enqueue`` takes: same validation, same statement, the caller's transaction. The row's
   ``name`` is the ``module_path``; its ``input`` is ``{"args": [...], "kwargs": {...},
   "backend": alias}`` (plus ``run_after``); its ``priority`` is the task's priority, unchanged:
   both scales run the higher number first (the claim orders by ``priority desc``).
   The result's ``enqueued_at`` is the row's ``created_at``, read back in the caller's
   transaction, so it is the result ``get_result`` reads later.
   ``task_enqueued`` is sent after the insert, inside the caller's transaction like the row.
3. **Run.** A worker claims the row like any job; the claim appends the worker's id to
   ``worker_ids`` (``jobs_claim``), so ``TaskResult.attempts`` counts claims that ran. The runner
   reads the row once (worker ids and timestamps for the context and the signals), sends
   ``task_started``, calls the function (with a ``TaskContext`` first when ``takes_context``),
   and sends ``task_finished`` when this attempt ends the task: a success, or a failure on the
   last attempt, ``SystemExit`` included (sent inside the ``except`` block, so Django's logger
   gets ``exc_info``). A failure that will be retried sends nothing: the task is READY again,
   not finished. The outcome itself is written by the worker's fenced statements, as for any
   job, just after; a failure's record starts with the class of the exception raised
   (``exceptions.error_class_line``).
4. **Read.** :meth:`XJobsBackend.get_result` reads the row and maps it (:func:`to_task_result`).

Which code a stored name runs
-----------------------------
Only a task registered in step 1: declared for a backend of this class, by a module-level
function of an installed app's module. A stored string is never imported: a row naming
``os.system``, a plain function, or a task of another backend finds no registry entry, so the
worker retries it as an unknown job and it ends ``dead``; nothing is called
(tests/acceptance/test_django_tasks_worker.py). A registry filled at enqueue time would be empty
in a worker process, which never enqueues; importing ``module_path`` on demand would let a row
choose which module's top-level code runs. Declaring at import, plus startup autodiscovery of
``tasks.py``, makes the worker's registry the same as the web process's, whatever ran first.

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
"""

from __future__ import annotations

import asyncio
import builtins
import re
import threading
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from inspect import iscoroutinefunction
from typing import Any
from uuid import UUID

from django.db import transaction

from . import outbox

try:
    from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TaskError
    from django.tasks.exceptions import InvalidTask, InvalidTaskBackend, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
except ImportError as exc:  # Django 5.2: no django.tasks
    raise ImportError(
        "django_xjobs.tasks is a django.tasks backend and needs Django 6.0 or newer; on older "
        "Django use @job from django_xjobs"
    ) from exc

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.core.exceptions import AppRegistryNotReady
from django.utils import timezone
from django.utils.json import normalize_json
from django.utils.module_loading import autodiscover_modules, import_string

from . import api, conf, exceptions, registry, values
from .base import BoundJob
from .context import JobContext, in_thread
from .exceptions import ConfigurationError, InvalidJobInput, JobNotFound, PermanentError
from .records import JobRecord

__all__ = [
    "XJobsBackend",
    "XJobsTask",
    "status_of",
    "task_error_of",
    "to_task_result",
]

INPUT_KEYS = frozenset({"args", "kwargs", "backend", "run_after"})
OPTIONS = frozenset({"MAX_ATTEMPTS"})

_lock = threading.Lock()
_tasks: dict[str, Task] = {}  # module_path -> the task declared under it (the first one seen)
_deferred: list[Task] = []  # declared before the app registry was ready; finished by ready()


# -------------------------------------------------------------------------------- the task --


@dataclass(frozen=True, slots=True, kw_only=True)
class XJobsTask(Task):
    """The backend's ``task_class``: a ``django.tasks.Task`` with django-xjobs' job options.

    On Django 6.1, ``@task(max_attempts=5, timeout="2m")`` forwards these to it. Each is checked
    the way ``@job`` checks it, at decoration time, and a bad one raises ``InvalidTask``.

    * ``max_attempts``: attempts before the task is FAILED for good (default: the backend's
      ``OPTIONS["MAX_ATTEMPTS"]``, else ``XJOBS["MAX_ATTEMPTS"]``).
    * ``timeout``: a run past it is stopped and counts as a failed attempt.
    * ``retry_base`` / ``retry_cap``: the backoff between attempts.
    * ``idempotency_key``: a string, or a function of the task's arguments returning one; while
      a task with that key is live (not finished), enqueueing it again returns the live one.
    * ``unique_for``: with ``idempotency_key``, a task of that key that finished less than this
      ago also dedupes, and ``"forever"`` never frees the key (docs/durable.md, "Idempotency
      windows"); a timedelta, seconds or a string such as ``"24h"``.
    * ``concurrency``: passed to the job registry's ``concurrency`` option (``@job(concurrency=
      Concurrency(...))``); its key template sees ``args`` and ``kwargs``
      (``"user:{kwargs[user_id]}"``).

    ``using()`` also takes ``idempotency_key``, ``unique_for`` and ``max_attempts`` per
    enqueue. ``timeout``,
    the retry policy and ``concurrency`` belong to the declaration: the worker applies the
    declared ones, so a copy cannot change them.
    """

    max_attempts: int | None = None
    timeout: timedelta | float | str | None = None
    retry_base: timedelta | float | str | None = None
    retry_cap: timedelta | float | str | None = None
    idempotency_key: str | Callable[..., str] | None = None
    concurrency: Any = None
    unique_for: timedelta | float | str | None = None

    def __post_init__(self) -> None:
        # Django's own rules first (module-level function, takes_context, priority, queue,
        # run_after), so a task breaking one gets Django's message, not a job-name error.
        BaseTaskBackend.validate_task(self.get_backend(), self)
        _check_options(self)
        Task.__post_init__(self)  # zero-argument super() does not work in slotted dataclasses

    def using(
        self,
        *,
        priority: int | None = None,
        queue_name: str | None = None,
        run_after: datetime | None = None,
        backend: str | None = None,
        idempotency_key: str | Callable[..., str] | None = None,
        max_attempts: int | None = None,
        unique_for: timedelta | float | str | None = None,
    ) -> XJobsTask:
        """A copy with other enqueue defaults (validated again, as ``Task.using``)."""
        given: dict[str, Any] = {
            "priority": priority, "queue_name": queue_name, "run_after": run_after,
            "backend": backend, "idempotency_key": idempotency_key, "max_attempts": max_attempts,
            "unique_for": unique_for,
        }
        return replace(self, **{k: v for k, v in given.items() if v is not None})

    def enqueue_on_commit(self, *args: Any, **kwargs: Any) -> TaskResult:
        """Enqueue this task if and only if the current transaction (of the "default" database)
        commits: it is staged in django-xjobs' outbox and relayed after the commit
        (docs/transactional-enqueue.md). Same validation as ``enqueue``; the result is READY,
        and its id is the id the task keeps once relayed."""
        backend = self.get_backend()
        if not isinstance(backend, XJobsBackend):
            raise InvalidTask(
                f"{self.module_path}: enqueue_on_commit needs the django-xjobs backend, but "
                f"TASKS[{self.backend!r}] is {type(backend).__name__}"
            )
        return backend.enqueue_on_commit(self, args, kwargs)


def _options(task: Task) -> dict[str, Any]:
    """The declaration-level job options of ``task`` (none for a plain ``Task``)."""
    if not isinstance(task, XJobsTask):
        return {}
    found = {"max_attempts": task.max_attempts, "timeout": task.timeout,
             "retry_base": task.retry_base, "retry_cap": task.retry_cap}
    if task.concurrency is not None:
        found["concurrency"] = task.concurrency
    return {k: v for k, v in found.items() if v is not None}


def _check_options(task: XJobsTask) -> None:
    """Validate the job options with ``@job``'s own rules; normalise durations to seconds."""
    key = task.idempotency_key
    if key is not None and not callable(key) and (not isinstance(key, str) or not key):
        raise InvalidTask(
            f"{task.module_path}: idempotency_key must be a non-empty string or a function of "
            f"the task's arguments returning one, got {key!r:.80}"
        )
    if task.unique_for is not None:
        if key is None:
            raise InvalidTask(
                f"{task.module_path}: unique_for needs idempotency_key: the window holds one key"
            )
        try:  # the rules of an enqueue's unique_for, checked once when the task is declared
            api.window_ms(task.unique_for)
        except InvalidJobInput as exc:
            raise InvalidTask(f"{task.module_path}: {exc}") from None
    try:
        definition: registry.JobDefinition[..., Any] = registry.JobDefinition.build(
            task.func, name=_job_name(task), **_options(task))
    except ConfigurationError as exc:
        raise InvalidTask(str(exc)) from None
    for field_name, seconds in (("timeout", definition.timeout),
                                ("retry_base", definition.retry.base),
                                ("retry_cap", definition.retry.cap)):
        if getattr(task, field_name) is not None:
            object.__setattr__(task, field_name, seconds)


def _job_name(task: Task) -> str:
    """The row's ``name``: the task's ``module_path``, if it is a valid job name."""
    path = task.module_path
    if not values.NAME_RE.match(path):
        raise InvalidTask(
            f"task path {path!r} cannot be stored as a job name: use 1-200 characters from "
            "[A-Za-z0-9_.:-] (ASCII module and function names)"
        )
    return path


# ------------------------------------------------------------------------- the declaration --


def _declare(task: Task) -> None:
    """Make ``task`` runnable by workers: register it under its module path (first one wins).

    Copies made by ``using()`` come back here with the same function; they change nothing but
    must not disagree with the declaration about the options the worker applies.
    """
    path = _job_name(task)
    with _lock:
        existing = _tasks.get(path)
    if existing is not None and existing.func is task.func:
        if _policy(existing) != _policy(task):
            raise InvalidTask(
                f"{path} is already declared with timeout/retry/concurrency "
                f"{_policy(existing)}; a copy cannot change them (declare another task)"
            )
        return
    try:
        config = apps.get_containing_app_config(task.func.__module__)
    except AppRegistryNotReady:  # declared while the app registry loads: ready() finishes it
        with _lock:
            _deferred.append(task)
        return
    if config is None:
        raise InvalidTask(
            f"{path} is not in an installed app's module: a worker only runs tasks declared in "
            "INSTALLED_APPS (put it in an app's tasks.py)"
        )
    definition: registry.JobDefinition[..., Any] = registry.JobDefinition.build(
        _runner(task), name=path, queue=task.queue_name, priority=task.priority,
        **_options(task))
    try:
        registry.check_options(definition)
        registry.register(definition)
    except ConfigurationError as exc:
        raise InvalidTask(str(exc)) from None
    with _lock:
        _tasks[path] = task


def _policy(task: Task) -> tuple[Any, ...]:
    options = _options(task)
    return tuple(options.get(k) for k in ("timeout", "retry_base", "retry_cap", "concurrency"))


def declared(path: str) -> Task | None:
    """The task declared under ``path`` in this process, or None. Never imports anything."""
    with _lock:
        return _tasks.get(path)


def forget(path: str) -> None:
    """Undo a declaration (tests): the task and its job registration."""
    with _lock:
        _tasks.pop(path, None)
    registry.unregister(path)


def ready() -> None:
    """At startup (``AppConfig.ready``): finish early declarations, then, when a ``TASKS``
    backend is of this class, import every installed app's ``tasks.py`` so that this process
    (a worker, typically) knows every task, as ``jobs.py`` are imported for ``@job``."""
    with _lock:
        early = list(_deferred)
        _deferred.clear()
    for task in early:
        _declare(task)
    if any(_is_ours(params) for params in getattr(settings, "TASKS", {}).values()):
        autodiscover_modules("tasks")


def _is_ours(params: Any) -> bool:
    try:
        backend = import_string(params["BACKEND"])
    except (ImportError, KeyError, TypeError):
        return False  # django.tasks reports a bad BACKEND itself, at first use
    return isinstance(backend, type) and issubclass(backend, XJobsBackend)


# ------------------------------------------------------------------------------ the runner --


def _runner(task: Task) -> Callable[..., Any]:
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
        normalised = normalize_json(value)
        values.encode_json(normalised, what=f"return value of {started.task.module_path}",
                        limit=conf.get().max_payload_bytes)
    except (TypeError, ValueError) as exc:
        # The encoder's own error, as Django's backends report it (normalize_json's TypeError),
        # or PayloadTooLarge, but for good: the task ran, and running it again cannot change
        # what it returns.
        exceptions.fail_for_good(exc)
        _send(task_finished, _failed(started, exc))  # in the except: exc_info
        raise
    finished = replace(started, status=TaskResultStatus.SUCCESSFUL, finished_at=timezone.now())
    object.__setattr__(finished, "_return_value", normalised)
    _send(task_finished, finished)
    return normalised


def _failed(started: TaskResult, exc: BaseException) -> TaskResult:
    error = TaskError(exception_class_path=exceptions.class_path(type(exc)),
                      traceback="".join(traceback.format_exception(exc)))
    return replace(started, status=TaskResultStatus.FAILED, finished_at=timezone.now(),
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


# ----------------------------------------------------------------------------- the mapping --

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
    :func:`exception_class_path` and kept whole.
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
    result = TaskResult(
        task=_as_enqueued(task, backend, stored.get("run_after"), queue=record.queue,
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


def _as_enqueued(task: Task, backend: str, run_after: Any, *, queue: str | None = None,
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


# ----------------------------------------------------------------------------- the backend --


class XJobsBackend(BaseTaskBackend):
    """``django.tasks`` on django-xjobs: durable rows in ``x_jobs``, run by ``xjobs_worker``.

    ``__init__`` runs when a module using ``@task`` is imported: it reads ``params`` and
    touches neither models nor the database.
    """

    task_class = XJobsTask
    supports_defer = True  # run_after is the row's run_at
    supports_async_task = True  # async def runs on the worker's event loop
    supports_get_result = True  # the row is readable from any process
    supports_priority = True  # the claim orders by priority desc, the same scale

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        options = self.options if isinstance(self.options, Mapping) else None
        if options is None or set(options) - OPTIONS:
            raise InvalidTaskBackend(
                f"TASKS[{alias!r}]['OPTIONS'] must be a dict with the optional keys "
                f"{sorted(OPTIONS)}, got {self.options!r:.100}"
            )
        self.max_attempts: int | None = options.get("MAX_ATTEMPTS")
        if self.max_attempts is not None and (
            isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int)
            or not 1 <= self.max_attempts <= registry.INT32
        ):
            raise InvalidTaskBackend(
                f"TASKS[{alias!r}]['OPTIONS']['MAX_ATTEMPTS'] must be a positive integer, "
                f"got {self.max_attempts!r}"
            )

    def validate_task(self, task: Task) -> None:
        super().validate_task(task)
        if not values.NAME_RE.match(task.queue_name):
            raise InvalidTask(
                f"queue_name {task.queue_name!r} is not valid: use 1-200 characters from "
                "[A-Za-z0-9_.:-]"
            )
        _declare(task)

    # -------------------------------------------------------------------------- enqueue --
    def prepare(self, task: Task, args: Sequence[Any], kwargs: Mapping[str, Any]
                ) -> tuple[BoundJob, dict[str, Any]]:
        """Validate one call of ``task`` and turn it into the job enqueue it becomes: the bound
        job and its input. Raises before anything is written. ``enqueue`` is this plus
        ``bound.enqueue(**input)``; an on-commit enqueue is this plus the bound job's on-commit
        enqueue, so a task is validated and stored the same way through either."""
        self.validate_task(task)
        definition = registry.lookup(task.module_path)
        if definition is None:  # declared before the app registry was ready, not finished yet
            raise InvalidTask(f"{task.module_path} is not declared yet (apps not ready?)")
        call_args, call_kwargs = normalize_json(list(args)), normalize_json(dict(kwargs))
        options: dict[str, Any] = {"queue": task.queue_name, "priority": task.priority}
        stored: dict[str, Any] = {"args": call_args, "kwargs": call_kwargs, "backend": self.alias}
        if task.run_after is not None:
            when = task.run_after
            if timezone.is_naive(when):  # USE_TZ = False: Django allows naive dates
                when = timezone.make_aware(when)
            options["run_at"] = when
            stored["run_after"] = when.isoformat()
        max_attempts = getattr(task, "max_attempts", None) or self.max_attempts
        if max_attempts is not None:
            options["max_attempts"] = max_attempts
        key = getattr(task, "idempotency_key", None)
        if callable(key):
            key = key(*call_args, **call_kwargs)
        if key is not None:
            options["idempotency_key"] = key
        unique_for = getattr(task, "unique_for", None)
        if unique_for is not None:
            options["unique_for"] = unique_for
        return BoundJob(definition, options), stored

    def enqueue(self, task: Task, args: Sequence[Any], kwargs: Mapping[str, Any]) -> TaskResult:
        bound, stored = self.prepare(task, args, kwargs)
        handle = bound.enqueue(**stored)
        if not handle.created:
            # The idempotency key named a live task: that one is the answer, and nothing new
            # was enqueued, so no task_enqueued either.
            return self.get_result(str(handle.id))
        # enqueued_at is the row's created_at (the database's clock, at the insert), read back
        # by primary key in the caller's transaction: get_result() reports that one, so the
        # result returned here equals it (tests/integration/test_django_tasks_contract.py).
        result = TaskResult(
            task=task, id=str(handle.id), status=TaskResultStatus.READY,
            enqueued_at=handle.get().created_at, started_at=None, last_attempted_at=None,
            finished_at=None, args=stored["args"], kwargs=stored["kwargs"], backend=self.alias,
            errors=[], worker_ids=[],
        )
        task_enqueued.send(sender=type(self), task_result=result)
        return result

    def enqueue_on_commit(self, task: Task, args: Sequence[Any], kwargs: Mapping[str, Any]
                          ) -> TaskResult:
        """``prepare`` plus the outbox: staged in the caller's transaction on "default";
        ``task_enqueued`` is sent once that transaction commits (never for a rollback)."""

        bound, stored = self.prepare(task, args, kwargs)
        staged = bound.enqueue_on_commit(**stored)
        status = staged.status()  # the caller's connection sees its own uncommitted staging
        assert status is not None
        result = TaskResult(
            task=task, id=str(staged.id), status=TaskResultStatus.READY,
            enqueued_at=status.staged_at, started_at=None, last_attempted_at=None,
            finished_at=None, args=stored["args"], kwargs=stored["kwargs"], backend=self.alias,
            errors=[], worker_ids=[],
        )
        transaction.on_commit(
            lambda: task_enqueued.send(sender=type(self), task_result=result), using=staged.using
        )
        return result

    # --------------------------------------------------------------------------- results --
    def get_result(self, result_id: str) -> TaskResult:
        try:
            record = api.get_job(str(result_id))
        except JobNotFound:
            return self._staged_result(str(result_id))
        task = declared(record.name)
        if task is None:
            # Not a task of this backend, or one this process never imported: never import
            # the stored name to find out (module docstring).
            raise TaskResultDoesNotExist(
                f"{result_id} is not a task of this backend known to this process "
                f"(job {record.name!r})"
            )
        return to_task_result(record, task, default_backend=self.alias)

    def _staged_result(self, result_id: str) -> TaskResult:
        """A task staged by ``enqueue_on_commit`` whose staging committed but that no relay has
        published yet is READY; one whose key named a live task is that task."""

        for alias in conf.get().outbox.databases:
            try:
                status = outbox.StagedJob(UUID(result_id), alias).status()
            except ValueError:
                break  # not a uuid: no such result anywhere
            if status is None:
                continue
            if status.job_id is not None and str(status.job_id) != result_id:
                return self.get_result(str(status.job_id))
            task = declared(status.name)
            if task is None or status.published_at is not None:
                break  # not ours, or published and since purged
            stored = status.input if isinstance(status.input, dict) else {}
            backend = stored.get("backend")
            backend = backend if isinstance(backend, str) else self.alias
            return TaskResult(
                task=_as_enqueued(task, backend, stored.get("run_after")), id=result_id,
                status=TaskResultStatus.READY, enqueued_at=status.staged_at, started_at=None,
                last_attempted_at=None, finished_at=None, args=list(stored.get("args", [])),
                kwargs=dict(stored.get("kwargs", {})), backend=backend, errors=[],
                worker_ids=[],
            )
        raise TaskResultDoesNotExist(result_id)

    # ----------------------------------------------------------------------------- checks --
    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        messages: list[checks.CheckMessage] = []
        if not apps.is_installed("django_xjobs"):
            messages.append(checks.Error(
                f"TASKS[{self.alias!r}] uses {type(self).__name__}, but django_xjobs is not in "
                "INSTALLED_APPS (its tables, worker and task discovery live there)",
                hint='Add "django_xjobs" to INSTALLED_APPS and run manage.py migrate. See '
                     f"{conf.DOCS_URL}django-tasks.md",
                id="xjobs.T001",
            ))
        bad = sorted(q for q in self.queues if not values.NAME_RE.match(q))
        if bad:
            messages.append(checks.Error(
                f"TASKS[{self.alias!r}]['QUEUES'] has invalid queue names {bad}: use 1-200 "
                "characters from [A-Za-z0-9_.:-]",
                hint="Rename the queues in TASKS[...]['QUEUES'] (and in XJOBS['QUEUES'] and "
                     f"every @task(queue_name=...)). See {conf.DOCS_URL}django-tasks.md",
                id="xjobs.T002",
            ))
        try:
            worked = set(registry.worked_queues())
        except ConfigurationError:
            return messages  # reported by django-xjobs' own check (xjobs.E001)
        idle = sorted(set(self.queues) - worked - set(bad))
        if idle:
            messages.append(checks.Warning(
                f"TASKS[{self.alias!r}]['QUEUES'] has {idle}, which XJOBS['QUEUES'] does not "
                "list: a worker started without --queue does not run their tasks",
                hint="Add them to XJOBS['QUEUES'], or start xjobs_worker --queue for each. "
                     f"See {conf.DOCS_URL}django-tasks.md",
                id="xjobs.T003",
            ))
        return messages
