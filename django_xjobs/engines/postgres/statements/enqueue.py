"""x_jobs: enqueue, one job and many, keyed and unkeyed, by COPY, and the read of the live job
behind a key's conflict (docs/design.md, "Enqueue").

The enqueue of a windowed key is in windows.py, a debounced one's in debounce.py.
"""

from __future__ import annotations

from ...base import Statement
from .fragments import (
    CHANNEL,
    LIVE,
    ON_LIVE_KEY_CONFLICT,
    count_sql,
    enqueue_batch_sql,
    enqueue_one_sql,
)

JOB_ENQUEUE = Statement(
    "job_enqueue",
    why="""
Insert one job; `delayed` when its run_at is in the future, else `ready`.

`on conflict ... do nothing` against the partial unique index over LIVE states is the whole
idempotency story: one live job per (name, tenant, key), while finished rows stay as history so
the same work can run again tomorrow. No check-then-insert and no advisory lock: a concurrent
inserter of the same key waits on the index entry of the other transaction and, if that one
rolls back, inserts its own (tests/conformance/test_enqueue.py). The tenant is in the index as
`coalesce(tenant_id, '')` so one tenant can neither block nor detect another's key, and a NULL
tenant is one tenant rather than a wildcard.

A caller that gives no key gets the job's own id as key, through the plain insert of the
unkeyed statement: such a row can never conflict, and the live-key index leaves it out.

The NOTIFY names the queue and nothing else, is sent only for a job due now, and is
transactional: delivered on commit, and PostgreSQL folds identical notifications of one
transaction into one, so an enqueue loop in one transaction wakes workers once.
""",
    sql=enqueue_one_sql("%(key)s::text", ON_LIVE_KEY_CONFLICT),
)

JOB_ENQUEUE_UNKEYED = Statement(
    "job_enqueue_unkeyed",
    why="""
job_enqueue for a job given no idempotency key: its key is its own id, which no other row can
hold, so it is a plain INSERT. No `on conflict`: the speculative insertion it needs would cost
every enqueue server time for a conflict that cannot happen (docs/performance.md, "What the
simpler forms cost"); the live-key index leaves
these rows out (`not (idempotency_key = id::text)`), so their claims and acks do not maintain it
either. Same NOTIFY rule as job_enqueue.
""",
    sql=enqueue_one_sql("%(id)s::uuid::text"),
)

JOBS_ENQUEUE = Statement(
    "jobs_enqueue",
    why="""
The batch form of job_enqueue for items that carry an idempotency key: one statement for the
whole batch, the same `on conflict do nothing` against the live-key index, so idempotency holds
inside the batch too (a second item with the same key is skipped, and find-live-by-keys names
the first one).

At most one NOTIFY per queue per batch, never one per job: the `notified` CTE is read by the
final select only to force it to run.

The batch arrives as two JSON arrays, the rows' other columns (in the order unpacked below) and
their inputs, zipped by position: the client makes one json.dumps call and one string join
instead of fourteen parameter arrays dumped element by element, which cost more than the insert
itself at a thousand rows.
""",
    sql=enqueue_batch_sql("r.key", ON_LIVE_KEY_CONFLICT),
)

JOBS_ENQUEUE_UNKEYED = Statement(
    "jobs_enqueue_unkeyed",
    why="""
jobs_enqueue for items without a key (each keyed by its own id): a plain insert, for the reason
given at job_enqueue_unkeyed. Same batch format and NOTIFY rule as jobs_enqueue.
""",
    sql=enqueue_batch_sql("r.id::text"),
)

JOBS_ENQUEUE_CHILDREN = Statement(
    "jobs_enqueue_children",
    why="""
The children of a parent's invoke or gather step (docs/durable.md, "Child jobs"), in the
parent's transaction that opens the step and suspends the parent: the children exist if and
only if that transaction commits, so a crash between the enqueue and the step's record leaves
neither, and the next run makes them once. Each row names its parent and the parent's step:
the x_jobs_transition trigger reads them when the child finishes, to wake the parent. Keyed by
their own ids (a child is deduplicated by its parent's step, not by a key); same batch format
and NOTIFY rule as jobs_enqueue.
""",
    sql=enqueue_batch_sql("r.id::text", children=True),
)

JOBS_COPY = Statement(
    "jobs_copy",
    why="""
The fast path of a bulk enqueue: jobs without an idempotency key that are due now. They can
never conflict (their key is their own id, left out of the live-key index), need no `on
conflict`, and take every other column's default (state ready, run_at now()); so COPY, cheaper
on the server than INSERT ... SELECT (docs/performance.md, "What the simpler forms cost"). It
is followed, in the
same transaction, by jobs_notify_queues: COPY cannot send the NOTIFY itself.
""",
    sql="""
copy x_jobs (id, name, queue, input, idempotency_key, run_id, max_attempts, priority,
             tenant_id, traceparent, enqueued_by, concurrency_key, rate_key)
from stdin
""",
)

JOBS_NOTIFY_QUEUES = Statement(
    "jobs_notify_queues",
    why="""
What COPY cannot do for the jobs a jobs_copy just added, in the same transaction: count them
(the counters' deltas, per queue and job name) and send one NOTIFY per queue (delivered on
commit, like the enqueue statements' own NOTIFY).
""",
    sql=f"""
with added as (
    select queue, name, n
      from unnest(%(queues)s::text[], %(names)s::text[], %(counts)s::int[]) as c(queue, name, n)
), tallied as (
    {count_sql("added", enqueued="sum(n)::int")}
)
select count(pg_notify('{CHANNEL}', q.queue))
  from (select distinct queue from added) q
 where %(notify)s
""",
)

JOB_FIND_LIVE_BY_KEY = Statement(
    "job_find_live_by_key",
    why="""
The live job holding (name, tenant, key), read after job_enqueue met a conflict. Scoped exactly
as the unique index is, name and tenant included: a lookup by key alone would find a stranger's
job. It can find nothing when the live job finished between the conflict
and this read; the caller then inserts again.

The filters repeat the unique index's whole predicate, `not (idempotency_key = id::text)`
included: a conflicting row is always in that index, and without the last filter the planner
cannot prove the query matches the partial index and scans the table (docs/performance.md,
"What the simpler forms cost").
""",
    sql=f"""
select id, run_id, state
  from only x_jobs
 where name = %(name)s
   and coalesce(tenant_id, '') = coalesce(%(tenant_id)s, '')
   and idempotency_key = %(key)s
   and state in {LIVE}
   and not (idempotency_key = id::text)
 limit 1
""",
)

JOBS_FIND_LIVE_BY_KEYS = Statement(
    "jobs_find_live_by_keys",
    why="""
job_find_live_by_key for the items of a batch that were not inserted, in one statement. The join
is on the same (name, coalesce(tenant_id, ''), key) expression as the unique index, and the
filters repeat its whole predicate, which is what lets it use that index (job_find_live_by_key).
""",
    sql=f"""
select k.ord, j.id, j.run_id, j.state
  from unnest(%(names)s::text[], %(tenant_ids)s::text[], %(keys)s::text[])
       with ordinality as k(name, tenant_id, key, ord)
  join only x_jobs j
    on j.name = k.name
   and coalesce(j.tenant_id, '') = coalesce(k.tenant_id, '')
   and j.idempotency_key = k.key
   and j.state in {LIVE}
   and not (j.idempotency_key = j.id::text)
""",
)
