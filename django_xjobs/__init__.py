"""django-xjobs: durable jobs on your Django project's own PostgreSQL.

The public API (everything else is internal)::

    from django_xjobs import job, enqueue, enqueue_many, JobHandle, PermanentError, Snooze
    from django_xjobs import backfill, Batch     # resumable data backfills (docs/backfills.md)

    @job(queue="emails", max_attempts=5)
    def send_welcome(ctx, user_id: int) -> dict: ...

    send_welcome.enqueue(user_id=42)            # checked against send_welcome's parameters
    await send_welcome.aenqueue(user_id=42)     # from async code

The package is typed (``py.typed``): ``send_welcome.enqueue(...)`` is checked by mypy or
pyright against ``send_welcome``'s own parameters after ``ctx`` (docs/guide.md, "Typing").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = [
    "Batch",
    "Concurrency",
    "JobContext",
    "JobHandle",
    "PermanentError",
    "Snooze",
    "StagedJob",
    "aenqueue",
    "backfill",
    "cancel",
    "enqueue",
    "enqueue_many",
    "enqueue_on_commit",
    "get_job",
    "job",
    "publish_event",
    "retry",
]

from .context import JobContext
from .exceptions import PermanentError, Snooze
from .registry import job

# Imported for their @job options (concurrency=; cron=, timezone=, misfire=), which each
# registers on import: every documented option is then known wherever @job is importable,
# before the app registry is ready too (tests/unit/test_registry.py::
# test_every_option_is_known_before_django_setup). Both are light (no croniter, no engine).
from .scheduler import options as _scheduler_options  # noqa: F401  (registers on import)
from .slots import Concurrency

if TYPE_CHECKING:
    from .api import (
        JobHandle,
        aenqueue,
        cancel,
        enqueue,
        enqueue_many,
        enqueue_on_commit,
        get_job,
        retry,
    )
    from .backfills import Batch, backfill
    from .outbox import StagedJob
    from .steps import publish_event

_LAZY = {
    "JobHandle": "api", "cancel": "api", "enqueue": "api", "enqueue_many": "api", "aenqueue": "api",
    "get_job": "api", "retry": "api", "publish_event": "steps",
    "backfill": "backfills", "Batch": "backfills",
    "enqueue_on_commit": "api", "StagedJob": "outbox",
}


def __getattr__(name: str) -> Any:
    # api imports the engine layer; keep `import django_xjobs` light for settings modules.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'django_xjobs' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f".{module}", __name__), name)
