"""A whole job row, as read for inspection (CLI, admin actions, handles): with its attempt
history, its progress, and the reasons it is not running, read when asked."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from .states import LIVE_STATES, TERMINAL_STATES, WAITING_STATES, JobStateName
from .why import BlockedBy


def decode_stored_json(text: str, loads: Callable[[str], Any] = json.loads
                       ) -> tuple[Any, str | None]:
    """(value, None) for JSON text as the database stores it, or (None, why) for valid JSON
    that Python's json module refuses: it raises ValueError past
    ``sys.get_int_max_str_digits()`` digits in an integer and RecursionError on deep nesting
    (docs/console.md, "Big and undecodable JSON"). Every reader of stored JSON that must
    survive such a row (the engine's records, the console) decodes through here: the console
    with ``json.loads`` (it shows typed values as stored), the engine with
    ``values.decode_json``, whose ValueError also names a malformed typed value."""
    try:
        return loads(text), None
    except RecursionError:
        return None, "nested too deeply for Python's json module"
    except ValueError as exc:
        return None, str(exc).split(";")[0]


# What reads why a job is not running: django_xjobs.why's reader, which django_xjobs/__init__.py
# sets here at ``import django_xjobs``; this module is below the engines and cannot call them
# itself. Set on this module, not on the package that re-exports the records: JobRecord reads it
# here.
blocked_by_reader: Callable[[JobRecord], tuple[BlockedBy, ...]] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptRecord:
    """One run of a job, as its attempt history keeps it (docs/observability.md, "Attempt
    history"): written by the statement that ended the run. ``outcome`` is one of
    ATTEMPT_OUTCOMES; ``error`` the recorded error (class line, message, traceback) or the note
    of a run handed back, else None. ``run`` numbers the job's runs from 1: a run that
    suspended, snoozed or was handed back keeps its ``attempt``, so the next run has the same
    attempt and the next run number; None for a run after a gap (the history kept only the
    first and the newest 20, and cannot tell how many went)."""

    attempt: int
    worker: str | None
    started_at: datetime | None
    finished_at: datetime | None
    outcome: str
    error: str | None = None
    run: int | None = None

    @property
    def duration(self) -> float | None:
        """Seconds from start to end, when both are known."""
        if self.started_at is None or self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()


# How a run can end, in the attempt history: the job finished, or failed (retried or dead), or
# ran past its timeout; its lease lapsed (`lost`), it was cancelled, lost its concurrency slot,
# snoozed, parked by a durable step, or was handed back without spending an attempt.
ATTEMPT_OUTCOMES: tuple[str, ...] = (
    "done", "failed", "timeout", "lost", "cancelled", "slot_lost", "snoozed", "suspended",
    "handed_back", "unknown_job",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProgressRecord:
    """A run's last ``ctx.progress(done, total, message)`` and when it reached the database."""

    done: float
    total: float | None
    message: str | None
    at: datetime

    def eta(self, started_at: datetime | None) -> datetime | None:
        """When the run will be done at its pace since ``started_at``: None without a total,
        without progress yet, or without a start."""
        if self.total is None or started_at is None or self.done <= 0:
            return None
        elapsed = (self.at - started_at).total_seconds()
        if elapsed <= 0:
            return None
        left = max(self.total - self.done, 0) * elapsed / self.done
        return self.at + timedelta(seconds=left)

    @property
    def fraction(self) -> float | None:
        """Done as a share of the total, 0 to 1; None without a total."""
        if not self.total:
            return None
        return min(max(self.done / self.total, 0.0), 1.0)


def _parse_moment(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) else None


def attempt_history(entries: Any, *, state: str, attempt: int, worker: str | None,
                    started_at: datetime | None,
                    finished_at: datetime | None) -> list[AttemptRecord]:
    """A job's attempt history: the ``attempts`` column (a JSON list of entries; entries that
    are not objects, from a hand-edited row, are skipped rather than failing the read) and, for
    a ``done`` job, the run that finished it, which the row itself records (its attempt,
    ``claimed_by``, ``started_at``, ``finished_at``): the acknowledgement writes no entry of
    its own, the hot path's cheapest form (docs/observability.md, "Attempt history")."""
    history = _entries(entries)
    if state == "done":
        history.append(AttemptRecord(attempt=attempt, worker=worker, started_at=started_at,
                                     finished_at=finished_at, outcome="done"))
    # xjobs_attempt_push keeps the first entry and the newest 20: a full list may have a gap.
    complete = len(history) - (state == "done") < ATTEMPTS_KEPT
    return [replace(a, run=n if complete or n == 1 else None)
            for n, a in enumerate(history, start=1)]


# The entries the attempt history keeps: the first and the newest 20 (xjobs_attempt_push).
ATTEMPTS_KEPT = 21


def _entries(entries: Any) -> list[AttemptRecord]:
    if not isinstance(entries, list):
        return []
    return [
        AttemptRecord(
            attempt=int(e.get("attempt") or 0), worker=e.get("worker"),
            started_at=_parse_moment(e.get("started_at")),
            finished_at=_parse_moment(e.get("finished_at")),
            outcome=str(e.get("outcome") or "?"), error=e.get("error"),
        )
        for e in entries if isinstance(e, dict)
    ]


def progress_from_json(value: Any) -> ProgressRecord | None:
    """The ``progress`` column as a record (None when the run never reported any)."""
    at = _parse_moment(value.get("at")) if isinstance(value, dict) else None
    if not isinstance(value, dict) or at is None:
        return None
    total = value.get("total")
    return ProgressRecord(done=float(value.get("done") or 0),
                          total=float(total) if total is not None else None,
                          message=value.get("message"), at=at)


class _BlocksLazily:
    """The ``blocked_by`` of a :class:`JobRecord`: read on first access, then kept.

    A slot of this plain base class, not a dataclass field: it is not part of the record's
    value (equality, ``dataclasses.fields``, JSON output), and reading a job
    (``get_job``, polled by ``JobHandle.wait()``) costs no statement more for it.
    """

    __slots__ = ("_blocked_by",)
    _blocked_by: tuple[BlockedBy, ...]

    @property
    def blocked_by(self) -> tuple[BlockedBy, ...]:
        """Every reason the job is not running now, most binding first (docs/flow-control.md,
        "Why is a job not running?"); empty for a running, finished or claimable job. Read on
        first access, on the database's state at that moment."""
        try:
            return self._blocked_by
        except AttributeError:
            pass
        record: JobRecord = self  # type: ignore[assignment]
        if record.state not in WAITING_STATES:
            value: tuple[BlockedBy, ...] = ()
        elif blocked_by_reader is None:
            raise RuntimeError("blocked_by needs django_xjobs.why, which `import django_xjobs` "
                               "loads; import the package before reading it")
        else:
            value = blocked_by_reader(record)
        object.__setattr__(self, "_blocked_by", value)
        return value


@dataclass(frozen=True, slots=True, kw_only=True)
class JobRecord(_BlocksLazily):
    """A whole ``x_jobs`` row, for inspection (CLI, admin actions, handles).

    ``input_error`` / ``result_error``: why Python's ``json`` module could not decode the stored
    input / result (valid ``jsonb`` it refuses: an integer past ``sys.get_int_max_str_digits()``
    digits, nesting deeper than its recursion limit). ``input`` is then ``{}`` and ``result``
    ``None``; the console and ``manage.py xjobs show`` print the stored text
    (docs/console.md, "Big and undecodable JSON").
    """

    id: UUID
    name: str
    queue: str
    input: dict[str, Any]  # the keyword arguments the function is called with
    idempotency_key: str  # the job's id when none was given
    run_id: UUID
    attempt: int
    max_attempts: int
    state: JobStateName
    run_at: datetime
    visible_at: datetime | None
    claimed_by: str | None
    last_error: str | None
    tenant_id: str | None
    traceparent: str | None
    enqueued_by: str | None
    created_at: datetime
    updated_at: datetime
    priority: int
    result: Any
    lease_token: UUID | None
    concurrency_key: str | None
    started_at: datetime | None
    finished_at: datetime | None
    rescues: int  # times a lapsed lease was taken over by another claim
    worker_ids: list[str] = field(default_factory=list)
    input_error: str | None = None
    result_error: str | None = None
    # Every run that ended, oldest first: the first and the newest 20 (docs/observability.md).
    attempts: list[AttemptRecord] = field(default_factory=list)
    progress: ProgressRecord | None = None
    # A child job's parent and the parent's step that waits for it (docs/durable.md).
    parent_id: UUID | None = None
    parent_step: str | None = None
    # The idempotency window it was enqueued with, in ms; -1 for "forever".
    unique_for_ms: int | None = None

    @property
    def is_live(self) -> bool:
        return self.state in LIVE_STATES

    @property
    def is_finished(self) -> bool:
        return self.state in TERMINAL_STATES
