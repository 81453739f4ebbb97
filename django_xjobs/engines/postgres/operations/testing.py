"""What django_xjobs.testing asks of the engine (docs/testing.md). On the caller's connection
like every operation, so they work inside a TestCase's transaction."""

from __future__ import annotations

from collections.abc import Sequence

from ....records import ClaimedJob, JobRecord
from ..core import PostgresCore
from ..params import as_uuid
from ..rows import claimed_job, job_record
from ..statements.claim import JOB_CLAIM_IF_DUE
from ..statements.jobs import JOBS_SHIFT_DUE
from ..statements.reads import JOBS_LIST


class Testing(PostgresCore):
    """The seam's test-support operations."""

    def job_claim_if_due(self, job_id: str, *, worker_id: str,
                         lease_ms: int) -> ClaimedJob | None:
        job_uuid = as_uuid(job_id)
        if job_uuid is None:
            return None
        r = self._run(JOB_CLAIM_IF_DUE, {
            "id": job_uuid, "worker_id": worker_id, "lease_ms": lease_ms,
        }, fetch="one")
        return claimed_job(r) if r is not None else None

    def jobs_shift_due(self, shift_ms: int) -> int:
        return int(self._run(JOBS_SHIFT_DUE, {"shift_ms": shift_ms}, fetch="one")[0])

    def jobs_list(self, *, name: str | None = None, queue: str | None = None,
                  states: Sequence[str] | None = None, tenant_id: str | None = None,
                  limit: int | None = None) -> list[JobRecord]:
        return [job_record(r) for r in self._run(JOBS_LIST, {
            "name": name, "queue": queue, "states": None if states is None else list(states),
            "tenant_id": tenant_id, "limit": limit,
        })]
