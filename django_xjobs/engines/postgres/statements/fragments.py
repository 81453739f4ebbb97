"""SQL written once and composed into the statements of several families.

Only text lives here, never a Statement: the channel every job NOTIFY names, the live states,
the column list of a whole job row, and the insert the enqueue statements share.
"""

from __future__ import annotations

import textwrap

# The channel of enqueue wake-ups: every job NOTIFY names it (its payload is the queue), and a
# worker's listener LISTENs on it. The outbox has a channel of its own (outbox.OUTBOX_CHANNEL).
CHANNEL = "xjobs"

LIVE = "('ready', 'delayed', 'running', 'suspended', 'blocked')"

# Column list of a whole job row, decoded by engine._job_record in this order.
JOB_COLUMNS = (
    "id, name, queue, input, idempotency_key, run_id, attempt, max_attempts, state, run_at,"
    " visible_at, claimed_by, last_error, tenant_id, traceparent, enqueued_by, created_at,"
    " updated_at, priority, result, lease_token, concurrency_key, started_at, finished_at,"
    " rescues, worker_ids"
)

# ---------------------------------------------------------------------------------- enqueue --
# job_enqueue and jobs_enqueue (jobs.py) say why these are written as they are.

# The conflict target of a keyed enqueue: the partial unique index over the live states, with
# the tenant as coalesce(tenant_id, '') and without the rows keyed by their own id.
ON_LIVE_KEY_CONFLICT = f"""    on conflict (name, (coalesce(tenant_id, '')), idempotency_key)
       where state in {LIVE}
         and not (idempotency_key = id::text)
       do nothing"""


def insert_job_sql(key: str, *, indent: str = "") -> str:
    """The insert of one job (job_enqueue, job_enqueue_unkeyed): ``key`` is the SQL of its
    idempotency key, the caller's or the job's own id. The job is ``delayed`` while its run_at
    (the given time, or now() plus the delay) is in the future, else ``ready``."""
    return textwrap.indent(f"""insert into x_jobs
    (id, name, queue, input, idempotency_key, run_id, max_attempts, priority, state, run_at,
     tenant_id, traceparent, enqueued_by, concurrency_key, rate_key)
select %(id)s::uuid, %(name)s, %(queue)s, %(input)s::jsonb, {key},
       %(run_id)s::uuid, %(max_attempts)s::int, %(priority)s::int,
       case when t.run_at > now() then 'delayed' else 'ready' end, t.run_at,
       %(tenant_id)s, %(traceparent)s, %(enqueued_by)s, %(concurrency_key)s, %(rate_key)s
  from (select coalesce(%(run_at)s::timestamptz,
                        now() + %(delay_ms)s * interval '1 millisecond') as run_at) t""", indent)


def enqueue_batch_sql(key: str, on_conflict: str = "") -> str:
    """The text of jobs_enqueue (``key`` the item's, ``on_conflict`` the live-key target) and
    of jobs_enqueue_unkeyed (``key`` the job's own id, no conflict target)."""
    conflict = f"\n{on_conflict}" if on_conflict else ""
    return f"""
with rows as (
    select (m.e->>0)::uuid as id, m.e->>1 as name, m.e->>2 as queue, i.e as input,
           m.e->>3 as key, (m.e->>4)::uuid as run_id, (m.e->>5)::int as max_attempts,
           (m.e->>6)::int as priority, (m.e->>7)::timestamptz as run_at,
           (m.e->>8)::bigint as delay_ms, m.e->>9 as tenant_id, m.e->>10 as traceparent,
           m.e->>11 as enqueued_by, m.e->>12 as concurrency_key, m.e->>13 as rate_key
      from jsonb_array_elements(%(meta)s::jsonb) with ordinality as m(e, n)
      join jsonb_array_elements(%(inputs)s::jsonb) with ordinality as i(e, n) using (n)
), inserted as (
    insert into x_jobs
        (id, name, queue, input, idempotency_key, run_id, max_attempts, priority, state, run_at,
         tenant_id, traceparent, enqueued_by, concurrency_key, rate_key)
    select r.id, r.name, r.queue, r.input, {key}, r.run_id, r.max_attempts,
           r.priority, case when t.run_at > now() then 'delayed' else 'ready' end, t.run_at,
           r.tenant_id, r.traceparent, r.enqueued_by, r.concurrency_key, r.rate_key
      from rows r
      cross join lateral (
          select coalesce(r.run_at, now() + r.delay_ms * interval '1 millisecond') as run_at
      ) t{conflict}
    returning id, state, queue
), notified as (
    select pg_notify('{CHANNEL}', q.queue)
      from (select distinct queue from inserted where state = 'ready') q
     where %(notify)s
)
select id, state from inserted where (select count(*) from notified) >= 0
"""
