"""The surface a Celery codebase calls, over django-xjobs: a tasks module ports by changing
its imports (docs/from-celery.md)::

    from django_xjobs.celery import shared_task, chain, group, chord, AsyncResult

    @shared_task(bind=True, autoretry_for=(ConnectionError,), max_retries=5,
                 retry_backoff=True)
    def charge(self, order_id): ...

    charge.delay(42)                                 # a job, in the caller's transaction
    chain(reserve.s(42), charge.s(), notify.si(42)).delay()
    AsyncResult(result_id).get(timeout=10)

A task is a job (``task.job``): the console, ``manage.py xjobs``, retries, leases, the outbox
and the rest apply to it unchanged. Tasks live in an app's ``tasks.py``, which is imported at
start-up like ``jobs.py``. What this surface does not take raises :class:`NotSupported`,
naming what to use instead.
"""

from __future__ import annotations

__all__ = [
    "AsyncResult",
    "Celery",
    "MaxRetriesExceededError",
    "NotSupported",
    "Signature",
    "Task",
    "TaskExpired",
    "TaskFailed",
    "TaskRevokedError",
    "TimeoutError",
    "chain",
    "chord",
    "crontab",
    "current_request",
    "group",
    "shared_task",
    "signature",
    "states",
]

from typing import Any

from .. import api
from ..scheduler.celery_beat import crontab
from .base import current_request, enqueue_options, lookup
from .canvas import Signature, chain, chord, group, signature
from .errors import (
    MaxRetriesExceededError,
    NotSupported,
    TaskExpired,
    TaskFailed,
    TaskRevokedError,
    TimeoutError,
)
from .result import AsyncResult, states
from .task import Task, shared_task


class Celery:
    """Celery's application object, for the ``app.task`` / ``app.send_task`` /
    ``app.AsyncResult`` a project calls: the configuration is the project's ``XJOBS``
    setting, and tasks are found in ``tasks.py`` without ``autodiscover_tasks()``."""

    def __init__(self, main: str | None = None, **_: Any) -> None:
        self.main = main

    def task(self, *args: Any, **options: Any) -> Any:
        return shared_task(*args, **options)

    def config_from_object(self, *_: Any, **__: Any) -> None:
        """Nothing to read: django-xjobs reads ``settings.XJOBS``."""

    def autodiscover_tasks(self, *_: Any, **__: Any) -> None:
        """Nothing to do: every installed app's ``tasks.py`` is imported at start-up."""

    def send_task(self, name: str, args: Any = None, kwargs: Any = None,
                  **options: Any) -> AsyncResult:
        """Enqueue the task registered under ``name`` (a ``@shared_task``, or any job)."""
        task = lookup(name)
        if task is not None:
            return task.apply_async(args, kwargs, **options)
        if args:
            raise NotSupported(f"send_task({name!r}, args=...): {name} is not a Celery-style "
                               "task here; pass its input by keyword (kwargs=)")
        handle = api.enqueue(name, dict(kwargs or {}), **enqueue_options(name, options))
        return AsyncResult(handle.id, task_name=name)

    def AsyncResult(self, task_id: Any) -> AsyncResult:  # Celery's name
        return AsyncResult(task_id)
