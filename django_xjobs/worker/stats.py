"""The counters' rollup duty: folds the deltas the job statements wrote into their buckets
(django_xjobs/counters.py, docs/observability.md "Counters").

Every worker runs it (``xjobs_worker --no-stats`` switches it off); one rollup runs at a time
(the statement tries a transaction-scoped advisory lock and folds nothing without it), so more
workers cost a tried lock each per round, not more work. A database error ends the round; the
next one tries again. Each worker's rollups start past the last delta it folded, and one in
``counters.ROLLUP_FULL`` seconds from the first (counters.RollupFloor).
"""

from __future__ import annotations

import logging

from .. import counters
from . import reachability
from .duties import Duty

log = logging.getLogger("django_xjobs.worker")


class StatsDuty(Duty):
    name = "stats"

    def run(self) -> None:
        floor = counters.RollupFloor()
        try:
            while not self.stop.is_set():
                try:
                    counters.rollup(self.engine, floor=floor)
                except Exception as exc:  # the contract: a database error never ends the duty
                    if self.stop.is_set():
                        break
                    # Could not connect: said once per outage, by reachability. Anything else
                    # is this thread's own line.
                    lost = reachability.connection_error(exc, "stats rollup", self.engine)
                    if lost != reachability.UNREACHABLE:
                        log.warning("stats rollup failed (%s); retrying in %.0fs", exc,
                                    counters.ROLLUP_INTERVAL)
                    self.engine.reset_connection()
                else:
                    reachability.database.reached()
                finally:
                    self.started.set()
                self.stop.wait(counters.ROLLUP_INTERVAL)
        finally:
            self.close_connection()
