"""The worker processes (``x_workers``: each one's heartbeat and what it reports) and the
fleet's compatibility (``x_fleet``; docs/deployment.md, "Mixed versions")."""

from __future__ import annotations

import json
from collections.abc import Sequence

from ....records import FleetRecord, WorkerRecord, stall_reason
from ..core import PostgresCore
from ..statements.fleet import FLEET_GET, FLEET_SET
from ..statements.workers import HORIZON_AGE, WORKER_GONE, WORKER_SEEN, WORKERS_LIST


class Workers(PostgresCore):
    """The seam's worker and fleet operations."""

    def worker_seen(self, worker_id: str, host: str, pid: int, queues: Sequence[str], *,
                    version: str, concurrency: int, running: int, finished: int,
                    claimed_age: float | None, loop_age: float | None) -> None:
        self._run(WORKER_SEEN, {
            "worker_id": worker_id, "host": host, "pid": pid, "queues": json.dumps(list(queues)),
            "version": version, "concurrency": concurrency, "running": running,
            "finished": finished,
            "claimed_age_ms": None if claimed_age is None else round(claimed_age * 1000),
            "loop_age_ms": None if loop_age is None else round(loop_age * 1000),
        }, fetch="count")

    def workers_list(self, *, max_stall: float) -> list[WorkerRecord]:
        return [
            WorkerRecord(
                id=r[0], host=r[1], pid=r[2], queues=tuple(r[3]), version=r[4],
                concurrency=r[5], running=r[6], finished=r[7], started_at=r[8], seen_at=r[9],
                claimed_at=r[10], loop_at=r[11],
                stalled=None if r[12] is None else stall_reason(r[12], float(r[13]) / 1000,
                                                                r[14], r[15]),
            )
            for r in self._run(WORKERS_LIST, {"stall_ms": round(max_stall * 1000)})
        ]

    def worker_gone(self, worker_id: str, stale_after: float = 86_400.0) -> None:
        self._run(WORKER_GONE, {"worker_id": worker_id,
                                  "stale_ms": round(stale_after * 1000)}, fetch="count")

    def fleet_get(self) -> FleetRecord:
        row = self._run(FLEET_GET, {}, fetch="one")
        return FleetRecord() if row is None else FleetRecord(
            compatible_with=row[0], changed_at=row[1], changed_by=row[2])

    def fleet_set(self, *, compatible_with: str | None, changed_by: str) -> FleetRecord:
        row = self._run(FLEET_SET, {"compatible_with": compatible_with,
                                      "changed_by": changed_by}, fetch="one")
        return FleetRecord(compatible_with=row[0], changed_at=row[1], changed_by=row[2])

    def horizon_age(self) -> int:
        return int(self._run(HORIZON_AGE, {})[0][0])
