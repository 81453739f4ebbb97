"""``JobContext``: what a job function receives as its first argument."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import connections

from .exceptions import JobCancelled

_logger = logging.getLogger("django_xjobs.job")


class StopSignal:
    """A one-way flag with ``threading.Event``'s interface (``is_set``, ``set``, ``wait``).

    A worker makes one per job; a real Event costs a Condition and two locks at creation, so
    the Event behind :meth:`wait` is only built when some code actually waits.
    """

    __slots__ = ("_event", "_flag")
    _guard = threading.Lock()

    def __init__(self) -> None:
        self._flag = False
        self._event: threading.Event | None = None

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        with self._guard:
            self._flag = True
            if self._event is not None:
                self._event.set()

    def wait(self, timeout: float | None = None) -> bool:
        if self._flag:
            return True
        with self._guard:
            if self._event is None:
                self._event = threading.Event()
                if self._flag:
                    self._event.set()
        return self._event.wait(timeout)


@dataclass(eq=False, kw_only=True, slots=True)
class JobContext:
    """The running job as its code sees it.

    ``cancelled`` is set when the run must stop: the job was cancelled from outside, its
    timeout passed, the worker lost its lease or is shutting down. Long-running code may poll
    it (``if ctx.cancelled.is_set(): return``) or call :meth:`check_cancelled`; step boundaries
    check it for you. Whatever a stopped run returns afterwards is discarded.
    """

    job_id: str
    run_id: str
    name: str
    queue: str
    attempt: int
    max_attempts: int
    tenant_id: str | None
    traceparent: str | None
    # The claim's fence token: services that write about the run inside the job's own code
    # (backfills, whose batches commit with their progress) fence those writes on it.
    lease_token: str | None = None
    cancelled: StopSignal = field(default_factory=StopSignal)
    stop_reason: str | None = None
    # What check_cancelled raises: a JobCancelled, or a subclass naming why (SlotLost).
    stop_error: type[JobCancelled] = JobCancelled
    # Builds ``step`` on first use (the worker supplies it: it knows the engine and the lease).
    step_factory: Callable[[JobContext], Any] | None = None
    # Raises unless the run can still prove it holds its lease (the worker supplies it: it knows
    # when the lease was last renewed). Called before the job's body and before every step's
    # body (docs/guarantees.md).
    lease_proof: Callable[[], None] | None = None
    _logger: logging.LoggerAdapter[Any] | None = None
    _step: Any = None

    @property
    def step(self) -> Any:
        """The durable steps of this run: ``run``, ``sleep``, ``sleep_until``,
        ``wait_for_event``, ``wait_for_any`` (awaitable in an ``async def`` job)."""
        if self._step is None:
            if self.step_factory is None:
                raise RuntimeError("steps are only available to a job run by a worker")
            self._step = self.step_factory(self)
        return self._step

    @property
    def logger(self) -> logging.LoggerAdapter[Any]:
        """``django_xjobs.job`` with job_id, job_name and attempt in every record's extra.

        Built on first use: most jobs never log, and a worker builds one context per job."""
        if self._logger is None:
            self._logger = logging.LoggerAdapter(
                _logger, {"job_id": self.job_id, "job_name": self.name, "attempt": self.attempt}
            )
        return self._logger

    @property
    def is_last_attempt(self) -> bool:
        return self.attempt >= self.max_attempts

    def stop(self, reason: str, error: type[JobCancelled] = JobCancelled) -> None:
        """Ask the run to stop (the worker calls this); the first reason wins."""
        if not self.cancelled.is_set():
            self.stop_reason = reason
            self.stop_error = error
            self.cancelled.set()

    def check_cancelled(self) -> None:
        """Raise :class:`JobCancelled` (or the subclass the worker named, e.g. ``SlotLost``) if
        the run was asked to stop."""
        if self.cancelled.is_set():
            raise self.stop_error(self.stop_reason or "cancelled")

    def prove_lease(self) -> None:
        """Before a body starts (the job's, a step's): raise :class:`JobCancelled` if the run was
        asked to stop or can no longer prove that its lease is still valid; in the latter case
        the worker hands the job back."""
        if self.lease_proof is not None:
            self.lease_proof()
        self.check_cancelled()


async def in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """Database work of an async job, off the event loop, in a thread that looks after its Django
    connections: a connection that failed (the server dropped it, the network broke) is closed
    after the call that met it, so the next call reconnects, and one whose health check fails
    (CONN_HEALTH_CHECKS) is replaced before. The event loop's pool threads live as long as the
    worker, so without this one dropped connection would fail every later call on its thread.
    Healthy connections stay open across calls (closing them per call would open a connection
    for every step with CONN_MAX_AGE = 0)."""

    def call() -> Any:
        for conn in connections.all(initialized_only=True):
            conn.close_if_health_check_failed()
        try:
            return fn(*args)
        finally:
            for conn in connections.all(initialized_only=True):
                if conn.errors_occurred:
                    conn.close_if_unusable_or_obsolete()

    return await asyncio.to_thread(call)
