"""x_jobs: the claim, which leases due jobs to a worker and decides flow control on the way
(docs/design.md, "Claim").

JOBS_CLAIM is composed below from its stages, each a named group of CTEs with what it decides
and which locks it takes; the statement's own why gives the reasons behind the whole.
JOB_CLAIM_IF_DUE, the test kit's claim of one job, writes what the claim's due branch writes and
lives beside it so the two are changed together.
"""

from __future__ import annotations

from ...base import Statement
from .fragments import (
    SETTLE_COLUMNS,
    attempt_entry_sql,
    count_sql,
    elapsed_ms_sql,
    grant_slots_sql,
    key_limit_sql,
    settle_locks_sql,
)

# A lapsed lease ends its run in the attempt history: `lost`, when the lease ran out.
LAPSED_ENTRY = attempt_entry_sql("'lost'", alias="j", finished="j.visible_at")
# The waits, due to start, of the jobs a claim started (a rescued lease's job waited a whole
# lease, not in the queue: left out).
_WAITED = "filter (where state = 'running' and prev_state <> 'running')"
QUEUE_WAITS = f"array_agg({elapsed_ms_sql('run_at')}) {_WAITED}"
QUEUE_WAIT_SUM = f"coalesce(sum({elapsed_ms_sql('run_at')}) {_WAITED}, 0)"


# ------------------------------------------------------------------------ the tenant walk --


def _tenants_after(name: str, first: str, stop: str) -> str:
    """A loose index scan (x_jobs_fair_tenant_idx) over the tenants of queue w.queue with
    claimable jobs, ascending from the first one ``first`` admits, while ``stop`` holds. Each
    scan names ``coalesce(tenant_id, '') is not null``, the index's predicate (migration 0015:
    only a statement that names it can use the index)."""
    claimable = ("queue = w.queue and state in ('ready', 'delayed', 'suspended')"
                 " and coalesce(tenant_id, '') is not null")
    return f"""{name}(t) as (
                      (select coalesce(tenant_id, '') from only x_jobs
                        where {claimable}{first}
                        order by coalesce(tenant_id, '') limit 1)
                      union all
                      select (select coalesce(tenant_id, '') from only x_jobs
                               where {claimable}
                                 and coalesce(tenant_id, '') > {name}.t
                               order by coalesce(tenant_id, '') limit 1)
                        from {name} where {name}.t is not null{stop}
                  )"""


def tenant_walk_sql() -> str:
    """The tenants of a fair queue in the order a claim visits them (jobs_claim): those after
    the cursor w.cursor, then from the first one up to the cursor (the wrap)."""
    after = _tenants_after("after", " and coalesce(tenant_id, '') > w.cursor", "")
    wrap = _tenants_after("wrap", "", " and wrap.t < w.cursor")
    return f"""with recursive {after}, {wrap}
                  select t from after where t is not null
                  union all
                  select t from wrap where t is not null and t <= w.cursor"""


# ------------------------------------------------------------------------ the claim's stages --
# JOBS_CLAIM is one statement: the CTEs of the stages below, in this order, then ANSWER. Each
# stage says what it decides. None of them waits on a lock another transaction holds, and they
# take theirs in the one order of docs/design.md, "Lock order": the x_jobs rows of the jobs
# taken (1: RESCUES, DUE, FAIR_DUE, SKIP LOCKED); the rows the trigger x_jobs_transition writes
# when a rescue is buried, its parent's step row (2) and its window's key row (3), locked by
# RESCUES before any job changes; the parent's own row, which the trigger wakes only if it is
# free (4). Flow control's locks are its own and only ever tried: a rate key's advisory lock in
# key order (RATED), a slot's advisory lock and its x_job_leases row in (lease_key, slot) order
# (SLOTS). PostgreSQL runs a statement's CTEs as their rows are needed, not one after another,
# so the order below is the data's; the claim is in no deadlock whatever order its rows are read
# in, since each of its locks is taken SKIP LOCKED or only tried, and it keeps the lock order
# where a waiting statement relies on it: 2 and 3 are held before the update that fires the
# trigger (CLAIMED reads RESCUES' `lapsed`, which reads their locks).


