"""The worker's report of jobs that wait for a worker knowing their name (docs/deployment.md,
"New job types before their workers").

A worker gives back a job whose name it does not know (``executor.unknown_job``), no attempt
spent, and the job waits: normal for the minutes of a rolling deploy that brings a new job type
to the web processes before the workers. Once the oldest job of a name has waited
``XJOBS["UNKNOWN_JOB_REPORT_AFTER"]`` (on the database clock, from ``x_jobs.unknown_since``),
the wait is a problem someone must act on: the worker logs one ERROR for that name, then at most
one per that interval, naming how many jobs wait on which queue, since when, and where the
name's code was expected. The jobs keep waiting; nothing buries them.

A give-back costs the worker one read of ``jobs_unknown_waiting`` for its name at most every
``CHECK_EVERY`` seconds (or every interval, when shorter), so a flood of jobs of one unknown
name costs no more than one.
"""

from __future__ import annotations

import logging

from .. import clock, registry
from ..engines import Engine
from ..records import UnknownWait

log = logging.getLogger("django_xjobs.worker")

# The longest a worker goes between two reads of a name's waiting jobs while it gives them back.
CHECK_EVERY = 60.0


class UnknownNames:
    """Decides, per give-back of a job of an unknown name, whether the name's wait is due to be
    reported, and reports it (:func:`report`). Used by the loop thread only."""

    def __init__(self, engine: Engine, report_after: float) -> None:
        self.engine = engine
        self.report_after = report_after
        self._next_check: dict[str, float] = {}
        self.reported = 0  # ERRORs logged (a test signal)

    def gave_back(self, name: str) -> None:
        now = clock.monotonic()
        if now < self._next_check.get(name, 0.0):
            return
        self._next_check[name] = now + min(self.report_after, CHECK_EVERY)
        late = [w for w in self.engine.jobs_unknown_waiting(names=[name])
                if w.waited >= self.report_after]
        if late:
            self._next_check[name] = now + self.report_after
            for wait in late:
                report(wait, self.report_after)
                self.reported += 1


def report(wait: UnknownWait, report_after: float) -> None:
    """One ERROR about ``wait``: which name, how many jobs, since when, where it was expected."""
    enqueued_by = f"cron:{wait.cron_tasks[0]}" if wait.cron_tasks else None
    log.error(
        "%d job(s) named %r on queue %r have waited since %s (%.0fs, over "
        "XJOBS[\"UNKNOWN_JOB_REPORT_AFTER\"] = %gs) for a worker that knows the name; no worker "
        "that claimed them does (deployed to web before the workers?). The name is %s. They "
        "keep waiting, spending no attempt: deploy the code to the workers, or cancel them.",
        wait.count, wait.name, wait.queue, wait.since.isoformat(sep=" ", timespec="seconds"),
        wait.waited, report_after, registry.expected_home(wait.name, enqueued_by),
    )
