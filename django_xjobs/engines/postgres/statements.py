"""THE WIRE FORMAT: every statement the PostgreSQL engine runs, as a named constant.

Rules of this module:

* Nothing else in django-xjobs writes queue SQL. The engine runs these by name, logs the name,
  and ``manage.py xjobs_sql NAME`` prints the text (as a ``PREPARE`` an operator can paste into
  psql).
* Each statement's ``why`` says why its filters exist; most of them record a real bug of an
  earlier implementation of this design (``../shared/seed``) or of a peer queue.
* Parameters are ``%(name)s`` placeholders bound by psycopg, never formatted into the text.
* Time is the database's: every lease and due-time comparison uses ``now()``, so a worker with
  a wrong clock cannot stretch or shrink a lease.

Fencing (see SPEC §2): a claim writes a fresh ``lease_token`` (``gen_random_uuid()``, never
reused); every write a worker makes about a run carries ``id``, ``state = 'running'`` AND that
token. ``state = 'running'`` alone, the seed's fence, also matches the row after another worker
re-claimed a lapsed lease. A finished row keeps the token of the run that finished it, so a write
retried after an ambiguous commit is recognised by :data:`JOBS_FENCE_CHECK` as already applied.
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
job (the seed's 1.x bug). It can find nothing when the live job finished between the conflict
and this read; the caller then inserts again.
""",
    sql=f"""
select id, run_id, state
  from x_jobs
 where name = %(name)s
   and coalesce(tenant_id, '') = coalesce(%(tenant_id)s, '')
   and idempotency_key = %(key)s
   and state in {LIVE}
 limit 1
""",
)

JOBS_FIND_LIVE_BY_KEYS = Statement(
    "jobs_find_live_by_keys",
    why="""
job_find_live_by_key for the items of a batch that were not inserted, in one statement. The join
is on the same (name, coalesce(tenant_id, ''), key) expression as the unique index, which is
what lets it use that index.
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
    select c.id, c.prev_state, false as exhausted, w.queue
      from wants w
      cross join lateral (
          select id, state as prev_state
            from x_jobs
           where queue = w.queue and state in ('ready', 'delayed', 'suspended')
             and run_at <= now()
           order by priority desc, run_at
           limit greatest(w.n - (select count(*) from lapsed l where l.queue = w.queue), 0)
             for update skip locked
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

# The fence every step write carries: the run still owns its job (SPEC §2). Written into each
# step statement as an EXISTS on the job's row, so a run that lost its lease records nothing.
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
and the lock's order agree (a waiter's started_at is taken under the same lock).
""",
    sql="""
insert into x_job_events (name, payload, correlation_key, published_at, expires_at)
values (%(name)s, %(payload)s::jsonb, %(correlation_key)s, clock_timestamp(),
        clock_timestamp() + %(ttl_ms)s::bigint * interval '1 millisecond')
returning id, published_at
""",
)

EVENT_WAKE_WAITERS = Statement(
    "event_wake_waiters",
    why="""
Make every suspended job that waits for this event due now, and NOTIFY each of their queues
once: waiters resume at once, not at their timeout or the next poll. Only `suspended` jobs are
touched: a waiter still running its check holds the event lock, so this statement runs after it
committed its suspension, never in between.
""",
    sql="""
with woken as (
    update x_jobs j
       set run_at = now(), updated_at = now()
     where j.state = 'suspended'
       and j.run_id in (select s.run_id from x_job_steps s
                         where s.status = 'waiting' and s.event = %(name)s
                           and (s.correlation_key is null
                                or s.correlation_key = %(correlation_key)s))
    returning j.queue
)
select (select count(*) from woken),
       (select count(*) from (select pg_notify('xjobs', d.queue)
                                from (select distinct queue from woken) d) n)
""",
)

EVENT_NEXT = Statement(
    "event_next",
    why="""
The earliest unexpired event of the given names (and correlation key, when the wait names one)
after (after_at, after_id): publication order, never the newest. The bound is the step's start,
or the last event this run consumed of these names, so two waits consume two events in order.
""",
    sql="""
select id, name, payload, published_at
  from x_job_events
 where name = any(%(names)s::text[])
   and expires_at > now()
   and (%(correlation_key)s::text is null or correlation_key = %(correlation_key)s)
   and (published_at, id) > (%(after_at)s::timestamptz, %(after_id)s::bigint)
 order by published_at, id
 limit 1
""",
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
 where id in (select id from x_job_events where expires_at <= now()
               order by expires_at limit %(batch)s)
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
""",
    sql="""
with victims as (
    select id, run_id
      from x_jobs
     where state = any(%(states)s::text[]) and finished_at < %(before)s
     order by finished_at
     limit %(batch)s
       for update skip locked
), steps as (
    delete from x_job_steps s using victims v where s.run_id = v.run_id
)
delete from x_jobs j using victims v where j.id = v.id
""",
)

QUEUE_STATS = Statement(
    "queue_stats",
    why="""
Per queue, five buckets a depth is SUMMED from, so a row must land in exactly one:
`ready` (ready and due), `delayed` (delayed, or ready but not yet due), `running`, `suspended`,
`dead`; plus done and cancelled. A bare `run_at > now()` would count a sleeping `suspended` job,
or a dead one with a future run_at, twice (the seed's 1.x bug, found because its memory driver's
if/else chain was exclusive and Postgres was not). Pinned by the property test
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

# -------------------------------------------------------------------------------- console --
# The operations console (django_xjobs/console.py, admin.py): its one queue write (deleting
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

ALL: dict[str, Statement] = {
    s.name: s for s in globals().copy().values() if isinstance(s, Statement)
}
