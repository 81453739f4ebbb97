"""The soak's worker processes and what it does to them (docs/soak.md, "The chaos").

The workers are real ``xjobs_worker`` processes on the user's settings, started through
``manage.py xjobs_soak --worker`` (which registers the soak's jobs first), working only the
soak's queue, with a short lease so that a lapse happens within the run. The chaos thread picks,
from its random seed, one fault every two to three seconds: SIGKILL (then a new process), SIGTERM (a
graceful stop, then a new process), SIGSTOP for longer than the lease (then SIGCONT: the process
wakes up as a zombie whose writes the fence must refuse), or ``pg_terminate_backend`` on one of a
worker's database sessions. Every fault is written to the timeline printed with a failure.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError, connections

from . import tables

# (fault, weight in per cent)
FAULTS: tuple[tuple[str, int], ...] = (
    ("sigkill", 35),
    ("sigterm", 15),
    ("sigstop", 20),
    ("terminate_backend", 30),
)


@dataclass
class Timings:
    lease: float
    heartbeat: float
    poll: float
    grace: float
    concurrency: int


def worker_command() -> list[str]:
    """How to start ``manage.py xjobs_soak --worker`` on the settings this process runs on:
    through the project's own ``manage.py`` when that is what runs the soak (it may set up
    more than the settings: environment files, paths), else ``python -m django``."""
    entry = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if entry is not None and entry.name == "manage.py" and entry.is_file():
        return [sys.executable, str(entry.resolve()), "xjobs_soak", "--worker"]
    return [sys.executable, "-m", "django", "xjobs_soak", "--worker"]


def worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = settings.SETTINGS_MODULE
    # The child imports what this process imports (manage.py's directory is on sys.path here).
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


@dataclass
class Slot:
    """One of the pool's places: the process in it now and the ones before it."""

    index: int
    generation: int = 0
    proc: subprocess.Popen[bytes] | None = None
    worker_id: str = ""


