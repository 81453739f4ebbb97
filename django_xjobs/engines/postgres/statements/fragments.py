"""SQL written once and composed into the statements of several families.

Only text lives here, never a Statement: the channel every job NOTIFY names, the live states,
and the column list of a whole job row.
"""

from __future__ import annotations

CHANNEL = "xjobs"

LIVE = "('ready', 'delayed', 'running', 'suspended')"

# Column list of a whole job row, decoded by engine._job_record in this order.
JOB_COLUMNS = (
    "id, name, queue, input, idempotency_key, run_id, attempt, max_attempts, state, run_at,"
    " visible_at, claimed_by, last_error, tenant_id, traceparent, enqueued_by, created_at,"
    " updated_at, priority, result, lease_token, concurrency_key, started_at, finished_at,"
    " rescues, worker_ids"
)
