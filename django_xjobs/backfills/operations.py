"""What an operator does to passes: start, list, show, cancel, retry; and how far one is.

``manage.py xjobs_backfill`` is these functions and their output. An action that writes both a
pass's job and its row does so in one transaction, the job's row first: the lock order of every
batch (docs/design.md, "Lock order"). The states they move a pass between are drawn in
:mod:`.passes`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from .. import api, registry
from ..engines import get_engine
from ..exceptions import BackfillNotFound, InvalidJobInput, InvalidTransition, LiveJobExists
from ..records import BACKFILL_STATUSES, LIVE_STATES, BackfillRecord
from .definition import PassHandle, check_alias, count_total
from .registry import get, lookup


@dataclass(frozen=True, slots=True, kw_only=True)
class PassChange:
    """An operator action on a pass: the row after it, and whether this call changed it."""

    record: BackfillRecord
    changed: bool
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Progress:
    """How far a pass is: rates are the average since the pass began (pauses included)."""

    rows_processed: int
    total: int | None = None
    total_error: str | None = None
    fraction: float | None = None
    elapsed: float | None = None  # seconds from started_at to the last progress (or the end)
    rate: float | None = None  # rows per second
    eta: float | None = None  # seconds left at that rate, for a running pass with a total
    eta_at: datetime | None = None


class _RollBack(Exception):
    """Undo an operator action that lost a race."""


def _run_id(value: Any) -> str:
    try:
        return str(value if isinstance(value, UUID) else UUID(str(value)))
    except ValueError:
        raise InvalidJobInput(f"run id {value!r} is not a UUID") from None


def start(name: str, *, batch_size: int | None = None,
          throttle: timedelta | float | str | None = None) -> PassHandle:
    """Start a pass of ``name``: its job is enqueued and its row recorded ``pending``, in one
    transaction. One live pass per backfill: while one is live, this returns it
    (``created=False``) and changes nothing. Bad options raise before anything is written."""
    return get(name).start(batch_size=batch_size, throttle=throttle)


def list_passes(*, name: str | None = None, status: str | None = None,
                run_id: Any = None, limit: int = 50) -> list[BackfillRecord]:
    if status is not None and status not in BACKFILL_STATUSES:
        raise InvalidJobInput(
            f"status {status!r} is not a pass status ({', '.join(BACKFILL_STATUSES)})"
        )
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidJobInput(f"limit must be a positive integer, got {limit!r}")
    return get_engine().backfills_list(
        name=name, status=status, run_id=None if run_id is None else _run_id(run_id),
        limit=limit,
    )


def get_pass(run_id: Any) -> BackfillRecord:
    record = get_engine().backfill_get(_run_id(run_id))
    if record is None:
        raise BackfillNotFound(f"no backfill pass with run id {run_id}")
    return record


def cancel(run_id: Any) -> PassChange:
    """Stop a pass: its job is cancelled (a running pass stops at its next batch boundary; the
    batch in flight, if any, rolls back) and its row marked ``cancelled``, in one transaction.
    Its cursor is kept: :func:`retry` resumes it."""
    record = get_pass(run_id)
    if record.status in ("completed", "cancelled"):
        return PassChange(record=record, changed=False, reason=f"already {record.status}")
    engine = get_engine()
    try:
        with engine.atomic():
            # The job first: the same lock order as every batch (x_jobs, then x_backfills).
            if record.job_id is not None:
                engine.job_cancel(str(record.job_id), reason="cancelled: backfill pass cancelled")
            cancelled = engine.backfill_cancel(str(record.run_id))
            if cancelled is None:
                raise _RollBack  # it completed meanwhile: leave its job alone too
    except _RollBack:
        current = get_pass(run_id)
        return PassChange(record=current, changed=False, reason=f"already {current.status}")
    return PassChange(record=get_pass(run_id), changed=True)


def retry(run_id: Any) -> PassHandle:
    """Resume a pass from its cursor: its job is retried (same run id, a fresh set of
    attempts), or, if retention purged the job, enqueued again under the same run id.

    For a ``failed`` or ``cancelled`` pass, and for a ``running`` or ``pending`` one whose job
    is no longer live (cancelled with ``xjobs cancel``, or dead after too many lost leases: the
    pass had no chance to record it). Raises :class:`InvalidTransition` for a completed pass, or
    one whose job is still live (it goes on by itself)."""
    record = get_pass(run_id)
    if record.status == "completed":
        raise InvalidTransition(
            f"pass {record.run_id} of {record.name} is completed: there is nothing to resume"
        )
    if record.job_state in LIVE_STATES:
        raise InvalidTransition(
            f"pass {record.run_id} of {record.name} is {record.status} and its job "
            f"{record.job_id} is {record.job_state}: it goes on by itself (manage.py xjobs "
            f"run-now {record.job_id} brings a delayed retry forward)"
        )
    if record.job_state == "done":
        raise InvalidTransition(
            f"pass {record.run_id} of {record.name} is {record.status} but its job "
            f"{record.job_id} is done; start a new pass"
        )
    definition = get(record.name)
    check_alias(definition)
    if record.job_state in ("dead", "cancelled"):
        result = api.retry(str(record.job_id))
        job = result.job
        assert job is not None  # api.retry raises JobNotFound rather than return no job
        return PassHandle(name=record.name, run_id=record.run_id, job_id=job.id,
                          created=bool(result.changed))
    # The job is gone (purged by retention): a new job under the same run id adopts the row.
    job_definition = registry.get(definition.job_name)
    params = api.build_params(job_definition, {}, {"idempotency_key": definition.job_name})
    params = dataclasses.replace(params, run_id=record.run_id)
    enqueued = get_engine().job_enqueue(params)
    if not enqueued.created:
        raise LiveJobExists(
            f"pass {record.run_id} was not resumed: another pass of {record.name} is live "
            f"(job {enqueued.id})", live_job_id=str(enqueued.id),
        )
    return PassHandle(name=record.name, run_id=record.run_id, job_id=enqueued.id, created=True)


def progress(record: BackfillRecord, *, now: datetime | None = None) -> Progress:
    """Rate since the pass began; with the backfill's ``total`` hook, a fraction and an ETA."""
    definition = lookup(record.name)
    total, total_error = count_total(definition) if definition is not None else (None, None)
    fraction = None
    if total is not None:
        fraction = 1.0 if total == 0 else min(record.rows_processed / total, 1.0)
    if record.status == "pending":
        return Progress(rows_processed=record.rows_processed, total=total,
                        total_error=total_error, fraction=fraction)
    now = now or get_engine().db_now()
    until = record.completed_at or record.updated_at or now
    elapsed = max((until - record.started_at).total_seconds(), 0.0)
    rate = record.rows_processed / elapsed if elapsed > 0 and record.rows_processed else None
    eta = eta_at = None
    if record.status == "running" and total is not None and rate:
        eta = max(total - record.rows_processed, 0) / rate
        if math.isfinite(eta):
            eta_at = now + timedelta(seconds=eta)
    return Progress(rows_processed=record.rows_processed, total=total, total_error=total_error,
                    fraction=fraction, elapsed=elapsed, rate=rate, eta=eta, eta_at=eta_at)