# The claim's own transaction commits without waiting for its WAL to reach disk (the last
# paragraph of the why says why a claim lost in a crash is harmless). The answer reads it, so it
# runs once in every claim.
ASYNC_COMMIT = """async_commit as (
    select set_config('synchronous_commit', 'off', true)
)"""


# Which queues are scanned: those asked, with how many jobs each, whether it is fair, the
# worker's tenant cursor in it, and whether it has floors (docs/performance.md, "Under a held
# horizon"): `floored`, its due scans start at the floors of floor_values, per priority (the
# priorities scanned are those listed), and `lapsed_from` (NULL: none), the earliest lease
# expiry the rescue scan reads; a queue paused in x_flow_pauses (kind 'queue', no end or an end
# still ahead) is left out here, so none of its rows is read. Reads only.
WANTS = """wants as (
    select w.queue, w.n, w.fair, w.cursor, w.floored, w.lapsed_from
      from unnest(%(queues)s::text[], %(limits)s::int[], %(fair)s::boolean[],
                  %(cursors)s::text[], %(floored)s::boolean[],
                  %(lapsed_from)s::timestamptz[])
                as w(queue, n, fair, cursor, floored, lapsed_from)
     where not exists (select 1 from x_flow_pauses p
                        where p.kind = 'queue' and p.key = w.queue
                          and (p.until is null or p.until > now()))
)"""


# Which lapsed leases are taken back: per queue, the `running` rows whose lease ran out, oldest
# expiry first, at most the queue's n; a lease kept beside its held row (x_lease_extensions) has
# not lapsed while its extension runs. Lock order 1: these x_jobs rows, FOR UPDATE SKIP LOCKED.
# Those on their last attempt will be buried (`exhausted`): `burials` are the ones with a parent
# or an idempotency window, whose settle the trigger x_jobs_transition follows, and
# settle_locks_sql locks what it will write first, SKIP LOCKED, in the documented order (2: the
# parents' step rows by (run_id, name); 3: the window's key rows by id). `lapsed` leaves out the
# burials one of whose rows another transaction holds (`stuck`): a later claim buries them
# (tests/integration/test_lock_order.py pins both: a kept lease is not claimed, a lapsed child
# whose parent's step row is held is buried later).
RESCUES = f"""lapsed_rows as materialized (
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
             and visible_at >= coalesce(w.lapsed_from, '-infinity'::timestamptz)
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
)"""


# How many due jobs each queue may still take: its n less its rescues
# (tests/conformance/test_claim.py::test_lapsed_rows_count_towards_the_asked_number). A rescue
# takes its place first: its job waited a whole lease already. Reads only.
SHARES = """shares as (
    select w.queue, w.fair, w.cursor, w.floored,
           greatest(w.n - (select count(*) from lapsed l where l.queue = w.queue), 0) as share
      from wants w
)"""


# The due jobs of each queue that is not fair, in claim order (priority desc, run_at) up to its
# share: one bounded run_at scan per distinct priority, highest first, the priorities found by a
# loose index scan. Lock order 1: x_jobs rows, FOR UPDATE SKIP LOCKED (a row another
# transaction holds is passed over, never waited for:
# tests/conformance/test_claim.py::test_a_row_locked_by_another_session_is_skipped_not_waited_for).
DUE = """due as (
    -- Lapsed leases take their places first (they have waited a whole lease already), and the
    -- due scan fills what is left of each queue's share, in claim order, so a rescue never
    -- lets an older low-priority job pass a higher-priority one (tests/conformance/test_claim.py).
    --
    -- One bounded run_at scan per distinct priority of the queue, highest first (the priorities
    -- found by a loose index scan: one index probe each). A single scan in (priority, run_at)
    -- order cannot stop at the first row not yet due, since a lower priority follows it: with
    -- many delayed jobs and none due, an idle poll would read every one of them
    -- (docs/performance.md, "What the simpler forms cost").
    --
    -- With floors (a worker's claims while the database's horizon is held), each priority's
    -- scan starts at its floor, past the index entries of the jobs already claimed (dead, but
    -- not removable while the horizon is held), and the priorities are the worker's known
    -- ones instead of the loose scan, which would walk them all when the queue is empty.
    select c.*, w.queue
      from shares w
      cross join lateral (
          select d.id, d.prev_state, false as exhausted, d.name, d.concurrency_key, d.rate_key,
                 d.priority, d.run_at
            from (with recursive prio(p) as (
                      (select priority from only x_jobs
                        where not w.floored
                          and queue = w.queue and state in ('ready', 'delayed', 'suspended')
                        order by priority desc limit 1)
                      union all
                      select (select priority from only x_jobs
                               where queue = w.queue
                                 and state in ('ready', 'delayed', 'suspended')
                                 and priority < prio.p
                               order by priority desc limit 1)
                        from prio where prio.p is not null)
                  select p, null::timestamptz as floor from prio where p is not null
                  union all
                  select k.p, k.floor
                    from unnest(%(floor_queues)s::text[], %(floor_priorities)s::int[],
                                %(floor_values)s::timestamptz[]) as k(queue, p, floor)
                   where w.floored and k.queue = w.queue
                  order by p desc) pr
            cross join lateral (
                select id, state as prev_state, name, concurrency_key, rate_key, priority, run_at
                  from only x_jobs
                 where queue = w.queue and state in ('ready', 'delayed', 'suspended')
                   and priority = pr.p and run_at <= now()
                   and run_at >= coalesce(pr.floor, '-infinity'::timestamptz)
                 order by run_at
                 limit w.share
                   for update skip locked
            ) d
           limit w.share
      ) c
     where not w.fair
)"""


