"""``AsyncResult``: a job read by its id, in Celery's words.

=====================================  ==========================================
the job's state                        ``status``
=====================================  ==========================================
no job with this id (yet, or pruned)   ``PENDING`` (as Celery says of an unknown id)
ready, delayed or blocked, never run   ``PENDING``
ready or delayed after a failed run    ``RETRY``
running, or suspended on a step        ``STARTED``
done                                   ``SUCCESS``
dead                                   ``FAILURE`` (``REVOKED`` if it expired)
cancelled                              ``REVOKED``
=====================================  ==========================================

``get(timeout=)`` polls the row (from 50 ms, doubling to ``interval``) until the job finished:
the result, the task's exception (rebuilt from the recorded error when its class is one this
process has imported and takes a message; :class:`~django_xjobs.celery.TaskFailed`
otherwise), or :class:`~django_xjobs.celery.TaskRevokedError`. It refuses to run inside a task,
as Celery does: a job that waits on another holds a worker's thread meanwhile;
``ctx.step.invoke`` or a chain suspends instead.
"""

from __future__ import annotations

import re
import sys
import time
from datetime import datetime
from typing import Any
from uuid import UUID

from .. import api
from ..exceptions import ChildFailed, JobNotFound, class_path, split_recorded_error
from ..records import JobRecord
from .base import current_request
from .errors import NotSupported, TaskExpired, TaskFailed, TaskRevokedError, TimeoutError


class states:  # Celery's module of names, as a namespace
    PENDING = "PENDING"
    RECEIVED = "RECEIVED"
    STARTED = "STARTED"
    RETRY = "RETRY"
    SUCCESS = "SUCCESS"
    FAILURE = "FAILURE"
    REVOKED = "REVOKED"
    READY_STATES = frozenset({SUCCESS, FAILURE, REVOKED})
    UNREADY_STATES = frozenset({PENDING, RECEIVED, STARTED, RETRY})
    EXCEPTION_STATES = frozenset({RETRY, FAILURE, REVOKED})
    PROPAGATE_STATES = frozenset({FAILURE, REVOKED})
    ALL_STATES = frozenset({PENDING, RECEIVED, STARTED, RETRY, SUCCESS, FAILURE, REVOKED})


_EXPIRED = class_path(TaskExpired)
_CHILD_FAILED = class_path(ChildFailed)
# How ChildFailed names the child that failed: "... (<job name> <job id>) ended dead ...".
_FAILED_CHILD = re.compile(r"\(\S+ ([0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12})\)")
MAX_DEPTH = 20


def failed_root(record: JobRecord) -> JobRecord:
    """The job whose failure failed ``record``: a canvas' orchestrator fails with
    ``ChildFailed``, so its result raises what its failed task raised, as a Celery chain's
    does; followed down nested canvases."""
    for _ in range(MAX_DEPTH):
        recorded = split_recorded_error(record.last_error or "")
        found = _FAILED_CHILD.search(recorded[1]) if recorded and recorded[0] == _CHILD_FAILED \
            else None
        if found is None:
            return record
        try:
            child = api.get_job(found.group(1))
        except JobNotFound:
            return record
        if child.state not in ("dead", "cancelled"):
            return record
        record = child
    return record


def status_of(record: JobRecord | None) -> str:
    """Celery's word for a job's state (the table above)."""
    if record is None:
        return states.PENDING
    state = record.state
    if state == "done":
        return states.SUCCESS
    if state == "dead":
        recorded = split_recorded_error(record.last_error or "")
        return states.REVOKED if recorded and recorded[0] == _EXPIRED else states.FAILURE
    if state == "cancelled":
        return states.REVOKED
    if state in ("running", "suspended"):
        return states.STARTED
    if record.attempt > 0 and record.last_error:
        return states.RETRY
    return states.PENDING


