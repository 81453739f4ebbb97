"""What operators read and change: the queues' figures, the counters, the answer of an action
on one job."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from .jobs import JobRecord


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueStats:
    """Six exclusive buckets (a live row is in exactly one) plus finished counts."""

    queue: str
    ready: int = 0
    delayed: int = 0
    running: int = 0
    suspended: int = 0
    dead: int = 0
    done: int = 0
    cancelled: int = 0
    blocked: int = 0  # held back by flow control (docs/flow-control.md)

    @property
    def live(self) -> int:
        return self.ready + self.delayed + self.running + self.suspended + self.blocked


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueDepth:
    """A queue's live buckets (exclusive, as in :class:`QueueStats`) and how long its oldest
    due job has waited, in seconds (None when none is due): read through the live rows' indexes,
    never the history (docs/observability.md)."""

    queue: str
    ready: int = 0
    delayed: int = 0
    running: int = 0
    suspended: int = 0
    blocked: int = 0
    oldest_ready_age: float | None = None


# Upper bounds (milliseconds) of the wait and run time histograms; a value v falls in the first
# bucket whose bound is >= v, the last bucket is unbounded (docs/observability.md, "Counters").
HISTOGRAM_BOUNDS_MS = (5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000,
                       60_000, 300_000, 900_000, 3_600_000)


@dataclass(frozen=True, slots=True, kw_only=True)
class Counters:
    """The counters of one queue (and job name, for all-time totals) over one time bucket
    (``at``; the epoch for all-time): docs/observability.md, "Counters". The histograms count
    the waits (due to start) and run times per bucket of :data:`HISTOGRAM_BOUNDS_MS`, the
    last bucket unbounded; not cumulative."""

    queue: str
    name: str | None = None
    at: datetime | None = None
    enqueued: int = 0
    started: int = 0
    done: int = 0
    failed: int = 0
    dead: int = 0
    cancelled: int = 0
    wait_ms_sum: int = 0
    run_ms_sum: int = 0
    wait_hist: tuple[int, ...] = ()
    run_hist: tuple[int, ...] = ()

    @property
    def mean_wait(self) -> float | None:
        """Mean wait from due to start, in seconds (None without starts)."""
        return self.wait_ms_sum / self.started / 1000 if self.started else None

    @property
    def mean_run(self) -> float | None:
        """Mean run time of the finished runs, in seconds (None without any)."""
        ended = self.done + self.failed
        return self.run_ms_sum / ended / 1000 if ended else None


@dataclass(frozen=True, slots=True, kw_only=True)
class ChangeResult:
    """An operator action on one job: the row after it, and whether this call changed it."""

    job: JobRecord | None
    changed: bool
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Reopened:
    """A failed invoke or gather step a resume opened again: the workflow job whose step it
    is, the step's name, and the children the resume retried (dead or cancelled ones)."""

    job_id: UUID
    step: str
    retried: tuple[UUID, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumeResult(ChangeResult):
    """A resume of a dead workflow (``api.resume``): the workflow job after it and, when it
    changed, each step it opened again (the job's own first, then those of children that are
    dead workflows themselves). No step at all: the job was retried from its recorded steps
    (its failure was not a child's)."""

    reopened: tuple[Reopened, ...] = ()
