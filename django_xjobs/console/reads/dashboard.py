"""The dashboard: each queue's live buckets and last 24 hours, the outbox, the scheduler's
leader and tasks, the workers, the latest failures (docs/console.md, "The dashboard").

Under a tenant scope, what names no tenant's rows (the scheduler, the workers) is left out.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count

from ... import counters, registry, scheduler
from ...engines import get_engine
from ...models import Job, SchedulerLeader
from ...records import QueueDepth, WorkerRecord
from .health import OK, OUTBOX_AGE_WARN, WARN, fleet
from .jobs import PANEL_ROWS, JobBrief, finished_since
from .json_columns import without_json
from .scope import TenantScope, scoped
from .text import db_now, orm_time

# The dashboard's finished counts: the counters' "day" window (24 hourly buckets).
FINISHED_WINDOW = timedelta(hours=24)


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueRow(QueueDepth):
    """One queue on the dashboard: its live buckets and the age of its oldest due job
    (``queue_depth``), and what it finished in the last 24 hours: the counters' day window, or
    under a tenant scope the finished rows of that window (the counters count every tenant's
    jobs). ``failed_24h`` counts failed runs (retried, or the one a job died of), which only
    the counters know: None under a tenant scope."""

    done_24h: int = 0
    failed_24h: int | None = 0
    dead_24h: int = 0
    cancelled_24h: int = 0

    @property
    def live(self) -> int:
        return self.ready + self.delayed + self.running + self.suspended + self.blocked


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaderRow:
    lock_key: str
    holder: str
    expires_at: datetime
    live: bool  # the lease has not expired: a scheduler leads right now


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleRow:
    """One cron task: its watermark (the last occurrence fired) and whether it is paused.

    ``next_fire_at`` is the next occurrence after the watermark (None: paused, or a state row
    of a task no longer declared).
    """

    task: str
    last_fired_at: datetime | None
    paused: bool
    updated_at: datetime | None
    next_fire_at: datetime | None = None
    configured: bool = False  # named in XJOBS["SCHEDULE"] / a @job(cron=...)
    # Its overlap policy and the occurrences that policy did not enqueue, with the latest
    # (docs/scheduling.md, "Overlap").
    overlap: str | None = None
    overlap_skipped: int = 0
    overlap_skipped_at: datetime | None = None
    # When it fires, as an operator reads it: the cron expression, or "every 45s"
    # (docs/scheduling.md, "Intervals"); None: a task no longer declared.
    schedule: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Dashboard:
    now: datetime
    tenants: TenantScope
    queues: list[QueueRow]
    outbox_pending: int
    outbox_oldest_seconds: float | None
    leaders: list[LeaderRow]  # empty under a tenant scope
    schedules: list[ScheduleRow]  # empty under a tenant scope
    workers: list[WorkerRecord]  # x_workers; empty under a tenant scope
    failures: list[JobBrief]

    @property
    def totals(self) -> QueueRow:
        return added_up(self.queues, "all queues")

    @property
    def outbox_verdict(self) -> str:
        age = self.outbox_oldest_seconds
        return WARN if age is not None and age > OUTBOX_AGE_WARN else OK


def added_up(rows: list[QueueRow], name: str) -> QueueRow:
    """``rows`` (queues, or shards) added up: counts sum, the oldest due wait is the longest,
    failed runs are unknown (None) if any row's is."""
    sums: dict[str, Any] = {
        f.name: sum(getattr(r, f.name) or 0 for r in rows)
        for f in dataclasses.fields(QueueRow)
        if f.name not in ("queue", "oldest_ready_age", "failed_24h")}
    ages = [r.oldest_ready_age for r in rows if r.oldest_ready_age is not None]
    failed = [r.failed_24h for r in rows]
    return QueueRow(queue=name, oldest_ready_age=max(ages, default=None),
                    failed_24h=None if None in failed else sum(f or 0 for f in failed), **sums)


