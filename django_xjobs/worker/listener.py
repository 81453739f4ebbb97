"""The LISTEN threads: turn notifications into wake-ups of a waiting loop.

NOTIFY is a latency hint, never the source of truth: a notification sent while this connection
is down is simply lost, so the loop polls anyway (``XJOBS["POLL_INTERVAL"]``). After every
(re)connect the thread LISTENs again and wakes the loop once, because anything enqueued while it
was away was never announced (tests/acceptance/test_worker_faults.py terminates this backend).
Two users: the worker loop's :class:`WakeListener` (enqueues, filtered by queue) and the outbox
relay's ``OutboxListener`` (worker/relay.py, stagings).
"""

from __future__ import annotations

import abc
import logging
import threading
from collections.abc import Callable, Iterable

from ..engines import Engine, Listener, ListenerLost

log = logging.getLogger("django_xjobs.worker")


class ListenerThread(threading.Thread, abc.ABC):
    """One dedicated LISTEN connection, reconnected with backoff, that calls ``wake``."""

    what = "LISTEN"  # how its log lines name the connection
    log_reconnects = False  # whether a reconnect (after the first connect) is logged

    def __init__(self, *, name: str, engine: Engine, label: str, wake: Callable[[], None],
                 stop: threading.Event) -> None:
        super().__init__(name=name, daemon=True)
        self.engine = engine
        self.label = label
        self._wake = wake
        self._stop = stop
        self.connected = threading.Event()
        self.connects = 0
        self.backend_pid: int | None = None

    @abc.abstractmethod
    def _connect(self) -> Listener:
        """Open the LISTEN connection (raises :class:`ListenerLost` when it cannot)."""

    def _wanted(self, notified: list[str]) -> bool:
        """Whether what ``Listener.wait`` returned calls for a wake-up."""
        return bool(notified)

    def run(self) -> None:
        backoff = 0.1
        told = False  # this outage has had its one WARNING line (the loss, or a failed connect)
        while not self._stop.is_set():
            try:
                listener = self._connect()
            except ListenerLost as exc:
                # The first failure in a row only: a database that is down fails every try.
                log.log(logging.DEBUG if told else logging.WARNING,
                        "%s connection failed (%s); retrying with backoff", self.what, exc)
                told = True
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            backoff = 0.1
            told = False
            try:  # from here on, however this ends, the connection is closed
                self.connects += 1
                self.backend_pid = getattr(listener, "backend_pid", lambda: None)()
                self.connected.set()
                if self.log_reconnects and self.connects > 1:
                    log.info("%s connection re-established", self.what)
                self._wake()
                while not self._stop.is_set():
                    if self._wanted(listener.wait(0.5)):
                        self._wake()
            except ListenerLost as exc:
                log.warning("%s connection lost (%s); polling until it is back", self.what, exc)
                told = True
            finally:
                self.connected.clear()
                listener.close()


class WakeListener(ListenerThread):
    """Wakes the worker loop when a job is enqueued on one of its queues."""

    log_reconnects = True

    def __init__(self, *, engine: Engine, label: str, queues: Iterable[str],
                 wake: Callable[[], None], stop: threading.Event) -> None:
        super().__init__(name="xjobs-listener", engine=engine, label=label, wake=wake,
                         stop=stop)
        self.queues = frozenset(queues)

    def _connect(self) -> Listener:
        return self.engine.listener(self.label)

    def _wanted(self, notified: list[str]) -> bool:
        return bool(notified) and not self.queues.isdisjoint(notified)
