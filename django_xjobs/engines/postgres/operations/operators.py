"""An operator's actions on one job (the console, the commands, the API's cancel and retry):
each answers with the job as it is after it, and whether this call changed it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any
from uuid import UUID

from django.db import IntegrityError
from django.db import transaction as db_transaction

from ....exceptions import LiveJobExists
from ....records import ChangeResult, JobRecord
from ..core import PostgresCore
from ..params import as_uuid, tenants, uuid_array
from ..rows import job_record
from ..statements.history import JOB_UNARCHIVE
from ..statements.jobs import JOB_CANCEL, JOB_RETRY, JOB_RUN_NOW
from ..statements.maintenance import JOBS_DELETE_FINISHED
from ..statements.reads import JOB_GET


class _Unchanged(Exception):
    """Rolls back an operator's change that turned out to change nothing (its savepoint)."""


class Operators(PostgresCore):
    """The seam's operator actions on one job."""

    def job_get(self, job_id: str, *, tenant_ids: Iterable[str] | None = None) -> JobRecord | None:
        job_uuid = as_uuid(job_id)
        if job_uuid is None:
            return None
        row = self._run(JOB_GET, {"id": job_uuid, "tenant_ids": tenants(tenant_ids)},
                        fetch="one")
        return job_record(row) if row is not None else None

    def _change_result(self, row: Sequence[Any] | None, job_id: str,
                       tenant_ids: Iterable[str] | None, *, unchanged: str) -> ChangeResult:
        """An operator's action answered: the job as the statement changed it, or, when it
        matched no row, the job as it is now with the reason ``unchanged`` (``{state}`` filled
        in), or "not found" (also for a job outside the tenant scope)."""
        if row is not None:
            return ChangeResult(job=job_record(row), changed=True)
        current = self.job_get(job_id, tenant_ids=tenant_ids)
        if current is None:
            return ChangeResult(job=None, changed=False, reason="not found")
        return ChangeResult(job=current, changed=False,
                            reason=unchanged.format(state=current.state))

    def job_cancel(
        self, job_id: str, *, reason: str | None, tenant_ids: Iterable[str] | None = None
    ) -> ChangeResult:
        job_uuid = as_uuid(job_id)
        if job_uuid is None:
            return ChangeResult(job=None, changed=False, reason="not found")
        # A savepoint: the job's move back from its history table, its live children's cancel
        # and its own are one. The children go first (jobs_cancel_tree says why); when the job
        # itself cannot be cancelled (finished, another tenant's), neither are they.
        try:
            with db_transaction.atomic(using=self.alias):
                self._unarchive(job_uuid, tenant_ids)
                self.jobs_cancel_tree(parents=[str(job_uuid)], reason=reason)
                row = self._run(JOB_CANCEL, {
                    "id": job_uuid, "reason": reason, "tenant_ids": tenants(tenant_ids),
                }, fetch="one")
                if row is None:
                    raise _Unchanged
                # Children a parent inserted while the first pass ran were not visible to it;
                # the cancel above waited for that parent's transaction, so this statement's
                # snapshot sees them.
                self.jobs_cancel_tree(parents=[str(job_uuid)], reason=reason)
        except _Unchanged:
            row = None
        return self._change_result(row, job_id, tenant_ids, unchanged="already {state}")

    def _unarchive(self, job_uuid: UUID, tenant_ids: Iterable[str] | None) -> None:
        """Move a finished job (and its steps) back from its history table into x_jobs, if it
        is in one, so that an operator's change to it can run on x_jobs (job_unarchive)."""
        self._run(JOB_UNARCHIVE, {"id": job_uuid, "tenant_ids": tenants(tenant_ids)},
                  fetch="count")

    def job_retry(self, job_id: str, *, tenant_ids: Iterable[str] | None = None,
                  enqueued_by: str | None = None) -> ChangeResult:
        job_uuid = as_uuid(job_id)
        if job_uuid is None:
            return ChangeResult(job=None, changed=False, reason="not found")
        try:
            # A savepoint, so a refused retry inside the caller's transaction leaves it usable.
            with db_transaction.atomic(using=self.alias):
                self._unarchive(job_uuid, tenant_ids)
                row = self._run(JOB_RETRY, {
                    "id": job_uuid, "tenant_ids": tenants(tenant_ids), "notify": self.notify,
                    "enqueued_by": enqueued_by,
                }, fetch="one")
        except IntegrityError:
            current = self.job_get(job_id, tenant_ids=tenant_ids)
            live = None
            if current is not None:
                live = self.job_find_live_by_key(
                    current.name, current.tenant_id, current.idempotency_key
                )
            raise LiveJobExists(
                f"job {job_id} was not retried: live job {live.id if live else '?'} holds its "
                f"idempotency key",
                live_job_id=str(live.id) if live else None,
            ) from None
        return self._change_result(
            row, job_id, tenant_ids,
            unchanged="is {state}, only dead or cancelled jobs can be retried",
        )

    def job_run_now(self, job_id: str, *, tenant_ids: Iterable[str] | None = None) -> ChangeResult:
        job_uuid = as_uuid(job_id)
        if job_uuid is None:
            return ChangeResult(job=None, changed=False, reason="not found")
        row = self._run(JOB_RUN_NOW, {
            "id": job_uuid, "tenant_ids": tenants(tenant_ids), "notify": self.notify,
        }, fetch="one")
        return self._change_result(row, job_id, tenant_ids, unchanged="is {state} and due")

    def jobs_delete_finished(
        self, ids: Sequence[str], *, tenant_ids: Iterable[str] | None = None
    ) -> int:
        uuids = [u for u in (as_uuid(i) for i in ids) if u is not None]
        if not uuids:
            return 0
        return self._run(JOBS_DELETE_FINISHED, {
            "ids": uuid_array(uuids), "tenant_ids": tenants(tenant_ids),
        }, fetch="count")
