"""The figures the console, the commands and the metrics read (docs/observability.md): the
queues' buckets and counters, why a job is not running, the health of the tables."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime

from ....records import (
    Counters,
    FlowFacts,
    HistoryTable,
    PauseRecord,
    QueueDepth,
    QueueStats,
    RateWindow,
    TableHealth,
    XminHolder,
)
from ..core import PostgresCore
from ..params import as_uuid, tenants
from ..rows import counters
from ..statements.history import HISTORY_TABLES
from ..statements.jobs import QUEUE_DEPTH, QUEUE_STATS
from ..statements.maintenance import TABLES_HEALTH, XMIN_HORIZON
from ..statements.outbox import OUTBOX_PENDING
from ..statements.stats import STATS_SERIES, STATS_TOTALS
from ..statements.why import WHY_JOB, WHY_RATE_WINDOW


class Reads(PostgresCore):
    """The seam's reads for operators and the metrics; nothing here writes."""

    def queue_stats(self, *, tenant_ids: Iterable[str] | None = None) -> list[QueueStats]:
        return [
            QueueStats(queue=r[0], ready=r[1], delayed=r[2], running=r[3], suspended=r[4],
                       blocked=r[5], dead=r[6], done=r[7], cancelled=r[8])
            for r in self._run(QUEUE_STATS, {"tenant_ids": tenants(tenant_ids)})
        ]

    def queue_depth(self, *, tenant_ids: Iterable[str] | None = None) -> list[QueueDepth]:
        return [
            QueueDepth(queue=r[0], ready=r[1], delayed=r[2], running=r[3], suspended=r[4],
                       blocked=r[5], oldest_ready_age=r[6])
            for r in self._run(QUEUE_DEPTH, {"tenant_ids": tenants(tenant_ids)})
        ]

    def outbox_pending(
        self, *, tenant_ids: Iterable[str] | None = None
    ) -> tuple[int, float | None]:
        count, age = self._run(OUTBOX_PENDING, {"tenant_ids": tenants(tenant_ids)},
                               fetch="one")
        return int(count), age

    def stats_series(self, grain: str, since: datetime, *,
                     queue: str | None = None) -> list[Counters]:
        if grain not in ("minute", "hour", "day"):
            raise ValueError(f"grain must be minute, hour or day, not {grain!r}")
        rows = self._run(STATS_SERIES, {"grain": grain, "since": since, "queue": queue})
        return [counters(r[1], None, r[0], r[2:]) for r in rows]

    def stats_totals(self) -> list[Counters]:
        return [counters(r[0], r[1], None, r[2:]) for r in self._run(STATS_TOTALS, {})]

    def why_job(self, job_id: str, *, tenant_ids: Iterable[str] | None = None) -> FlowFacts | None:
        job_uuid = as_uuid(job_id)
        if job_uuid is None:
            return None
        r = self._run(WHY_JOB, {"id": job_uuid, "tenant_ids": tenants(tenant_ids)},
                      fetch="one")
        if r is None:
            return None
        pauses = tuple(
            PauseRecord(kind=kind, key=key,
                        until=datetime.fromisoformat(until) if until is not None else None,
                        reason=reason)
            for kind, key, until, reason in json.loads(r[11])
        )
        return FlowFacts(
            id=r[0], name=r[1], queue=r[2], state=r[3], run_at=r[4], attempt=r[5],
            last_error=r[6], concurrency_key=r[7], rate_key=r[8], blocked_on=r[9], now=r[10],
            pauses=pauses, holders=tuple(r[12]), worker_seen=r[13], unknown_since=r[14],
            unknown_workers=tuple(json.loads(r[15])) if r[15] else (), enqueued_by=r[16],
        )

    def why_rate_window(self, key: str, *, limit: int, period_ms: int, cost: int) -> RateWindow:
        spent, next_at = self._run(WHY_RATE_WINDOW, {
            "key": key, "limit": limit, "period_ms": period_ms, "cost": cost,
        }, fetch="one")
        return RateWindow(key=key, spent=int(spent), next_at=next_at)

    def history_tables(self) -> list[HistoryTable]:
        return [HistoryTable(table=r[0], rows=max(int(r[1]), 0), size_bytes=int(r[2]))
                for r in self._run(HISTORY_TABLES, {})]

    def tables_health(self) -> list[TableHealth]:
        return [
            TableHealth(table=r[0], live_tuples=r[1], dead_tuples=r[2], last_vacuum=r[3],
                        last_analyze=r[4], xid_age=r[5], freeze_max_age=r[6], size_bytes=r[7])
            for r in self._run(TABLES_HEALTH, {})
        ]

    def xmin_horizon(self, limit: int = 10) -> list[XminHolder]:
        return [
            XminHolder(kind=r[0], name=r[1], pid=r[2], state=r[3], started_at=r[4],
                       age_seconds=r[5], xmin_age=r[6], query=r[7])
            for r in self._run(XMIN_HORIZON, {"limit": limit})
        ]
