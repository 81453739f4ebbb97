"""An operator's actions on one job (the console, the commands, the API's cancel and retry):
each answers with the job as it is after it, and whether this call changed it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any
from uuid import UUID

from django.db import IntegrityError
from django.db import transaction as db_transaction

from ....exceptions import ERROR_CLASS_PREFIX, ChildFailed, LiveJobExists, class_path
from ....records import ChangeResult, JobRecord, Reopened, ResumeResult
from ..core import PostgresCore
from ..params import as_uuid, tenants, uuid_array
from ..rows import job_record
from ..statements.history import JOB_UNARCHIVE, JOBS_UNARCHIVE
from ..statements.jobs import (
    JOB_CANCEL,
    JOB_RESUME,
    JOB_RESUME_PLAN,
    JOB_RETRY,
    JOB_RUN_NOW,
    JOBS_RETRY_MANY,
)
from ..statements.maintenance import JOBS_DELETE_FINISHED
from ..statements.reads import JOB_GET


class _Unchanged(Exception):
    """Rolls back an operator's change that turned out to change nothing (its savepoint)."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = reason


# The first line of the error a job that raised ChildFailed records (values.record_error).
CHILD_FAILED_ERROR = f"{ERROR_CLASS_PREFIX}{class_path(ChildFailed)}\n"
# How deep a resume follows children that are dead workflows themselves.
RESUME_DEPTH = 20


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

    def job_resume(self, job_id: str, *, tenant_ids: Iterable[str] | None = None,
                   enqueued_by: str | None = None) -> ResumeResult:
        job_uuid = as_uuid(job_id)
        current = None if job_uuid is None else self.job_get(str(job_uuid),
                                                             tenant_ids=tenant_ids)
        if job_uuid is None or current is None:
            return ResumeResult(job=None, changed=False, reason="not found")
        if current.state != "dead":
            return ResumeResult(job=current, changed=False, reason=(
                f"is {current.state}: only a dead workflow can be resumed"
                + (" (retry puts a cancelled job back on its queue)"
                   if current.state == "cancelled" else "")))
        scope = tenants(tenant_ids)
        # One savepoint: the family's move back from the history tables and the resume are
        # one; a resume refused or overtaken (_Unchanged) leaves nothing behind.
        try:
            with db_transaction.atomic(using=self.alias):
                ids, steps, reopened = self._resume_plan(job_uuid, scope)
                for moved in ids:  # the workflow first, then its children by id
                    self._unarchive(moved, tenant_ids)
                row = self._run(JOB_RESUME, {
                    "id": job_uuid, "ids": uuid_array(ids), "step_ids": steps,
                    "tenant_ids": scope, "enqueued_by": enqueued_by, "notify": self.notify,
                }, fetch="one")
                if row is None:
                    raise _Unchanged("changed while it was being resumed (retried, cancelled "
                                     "or deleted meanwhile); look again and resume it again")
        except _Unchanged as exc:
            now = self.job_get(job_id, tenant_ids=tenant_ids)
            return ResumeResult(job=now, changed=False,
                                reason=exc.reason if now is not None else "not found")
        except IntegrityError:
            live = self.job_find_live_by_key(current.name, current.tenant_id,
                                             current.idempotency_key)
            raise LiveJobExists(
                f"job {job_id} was not resumed: live job {live.id if live else '?'} holds its "
                f"idempotency key", live_job_id=str(live.id) if live else None,
            ) from None
        return ResumeResult(job=job_record(row), changed=True, reopened=reopened)

    def _resume_plan(self, job_uuid: UUID, scope: list[str] | None
                     ) -> tuple[list[UUID], list[int], tuple[Reopened, ...]]:
        """job_resume_plan read into what job_resume changes: the jobs to retry (the workflow,
        then the dead or cancelled children of each failed step, by id), the failed steps to
        open again, and what to report; _Unchanged with the reason when it cannot be done."""
        rows = self._run(JOB_RESUME_PLAN, {
            "id": job_uuid, "tenant_ids": scope, "error_prefix": CHILD_FAILED_ERROR,
            "limit": RESUME_DEPTH,
        })
        if not rows:
            raise _Unchanged("changed while it was being resumed; look again")
        if not any(r[1] for r in rows):
            raise _Unchanged("recorded no durable step: it is no workflow; retry it to run "
                             "it again from the start")
        children: list[UUID] = []
        steps: dict[int, tuple[UUID, str, list[UUID]]] = {}
        for flow_id, _, step_id, step, _n, child, state, tenant in rows:
            if step_id is None or child is None:
                continue
            retried = steps.setdefault(step_id, (flow_id, step, []))[2]
            if state is None:
                raise _Unchanged(f"child {child} of step {step!r} of job {flow_id} no longer "
                                 "exists, so the step cannot wait for it again")
            if scope is not None and tenant not in scope:
                raise _Unchanged(f"child {child} of step {step!r} of job {flow_id} is outside "
                                 "your tenant scope")
            if state in ("dead", "cancelled") and child not in children:
                children.append(child)
                retried.append(child)
        reopened = tuple(Reopened(job_id=flow_id, step=step, retried=tuple(retried))
                         for flow_id, step, retried in steps.values())
        return [job_uuid, *sorted(children)], list(steps), reopened

    def jobs_retry_many(self, ids: Sequence[str], *, tenant_ids: Iterable[str] | None = None,
                        enqueued_by: str | None = None) -> list[str]:
        uuids = [u for u in (as_uuid(i) for i in ids) if u is not None]
        if not uuids:
            return []
        params = {"ids": uuid_array(uuids), "tenant_ids": tenants(tenant_ids)}
        try:
            # One transaction: the batch's archived rows come back and are retried together.
            with db_transaction.atomic(using=self.alias):
                self._run(JOBS_UNARCHIVE, params, fetch="count")
                rows = self._run(JOBS_RETRY_MANY, {**params, "notify": self.notify,
                                                   "enqueued_by": enqueued_by}, fetch="all")
            return [str(row[0]) for row in rows]
        except IntegrityError:
            # An enqueue of one of the keys committed meanwhile: this batch one job at a time,
            # each refused retry skipped (jobs_retry_many's why).
            retried = []
            for job_id in uuids:
                try:
                    if self.job_retry(str(job_id), tenant_ids=tenant_ids,
                                      enqueued_by=enqueued_by).changed:
                        retried.append(str(job_id))
                except LiveJobExists:
                    continue
            return retried

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