def rebuilt_exception(error: str | None) -> BaseException:
    """The exception a failed job raised, from its recorded error: its class when a module
    this process imported already defines it (nothing is imported by a name read from a row)
    and it takes a message; else :class:`TaskFailed` carrying the whole text."""
    text = error or "the job failed without an error recorded"
    recorded = split_recorded_error(text)
    if recorded is not None:
        path, rest = recorded
        module, _, qualname = path.rpartition(".")
        kind = getattr(sys.modules.get(module), qualname, None) if "." not in qualname else None
        message = _last_line(rest, qualname)
        if isinstance(kind, type) and issubclass(kind, Exception):
            try:
                exc = kind(message)
            except Exception:
                pass
            else:
                exc.add_note(rest.rstrip())
                return exc
    return TaskFailed(text)


def _last_line(traceback_text: str, qualname: str) -> str:
    """The message of the exception line ``Class: message`` at the end of a traceback."""
    for line in reversed(traceback_text.rstrip().splitlines()):
        head, sep, message = line.partition(": ")
        if head.rpartition(".")[2] == qualname:
            return message if sep else ""
    return traceback_text.rstrip().rpartition("\n")[2]


class AsyncResult:
    """A task's result by its id: ``status``, ``result``, ``ready()``, ``get(timeout=)``."""

    def __init__(self, id: str | UUID, task_name: str | None = None, **_: Any) -> None:
        self.id = str(id)
        self.task_id = self.id
        self.name = task_name

    def __repr__(self) -> str:
        return f"<AsyncResult: {self.id}>"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, AsyncResult):
            return other.id == self.id
        return other == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def _record(self) -> JobRecord | None:
        try:
            return api.get_job(self.id)
        except JobNotFound:
            return None

    @property
    def status(self) -> str:
        return status_of(self._record())

    state = status

    @property
    def result(self) -> Any:
        """The value once ``SUCCESS``, the exception once ``FAILURE`` / ``REVOKED``, else
        None."""
        record = self._record()
        if record is None or record.state not in ("done", "dead", "cancelled"):
            return None
        if record.state == "done":
            return record.result
        return self._failure(record)

    info = result

    @property
    def traceback(self) -> str | None:
        record = self._record()
        return record.last_error if record is not None and record.state == "dead" else None

    @property
    def date_done(self) -> datetime | None:
        record = self._record()
        return record.finished_at if record is not None else None

    def ready(self) -> bool:
        return self.status in states.READY_STATES

    def successful(self) -> bool:
        return self.status == states.SUCCESS

    def failed(self) -> bool:
        return self.status == states.FAILURE

    def get(self, timeout: float | None = None, propagate: bool = True,
            interval: float = 0.5, **_: Any) -> Any:
        """Wait until the task finished and return its value; raise its exception
        (``propagate=False``: return it), :class:`TaskRevokedError`, or
        :class:`TimeoutError` after ``timeout`` seconds."""
        if current_request() is not None and current_request().ctx is not None:  # type: ignore[union-attr]
            raise NotSupported(
                "AsyncResult.get() inside a task would hold a worker's thread while it waits: "
                "use a chain, or ctx.step.invoke(), which suspends the job instead")
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.05
        while True:
            record = self._record()
            if record is not None and record.state in ("done", "dead", "cancelled"):
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"task {self.id} did not finish within {timeout}s "
                                   f"(status {status_of(record)})")
            wait = pause if deadline is None else min(pause, max(deadline - time.monotonic(), 0))
            time.sleep(wait)
            pause = min(pause * 2, max(interval, 0.05))
        if record.state == "done":
            return record.result
        failure = self._failure(record)
        if propagate:
            raise failure
        return failure

    wait = get

    def _failure(self, record: JobRecord) -> BaseException:
        record = failed_root(record)
        if record.state == "cancelled" or status_of(record) == states.REVOKED:
            return TaskRevokedError(f"task {self.id} was revoked: "
                                    f"{record.last_error or 'cancelled'}")
        return rebuilt_exception(record.last_error)

    def revoke(self, terminate: bool = False, **_: Any) -> None:
        """Cancel the job; a running one is stopped at its next step or check of
        ``ctx.cancelled`` (``terminate`` is what a cancel always does here)."""
        try:
            api.cancel(self.id, reason="revoked")
        except JobNotFound:
            pass  # as Celery: revoking an id nobody knows does nothing

    def forget(self) -> None:
        """Nothing to do: a finished job is removed by retention (XJOBS["RETENTION"])."""
