"""django-xjobs: durable jobs on your Django project's own PostgreSQL.

The public API (everything else is internal)::

    from django_xjobs import job, enqueue, enqueue_many, JobHandle, PermanentError, Retry, Snooze
    from django_xjobs import backfill, Batch     # resumable data backfills (docs/backfills.md)
    from django_xjobs import pause_queue, pause_key, PauseKey   # docs/flow-control.md

    @job(queue="emails", max_attempts=5)
    def send_welcome(ctx, user_id: int) -> dict: ...

    send_welcome.enqueue(user_id=42)            # checked against send_welcome's parameters
    await send_welcome.aenqueue(user_id=42)     # from async code

The package is typed (``py.typed``): ``send_welcome.enqueue(...)`` is checked by mypy or
pyright against ``send_welcome``'s own parameters after ``ctx`` (docs/guide.md, "Typing").
"""

from __future__ import annotations

__all__ = [
    "Batch",
    "ChildFailed",
    "Concurrency",
    "JobContext",
    "JobHandle",
    "PauseKey",
    "PermanentError",
    "RateLimit",
    "Retry",
    "Snooze",
    "StagedJob",
    "__version__",
    "aenqueue",
    "backfill",
    "cancel",
    "enqueue",
    "enqueue_many",
    "enqueue_on_commit",
    "get_job",
    "job",
    "pause_key",
    "pause_queue",
    "pauses",
    "publish_event",
    "resume_key",
    "resume_queue",
    "retry",
]

from . import ratelimits, registry, slots, why
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
from .conf import VERSION as __version__
from .context import JobContext
from .decorator import job
from .exceptions import ChildFailed, PauseKey, PermanentError, Retry, Snooze
from .outbox import StagedJob
from .pauses import pause_key, pause_queue, pauses, resume_key, resume_queue
from .ratelimits import RateLimit
from .records import jobs as _job_records
from .scheduler import options as _cron_options
from .slots import Concurrency
from .steps import publish_event

# The @job options beyond the core ones, registered here, where the package is first imported:
# every documented option is then known wherever @job is importable, before the app registry is
# ready too (tests/unit/test_registry.py::test_every_option_is_known_before_django_setup).
registry.register_option("concurrency", slots.check_option)
registry.register_option("rate_limit", ratelimits.check_option)
for _name, _check in _cron_options.CHECKS.items():
    registry.register_option(_name, _check)

# JobRecord.blocked_by reads through django_xjobs.why, which the records, below the engines,
# cannot import (docs/flow-control.md, "Why is a job not running?").
_job_records.blocked_by_reader = why.read_blocked_by
