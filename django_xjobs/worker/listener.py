"""The LISTEN thread: turns enqueue notifications into wake-ups of the worker loop.

NOTIFY is a latency hint, never the source of truth: a notification sent while this connection
is down is simply lost, so the loop polls anyway (``XJOBS["POLL_INTERVAL"]``). After every
(re)connect the thread LISTENs again and wakes the loop once, because anything enqueued while it
was away was never announced (tests/acceptance/test_worker_faults.py terminates this backend).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from ..engines import Engine, ListenerLost

log = logging.getLogger("django_xjobs.worker")


class WakeListener(threading.Thread):
    def __init__(
        self,
        *,
        engine: Engine,
        label: str,
        queues: Iterable[str],
        wake: Callable[[], None],
        stop: threading.Event,
    ) -> None:
        super().__init__(name="xjobs-listener", daemon=True)
        self.engine = engine
        self.label = label
        self.queues = frozenset(queues)
        self._wake = wake
        self._stop = stop
        self.connected = threading.Event()
        self.connects = 0
        self.backend_pid: int | None = None

    def run(self) -> None:
        backoff = 0.1
        while not self._stop.is_set():
            try:
                listener = self.engine.listener(self.label)
            except ListenerLost as exc:
                # The first failure in a row only: a database that is down fails every try.
                log.log(logging.WARNING if backoff == 0.1 else logging.DEBUG,
                        "LISTEN connection failed (%s); retrying with backoff", exc)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            backoff = 0.1
            try:  # from here on, however this ends, the connection is closed
                self.connects += 1
                self.backend_pid = getattr(listener, "backend_pid", lambda: None)()
                self.connected.set()
                if self.connects > 1:
                    log.info("LISTEN connection re-established")
                self._wake()
                while not self._stop.is_set():
                    notified = listener.wait(0.5)
                    if notified and not self.queues.isdisjoint(notified):
                        self._wake()
            except ListenerLost as exc:
                log.warning("LISTEN connection lost (%s); polling until it is back", exc)
            finally:
                self.connected.clear()
                listener.close()
