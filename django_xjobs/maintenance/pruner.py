"""Retention: delete what the job tables no longer need, in bounded batches.

What goes, and after how long (docs/scheduling.md, "Maintenance and retention"):

* finished jobs past ``XJOBS["RETENTION"]`` for their state (``done``, ``cancelled``,
  ``dead``), measured from ``finished_at``, with the steps of their runs: a whole history table
  per UTC day (``history_drop``, one statement per day), and the rows still in ``x_jobs``
  itself (``jobs_purge``);
* events past their ``expires_at`` (``events_purge``);
* relayed outbox rows published more than ``XJOBS["OUTBOX_RETENTION"]`` ago; pending rows are
  never touched (``outbox_purge_published``);
* concurrency slot rows expired for more than ``XJOBS["SLOT_PURGE_GRACE"]``
  (``slots_purge_expired``; why the grace: see that statement);
* the counters' minute, hour and day buckets past ``counters.RETENTION`` (``stats_prune``);
* idempotency-window rows whose window ended (``job_keys_purge_expired``, docs/durable.md,
  "Idempotency windows");
* leases kept beside a held row that ended a minute ago (``lease_extensions_purge``,
  docs/design.md, "Lease extensions").

Before that, finished jobs older than ``XJOBS["ARCHIVE_AFTER"]`` move out of ``x_jobs`` into
the history tables (:func:`archive`, which the scheduler's maintenance thread also runs every
second while it leads: docs/scheduling.md, "History tables").

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
from datetime import datetime, timedelta

from .. import conf, counters, versions
from ..engines import Engine, get_engine
from ..records import TERMINAL_STATES

# The archive moves ten times MAINTENANCE_BATCH rows per statement: finished rows, which no
# worker writes, so a bigger batch makes nobody wait, and it moves them at about 130,000 rows/s
# against 90,000 in batches of 1,000 (docs/performance.md, "History: what we measured and
# chose").
ARCHIVE_BATCH_FACTOR = 10
# How far before the cutoff of its last complete pass the archive's next pass starts (a finish
# time, see :func:`archive`): a job finished by a transaction that began before that cutoff and
# committed after the pass is still moved by the next one, if it committed within this.
ARCHIVE_FLOOR_SLACK = timedelta(seconds=2)


@dataclass(frozen=True, slots=True, kw_only=True)
class PruneReport:
    """Rows deleted by one maintenance run; ``stopped`` when it ended early (leadership lost)."""

    jobs: Mapping[str, int] = field(default_factory=dict)  # per finished state
    archived: int = 0  # finished jobs moved into the history tables
    days: tuple[str, ...] = ()  # the history tables dropped, a day (of a state) each
    events: int = 0
    outbox: int = 0
    slots: int = 0
    stats: int = 0
    keys: int = 0  # idempotency-window rows whose window ended
    extensions: int = 0  # leases kept beside held rows, ended
    stopped: bool = False

    @property
    def total(self) -> int:
        return (sum(self.jobs.values()) + self.archived + len(self.days) + self.events
                + self.outbox + self.slots + self.stats + self.keys + self.extensions)

    def summary(self) -> str:
        jobs = ", ".join(f"{n} {state}" for state, n in sorted(self.jobs.items()) if n)
        parts = [f"jobs: {jobs or 0}", f"history tables: {', '.join(self.days) or 0}",
                 f"events: {self.events}", f"outbox: {self.outbox}",
                 f"slots: {self.slots}", f"counters: {self.stats}",
                 f"idempotency windows: {self.keys}", f"lease extensions: {self.extensions}"]
        return (f"archived {self.archived} finished jobs; deleted " + "; ".join(parts)
                + (" (stopped early)" if self.stopped else ""))


def archive(*, engine: Engine | None = None, settings: conf.XJobsSettings | None = None,
            batch_size: int | None = None, now: datetime | None = None,
            keep_going: Callable[[], bool] = lambda: True,
            floors: dict[str, datetime] | None = None) -> int:
    """Move the jobs finished more than ``XJOBS["ARCHIVE_AFTER"]`` ago (before ``now``, the
    database clock, read here unless given) out of ``x_jobs`` into the history tables (none
    when it is None); how many moved. Each batch is one transaction: call it outside a
    transaction, for the reason :func:`run_once` gives.

    ``floors``, kept by the caller from one pass to the next, per state: where this state's
    pass starts (a finish time), and, once a pass is complete, its cutoff less
    ``ARCHIVE_FLOOR_SLACK``. Each job moved leaves a dead entry at the head of the index the
    archive scans, which no vacuum removes while a long transaction holds the database's
    horizon; a pass from the start reads them all (docs/performance.md, "Under a held
    horizon"). What a floor cannot see (a job finished by a transaction that stayed open past
    it) waits for a pass without floors: the maintenance runs one every interval.
    """
    engine = engine or get_engine()
    settings = settings or conf.get()
    if settings.archive_after is None or not versions.writes("history", engine.fleet_get()):
        return 0  # none kept, or a fleet kept compatible with a release without them
    cutoff = (now or engine.db_now()) - timedelta(seconds=settings.archive_after)
    batch = batch_size or settings.maintenance_batch * ARCHIVE_BATCH_FACTOR
    stopped = False

    def going() -> bool:  # keep_going, remembering whether it ever said stop
        nonlocal stopped
        stopped = stopped or not keep_going()
        return not stopped

    moved = 0
    for state in TERMINAL_STATES:
        start = floors.get(state) if floors is not None else None
        moved += engine.jobs_archive(state=state, finished_before=cutoff, batch_size=batch,
                                     finished_from=start, keep_going=going)
        if stopped:
            break
        if floors is not None:
            reached = cutoff - ARCHIVE_FLOOR_SLACK
            floors[state] = reached if start is None else max(start, reached)
    return moved


def run_once(*, engine: Engine | None = None, settings: conf.XJobsSettings | None = None,
             batch_size: int | None = None,
             keep_going: Callable[[], bool] = lambda: True,
             archive_floors: dict[str, datetime] | None = None) -> PruneReport:
    """Run every retention delete once; ``keep_going`` is asked before each kind of delete
    (the scheduler passes "still the leader"). Its archive starts from no floor, and sets
    ``archive_floors`` (see :func:`archive`) once it is complete."""
    engine = engine or get_engine()
    settings = settings or conf.get()
    batch = batch_size or settings.maintenance_batch
    now = engine.db_now()
    jobs: dict[str, int] = {}
    days: list[str] = []
    counts = {"events": 0, "outbox": 0, "slots": 0, "stats": 0, "keys": 0}
    if archive_floors is not None:
        archive_floors.clear()
    archived = archive(engine=engine, settings=settings, batch_size=batch_size, now=now,
                       keep_going=keep_going, floors=archive_floors)

    def stopped() -> PruneReport:
        return PruneReport(jobs=jobs, archived=archived, days=tuple(days), stopped=True,
                           **counts)

    for state, seconds in sorted(settings.retention.items()):
        if not keep_going():
            return stopped()
        cutoff = now - timedelta(seconds=seconds)
        days.extend(engine.history_drop(state=state, finished_before=cutoff))
        jobs[state] = engine.jobs_purge(states=[state], finished_before=cutoff,
                                        batch_size=batch)
    steps: list[tuple[str, Callable[[], int]]] = [
        ("events", lambda: engine.events_purge(batch)),
        ("outbox", lambda: engine.outbox_purge_published(
            published_before=now - timedelta(seconds=settings.outbox_retention),
            batch_size=batch)),
        ("slots", lambda: engine.slots_purge_expired(
            grace_ms=round(settings.slot_purge_grace * 1000), batch_size=batch)),
        ("stats", lambda: counters.prune(engine, batch_size=batch)),
        ("keys", lambda: engine.job_keys_purge_expired(batch_size=batch)),
        ("extensions", lambda: engine.lease_extensions_purge(batch_size=batch)),
    ]
    for name, purge in steps:
        if not keep_going():
            return stopped()
        counts[name] = purge()
    return PruneReport(jobs=jobs, archived=archived, days=tuple(days), stopped=False,
                       **counts)