def queue_rows(tenants: TenantScope = None) -> list[QueueRow]:
    """The dashboard's queues: live buckets from ``queue_depth``, finished counts of the last
    24 hours from the counters (from the rows under a tenant scope: see :class:`QueueRow`).
    No read here scans ``x_jobs`` (tests/integration/test_console_site.py checks the plans)."""

    depth: dict[str, QueueDepth] = {
        d.queue: d for d in get_engine().queue_depth(tenant_ids=tenants)
    }
    finished: dict[str, dict[str, Any]] = {}
    if tenants is None:
        day = counters.chart("day")
        for q in day.series:
            t = day.total(q)
            finished[q] = {"done_24h": t.done, "failed_24h": t.failed, "dead_24h": t.dead,
                           "cancelled_24h": t.cancelled}
    else:
        for state, rows in finished_since(FINISHED_WINDOW, tenants):
            for row in rows.order_by().values("queue").annotate(n=Count("id")):
                counts = finished.setdefault(row["queue"], {"failed_24h": None})
                counts[f"{state}_24h"] = row["n"]
    queues = sorted(set(depth) | set(finished) | set(
        registry.worked_queues() if tenants is None else ()))
    rows = []
    for q in queues:
        d = depth.get(q) or QueueDepth(queue=q)
        rows.append(QueueRow(
            queue=q, ready=d.ready, delayed=d.delayed, running=d.running,
            suspended=d.suspended, blocked=d.blocked, oldest_ready_age=d.oldest_ready_age,
            **finished.get(q, {"failed_24h": None if tenants is not None else 0}),
        ))
    return rows


def queue_chart(window: str, queue: str | None = None) -> counters.Chart:
    """The counters of ``window`` (``hour``, ``day``, ``week``) for the console's charts, of
    one queue or all. Never under a tenant scope: the counters count every tenant's jobs."""
    return counters.chart(window, queue=queue)


def scheduler_leaders(now: datetime) -> list[LeaderRow]:
    return [LeaderRow(lock_key=r.lock_key, holder=r.holder, expires_at=r.expires_at,
                      live=r.expires_at > now)
            for r in SchedulerLeader.objects.order_by("lock_key")]


def schedule_rows() -> list[ScheduleRow]:
    """Every cron task the console knows of, as the scheduler describes it (``manage.py xjobs
    schedule`` shows the same): configured tasks (``@job(cron=...)`` and ``XJOBS["SCHEDULE"]``)
    and state rows of tasks no longer declared, with the watermark and the next fire time.

    The scheduler computes on the engine's clock in the engine's form; its answers are turned
    into the ORM's form here (:func:`orm_time`), like every time the console shows."""

    return [ScheduleRow(task=t.name, last_fired_at=orm_time(t.watermark), paused=t.paused,
                        updated_at=orm_time(t.updated_at), next_fire_at=orm_time(t.next_fire_at),
                        configured=t.configured, overlap=t.overlap,
                        overlap_skipped=t.overlap_skipped,
                        overlap_skipped_at=orm_time(t.overlap_skipped_at),
                        schedule=t.schedule)
            for t in scheduler.describe(now=get_engine().db_now()).tasks]


def latest_failures(tenants: TenantScope = None, limit: int = PANEL_ROWS) -> list[JobBrief]:
    dead = without_json(scoped(Job.objects.filter(state="dead"), tenants))
    dead = dead.order_by("-finished_at")[:limit]
    return [JobBrief.of(j, j.finished_at) for j in dead]


def dashboard(tenants: TenantScope = None) -> Dashboard:
    now = db_now()
    pending, oldest = get_engine().outbox_pending(tenant_ids=tenants)
    return Dashboard(
        now=now, tenants=tenants, queues=queue_rows(tenants), outbox_pending=pending,
        outbox_oldest_seconds=oldest,
        leaders=scheduler_leaders(now) if tenants is None else [],
        schedules=schedule_rows() if tenants is None else [],
        workers=fleet(tenants), failures=latest_failures(tenants),
    )
