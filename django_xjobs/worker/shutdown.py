"""OS signals -> a graceful stop, then a hard one.

The first SIGTERM or SIGINT asks the worker to stop claiming and let its runs finish within the
grace period; a second one exits the process at once. The leases of whatever was still running
then lapse, and another worker re-claims those jobs (tests/acceptance/test_worker_signals.py).
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from types import FrameType
from typing import Any

log = logging.getLogger("django_xjobs.worker")

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class ShutdownSignals:
    def __init__(self, on_first: Callable[[str], None]) -> None:
        self._on_first = on_first
        self._received = 0
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._received += 1
        name = signal.Signals(signum).name
        if self._received == 1:
            self._on_first(name)
            return
        log.warning("%s received again: exiting now; running jobs will be re-claimed after "
                    "their leases lapse", name)
        os._exit(1)
