"""Monitoring reads for the operations console (django_xjobs/console/reads/health.py): the
catalog figures that say whether PostgreSQL can still clean up after the queue."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class HistoryTable:
    """One history table of finished jobs (``x_jobs_<state>_<yyyymmdd>``): the planner's
    estimate of its rows, and its size on disk with its indexes and its steps' table."""

    table: str
    rows: int
    size_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TableHealth:
    """Vacuum state of one ``x_`` table, from ``pg_stat_user_tables`` and ``pg_class``."""

    table: str
    live_tuples: int
    dead_tuples: int
    last_vacuum: datetime | None  # the later of the manual and the automatic one
    last_analyze: datetime | None
    xid_age: int  # age(relfrozenxid), of the table or its TOAST table, whichever is older
    freeze_max_age: int  # autovacuum_freeze_max_age: an anti-wraparound vacuum starts here
    size_bytes: int

    @property
    def dead_ratio(self) -> float:
        total = self.live_tuples + self.dead_tuples
        return self.dead_tuples / total if total else 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class XminHolder:
    """Something that keeps VACUUM from removing dead rows: an open transaction of this
    database, a replication slot, or a prepared transaction."""

    kind: str  # "transaction", "replication slot", "prepared transaction"
    name: str  # application name / user, slot name, or the prepared transaction's gid
    pid: int | None
    state: str | None  # "active", "idle in transaction", ... (slots: "active"/"inactive")
    started_at: datetime | None
    age_seconds: float | None
    xmin_age: int | None  # transactions since the snapshot it holds was taken
    query: str | None
