"""The scheduler: who leads, each cron task's watermark, and a task's live runs as its
overlap policy sees them (docs/scheduling.md, "Overlap")."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaderFence:
    """What a scheduler round's statements check to be sure it still leads (scheduler/).

    Lease mode: the lease row of ``lock_key`` names ``holder`` and has more than ``margin_ms``
    left on the database clock. Advisory mode (``advisory_pid`` set): the backend with that
    pid holds the session advisory lock of ``lock_key``.
    """

    lock_key: str
    holder: str
    margin_ms: int = 0
    advisory_pid: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaderRecord:
    """Who leads the scheduler now. ``holder`` is the worker id (lease mode) or the
    ``application_name`` of the backend holding the advisory lock."""

    lock_key: str
    mode: str  # "lease" | "advisory"
    holder: str
    expires_at: datetime | None = None  # lease mode only
    live: bool = True  # lease mode: expires_at > now() on the database clock
    pid: int | None = None  # advisory mode: the backend holding the lock


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerStateRecord:
    """One ``x_scheduler_state`` row: a task's watermark and whether it is paused."""

    task_name: str
    last_fired_at: datetime
    paused: bool
    updated_at: datetime
    # Occurrences its overlap policy did not enqueue, and the latest (docs/scheduling.md,
    # "Overlap").
    overlap_skipped: int = 0
    overlap_skipped_at: datetime | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LockedStates:
    """The state rows a round locked until its transaction ends.

    ``leading`` False: the fence failed, this process no longer leads (nothing was locked).
    A task missing from ``watermarks`` while leading: another round holds its row (skipped, not
    waited for), or it has none.
    """

    leading: bool
    watermarks: Mapping[str, datetime] = field(default_factory=dict)
    paused: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True, kw_only=True)
class CronRun:
    """A live run of a cron task (``enqueued_by = "cron:<task>"``), as a round's overlap
    policy sees it. ``buffered``: a run held back by ``overlap="buffer_one"`` until the runs
    before it finish (blocked on its own ``enqueued_by``)."""

    enqueued_by: str
    id: str
    state: str
    blocked_on: str | None = None
    # Read locked (buffer_one, cancel_previous) but another transaction holds its row: the
    # round leaves the task for a later round rather than wait (cron_runs_lock_live).
    held: bool = False

    @property
    def buffered(self) -> bool:
        return self.state == "blocked" and self.blocked_on == self.enqueued_by
