"""A backfill's passes (``x_backfills``; django_xjobs/backfills/)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

# A pass is `pending` from `xjobs_backfill start` until a worker opens it, `running` while a
# worker (or a retry due soon) owns it, and ends `completed`, `failed` (cursor kept: a retry
# resumes there) or `cancelled` (also resumable). See django_xjobs/backfills/passes.py.
BACKFILL_STATUSES: tuple[str, ...] = ("pending", "running", "completed", "failed", "cancelled")


@dataclass(frozen=True, slots=True, kw_only=True)
class BackfillRecord:
    """One ``x_backfills`` row: a pass of a backfill, keyed by the run_id of the job running it.

    ``job_state`` and ``job_attempt`` come from the pass's job row (None when the job is gone,
    or when the statement that returned this record does not read it).
    """

    run_id: UUID
    name: str
    status: str
    rows_processed: int
    last_cursor: Any
    checksum: str | None
    app_version: str | None
    started_at: datetime
    completed_at: datetime | None
    updated_at: datetime | None
    error: str | None
    job_id: UUID | None
    code_changes: list[dict[str, Any]] = field(default_factory=list)
    job_state: str | None = None
    job_attempt: int | None = None
