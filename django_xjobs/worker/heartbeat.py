"""The heartbeat thread: one statement per interval renews every in-flight lease of a worker.

Protocol (the database is authoritative for ownership):

* every ``XJOBS["HEARTBEAT"]`` seconds (monotonic clock), send ``jobs_renew_if_owned`` with the
  (id, lease_token) of every unsettled run (queued, running, or finished but not yet
  acknowledged): an acknowledgement waiting in the batch buffer still needs its lease;
* an id missing from the answer means the run lost the job: the worker stops that run and
  discards its result (``Worker.on_renewed``);
* a renewal that landed moves the run's ``renewed_at`` to the moment the statement was SENT, not
  answered: the database's ``now() + lease`` was computed at or after that moment, so the
  worker's belief about the lease never outlives the database's.

A hung connection (a stopped backend, a half-open socket) blocks this thread inside the
statement. The worker does not wait for it: its loop stops every run that has gone a whole
lease without renewal (the self-fence) and replaces this thread after a lease, bumping
``generation`` so the old thread's late answer is ignored.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from .. import clock
from ..engines import Engine
from ..records import LeaseRef

log = logging.getLogger("django_xjobs.worker")


class Heartbeat(threading.Thread):
    def __init__(
        self,
        *,
        engine: Engine,
        label: str,
        interval: float,
        lease_ms: int,
        generation: int,
        current_generation: Callable[[], int],
        snapshot: Callable[[], Sequence[Any]],
        on_renewed: Callable[[Sequence[Any], frozenset[str], float], None],
        stop: threading.Event,
    ) -> None:
        super().__init__(name=f"xjobs-heartbeat-{generation}", daemon=True)
        self.engine = engine
        self.label = label
        self.interval = interval
        self.lease_ms = lease_ms
        self.generation = generation
        self._current_generation = current_generation
        self._snapshot = snapshot
        self._on_renewed = on_renewed
        self._stop = stop
        self.in_call_since: float | None = None
        self.rounds = 0

    def run(self) -> None:
        labelled = False
        while not self._stop.wait(self.interval):
            if self.generation != self._current_generation():
                return
            runs = self._snapshot()
            if not runs:
                continue
            sent_at = clock.monotonic()
            self.in_call_since = sent_at
            try:
                if not labelled:
                    self.engine.session_label(self.label)
                    labelled = True
                renewed = self.engine.jobs_renew_if_owned(
                    [LeaseRef(id=r.job.id, lease_token=r.job.lease_token) for r in runs],
                    self.lease_ms,
                )
            except Exception as exc:
                if self.engine.is_connection_error(exc):
                    self.engine.reset_connection()
                    labelled = False
                log.warning("heartbeat failed (%d leases not renewed this round): %s",
                            len(runs), exc)
                continue
            finally:
                self.in_call_since = None
            if self.generation != self._current_generation():
                return  # replaced while this call hung: its answer is stale
            self.rounds += 1
            self._on_renewed(runs, renewed, sent_at)
        # Closing is best effort; the thread may be abandoned with a hung connection.
        try:
            from django.db import connections

            connections[self.engine.alias].close()
        except Exception:
            pass
