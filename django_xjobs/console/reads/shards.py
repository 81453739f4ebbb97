"""The dashboard's shards panel: every shard's live buckets, last 24 hours and health, and the
totals across shards where they add up (docs/scaling.md, "Workers, commands and the console").

Each shard is read on its own database (on its replica, when it has one fresh enough: the
request's other reads go there too), one after the other; a shard that cannot be read is a row
that says why, never a failed page. Nothing here is cached: the page is one operator's read.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import DatabaseError

from ... import conf, replica
from .dashboard import QueueRow, added_up, queue_rows, scheduler_leaders
from .health import BAD, OK, WARN, fleet
from .scope import TenantScope
from .text import db_now


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardRow:
    alias: str
    chosen: bool  # the shard the rest of the page shows
    totals: QueueRow | None  # None: the shard could not be read (error says why)
    workers: int = 0
    stalled: int = 0
    leader: bool | None = False  # a scheduler leads it now; None: not shown (tenant scope)
    error: str | None = None

    @property
    def verdict(self) -> str:
        """BAD: unreadable, or a worker stalled; WARN: live jobs and no worker, or workers and no
        scheduler leading."""
        if self.error or self.stalled:
            return BAD
        if self.totals is not None and self.totals.live and not self.workers:
            return WARN
        return WARN if self.leader is False and self.workers else OK


def _shard(alias: str, tenants: TenantScope, chosen: str) -> ShardRow:
    try:
        with conf.using_database(alias), replica.reads():
            rows = queue_rows(tenants)
            workers = fleet(tenants)
            leaders = scheduler_leaders(db_now()) if tenants is None else []
    except DatabaseError as exc:
        return ShardRow(alias=alias, chosen=alias == chosen, totals=None,
                        error=replica.first_line(exc))
    return ShardRow(alias=alias, chosen=alias == chosen, totals=added_up(rows, alias),
                    workers=len(workers), stalled=sum(1 for w in workers if w.stalled),
                    leader=any(leader.live for leader in leaders) if tenants is None else None)


def shard_rows(tenants: TenantScope, chosen: str) -> list[ShardRow]:
    """One row per shard, home first; empty when the jobs are not sharded."""
    return [_shard(alias, tenants, chosen) for alias in conf.get().shards]


def total(rows: list[ShardRow]) -> QueueRow | None:
    """Every readable shard added up (None when none is)."""
    readable = [r.totals for r in rows if r.totals is not None]
    return added_up(readable, "all shards") if readable else None
