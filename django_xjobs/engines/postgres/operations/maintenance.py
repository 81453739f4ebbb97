"""The pruner's work (django_xjobs/maintenance/): bounded deletes of what has served its time,
the archive of finished jobs into history tables, the fold of the counters' deltas."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from ..core import PostgresCore
from ..statements.history import HISTORY_DROP, JOBS_ARCHIVE
from ..statements.maintenance import (
    EVENTS_PURGE,
    JOBS_PURGE,
    JOBS_PURGE_ALL,
    LEASE_EXTENSIONS_PURGE,
    OUTBOX_PURGE_PUBLISHED,
)
from ..statements.slots import SLOTS_PURGE_EXPIRED
from ..statements.stats import STATS_PRUNE, STATS_ROLLUP
from ..statements.windows import JOB_KEYS_PURGE_EXPIRED


class Maintenance(PostgresCore):
    """The seam's maintenance operations."""

    def jobs_purge(
        self, *, states: Sequence[str], finished_before: datetime, batch_size: int = 1000,
        history: bool = False,
    ) -> int:
        return self._purge(JOBS_PURGE_ALL if history else JOBS_PURGE,
                           {"states": list(states), "before": finished_before}, batch_size)

    def jobs_archive(self, *, state: str, finished_before: datetime, batch_size: int = 1000,
                     finished_from: datetime | None = None,
                     keep_going: Callable[[], bool] = lambda: True) -> int:
        total = 0
        while keep_going():
            moved = self._run(JOBS_ARCHIVE, {
                "state": state, "before": finished_before, "batch": batch_size,
                "floor": finished_from,
            }, fetch="one")[0]
            total += moved
            if moved == 0:
                return total
        return total

    def history_drop(self, *, state: str, finished_before: datetime) -> list[str]:
        return [r[0] for r in self._run(HISTORY_DROP, {
            "state": state, "before": finished_before,
        })]

    def events_purge(self, batch_size: int = 1000) -> int:
        return self._purge(EVENTS_PURGE, {}, batch_size)

    def job_keys_purge_expired(self, *, batch_size: int = 1000) -> int:
        return self._purge(JOB_KEYS_PURGE_EXPIRED, {}, batch_size)

    def outbox_purge_published(self, *, published_before: datetime,
                               batch_size: int = 1000) -> int:
        return self._purge(OUTBOX_PURGE_PUBLISHED, {"before": published_before}, batch_size)

    def slots_purge_expired(self, *, grace_ms: int, batch_size: int = 1000) -> int:
        return self._purge(SLOTS_PURGE_EXPIRED, {"grace_ms": grace_ms}, batch_size)

    def lease_extensions_purge(self, *, batch_size: int = 1000) -> int:
        return self._purge(LEASE_EXTENSIONS_PURGE, {}, batch_size)

    def stats_rollup(self, batch_size: int = 10_000, *,
                     after_id: int = 0) -> tuple[int, int | None]:
        folded, _stored, last = self._run(STATS_ROLLUP, {"batch": batch_size,
                                                         "after_id": after_id}, fetch="one")
        return int(folded), last

    def stats_prune(self, *, minute_keep: float, hour_keep: float, day_keep: float,
                    batch_size: int = 1000) -> int:
        return self._purge(STATS_PRUNE, {
            "minute_ms": round(minute_keep * 1000), "hour_ms": round(hour_keep * 1000),
            "day_ms": round(day_keep * 1000),
        }, batch_size)
