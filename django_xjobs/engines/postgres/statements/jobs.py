"""x_jobs: a job's life from enqueue to its fenced settlement (docs/architecture.md).

In the order a job meets them: enqueue (one and many, keyed and unkeyed, COPY), the claim (and
the flow control it decides), the fenced writes of a run, its heartbeat and the fence check;
then an operator's actions and the queue counts, the early wake-up of jobs handed back
(jobs_wake_refused, Job.objects.wake_refused), and the test kit's claim of one job and shift of
due times. The deletion of finished jobs is in maintenance.py, the reads of whole
job rows in reads.py.
"""

from __future__ import annotations

from ...base import Statement
from .fragments import (
    CHANNEL,
    JOB_COLUMNS,
    LIVE,
    ON_LIVE_KEY_CONFLICT,
    REQUEUE_SET,
    RUN_PAIRS,
    SETTLE_COLUMNS,
    attempt_entry_sql,
    by_key,
    cancel_set_sql,
    count_sql,
    elapsed_ms_sql,
    enqueue_batch_sql,
    enqueue_one_sql,
    free_runs_sql,
    grant_slots_sql,
    held_runs_sql,
    key_limit_sql,
    notify_queues_sql,
    settle_locks_sql,
    tenant_walk_sql,
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

# ----------------------------------------------------------------------------------- claim --

# A lapsed lease ends its run in the attempt history: `lost`, when the lease ran out.
LAPSED_ENTRY = attempt_entry_sql("'lost'", alias="j", finished="j.visible_at")
# The waits, due to start, of the jobs a claim started (a rescued lease's job waited a whole
# lease, not in the queue: left out).
_WAITED = "filter (where state = 'running' and prev_state <> 'running')"
QUEUE_WAITS = f"array_agg({elapsed_ms_sql('run_at')}) {_WAITED}"
QUEUE_WAIT_SUM = f"coalesce(sum({elapsed_ms_sql('run_at')}) {_WAITED}, 0)"

JOBS_CLAIM = Statement(
    "jobs_claim",
    why="""
Lease up to n jobs per queue in one statement, deciding flow control in the same statement
(docs/flow-control.md): a worker never claims a job it may not run. SKIP LOCKED is the whole
design: without it a second worker blocks on the first one's row locks and throughput collapses
to one worker
(tests/conformance/test_claim.py::test_a_row_locked_by_another_session_is_skipped_not_waited_for).

Eligible: `ready`/`delayed`/`suspended` rows due now, or `running` rows whose lease lapsed
(`visible_at <= now()`: the worker died or stopped renewing). `done`, `dead`, `cancelled` and
`blocked` appear in no branch, so a finished, cancelled or held-back job is never handed out. One
lateral scan per queue walks that queue's claim index in (priority desc, run_at) order, which a
single `queue = any(...)` scan cannot do. A queue paused (x_flow_pauses) is not scanned at all.

A fair queue (`fair` true: XJOBS["QUEUES"][q]["fair_by"] = "tenant") is walked tenant by
tenant instead: a loose index scan over the tenants that have claimable jobs, starting after
the worker's cursor (the last tenant it served) and wrapping round, visiting at most `share`
tenants (the recursive walk is lazy and stops there, so a claim reads a handful of tenants
however many there are). Each tenant takes up to its weight per round, in claim order, for as
many rounds as the share needs: one backlogged tenant alone fills the whole share.

Flow control, for the picked jobs that carry a concurrency or rate-limit key only (a batch
without them skips all of it):
- a job whose key is paused goes to `blocked` (blocked_on = that key);
- rate budgets are spent in ONE call of xjobs_rate_take (migration 0003: a function, because it
  must read a key's spending after taking its lock); a job over budget goes back to `delayed`
  (or `suspended`) until its budget frees, and the claim answers that time so the worker claims
  again then;
- slots are taken here, in the same statement, as slots_acquire takes them (the unique index
  serialises two workers on one slot; a live slot is never overwritten); a job whose key has no
  free slot under its limit goes to `blocked` (blocked_on = its key), and the release of a slot
  wakes it (slots_release_if_held). A job held back keeps its attempt, and a durable run's
  resume goes back to `suspended` (blocked_resume) when it is woken. While the fleet is kept
  compatible with release 0.1 (`park` false: x_fleet, docs/deployment.md, "Mixed versions"),
  whose enqueue and operator paths do not know `blocked`, such a job is not parked: it stays
  `delayed` (or `suspended`), due again `hold_ms` (the worker's poll interval) later, as 0.1's
  claim left it.
The answer ends with one row without a job when flow control held jobs back: how many, when
the earliest of those held for their rate budget is due, and the database's now(), so that the
worker measures the wait on the database clock, not on its own wall clock. The worker then
claims again at once (the held jobs left the scan, and what was behind them may be claimable)
and at that time.
The limit of a key: the longest prefix of XJOBS["CONCURRENCY_LIMITS"], else its job's
Concurrency(limit=...), else 1; a debounce key (`debounce:...`, slots.debounce_key) is always 1.

It never waits on a row another transaction holds (docs/design.md, "Lock order"): rows are
taken SKIP LOCKED; a lapsed lease kept beside its held row (x_lease_extensions: the heartbeat
could not renew the row) has not lapsed while its extension runs; a lapsed job buried on its
last attempt has the rows its settle writes (its parent's step row, its window's key row)
locked first, SKIP LOCKED, and one whose row is held is left for a later claim; a rate key
another transaction is spending is tried, not waited for (its jobs are due again 0.1 s later);
a slot is granted only if its advisory lock is free (grant_slots_sql).

Every claim writes a fresh lease_token: the fence for every later write of this run; a slot's
holder is `<job id>/<lease token>/<worker id>`. `attempt` counts claims, except a resume from
`suspended` (waking from a durable sleep is not a new attempt). A lapsed lease whose attempt was
already the last one goes to `dead` instead of running again: a job that kills its worker must
not loop forever. Its token is cleared, so the late writes of the run that lost it read as lost.

The claim commits asynchronously (`synchronous_commit` off for its own transaction only; the
claim never runs inside a caller's transaction). If PostgreSQL crashes before the claim's WAL
reaches disk, the claim never happened: the job is claimable again and the run that started
it is fenced out by its token. That is at-least-once execution, which a crash after a durable
claim gives as well; what it saves is a disk flush on every claim, the largest part of an idle
worker's enqueue-to-start latency.
""",
    sql=f"""
with async_commit as (
    select set_config('synchronous_commit', 'off', true)
), wants as (
    select w.queue, w.n, w.fair, w.cursor
      from unnest(%(queues)s::text[], %(limits)s::int[], %(fair)s::boolean[],
                  %(cursors)s::text[]) as w(queue, n, fair, cursor)
     where not exists (select 1 from x_flow_pauses p
                        where p.kind = 'queue' and p.key = w.queue
                          and (p.until is null or p.until > now()))
), lapsed_rows as materialized (
    -- A lease kept beside its row (x_lease_extensions: the heartbeat found the row held by
    -- another transaction) has not lapsed while its extension runs.
    select c.id, c.prev_state, c.exhausted, w.queue, c.name, c.concurrency_key, c.rate_key,
           c.parent_id, c.parent_step, c.tenant_id, c.idempotency_key, c.unique_for_ms
      from wants w
      cross join lateral (
          select id, state as prev_state, attempt >= max_attempts as exhausted, name,
                 concurrency_key, rate_key, parent_id, parent_step, tenant_id, idempotency_key,
                 unique_for_ms
            from only x_jobs j
           where queue = w.queue and state = 'running' and visible_at <= now()
             and not exists (select 1 from x_lease_extensions e
                              where e.lease_token = j.lease_token and e.until > now())
           order by visible_at
           limit w.n
             for update skip locked
      ) c
), burials as (
    select {SETTLE_COLUMNS} from lapsed_rows
     where exhausted and (parent_id is not null or unique_for_ms is not null)
), {settle_locks_sql("burials")}, lapsed as (
    -- A job buried on its last attempt has its parent's step row counted down, or its
    -- window's key row written, by x_jobs_transition: one whose row another transaction holds
    -- is left for a later claim, never waited for (docs/design.md, "Lock order").
    select id, prev_state, exhausted, queue, name, concurrency_key, rate_key
      from lapsed_rows
     where id not in (select id from stuck)
), shares as (
    select w.queue, w.fair, w.cursor,
           greatest(w.n - (select count(*) from lapsed l where l.queue = w.queue), 0) as share
      from wants w
), due as (
    -- Lapsed leases take their places first (they have waited a whole lease already), and the
    -- due scan fills what is left of each queue's share, in claim order, so a rescue never
    -- lets an older low-priority job pass a higher-priority one (tests/conformance/test_claim.py).
    --
    -- One bounded run_at scan per distinct priority of the queue, highest first (the priorities
    -- found by a loose index scan: one index probe each). A single scan in (priority, run_at)
    -- order cannot stop at the first row not yet due, since a lower priority follows it: with
    -- many delayed jobs and none due, an idle poll would read every one of them
    -- (docs/performance.md, "What the simpler forms cost").
    select c.*, w.queue
      from shares w
      cross join lateral (
          select d.id, d.prev_state, false as exhausted, d.name, d.concurrency_key, d.rate_key
            from (with recursive prio(p) as (
                      (select priority from only x_jobs
                        where queue = w.queue and state in ('ready', 'delayed', 'suspended')
                        order by priority desc limit 1)
                      union all
                      select (select priority from only x_jobs
                               where queue = w.queue
                                 and state in ('ready', 'delayed', 'suspended')
                                 and priority < prio.p
                               order by priority desc limit 1)
                        from prio where prio.p is not null)
                  select p from prio where p is not null order by p desc) pr
            cross join lateral (
                select id, state as prev_state, name, concurrency_key, rate_key
                  from only x_jobs
                 where queue = w.queue and state in ('ready', 'delayed', 'suspended')
                   and priority = pr.p and run_at <= now()
                 order by run_at
                 limit w.share
                   for update skip locked
            ) d
           limit w.share
      ) c
     where not w.fair
), fair_tenants as materialized (
    -- The tenants of each fair queue after the cursor, then from the first one up to the
    -- cursor (the wrap): at most `share` of them, each visited once (x_jobs_fair_idx: the walk
    -- is lazy and stops there). `pos` is the order of the visit.
    select w.queue, w.share, tn.t, tn.pos,
           count(*) over (partition by w.queue) as visited,
           coalesce((select x.weight
                       from unnest(%(weight_queues)s::text[], %(weight_tenants)s::text[],
                                   %(weight_values)s::int[]) as x(queue, tenant, weight)
                      where x.queue = w.queue and x.tenant = tn.t
                      limit 1), 1) as weight
      from shares w
      cross join lateral (
          select v.t, row_number() over () as pos
            from ({tenant_walk_sql()}
                  limit w.share) v
      ) tn
     where w.fair and w.share > 0
), fair_due as (
    -- Round-robin: each visited tenant takes up to its weight per round, and as many rounds
    -- as the share needs when few tenants have work (one backlogged tenant fills the whole
    -- share). A tenant's jobs in claim order, the rounds in visit order.
    select f.id, f.prev_state, false as exhausted, f.name, f.concurrency_key, f.rate_key,
           f.queue
      from (select d.*, ft.queue, ft.share,
                   row_number() over (partition by ft.queue
                                      order by (d.n - 1) / ft.weight, ft.pos, d.n) as k
              from fair_tenants ft
              cross join lateral (
                  select j.*, row_number() over () as n
                    from (select id, state as prev_state, name, concurrency_key, rate_key
                            from only x_jobs
                           where queue = ft.queue and coalesce(tenant_id, '') = ft.t
                             and state in ('ready', 'delayed', 'suspended') and run_at <= now()
                           order by priority desc, run_at
                           limit ft.weight * ((ft.share + ft.visited - 1) / ft.visited)
                             for update skip locked) j
              ) d) f
     where f.k <= f.share
), picked as (
    select id, prev_state, exhausted, name, concurrency_key, rate_key from lapsed
    union all
    select id, prev_state, exhausted, name, concurrency_key, rate_key from due
    union all
    select id, prev_state, exhausted, name, concurrency_key, rate_key from fair_due
), tokens as materialized (
    select id, gen_random_uuid() as token from picked where not exhausted
), gated as (
    -- The picked jobs flow control applies to, with their pause, limit and rate budget.
    select p.id, p.prev_state, p.concurrency_key, p.rate_key,
           (select k.key from x_flow_pauses k
             where k.kind = 'key' and k.key in (p.concurrency_key, p.rate_key)
               and (k.until is null or k.until > now())
             limit 1) as paused_key,
           {key_limit_sql("p.concurrency_key", "p.name")} as slot_limit,
           r.lim as rate_limit, r.period_ms, r.cost
      from picked p
      left join unnest(%(rate_names)s::text[], %(rate_limits)s::int[],
                       %(rate_periods)s::bigint[], %(rate_costs)s::int[])
                as r(name, lim, period_ms, cost)
        on r.name = p.name and p.rate_key is not null
     where not p.exhausted and (p.concurrency_key is not null or p.rate_key is not null)
), spending as (
    select array_agg(id order by id) as ids, array_agg(rate_key order by id) as keys,
           array_agg(rate_limit order by id) as lims, array_agg(period_ms order by id) as pers,
           array_agg(cost order by id) as costs
      from gated
     where paused_key is null and rate_limit is not null
), rated as (
    select s.ids[t.ord] as id, t.next_at
      from spending s
      -- false: a key another transaction is spending (a request's try_acquire) is not
      -- waited for: its jobs are due again a moment later (migration 0010)
      cross join lateral (select * from xjobs_rate_take(s.keys, s.lims, s.pers, s.costs, false)
                           where s.ids is not null) t
), slot_req as (
    -- The jobs that need a slot now: not paused, their rate budget (if any) spent.
    select g.id, g.concurrency_key as lease_key, g.slot_limit as lim,
           g.id::text || '/' || tk.token::text || '/' || %(worker_id)s as holder,
           g.id as ord,
           row_number() over (partition by g.concurrency_key order by g.slot_limit, g.id) - 1
             as pos
      from gated g
      join tokens tk on tk.id = g.id
      left join rated r on r.id = g.id
     where g.concurrency_key is not null and g.paused_key is null
       and (g.rate_limit is null or (r.id is not null and r.next_at is null))
), {grant_slots_sql("slot_req", "%(slot_ttl_ms)s")}, held as (
    -- What flow control holds back: paused or without a slot -> blocked, over budget -> due
    -- again when the budget frees.
    select g.id, g.prev_state,
           case when g.paused_key is not null then g.paused_key
                when r.next_at is null then g.concurrency_key end as blocked_on,
           r.next_at
      from gated g
      left join rated r on r.id = g.id
      left join slot_req q on q.id = g.id
      left join granted gr on gr.holder = q.holder
     where g.paused_key is not null
        or r.next_at is not null
        or (q.id is not null and gr.holder is null)
), holding as (
    update only x_jobs j
       set state          = case when h.blocked_on is not null and %(park)s then 'blocked'
                                 when h.prev_state = 'suspended' then 'suspended'
                                 else 'delayed' end,
           blocked_on     = case when %(park)s then h.blocked_on end,
           blocked_resume = %(park)s and h.prev_state = 'suspended',
           rescues        = j.rescues + (h.prev_state = 'running')::int,
           -- Not parked (a fleet kept compatible with 0.1): due again a poll interval later.
           run_at         = coalesce(h.next_at,
                                     case when h.blocked_on is not null and not %(park)s
                                          then now() + %(hold_ms)s * interval '1 millisecond'
                                     end,
                                     j.run_at),
           lease_token    = case when h.prev_state = 'running' then null else j.lease_token end,
           attempts       = case when h.prev_state = 'running'
                                 then {LAPSED_ENTRY}
                                 else j.attempts end,
           visible_at     = null,
           updated_at     = now()
      from held h
     where j.id = h.id
       and j.id = any(array(select id from held))
    returning j.id
), admitted as (
    select p.id, p.prev_state, p.exhausted, tk.token, gr.slot,
           case when q.id is not null then q.lim end as slot_limit
      from picked p
      left join tokens tk on tk.id = p.id
      left join slot_req q on q.id = p.id
      left join granted gr on gr.holder = q.holder
     where p.id not in (select id from held)
), claimed as (
    update only x_jobs j
       set state       = case when p.exhausted then 'dead' else 'running' end,
           attempt     = case when p.exhausted or p.prev_state = 'suspended' then j.attempt
                              else j.attempt + 1 end,
           rescues     = j.rescues + (p.prev_state = 'running')::int,
           visible_at  = case when p.exhausted then null
                              else now() + %(lease_ms)s * interval '1 millisecond' end,
           lease_token = case when p.exhausted then null else p.token end,
           claimed_by  = case when p.exhausted then j.claimed_by else %(worker_id)s end,
           worker_ids  = case when p.exhausted or p.prev_state = 'suspended' then j.worker_ids
                              else j.worker_ids || jsonb_build_array(%(worker_id)s::text) end,
           started_at  = case when p.exhausted then j.started_at else now() end,
           attempts    = case when p.prev_state = 'running'
                              then {LAPSED_ENTRY}
                              else j.attempts end,
           finished_at = case when p.exhausted then now() end,
           last_error  = case when p.exhausted
                              then format('lease lost %%s times: the worker running attempt %%s'
                                          ' of %%s (%%s) stopped renewing it (killed or crashed?)',
                                          j.rescues + 1, j.attempt, j.max_attempts, j.claimed_by)
                              else j.last_error end,
           updated_at  = now()
      from admitted p
     where j.id = p.id
       -- Redundant with the join, and the reason the update reaches its rows through the
       -- primary key: without it the planner, which cannot estimate the CTE, hashes the whole
       -- table: a sequential scan per claim, growing with history (docs/performance.md).
       and j.id = any(array(select id from admitted))
 returning j.id, j.lease_token, j.name, j.queue, j.input, j.run_id, j.attempt, j.max_attempts,
           j.tenant_id, j.traceparent, j.concurrency_key, p.prev_state = 'suspended' as resumed,
           j.state, p.slot, p.slot_limit, p.prev_state, j.run_at, j.parent_id
), tallied as (
    -- The starts with their waits (QUEUE_WAITS), and the jobs a lapsed last attempt buried.
    {count_sql("claimed", started="count(*) filter (where state = 'running')",
               dead="count(*) filter (where state = 'dead')",
               wait_ms=QUEUE_WAITS, wait_ms_sum=QUEUE_WAIT_SUM)}
)
select id::text, lease_token::text, name, queue, input, run_id::text, attempt, max_attempts,
       tenant_id, traceparent, concurrency_key, resumed, slot, slot_limit, null::timestamptz,
       0::bigint, null::timestamptz, parent_id::text
  from claimed
 where state = 'running' and (select count(*) from async_commit) = 1
union all
select null, null, null, null, null, null, null, null, null, null, null, null, null, null,
       (select min(next_at) from rated where next_at is not null), h.n, now(), null
  from (select count(*) as n from holding) h
 where h.n > 0
""",
)

# --------------------------------------------------------------------------- fenced writes --

JOBS_COMPLETE_IF_OWNED = Statement(
    "jobs_complete_if_owned",
    why="""
Mark many runs done in one statement, each fenced on (id, state = 'running', its lease_token).
A pair that matches no row is NOT a success: the run lost the job (cancelled, or re-claimed
after its lease lapsed) and its result is discarded; jobs_fence_check tells that apart from an
earlier try of this same write that committed before the connection died.

It never waits on a lock (docs/design.md, "Lock order"): the rows are locked first, in id
order, SKIP LOCKED, and so are the step rows of the parents of the children among them (the
trigger x_jobs_transition counts those down). A run whose row, or whose parent's step row,
another transaction holds (a request's select for update or debounce, an operator's change not
committed yet) is answered busy: nothing written, the worker acknowledges it again later, and
its lease is kept meanwhile (jobs_renew_if_owned). One worker's batch therefore never waits on
another's, on its own heartbeat, or on the application.

The ids and tokens arrive as uuid[] literals and the results as one JSON array (element n is
the result of pair n; JSON null is stored as SQL NULL): formatting each value of the arrays on
the client would cost more CPU than the statement (docs/performance.md, "What the simpler forms
cost"). The row keeps claimed_by, attempt and lease_token of the run that finished it. The
answer is the TOKENS, each landed or busy, not the ids: one worker can hold two runs of the
same job (a stale run still executing when the job is re-claimed), and only the token tells
them apart.

The counters' deltas go in with it (done, and each run's time); the attempt history gets no
entry: the row, with its attempt, claimed_by, started_at and finished_at, is the entry of the
run that finished the job (docs/observability.md, "Attempt history").
""",
    sql=f"""
with v as (
    select i.id, i.token, r.result
      from unnest(%(ids)s::uuid[], %(tokens)s::uuid[]) with ordinality as i(id, token, n)
      join jsonb_array_elements(%(results)s::jsonb) with ordinality as r(result, n) using (n)
), free as materialized (
    {free_runs_sql("v", SETTLE_COLUMNS)}
), {settle_locks_sql("free")}, settled as (
    update only x_jobs j
       set state = 'done', result = nullif(v.result, 'null'::jsonb), visible_at = null,
           finished_at = now(), updated_at = now()
      from v
     where j.id = v.id and {by_key("free", "id not in (select id from stuck)")}
    returning j.id, j.lease_token, j.queue, j.name, {elapsed_ms_sql("j.started_at")} as run_ms
), tallied as (
    {count_sql("settled", done="count(*)", run_ms="array_agg(run_ms)", run_ms_sum="sum(run_ms)")}
)
select lease_token::text, true from settled
union all
select token::text, false from ({held_runs_sql("v", "settled")}) busy
""",
)

# The pair of a single-run write, as a CTE for free_runs_sql and held_runs_sql.
_ONE_RUN = "one as (select %(id)s::uuid as id, %(token)s::uuid as token)"

JOB_FAIL_IF_OWNED = Statement(
    "job_fail_if_owned",
    why="""
A run that raised: retry (`ready`, or `delayed` until the backoff's run_at) or `dead` once the
attempts are used up or the error is permanent. The choice is made here from the row, under the
same fence as the ack, so a run that lost the job cannot bury or revive it. last_error always
records this run's error. Locked as the ack locks (a child's burial counts its parent's step
row down): a row another transaction holds answers `busy`, and the worker writes it again later.
""",
    sql=f"""
with {_ONE_RUN}, free as materialized (
    {free_runs_sql("one", SETTLE_COLUMNS)}
), {settle_locks_sql("free")}, settled as (
    update only x_jobs
       set state       = case when %(permanent)s or attempt >= max_attempts then 'dead'
                              when %(delay_ms)s > 0 then 'delayed' else 'ready' end,
           run_at      = case when %(permanent)s or attempt >= max_attempts then run_at
                              else now() + %(delay_ms)s * interval '1 millisecond' end,
           finished_at = case when %(permanent)s or attempt >= max_attempts then now() end,
           visible_at  = null,
           last_error  = %(error)s,
           attempts    = {attempt_entry_sql("%(outcome)s::text", error="%(error)s::text")},
           updated_at  = now()
     where id = any(array(select id from free where id not in (select id from stuck)))
    returning id, state, queue, name, {elapsed_ms_sql("started_at")} as run_ms
), tallied as (
    {count_sql("settled", failed="count(*)", dead="count(*) filter (where state = 'dead')",
               run_ms="array_agg(run_ms)", run_ms_sum="sum(run_ms)")}
)
select state from settled
union all
select 'busy' from ({held_runs_sql("one", "settled")}) busy
""",
)

JOB_REQUEUE_IF_OWNED = Statement(
    "job_requeue_if_owned",
    why="""
Give a job back without spending an attempt (Snooze, graceful shutdown, a lost concurrency
slot): the attempt the claim counted is taken back, and so is its worker_ids entry, so attempts
count runs that really ran. A claim that resumed a suspended job counted nothing, so it returns
to `suspended` (its next claim will not count one either). Fenced like every worker write,
and locked as the ack locks: a row another transaction holds answers `busy`.
""",
    sql=f"""
with {_ONE_RUN}, free as materialized (
    {free_runs_sql("one")}
), moved as (
    update only x_jobs
       {REQUEUE_SET}
     where id = any(array(select id from free))
    returning id, state
)
select state from moved
union all
select 'busy' from ({held_runs_sql("one", "moved")}) busy
""",
)

# What job_give_back_unknown_if_owned reads of the row it gives back: the run's attempt entry,
# and the last entry, which tells a job that waits already from one that starts to.
_UNKNOWN_COLUMNS = "id, attempt, claimed_by, started_at, unknown_since, attempts->-1 as last"

JOB_GIVE_BACK_UNKNOWN_IF_OWNED = Statement(
    "job_give_back_unknown_if_owned",
    why="""
Give back a job whose name the claiming worker does not know (its code is not deployed there
yet: docs/deployment.md, "New job types before their workers"), like job_requeue_if_owned: no
attempt spent, so a rolling deploy that brings the code to web first buries nothing. It is due
again after as long as it has waited so far (at least a second, at most max_ms), times a random
factor between one half and one: the waits roughly double, and a worker that knows the name
waits for at most max_ms once it is deployed. The factor is what lets that worker in: without
it the job falls due a fixed time after the give-back, which is a whole number of poll
intervals of the worker that gave it back, so that worker's next claim lands just after the job
is due, every time, and one that knows the name, polling at a phase of its own, finds it taken
(tests/acceptance/test_unknown_jobs_worker.py lost that race round after round).

unknown_since is when the wait began: kept while the job's last attempt entry is this
give-back's (`unknown_job`), else now. Consecutive give-backs share one entry (its `tries`
counted, its last five `workers` kept), so a long wait does not push the runs out of the
job's attempt history. Fenced and locked like job_requeue_if_owned.
""",
    sql=f"""
with {_ONE_RUN}, free as materialized (
    {free_runs_sql("one", _UNKNOWN_COLUMNS)}
), w as (
    select f.*, coalesce(f.last->>'outcome' = 'unknown_job', false) as waiting,
           case when f.last->>'outcome' = 'unknown_job' then coalesce(f.unknown_since, now())
                else now() end as since
      from free f
), e as (
    select w.id, w.since, jsonb_strip_nulls(jsonb_build_object(
               'attempt', w.attempt, 'worker', w.claimed_by, 'started_at', w.started_at,
               'finished_at', now(), 'outcome', 'unknown_job', 'error', %(note)s::text,
               'since', w.since,
               'tries', case when w.waiting then coalesce((w.last->>'tries')::int, 1) + 1
                             else 1 end,
               'workers', (select jsonb_agg(k.x order by k.n)
                             from (select x, n
                                     from jsonb_array_elements(
                                              case when w.waiting
                                                   then coalesce(w.last->'workers', '[]'::jsonb)
                                                   else '[]'::jsonb end
                                              - coalesce(w.claimed_by, '?')
                                              || jsonb_build_array(coalesce(w.claimed_by, '?'))
                                          ) with ordinality as t(x, n)
                                    order by n desc limit 5) k))) as entry,
           w.waiting
      from w
), moved as (
    update only x_jobs j
       set state         = case when %(resumed)s::boolean then 'suspended' else 'delayed' end,
           attempt       = j.attempt - %(spent)s::boolean::int,
           worker_ids    = case when %(spent)s::boolean
                                then j.worker_ids - (jsonb_array_length(j.worker_ids) - 1)
                                else j.worker_ids end,
           unknown_since = e.since,
           run_at        = now() + least(%(max_ms)s::bigint,
                                         greatest(1000, {elapsed_ms_sql("e.since")}))
                                   * (0.5 + random() / 2) * interval '1 millisecond',
           visible_at    = null,
           last_error    = %(note)s,
           attempts      = case when e.waiting then jsonb_set(j.attempts, '{{-1}}', e.entry)
                                else xjobs_attempt_push(j.attempts, e.entry) end,
           updated_at    = now()
      from e
     where j.id = e.id
    returning j.id, j.state
)
select state from moved
union all
select 'busy' from ({held_runs_sql("one", "moved")}) busy
""",
)

JOB_SUSPEND_IF_OWNED = Statement(
    "job_suspend_if_owned",
    why="""
Park a running job until wake_at (a durable sleep or an event wait). `suspended` rows are in the
claim index and become eligible at run_at; their resume does not count an attempt. Fenced: a run
that lost the job cannot park it. Locked as the ack locks: a row another transaction holds
answers `busy` (the step's transaction is then rolled back and tried again; the run's own step
write earlier in it holds the row FOR SHARE, which does not stop this one).
""",
    sql=f"""
with {_ONE_RUN}, free as materialized (
    {free_runs_sql("one")}
), parked as (
    update only x_jobs
       set state = 'suspended', run_at = %(wake_at)s, visible_at = null, updated_at = now(),
           attempts = {attempt_entry_sql("'suspended'")}
     where id = any(array(select id from free))
    returning id
)
select id::text from parked
union all
select 'busy' from ({held_runs_sql("one", "parked")}) busy
""",
)

JOB_PROGRESS_IF_OWNED = Statement(
    "job_progress_if_owned",
    why="""
A run's ctx.progress(), fenced like every write of a run: a run that lost its job cannot
overwrite the progress of the run that has it. The worker sends at most one per second per run
(docs/observability.md, "Progress"); the column is in no index, so the update can be HOT and
leaves updated_at alone (progress is not a state change). A row another transaction holds is
not waited for: that report is skipped (`busy`), the next one writes.
""",
    sql=f"""
with {_ONE_RUN}, free as materialized (
    {free_runs_sql("one")}
), reported as (
    update only x_jobs
       set progress = jsonb_build_object('done', %(done)s::float8, 'total', %(total)s::float8,
                                         'message', %(message)s::text, 'at', now())
     where id = any(array(select id from free))
    returning id
)
select id::text from reported
union all
select 'busy' from ({held_runs_sql("one", "reported")}) busy
""",
)

JOBS_RENEW_IF_OWNED = Statement(
    "jobs_renew_if_owned",
    why="""
The heartbeat: renew every in-flight lease of a worker in ONE statement per interval, fenced
per run on (id, running, token). A run missing from the answer lost the job (cancelled from
outside, or re-claimed after a lapse): that run is stopped and its result discarded, because
continuing it is the double execution the lease exists to prevent. The answer is per TOKEN: a
stale run and the current run of one job in the same worker share the id, and an answer keyed
by id would renew both.

It never waits on a lock (docs/design.md, "Lock order"): the rows are locked first, in id
order, SKIP LOCKED. A row another transaction holds (a request's lock on it, an operator's
change not committed yet, the run's own step write) cannot be updated now, so its lease is
KEPT beside it instead, in x_lease_extensions (keyed by the run's token; `kept` in the answer):
the claim takes no lapsed lease whose extension still runs, so the run goes on and its row is
renewed at the first round it is free. One held row therefore delays none of the worker's
other leases, and never hands its run to another worker.
""",
    sql=f"""
with v as (
    {RUN_PAIRS}
), free as materialized (
    {free_runs_sql("v")}
), renewed as (
    update only x_jobs j
       set visible_at = now() + %(lease_ms)s * interval '1 millisecond', updated_at = now()
      from v
     where j.id = v.id and {by_key("free")}
    returning j.id, j.lease_token
), kept as (
    insert into x_lease_extensions as e (lease_token, job_id, until)
    select token, id, now() + %(lease_ms)s * interval '1 millisecond'
      from ({held_runs_sql("v", "renewed")}) held
    on conflict (lease_token) do update set until = excluded.until
    returning e.lease_token
)
select lease_token::text, true from renewed
union all
select lease_token::text, false from kept
""",
)

JOBS_FENCE_CHECK = Statement(
    "jobs_fence_check",
    why="""
Read after a fenced write matched fewer rows than it was given, to tell `lost` from `already
applied`: when the connection died after the server committed a write, the retry matches
nothing, yet the row carries this run's token in the state the write set. Only a run's own
writes leave its token on a non-running row (cancel and burial clear it), so the token decides.
`only x_jobs`: a job archived since (ARCHIVE_AFTER later) is not found here and reads as lost,
its result discarded; that job finished, and no history table is locked by a worker.
""",
    sql="""
select v.token::text, j.state, coalesce(j.lease_token = v.token, false)
  from unnest(%(ids)s::uuid[], %(tokens)s::uuid[]) as v(id, token)
  left join only x_jobs j on j.id = v.id
""",
)

# ------------------------------------------------------------------------------- operators --

JOB_CANCEL = Statement(
    "job_cancel",
    why="""
Stop a job from outside. Any state but `done` (nothing left to stop) and `cancelled` (already
stopped; a second cancel must not rewrite the first one's reason). A `running` job's worker
learns at its next heartbeat, which no longer matches: the token is cleared here, so its late
ack or nack reads as lost and the cancel is never undone by the run it stopped.
""",
    sql=f"""
with cancelled as (
    update x_jobs
       {cancel_set_sql("%(reason)s")}
     where id = %(id)s and state not in ('done', 'cancelled')
       and (%(tenant_ids)s::text[] is null or tenant_id = any(%(tenant_ids)s::text[]))
    returning {JOB_COLUMNS}
), tallied as (
    {count_sql("cancelled", cancelled="count(*)")}
)
select {JOB_COLUMNS} from cancelled
""",
)

def _cancel_tree_sql(*, skip: bool) -> str:
    """The text of jobs_cancel_tree (an operator's: it waits for the rows it locks, in the
    order of docs/design.md, "Lock order") and of jobs_cancel_tree_free (a worker's: it skips
    what another transaction holds, and answers how many it left)."""
    lock = "for no key update skip locked" if skip else "for no key update"
    if skip:
        settle = f"""{settle_locks_sql("locked")}, cancelling as (
    select id from locked where id not in (select id from stuck)
)"""
    else:
        settle = f"""steps_locked as materialized (
    select s.id
      from (select distinct p.run_id, l.parent_step as name
              from locked l join only x_jobs p on p.id = l.parent_id) q
      join only x_job_steps s on s.run_id = q.run_id and s.name = q.name
                            and s.status = 'invoking'
     order by s.run_id, s.name
       {lock} of s
), keys_locked as materialized (
    select k.id
      from x_job_keys k
      join locked l on k.name = l.name and k.tenant = coalesce(l.tenant_id, '')
                   and k.key = l.idempotency_key and k.job_id = l.id
     where l.unique_for_ms is not null
     order by k.id
       {lock} of k
), cancelling as (
    select id from locked
     where (select count(*) from steps_locked) + (select count(*) from keys_locked) >= 0
)"""
    return f"""
with recursive tree(id) as (
    select id from only x_jobs
     where (id = any(%(ids)s::uuid[]) or parent_id = any(%(parents)s::uuid[]))
       and state in {LIVE}
    union
    select c.id from only x_jobs c join tree t on c.parent_id = t.id
     where c.state in {LIVE}
), locked as materialized (
    select {SETTLE_COLUMNS} from only x_jobs
     where id in (select id from tree) and state in {LIVE}
     order by id
       {lock}
), {settle}, cancelled as (
    update only x_jobs
       {cancel_set_sql("%(reason)s")}
     where id in (select id from cancelling) and state in {LIVE}
    returning queue, name
), tallied as (
    {count_sql("cancelled", cancelled="count(*)")}
)
select (select count(*) from cancelled),
       (select count(*) from tree) - (select count(*) from cancelled)
"""


JOBS_CANCEL_TREE = Statement(
    "jobs_cancel_tree",
    why="""
Cancel live jobs and, through parent_id, their live descendants, in one statement: the live
children of a job an operator cancels (`parents`), or a cancel of the jobs themselves (`ids`).
Run BEFORE the parent's own cancel. It takes its locks in the order of docs/design.md ("Lock
order"): the jobs' rows by id, then their parents' step rows (which x_jobs_transition counts
down) by (run_id, name), then the key rows of their idempotency windows by id, then the update.
A parent woken by its last child's cancel is woken without waiting for its row (the trigger
skips a row another transaction holds; jobs_unblock wakes it then). A worker's statements never
wait for this statement's locks: they skip what it holds. Same changes as job_cancel, counters
included. The answer: how many it cancelled (and how many of the tree it did not: finished
meanwhile).
""",
    sql=_cancel_tree_sql(skip=False),
)

JOBS_CANCEL_TREE_FREE = Statement(
    "jobs_cancel_tree_free",
    why="""
jobs_cancel_tree for a worker (a parent whose invoke timed out cancels its children; a cron
round's cancel_previous): the same changes in the same lock order, SKIP LOCKED, so a worker
never waits on a job, step or key row another transaction holds (docs/design.md, "Lock order").
A job of the tree held elsewhere is left live; the answer says how many were cancelled and how
many were left, and the caller tries those again later.
""",
    sql=_cancel_tree_sql(skip=True),
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
select {JOB_COLUMNS}, case when %(notify)s then pg_notify('{CHANNEL}', queue) end from retried
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
    update only x_jobs
       set run_at = now(),
           state = case when state = 'delayed' then 'ready' else state end,
           updated_at = now()
     where id = %(id)s
       and (state in ('delayed', 'suspended') or (state = 'ready' and run_at > now()))
       and (%(tenant_ids)s::text[] is null or tenant_id = any(%(tenant_ids)s::text[]))
    returning {JOB_COLUMNS}
), ended_waits as (
    update only x_job_steps s
       set wake_at = now()
      from moved m
     where s.run_id = m.run_id and s.status in ('sleeping', 'waiting')
    returning 1
)
select {JOB_COLUMNS}, case when %(notify)s then pg_notify('{CHANNEL}', queue) end
  from moved
 where (select count(*) from ended_waits) >= 0
""",
)

# The live buckets, exclusive (queue_stats says why), as count columns of a grouped query.
LIVE_BUCKETS = """count(*) filter (where state = 'ready' and run_at <= now())    as ready,
       count(*) filter (where state = 'delayed'
                           or (state = 'ready' and run_at > now()))    as delayed,
       count(*) filter (where state = 'running')                      as running,
       count(*) filter (where state = 'suspended')                    as suspended,
       count(*) filter (where state = 'blocked')                      as blocked"""

QUEUE_STATS = Statement(
    "queue_stats",
    why="""
Per queue, six buckets a depth is SUMMED from, so a row must land in exactly one:
`ready` (ready and due), `delayed` (delayed, or ready but not yet due), `running`, `suspended`,
`blocked` (held back by flow control), `dead`; plus done and cancelled. A bare
`run_at > now()` would count a sleeping `suspended` job, or a dead one with a future run_at,
twice. Pinned by the property test
tests/conformance/test_stats.py.
Under a tenant scope (the console's ADMIN_TENANT_SCOPE) only those tenants' rows are counted.
""",
    sql=f"""
select queue,
       {LIVE_BUCKETS},
       count(*) filter (where state = 'dead')                                      as dead,
       count(*) filter (where state = 'done')                                      as done,
       count(*) filter (where state = 'cancelled')                                 as cancelled
  from x_jobs
 where (%(tenant_ids)s::text[] is null or tenant_id = any(%(tenant_ids)s::text[]))
 group by queue
 order by queue
""",
)

QUEUE_DEPTH = Statement(
    "queue_depth",
    why="""
The live buckets of queue_stats (ready and due, delayed, running, suspended, blocked) and the
age of each queue's oldest due job, read through the partial indexes that hold only live rows
(one arm per index, whose predicate each arm repeats): its cost follows the backlog, never the
history, unlike queue_stats, which counts finished rows too. The dashboard, `xjobs_queue_depth`
and `xjobs_oldest_ready_age_seconds` read it (docs/observability.md).
""",
    sql=f"""
select queue,
       {LIVE_BUCKETS},
       extract(epoch from now() - min(run_at) filter (where state = 'ready'
                                                        and run_at <= now()))::float8
  from (select queue, state, run_at from only x_jobs
         where state in ('ready', 'delayed', 'suspended')
           and (%(tenant_ids)s::text[] is null or tenant_id = any(%(tenant_ids)s::text[]))
        union all
        select queue, state, null from only x_jobs
         where state = 'running'
           and (%(tenant_ids)s::text[] is null or tenant_id = any(%(tenant_ids)s::text[]))
        union all
        select queue, state, null from only x_jobs
         where state = 'blocked'
           and (%(tenant_ids)s::text[] is null or tenant_id = any(%(tenant_ids)s::text[]))) l
 group by queue
 order by queue
""",
)

JOBS_UNKNOWN_WAITING = Statement(
    "jobs_unknown_waiting",
    why="""
The jobs that wait for a worker knowing their name (job_give_back_unknown_if_owned), per
queue and name: how many, since when the oldest waits and for how long on the database clock,
and the cron tasks that enqueued them. For the health panel, `xjobs_jobs_unknown` and the
worker's report past XJOBS["UNKNOWN_JOB_REPORT_AFTER"]. Read through the live rows (the claim
index's states) whose unknown_since is set, nearly none; the last attempt entry tells a job that
waits now from one that waited once and has run since.
""",
    sql="""
select queue, name, count(*)::bigint, min(unknown_since),
       extract(epoch from now() - min(unknown_since))::float8,
       coalesce(array_agg(distinct substr(enqueued_by, 6))
                  filter (where enqueued_by like 'cron:%%'), '{}'::text[])
  from only x_jobs
 where state in ('ready', 'delayed', 'suspended') and unknown_since is not null
   and attempts->-1->>'outcome' = 'unknown_job'
   and (%(names)s::text[] is null or name = any(%(names)s::text[]))
   and (%(tenant_ids)s::text[] is null or tenant_id = any(%(tenant_ids)s::text[]))
 group by queue, name
 order by min(unknown_since), queue, name
""",
)

# ------------------------------------------------------------------------ handed-back jobs --
# Batch forms for code that hands claimed jobs back itself (Job.objects.requeue /
# wake_refused, docs/managers.md). The worker no longer needs them: the claim does not take a
# job it may not run (docs/flow-control.md).

JOBS_WAKE_REFUSED = Statement(
    "jobs_wake_refused",
    why="""
Make jobs that a claim handed back (due later) due now, for code that hands claimed jobs back
itself and knows when they may run: Job.objects.wake_refused. The caller names each job
with the token of the claim it handed back: the hand-back leaves
that token on the row, and any later claim replaces it, so a job that was claimed again since
(and perhaps failed into a backoff, or snoozed) is not touched. Only rows still waiting
(`run_at > now()`) move. NOTIFY wakes the other workers of the queues, at most once per queue.
""",
    sql=f"""
with woken as (
    update only x_jobs j
       set run_at = now(), updated_at = now()
      from unnest(%(ids)s::uuid[], %(tokens)s::uuid[]) as v(id, token)
     where j.id = v.id and j.lease_token = v.token
       and j.state in ('ready', 'delayed', 'suspended') and j.run_at > now()
    returning j.queue
)
select (select count(*) from woken),
       {notify_queues_sql("woken")}
""",
)

JOBS_REQUEUE_IF_OWNED = Statement(
    "jobs_requeue_if_owned",
    why="""
job_requeue_if_owned for many runs in one statement (Job.objects.requeue of a batch): N jobs
handed back cost one round trip, not N. Same rule per run: the attempt the claim counted is
taken back (and its worker_ids entry), a resumed suspended job returns to `suspended`, and the
job is due again after its delay. Fenced per
run on (id, running, token), and locked as the ack locks. The answer is the tokens that
landed, and those whose row another transaction holds (busy: not written).
""",
    sql=f"""
with pairs as (
    {RUN_PAIRS}
), free as materialized (
    {free_runs_sql("pairs")}
), moved as (
update only x_jobs j
   set state      = case when v.resumed then 'suspended'
                         when v.delay_ms > 0 then 'delayed' else 'ready' end,
       attempt    = j.attempt - v.spent::int,
       worker_ids = case when v.spent
                         then j.worker_ids - (jsonb_array_length(j.worker_ids) - 1)
                         else j.worker_ids end,
       run_at     = now() + v.delay_ms * interval '1 millisecond',
       visible_at = null,
       last_error = coalesce(v.note, j.last_error),
       attempts   = {attempt_entry_sql("v.outcome", alias="j", error="v.note")},
       updated_at = now()
  from unnest(%(ids)s::uuid[], %(tokens)s::uuid[], %(delays_ms)s::bigint[],
              %(spent)s::boolean[], %(resumed)s::boolean[], %(notes)s::text[],
              %(outcomes)s::text[])
       as v(id, token, delay_ms, spent, resumed, note, outcome)
 where j.id = v.id and {by_key("free")}
returning j.id, j.lease_token
)
select lease_token::text, true from moved
union all
select token::text, false from ({held_runs_sql("pairs", "moved")}) busy
""",
)

# ---------------------------------------------------------------------------- test support --
# django_xjobs.testing (docs/testing.md): the inline test mode's claim of the one job it runs
# and travel()'s shift of due times. They run on the caller's connection like every statement,
# so inside a TestCase's transaction too.

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
    sql=f"""
with picked as (
    select id, state as prev_state
      from only x_jobs
     where id = %(id)s::uuid and state in ('ready', 'delayed', 'suspended') and run_at <= now()
       for update skip locked
), claimed as (
    update only x_jobs j
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
              p.prev_state = 'suspended' as resumed, {elapsed_ms_sql("j.run_at")} as wait_ms
), tallied as (
    {count_sql("claimed", started="count(*)", wait_ms="array_agg(wait_ms)",
               wait_ms_sum="sum(wait_ms)")}
)
select id, lease_token, name, queue, input, run_id, attempt, max_attempts, tenant_id,
       traceparent, concurrency_key, resumed
  from claimed
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
    update only x_jobs
       set run_at = run_at - %(shift_ms)s::bigint * interval '1 millisecond', updated_at = now()
     where state in ('ready', 'delayed', 'suspended')
    returning run_id
), waits as (
    update only x_job_steps s
       set wake_at = s.wake_at - %(shift_ms)s::bigint * interval '1 millisecond'
      from (select distinct run_id from moved) m
     where s.run_id = m.run_id and s.status in ('sleeping', 'waiting')
    returning 1
)
select count(*) from moved where (select count(*) from waits) >= 0
""",
)
