"""Rows as records: the decoding of the rows the statements return, shared by the families of
operations (operations/). A row's columns come in the order its statement lists them."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from ...exceptions import UndecodableValue, fail_for_good
from ...records import (
    BackfillRecord,
    ClaimedJob,
    ClaimScans,
    Counters,
    DueScan,
    JobRecord,
    PauseRecord,
    SlotHold,
    SlotRelease,
    attempt_history,
    decode_stored_json,
    progress_from_json,
)
from ...values import decode_json as decode_typed_json


def decode_json(value: Any) -> Any:
    # Django registers a jsonb loader that returns the text (JSONField decodes it itself), so
    # jsonb arrives here as str on Django's connections; its typed values come back as Python's
    # (values.decode_json).
    if isinstance(value, str):
        return decode_typed_json(value)
    return value


def try_decode_json(value: Any) -> tuple[Any, str | None]:
    """:func:`records.decode_stored_json` for a column psycopg may already have decoded, typed
    values as Python's."""
    if not isinstance(value, str):
        return value, None
    return decode_stored_json(value, decode_typed_json)


def decode_json_for_run(value: Any, what: str) -> Any:
    """A JSON column a run cannot go on without (a step's output, an event's payload), decoded;
    or, when Python cannot decode it, an error raised in the job that fails it for good and
    says which value, instead of a bare ValueError or RecursionError."""
    decoded, problem = try_decode_json(value)
    if problem is not None:
        raise fail_for_good(UndecodableValue(f"{what} cannot be decoded: {problem}"))
    return decoded


def job_record(row: Sequence[Any]) -> JobRecord:
    """A whole row; an input or result Python cannot decode is reported in ``input_error`` /
    ``result_error`` instead of failing the read (the action that returned the row is done)."""
    (id_, name, queue, input_, key, run_id, attempt, max_attempts, state, run_at, visible_at,
     claimed_by, last_error, tenant_id, traceparent, enqueued_by, created_at, updated_at,
     priority, result, lease_token, concurrency_key, started_at, finished_at, rescues,
     worker_ids, attempts, progress, parent_id, parent_step, unique_for_ms) = row[:31]
    decoded_input, input_error = try_decode_json(input_)
    decoded_result, result_error = try_decode_json(result)
    return JobRecord(
        id=id_, name=name, queue=queue, input={} if input_error else decoded_input,
        idempotency_key=key, run_id=run_id, attempt=attempt, max_attempts=max_attempts,
        state=state, run_at=run_at, visible_at=visible_at, claimed_by=claimed_by,
        last_error=last_error, tenant_id=tenant_id, traceparent=traceparent,
        enqueued_by=enqueued_by, created_at=created_at, updated_at=updated_at,
        priority=priority, result=decoded_result, lease_token=lease_token,
        concurrency_key=concurrency_key, started_at=started_at, finished_at=finished_at,
        rescues=rescues, worker_ids=list(decode_json(worker_ids) or []),
        input_error=input_error, result_error=result_error,
        attempts=attempt_history(decode_json(attempts), state=state, attempt=attempt,
                                 worker=claimed_by, started_at=started_at,
                                 finished_at=finished_at),
        progress=progress_from_json(decode_json(progress)),
        parent_id=parent_id, parent_step=parent_step, unique_for_ms=unique_for_ms,
    )


def claimed_job(r: Sequence[Any]) -> ClaimedJob:
    """A row of jobs_claim or job_claim_if_due (the same columns, in this order).

    Each row is decoded on its own: an input Python cannot decode becomes ``input_error`` on
    that job alone (the worker buries it), never an error that loses the whole claimed batch.
    """
    decoded, problem = try_decode_json(r[4])
    return ClaimedJob(
        id=r[0], lease_token=r[1], name=r[2], queue=r[3], input=decoded, run_id=r[5],
        attempt=r[6], max_attempts=r[7], tenant_id=r[8], traceparent=r[9],
        concurrency_key=r[10], resumed=r[11], input_error=problem,
        slot=r[12] if len(r) > 12 else None, slot_limit=r[13] if len(r) > 13 else None,
        parent_id=r[17] if len(r) > 17 else None,
    )


def slot_release(holds: Sequence[SlotHold], rows: Iterable[Sequence[Any]]) -> SlotRelease:
    """What a release did, from its answer (slots_release_if_held's rows, in jobs_claim's
    columns: one without a job, then one per job handed over) for ``holds``, the holds it
    was sent."""
    released, woken, busy, started = 0, 0, set(), []
    for r in rows:
        if r[0] is None:
            released, busy, woken = int(r[14]), set(r[16] or ()), int(r[18])
        else:
            started.append(claimed_job(r))
    return SlotRelease(released=released, woken=woken, started=started,
                       busy=[h for h in holds if h.holder in busy])


def claim_scans(text: str) -> ClaimScans:
    """The summary row's account of what jobs_claim's scans found (its SCANS column)."""
    raw = json.loads(text)
    return ClaimScans(
        queues=frozenset(raw["queues"]), lapsed=raw["lapsed"], taken=raw["taken"],
        due=tuple(DueScan(queue=q, priority=p, found=n, last=datetime.fromisoformat(last),
                          keyed=keyed) for q, p, n, last, keyed in raw["due"]))


def counters(queue: str, name: str | None, at: datetime | None,
              figures: Sequence[Any]) -> Counters:
    """A row of stats_series / stats_totals: the six counts, the two sums, the two histograms."""
    (enqueued, started, done, failed, dead, cancelled, wait_sum, run_sum, wait_hist,
     run_hist) = figures
    return Counters(queue=queue, name=name, at=at, enqueued=enqueued or 0,
                    started=started or 0, done=done or 0, failed=failed or 0, dead=dead or 0,
                    cancelled=cancelled or 0, wait_ms_sum=wait_sum or 0,
                    run_ms_sum=run_sum or 0, wait_hist=tuple(wait_hist or ()),
                    run_hist=tuple(run_hist or ()))


def pause_record(row: Sequence[Any]) -> PauseRecord:
    kind, key, until, reason, paused_at = row[:5]
    return PauseRecord(kind=kind, key=key, until=until, reason=reason, paused_at=paused_at,
                       blocked=int(row[5]) if len(row) > 5 else 0)


def backfill_record(row: Sequence[Any]) -> BackfillRecord:
    """A row in the order of BACKFILL_COLUMNS (statements/backfills.py), maybe followed by
    job state, attempt."""
    (run_id, name, status, rows_processed, last_cursor, checksum, app_version, started_at,
     completed_at, updated_at, error, job_id, code_changes) = row[:13]
    job_state, job_attempt = (row[13], row[14]) if len(row) > 13 else (None, None)
    return BackfillRecord(
        run_id=run_id, name=name, status=status, rows_processed=int(rows_processed),
        last_cursor=decode_json(last_cursor), checksum=checksum, app_version=app_version,
        started_at=started_at, completed_at=completed_at, updated_at=updated_at, error=error,
        job_id=job_id, code_changes=list(decode_json(code_changes) or []),
        job_state=job_state, job_attempt=job_attempt,
    )
