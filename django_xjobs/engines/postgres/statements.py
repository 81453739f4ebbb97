"""THE WIRE FORMAT: every statement the PostgreSQL engine runs, as a named constant.

Rules of this module:

* Nothing else in django-xjobs writes queue SQL. The engine runs these by name, logs the name,
  and ``manage.py xjobs_sql NAME`` prints the text (as a ``PREPARE`` an operator can paste into
  psql).
* Each statement's ``why`` says why its filters exist: most of them guard against a real
  failure (a lost update, a double fire, a stranger's row) that a looser filter allows.
* Parameters are ``%(name)s`` placeholders bound by psycopg, never formatted into the text.
* Time is the database's: every lease and due-time comparison uses ``now()``, so a worker with
  a wrong clock cannot stretch or shrink a lease.

Fencing (docs/guarantees.md): a claim writes a fresh ``lease_token`` (``gen_random_uuid()``, never
reused); every write a worker makes about a run carries ``id``, ``state = 'running'`` AND that
token. ``state = 'running'`` alone, a fence on the state only, also matches the row after
another worker re-claimed a lapsed lease. A finished row keeps the token of the run that
finished it, so a write retried after an ambiguous commit is recognised by
:data:`JOBS_FENCE_CHECK` as already applied.
An outside actor that ends a run (cancel, the claim that buries a lapsed job) clears the token:
that run did not finish the job, and its late writes must read as lost.
"""

from __future__ import annotations

from ..base import Statement

CHANNEL = "xjobs"

LIVE = "('ready', 'delayed', 'running', 'suspended')"

# Column list of a whole job row, decoded by engine._job_record in this order.
JOB_COLUMNS = (
    "id, name, queue, input, idempotency_key, run_id, attempt, max_attempts, state, run_at,"
    " visible_at, claimed_by, last_error, tenant_id, traceparent, enqueued_by, created_at,"
    " updated_at, priority, result, lease_token, concurrency_key, started_at, finished_at,"
    " rescues, worker_ids"
)

# --------------------------------------------------------------------------------- enqueue --

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
    sql="""
with inserted as (
    insert into x_jobs
        (id, name, queue, input, idempotency_key, run_id, max_attempts, priority, state, run_at,
         tenant_id, traceparent, enqueued_by, concurrency_key)
    select %(id)s::uuid, %(name)s, %(queue)s, %(input)s::jsonb, %(key)s::text,
           %(run_id)s::uuid, %(max_attempts)s::int, %(priority)s::int,
           case when t.run_at > now() then 'delayed' else 'ready' end, t.run_at,
           %(tenant_id)s, %(traceparent)s, %(enqueued_by)s, %(concurrency_key)s
      from (select coalesce(%(run_at)s::timestamptz,
                            now() + %(delay_ms)s * interval '1 millisecond') as run_at) t
    on conflict (name, (coalesce(tenant_id, '')), idempotency_key)
       where state in ('ready', 'delayed', 'running', 'suspended')
         and not (idempotency_key = id::text)
       do nothing
    returning id, run_id, state, queue
)
select id, run_id, state,
       case when %(notify)s and state = 'ready' then pg_notify('xjobs', queue) end
  from inserted
""",
)

JOB_ENQUEUE_UNKEYED = Statement(
    "job_enqueue_unkeyed",
    why="""
job_enqueue for a job given no idempotency key: its key is its own id, which no other row can
hold, so it is a plain INSERT. No `on conflict`: the speculative insertion it needs costs every
enqueue a third of its server time, for a conflict that cannot happen; the live-key index leaves
these rows out (`not (idempotency_key = id::text)`), so their claims and acks do not maintain it
either. Same NOTIFY rule as job_enqueue.
""",
    sql="""
insert into x_jobs
    (id, name, queue, input, idempotency_key, run_id, max_attempts, priority, state, run_at,
     tenant_id, traceparent, enqueued_by, concurrency_key)
select %(id)s::uuid, %(name)s, %(queue)s, %(input)s::jsonb, %(id)s::uuid::text,
       %(run_id)s::uuid, %(max_attempts)s::int, %(priority)s::int,
       case when t.run_at > now() then 'delayed' else 'ready' end, t.run_at,
       %(tenant_id)s, %(traceparent)s, %(enqueued_by)s, %(concurrency_key)s
  from (select coalesce(%(run_at)s::timestamptz,
                        now() + %(delay_ms)s * interval '1 millisecond') as run_at) t
returning id, run_id, state,
          case when %(notify)s and state = 'ready' then pg_notify('xjobs', queue) end
""",
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
    sql="""
with rows as (
    select (m.e->>0)::uuid as id, m.e->>1 as name, m.e->>2 as queue, i.e as input,
           m.e->>3 as key, (m.e->>4)::uuid as run_id, (m.e->>5)::int as max_attempts,
           (m.e->>6)::int as priority, (m.e->>7)::timestamptz as run_at,
           (m.e->>8)::bigint as delay_ms, m.e->>9 as tenant_id, m.e->>10 as traceparent,
           m.e->>11 as enqueued_by, m.e->>12 as concurrency_key
      from jsonb_array_elements(%(meta)s::jsonb) with ordinality as m(e, n)
      join jsonb_array_elements(%(inputs)s::jsonb) with ordinality as i(e, n) using (n)
), inserted as (
    insert into x_jobs
        (id, name, queue, input, idempotency_key, run_id, max_attempts, priority, state, run_at,
         tenant_id, traceparent, enqueued_by, concurrency_key)
    select r.id, r.name, r.queue, r.input, r.key, r.run_id, r.max_attempts,
           r.priority, case when t.run_at > now() then 'delayed' else 'ready' end, t.run_at,
           r.tenant_id, r.traceparent, r.enqueued_by, r.concurrency_key
      from rows r
      cross join lateral (
          select coalesce(r.run_at, now() + r.delay_ms * interval '1 millisecond') as run_at
      ) t
    on conflict (name, (coalesce(tenant_id, '')), idempotency_key)
       where state in ('ready', 'delayed', 'running', 'suspended')
         and not (idempotency_key = id::text)
       do nothing
    returning id, state, queue
), notified as (
    select pg_notify('xjobs', q.queue)
      from (select distinct queue from inserted where state = 'ready') q
     where %(notify)s
)
select id, state from inserted where (select count(*) from notified) >= 0
""",
)

JOBS_ENQUEUE_UNKEYED = Statement(
    "jobs_enqueue_unkeyed",
    why="""
jobs_enqueue for items without a key (each keyed by its own id): a plain insert, for the reason
given at job_enqueue_unkeyed. Same batch format and NOTIFY rule as jobs_enqueue.
""",
    sql="""
with rows as (
    select (m.e->>0)::uuid as id, m.e->>1 as name, m.e->>2 as queue, i.e as input,
           m.e->>3 as key, (m.e->>4)::uuid as run_id, (m.e->>5)::int as max_attempts,
           (m.e->>6)::int as priority, (m.e->>7)::timestamptz as run_at,
           (m.e->>8)::bigint as delay_ms, m.e->>9 as tenant_id, m.e->>10 as traceparent,
           m.e->>11 as enqueued_by, m.e->>12 as concurrency_key
      from jsonb_array_elements(%(meta)s::jsonb) with ordinality as m(e, n)
      join jsonb_array_elements(%(inputs)s::jsonb) with ordinality as i(e, n) using (n)
), inserted as (
    insert into x_jobs
        (id, name, queue, input, idempotency_key, run_id, max_attempts, priority, state, run_at,
         tenant_id, traceparent, enqueued_by, concurrency_key)
    select r.id, r.name, r.queue, r.input, r.id::text, r.run_id, r.max_attempts,
           r.priority, case when t.run_at > now() then 'delayed' else 'ready' end, t.run_at,
           r.tenant_id, r.traceparent, r.enqueued_by, r.concurrency_key
      from rows r
      cross join lateral (
          select coalesce(r.run_at, now() + r.delay_ms * interval '1 millisecond') as run_at
      ) t
    returning id, state, queue
), notified as (
    select pg_notify('xjobs', q.queue)
      from (select distinct queue from inserted where state = 'ready') q
     where %(notify)s
)
select id, state from inserted where (select count(*) from notified) >= 0
""",
)

JOBS_COPY = Statement(
    "jobs_copy",
    why="""
The fast path of a bulk enqueue: jobs without an idempotency key that are due now. They can
never conflict (their key is their own id, left out of the live-key index), need no `on
conflict`, and take every other column's default (state ready, run_at now()); so COPY, which
halves the server time of a thousand-row batch against INSERT ... SELECT. It is followed, in the
same transaction, by jobs_notify_queues: COPY cannot send the NOTIFY itself.
""",
    sql="""
copy x_jobs (id, name, queue, input, idempotency_key, run_id, max_attempts, priority,
             tenant_id, traceparent, enqueued_by, concurrency_key)
from stdin
""",
)

