"""A backfill's passes (``x_backfills``; django_xjobs/backfills/passes.py), keyed by the run_id of
the job running each. A worker's writes are fenced on its run's claim."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ....records import BackfillRecord, RunOwner
from ...base import Statement
from ..core import PostgresCore
from ..errors import unless_busy
from ..params import as_uuid, owner_params
from ..rows import backfill_record
from ..statements.backfills import (
    BACKFILL_CANCEL,
    BACKFILL_COMPLETE_IF_OWNED,
    BACKFILL_CREATE,
    BACKFILL_FAIL_IF_OWNED,
    BACKFILL_PROGRESS_IF_OWNED,
    BACKFILL_START_IF_OWNED,
    BACKFILLS_LIST,
)


class Backfills(PostgresCore):
    """The seam's backfill operations."""

    def backfill_create(self, *, run_id: str, name: str, job_id: str, checksum: str,
                        app_version: str) -> bool:
        created = self._run(BACKFILL_CREATE, {
            "run_id": run_id, "name": name, "job_id": job_id, "checksum": checksum,
            "app_version": app_version,
        }, fetch="count")
        return bool(created)

    def _backfill_write(self, stmt: Statement, owner: RunOwner,
                        params: Mapping[str, Any]) -> Sequence[Any] | None:
        """A backfill write (fenced by a lock on the job's row taken SKIP LOCKED): its answer,
        None when it wrote nothing (the run lost its job, or the pass is not running), RowBusy
        when another transaction holds the job's row."""
        row = unless_busy(self._run(stmt, {**owner_params(owner), **params}, fetch="one"),
                          stmt.name)
        return None if row[0] is None else row[:-1]

    def backfill_start_if_owned(self, owner: RunOwner, *, name: str, checksum: str,
                                app_version: str) -> BackfillRecord | None:
        row = self._backfill_write(BACKFILL_START_IF_OWNED, owner, {
            "name": name, "checksum": checksum, "app_version": app_version})
        return backfill_record(row) if row is not None else None

    def backfill_progress_if_owned(self, owner: RunOwner, *, processed: int,
                                   cursor_json: str) -> int | None:
        row = self._backfill_write(BACKFILL_PROGRESS_IF_OWNED, owner, {
            "processed": processed, "cursor": cursor_json})
        return int(row[0]) if row is not None else None

    def backfill_complete_if_owned(self, owner: RunOwner, *, processed: int) -> int | None:
        row = self._backfill_write(BACKFILL_COMPLETE_IF_OWNED, owner,
                                   {"processed": processed})
        return int(row[0]) if row is not None else None

    def backfill_fail_if_owned(self, owner: RunOwner, *, error: str) -> bool:
        return self._backfill_write(BACKFILL_FAIL_IF_OWNED, owner, {"error": error}) is not None

    def backfill_cancel(self, run_id: str) -> BackfillRecord | None:
        run_uuid = as_uuid(run_id)
        if run_uuid is None:
            return None
        row = self._run(BACKFILL_CANCEL, {"run_id": run_uuid}, fetch="one")
        return backfill_record(row) if row is not None else None

    def backfills_list(self, *, name: str | None = None, status: str | None = None,
                       run_id: str | None = None, limit: int = 50) -> list[BackfillRecord]:
        run_uuid = None
        if run_id is not None:
            run_uuid = as_uuid(run_id)
            if run_uuid is None:
                return []
        rows = self._run(BACKFILLS_LIST, {
            "name": name, "status": status, "run_id": run_uuid, "limit": limit,
        })
        return [backfill_record(r) for r in rows]

    def backfill_get(self, run_id: str) -> BackfillRecord | None:
        found = self.backfills_list(run_id=run_id, limit=1)
        return found[0] if found else None
