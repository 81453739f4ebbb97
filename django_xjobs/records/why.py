"""Why a job is not running: the facts one statement reads, and the reasons
django_xjobs/why.py makes of them (docs/flow-control.md, "Why is a job not running?")."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal
from uuid import UUID

from .pauses import PauseRecord
from .states import JobStateName

# Every kind of BlockedBy, in the order two reasons with the same end are listed: an operator's
# pause, then a missing worker, then a full key (django_xjobs/why.py sorts by the end first).
BLOCKED_KINDS: tuple[str, ...] = ("queue_paused", "key_paused", "no_worker", "unknown_job",
                                  "slot_full", "rate_limit", "backoff", "delayed")

BlockedKind = Literal["delayed", "backoff", "queue_paused", "key_paused", "slot_full",
                      "rate_limit", "no_worker", "unknown_job"]


def _moment(value: datetime | None) -> str:
    return value.isoformat(sep=" ", timespec="seconds") if value is not None else "?"


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockedBy:
    """One reason a job is not running now (django_xjobs/why.py), with its end where it has one.

    ``until``: when the reason ends by itself (a delay, a backoff, a timed pause, the rate
    budget's next room); None when it lasts until something happens (a resume, a slot freed,
    a worker started). ``key`` is the concurrency or rate-limit key, ``queue`` the queue;
    ``holders`` and ``limit`` describe a full concurrency key. ``unknown_job``: no worker that
    claimed job ``name`` knows it; ``workers`` are the last of them, ``since`` when its wait
    began, ``until`` its next try, ``reason`` where the name was expected.
    """

    kind: BlockedKind
    until: datetime | None = None
    key: str | None = None
    queue: str | None = None
    reason: str | None = None
    holders: tuple[str, ...] = ()
    limit: int | None = None
    name: str | None = None
    since: datetime | None = None
    workers: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        """The reason as a sentence for a person (the ``xjobs why`` line, the console)."""
        if self.kind == "delayed":
            return f"delayed until {_moment(self.until)}"
        if self.kind == "backoff":
            return f"retry backoff until {_moment(self.until)}"
        if self.kind in ("queue_paused", "key_paused"):
            what = f"queue {self.queue}" if self.kind == "queue_paused" else f"key {self.key}"
            until = f"until {_moment(self.until)}" if self.until else "until resumed"
            reason = f", {self.reason}" if self.reason else ""
            return f"{what} paused ({until}{reason})"
        if self.kind == "slot_full":
            return (f"slot full: key {self.key} has all {self.limit} slot(s) held "
                    f"({', '.join(self.holders)})")
        if self.kind == "rate_limit":
            if self.until is None:
                return f"rate limit of key {self.key}: its cost exceeds the whole limit"
            return f"rate limit of key {self.key} (next unit at {_moment(self.until)})"
        if self.kind == "unknown_job":
            who = f"workers {', '.join(self.workers)}" if self.workers else "the workers"
            hint = f"; {self.reason}" if self.reason else ""
            return (f"no worker that knows job {self.name!r} has claimed it: {who} do not "
                    "know it (deployed to web before the workers?); waiting since "
                    f"{_moment(self.since)}, next try at {_moment(self.until)}{hint}")
        return f"no worker serving queue {self.queue} in the last 5 minutes"


@dataclass(frozen=True, slots=True, kw_only=True)
class FlowFacts:
    """What holds one job back, read in one statement (``why_job``): the row's own fields as
    they are now, and the flow-control rows that concern it, on the database clock ``now``."""

    id: UUID
    name: str
    queue: str
    state: JobStateName
    run_at: datetime
    attempt: int
    last_error: str | None
    concurrency_key: str | None
    rate_key: str | None
    blocked_on: str | None
    now: datetime
    pauses: tuple[PauseRecord, ...]  # in force for its queue, its concurrency or rate key
    holders: tuple[str, ...]  # the live holders of its concurrency key's slots
    worker_seen: bool  # an x_workers row names its queue, seen in the last 5 minutes
    # Waiting for a worker that knows its name (job_give_back_unknown_if_owned): since when,
    # the last workers that gave it back, and the cron task that enqueued it ("cron:<task>").
    unknown_since: datetime | None = None
    unknown_workers: tuple[str, ...] = ()
    enqueued_by: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RateWindow:
    """A rate-limit key's spending over one period (``why_rate_window``): ``next_at`` is when
    enough units leave the window for ``cost`` more to fit (None: it fits now, or never does
    because the cost exceeds the limit)."""

    key: str
    spent: int
    next_at: datetime | None