JOBS_NOTIFY_QUEUES = Statement(
    "jobs_notify_queues",
    why="""
One NOTIFY per queue for the jobs a jobs_copy just added (delivered on commit, like the
enqueue statements' own NOTIFY).
""",
    sql="select count(pg_notify('xjobs', q)) from unnest(%(queues)s::text[]) as q",
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
cannot prove the query matches the partial index and scans the table (170 ms at 1M rows).
""",
    sql=f"""
select id, run_id, state
  from x_jobs
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
  join x_jobs j
    on j.name = k.name
   and coalesce(j.tenant_id, '') = coalesce(k.tenant_id, '')
   and j.idempotency_key = k.key
   and j.state in {LIVE}
   and not (j.idempotency_key = j.id::text)
""",
)

# ----------------------------------------------------------------------------------- claim --

JOBS_CLAIM = Statement(
    "jobs_claim",
    why="""
Lease up to n jobs per queue in one statement. SKIP LOCKED is the whole design: without it a
second worker blocks on the first one's row locks and throughput collapses to one worker
(tests/conformance/test_claim.py::test_a_row_locked_by_another_session_is_skipped).

Eligible: `ready`/`delayed`/`suspended` rows due now, or `running` rows whose lease lapsed
(`visible_at <= now()`: the worker died or stopped renewing). `done`, `dead` and `cancelled`
appear in no branch, so a finished or cancelled job is never handed out again. One lateral scan
per queue walks that queue's claim index in (priority desc, run_at) order, which a single
`queue = any(...)` scan cannot do.

Every claim writes a fresh lease_token: the fence for every later write of this run. `attempt`
counts claims, except a resume from `suspended` (waking from a durable sleep is not a new
attempt). A lapsed lease whose attempt was already the last one goes to `dead` instead of
running again: a job that kills its worker must not loop forever. Its token is cleared, so the
late writes of the run that lost it read as lost.

The claim commits asynchronously (`synchronous_commit` off for its own transaction only; the
claim never runs inside a caller's transaction). If PostgreSQL crashes before the claim's WAL
reaches disk, the claim never happened: the job is claimable again and the run that started
it is fenced out by its token. That is at-least-once execution, which a crash after a durable
claim gives as well; what it saves is a disk flush on every claim, the largest part of an idle
worker's enqueue-to-start latency.
""",
    sql="""
with async_commit as (
    select set_config('synchronous_commit', 'off', true)
), wants as (
    select * from unnest(%(queues)s::text[], %(limits)s::int[]) as w(queue, n)
), lapsed as (
    select c.id, c.prev_state, c.exhausted, w.queue
      from wants w
      cross join lateral (
          select id, state as prev_state, attempt >= max_attempts as exhausted
            from x_jobs
           where queue = w.queue and state = 'running' and visible_at <= now()
           order by visible_at
           limit w.n
             for update skip locked
      ) c
), due as (
    -- Lapsed leases take their places first (they have waited a whole lease already), and the
    -- due scan fills what is left of each queue's share, in claim order, so a rescue never
    -- lets an older low-priority job pass a higher-priority one (tests/conformance/test_claim.py).
    --
    -- One bounded run_at scan per distinct priority of the queue, highest first (the priorities
    -- found by a loose index scan: one index probe each). A single scan in (priority, run_at)
    -- order cannot stop at the first row not yet due, since a lower priority follows it: with
    -- 200,000 delayed jobs and none due, every idle poll read all of them (15 ms, 1,000 pages).
    select c.id, c.prev_state, false as exhausted, w.queue
      from (select w.queue,
                   greatest(w.n - (select count(*) from lapsed l where l.queue = w.queue), 0)
                     as share
              from wants w) w
      cross join lateral (
          select d.id, d.prev_state
            from (with recursive prio(p) as (
                      (select priority from x_jobs
                        where queue = w.queue and state in ('ready', 'delayed', 'suspended')
                        order by priority desc limit 1)
                      union all
                      select (select priority from x_jobs
                               where queue = w.queue
                                 and state in ('ready', 'delayed', 'suspended')
                                 and priority < prio.p
                               order by priority desc limit 1)
                        from prio where prio.p is not null)
                  select p from prio where p is not null order by p desc) pr
            cross join lateral (
                select id, state as prev_state
                  from x_jobs
                 where queue = w.queue and state in ('ready', 'delayed', 'suspended')
                   and priority = pr.p and run_at <= now()
                 order by run_at
                 limit w.share
                   for update skip locked
            ) d
           limit w.share
      ) c
), picked as (
    select id, prev_state, exhausted from lapsed
    union all
    select id, prev_state, exhausted from due
), claimed as (
    update x_jobs j
       set state       = case when p.exhausted then 'dead' else 'running' end,
           attempt     = case when p.exhausted or p.prev_state = 'suspended' then j.attempt
                              else j.attempt + 1 end,
           rescues     = j.rescues + (p.prev_state = 'running')::int,
           visible_at  = case when p.exhausted then null
                              else now() + %(lease_ms)s * interval '1 millisecond' end,
           lease_token = case when p.exhausted then null else gen_random_uuid() end,
           claimed_by  = case when p.exhausted then j.claimed_by else %(worker_id)s end,
           worker_ids  = case when p.exhausted or p.prev_state = 'suspended' then j.worker_ids
                              else j.worker_ids || jsonb_build_array(%(worker_id)s::text) end,
           started_at  = case when p.exhausted then j.started_at else now() end,
           finished_at = case when p.exhausted then now() end,
           last_error  = case when p.exhausted
                              then format('lease lost %%s times: the worker running attempt %%s'
                                          ' of %%s (%%s) stopped renewing it (killed or crashed?)',
                                          j.rescues + 1, j.attempt, j.max_attempts, j.claimed_by)
                              else j.last_error end,
           updated_at  = now()
      from picked p
     where j.id = p.id
       -- Redundant with the join, and the reason the update reaches its rows through the
       -- primary key: without it the planner, which cannot estimate the CTE, hashes the whole
       -- table (a sequential scan per claim, 12 ms at 20,000 rows and growing with history).
       and j.id = any(array(select id from picked))
 returning j.id, j.lease_token, j.name, j.queue, j.input, j.run_id, j.attempt, j.max_attempts,
           j.tenant_id, j.traceparent, j.concurrency_key, p.prev_state = 'suspended' as resumed,
           j.state
)
select id::text, lease_token::text, name, queue, input, run_id::text, attempt, max_attempts,
       tenant_id, traceparent, concurrency_key, resumed
  from claimed
 where state = 'running' and (select count(*) from async_commit) = 1
""",
)

# ----------------------------------------------------------------------------- fenced writes --

JOBS_COMPLETE_IF_OWNED = Statement(
    "jobs_complete_if_owned",
    why="""
Mark many runs done in one statement, each fenced on (id, state = 'running', its lease_token).
A pair that matches no row is NOT a success: the run lost the job (cancelled, or re-claimed
after its lease lapsed) and its result is discarded; jobs_fence_check tells that apart from an
earlier try of this same write that committed before the connection died.

The ids and tokens arrive as uuid[] literals and the results as one JSON array (element n is
the result of pair n; JSON null is stored as SQL NULL): formatting a thousand values per array on
the client cost more CPU than the statement. The row keeps claimed_by, attempt and lease_token
of the run that finished it. The answer is
the TOKENS that landed, not the ids: one worker can hold two runs of the same job (a stale run
still executing when the job is re-claimed), and only the token tells them apart.
""",
    sql="""
update x_jobs j
   set state = 'done', result = nullif(v.result, 'null'::jsonb), visible_at = null,
       finished_at = now(), updated_at = now()
  from (select i.id, i.token, r.result
          from unnest(%(ids)s::uuid[], %(tokens)s::uuid[]) with ordinality as i(id, token, n)
          join jsonb_array_elements(%(results)s::jsonb) with ordinality as r(result, n)
         using (n)) as v
 where j.id = v.id and j.lease_token = v.token and j.state = 'running'
returning j.lease_token::text
""",
)

JOB_FAIL_IF_OWNED = Statement(
    "job_fail_if_owned",
    why="""
A run that raised: retry (`ready`, or `delayed` until the backoff's run_at) or `dead` once the
attempts are used up or the error is permanent. The choice is made here from the row, under the
same fence as the ack, so a run that lost the job cannot bury or revive it. last_error always
records this run's error.
""",
    sql="""
update x_jobs
   set state       = case when %(permanent)s or attempt >= max_attempts then 'dead'
                          when %(delay_ms)s > 0 then 'delayed' else 'ready' end,
       run_at      = case when %(permanent)s or attempt >= max_attempts then run_at
                          else now() + %(delay_ms)s * interval '1 millisecond' end,
       finished_at = case when %(permanent)s or attempt >= max_attempts then now() end,
       visible_at  = null,
       last_error  = %(error)s,
       updated_at  = now()
 where id = %(id)s and lease_token = %(token)s and state = 'running'
returning state
""",
)

JOB_REQUEUE_IF_OWNED = Statement(
    "job_requeue_if_owned",
    why="""
Give a job back without spending an attempt (Snooze, graceful shutdown, a refused concurrency
slot): the attempt the claim counted is taken back, and so is its worker_ids entry, so attempts
count runs that really ran. A claim that resumed a suspended job counted nothing, so it returns
to `suspended` (its next claim will not count one either). Fenced like every worker write.
""",
    sql="""
update x_jobs
   set state      = case when %(resumed)s::boolean then 'suspended'
                         when %(delay_ms)s > 0 then 'delayed' else 'ready' end,
       attempt    = attempt - %(spent)s::boolean::int,
       worker_ids = case when %(spent)s::boolean
                         then worker_ids - (jsonb_array_length(worker_ids) - 1)
                         else worker_ids end,
       run_at     = now() + %(delay_ms)s * interval '1 millisecond',
       visible_at = null,
       last_error = coalesce(%(note)s, last_error),
       updated_at = now()
 where id = %(id)s and lease_token = %(token)s and state = 'running'
returning state
""",
)

JOB_SUSPEND_IF_OWNED = Statement(
    "job_suspend_if_owned",
    why="""
Park a running job until wake_at (a durable sleep or an event wait). `suspended` rows are in the
claim index and become eligible at run_at; their resume does not count an attempt. Fenced: a run
that lost the job cannot park it.
""",
    sql="""
update x_jobs
   set state = 'suspended', run_at = %(wake_at)s, visible_at = null, updated_at = now()
 where id = %(id)s and lease_token = %(token)s and state = 'running'
returning id::text
""",
)

JOBS_RENEW_IF_OWNED = Statement(
    "jobs_renew_if_owned",
    why="""
The heartbeat: renew every in-flight lease of a worker in ONE statement per interval, fenced
per run on (id, running, token), returning the ids that still belong to it. An id missing from
the answer means the run lost the job (cancelled from outside, or re-claimed after a lapse):
that run is stopped and its result discarded, because continuing it is the double execution the
lease exists to prevent. The answer is the renewed TOKENS: a stale run and the current run of one
job in the same worker share the id, and an answer keyed by id would renew both.
""",
    sql="""
update x_jobs j
   set visible_at = now() + %(lease_ms)s * interval '1 millisecond', updated_at = now()
  from unnest(%(ids)s::uuid[], %(tokens)s::uuid[]) as v(id, token)
 where j.id = v.id and j.lease_token = v.token and j.state = 'running'
returning j.lease_token::text
""",
)

JOBS_FENCE_CHECK = Statement(
    "jobs_fence_check",
    why="""
Read after a fenced write matched fewer rows than it was given, to tell `lost` from `already
applied`: when the connection died after the server committed a write, the retry matches
nothing, yet the row carries this run's token in the state the write set. Only a run's own
writes leave its token on a non-running row (cancel and burial clear it), so the token decides.
""",
    sql="""
select v.token::text, j.state, coalesce(j.lease_token = v.token, false)
  from unnest(%(ids)s::uuid[], %(tokens)s::uuid[]) as v(id, token)
  left join x_jobs j on j.id = v.id
""",
)

# ------------------------------------------------------------------------------------ steps --

# The fence every step write carries: the run still owns its job (docs/guarantees.md). Written
# into each step statement as an EXISTS on the job's row, so a run that lost its lease records
# nothing.
_OWNED = """exists (select 1 from x_jobs
                where id = %(job_id)s::uuid and lease_token = %(token)s::uuid
                  and state = 'running')"""

STEPS_OF_RUN = Statement(
    "steps_of_run",
    why="""
Every step a run recorded, read once when the run's code takes its first step, so a job of
twenty steps costs one read, not twenty. `due` compares wake_at with the database clock: a
durable sleep ends by the clock every lease is measured on.
""",
    sql="""
select name, status, output, attempts, error, started_at, completed_at, wake_at, event,
       correlation_key, event_id, event_published_at, coalesce(wake_at <= now(), false) as due
  from x_job_steps
 where run_id = %(run_id)s::uuid
""",
)

STEP_COMPLETE_IF_OWNED = Statement(
    "step_complete_if_owned",
    why="""
Record a step's output. Fenced on the job's ownership: the EXISTS on the job row is the fence,
so a run whose lease lapsed (and whose job another run holds) cannot record an output the new
run would then take as done. attempts counts the step's executions: a step that failed twice
and then succeeded says 3.
For an event wait, event_id/event_published_at name the event consumed.
""",
    sql=f"""
insert into x_job_steps
    (run_id, name, status, output, started_at, completed_at, attempts, event, correlation_key,
     event_id, event_published_at)
select %(run_id)s::uuid, %(name)s, 'completed', %(output)s::jsonb, now(), now(), 1, %(event)s,
       %(correlation_key)s, %(event_id)s::bigint, %(event_published_at)s::timestamptz
 where {_OWNED}
on conflict (run_id, name) do update
   set status = 'completed', output = excluded.output, completed_at = now(), error = null,
       attempts = x_job_steps.attempts + (x_job_steps.status = 'failed')::int,
       event = coalesce(excluded.event, x_job_steps.event),
       event_id = excluded.event_id, event_published_at = excluded.event_published_at
returning name
""",
)

STEP_FAIL_IF_OWNED = Statement(
    "step_fail_if_owned",
    why="""
Record a step's failure: `failed`, its error, attempts + 1. The job then fails and retries by
its own policy, and the step runs again on the next attempt. Fenced like every step write.
""",
    sql=f"""
insert into x_job_steps (run_id, name, status, started_at, attempts, error)
select %(run_id)s::uuid, %(name)s, 'failed', now(), 1, %(error)s
 where {_OWNED}
on conflict (run_id, name) do update
   set status = 'failed', error = excluded.error, completed_at = null,
       attempts = x_job_steps.attempts + 1
returning attempts
""",
)

STEP_PARK_IF_OWNED = Statement(
    "step_park_if_owned",
    why="""
Open a durable sleep or an event wait: the step row says what the run waits for (`sleeping`
until wake_at, or `waiting` for an event, wake_at being the timeout). An existing row keeps its
started_at and wake_at: a run resumed early (an event for another waiter, an operator) waits
until the same moment, not a fresh duration. Fenced like every step write.

started_at is now(), the start of the waiter's transaction, which began before it took the
event lock: an event whose publisher held the lock while the waiter waited for it was
published after the wait started, and counts.
""",
    sql=f"""
insert into x_job_steps
    (run_id, name, status, started_at, wake_at, event, correlation_key, attempts)
select %(run_id)s::uuid, %(name)s, %(status)s, now(),
       coalesce(%(wake_at)s::timestamptz,
                now() + %(duration_ms)s::bigint * interval '1 millisecond'),
       %(event)s, %(correlation_key)s, 1
 where {_OWNED}
on conflict (run_id, name) do update set status = excluded.status
returning started_at, wake_at, wake_at <= now() as due
""",
)

STEP_CANCEL_SIBLINGS = Statement(
    "step_cancel_siblings",
    why="""
wait_for_any: once one event won, the waits on the others are closed in the SAME transaction
as the win, so no later publish of a losing event wakes the job for a wait that is over.
""",
    sql=f"""
update x_job_steps
   set status = 'cancelled', completed_at = now()
 where run_id = %(run_id)s::uuid and name like %(prefix)s and status = 'waiting'
   and {_OWNED}
""",
)

EVENT_LOCK = Statement(
    "event_lock",
    why="""
The rendezvous between a waiter and a publisher of one event name, held to the end of the
transaction (pooler-safe: transaction-scoped). The waiter registers its wait, looks for an
event and suspends under it; the publisher inserts the event and wakes waiters under it. So
whichever comes second sees what the first committed: an event published at any moment
relative to the waiter's check-then-suspend is never missed (tests/integration/test_steps.py).
Several names (wait_for_any) are locked in sorted order, so two waiters never deadlock.
""",
    sql="""
select count(pg_advisory_xact_lock(1937010802, hashtext(n)))
  from (select distinct n from unnest(%(names)s::text[]) as n order by n) as names
""",
)

EVENT_PUBLISH = Statement(
    "event_publish",
    why="""
Store an event. published_at is the clock time under the event lock, so publication order
and the lock's order agree (a waiter's started_at is taken under the same lock). The clock is
read once: two calls of clock_timestamp() differ, and the TTL would come out a microsecond off.
""",
    sql="""
insert into x_job_events (name, payload, correlation_key, published_at, expires_at)
select %(name)s, %(payload)s::jsonb, %(correlation_key)s, t.at,
       t.at + %(ttl_ms)s::bigint * interval '1 millisecond'
  from (select clock_timestamp() as at) t
returning id, published_at, expires_at
""",
)

EVENT_WAKE_WAITERS = Statement(
    "event_wake_waiters",
    why="""
Make every suspended job that waits for this event due now, and NOTIFY each of their queues
once: waiters resume at once, not at their timeout or the next poll. Only `suspended` jobs are
touched: a waiter still running its check holds the event lock, so this statement runs after it
committed its suspension, never in between.

The waiting steps are found first, by two probes of the partial waiting index (the event's
correlation key, and waits that named no key; `key is null or key = $2` is no index condition),
and their run_ids handed to the suspended-run index as one array. Written as a semi-join, the
planner was free to walk every suspended job and, for each, every waiting step of the event:
quadratic in the number of waiters (15 ms a publish at 250 waiters, bench W5).
""",
    sql="""
with woken as (
    update x_jobs j
       set run_at = now(), updated_at = now()
     where j.state = 'suspended'
       and j.run_id = any(array(
             select s.run_id from x_job_steps s
              where s.status = 'waiting' and s.event = %(name)s
                and s.correlation_key = %(correlation_key)s
             union all
             select s.run_id from x_job_steps s
              where s.status = 'waiting' and s.event = %(name)s
                and s.correlation_key is null))
    returning j.queue
)
select (select count(*) from woken),
       (select count(*) from (select pg_notify('xjobs', d.queue)
                                from (select distinct queue from woken) d) n)
""",
)

def _event_next_sql(key_filter: str) -> str:
    """The text of event_next and event_next_keyed, which differ by one filter only."""
    return f"""
select e.id, e.name, e.payload, e.published_at
  from unnest(%(names)s::text[]) as n(name)
  cross join lateral (
      select id, name, payload, published_at
        from x_job_events
       where name = n.name{key_filter}
         and expires_at > now()
         and (published_at, id) > (%(after_at)s::timestamptz, %(after_id)s::bigint)
       order by published_at, id
       limit 1
  ) e
 order by e.published_at, e.id
 limit 1
"""


EVENT_NEXT = Statement(
    "event_next",
    why="""
The earliest unexpired event of the given names after (after_at, after_id), for a wait that
named no correlation key: publication order, never the newest. The bound is the step's start,
or the last event this run consumed of these names, so two waits consume two events in order.

One ordered probe of the (name, published_at, id) index per name (wait_for_any names several),
then the earliest of those: `name = any(...)` over the index cannot return rows in publication
order, so the planner read and sorted every event of the name since the wait began.
""",
    sql=_event_next_sql(""),
)

EVENT_NEXT_KEYED = Statement(
    "event_next_keyed",
    why="""
event_next for a wait that named a correlation key: only that key's events. A statement of its
own, not `($2 is null or correlation_key = $2)`: a prepared statement's generic plan cannot use
such a filter as an index condition, and would walk every event of the name published since the
wait began (a week of other customers' events) instead of the (name, key, published_at) index.
One probe per name, as in event_next.
""",
    sql=_event_next_sql("\n         and correlation_key = %(correlation_key)s"),
)

EVENTS_LIST = Statement(
    "events_list",
    why="Recent events, newest first, for `manage.py xjobs events` and the console.",
    sql="""
select id, name, payload, correlation_key, published_at, expires_at
  from x_job_events
 where (%(name)s::text is null or name = %(name)s)
 order by published_at desc, id desc
 limit %(limit)s
""",
)

EVENTS_PURGE = Statement(
    "events_purge",
    why="Delete expired events, one bounded batch per call (the caller loops).",
    sql="""
delete from x_job_events
 where id = any(array(select id from x_job_events where expires_at <= now()
                       order by expires_at limit %(batch)s))
""",
)

# ------------------------------------------------------------------------------- operators --

JOB_GET = Statement(
    "job_get",
    why="""
One job by id. Under a tenant scope (the console's ADMIN_TENANT_SCOPE) a job of another tenant
is simply not found, so its existence is not revealed either.
""",
    sql=f"""
select {JOB_COLUMNS}
  from x_jobs
 where id = %(id)s
   and (%(tenant_ids)s::text[] is null or tenant_id = any(%(tenant_ids)s::text[]))
""",
)

JOB_CANCEL = Statement(
    "job_cancel",
    why="""
Stop a job from outside. Any state but `done` (nothing left to stop) and `cancelled` (already
stopped; a second cancel must not rewrite the first one's reason). A `running` job's worker
learns at its next heartbeat, which no longer matches: the token is cleared here, so its late
ack or nack reads as lost and the cancel is never undone by the run it stopped.
""",
    sql=f"""
update x_jobs
   set state = 'cancelled', visible_at = null, lease_token = null, finished_at = now(),
       last_error = coalesce(%(reason)s, last_error), updated_at = now()
 where id = %(id)s and state not in ('done', 'cancelled')
   and (%(tenant_ids)s::text[] is null or tenant_id = any(%(tenant_ids)s::text[]))
returning {JOB_COLUMNS}
""",
)

JOB_RETRY = Statement(
    "job_retry",
    why="""
An operator's "retry now": a `dead` or `cancelled` job becomes `ready` with a fresh attempt
budget and the SAME run_id, so the durable steps it completed are not run again. last_error is
kept as the record of why it stopped. If another live job holds the key meanwhile, the unique
index refuses the update; the engine reports that job instead of a driver error. enqueued_by
becomes who retried it when the caller says (the console's `admin:<username>`), so the row
tells who put it back on the queue; otherwise it is kept.
""",
    sql=f"""
with retried as (
    update x_jobs
       set state = 'ready', attempt = 0, run_at = now(), visible_at = null, lease_token = null,
           finished_at = null, result = null, updated_at = now(),
           enqueued_by = coalesce(%(enqueued_by)s, enqueued_by)
     where id = %(id)s and state in ('dead', 'cancelled')
       and (%(tenant_ids)s::text[] is null or tenant_id = any(%(tenant_ids)s::text[]))
    returning {JOB_COLUMNS}
)
select {JOB_COLUMNS}, case when %(notify)s then pg_notify('xjobs', queue) end from retried
""",
)

JOB_RUN_NOW = Statement(
    "job_run_now",
    why="""
An operator's "run now": a `delayed` job, a `suspended` one, or a `ready` one due later becomes
due at once. `running` and finished jobs are untouched (there is nothing to bring forward). For a
suspended job, its open durable sleep or event wait ends now too (a wait ended so returns None):
otherwise the resumed run would find its step not due and park again.
""",
    sql=f"""
with moved as (
    update x_jobs
       set run_at = now(),
           state = case when state = 'delayed' then 'ready' else state end,
           updated_at = now()
     where id = %(id)s
       and (state in ('delayed', 'suspended') or (state = 'ready' and run_at > now()))
       and (%(tenant_ids)s::text[] is null or tenant_id = any(%(tenant_ids)s::text[]))
    returning {JOB_COLUMNS}
), ended_waits as (
    update x_job_steps s
       set wake_at = now()
      from moved m
     where s.run_id = m.run_id and s.status in ('sleeping', 'waiting')
    returning 1
)
select {JOB_COLUMNS}, case when %(notify)s then pg_notify('xjobs', queue) end
  from moved
 where (select count(*) from ended_waits) >= 0
""",
)

JOBS_PURGE = Statement(
    "jobs_purge",
    why="""
Delete finished jobs of the given states that finished before a cutoff, one bounded batch per
call (the caller loops), so retention never holds long locks on the hot table. Driven by the
partial index on finished rows; SKIP LOCKED so it never waits behind a worker. The run's steps go
with it (steps are keyed by run_id, which a job keeps for life).

One ordered scan of the (state, finished_at) index per state: `state = any(...)` over the index
cannot return rows in finished_at order, and the planner then read and sorted every finished
row for each batch of a thousand (0.9 s a batch at 900,000 rows). The deletes reach their rows
through arrays of keys, so no plan can hash-join the whole tables. Up to `batch` rows per state
are locked while a batch is chosen; the unchosen ones are released at commit.
""",
    sql="""
with victims as (
    select j.id, j.run_id
      from unnest(%(states)s::text[]) as s(state)
      cross join lateral (
          select id, run_id, finished_at
            from x_jobs
           where state = s.state and state in ('done', 'dead', 'cancelled')
             and finished_at < %(before)s
           order by finished_at
           limit %(batch)s
             for update skip locked
      ) j
     order by j.finished_at
     limit %(batch)s
), steps as (
    delete from x_job_steps s where s.run_id = any(array(select run_id from victims))
)
delete from x_jobs j where j.id = any(array(select id from victims))
""",
)

QUEUE_STATS = Statement(
    "queue_stats",
    why="""
Per queue, five buckets a depth is SUMMED from, so a row must land in exactly one:
`ready` (ready and due), `delayed` (delayed, or ready but not yet due), `running`, `suspended`,
`dead`; plus done and cancelled. A bare `run_at > now()` would count a sleeping `suspended` job,
or a dead one with a future run_at, twice. Pinned by the property test
tests/conformance/test_stats.py.
Under a tenant scope (the console's ADMIN_TENANT_SCOPE) only those tenants' rows are counted.
""",
    sql="""
select queue,
       count(*) filter (where state = 'ready' and run_at <= now())                 as ready,
       count(*) filter (where state = 'delayed'
                           or (state = 'ready' and run_at > now()))                 as delayed,
       count(*) filter (where state = 'running')                                   as running,
       count(*) filter (where state = 'suspended')                                 as suspended,
       count(*) filter (where state = 'dead')                                      as dead,
       count(*) filter (where state = 'done')                                      as done,
       count(*) filter (where state = 'cancelled')                                 as cancelled
  from x_jobs
 where (%(tenant_ids)s::text[] is null or tenant_id = any(%(tenant_ids)s::text[]))
 group by queue
 order by queue
""",
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

# ---------------------------------------------------------------------------------- outbox --
# The transactional outbox (docs/transactional-enqueue.md). x_outbox lives on the app's
# database alias, x_jobs on XJOBS["DATABASE"]; the two may be one database or two. These
# statements run on whichever alias holds their table: the engine of that alias runs them.

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
         tenant_id, traceparent, enqueued_by, concurrency_key)
    values (%(id)s::uuid, %(name)s, %(queue)s, %(input)s::jsonb, %(key)s::text,
            %(max_attempts)s::int, %(run_at)s::timestamptz, %(delay_ms)s::bigint,
            %(priority)s::int, %(tenant_id)s, %(traceparent)s, %(enqueued_by)s,
            %(concurrency_key)s)
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
       priority, tenant_id, traceparent, enqueued_by, concurrency_key
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

# ------------------------------------------------------------------------------- scheduler --
# Leader election and the cron watermark (django_xjobs/scheduler/, docs/scheduling.md).

# The two-int form of the session advisory lock: (this class, a 31-bit hash of the lock key),
# so it shows in pg_locks as classid/objid with objsubid = 2 and never collides with the
# single-bigint locks an application takes.
ADVISORY_LOCK_CLASS = 1937010803

# The fence every write of a scheduler round carries: this process still leads. Lease mode:
# the lease row names us with more than margin_ms left, so a leader that missed a renewal
# stops writing while it still holds the lease, before anyone else can be elected. Advisory
# mode: our dedicated backend holds the lock (pg_locks is visible from any session, so the
# round's own, possibly pooled, connection can check it).
_LEADING = """(case when %(advisory_pid)s::int is null
        then exists (select 1 from x_scheduler_leader
                      where lock_key = %(lock_key)s and holder = %(holder)s
                        and expires_at > now() + %(margin_ms)s::bigint * interval '1 millisecond')
        else exists (select 1 from pg_locks
                      where locktype = 'advisory' and granted and objsubid = 2
                        and pid = %(advisory_pid)s::int
                        and classid = %(lock_class)s::int::oid
                        and objid = %(lock_id)s::int::oid)
        end)"""

LEADER_ATTEMPT_ELECT = Statement(
    "leader_attempt_elect",
    why="""
Acquire or renew the scheduler's leader lease in ONE statement, safe on a pooled connection
(PgBouncer in transaction mode): the lease is a row, not a session, so it survives the
connection going back to the pool (tests/integration/test_leader_pooling.py). The primary key
makes it atomic: the insert wins an unheld key, and `do update` fires only for the holder itself
(a renewal) or over a lease that already expired. A second node reaching for a live lease
matches neither branch and gets no row back. Expiry is the database clock's now() + lease,
never the caller's.
""",
    sql="""
insert into x_scheduler_leader (lock_key, holder, expires_at)
values (%(lock_key)s, %(holder)s, now() + %(lease_ms)s::bigint * interval '1 millisecond')
on conflict (lock_key) do update
   set holder = excluded.holder, expires_at = excluded.expires_at
 where x_scheduler_leader.holder = excluded.holder
    or x_scheduler_leader.expires_at <= now()
returning expires_at
""",
)

LEADER_RESIGN = Statement(
    "leader_resign",
    why="""
Hand the lease back on a clean stop, so the next leader need not wait for it to expire. Only
the holder may: a node that already lost the lease (it lapsed and another took it) deletes
nothing, and never the new leader's row.
""",
    sql="delete from x_scheduler_leader where lock_key = %(lock_key)s and holder = %(holder)s",
)

LEADER_GET = Statement(
    "leader_get",
    why="""
Who holds the lease, and whether it is still live on the database clock: an expired row is a
leader that stopped renewing (crashed or stopped cleanly without resigning), not a leader.
""",
    sql="""
select lock_key, holder, expires_at, expires_at > now()
  from x_scheduler_leader
 where lock_key = %(lock_key)s
""",
)

LEADER_ADVISORY_LOCK_TRY = Statement(
    "leader_advisory_lock_try",
    why="""
XJOBS["LEADER"] = "advisory": the session advisory lock, on a DEDICATED connection. It is
released when the session ends, so a crashed node's lock frees itself at once; and released just
as surely when a pooled connection goes back to the pool, or handed to whichever client the
pooler gives the session next. Never on a pooled connection
(tests/integration/test_leader_pooling.py shows both ways it breaks). try_ never waits.
""",
    sql="select pg_try_advisory_lock(%(lock_class)s::int, %(lock_id)s::int)",
)

LEADER_ADVISORY_HELD = Statement(
    "leader_advisory_held",
    why="""
Whether this session still holds the advisory lock: asked at every renewal interval instead of
taking the lock again, because advisory locks are re-entrant (each successful try stacks one
more hold that one unlock does not release).
""",
    sql="""
select count(*) > 0
  from pg_locks
 where locktype = 'advisory' and granted and objsubid = 2 and pid = pg_backend_pid()
   and classid = %(lock_class)s::int::oid and objid = %(lock_id)s::int::oid
""",
)

LEADER_ADVISORY_UNLOCK = Statement(
    "leader_advisory_unlock",
    why="""
Release the advisory lock on a clean stop (closing the session would too; this says so
explicitly and lets the next node take over before the connection is torn down).
""",
    sql="select pg_advisory_unlock(%(lock_class)s::int, %(lock_id)s::int)",
)

LEADER_ADVISORY_HOLDER = Statement(
    "leader_advisory_holder",
    why="""
Which backend holds the advisory lock, for `manage.py xjobs schedule` and the console: the
session's application_name names the worker (xjobs:<worker id>:leader).
""",
    sql="""
select l.pid, coalesce(a.application_name, '')
  from pg_locks l
  left join pg_stat_activity a on a.pid = l.pid
 where l.locktype = 'advisory' and l.granted and l.objsubid = 2
   and l.classid = %(lock_class)s::int::oid and l.objid = %(lock_id)s::int::oid
 limit 1
""",
)

SCHEDULER_STATES_ENSURE = Statement(
    "scheduler_states_ensure",
    why="""
A new task starts from now, not from the epoch: its row is created with the round's time as
watermark, so nothing before it fires. `do nothing` leaves an existing watermark alone (the
row, and only `greatest`, moves it). Fenced on leading: a non-leader with a clock far ahead
must not set a watermark in the future.
""",
    sql=f"""
insert into x_scheduler_state (task_name, last_fired_at, updated_at)
select t.name, %(at)s::timestamptz, now()
  from unnest(%(names)s::text[]) as t(name)
 where {_LEADING}
on conflict (task_name) do nothing
""",
)

SCHEDULER_STATES_LOCK_IF_LEADING = Statement(
    "scheduler_states_lock_if_leading",
    why="""
Open a round: lock the state rows of the tasks that are due until the transaction ends, and
read their watermarks UNDER the lock. This, not the leader lease, is what makes two overlapping
rounds safe (a leader whose lease lapsed while it was frozen, and its successor): they
serialise on the rows, and the second reads the watermarks the first committed, so it computes
nothing the first already fired - even when that job has since finished and its key is free
again. SKIP LOCKED: a round never waits behind another one (which may belong to a frozen
process); it leaves those tasks for its next round. Fenced on leading, so a process that no
longer leads locks nothing. Always one row at least, whose first column says whether we lead.
""",
    sql=f"""
select l.leading, s.task_name, s.last_fired_at, s.paused
  from (select {_LEADING} as leading) l
  left join lateral (
      select task_name, last_fired_at, paused
        from x_scheduler_state
       where task_name = any(%(names)s::text[]) and l.leading
       order by task_name
         for update skip locked
  ) s on true
""",
)

SCHEDULER_STATES_MARK_IF_LEADING = Statement(
    "scheduler_states_mark_if_leading",
    why="""
Close a round: move the watermarks to the round's time, in the transaction that enqueued the
round's occurrences, so both commit or neither does (a crash between them would otherwise fire
an occurrence twice once its first job finished). `greatest` and not an assignment: a watermark
only ever moves FORWARD, and an older round must never rewind it - every occurrence between
the two values would fire a second time. Fenced on leading, as the last
statement before the commit: a leader that lost its lease mid-round gets no rows, and its
round is rolled back.
""",
    sql=f"""
update x_scheduler_state
   set last_fired_at = greatest(last_fired_at, %(at)s::timestamptz), updated_at = now()
 where task_name = any(%(names)s::text[]) and {_LEADING}
returning task_name, last_fired_at
""",
)

SCHEDULER_STATES_LIST = Statement(
    "scheduler_states_list",
    why="""
Every task's watermark and pause flag, for `manage.py xjobs schedule` and the console; includes
rows of tasks no longer configured, so an operator can see them.
""",
    sql="""
select task_name, last_fired_at, paused, updated_at
  from x_scheduler_state
 order by task_name
""",
)

SCHEDULER_STATE_SET_PAUSED = Statement(
    "scheduler_state_set_paused",
    why="""
An operator pauses or resumes a task. While paused, rounds keep moving the watermark without
firing; resuming also moves it to at least now, so resuming never replays the paused stretch
even if no leader ran meanwhile. A task that never ran gets its row here, starting from now.
""",
    sql="""
insert into x_scheduler_state (task_name, last_fired_at, updated_at, paused)
values (%(name)s, %(at)s::timestamptz, now(), %(paused)s)
on conflict (task_name) do update
   set paused = excluded.paused,
       last_fired_at = case when excluded.paused then x_scheduler_state.last_fired_at
                            else greatest(x_scheduler_state.last_fired_at,
                                          excluded.last_fired_at) end,
       updated_at = now()
returning task_name, last_fired_at, paused, updated_at
""",
)

# ----------------------------------------------------------------------------- maintenance --

OUTBOX_PURGE_PUBLISHED = Statement(
    "outbox_purge_published",
    why="""
Delete relayed outbox rows published before a cutoff, one bounded batch per call (the caller
loops), so retention never holds long locks on a table every enqueue_on_commit writes. Driven
by the partial index on published rows; pending rows (published_at null) are never touched.
SKIP LOCKED: a row the relay still holds is left for the next batch.
""",
    sql="""
delete from x_outbox
 where id = any(array(select id from x_outbox
                       where published_at is not null and published_at < %(before)s
                       order by published_at
                       limit %(batch)s
                         for update skip locked))
""",
)

SLOTS_PURGE_EXPIRED = Statement(
    "slots_purge_expired",
    why="""
Delete concurrency slot rows expired for longer than a grace, one bounded batch per call. An
expired slot is free anyway (the acquire overwrites it), so this only collects keys nobody uses
any more. The grace keeps the row for a renewal that is in flight: its transaction's now() may
predate the expiry, and it must see its own fence (holder and expires_at > now()) decide, not a
row that vanished under it. SKIP LOCKED: a slot being renewed or taken is never waited for.
""",
    sql="""
delete from x_job_leases
 where id in (select id from x_job_leases
               where expires_at <= now() - %(grace_ms)s::bigint * interval '1 millisecond'
               order by expires_at
               limit %(batch)s
                 for update skip locked)
""",
)

# ------------------------------------------------------------------------------ connections --

SESSION_LABEL = Statement(
    "session_label",
    why="""
Set up a worker's own connection. `application_name` names it, so `pg_stat_activity` shows which
worker and which role (loop, heartbeat, listener) a backend serves, and fault tests can find it.
`jit` off: the claim's generic plan on a table of a million rows is costed high enough to be
JIT-compiled, which took 1.3 s per claim where executing it takes 50 ms (bench/scale.py).
""",
    sql="select set_config('application_name', %(label)s, false), set_config('jit', 'off', false)",
)

LISTEN = Statement(
    "listen",
    why="""
Subscribe a dedicated connection to enqueue wake-ups. NOTIFY is a latency hint, never the source
of truth: notifications sent while this session is gone are lost, so the worker polls as well
and re-LISTENs after every reconnect.
""",
    sql=f"listen {CHANNEL}",
)

DB_NOW = Statement(
    "db_now",
    why="The database clock, the one every lease is measured on.",
    sql="select now()",
)

# ------------------------------------------------------------------------------- backfills --

# The fence of every backfill write a worker makes: the pass's job row, still owned by this run,
# LOCKED until the end of the writer's transaction. A plain EXISTS is not enough here: under READ
# COMMITTED it reads a snapshot taken when the statement started, so a re-claim committed a moment
# later would not stop a stale run from committing a whole batch of the user's writes, and the
# new run could read the cursor from before it (and process those rows again). FOR UPDATE waits
# for a cancel or claim in flight and re-checks the newest row version; once held, no claim
# (SKIP LOCKED) or cancel can change the job before the batch commits. The lock lasts one
# statement and a commit, so the worker's heartbeat, which updates the same row, barely waits.
# Lock order is x_jobs then x_backfills everywhere (backfills.cancel too): no deadlock.
_BACKFILL_OWNER = """(select id from x_jobs
          where id = %(job_id)s::uuid and state = 'running' and lease_token = %(token)s::uuid
            for update) as owner"""

BACKFILL_COLUMNS = (
    "run_id, name, status, rows_processed, last_cursor, checksum, app_version, started_at,"
    " completed_at, updated_at, error, job_id, code_changes"
)

BACKFILL_CREATE = Statement(
    "backfill_create",
    why="""
Record a pass as `pending` in the same transaction that enqueues its job, so `xjobs_backfill
show RUN_ID` and `--list` find it before any worker has claimed it. `do nothing` on a second
create of the same run: the row a worker already opened is never reset by an operator.
""",
    sql="""
insert into x_backfills
    (run_id, name, status, checksum, app_version, job_id, started_at, updated_at)
values (%(run_id)s::uuid, %(name)s, 'pending', %(checksum)s, %(app_version)s, %(job_id)s::uuid,
        now(), now())
on conflict (run_id) do nothing
""",
)

BACKFILL_START_IF_OWNED = Statement(
    "backfill_start_if_owned",
    why="""
Open the pass's row, or adopt the one an earlier attempt of the SAME run (same run_id) left:
`do update` because a failed or killed attempt left it `failed` or `running`, and a cancelled
pass may be resumed by a retry. Adopting keeps started_at, checksum, app_version and the
progress (rows_processed, last_cursor) where the last attempt got to, and clears completed_at,
which a failure or cancel stamped: otherwise a list would show a running pass with a
completion time in the past. A `pending` row (created by `start`) becomes the pass
as it really begins: started_at, checksum and app_version of the code that runs it.

A `completed` row stays completed and is returned as such: its job is running again only
because the ack after the final batch was lost (a crash between the commit and the ack), and
re-opening it with its cleared cursor would start the pass over.

A resume under code whose checksum differs from the code the pass last ran with appends one
entry to code_changes (the audit of which code processed which rows), and only one per change.
Fenced on the job's ownership, locked (see _BACKFILL_OWNER): nothing happens for a stale run.
""",
    sql=f"""
insert into x_backfills as b
    (run_id, name, status, checksum, app_version, job_id, started_at, updated_at)
select %(run_id)s::uuid, %(name)s, 'running', %(checksum)s, %(app_version)s, owner.id, now(),
       now()
  from {_BACKFILL_OWNER}
on conflict (run_id) do update
   set status       = case when b.status = 'completed' then 'completed' else 'running' end,
       completed_at = case when b.status = 'completed' then b.completed_at end,
       started_at   = case when b.status = 'pending' then now() else b.started_at end,
       checksum     = case when b.status = 'pending' then excluded.checksum else b.checksum end,
       app_version  = case when b.status = 'pending' then excluded.app_version
                           else b.app_version end,
       code_changes = case
           when b.status in ('pending', 'completed')
             or coalesce(b.code_changes -> -1 ->> 'checksum', b.checksum)
                is not distinct from excluded.checksum
           then b.code_changes
           else b.code_changes || jsonb_build_array(jsonb_build_object(
                    'checksum', excluded.checksum, 'app_version', excluded.app_version,
                    'at', now(), 'rows_processed', b.rows_processed))
       end,
       job_id       = excluded.job_id,
       updated_at   = now()
returning {BACKFILL_COLUMNS}
""",
)

BACKFILL_PROGRESS_IF_OWNED = Statement(
    "backfill_progress_if_owned",
    why="""
Advance a pass past one batch, INSIDE the batch's own transaction: the user's writes and the
cursor commit together or not at all, so a crash anywhere resumes exactly after the last
committed batch and no row is processed twice (tests/acceptance/test_backfills.py). No row
returned means the run lost its job (cancelled, re-claimed after a lapse) or the pass is no
longer running: the caller rolls the batch back. Fenced and locked (see _BACKFILL_OWNER).
""",
    sql=f"""
update x_backfills b
   set rows_processed = b.rows_processed + %(processed)s::bigint,
       last_cursor    = %(cursor)s::jsonb,
       updated_at     = now()
  from {_BACKFILL_OWNER}
 where b.run_id = %(run_id)s::uuid and b.status = 'running'
returning b.rows_processed
""",
)

BACKFILL_COMPLETE_IF_OWNED = Statement(
    "backfill_complete_if_owned",
    why="""
The final batch: its progress and the completion commit in the batch's transaction. A separate
"finish" after the last batch's commit would leave a crash window in which the pass is
`running` with the final (cleared) cursor, and the resumed pass would start over. Completion
clears the cursor; nothing is left to resume. Fenced and locked like every batch.
""",
    sql=f"""
update x_backfills b
   set rows_processed = b.rows_processed + %(processed)s::bigint,
       last_cursor    = null,
       status         = 'completed',
       completed_at   = now(),
       updated_at     = now()
  from {_BACKFILL_OWNER}
 where b.run_id = %(run_id)s::uuid and b.status = 'running'
returning b.rows_processed
""",
)

BACKFILL_FAIL_IF_OWNED = Statement(
    "backfill_fail_if_owned",
    why="""
A batch raised and was rolled back: the pass is `failed` with the error, and KEEPS its cursor
(the last committed batch): where a pass stopped is the first thing anyone asks about one, and
a retry resumes exactly there. completed_at stamps when it stopped; a retry clears it again.
Fenced and locked: a stale run's late failure must not mark the new run's pass failed.
""",
    sql=f"""
update x_backfills b
   set status = 'failed', error = %(error)s, completed_at = now(), updated_at = now()
  from {_BACKFILL_OWNER}
 where b.run_id = %(run_id)s::uuid and b.status = 'running'
returning b.run_id
""",
)

BACKFILL_CANCEL = Statement(
    "backfill_cancel",
    why="""
An operator stops a pass (`xjobs_backfill cancel`), in the transaction that also cancels its
job, which comes first (lock order x_jobs, then x_backfills, as in every batch). The job's
cancel is what stops the worker: its next batch's fence finds no owned job and rolls back. A
completed pass has nothing to stop; a pending, running or failed one becomes `cancelled`, its
cursor kept, so `xjobs_backfill retry` can resume it later.
""",
    sql=f"""
update x_backfills
   set status = 'cancelled', completed_at = now(), updated_at = now()
 where run_id = %(run_id)s::uuid and status in ('pending', 'running', 'failed')
returning {BACKFILL_COLUMNS}
""",
)

BACKFILLS_LIST = Statement(
    "backfills_list",
    why="""
Passes for `xjobs_backfill --list` and `show`, newest first, each with the state of its job (a
pass `running` whose job is cancelled or gone is visible as such). Every filter is optional.
The run id parameter is cast to uuid in BOTH places, because run_id IS a uuid: a null test cast
to text would type the parameter as text, and `uuid = text` has no operator, so every call
would fail, filtered or not (tests/conformance/test_backfills.py pins the filter). An
operator types this value by hand: the command checks it is a uuid before it gets here.
""",
    sql="""
select b.run_id, b.name, b.status, b.rows_processed, b.last_cursor, b.checksum, b.app_version,
       b.started_at, b.completed_at, b.updated_at, b.error, b.job_id, b.code_changes,
       j.state, j.attempt
  from x_backfills b
  left join x_jobs j on j.id = b.job_id
 where (%(name)s::text is null or b.name = %(name)s::text)
   and (%(status)s::text is null or b.status = %(status)s::text)
   and (%(run_id)s::uuid is null or b.run_id = %(run_id)s::uuid)
 order by b.started_at desc, b.run_id desc
 limit %(limit)s
""",
)

# ------------------------------------------------------------------------ concurrency slots --
# django_xjobs/slots.py has the protocol (states, transitions, which timeout bounds which).
# A slot row is free when it is missing OR lapsed (expires_at <= now()); nothing here deletes
# lapsed rows of other holders: maintenance does.

SLOTS_ACQUIRE = Statement(
    "slots_acquire",
    why="""
Take the lowest free slot under its limit for each request of a claimed batch, in one
statement. Race-safe without an advisory lock: the (lease_key, slot) unique index serialises two
workers that picked the same slot, and the loser's `do update` is guarded on the row having
expired, so a live slot returns no row and is never granted twice. Under contention this can
refuse a slot that is genuinely free (both picked slot 0, slot 1 was free): a refusal costs one
poll interval, an over-grant would cost the guarantee (tests/conformance/test_slots.py races 16
threads for the last slot).

Several requests for one key in a batch share that key's free slots, lowest limit first, then
in request order: a request's `rank` is how many requests before it were granted (its
position, less the shortfall of the ones that were not: the running minimum of
`below - pos - 1`), and it gets the rank-th free slot only if that slot is below its OWN limit
(`rank < below`, `below` = free slots under its limit). So each run stays under the limit that
applies to it, and a refused low-limit request does not push a higher-limit one off a slot.
The free slots of a key are found by probing the unique index from slot 0 up, stopping once
there are as many as the key has requests. Rows are written in (lease_key, slot) order, so two
workers acquiring overlapping slots wait for each other in one order and cannot deadlock. The
answer names the holders that got a slot.
""",
    sql="""
with req as (
    select r.lease_key, r.lim, r.holder, r.ord,
           row_number() over (partition by r.lease_key order by r.lim, r.ord) - 1 as pos
      from unnest(%(keys)s::text[], %(limits)s::int[], %(holders)s::text[])
           with ordinality as r(lease_key, lim, holder, ord)
), wanted as (
    select lease_key, max(lim) as lim, count(*) as n from req group by lease_key
), free as (
    select w.lease_key, f.slot, f.rank
      from wanted w
      cross join lateral (
          select s.slot, row_number() over (order by s.slot) - 1 as rank
            from generate_series(0, w.lim - 1) as s(slot)
           where not exists (select 1 from x_job_leases l
                              where l.lease_key = w.lease_key and l.slot = s.slot
                                and l.expires_at > now())
           order by s.slot
           limit w.n
      ) f
), counted as (
    select q.lease_key, q.lim, q.holder, q.ord, q.pos,
           (select count(*) from free f
             where f.lease_key = q.lease_key and f.slot < q.lim) as below
      from req q
), placed as (
    select c.lease_key, c.holder, c.below,
           c.pos + least(0, coalesce(min(c.below - c.pos - 1) over (
               partition by c.lease_key order by c.lim, c.ord
               rows between unbounded preceding and 1 preceding), 0)) as rank
      from counted c
)
insert into x_job_leases (lease_key, slot, holder, expires_at)
select p.lease_key, f.slot, p.holder, now() + %(ttl_ms)s::bigint * interval '1 millisecond'
  from placed p
  join free f on f.lease_key = p.lease_key and f.rank = p.rank
 where p.rank < p.below
 order by p.lease_key, f.slot
on conflict (lease_key, slot) do update
   set holder = excluded.holder, expires_at = excluded.expires_at
 where x_job_leases.expires_at <= now()
returning lease_key, slot, holder
""",
)

SLOTS_RENEW_IF_HELD = Statement(
    "slots_renew_if_held",
    why="""
The heartbeat's renewal of every slot a worker holds, one statement per round. Two fences, and
each answers a case the other cannot: `holder` answers "another run has this slot";
`expires_at > now()` answers "nobody has it YET": a lapsed slot is one any worker may take on
its next acquire, so reviving it would make the TTL an expiry only other workers observe, and
two runs would believe they hold one slot. A slot missing from the answer is lost: its run is
stopped with X_JOB_SLOT_LOST (without the expiry fence a renewal would revive a slot that
lapsed, and the run would go on silently beside the slot's new holder).
""",
    sql="""
update x_job_leases l
   set expires_at = now() + %(ttl_ms)s::bigint * interval '1 millisecond'
  from unnest(%(keys)s::text[], %(slots)s::int[], %(holders)s::text[])
       as v(lease_key, slot, holder)
 where l.lease_key = v.lease_key and l.slot = v.slot and l.holder = v.holder
   and l.expires_at > now()
returning l.holder
""",
)

SLOTS_RELEASE_IF_HELD = Statement(
    "slots_release_if_held",
    why="""
Hand slots back when their runs ended, however they ended, one statement per settle. Fenced on
the holder only: a run may delete its own row even after it lapsed (nobody else's row carries
its holder, which contains its never-reused lease token), and never touches a row another run
took over.
""",
    sql="""
delete from x_job_leases l
 using unnest(%(keys)s::text[], %(slots)s::int[], %(holders)s::text[])
       as v(lease_key, slot, holder)
 where l.lease_key = v.lease_key and l.slot = v.slot and l.holder = v.holder
""",
)

SLOTS_LIST = Statement(
    "slots_list",
    why="""
The slots held now, for `manage.py xjobs slots`: live rows only (a lapsed row is free, whoever
it names). The expiry is also given as milliseconds left on the database clock, the clock the
slots are measured on.
""",
    sql="""
select lease_key, slot, holder, expires_at,
       (extract(epoch from expires_at - now()) * 1000)::bigint
  from x_job_leases
 where expires_at > now()
   and (%(key)s::text is null or lease_key = %(key)s)
 order by lease_key, slot
 limit %(limit)s
""",
)

# -------------------------------------------------------------------------------- console --
# The operations console (django_xjobs/reads.py, admin.py): its one queue write (deleting
# chosen finished jobs) and its monitoring reads. The reads are not queue statements; they are
# here so that an operator finds every statement django-xjobs sends in one place.

JOBS_DELETE_FINISHED = Statement(
    "jobs_delete_finished",
    why="""
The console's "delete finished jobs" on rows an operator picked: only `done`, `dead` and
`cancelled` rows go (a live job is a worker's business: cancel it first), with their steps.
The state test is re-checked on the locked row, so a job retried while the operator confirmed
is not deleted. SKIP LOCKED: a row a retry or a worker holds is skipped, never waited for.
Under a tenant scope another tenant's ids match nothing.
""",
    sql="""
with victims as (
    select id, run_id
      from x_jobs
     where id = any(%(ids)s::uuid[])
       and state in ('done', 'dead', 'cancelled')
       and (%(tenant_ids)s::text[] is null or tenant_id = any(%(tenant_ids)s::text[]))
       for update skip locked
), steps as (
    delete from x_job_steps s using victims v where s.run_id = v.run_id
)
delete from x_jobs j using victims v where j.id = v.id
""",
)

TABLES_HEALTH = Statement(
    "tables_health",
    why="""
Dead tuples and transaction-id age of the eight x_ tables: what takes a PostgreSQL queue down.
Every claim and ack leaves a dead row version; when VACUUM cannot keep up (or an old snapshot
stops it, see xmin_horizon) claims scan ever more dead index entries and slow down. xid age is
age(relfrozenxid) of the table or its TOAST table, whichever is older: at
autovacuum_freeze_max_age an anti-wraparound vacuum starts, and near 2^31 the server refuses
writes. Names go through to_regclass so a table that is missing reads as absent, not an error.
""",
    sql="""
select t.name, coalesce(s.n_live_tup, 0), coalesce(s.n_dead_tup, 0),
       greatest(s.last_vacuum, s.last_autovacuum), greatest(s.last_analyze, s.last_autoanalyze),
       greatest(age(c.relfrozenxid), coalesce(age(toast.relfrozenxid), 0)),
       current_setting('autovacuum_freeze_max_age')::bigint,
       pg_total_relation_size(c.oid)
  from unnest(array['x_jobs', 'x_job_steps', 'x_job_events', 'x_outbox', 'x_job_leases',
                    'x_scheduler_leader', 'x_scheduler_state', 'x_backfills']) as t(name)
  join pg_class c on c.oid = to_regclass(t.name)
  left join pg_class toast on toast.oid = c.reltoastrelid
  left join pg_stat_user_tables s on s.relid = c.oid
 order by t.name
""",
)

XMIN_HORIZON = Statement(
    "xmin_horizon",
    why="""
What holds back VACUUM on this database, oldest first: open transactions (an `idle in
transaction` session, a long report, a stuck migration), replication slots whose xmin does not
move (a standby or a consumer that went away), and forgotten prepared transactions. While one of
them holds an old snapshot, no dead row version younger than it can be removed, however often
autovacuum runs, and the queue tables bloat. Only this database's backends count (PostgreSQL 14+
ignores other databases' snapshots for our tables); the console's own backend is left out.
A transaction's horizon is the older of its snapshot (backend_xmin, none between statements
of a read-committed transaction) and its own transaction id (backend_xid, once it wrote).
""",
    sql="""
select * from (
    select 'transaction' as kind,
           coalesce(nullif(a.application_name, ''), a.usename::text, 'backend') as name,
           a.pid, a.state, a.xact_start,
           extract(epoch from now() - a.xact_start)::float8 as age_seconds,
           greatest(age(a.backend_xmin), age(a.backend_xid))::bigint as xmin_age,
           left(a.query, 500) as query
      from pg_stat_activity a
     where a.datname = current_database() and a.pid <> pg_backend_pid()
       and (a.xact_start is not null or a.backend_xmin is not null
            or a.backend_xid is not null)
    union all
    select 'replication slot', r.slot_name::text, r.active_pid,
           case when r.active then 'active' else 'inactive' end, null, null,
           age(r.xmin)::bigint, null
      from pg_replication_slots r
     where r.xmin is not null and (r.database is null or r.database = current_database())
    union all
    select 'prepared transaction', p.gid, null, 'prepared', p.prepared,
           extract(epoch from now() - p.prepared)::float8, age(p.transaction)::bigint, null
      from pg_prepared_xacts p
     where p.database = current_database()
) h
 order by h.xmin_age desc nulls last, h.age_seconds desc nulls last
 limit %(limit)s
""",
)

SLOTS_USAGE = Statement(
    "slots_usage",
    why="""
Held slots per key for the stats: live rows only, counted on the database clock, busiest keys
first. Lapsed rows wait for maintenance and are not counted: they are free.
""",
    sql="""
select lease_key, count(*), min(expires_at)
  from x_job_leases
 where expires_at > now()
 group by lease_key
 order by count(*) desc, lease_key
 limit %(limit)s
""",
)

JOBS_WAKE_REFUSED = Statement(
    "jobs_wake_refused",
    why="""
Make jobs that were refused a slot due now, because the worker that refused them has just
released a slot of their key: without it, a refused job waits its whole poll interval even when
a slot frees a millisecond later, and a saturated key of short jobs runs `limit` jobs per poll
interval. The worker names each job with the token of the claim it refused: the refusal leaves
that token on the row, and any later claim replaces it, so a job that was claimed again since
(and perhaps failed into a backoff, or snoozed) is not touched. Only rows still waiting
(`run_at > now()`) move. NOTIFY wakes the other workers of the queues, at most once per queue.
""",
    sql="""
with woken as (
    update x_jobs j
       set run_at = now(), updated_at = now()
      from unnest(%(ids)s::uuid[], %(tokens)s::uuid[]) as v(id, token)
     where j.id = v.id and j.lease_token = v.token
       and j.state in ('ready', 'delayed', 'suspended') and j.run_at > now()
    returning j.queue
)
select (select count(*) from woken),
       (select count(pg_notify('xjobs', d.queue))
          from (select distinct queue from woken) d
         where %(notify)s)
""",
)

JOBS_REQUEUE_IF_OWNED = Statement(
    "jobs_requeue_if_owned",
    why="""
job_requeue_if_owned for many runs in one statement: the claims of a batch whose concurrency
slot was refused go back together, so a batch of N refused jobs costs one round trip, not N.
Same rule per run: the attempt the claim counted is taken back (and its worker_ids entry), a
resumed suspended job returns to `suspended`, and the job is due again after its delay (one
poll interval for a refusal, so this worker does not claim it again in a tight loop). Fenced per
run on (id, running, token). The answer is the tokens that landed.
""",
    sql="""
update x_jobs j
   set state      = case when v.resumed then 'suspended'
                         when v.delay_ms > 0 then 'delayed' else 'ready' end,
       attempt    = j.attempt - v.spent::int,
       worker_ids = case when v.spent
                         then j.worker_ids - (jsonb_array_length(j.worker_ids) - 1)
                         else j.worker_ids end,
       run_at     = now() + v.delay_ms * interval '1 millisecond',
       visible_at = null,
       last_error = coalesce(v.note, j.last_error),
       updated_at = now()
  from unnest(%(ids)s::uuid[], %(tokens)s::uuid[], %(delays_ms)s::bigint[],
              %(spent)s::boolean[], %(resumed)s::boolean[], %(notes)s::text[])
       as v(id, token, delay_ms, spent, resumed, note)
 where j.id = v.id and j.lease_token = v.token and j.state = 'running'
returning j.lease_token::text
""",
)

# ---------------------------------------------------------------------------- test support --
# django_xjobs.testing (docs/testing.md): the inline test mode's claim of the one job it runs,
# travel()'s shift of due times, and the listing behind enqueued_jobs()/assert_enqueued(). They
# run on the caller's connection like every statement, so inside a TestCase's transaction too.

JOB_CLAIM_IF_DUE = Statement(
    "job_claim_if_due",
    why="""
The inline test mode runs the job an enqueue just made, and only that one: jobs_claim takes
whatever is due first in a queue. This is jobs_claim's due branch for one id, writing what that
branch writes (a fresh lease_token, attempt + 1 except for a resume from `suspended`, the
worker in claimed_by and worker_ids, the lease on the database clock), so the run that follows
is fenced and settled exactly as a worker's (tests/conformance/test_testing_support.py compares
the two rows). A job not due yet (a delay, a backoff, a durable sleep), one already running or
finished, and one another session holds locked (SKIP LOCKED, as in jobs_claim) are not claimed.
""",
    sql="""
with picked as (
    select id, state as prev_state
      from x_jobs
     where id = %(id)s::uuid and state in ('ready', 'delayed', 'suspended') and run_at <= now()
       for update skip locked
)
update x_jobs j
   set state       = 'running',
       attempt     = case when p.prev_state = 'suspended' then j.attempt else j.attempt + 1 end,
       visible_at  = now() + %(lease_ms)s::bigint * interval '1 millisecond',
       lease_token = gen_random_uuid(),
       claimed_by  = %(worker_id)s::text,
       worker_ids  = case when p.prev_state = 'suspended' then j.worker_ids
                          else j.worker_ids || jsonb_build_array(%(worker_id)s::text) end,
       started_at  = now(),
       updated_at  = now()
  from picked p
 where j.id = p.id
returning j.id::text, j.lease_token::text, j.name, j.queue, j.input, j.run_id::text, j.attempt,
          j.max_attempts, j.tenant_id, j.traceparent, j.concurrency_key,
          p.prev_state = 'suspended' as resumed
""",
)

JOBS_SHIFT_DUE = Statement(
    "jobs_shift_due",
    why="""
travel(): make waiting jobs due as if time had passed, without touching any clock. Every due
time the claim compares with now() moves back by the shift: run_at of `ready`, `delayed` and
`suspended` jobs (a delay, a retry's backoff, a snooze, a durable sleep's wake-up) and wake_at
of their runs' open sleeps and event waits, which a resumed step compares with now() to know
whether it is over. All waiting rows move, due ones too, so their claim order stays as it was.
`running` rows keep their leases: passing time must not make a run that is still executing
look crashed.
""",
    sql="""
with moved as (
    update x_jobs
       set run_at = run_at - %(shift_ms)s::bigint * interval '1 millisecond', updated_at = now()
     where state in ('ready', 'delayed', 'suspended')
    returning run_id
), waits as (
    update x_job_steps s
       set wake_at = s.wake_at - %(shift_ms)s::bigint * interval '1 millisecond'
      from (select distinct run_id from moved) m
     where s.run_id = m.run_id and s.status in ('sleeping', 'waiting')
    returning 1
)
select count(*) from moved where (select count(*) from waits) >= 0
""",
)

JOBS_LIST = Statement(
    "jobs_list",
    why="""
Jobs of any state, filtered by name, queue, states and tenant (each filter optional), oldest
first, for enqueued_jobs() and assert_enqueued()'s report of what IS enqueued. A test's table is
small; `limit` (NULL = no limit) bounds it anyway. A NULL tenant filter means any tenant.
""",
    sql=f"""
select {JOB_COLUMNS}
  from x_jobs
 where (%(name)s::text is null or name = %(name)s::text)
   and (%(queue)s::text is null or queue = %(queue)s::text)
   and (%(states)s::text[] is null or state = any(%(states)s::text[]))
   and (%(tenant_id)s::text is null or tenant_id = %(tenant_id)s::text)
 order by created_at, id
 limit %(limit)s::bigint
""",
)

ALL: dict[str, Statement] = {
    s.name: s for s in globals().copy().values() if isinstance(s, Statement)
}
