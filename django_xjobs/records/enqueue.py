"""What an enqueue sends the engine, and what it answers."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSpec:
    """One job as a caller asked for it: the fields an enqueue (:class:`EnqueueParams`) and an
    outbox staging (:class:`OutboxRow`) share. ``input_json`` is already validated and encoded
    by the API layer."""

    id: UUID
    name: str
    queue: str
    input_json: str
    idempotency_key: str | None  # None: the job's own id (never deduplicates)
    priority: int = 0
    run_at: datetime | None = None  # absolute, aware; None = now + delay_ms on the DB clock
    delay_ms: int = 0
    tenant_id: str | None = None
    traceparent: str | None = None
    enqueued_by: str | None = None
    concurrency_key: str | None = None
    rate_key: str | None = None  # ratelimits.py
    # The idempotency window in ms (docs/durable.md, "Idempotency windows"): None for none,
    # UNIQUE_FOREVER for a key that never frees.
    unique_for_ms: int | None = None


# JobSpec.unique_for_ms of ``unique_for="forever"``, as x_jobs.unique_for_ms stores it.
UNIQUE_FOREVER = -1


@dataclass(frozen=True, slots=True, kw_only=True)
class EnqueueParams(JobSpec):
    """One job to insert."""

    run_id: UUID
    max_attempts: int


@dataclass(frozen=True, slots=True, kw_only=True)
class EnqueueResult:
    """What enqueue tells the caller: the live job for the key, and whether this call made it."""

    id: UUID
    run_id: UUID
    created: bool
    # "purged" (and run_id the id) for an idempotency window's holder that retention deleted
    state: str
