"""Jobs staged by ``enqueue_on_commit`` (``x_outbox``; docs/transactional-enqueue.md)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from .enqueue import JobSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class OutboxRow(JobSpec):
    """One ``x_outbox`` row: a job staged by ``enqueue_on_commit``, not yet (or being) relayed.

    ``id`` is also the id the job gets when the relay publishes it (unless an idempotency key
    names a live job already). Staged with either ``run_at`` (absolute) or ``delay_ms``
    (counted from the staging); a claimed row carries the resolved ``run_at`` (None: due now)
    and ``delay_ms = 0``. ``enqueued_by`` is None when the stager knew nobody better than
    "outbox" (docs/transactional-enqueue.md).
    """

    max_attempts: int | None  # None: XJOBS["MAX_ATTEMPTS"] when the relay publishes it


@dataclass(frozen=True, slots=True, kw_only=True)
class OutboxStatus:
    """Where a staged row is: pending (``published_at`` None) or relayed into job ``job_id``."""

    id: UUID
    name: str
    staged_at: datetime
    published_at: datetime | None
    job_id: UUID | None
    input: Any = None  # the job's input as staged
