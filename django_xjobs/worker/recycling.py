"""Recycling a worker process: Celery's ``--max-tasks-per-child`` and ``--max-memory-per-child``
(docs/deployment.md, "Recycling worker processes").

A worker process with a bound (``xjobs_worker --max-jobs-per-process N``, ``--max-memory M``,
or ``XJOBS["MAX_JOBS_PER_PROCESS"]`` / ``["MAX_MEMORY"]``) leaves once it reaches it, and a
fresh process takes its place. Its life::

    working --(N runs settled, or RSS over M after a settle)--> draining --> gone (exit 75)
                                                                   |
                              a stop (SIGTERM) while draining -----+--> a plain stop (exit 0)

* **What counts** (:meth:`Recycling.settled`): every run this process settled whose job's code
  it had, whatever the outcome: done, failed (retried or dead), timed out, snoozed, a
  ``PauseKey``, suspended (a durable run that parked on a step: its resumption is another
  run), cancelled or lost. A job whose name this process does not know is given back without
  counting: its code never ran here. Counted when the run's fenced write is done, so a settle
  set aside behind another transaction's lock counts once it lands.
* **The budget**: a process with ``--max-jobs-per-process N`` never holds more runs than it
  may still count (``Capacity.free``): it claims at most ``N`` minus what it settled and what
  it holds, so it leaves with nothing in flight and hands nothing back.
* **Memory**: the resident set size as it is now (``/proc/self/statm``, one read of a small
  file), not the peak, read after a settle that counted a run: at most once per settled run,
  never on an idle loop. Over the bound, the process drains.
* **The drain** is a graceful stop's (worker/loop.py, "Shutdown"): no new claims, runs
  claimed but not started handed back at once without spending an attempt, running ones
  finished and settled, the x_workers row deleted. Unlike a SIGTERM's there is no grace
  period: nobody is waiting for this process to end, so a run going fine is never stopped and
  handed back (its job's own ``timeout`` still applies). A SIGTERM that comes during the drain
  turns it into that stop, grace period included (``Worker.stop``).
* **The exit**: the worker says why in :attr:`Worker.recycled`; ``xjobs_worker`` then exits
  with :data:`EXIT_RECYCLED`, and the supervisor, which runs every recycling worker process
  (also with one process), starts a fresh one at once: a recycle is not a crash, so it neither
  grows nor resets the restart backoff (worker/supervisor.py).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable

from .executor import UnknownName
from .runs import SETTLED, Run

log = logging.getLogger("django_xjobs.worker")

# A worker process that recycled itself exits with this status (sysexits.h's EX_TEMPFAIL: "try
# again"): the supervisor starts a fresh one at once (worker/supervisor.py).
EXIT_RECYCLED = 75

MIB = 1024 * 1024
_STATM = "/proc/self/statm"
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int | None:
    """This process's resident set size now (not its peak), or None where the system has no
    ``/proc/self/statm`` (not Linux)."""
    try:
        with open(_STATM, "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


class Recycling:
    """When one worker process should leave (see the module docstring): the loop reports each
    settle (:meth:`settled`), the claim sizes ask :attr:`jobs_left`."""

    def __init__(self, *, max_jobs: int | None, max_memory: int | None) -> None:
        self.max_jobs = max_jobs
        self.max_memory = max_memory  # MiB
        self.jobs = 0  # runs counted so far

    @property
    def jobs_left(self) -> int | None:
        """Runs this process may still count before it leaves; None: no bound."""
        return None if self.max_jobs is None else self.max_jobs - self.jobs

    def starting(self, worker_id: str) -> None:
        """At start-up: a process already over its memory bound would leave after every run
        (tests/unit/test_recycling.py)."""
        if self.max_memory is None:
            return
        rss = resident_bytes()
        if rss is not None and rss > self.max_memory * MIB:
            log.warning("worker %s: RSS %d MiB at start-up is already over --max-memory %d: "
                        "it will be replaced after every job it runs", worker_id, rss // MIB,
                        self.max_memory)

    def settled(self, batch: Iterable[Run]) -> str | None:
        """A settle wrote ``batch`` (the runs it left unsettled come back in a later one):
        count what counts; why the process should leave now, or None."""
        counted = sum(1 for r in batch
                      if r.phase == SETTLED and not isinstance(r.outcome, UnknownName))
        if not counted:
            return None
        self.jobs += counted
        if self.max_jobs is not None and self.jobs >= self.max_jobs:
            return f"recycling after {self.jobs} jobs"
        if self.max_memory is not None:
            rss = resident_bytes()
            if rss is not None and rss > self.max_memory * MIB:
                return f"recycling: RSS {rss // MIB} MiB over --max-memory {self.max_memory}"
        return None
