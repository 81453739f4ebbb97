"""Retention: delete what the job tables no longer need, in bounded batches.

What goes, and after how long (docs/scheduling.md, "Maintenance and retention"):

* finished jobs past ``XJOBS["RETENTION"]`` for their state (``done``, ``cancelled``,
  ``dead``), measured from ``finished_at``, with the steps of their runs (``jobs_purge``);
* events past their ``expires_at`` (``events_purge``);
* relayed outbox rows published more than ``XJOBS["OUTBOX_RETENTION"]`` ago; pending rows are
  never touched (``outbox_purge_published``);
* concurrency slot rows expired for more than ``XJOBS["SLOT_PURGE_GRACE"]``
  (``slots_purge_expired``; why the grace: see that statement);
* the counters' minute, hour and day buckets past ``counters.RETENTION`` (``stats_prune``).

Every delete runs in batches of ``XJOBS["MAINTENANCE_BATCH"]`` rows, each batch its own short
transaction taken with SKIP LOCKED, so retention never holds long locks on a hot table nor waits
behind a worker. Call :func:`run_once` outside a transaction: inside one, the batches would all
commit at its end and their locks would be held until then.

Cut-offs are taken on the database clock. The scheduler leader runs this every
``XJOBS["MAINTENANCE_INTERVAL"]``; running it in two processes at once is harmless (each batch
skips rows the other holds), so leadership is an economy here, not a safety measure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from .. import conf, counters
from ..engines import Engine, get_engine


@dataclass(frozen=True, slots=True, kw_only=True)
class PruneReport:
    """Rows deleted by one maintenance run; ``stopped`` when it ended early (leadership lost)."""

    jobs: Mapping[str, int] = field(default_factory=dict)  # per finished state
    events: int = 0
    outbox: int = 0
    slots: int = 0
    stats: int = 0
    stopped: bool = False

    @property
    def total(self) -> int:
        return sum(self.jobs.values()) + self.events + self.outbox + self.slots + self.stats

    def summary(self) -> str:
        jobs = ", ".join(f"{n} {state}" for state, n in sorted(self.jobs.items()) if n)
        parts = [f"jobs: {jobs or 0}", f"events: {self.events}", f"outbox: {self.outbox}",
                 f"slots: {self.slots}", f"counters: {self.stats}"]
        return "deleted " + "; ".join(parts) + (" (stopped early)" if self.stopped else "")


def run_once(*, engine: Engine | None = None, settings: conf.XJobsSettings | None = None,
             batch_size: int | None = None,
             keep_going: Callable[[], bool] = lambda: True) -> PruneReport:
    """Run every retention delete once; ``keep_going`` is asked before each kind of delete
    (the scheduler passes "still the leader")."""
    engine = engine or get_engine()
    settings = settings or conf.get()
    batch = batch_size or settings.maintenance_batch
    now = engine.db_now()
    jobs: dict[str, int] = {}
    counts = {"events": 0, "outbox": 0, "slots": 0, "stats": 0}

    def stopped() -> PruneReport:
        return PruneReport(jobs=jobs, stopped=True, **counts)

    for state, seconds in sorted(settings.retention.items()):
        if not keep_going():
            return stopped()
        jobs[state] = engine.jobs_purge(
            states=[state], finished_before=now - timedelta(seconds=seconds), batch_size=batch)
    steps: list[tuple[str, Callable[[], int]]] = [
        ("events", lambda: engine.events_purge(batch)),
        ("outbox", lambda: engine.outbox_purge_published(
            published_before=now - timedelta(seconds=settings.outbox_retention),
            batch_size=batch)),
        ("slots", lambda: engine.slots_purge_expired(
            grace_ms=round(settings.slot_purge_grace * 1000), batch_size=batch)),
        ("stats", lambda: counters.prune(engine, batch_size=batch)),
    ]
    for name, purge in steps:
        if not keep_going():
            return stopped()
        counts[name] = purge()
    return PruneReport(jobs=jobs, stopped=False, **counts)
