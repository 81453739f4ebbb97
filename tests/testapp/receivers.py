"""Receivers of django_xjobs.signals for tests/acceptance/test_signals_worker.py, connected by
``TestAppConfig.ready`` only in a process started with ``XJOBS_TEST_SIGNALS_FILE`` (every other
test process keeps a worker with no receiver, and its one-pass acknowledgement).

``record`` appends one JSON line per signal to that file, with the pid and thread that received
it; ``boom`` raises on every signal and is connected first, so the file shows that the receivers
after a raising one still hear every signal.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from django_xjobs import signals

ENV = "XJOBS_TEST_SIGNALS_FILE"
_lock = threading.Lock()


def boom(sender: Any, signal: Any, **kwargs: Any) -> None:
    raise RuntimeError("a receiver that always raises")


def _describe(name: str, sender: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    line: dict[str, Any] = {"signal": name, "pid": os.getpid(),
                            "thread": threading.current_thread().name,
                            "sender": sender if isinstance(sender, str) else sender.name}
    job = kwargs.get("job")
    if job is not None:
        line.update(job_id=job.id, name=job.name, attempt=kwargs.get("attempt", job.attempt))
    if "outcome" in kwargs:
        exc = kwargs["exception"]
        line.update(outcome=kwargs["outcome"],
                    exception=None if exc is None else f"{type(exc).__name__}: {exc}")
    if "error" in kwargs:
        line["error"] = kwargs["error"]
    if "handle" in kwargs:
        line["job_id"] = str(kwargs["handle"].id)
    return line


def _recorder(name: str, path: str):
    def record(sender: Any, signal: Any, **kwargs: Any) -> None:
        text = json.dumps(_describe(name, sender, kwargs)) + "\n"
        with _lock, open(path, "a") as f:
            f.write(text)
    return record


def connect(path: str) -> None:
    for name in ("job_enqueued", "job_started", "job_finished", "job_dead"):
        signal = getattr(signals, name)
        signal.connect(boom, weak=False, dispatch_uid=f"tests.boom.{name}")
        signal.connect(_recorder(name, path), weak=False, dispatch_uid=f"tests.record.{name}")
