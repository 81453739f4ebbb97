"""The outbox (docs/transactional-enqueue.md): ``x_outbox`` lives on the app's alias, so these
run on the engine of that alias, all but jobs_find_by_ids, which reads the jobs'."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from uuid import UUID

from ....records import EnqueueResult, OutboxRow, OutboxStatus
from ...base import Listener
from ..core import PostgresCore
from ..params import as_uuid, uuid_array
from ..rows import decode_json
from ..sessions import PostgresListener
from ..statements.outbox import (
    JOBS_FIND_BY_IDS,
    OUTBOX_CLAIM,
    OUTBOX_LISTEN,
    OUTBOX_MARK_PUBLISHED,
    OUTBOX_STAGE,
    OUTBOX_STATUS,
)


class Outbox(PostgresCore):
    """The seam's outbox operations."""

    def outbox_stage(self, row: OutboxRow) -> None:
        self._run(OUTBOX_STAGE, {
            "id": row.id, "name": row.name, "queue": row.queue, "input": row.input_json,
            "key": row.idempotency_key, "max_attempts": row.max_attempts,
            "run_at": row.run_at, "delay_ms": row.delay_ms, "priority": row.priority,
            "tenant_id": row.tenant_id, "traceparent": row.traceparent,
            "enqueued_by": row.enqueued_by, "concurrency_key": row.concurrency_key,
            "rate_key": row.rate_key, "unique_for_ms": row.unique_for_ms,
            "notify": self.notify,
        }, fetch="one")

    def outbox_claim(self, batch_size: int) -> list[OutboxRow]:
        return [
            OutboxRow(
                id=r[0], name=r[1], queue=r[2], input_json=r[3], idempotency_key=r[4],
                max_attempts=r[5], run_at=r[6], priority=r[7], tenant_id=r[8],
                traceparent=r[9], enqueued_by=r[10], concurrency_key=r[11], rate_key=r[12],
                unique_for_ms=r[13],
            )
            for r in self._run(OUTBOX_CLAIM, {"batch": batch_size})
        ]

    def outbox_mark_published(self, published: Mapping[UUID, UUID]) -> int:
        if not published:
            return 0
        return int(self._run(OUTBOX_MARK_PUBLISHED, {
            "ids": uuid_array(published), "job_ids": uuid_array(published.values()),
        }, fetch="count"))

    def outbox_status(self, outbox_id: UUID | str) -> OutboxStatus | None:
        outbox_uuid = as_uuid(outbox_id)
        if outbox_uuid is None:
            return None
        row = self._run(OUTBOX_STATUS, {"id": outbox_uuid}, fetch="one")
        if row is None:
            return None
        return OutboxStatus(id=row[0], name=row[1], staged_at=row[2], published_at=row[3],
                            job_id=row[4], input=decode_json(row[5]))

    def jobs_find_by_ids(self, ids: Sequence[UUID]) -> list[EnqueueResult]:
        if not ids:
            return []
        return [
            EnqueueResult(id=r[0], run_id=r[1], created=False, state=r[2])
            for r in self._run(JOBS_FIND_BY_IDS, {"ids": uuid_array(ids)})
        ]

    def outbox_listener(self, channel_label: str) -> Listener:
        return PostgresListener(self.listen_alias, channel_label, listen=OUTBOX_LISTEN)
