"""The heartbeat thread: one statement per interval renews every in-flight lease of a worker.

Protocol (the database is authoritative for ownership):

* every ``XJOBS["HEARTBEAT"]`` seconds (monotonic clock), send ``jobs_renew_if_owned`` with the
  (id, lease_token) of every unsettled run (queued, running, or finished but not yet
  acknowledged): an acknowledgement waiting in the batch buffer still needs its lease;
* an id missing from the answer means the run lost the job: the worker stops that run and
  discards its result (``Watchdog.on_renewed``, worker/watchdog.py);
* the statement never waits on a row lock: a row another transaction holds (a request's lock,
  an operator's change not committed yet) has its lease KEPT beside it instead
  (``x_lease_extensions``), which no claim takes over; the run goes on, and its row is renewed
  at the first round it is free. One held row delays nothing else (docs/design.md, "Lock
  order");
* a renewal that landed moves the run's ``renewed_at`` to the moment the statement was SENT, not
  answered: the database's ``now() + lease`` was computed at or after that moment, so the
  worker's belief about the lease never outlives the database's. A run proves its lease from it
  before each body it starts (``runs.Run.prove_lease``).

Concurrency slots (``slots.py``): when some of those runs hold a slot, the same round sends ONE
more statement, ``slots_renew_if_held``, fenced on the holder and on the slot not having expired
(a lapsed slot is never revived); a run whose slot is missing from the answer lost it
(``Watchdog.on_slots_renewed``: ``X_JOB_SLOT_LOST``); a slot row another transaction holds this
moment is skipped (not renewed, not lost) and renewed at the next round. Its ``sent_at`` is
taken the same way. A round with no slot held sends nothing more.

Every ``XJOBS["WORKER_SEEN_INTERVAL"]`` (at most once a round, busy or idle, with or without
leases to renew) the round also refreshes the worker's x_workers row (``Watchdog.seen``): it is
alive, and how its loop is doing (worker/liveness.py). A stopped process stops refreshing it,
which is how ``xjobs health`` tells it is stalled.

A hung connection (a stopped backend, a half-open socket) blocks this thread inside the
statement. The worker does not wait for it: its watch thread stops every run that has gone a
whole lease without renewal (the self-fence) and replaces this thread after a lease, bumping
``generation`` so the old thread's late answer is ignored.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any, Protocol

from django.db import connections

from .. import clock
from ..engines import Engine
from ..records import Renewal
from . import reachability

log = logging.getLogger("django_xjobs.worker")

class Renewer(Protocol):
    """The worker, as its heartbeat sees it (worker/watchdog.py, ``Watchdog``)."""

    heartbeat_generation: int  # a heartbeat whose generation is older has been replaced

    def unsettled(self) -> Sequence[Any]:
        """The runs whose leases to renew (every run not yet settled)."""

    def on_renewed(self, runs: Sequence[Any], renewal: Renewal, sent_at: float) -> None:
        """The answer of a lease renewal, per lease token."""

    def on_slots_renewed(self, runs: Sequence[Any], renewal: Renewal, sent_at: float) -> None:
        """The answer of a slot renewal, per holder."""

    def seen(self) -> None:
        """Record in the database that the worker is alive (x_workers); may raise."""


class Heartbeat(threading.Thread):
    def __init__(self, *, worker: Renewer, engine: Engine, label: str, interval: float,
                 lease_ms: int, slot_ttl_ms: int, generation: int,
                 stop: threading.Event, seen_every: float) -> None:
        super().__init__(name=f"xjobs-heartbeat-{generation}", daemon=True)
        self.worker = worker
        self.engine = engine
        self.label = label
        self.interval = interval
        self.lease_ms = lease_ms
        self.slot_ttl_ms = slot_ttl_ms
        self.generation = generation
        self._stop_event = stop
        self.in_call_since: float | None = None
        self.rounds = 0
        # How often the worker's x_workers row is refreshed (XJOBS["WORKER_SEEN_INTERVAL"]),
        # busy or idle; at most once a round.
        self.seen_every = seen_every
        self._next_seen = clock.monotonic() + seen_every

    def _replaced(self) -> bool:
        return self.generation != self.worker.heartbeat_generation

    def run(self) -> None:
        labelled = False
        while not self._stop_event.wait(self.interval):
            if self._replaced():
                return
            if clock.monotonic() >= self._next_seen:
                self._seen()
            runs = self.worker.unsettled()
            if not runs:
                continue
            sent_at = clock.monotonic()
            self.in_call_since = sent_at
            try:
                if not labelled:
                    self.engine.session_label(self.label)
                    labelled = True
                renewed = self.engine.jobs_renew_if_owned(
                    [r.job.claim for r in runs],
                    self.lease_ms,
                )
            except Exception as exc:
                lost = reachability.connection_error(exc, "heartbeat", self.engine)
                if lost is not None:
                    labelled = False
                if lost != reachability.UNREACHABLE:
                    # A lost connection says all there is to say; anything else gets its
                    # traceback.
                    log.warning("heartbeat failed (%d leases not renewed this round): %s",
                                len(runs), exc, exc_info=lost is None)
                continue
            finally:
                self.in_call_since = None
            if self._replaced():
                return  # replaced while this call hung: its answer is stale
            self.rounds += 1
            reachability.database.reached()
            self.worker.on_renewed(runs, renewed, sent_at)
            answer = self._renew_slots(runs)
            if answer == "replaced":
                return  # replaced while the slot renewal hung
            labelled = labelled and answer != "reconnect"
        self._close()

    def _seen(self) -> None:
        self._next_seen = clock.monotonic() + self.seen_every
        try:
            self.worker.seen()
        except Exception as exc:  # the lease renewal that follows reports a lost database
            log.debug("worker row not refreshed: %s", exc)

    def _renew_slots(self, runs: Sequence[Any]) -> str:
        """The slot half of a round: "ok", "reconnect" (the connection was reset) or
        "replaced" (this thread was replaced while the statement hung)."""
        held = [(r, r.slot) for r in runs if r.slot is not None]
        if not held:
            return "ok"
        sent_at = clock.monotonic()
        self.in_call_since = sent_at
        try:
            renewed = self.engine.slots_renew_if_held([h for _, h in held], self.slot_ttl_ms)
        except Exception as exc:
            log.warning("slot renewal failed (%d slots not renewed this round): %s",
                        len(held), exc, exc_info=not self.engine.is_connection_error(exc))
            if self.engine.is_connection_error(exc):
                self.engine.reset_connection()
                return "reconnect"
            return "ok"
        finally:
            self.in_call_since = None
        if self._replaced():
            return "replaced"
        self.worker.on_slots_renewed([r for r, _ in held], renewed, sent_at)
        return "ok"

    def _close(self) -> None:
        # Closing is best effort; the thread may be abandoned with a hung connection.
        try:
            connections[self.engine.alias].close()
        except Exception:
            pass