@dataclass
class Pool:
    """The soak's worker processes; ``timeline`` records every start and fault."""

    soak: str
    queue: str
    size: int
    timings: Timings
    log_dir: Path
    started: float = field(default_factory=time.monotonic)
    slots: list[Slot] = field(default_factory=list)
    timeline: list[str] = field(default_factory=list)
    done: Counter[str] = field(default_factory=Counter)  # the faults made, by their name
    # worker id -> when (monotonic) its last SIGSTOP ended, None while it lasts: a stopped
    # process's open transaction stays open, which is the fault, not a finding (observe.py)
    stopped: dict[str, float | None] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def note(self, text: str) -> None:
        with self.lock:
            self.timeline.append(f"{time.monotonic() - self.started:7.2f}s  {text}")

    def start(self) -> None:
        self.slots = [Slot(i) for i in range(self.size)]
        for slot in self.slots:
            self.spawn(slot)

    def spawn(self, slot: Slot) -> None:
        slot.generation += 1
        slot.worker_id = f"{self.soak}-w{slot.index}.{slot.generation}"
        t = self.timings
        args = [
            "--worker-id", slot.worker_id, "--queue", self.queue,
            "--concurrency", str(t.concurrency), "--lease", f"{t.lease}s",
            "--heartbeat", f"{t.heartbeat}s", "--poll-interval", f"{t.poll}s",
            "--shutdown-grace", f"{t.grace}s", "--no-scheduler",
            "--supervised", str(os.getpid()),  # stops if this soak is killed (worker/watchdog.py)
        ]
        log = open(self.log_dir / f"{slot.worker_id}.log", "wb")  # noqa: SIM115 - the child's
        slot.proc = subprocess.Popen(worker_command() + args, env=worker_env(), stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()  # the child has its own descriptor
        self.note(f"start {slot.worker_id} (pid {slot.proc.pid})")

    def keep_alive(self) -> None:
        """Start a new process in any place whose process died on its own."""
        for slot in self.slots:
            if slot.proc is not None and slot.proc.poll() is not None:
                self.note(f"{slot.worker_id} exited by itself with {slot.proc.returncode}")
                self.spawn(slot)

    def stop_all(self, timeout: float) -> list[str]:
        """SIGTERM every process, wait up to ``timeout``, SIGKILL the rest; return complaints."""
        complaints = []
        for slot in self.slots:
            if slot.proc is not None and slot.proc.poll() is None:
                os.kill(slot.proc.pid, signal.SIGCONT)
                slot.proc.terminate()
        deadline = time.monotonic() + timeout
        for slot in self.slots:
            if slot.proc is None:
                continue
            try:
                code = slot.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                slot.proc.kill()
                slot.proc.wait()
                complaints.append(f"{slot.worker_id} did not stop within {timeout:g}s of SIGTERM")
                continue
            if code != 0:
                complaints.append(f"{slot.worker_id} exited {code} on SIGTERM")
        return complaints

    # ----------------------------------------------------------------------------- faults --
    def fault(self, rng: random.Random) -> None:
        kind = rng.choices([f for f, _ in FAULTS], [w for _, w in FAULTS])[0]
        slot = rng.choice(self.slots)
        proc = slot.proc
        if proc is None or proc.poll() is not None:
            return
        if kind == "sigkill":
            proc.kill()
            proc.wait()
            self.note(f"SIGKILL {slot.worker_id}")
            self.done["SIGKILL"] += 1
            self.spawn(slot)
        elif kind == "sigterm":
            proc.terminate()
            self.note(f"SIGTERM {slot.worker_id}")
            self.done["SIGTERM"] += 1
            try:
                code = proc.wait(self.timings.grace + 15)
                self.note(f"{slot.worker_id} exited {code}")
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                self.note(f"{slot.worker_id} ignored SIGTERM: SIGKILL")
            self.spawn(slot)
        elif kind == "sigstop":
            pause = self.timings.lease * rng.uniform(1.5, 2.5)
            self.stopped[slot.worker_id] = None
            proc.send_signal(signal.SIGSTOP)
            self.note(f"SIGSTOP {slot.worker_id} for {pause:.1f}s")
            self.done["SIGSTOP"] += 1
            time.sleep(pause)
            proc.send_signal(signal.SIGCONT)
            self.stopped[slot.worker_id] = time.monotonic()
            self.note(f"SIGCONT {slot.worker_id}")
        else:
            pids = self.backends(slot.worker_id)
            if pids:
                pid = rng.choice(pids)
                self.terminate_backend(pid)
                self.note(f"pg_terminate_backend {pid} of {slot.worker_id}")
                self.done["pg_terminate_backend"] += 1

    def stopped_lately(self, worker_id: str, within: float) -> bool:
        """Whether ``worker_id`` is stopped now, or was within the last ``within`` seconds."""
        if worker_id not in self.stopped:
            return False
        ended = self.stopped[worker_id]
        return ended is None or time.monotonic() - ended < within

    def backends(self, worker_id: str) -> list[int]:
        """The database sessions of worker ``worker_id`` (its connections are labelled
        ``xjobs:<worker id>:...``)."""
        with connections[tables.alias()].cursor() as cur:
            # Never its own: behind a transaction pooler, a server session's label is that of
            # whichever client used it last, possibly this one.
            cur.execute("select pid from pg_stat_activity where application_name like %s"
                        " and pid <> pg_backend_pid()", [f"xjobs:{worker_id}:%"])
            return [r[0] for r in cur.fetchall()]

    def terminate_backend(self, pid: int) -> None:
        with connections[tables.alias()].cursor() as cur:
            cur.execute("select pg_terminate_backend(%s)", [pid])


class Chaos(threading.Thread):
    """The pool's one supervising thread: until ``chaos_until`` (monotonic) a fault every two
    to three seconds (seeded); until ``stop``, a new process in any place whose process died on
    its own. One thread, so a fault and a restart never race for the same place."""

    def __init__(self, pool: Pool, seed: int, chaos_until: float, stop: threading.Event) -> None:
        super().__init__(name="xjobs-soak-chaos", daemon=True)
        self.pool = pool
        self.rng = random.Random(seed * 1000 + 99)
        self.chaos_until = chaos_until
        self.stop = stop
        self.error: BaseException | None = None

    def run(self) -> None:
        tables.name_session(self.pool.soak, "chaos")
        try:
            next_fault = time.monotonic() + self.rng.uniform(1.0, 3.0)
            while not self.stop.wait(0.25):
                self.pool.keep_alive()
                now = time.monotonic()
                if now >= next_fault and now < self.chaos_until:
                    try:
                        self.pool.fault(self.rng)
                    except DatabaseError as exc:
                        # Its own session went (a terminated backend behind a pooler can be
                        # one it was about to use): a fault it did to itself, not a finding.
                        self.pool.note(f"the chaos's own session failed: {exc}")
                        connections[tables.alias()].close()
                    next_fault = time.monotonic() + self.rng.uniform(1.0, 3.0)
        except BaseException as exc:  # reported by the soak, never lost
            self.error = exc
        finally:
            connections.close_all()
