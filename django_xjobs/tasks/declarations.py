"""Declaring a task: the backend's ``task_class``, its job options, and the tasks this process
knows.

``@task`` builds an :class:`XJobsTask`, whose construction runs
:meth:`~django_xjobs.tasks.XJobsBackend.validate_task`. That is where the task is registered in
the job registry (:func:`declare`), under its ``module_path``, with a runner function
(:mod:`.runner`) as the job's code. It happens when the task's MODULE is imported, so every
process that imports the module knows the task: installed apps' ``tasks.py`` are imported at
startup (:func:`django_xjobs.tasks.ready`, like ``jobs.py``).

Which code a stored name runs
-----------------------------
Only a task registered here: declared for a backend of this class, by a module-level function
of an installed app's module. A stored string is never imported: a row naming ``os.system``, a
plain function, or a task of another backend finds no registry entry, so the worker retries it
as an unknown job and it ends ``dead``; nothing is called
(tests/acceptance/test_django_tasks_worker.py). A registry filled at enqueue time would be empty
in a worker process, which never enqueues; importing ``module_path`` on demand would let a row
choose which module's top-level code runs. Declaring at import, plus startup autodiscovery of
``tasks.py``, makes the worker's registry the same as the web process's, whatever ran first.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from django.apps import apps
from django.core.exceptions import AppRegistryNotReady
from django.tasks import Task, TaskResult
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.exceptions import InvalidTask

from .. import api, registry, values
from ..exceptions import ConfigurationError, InvalidJobInput
from .runner import runner

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
      Concurrency(...))``); its key template sees the stored input's two names, ``args`` and
      ``kwargs``, whole, not a field inside them: a fixed key (``"exports"``) bounds the task as
      a whole.

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
        # Imported here: the package imports this module (XJobsTask is its task_class).
        from . import XJobsBackend

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


def declare(task: Task) -> None:
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
        runner(task), name=path, queue=task.queue_name, priority=task.priority,
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



def finish_deferred() -> None:
    """Declare the tasks declared while the app registry was loading (at ``ready()``)."""
    with _lock:
        early = list(_deferred)
        _deferred.clear()
    for task in early:
        declare(task)
