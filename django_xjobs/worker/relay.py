"""The outbox relay duty: publishes what ``enqueue_on_commit`` staged (protocol: outbox.py).

Runs in every worker (``xjobs_worker --no-relay`` switches it off) and alone as
``manage.py xjobs_relay``. Any number of relays may run at once, in any processes: the claim's
SKIP LOCKED splits the pending rows between them.

The loop, per round: for each outbox alias (``XJOBS["OUTBOX"]["DATABASES"]``), publish one
batch (``outbox.relay_batch``); if any batch came back full, go again at once, else wait for a
wake-up or the poll interval. Wake-ups:

* a NOTIFY on the outbox channel, sent by the staging's transaction on commit, received by one
  LISTEN thread per outbox alias (each on a dedicated connection that reconnects with backoff
  and wakes the relay once after every reconnect, since stagings meanwhile went unannounced);
* ``transaction.on_commit`` of a staging made in this same process (``outbox.add_waker``);
* the stop event, so a stopping worker is never held up by the relay.

What bounds what: a wake-up is a hint; the poll interval bounds the lag when every hint is
lost (NOTIFY off, listener down). A database error ends the round: the relay's transactions
roll back (rows stay pending, and no half-made batch remains in a shared database), its
connections are reset, and it retries after a backoff that grows to the poll interval.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from django.db import connections

from .. import conf, outbox
from ..engines import Engine, Listener, get_engine
from . import reachability
from .duties import Duty
from .listener import ListenerThread

log = logging.getLogger("django_xjobs.worker")


class Relay(Duty):
    name = "relay"

    def __init__(self, *, engine: Engine, worker_id: str, stop: threading.Event,
                 aliases: tuple[str, ...] | None = None, batch_size: int | None = None,
                 poll_interval: float | None = None) -> None:
        super().__init__(engine=engine, worker_id=worker_id, stop=stop)
        settings = conf.get()
        self.aliases = tuple(aliases or settings.outbox.databases)
        self.batch_size = batch_size or settings.outbox.batch_size
        self.poll_interval = poll_interval or settings.outbox.poll_interval
        self.listen = settings.notify and engine.features.listen_notify
        self.label = f"xjobs:{worker_id}:relay"
        self.relayed = 0  # rows this relay marked published
        self.rounds = 0  # test signal: completed rounds
        self.listeners: list[OutboxListener] = []
        self._wake = threading.Event()
        self._labelled: set[str] = set()

    def wake(self) -> None:
        self._wake.set()

    def run(self) -> None:
        outbox.add_waker(self.wake)
        threading.Thread(target=self._wake_on_stop, name="xjobs-relay-stop",
                         daemon=True).start()
        if self.listen:
            for alias in self.aliases:
                listener = OutboxListener(engine=get_engine(alias),
                                          label=f"xjobs:{self.worker_id}:relay-listen",
                                          wake=self.wake, stop=self.stop)
                listener.start()
                self.listeners.append(listener)
        backoff = 0.0
        try:
            while not self.stop.is_set():
                self._wake.clear()
                try:
                    more = self._round()
                except Exception as exc:  # the contract: a database error never ends the duty
                    if self.stop.is_set():
                        break
                    backoff = min(max(backoff * 2, 0.1), self.poll_interval)
                    lost = reachability.connection_error(exc, "outbox relay", *self._engines())
                    if lost != reachability.UNREACHABLE:
                        log.warning("outbox relay: %s: %s; retrying in %.1fs",
                                    type(exc).__name__, exc, backoff, exc_info=lost is None)
                    # Whatever the error, the round's connections are reset (see the module
                    # docstring); one that connection_error reset already is closed, a no-op.
                    self._reset_connections()
                    self.started.set()
                    self.stop.wait(backoff)
                    continue
                backoff = 0.0
                self.rounds += 1
                reachability.database.reached()
                self.started.set()
                if not more:
                    self._wake.wait(self.poll_interval)
        finally:
            outbox.remove_waker(self.wake)

    def _round(self) -> bool:
        """One batch per outbox alias; True when a batch was full (more may be pending)."""
        more = False
        for alias in self.aliases:
            source = get_engine(alias)
            self._label(source)
            self._label(self.engine)
            moved = outbox.relay_batch(source, self.engine, batch_size=self.batch_size)
            if moved:
                self.relayed += moved
                log.debug("outbox relay: published %d rows of %r", moved, alias)
            more = more or moved >= self.batch_size
        return more

    def _label(self, engine: Engine) -> None:
        if engine.alias not in self._labelled:
            engine.session_label(self.label)
            self._labelled.add(engine.alias)

    def _wake_on_stop(self) -> None:
        self.stop.wait()
        self._wake.set()

    def _engines(self) -> list[Engine]:
        """The engine of every database a round uses (outbox aliases and the queue's), once."""
        others = {*self.aliases} - {self.engine.alias}
        return [self.engine, *(get_engine(alias) for alias in others)]

    def _reset_connections(self) -> None:
        for engine in self._engines():
            engine.reset_connection()
        self._labelled.clear()

    def close_connection(self) -> None:
        for alias in {*self.aliases, self.engine.alias}:
            try:
                connections[alias].close()
            except Exception:  # best effort: the connection may be broken already
                log.debug("relay: closing its %r connection failed", alias, exc_info=True)


class OutboxListener(ListenerThread):
    """LISTENs for stagings on one outbox alias and wakes the relay (see the module docstring)."""

    what = "outbox LISTEN"

    def __init__(self, *, engine: Engine, label: str, wake: Callable[[], None],
                 stop: threading.Event) -> None:
        super().__init__(name=f"xjobs-relay-listen-{engine.alias}", engine=engine, label=label,
                         wake=wake, stop=stop)

    def _connect(self) -> Listener:
        return self.engine.outbox_listener(self.label)
