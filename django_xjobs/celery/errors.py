"""The exceptions of the Celery surface, under Celery's names where Celery has one."""

from __future__ import annotations

import builtins

from ..exceptions import PermanentError, XJobsError


class NotSupported(XJobsError):
    """A Celery construct this surface does not take: the message names what to use instead
    (docs/from-celery.md, "What does not port")."""


class TimeoutError(builtins.TimeoutError):  # Celery's name, and the built-in's
    """``AsyncResult.get(timeout=...)`` waited that long and the task had not finished.
    A subclass of the built-in ``TimeoutError``, so either name catches it."""


class TaskRevokedError(XJobsError):
    """``AsyncResult.get()`` of a task that was cancelled (Celery's "revoked")."""


class MaxRetriesExceededError(XJobsError):
    """Celery's name, exported so that ``except MaxRetriesExceededError`` still imports. A
    retry past the bound is not raised here: the job ends ``dead`` with the error it retried
    on (``FAILURE``), as Celery does when ``self.retry(exc=...)`` is given an exception."""


class TaskExpired(PermanentError):
    """The task was claimed after its ``expires=``: it is not run, and ends ``dead`` with this
    error (Celery marks such a task revoked; ``AsyncResult.status`` says ``REVOKED``)."""


class TaskFailed(XJobsError):
    """What ``AsyncResult.get()`` raises for a failed task whose exception class cannot be
    rebuilt here; the message is the error the job recorded."""
