"""``xjobs_worker --processes N``: one command that uses every core.

Python runs one thread of Python at a time, so one worker process saturates one core at best.
The supervisor starts N ordinary worker processes (the same command, one process each), and:

* restarts a child that exits on its own (a job that called ``os._exit``, a segfault, an OOM
  kill), with a backoff that grows while children keep dying young, so a poison job cannot
  turn into a fork loop (the job itself ends ``dead`` after ``max_attempts`` lapsed leases);
* replaces a child that recycled itself (``--max-jobs-per-process``, ``--max-memory``: it exits
  with ``EXIT_RECYCLED`` once it drained, worker/recycling.py) at once: not a crash, so the
  backoff neither grows nor resets. ``xjobs_worker`` runs a recycling worker under a supervisor
  even with one process, so the command keeps running across recycles;
* forwards the first SIGTERM/SIGINT to every child (each finishes its in-flight jobs within its
  grace period) and waits for them; a second signal kills the children at once (SIGKILL: their
  jobs are re-claimed once their leases lapse). A child ignores a repeated SIGTERM/SIGINT
  (``--supervised PID``, worker/shutdown.py): a signal sent to the whole process group or control
  group reaches it directly and forwarded, and that is one stop, not two. A child started while
  the first signal came (its ``Popen`` still running) gets it as soon as it is known;
* has no way to stop its children if it is SIGKILLed itself: each child watches its parent and
  stops as on a first SIGTERM once the supervisor is gone (worker/watchdog.py);
* with ``--burst``, lets a child that exits 0 (nothing left to do) stay gone, and exits once
  every child has; a child that exits 1 (the command's error exit: its burst could not go on,
  e.g. the database is unreachable) stays gone too, and the supervisor then exits non-zero.

Children are separate interpreters (not forks of this one): no database connection, thread or
lock is ever shared across a fork.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from types import FrameType

from .recycling import EXIT_RECYCLED

log = logging.getLogger("django_xjobs.worker")

MIN_UPTIME = 10.0  # a child that lived less than this "died young": back off before restarting
MAX_BACKOFF = 30.0


class Supervisor:
    def __init__(self, child_args: Sequence[Sequence[str]],
                 env: dict[str, str] | None = None, *, burst: bool = False) -> None:
        # One entry per process, its command line's options: the same for every process, or
        # per shard (xjobs_worker --shard a --shard b).
        self.child_args = [list(args) for args in child_args]
        self.processes = len(self.child_args)
        self.burst = burst
        self.env = env if env is not None else dict(os.environ)
        self.children: dict[int, subprocess.Popen[bytes]] = {}
        self.started_at: dict[int, float] = {}
        self.restarts = 0
        self.recycles = 0
        self.failed = 0  # burst children that exited with an error (not restarted)
        self._signals = 0
        self._first_signal: int | None = None
        self._backoff = 0.0

    def _spawn(self, slot: int) -> None:
        argv = [sys.executable, "-m", "django", "xjobs_worker", *self.child_args[slot],
                "--supervised", str(os.getpid())]
        proc = subprocess.Popen(argv, env=self.env)
        self.children[slot] = proc
        self.started_at[slot] = time.monotonic()
        log.info("supervisor: started worker process %d (pid %d)", slot, proc.pid)
        if self._first_signal is not None:  # it came while Popen ran: this child missed it
            self._send(proc, self._first_signal)

    def _forward(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        if self._first_signal is None:
            self._first_signal = signum
        # The first signal asks every child for a graceful stop; a second one ends them now.
        for proc in self.children.values():
            self._send(proc, signum if self._signals == 1 else signal.SIGKILL)

    @staticmethod
    def _send(proc: subprocess.Popen[bytes], signum: int) -> None:
        if proc.poll() is None:
            try:
                proc.send_signal(signum)
            except ProcessLookupError:
                pass

    def run(self) -> int:
        previous = {s: signal.signal(s, self._forward) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            for slot in range(self.processes):
                self._spawn(slot)
            while True:
                if self._signals:
                    return self._wait_all()
                for slot, proc in list(self.children.items()):
                    if self._signals:
                        break
                    code = proc.poll()
                    if code is None:
                        continue
                    # Gone from the children at once: a stop that comes while this slot waits
                    # out its restart backoff neither signals nor counts the dead process.
                    del self.children[slot]
                    if code == EXIT_RECYCLED:  # it said why; a fresh one goes on, burst or not
                        self.recycles += 1
                        log.info("supervisor: worker process %d (pid %d) recycled itself; "
                                 "starting a fresh one", slot, proc.pid)
                        if self._signals:
                            break
                        self._spawn(slot)
                        continue
                    if self.burst and code == 0:  # its burst is over: nothing left to do
                        log.info("supervisor: worker process %d (pid %d) finished its burst",
                                 slot, proc.pid)
                        continue
                    if self.burst and code == 1:  # it said why; a restart would say it again
                        self.failed += 1
                        log.error("supervisor: worker process %d (pid %d) could not finish its "
                                  "burst (exit code 1)", slot, proc.pid)
                        continue
                    lived = time.monotonic() - self.started_at[slot]
                    self._backoff = (min(MAX_BACKOFF, max(1.0, self._backoff * 2))
                                     if lived < MIN_UPTIME else 0.0)
                    log.warning("supervisor: worker process %d (pid %d) exited with %s after "
                                "%.1fs; restarting in %.1fs", slot, proc.pid, code, lived,
                                self._backoff)
                    deadline = time.monotonic() + self._backoff
                    while time.monotonic() < deadline and not self._signals:
                        time.sleep(0.05)
                    if self._signals:
                        break
                    self.restarts += 1
                    self._spawn(slot)
                if not self.children:
                    return 1 if self.failed else 0
                time.sleep(0.1)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _wait_all(self) -> int:
        # Every signal is forwarded by the handler as it arrives; a second one kills the
        # children.
        while any(p.poll() is None for p in self.children.values()):
            time.sleep(0.05)
        codes = [p.returncode for p in self.children.values()]
        log.info("supervisor: all worker processes stopped (exit codes %s)", codes)
        # A child still starting up when the signal came had no handler yet and died of it:
        # it had claimed nothing, so that is a clean stop too.
        # One that recycled itself meanwhile had drained: a clean stop as well.
        clean = {0, -signal.SIGTERM, -signal.SIGINT, EXIT_RECYCLED}
        return 0 if all(c in clean for c in codes) else 1
