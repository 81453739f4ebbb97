"""Named fault points for fault-injection tests (Temporal's "execute, then time out" idea).

Part of the repository's test kit (the fault tests of tests/acceptance/, tests/integration/ and
tests/conformance/; not of :mod:`django_xjobs.testing`, the kit for users), and inert in
production: nothing arms a point unless a test does. The engine calls
``hit("before:<statement>")`` and ``hit("after:<statement>")`` around every statement, the
worker, the steps, the scheduler and the backfills call a few points of their own
(``worker:<name>``, ``step:<name>``, ...). Unarmed, a point guarded by ``if faults.armed:``
costs one module attribute read (about 8 ns on the development machine) and a bare ``hit()``
one function call that returns on the empty ``_points`` (about 40 ns), against some 70 µs for
the smallest statement round trip.

The points are in the package because the code they interrupt is; this module comes with them
so that worker subprocesses, which import only the installed package and the test settings, can
be armed through their environment.

What arms a point, and nothing else does:

* :func:`inject` and :func:`inject_hook`, called in-process by a test (:func:`clear` disarms);
* the environment variable ``XJOBS_FAULTS``, read once when this module is imported: how the
  acceptance tests arm the worker subprocesses they start (tests/conftest.py,
  ``spawn_worker(faults=...)``). A deployment never sets it: its actions kill, stop and
  disconnect the process on purpose. ::

    XJOBS_FAULTS="after:jobs_complete_if_owned=disconnect*1;worker:job-start=exit"

Actions:

``disconnect``  close this thread's database connection, then raise ``OperationalError``:
                after a statement that committed, this is the ambiguous commit (the server
                applied the write, the client never heard);
``raise``       raise ``OperationalError`` without touching the connection;
``exit``        ``os._exit(137)``, as a SIGKILL would end the process;
``stop``        SIGSTOP this process (a frozen VM, a long GC pause);
``sleep:S``     sleep S seconds;
a callable      (in-process only, :func:`inject_hook`) called with the point's name: a test
                that must act at an exact moment (publish an event between a waiter's check
                and its suspension) does it there, deterministically.

``*N`` fires the fault N times (default: every time).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.db import OperationalError, connections

ENV_VAR = "XJOBS_FAULTS"


@dataclass
class _Fault:
    action: str | Callable[[str], None]
    remaining: int | None  # None = unlimited


_points: dict[str, _Fault] = {}
_lock = threading.Lock()
# Whether any fault is armed: hot paths test this before building a point's name.
armed = False
alias = "default"  # the connection `disconnect` closes; set by the worker to XJOBS["DATABASE"]


def _parse(spec: str) -> dict[str, _Fault]:
    parsed: dict[str, _Fault] = {}
    for item in filter(None, (part.strip() for part in spec.split(";"))):
        point, _, action = item.partition("=")
        times: int | None = None
        if "*" in action:
            action, _, count = action.rpartition("*")
            times = int(count)
        parsed[point.strip()] = _Fault(action.strip(), times)
    return parsed


def inject(point: str, action: str, *, times: int | None = 1) -> None:
    global armed
    with _lock:
        _points[point] = _Fault(action, times)
        armed = True


def inject_hook(point: str, hook: Callable[[str], None], *, times: int | None = 1) -> None:
    """Call ``hook(point)`` when the code reaches ``point`` (tests)."""
    global armed
    with _lock:
        _points[point] = _Fault(hook, times)
        armed = True


def clear() -> None:
    global armed
    with _lock:
        _points.clear()
        armed = False


def hit(point: str) -> None:
    if not _points:
        return
    with _lock:
        fault = _points.get(point)
        if fault is None:
            return
        if fault.remaining is not None:
            fault.remaining -= 1
            if fault.remaining <= 0:
                del _points[point]
    _act(point, fault.action)


def _act(point: str, action: str | Callable[[str], None]) -> None:
    if callable(action):
        action(point)
        return

    if action == "disconnect":
        raw = connections[alias].connection
        if raw is not None:
            raw.close()
        raise OperationalError(f"injected fault at {point}: connection lost")
    if action == "raise":
        raise OperationalError(f"injected fault at {point}")
    if action == "exit":
        os._exit(137)
    if action == "stop":
        # Sent to this thread, not to the process: a process-directed SIGSTOP starts the stop
        # in whichever thread the kernel picks, and under load this one ran on for
        # milliseconds (into the next step's body) before it stopped too.
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
        return
    if action.startswith("sleep:"):
        time.sleep(float(action.split(":", 1)[1]))
        return
    raise ValueError(f"unknown fault action {action!r} at {point}")


if os.environ.get(ENV_VAR):
    _points.update(_parse(os.environ[ENV_VAR]))
    armed = True
