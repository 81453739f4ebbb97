"""A ``django.tasks`` backend (Django 6+): ``@task`` functions become ``x_jobs`` rows and run in
``manage.py xjobs_worker``, with the retries, leases and fencing of every other job::

    TASKS = {"default": {"BACKEND": "django_xjobs.tasks.XJobsBackend",
                         "QUEUES": ["default"], "OPTIONS": {"MAX_ATTEMPTS": 3}}}

The public surface: :class:`XJobsBackend` (the ``BACKEND`` path above, defined here), its
``task_class`` :class:`XJobsTask` (``@task`` with job options), and the mapping of a row to a
``TaskResult`` (:func:`status_of`, :func:`task_error_of`, :func:`to_task_result`).

How a task travels (docs/django-tasks.md has the user's view)
--------------------------------------------------------------
1. **Declare** (``declarations.py``). ``@task`` builds an :class:`XJobsTask`, whose
   construction registers it in the job registry under its ``module_path``, with a runner
   function as the job's code, when its module is imported; installed apps' ``tasks.py`` are
   imported at startup (:func:`ready`, like ``jobs.py``). Only a declared task ever runs: a
   stored name is never imported (that module's docstring says why).
2. **Enqueue** (here). :meth:`XJobsBackend.enqueue` goes through ``decorator.BoundJob.enqueue``, the
   very path ``my_job.enqueue`` takes: same validation, same statement, the caller's
   transaction. The row's ``name`` is the ``module_path``; its ``input`` is ``{"args": [...],
   "kwargs": {...}, "backend": alias}`` (plus ``run_after``); its ``priority`` is the task's
   priority, unchanged: both scales run the higher number first (the claim orders by
   ``priority desc``). The result's ``enqueued_at`` is the row's ``created_at``, read back in
   the caller's transaction, so it is the result ``get_result`` reads later.
   ``task_enqueued`` is sent after the insert, inside the caller's transaction like the row.
3. **Run** (``runner.py``). A worker claims the row like any job and calls the runner, which
   sends ``task_started`` and, when the attempt ends the task, ``task_finished``; the worker's
   fenced statements write the outcome.
4. **Read** (``mapping.py``). :meth:`XJobsBackend.get_result` reads the row and maps it
   (:func:`to_task_result`); the status table is in that module's docstring.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from uuid import UUID

try:
    import django.tasks  # noqa: F401 (this package imports from it below)
except ImportError as exc:  # Django 5.2: no django.tasks
    raise ImportError(
        "django_xjobs.tasks is a django.tasks backend and needs Django 6.0 or newer; on older "
        "Django use @job from django_xjobs"
    ) from exc

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.db import transaction
from django.tasks import Task, TaskResult, TaskResultStatus
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.exceptions import InvalidTask, InvalidTaskBackend, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued
from django.utils import timezone
from django.utils.module_loading import autodiscover_modules, import_string

from .. import api, conf, outbox, registry, values
from ..decorator import BoundJob
from ..exceptions import ConfigurationError, JobNotFound
from .declarations import XJobsTask, declare, declared, finish_deferred
from .mapping import (
    as_enqueued,
    normalize,
    status_of,
    task_error_of,
    task_result,
    to_task_result,
)

__all__ = [
    "XJobsBackend",
    "XJobsTask",
    "status_of",
    "task_error_of",
    "to_task_result",
]

OPTIONS = frozenset({"MAX_ATTEMPTS"})


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
        declare(task)

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
        # JSON values and the typed ones a row keeps (mapping.normalize), as stored and as the
        # function receives them.
        call_args, call_kwargs = normalize(list(args)), normalize(dict(kwargs))
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
        result = task_result(
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
        result = task_result(
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
            # the stored name to find out (declarations.py, "Which code a stored name runs").
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
            return task_result(
                task=as_enqueued(task, backend, stored.get("run_after")), id=result_id,
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


def ready() -> None:
    """At startup (``AppConfig.ready``): finish early declarations, then, when a ``TASKS``
    backend is of this class, import every installed app's ``tasks.py`` so that this process
    (a worker, typically) knows every task, as ``jobs.py`` are imported for ``@job``."""
    finish_deferred()
    if any(_is_ours(params) for params in getattr(settings, "TASKS", {}).values()):
        autodiscover_modules("tasks")


def _is_ours(params: Any) -> bool:
    try:
        backend = import_string(params["BACKEND"])
    except (ImportError, KeyError, TypeError):
        return False  # django.tasks reports a bad BACKEND itself, at first use
    return isinstance(backend, type) and issubclass(backend, XJobsBackend)
