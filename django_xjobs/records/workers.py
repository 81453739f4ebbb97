"""The worker processes (``x_workers``), the sentence of a stalled one, and the fleet's
compatibility (``x_fleet``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

# How long a worker may go without a heartbeat, a round of its loop, or (with room and a due job)
# a claim before it reads as stalled, unless the reader says otherwise (seconds): the console,
# `manage.py xjobs workers / health` and the metrics judge alike. Longer than
# XJOBS["WORKER_SEEN_INTERVAL"] and XJOBS["POLL_INTERVAL"] (10 s and 1 s by default), or
# healthy workers read as stalled.
DEFAULT_MAX_STALL = 300.0


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerRecord:
    """An ``x_workers`` row: a worker process seen in the last day and what its heartbeat
    reported (``manage.py xjobs workers``, docs/observability.md, "Workers and health probes").
    The times are the database's. ``stalled`` says why the worker is stalled (no heartbeat, a
    wedged loop, no claim although its queues had due jobs), None when it is not."""

    id: str
    host: str
    pid: int
    queues: tuple[str, ...]
    version: str
    concurrency: int
    running: int  # runs in flight at its last heartbeat
    finished: int  # runs it finished since it started
    started_at: datetime
    seen_at: datetime  # its last heartbeat
    claimed_at: datetime | None  # when its loop last claimed a job (None: never)
    loop_at: datetime | None  # when its loop last went round
    stalled: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetRecord:
    """The ``x_fleet`` row (docs/deployment.md, "Mixed versions"): the oldest release series
    still allowed to share the tables (None: nothing older than this version), and when and by
    whom that was set (None and "" when no row was ever written)."""

    compatible_with: str | None = None
    changed_at: datetime | None = None
    changed_by: str = ""


def stall_reason(kind: str, age: float, queue: str | None = None,
                 due_since: datetime | None = None) -> str:
    """The sentence of a stalled worker (``WorkerRecord.stalled``): ``kind`` is "heartbeat",
    "loop" or "claim", ``age`` the seconds since the heartbeat, the loop's last round or the
    last claim; a "claim" names the queue whose job has been due since ``due_since``."""
    if kind == "heartbeat":
        return f"no heartbeat for {span(age)}"
    if kind == "loop":
        return f"loop has not gone round for {span(age)}"
    since = due_since.isoformat(sep=" ", timespec="seconds") if due_since else "?"
    return (f"has not claimed for {span(age)} although queue {queue!r} has had a job due "
            f"since {since}")


def span(seconds: float) -> str:
    """A duration in one short unit: ``42s``, ``5m``, ``1.5h``."""
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"