# The due jobs of each fair queue (fair_by = "tenant"): `fair_tenants` walks the tenants with
# claimable jobs from the worker's cursor round (tenant_walk_sql, at most `share` of them, with
# their weights); `fair_due` deals the share out in rounds, each tenant taking up to its weight
# per round in claim order (tests/integration/test_fair_share.py). Lock order 1, as DUE: x_jobs
# rows, FOR UPDATE SKIP LOCKED.
FAIR_DUE = f"""fair_tenants as materialized (
    -- The tenants of each fair queue after the cursor, then from the first one up to the
    -- cursor (the wrap): at most `share` of them, each visited once
    -- (x_jobs_fair_tenant_idx: the walk is lazy and stops there). `pos` is the order of the
    -- visit.
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
)"""


# Every job the claim holds a row lock on: the rescues first, then the due jobs. `tokens` draws
# the fresh lease token of each one that is to run (materialized, so a token is drawn once: the
# same one names the run in its slot's holder and in its row).
PICKED = """picked as (
    select id, prev_state, exhausted, name, concurrency_key, rate_key from lapsed
    union all
    select id, prev_state, exhausted, name, concurrency_key, rate_key from due
    union all
    select id, prev_state, exhausted, name, concurrency_key, rate_key from fair_due
), tokens as materialized (
    select id, gen_random_uuid() as token from picked where not exhausted
)"""


# Which picked jobs flow control applies to: those with a concurrency or a rate-limit key (a
# batch without any skips everything up to HELD), each with its paused key (x_flow_pauses, kind
# 'key'), its slot limit (key_limit_sql) and its rate budget. Reads only.
GATED = f"""gated as (
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
)"""


# The rate budgets spent: the gated jobs that are not paused and carry a budget, in ONE call
# of xjobs_rate_take (routines.py) with `wait` false. It tries each key's advisory lock in key
# order; a key another transaction is spending is not waited for, and its jobs are answered due
# a tenth of a second on (tests/integration/test_lock_order.py: a claim never waits on a rate
# key a user's transaction is spending). A row with next_at NULL was granted; any other is over
# budget.
RATED = """spending as (
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
)"""


# The concurrency slots taken: `slot_req` lists the jobs that need one now (not paused, their
# budget, if any, granted), ranked within their key lowest limit first; grant_slots_sql takes
# the lowest free slot under each one's own limit, trying each slot's advisory lock and writing
# x_job_leases rows in (lease_key, slot) order, SKIP LOCKED: a slot being acquired elsewhere is
# not offered, never waited for (tests/integration/test_lock_order.py: a claim never waits on a
# slot a user's transaction is acquiring).
SLOTS = f"""slot_req as (
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
), {grant_slots_sql("slot_req", "%(slot_ttl_ms)s")}"""


# What flow control holds back, and its write: `held` are the gated jobs paused or left without
# a slot (blocked on that key) and those over budget; `holding` writes their rows, already
# locked by this statement. One blocked on a key goes to `blocked` (or, while the fleet may not
# park, `park` false: x_fleet, back to `delayed` or `suspended`, due a poll interval later); one
# over budget goes back to `delayed` or `suspended`, due when its budget frees. A held job keeps
# its attempt; a held rescue's lapsed run gets its `lost` entry and loses its token.
HELD = f"""held as (
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
)"""


