"""OS signals -> a graceful stop, then a hard one.

The first SIGTERM or SIGINT asks the worker to stop claiming and let its runs finish within the
grace period; a second one exits the process at once. The leases of whatever was still running
then lapse, and another worker re-claims those jobs (tests/acceptance/test_worker_signals.py).

A worker process run by ``xjobs_worker --processes N`` (``repeat_exits=False``) ignores the
repeats: a signal sent to the whole process group or control group (Ctrl-C in a terminal,
systemd's default ``KillMode``) reaches it twice, once directly and once forwarded by the
supervisor, and both are the same stop. Exiting at once is then the supervisor's decision: its
own second signal kills the worker processes (worker/supervisor.py).

The Python-level handler does nothing that takes a lock: it runs between two bytecodes of the
main thread, which may be inside ``Event.clear()`` holding that event's lock, so setting the
event from the handler could deadlock. The C-level handler writes the signal number to a
socket (``signal.set_wakeup_fd``); a watcher thread reads it and calls ``on_first`` from a
normal thread context.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class ShutdownSignals:
    def __init__(self, on_first: Callable[[str], None], *, repeat_exits: bool = True) -> None:
        self._on_first = on_first
        self._repeat_exits = repeat_exits
        self._received = 0
        self._previous: dict[int, Any] = {}
        self._previous_fd = -1
        self._sockets: tuple[socket.socket, socket.socket] | None = None

    def install(self) -> None:
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        self._sockets = (reader, writer)
        self._previous_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        threading.Thread(target=self._watch, args=(reader,), name="xjobs-signals",
                         daemon=True).start()

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        signal.set_wakeup_fd(self._previous_fd)
        if self._sockets is not None:
            for sock in self._sockets:
                sock.close()
            self._sockets = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._received += 1
        if self._received >= 2 and self._repeat_exits:
            self._exit(signum)

    def _exit(self, signum: int) -> None:
        name = signal.Signals(signum).name
        os.write(2, f"{name} received again: exiting now; running jobs will be re-claimed "
                    "after their leases lapse\n".encode())
        os._exit(1)

    def _watch(self, reader: socket.socket) -> None:
        # The C-level handler writes one byte per signal, while the Python-level one runs once
        # for every signal that arrived before the main thread got to run it: a second SIGTERM
        # sent before then (the first one's stop already logged, by this thread) is counted
        # here (tests/acceptance/test_worker_signals.py).
        handled = {int(s) for s in SIGNALS}
        seen = 0
        while True:
            try:
                data = reader.recv(64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum not in handled:
                    continue
                seen += 1
                if seen == 1:
                    self._on_first(signal.Signals(signum).name)
                elif self._repeat_exits:
                    self._exit(signum)
