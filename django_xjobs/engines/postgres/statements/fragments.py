"""SQL written once and composed into the statements of several families.

Only text lives here, never a Statement: the channel every job NOTIFY names, the live states,
the column list of a whole job row, and the insert the enqueue statements share.
"""

from __future__ import annotations

import textwrap

from ....conf import DEBOUNCE_PREFIX
from ....records import HISTOGRAM_BOUNDS_MS

# The channel of enqueue wake-ups: every job NOTIFY names it (its payload is the queue), and a
# worker's listener LISTENs on it. The outbox has a channel of its own (outbox.OUTBOX_CHANNEL).
CHANNEL = "xjobs"

LIVE = "('ready', 'delayed', 'running', 'suspended', 'blocked')"

# Column list of a whole job row, decoded by rows.job_record (engines/postgres/rows.py) in
# this order.
JOB_COLUMNS = (
    "id, name, queue, input, idempotency_key, run_id, attempt, max_attempts, state, run_at,"
    " visible_at, claimed_by, last_error, tenant_id, traceparent, enqueued_by, created_at,"
    " updated_at, priority, result, lease_token, concurrency_key, started_at, finished_at,"
    " rescues, worker_ids, attempts, progress, parent_id, parent_step, unique_for_ms"
)

# ---------------------------------------------------------------------------------- enqueue --
# job_enqueue and jobs_enqueue (enqueue.py) say why these are written as they are.

# The conflict target of a keyed enqueue: the partial unique index over the live states, with
# the tenant as coalesce(tenant_id, '') and without the rows keyed by their own id.
ON_LIVE_KEY_CONFLICT = f"""    on conflict (name, (coalesce(tenant_id, '')), idempotency_key)
       where state in {LIVE}
         and not (idempotency_key = id::text)
       do nothing"""


def insert_job_sql(key: str, *, indent: str = "", window: str = "") -> str:
    """The insert of one job (job_enqueue, job_enqueue_unkeyed): ``key`` is the SQL of its
    idempotency key, the caller's or the job's own id. The job is ``delayed`` while its run_at
    (the given time, or now() plus the delay) is in the future, else ``ready``.

    ``window`` (job_enqueue_windowed): the name of the CTE that took the key's row in
    x_job_keys; the job gets %(job_unique_for_ms)s and is inserted only if that CTE took it."""
    columns = ", unique_for_ms" if window else ""
    values = ", %(job_unique_for_ms)s::bigint" if window else ""
    only_if = f"\n where exists (select 1 from {window})" if window else ""
    return textwrap.indent(f"""insert into x_jobs
    (id, name, queue, input, idempotency_key, run_id, max_attempts, priority, state, run_at,
     tenant_id, traceparent, enqueued_by, concurrency_key, rate_key{columns})
select %(id)s::uuid, %(name)s, %(queue)s, %(input)s::jsonb, {key},
       %(run_id)s::uuid, %(max_attempts)s::int, %(priority)s::int,
       case when t.run_at > now() then 'delayed' else 'ready' end, t.run_at,
       %(tenant_id)s, %(traceparent)s, %(enqueued_by)s, %(concurrency_key)s, %(rate_key)s{values}
  from (select coalesce(%(run_at)s::timestamptz,
                        now() + %(delay_ms)s * interval '1 millisecond') as run_at) t{only_if}""",
                           indent)


def enqueue_one_sql(key: str, on_conflict: str = "") -> str:
    """The text of job_enqueue (``key`` the caller's, ``on_conflict`` the live-key target) and
    of job_enqueue_unkeyed (``key`` the job's own id, no conflict target): the insert, its
    count, and the NOTIFY of a job due now."""
    conflict = f"\n{on_conflict}" if on_conflict else ""
    return f"""
with inserted as (
{insert_job_sql(key, indent='    ')}{conflict}
    returning id, run_id, state, queue, name
), tallied as (
    {count_sql("inserted", enqueued="count(*)")}
)
select id, run_id, state,
       case when %(notify)s and state = 'ready' then pg_notify('{CHANNEL}', queue) end
  from inserted
"""