# The claim itself: `admitted` are the picked jobs not held back, each with its token and slot;
# `claimed` writes them through the primary key: `running` under a fresh lease, or `dead`, token
# cleared, for a rescue whose attempt was the last. A burial fires x_jobs_transition, which finds
# lock order 2 and 3 already held by this statement (RESCUES) and wakes the parent (4) only if
# no other transaction holds its row.
CLAIMED = f"""admitted as (
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
)"""


# The counters' deltas: the starts with their waits, and the burials.
TALLIED = f"""tallied as (
    -- The starts with their waits (QUEUE_WAITS), and the jobs a lapsed last attempt buried.
    {count_sql("claimed", started="count(*) filter (where state = 'running')",
               dead="count(*) filter (where state = 'dead')",
               wait_ms=QUEUE_WAITS, wait_ms_sum=QUEUE_WAIT_SUM)}
)"""


# What the scans found, per queue, before flow control or a burial took anything out: the
# queues scanned (a paused one is not), the rows the rescue scan read and those it took (the
# taken ones count against the share), and per priority of the due scan how many rows it took,
# the last one's run_at and whether any carried a concurrency or rate key. A worker's floors
# follow these (worker/floors.py); JSON, built only when the worker asks (`scans`: while its
# floors are on).
SCANS = """case when %(scans)s then json_build_object(
    'queues', (select coalesce(json_agg(queue), '[]') from wants),
    'lapsed', (select coalesce(json_object_agg(queue, n), '{}')
                 from (select queue, count(*) as n from lapsed_rows group by queue) l),
    'taken', (select coalesce(json_object_agg(queue, n), '{}')
                from (select queue, count(*) as n from lapsed group by queue) t),
    'due', (select coalesce(json_agg(json_build_array(queue, priority, n, last, keyed)), '[]')
              from (select queue, priority, count(*) as n, max(run_at) as last,
                           bool_or(concurrency_key is not null or rate_key is not null) as keyed
                      from due group by queue, priority) d)
)::text end"""


# The answer: one row per job that runs, then one row without a job: how many jobs flow
# control held back, the earliest due time of those over budget, the database's now() (on
# which the worker measures its wait and sets its floors) and what the scans found (SCANS).
ANSWER = f"""
select id::text, lease_token::text, name, queue, input, run_id::text, attempt, max_attempts,
       tenant_id, traceparent, concurrency_key, resumed, slot, slot_limit, null::timestamptz,
       0::bigint, null::timestamptz, parent_id::text, null::text
  from claimed
 where state = 'running' and (select count(*) from async_commit) = 1
union all
select null, null, null, null, null, null, null, null, null, null, null, null, null, null,
       (select min(next_at) from rated where next_at is not null), h.n, now(), null,
       {SCANS}
  from (select count(*) as n from holding) h
"""


# The claim's stages in the order JOBS_CLAIM writes them, each a group of CTEs.
CLAIM_STAGES = (ASYNC_COMMIT, WANTS, RESCUES, SHARES, DUE, FAIR_DUE, PICKED, GATED, RATED, SLOTS,
                HELD, CLAIMED, TALLIED)

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
Floors (docs/performance.md, "Under a held horizon"): while a backup, a report or a replica's
feedback holds the database's horizon, no index entry of a job claimed since can be removed or
marked dead, and a scan from the start of its range walks them all (a claim of an empty queue
read every one). A worker then sends, per queue, where its last claims' scans stopped
(`floor_values`, per priority, with the priorities it knows; `lapsed_from`), a second or two
back for transactions that commit late; the scans start there. The answer's last row says what
the scans read (`scans`), which the floors follow. What the floors cannot see (a job made due
with an older run_at, a priority the worker does not know) is claimed by the queue's next claim
without floors, which a worker sends every half minute per queue.
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
    sql="\nwith " + ", ".join(CLAIM_STAGES) + ANSWER,
)

# ----------------------------------------------------------------------------- test support --
# django_xjobs.testing (docs/testing.md): the inline test mode's claim of the one job it runs.

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
