"""What a worker's loop shows of its own progress (docs/observability.md, "Workers and health
probes"): when it last went round and last claimed a job, and how many runs it finished. The
heartbeat thread reports these in the worker's x_workers row (``worker_seen``) as ages on the
worker's monotonic clock, which the database turns into times on its own clock; ``xjobs
health`` reads them there. With ``xjobs_worker --health-file PATH`` each round of the loop
also touches PATH, at most once per :data:`TOUCH_EVERY`: a file probe sees its mtime age when
the loop stops going round (a wedged loop, a stopped process), whatever the heartbeat does.
"""

from __future__ import annotations

import logging
import os

from .. import clock

log = logging.getLogger("django_xjobs.worker")

# The health file is touched at most this often (seconds): a probe's threshold is minutes, and
# a busy loop goes round thousands of times a second.
TOUCH_EVERY = 1.0


class Liveness:
    """Kept by the loop (worker/loop.py) and the run table (worker/runs.py: a run finished),
    read by the heartbeat thread: plain attribute writes and reads, each atomic under the
    GIL."""

    def __init__(self, health_file: str | None = None) -> None:
        self.health_file = health_file
        self.loop_at = clock.monotonic()
        self.claimed_at: float | None = None  # the last claim that got a job; None: none yet
        self.finished = 0  # runs finished since the worker started
        self._touched_at: float | None = None
        self._touch_failed = False

    def went_round(self, now: float) -> None:
        """The loop started a round at ``now`` (monotonic)."""
        self.loop_at = now
        if self.health_file is not None and (
                self._touched_at is None or now - self._touched_at >= TOUCH_EVERY):
            self._touched_at = now
            self._touch(self.health_file)

    def ages(self) -> tuple[float | None, float]:
        """(seconds since the last claim that got a job or None, seconds since the loop last
        went round), now."""
        now = clock.monotonic()
        claimed = None if self.claimed_at is None else max(0.0, now - self.claimed_at)
        return claimed, max(0.0, now - self.loop_at)

    def _touch(self, path: str) -> None:
        try:
            with open(path, "a"):
                os.utime(path)
        except OSError as exc:
            # Logged once per failing spell: the probe reports the stale file anyway.
            if not self._touch_failed:
                log.warning("health file %s not touched: %s", path, exc)
            self._touch_failed = True
        else:
            self._touch_failed = False
