"""A job's states, as ``x_jobs.state`` stores them, and the groups of them services
branch on."""

from __future__ import annotations

import enum
from typing import Literal


class JobState(enum.StrEnum):
    READY = "ready"
    DELAYED = "delayed"
    RUNNING = "running"
    SUSPENDED = "suspended"
    BLOCKED = "blocked"
    DONE = "done"
    DEAD = "dead"
    CANCELLED = "cancelled"


# The values of JobState as a type: what ``JobRecord.state`` holds (a plain str at run time, as
# read from the row; a type checker then refuses ``record.state == "finished"``).
JobStateName = Literal["ready", "delayed", "running", "suspended", "blocked", "done", "dead",
                       "cancelled"]

# ``blocked``: held back by flow control (a full concurrency key, a paused key) until a slot
# frees or the pause ends; live, so it keeps its idempotency key (docs/flow-control.md).
LIVE_STATES: tuple[str, ...] = ("ready", "delayed", "running", "suspended", "blocked")
TERMINAL_STATES: tuple[str, ...] = ("done", "dead", "cancelled")
ALL_STATES: tuple[str, ...] = LIVE_STATES + TERMINAL_STATES

# States in which a job waits to run: only these can be held back by anything.
WAITING_STATES: tuple[str, ...] = ("ready", "delayed", "suspended", "blocked")