def enqueue_batch_sql(key: str, on_conflict: str = "", *, children: bool = False) -> str:
    """The text of jobs_enqueue (``key`` the item's, ``on_conflict`` the live-key target), of
    jobs_enqueue_unkeyed (``key`` the job's own id, no conflict target) and, with ``children``,
    of jobs_enqueue_children (every row also names the parent job and its waiting step)."""
    conflict = f"\n{on_conflict}" if on_conflict else ""
    parent_columns = ", parent_id, parent_step" if children else ""
    parent_values = ", %(parent_id)s::uuid, %(parent_step)s::text" if children else ""
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
         tenant_id, traceparent, enqueued_by, concurrency_key, rate_key{parent_columns})
    select r.id, r.name, r.queue, r.input, {key}, r.run_id, r.max_attempts,
           r.priority, case when t.run_at > now() then 'delayed' else 'ready' end, t.run_at,
           r.tenant_id, r.traceparent, r.enqueued_by, r.concurrency_key, r.rate_key{parent_values}
      from rows r
      cross join lateral (
          select coalesce(r.run_at, now() + r.delay_ms * interval '1 millisecond') as run_at
      ) t{conflict}
    returning id, state, queue, name
), tallied as (
    {count_sql("inserted", enqueued="count(*)")}
), notified as (
    select pg_notify('{CHANNEL}', q.queue)
      from (select distinct queue from inserted where state = 'ready') q
     where %(notify)s
)
select id, state from inserted where (select count(*) from notified) >= 0
"""


# ------------------------------------------------------------------------------- lock order --
# docs/design.md, "Lock order": a worker's statement never waits on a row another transaction
# holds. It locks the rows it writes with SKIP LOCKED, in one order (x_jobs by id, then the step
# rows of their parents by (run_id, name)), writes those, and answers the rest as busy: still
# its run's in the statement's snapshot, but held elsewhere; it writes them again later.


# The (id, token) pairs of a batch of runs, for free_runs_sql and held_runs_sql.
RUN_PAIRS = "select * from unnest(%(ids)s::uuid[], %(tokens)s::uuid[]) as p(id, token)"


def run_owner_sql(lock: str) -> str:
    """The CTE ``owner`` of a run's write that commits with other writes (a step, a backfill
    batch): the job's row, still this run's, locked with ``lock`` (``for share``, ``for
    update``) SKIP LOCKED until the write's transaction ends, and ``busy``, the expression that
    says the write found it held by another transaction. The probe names the key and the token
    only (`offset 0` keeps `state = 'running'` out of it: free_runs_sql says why)."""
    return f"""owner as materialized (
    select o.id from (select id, state from only x_jobs
                       where id = %(job_id)s::uuid and lease_token = %(token)s::uuid
                      offset 0
                         {lock} skip locked) o
     where o.state = 'running'
)"""


# Not written because another transaction holds the job's row, which is still the run's (with
# run_owner_sql's ``owner``).
RUN_OWNER_BUSY = """(not exists (select 1 from owner)
        and coalesce((select state = 'running' from only x_jobs
                       where id = %(job_id)s::uuid and lease_token = %(token)s::uuid
                      offset 0), false))"""


def slot_holds_sql(lock: str, *, live: bool) -> str:
    """The CTEs ``v``, the slot holds of %(keys)s, %(slots)s, %(holders)s, and ``free``, the
    ids of their rows (``live``: unexpired only) locked with ``lock`` SKIP LOCKED in
    (lease_key, slot) order."""
    unexpired = "\n     where l.expires_at > now()" if live else ""
    return f"""v as (
    select * from unnest(%(keys)s::text[], %(slots)s::int[], %(holders)s::text[])
           as v(lease_key, slot, holder)
), free as materialized (
    select l.id from x_job_leases l
      join v on l.lease_key = v.lease_key and l.slot = v.slot and l.holder = v.holder{unexpired}
     order by l.lease_key, l.slot
       {lock} of l skip locked
)"""


def free_runs_sql(pairs: str, columns: str = "id") -> str:
    """The ``running`` rows of the runs of the CTE ``pairs`` (id, token), ``columns`` (and
    ``state``) of each, that no other transaction holds: locked one primary-key probe at a time,
    in the order of ``pairs`` (the engine sends them in id order), SKIP LOCKED: a row held
    elsewhere is skipped, never waited for. The probe names the key and the token only, and
    `offset 0` keeps `state = 'running'` out of it: given the state, a planner whose statistics
    count few running rows probes the partial index of running rows instead, and reads every
    one of them for each run of the batch. A row it locked that is no longer running (its job
    finished or was cancelled since the snapshot) is left out."""
    return f"""select f.* from {pairs} p
      cross join lateral (
          select {columns}, state from only x_jobs
           where id = p.id and lease_token = p.token
          offset 0
             for no key update skip locked) f
     where f.state = 'running'"""


def by_key(rows: str, where: str = "true") -> str:
    """``j.id = any(array(...))`` of the ids of the CTE ``rows`` that ``where``: how a write
    reaches rows a CTE chose (and locked) through the primary key. The planner cannot estimate a
    CTE, and joined to it the write could walk an index of every running row (or hash the
    table) instead (docs/performance.md, "What the simpler forms cost"). The rows are this
    transaction's, locked with their token and state checked: the write repeats neither, which
    would let the planner pick the partial index of running rows again."""
    return f"j.id = any(array(select id from {rows} where {where}))"


def held_runs_sql(pairs: str, done: str) -> str:
    """The runs of the CTE ``pairs`` (id, token) whose row is still theirs and running in the
    statement's snapshot, but that the CTE ``done`` (id) did not write: another transaction
    holds the row (or, for a child, its parent's step row). One primary-key probe each."""
    return f"""select p.id, p.token from {pairs} p
     where p.id not in (select id from {done})
       and (select j.state = 'running' from only x_jobs j
             where j.id = p.id and j.lease_token = p.token offset 0)"""


# What settle_locks_sql needs of each row it settles.
SETTLE_COLUMNS = "id, parent_id, parent_step, name, tenant_id, idempotency_key, unique_for_ms"


def settle_locks_sql(rows: str) -> str:
    """The rows the trigger x_jobs_transition writes when the jobs of ``rows`` (a CTE of
    SETTLE_COLUMNS, already locked) enter or leave a finished state, locked here first, SKIP
    LOCKED, so the trigger finds them held by this statement and never waits: ``steps_locked``,
    the invoke step rows of the parents of the children among them (counted down), in (run_id,
    name) order; ``keys_locked``, the x_job_keys rows of the jobs enqueued with an idempotency
    window (their finish is recorded); and ``stuck``, the jobs one of whose rows another
    transaction holds (a parent checking its children, an operator's cancel of the family, an
    enqueue taking the key), left for a later write. Every look into x_jobs, x_job_steps and
    x_job_keys is an index probe per row (`offset 0` keeps the planner from turning it into a
    join it could hash), and rows without a parent or a window read nothing more."""
    return f"""parents as materialized (
    select r.id, p.run_id, r.parent_step
      from {rows} r
      cross join lateral (select run_id from only x_jobs where id = r.parent_id offset 0) p
     where r.parent_id is not null
), steps_locked as materialized (
    select s.run_id, s.name
      from (select distinct run_id, parent_step from parents order by 1, 2) q
      cross join lateral (
          select run_id, name from only x_job_steps
           where run_id = q.run_id and name = q.parent_step and status = 'invoking'
             for no key update skip locked) s
), keys_locked as materialized (
    select r.id
      from (select * from {rows} where unique_for_ms is not null order by id) r
      cross join lateral (
          select id from x_job_keys
           where name = r.name and tenant = coalesce(r.tenant_id, '')
             and key = r.idempotency_key and job_id = r.id
             for no key update skip locked) k
), stuck as (
    select q.id from parents q
     where not exists (select 1 from steps_locked c
                        where c.run_id = q.run_id and c.name = q.parent_step)
       and exists (select 1 from only x_job_steps s
                    where s.run_id = q.run_id and s.name = q.parent_step
                      and s.status = 'invoking'
                   offset 0)
    union all
    select r.id from {rows} r
     where r.unique_for_ms is not null and r.id not in (select id from keys_locked)
       and exists (select 1 from x_job_keys k
                    where k.name = r.name and k.tenant = coalesce(r.tenant_id, '')
                      and k.key = r.idempotency_key and k.job_id = r.id
                   offset 0)
)"""


# ---------------------------------------------------------------------------- observability --
# docs/observability.md: a run's entry in its job's attempt history, and the counters' deltas,
# written by the statement that changes the job's state (no statement of their own).


def attempt_entry_sql(outcome: str, *, alias: str = "", error: str = "null",
                      finished: str = "now()") -> str:
    """The job's ``attempts`` with the entry of the run that ends now appended (the SQL
    function xjobs_attempt_push keeps the first and the newest 20). ``alias`` qualifies the
    row's columns; in an UPDATE's SET they are the row as it was, so the entry reads the run's
    own attempt, worker and start. An entry leaves out what it has no value for."""
    a = f"{alias}." if alias else ""
    return (f"xjobs_attempt_push({a}attempts, jsonb_strip_nulls(jsonb_build_object("
            f"'attempt', {a}attempt, 'worker', {a}claimed_by, 'started_at', {a}started_at, "
            f"'finished_at', {finished}, 'outcome', {outcome}, 'error', {error})))")


def cancel_set_sql(reason: str) -> str:
    """The SET clause of a cancel (job_cancel, jobs_cancel_tree): ``cancelled``, the lease token
    cleared so the stopped run's late ack or nack reads as lost, ``reason`` (SQL) as the last
    error when given, and the entry of the run it stops when the job was running."""
    return f"""set state = 'cancelled', visible_at = null, lease_token = null, finished_at = now(),
           last_error = coalesce({reason}, last_error), updated_at = now(),
           -- the run it stops (if running) ends `cancelled`
           attempts = case when state = 'running'
                           then {attempt_entry_sql("'cancelled'", error=f"{reason}::text")}
                           else attempts end"""


def elapsed_ms_sql(since: str) -> str:
    """Milliseconds from ``since`` to now(), rounded up, never negative: a wait or a run time."""
    return f"greatest(0, ceil(extract(epoch from now() - {since}) * 1000))::bigint"


# The counters of x_stat_deltas and x_stats (beside the waits and run times).
COUNTER_COLUMNS = ("enqueued", "started", "done", "failed", "dead", "cancelled")


def count_sql(rows: str, **counts: str) -> str:
    """The insert of the counters' deltas for the CTE ``rows`` (which has ``queue`` and
    ``name``): one x_stat_deltas row per queue and job name, each ``column=SQL aggregate``
    given (the counters, and the waits or run times with their sum); groups whose counters are
    all zero are left out."""
    columns = ", ".join(counts)
    values = ", ".join(counts.values())
    nonzero = " or ".join(f"{v} > 0" for k, v in counts.items() if k in COUNTER_COLUMNS)
    return f"""insert into x_stat_deltas (queue, name, {columns})
    select queue, name, {values}
      from {rows}
     group by queue, name
    having {nonzero}"""


def histogram_ctes(name: str, source: str, keys: str, values: str) -> str:
    """Two CTEs: ``{name}_counts`` and ``{name}``, the latter one row per group ``keys`` (a
    column list) of the CTE ``source`` with ``hist``, the counts per bucket of
    records.HISTOGRAM_BOUNDS_MS (not cumulative) of the values of the array column ``values``:
    bucket i counts bound[i-1] < v <= bound[i] (width_bucket of v - 1 over the integer bounds),
    the last one the values above every bound. One width_bucket and one hashed count per value,
    then the groups' buckets laid out in order with the empty ones as 0."""
    bounds = "'{" + ",".join(str(b) for b in HISTOGRAM_BOUNDS_MS) + "}'::bigint[]"
    on = " and ".join(f"c.{k} = g.{k}" for k in keys.split(", "))
    return f"""{name}_counts as (
    select {keys}, width_bucket(v - 1, {bounds}) as b, count(*) as n
      from {source} cross join unnest({values}) as v
     group by {keys}, b
), {name} as (
    select {", ".join(f"g.{k}" for k in keys.split(", "))},
           array_agg(coalesce(c.n, 0) order by s.b) as hist
      from (select distinct {keys} from {name}_counts) g
      cross join generate_series(0, {len(HISTOGRAM_BOUNDS_MS)}) as s(b)
      left join {name}_counts c on {on} and c.b = s.b
     group by {", ".join(f"g.{k}" for k in keys.split(", "))}
)"""


# ------------------------------------------------------------------------------ give back --

# A run gives its job back without spending an attempt (job_requeue_if_owned says why):
# the attempt the claim counted and its worker_ids entry are taken back, unless the claim was a
# resume; due after %(delay_ms)s. Fenced by the caller's WHERE on (id, token, running).
REQUEUE_SET = f"""set state      = case when %(resumed)s::boolean then 'suspended'
                         when %(delay_ms)s > 0 then 'delayed' else 'ready' end,
       attempt    = attempt - %(spent)s::boolean::int,
       worker_ids = case when %(spent)s::boolean
                         then worker_ids - (jsonb_array_length(worker_ids) - 1)
                         else worker_ids end,
       run_at     = now() + %(delay_ms)s * interval '1 millisecond',
       visible_at = null,
       last_error = coalesce(%(note)s, last_error),
       attempts   = {attempt_entry_sql("%(outcome)s::text", error="%(note)s::text")},
       updated_at = now()"""

# ----------------------------------------------------------------------------- flow control --
# docs/flow-control.md; jobs_claim, slots_acquire, slots_release_if_held, jobs_unblock and
# pause_resume_key say why each of these is written as it is.

# The state a blocked job goes back to when woken: `suspended` for a durable run's resume.
WAKE_SET = """set state          = case when blocked_resume then 'suspended' else 'ready' end,
           blocked_on     = null,
           blocked_resume = false,
           updated_at     = now()"""


def wake_blocked_sql(room: str, key: str, count: str, *, started: str = "") -> str:
    """The update that wakes, for each row of the CTE ``room``, up to its ``count`` jobs
    blocked on its ``key``, in claim order (x_jobs_blocked_idx), skipping rows another
    transaction holds and those of the CTE ``started`` (job_id: the jobs this statement starts
    itself, whose rows it holds); it returns their queues (for the NOTIFY). The rows are
    reached through the primary key only (by_key says why): locked `blocked` by the scan (its
    lock re-checks the state of a row changed since the snapshot), they cannot change before
    the update, and a state test beside the ids would let the planner walk the whole
    x_jobs_blocked_idx instead (its statistics, taken before a backlog was blocked, make it
    look empty)."""
    own = (f"\n                        and id not in (select job_id from {started})"
           if started else "")
    return f"""update only x_jobs j
       {WAKE_SET}
     where j.id = any(array(
               select b.id
                 from {room} r
                 cross join lateral (
                     select id from only x_jobs
                      where state = 'blocked' and blocked_on = r.{key}{own}
                      order by priority desc, run_at
                      limit greatest(r.{count}, 0)
                        for update skip locked) b))
    returning j.queue"""


def notify_queues_sql(rows: str) -> str:
    """One NOTIFY per distinct queue of the CTE ``rows`` (when %(notify)s), as a count."""
    return f"""(select count(pg_notify('{CHANNEL}', q.queue))
          from (select distinct queue from {rows}) q
         where %(notify)s)"""


def key_limit_sql(key: str, name: str) -> str:
    """The concurrency limit of the key ``key`` for a job named ``name``: 1 for a debounce
    key, else the longest matching prefix of %(prefixes)s (XJOBS["CONCURRENCY_LIMITS"]), else
    the job's own (%(limit_names)s), else 1."""
    return f"""case when starts_with({key}, '{DEBOUNCE_PREFIX}') then 1
                else coalesce(
                    (select x.lim
                       from unnest(%(prefixes)s::text[], %(prefix_limits)s::int[])
                            as x(prefix, lim)
                      where starts_with({key}, x.prefix)
                      order by length(x.prefix) desc limit 1),
                    (select x.lim
                       from unnest(%(limit_names)s::text[], %(limit_values)s::int[])
                            as x(name, lim)
                      where x.name = {name} limit 1),
                    1) end"""


def grant_slots_sql(req: str, ttl: str) -> str:
    """The CTEs ``wanted``, ``free``, ``counted``, ``placed``, ``inserted``, ``reclaimed`` and
    ``granted`` that take the lowest free slot under its own limit for each row of the CTE
    ``req`` (lease_key, lim, holder, pos, ord: its rank among the requests of its key, lowest
    limit first), with the expiry now() + ``ttl`` ms; ``granted`` returns (lease_key, slot,
    holder).

    Never waits on another transaction (docs/design.md, "Lock order"): a slot counts as free
    only if no live row holds it AND this transaction gets its transaction-scoped advisory
    lock at once (pg_try_advisory_xact_lock), which every grant takes before it writes a slot,
    so two grants never write one slot at the same time and an insert never waits on another's
    uncommitted row of it; a slot with no row is inserted with `on conflict do nothing` (a row
    committed since this statement's snapshot: refused, not locked), and a slot whose row
    expired is taken back through a lock taken SKIP LOCKED. A slot refused so costs a poll
    interval, never a wait and never an over-grant."""
    return f"""wanted as (
    select lease_key, max(lim) as lim, count(*) as n from {req} group by lease_key
), free as (
    select w.lease_key, f.slot, f.rank, f.lapsed
      from wanted w
      cross join lateral (
          -- The probe walks the slots upwards and stops at the n-th free one (generate_series
          -- yields them in order: the rank is numbered after the limit, so no sort makes the
          -- probe, and its lock attempts, run over every slot of the limit).
          select g.slot, row_number() over (order by g.slot) - 1 as rank,
                 (select l.id from x_job_leases l
                   where l.lease_key = w.lease_key and l.slot = g.slot) as lapsed
            from (select s.slot
                    from generate_series(0, w.lim - 1) as s(slot)
                   where case when exists (select 1 from x_job_leases l
                                            where l.lease_key = w.lease_key
                                              and l.slot = s.slot and l.expires_at > now())
                              then false
                              else pg_try_advisory_xact_lock(
                                       hashtextextended('xjobs:slot:' || w.lease_key, s.slot))
                         end
                   limit w.n) g
      ) f
), counted as (
    select q.lease_key, q.lim, q.holder, q.ord, q.pos,
           (select count(*) from free f
             where f.lease_key = q.lease_key and f.slot < q.lim) as below
      from {req} q
), placed as (
    select c.lease_key, c.holder, c.below,
           c.pos + least(0, coalesce(min(c.below - c.pos - 1) over (
               partition by c.lease_key order by c.lim, c.ord
               rows between unbounded preceding and 1 preceding), 0)) as rank
      from counted c
), chosen as materialized (
    select p.lease_key, f.slot, p.holder, f.lapsed
      from placed p
      join free f on f.lease_key = p.lease_key and f.rank = p.rank
     where p.rank < p.below
), inserted as (
    insert into x_job_leases (lease_key, slot, holder, expires_at)
    select lease_key, slot, holder, now() + {ttl}::bigint * interval '1 millisecond'
      from chosen
     where lapsed is null
     order by lease_key, slot
    on conflict (lease_key, slot) do nothing
    returning lease_key, slot, holder
), reclaimed as (
    update x_job_leases l
       set holder = c.holder, expires_at = now() + {ttl}::bigint * interval '1 millisecond'
      from chosen c
     where l.id = c.lapsed and l.expires_at <= now()
       and l.id = any(array(select x.id from x_job_leases x
                             where x.id in (select lapsed from chosen) and x.expires_at <= now()
                             order by x.lease_key, x.slot
                               for no key update skip locked))
    returning l.lease_key, l.slot, l.holder
), granted as (
    select lease_key, slot, holder from inserted
    union all
    select lease_key, slot, holder from reclaimed
)"""
