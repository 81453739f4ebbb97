"""x_job_keys: idempotency windows (docs/durable.md, "Idempotency windows").

A windowed enqueue takes its key's row, then inserts its job (job_enqueue_windowed), in a
savepoint of its own that it rolls back when no job was inserted (the key held, or a live job of
the key enqueued without a window), so a losing enqueue keeps no lock on the key's row; one that
did not take it reads who holds it (job_key_holder). Maintenance deletes the rows whose window
ended (job_keys_purge_expired).
"""

from __future__ import annotations

from ...base import Statement
from .fragments import CHANNEL, ON_LIVE_KEY_CONFLICT, count_sql, insert_job_sql

JOB_ENQUEUE_WINDOWED = Statement(
    "job_enqueue_windowed",
    why="""
Enqueue one job with an idempotency window (`unique_for`): take the key's row in x_job_keys,
then insert the job only if the row was taken, in one statement.

The unique constraint on x_job_keys (name, tenant, key) decides every race, not a lock taken
before a check. The upsert takes the row when there is none, or when its holder finished
before the window: `finished_at <= now() - window`, where the window is the longer of the
holder's and this enqueue's, and a NULL window (forever) never ends. The condition reads the
key row's own columns and nothing else, on purpose: an enqueue that waits on the row lock of
another enqueue (or of the ack whose trigger, x_jobs_transition, writes finished_at) re-checks
the condition against the row's newest committed version once the lock is free, so it sees the
job the other one put there and does not take the key a second time. A subquery into x_jobs
would be read in the statement's snapshot, taken before the wait, and let a second job through.
A first enqueue of a key waits on the other transaction's index entry instead, and finds the row
(not taken) or, if that transaction rolled back, inserts its own.

The job's insert carries the live-key `on conflict do nothing` as job_enqueue does: a live job
of the key enqueued without a window still wins. `taken` and the inserted row tell the caller
which of the three cases it is in. Same counters and NOTIFY rule as job_enqueue.

The upsert's `on conflict do update ... where` locks the key's row even when its condition is
false, until the transaction ends (or its savepoint is rolled back). So the engine runs this
statement in a savepoint of its own when the caller is in a transaction, and rolls it back when
no job was inserted: a losing enqueue in a request that stays open holds no lock the holder's
acknowledgement (whose trigger writes this row) would wait for, and a row taken for a job that
was not inserted is given back by the same rollback.

Cost over job_enqueue: one more index lookup and row write in x_job_keys; the trigger adds one
update of that row when the job finishes.
""",
    sql=f"""
with claimed as (
    insert into x_job_keys as k (name, tenant, key, job_id, unique_for_ms)
    values (%(name)s, coalesce(%(tenant_id)s, ''), %(key)s::text, %(id)s::uuid,
            %(unique_for_ms)s::bigint)
    on conflict (name, tenant, key) do update
       set job_id = excluded.job_id, unique_for_ms = excluded.unique_for_ms,
           finished_at = null, created_at = now()
     where k.finished_at is not null
       and k.unique_for_ms is not null
       and %(unique_for_ms)s::bigint is not null
       and k.finished_at <= now() - greatest(k.unique_for_ms, %(unique_for_ms)s::bigint)
                                    * interval '1 millisecond'
    returning k.job_id
), inserted as (
{insert_job_sql("%(key)s::text", indent="    ", window="claimed")}
{ON_LIVE_KEY_CONFLICT}
    returning id, run_id, state, queue, name
), tallied as (
    {count_sql("inserted", enqueued="count(*)")}
)
select exists (select 1 from claimed), i.id, i.run_id, i.state,
       case when %(notify)s and i.state = 'ready' then pg_notify('{CHANNEL}', i.queue) end
  from (select 1) one
  left join inserted i on true
""",
)

JOB_KEY_HELD = Statement(
    "job_key_held",
    why="""
Read first, before job_enqueue_windowed: the key's row if its window still holds (the
negation of the upsert's condition), with its holder from `only x_jobs`. A duplicate, the
usual case for a windowed key, is answered by this read alone, and takes no lock: the upsert's
`on conflict do update ... where` locks the row even when its condition is false, until the
caller's transaction ends (a request under ATOMIC_REQUESTS), and the holder's acknowledgement,
whose trigger writes that row, would wait for it. The answer is right as of the read: the
window held then. A holder not in x_jobs itself (archived, or deleted by retention) comes back
without run id and state; the engine then reads it with job_key_holder.
""",
    sql="""
select k.job_id, j.run_id, j.state
  from x_job_keys k
  left join only x_jobs j on j.id = k.job_id
 where k.name = %(name)s and k.tenant = coalesce(%(tenant_id)s, '') and k.key = %(key)s::text
   and not (k.finished_at is not null
            and k.unique_for_ms is not null
            and %(unique_for_ms)s::bigint is not null
            and k.finished_at <= now() - greatest(k.unique_for_ms, %(unique_for_ms)s::bigint)
                                         * interval '1 millisecond')
""",
)

JOB_KEY_HOLDER = Statement(
    "job_key_holder",
    why="""
The job that holds a window's key, read after job_enqueue_windowed did not take it: a statement
of its own, so it reads a snapshot taken after the upsert's wait and sees the job the winner
committed. The job is looked up in x_jobs with its history tables (no `only`): a holder that
finished may have been archived. It may also have been deleted by retention; the row then comes
back with the id alone, and the caller still answers with it. No row at all: the key's row was
deleted meanwhile (its window ended, or the enqueue that took it gave it back), and the caller
tries to take it again.
""",
    sql="""
select k.job_id, j.run_id, j.state
  from x_job_keys k
  left join x_jobs j on j.id = k.job_id
 where k.name = %(name)s and k.tenant = coalesce(%(tenant_id)s, '') and k.key = %(key)s::text
""",
)

JOB_KEYS_PURGE_EXPIRED = Statement(
    "job_keys_purge_expired",
    why="""
Maintenance: delete the x_job_keys rows whose window ended (their holder finished more than its
own window ago), one bounded batch per call. Rows of a live holder (finished_at NULL) and of a
"forever" window (unique_for_ms NULL) are never deleted. The partial index on finished_at over
rows with a window gives them oldest first. SKIP LOCKED: a row an enqueue is taking is skipped,
never waited for; an enqueue blocked on a row deleted here inserts a fresh one, which is what
it would have done to the expired row anyway. The delete reaches its rows through an array of
ids, so no plan can hash-join the whole table to the batch (as jobs_purge does). A row whose
window is longer than its age is read and passed over by each batch: a cost in rows of long
windows, never a wrong delete.
""",
    sql="""
delete from x_job_keys
 where id = any(array(select id from x_job_keys
                       where unique_for_ms is not null
                         and finished_at < now() - unique_for_ms * interval '1 millisecond'
                       order by finished_at
                       limit %(batch)s
                         for update skip locked))
""",
)
