"""x_outbox: the transactional outbox and its relay (docs/transactional-enqueue.md).

x_outbox lives on the app's database alias, x_jobs on XJOBS["DATABASE"]; the two may be one
database or two. These statements run on whichever alias holds their table: the engine of that
alias runs them (jobs_find_by_ids, the relay's read of x_jobs, on the jobs' alias). The deletion
of relayed rows is in maintenance.py with the other retention deletes.
"""

from __future__ import annotations

from ...base import Statement

OUTBOX_CHANNEL = "xjobs_outbox"

OUTBOX_STAGE = Statement(
    "outbox_stage",
    why="""
Stage a job in the caller's transaction (enqueue_on_commit): a plain insert into x_outbox on the
caller's connection, so the row commits or rolls back with the caller's writes, savepoints
included. A job that is never committed is never seen by a relay: the relay reads committed
rows only. The row's id is the id the job will get, so a row relayed twice names one job.

The NOTIFY wakes relays on the outbox's own channel (never the job channel, whose payload is a
queue name workers filter on). It is transactional: delivered on commit only, never for a
rolled-back staging, and PostgreSQL folds the identical notifications of one transaction into
one, so staging a thousand jobs in one transaction wakes the relays once.
""",
    sql=f"""
with staged as (
    insert into x_outbox
        (id, job, queue, input, idempotency_key, max_attempts, run_at, delay_ms, priority,
         tenant_id, traceparent, enqueued_by, concurrency_key, rate_key, unique_for_ms)
    values (%(id)s::uuid, %(name)s, %(queue)s, %(input)s::jsonb, %(key)s::text,
            %(max_attempts)s::int, %(run_at)s::timestamptz, %(delay_ms)s::bigint,
            %(priority)s::int, %(tenant_id)s, %(traceparent)s, %(enqueued_by)s,
            %(concurrency_key)s, %(rate_key)s, %(unique_for_ms)s::bigint)
    returning id
)
select id, case when %(notify)s then pg_notify('{OUTBOX_CHANNEL}', '') end from staged
""",
)

OUTBOX_CLAIM = Statement(
    "outbox_claim",
    why="""
Take a batch of staged rows for relaying. FOR UPDATE SKIP LOCKED: two relays never take the
same row (the second skips what the first holds) and never wait on each other; the lock lasts
until the relay's transaction on this database ends, which is after it marked the rows
published (tests/acceptance/test_outbox_relay.py runs two relay processes over 1,000 rows).
`published_at is null` is the whole notion of "pending" and the partial index on staged_at
serves it, so the claim stays an index scan however much published history the outbox keeps.

A delay counts from the staging: the row's due time is resolved here (run_at, or staged_at +
delay) so that a relay that comes late does not postpone the job by its lateness. `input` is
read as text: it goes back to the database as the job's input without being decoded.
""",
    sql="""
select id, job, queue, input::text, idempotency_key, max_attempts,
       coalesce(run_at, case when delay_ms > 0
                             then staged_at + delay_ms * interval '1 millisecond' end),
       priority, tenant_id, traceparent, enqueued_by, concurrency_key, rate_key, unique_for_ms
  from x_outbox
 where published_at is null
 order by staged_at
 limit %(batch)s
   for update skip locked
""",
)

OUTBOX_MARK_PUBLISHED = Statement(
    "outbox_mark_published",
    why="""
Mark relayed rows published, with the job each one became, in one statement per batch. It runs
in the transaction that claimed them (their row locks are held), so no other relay can have
published them meanwhile; `published_at is null` still guards it, so a row is never published
twice and its first job_id is never overwritten. When x_outbox and x_jobs share a database this
is the same transaction as the jobs' insert: the job and the mark commit together or not at all.
""",
    sql="""
update x_outbox o
   set published_at = now(), job_id = v.job_id
  from unnest(%(ids)s::uuid[], %(job_ids)s::uuid[]) as v(id, job_id)
 where o.id = v.id and o.published_at is null
""",
)

OUTBOX_STATUS = Statement(
    "outbox_status",
    why="""
One staged row by id: still pending, or published and the job it became (a StagedJob handle
asks; the job's id differs from the row's only when an idempotency key named a live job).
""",
    sql="""
select id, job, staged_at, published_at, job_id, input
  from x_outbox
 where id = %(id)s::uuid
""",
)

JOBS_FIND_BY_IDS = Statement(
    "jobs_find_by_ids",
    why="""
The jobs that exist among these ids, in any state. The relay asks before it publishes a batch
into a jobs database other than the outbox's: a relay that committed the jobs and then died
before its mark committed on the outbox's database leaves rows pending whose jobs exist
already (their id is the row's id), and this read is what keeps the second relay from making
them again, finished or not. Primary-key lookups only.
""",
    sql="""
select id, run_id, state
  from x_jobs
 where id = any(%(ids)s::uuid[])
""",
)

OUTBOX_LISTEN = Statement(
    "outbox_listen",
    why="""
Subscribe a relay's dedicated connection to staging wake-ups. Like the job channel's NOTIFY, a
hint only: the relay polls as well, and wakes once after every reconnect, because what was
staged while it was away was never announced to it.
""",
    sql=f"listen {OUTBOX_CHANNEL}",
)

OUTBOX_PENDING = Statement(
    "outbox_pending",
    why="""
Staged outbox rows not relayed yet and the age of the oldest: a growing age means no relay is
running. Reads the partial index on unpublished rows, so it stays cheap however much history
the outbox keeps. Under a tenant scope only those tenants' rows are counted.
""",
    sql="""
select count(*), extract(epoch from now() - min(staged_at))::float8
  from x_outbox
 where published_at is null
   and (%(tenant_ids)s::text[] is null or tenant_id = any(%(tenant_ids)s::text[]))
""",
)
