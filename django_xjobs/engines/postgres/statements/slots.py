"""x_job_leases: per-key concurrency slots (docs/concurrency.md).

django_xjobs/slots.py has the protocol (states, transitions, which timeout bounds which). A slot
row is free when it is missing OR lapsed (expires_at <= now()); every write is fenced on the
holder. Only slots_purge_expired, which maintenance runs, deletes lapsed rows of other holders;
it is here, not in maintenance.py, because its grace is part of the renewal's fence.

The claim takes slots itself (jobs_claim, in claim.py); slots_acquire is the same step on its
own, for JobLease.objects.acquire. The release hands its slots to the next jobs the claim
blocked on their keys, or wakes them; jobs_unblock (flow.py) is the periodic safety net of
those wake-ups.
"""

from __future__ import annotations

from ...base import Statement
from .fragments import (
    count_sql,
    elapsed_ms_sql,
    grant_slots_sql,
    key_limit_sql,
    notify_queues_sql,
    slot_holds_sql,
    wake_blocked_sql,
)


def release_ctes(holds: str) -> str:
    """The CTEs of a slot release and its hand-over (SLOTS_RELEASE_IF_HELD says why each is
    written as it is), for the slot holds of the CTE ``holds`` (lease_key, slot, holder, lim:
    the limit the run held it under): ``slot_rows`` (their rows, locked), ``released``,
    ``waiting``, ``handover``, ``started`` (the jobs handed over), ``handed`` (each with its
    slot), ``passed``, ``gone``, ``room``, ``woken`` and ``slot_tallied``; release_summary and
    HANDED_OVER read them."""
    return f"""slot_rows as materialized (
    -- The holds' rows, locked in (lease_key, slot) order, SKIP LOCKED.
    select l.id from x_job_leases l
      join {holds} h on l.lease_key = h.lease_key and l.slot = h.slot and l.holder = h.holder
     order by l.lease_key, l.slot
       for update of l skip locked
), released as materialized (
    -- The rows this release locked, numbered within their key for the hand-over.
    select l.id, l.lease_key, l.slot,
           row_number() over (partition by l.lease_key order by l.slot) as k
      from x_job_leases l
     where l.id in (select id from slot_rows)
), waiting as materialized (
    -- Per key, the next blocked jobs in claim order, one per slot released, locked SKIP
    -- LOCKED, read only when the worker can start some (take > 0).
    select w.lease_key, b.id, b.name, b.queue, b.priority, b.run_at,
           b.concurrency_key = w.lease_key and b.rate_key is null and not b.blocked_resume
           and b.run_at <= now() and b.queue = any(%(queues)s::text[])
           and not exists (select 1 from x_flow_pauses p
                            where ((p.kind = 'key' and p.key = w.lease_key)
                                   or (p.kind = 'queue' and p.key = b.queue))
                              and (p.until is null or p.until > now())) as startable,
           {key_limit_sql("b.concurrency_key", "b.name")} as lim
      from (select lease_key, count(*) as n from released
             where %(take)s > 0 group by lease_key) w
      cross join lateral (
          select id, name, queue, priority, run_at, concurrency_key, rate_key, blocked_resume
            from only x_jobs
           where state = 'blocked' and blocked_on = w.lease_key
           order by priority desc, run_at
           limit w.n
             for update skip locked) b
), handover as materialized (
    -- The startable ones paired with the key's released slots (under their own limit), at
    -- most `take`.
    select e.id as job_id, r.id as lease_id, r.slot, e.lim
      from (select *, row_number() over (partition by lease_key order by priority desc, run_at)
                        as k
              from waiting where startable) e
      join released r on r.lease_key = e.lease_key and r.k = e.k
     where r.slot < e.lim
     order by r.lease_key, r.slot
     limit %(take)s
), started as (
    -- Each run's fresh lease token. The rows are reached through the primary key alone, not
    -- joined to `handover`: the planner cannot estimate a CTE, and with the join it probed the
    -- key with the whole array once per job handed over (docs/performance.md, "Flow control").
    update only x_jobs j
       set state          = 'running',
           attempt        = j.attempt + 1,
           visible_at     = now() + %(lease_ms)s * interval '1 millisecond',
           lease_token    = gen_random_uuid(),
           claimed_by     = %(worker_id)s,
           worker_ids     = j.worker_ids || jsonb_build_array(%(worker_id)s::text),
           started_at     = now(),
           blocked_on     = null,
           blocked_resume = false,
           updated_at     = now()
     where j.id = any(array(select job_id from handover))
    returning j.id, j.lease_token, j.name, j.queue, j.input, j.run_id, j.attempt,
              j.max_attempts, j.tenant_id, j.traceparent, j.concurrency_key, j.parent_id,
              j.run_at
), handed as (
    -- The jobs started, each with the slot it was handed.
    select s.*, h.slot, h.lim, h.lease_id from started s join handover h on h.job_id = s.id
), passed as (
    -- The slot row, rewritten for the run it was handed to.
    update x_job_leases l
       set holder     = s.id::text || '/' || s.lease_token::text || '/' || %(worker_id)s,
           expires_at = now() + %(slot_ttl_ms)s::bigint * interval '1 millisecond'
      from handed s
     where l.id = s.lease_id
    returning l.lease_key
), gone as (
    delete from x_job_leases l
     where l.id in (select id from slot_rows)
       and l.id not in (select lease_id from handed)
    returning l.lease_key, l.slot, l.holder
), room as (
    select k.lease_key,
           -- The key's rows through its unique index (`offset 0`: the expiry is tested on
           -- them, never through x_job_leases_expiry_idx, whose dead entries a busy release
           -- would walk for every key).
           k.lim - (select count(*)
                      from (select id, expires_at from x_job_leases
                             where lease_key = k.lease_key offset 0) l
                     where l.expires_at > now() and l.id not in (select id from slot_rows))
                 - (select count(*) from passed p where p.lease_key = k.lease_key)
             as n
      from (select h.lease_key, max(h.lim) as lim
              from {holds} h
             where h.lease_key in (select lease_key from released)
             group by h.lease_key) k
     -- A paused key's jobs stay blocked: they wait for the resume, not for a slot.
     where not exists (select 1 from x_flow_pauses p
                        where p.kind = 'key' and p.key = k.lease_key
                          and (p.until is null or p.until > now()))
), woken as (
    {wake_blocked_sql("room", "lease_key", "n", started="handover")}
), slot_tallied as (
    -- The starts of the hand-over with their waits, as jobs_claim counts its own.
    {count_sql("started", started="count(*)",
               wait_ms=f"array_agg({elapsed_ms_sql('run_at')})",
               wait_ms_sum=f"sum({elapsed_ms_sql('run_at')})")}
)"""


def release_summary(holds: str) -> str:
    """The release's answer row, in jobs_claim's answer columns: the slot rows deleted (the
    15th), the NOTIFYs sent, the holders whose row another transaction held (busy), the jobs
    woken (the 19th)."""
    return f"""null::text, null::text, null::text, null::text, null::jsonb, null::text, null::int,
       null::int, null::text, null::text, null::text, false, null::int, null::int,
       (select count(*) from gone),
       {notify_queues_sql("woken")},
       (select array_agg(h.holder) from {holds} h
          join x_job_leases l
            on l.lease_key = h.lease_key and l.slot = h.slot and l.holder = h.holder
         where l.id not in (select id from slot_rows)),
       null::text, (select count(*) from woken)"""


# One row per job a release handed over (from its CTE ``handed``), in jobs_claim's answer
# columns.
HANDED_OVER = """id::text, lease_token::text, name, queue, input, run_id::text, attempt,
       max_attempts, tenant_id, traceparent, concurrency_key, false, slot, lim, null, null,
       null, parent_id::text, null"""

# The slot holds of a release, from its parameters: (lease_key, slot, holder, lim).
RELEASE_HOLDS = """select * from unnest(%(keys)s::text[], %(slots)s::int[], %(holders)s::text[],
                         %(limits)s::int[]) as h(lease_key, slot, holder, lim)"""


SLOTS_ACQUIRE = Statement(
    "slots_acquire",
    why="""
Take the lowest free slot under its limit for each request, in one statement: the step
jobs_claim takes for the keyed jobs it claims, on its own for JobLease.objects.acquire. Race-safe
without an advisory lock: the (lease_key, slot) unique index serialises two workers that picked
the same slot, and the loser's `do update` is guarded on the row having expired, so a live slot
returns no row and is never granted twice. Under contention this can miss a slot that is
genuinely free (both picked slot 0, slot 1 was free): in the claim the job is then blocked and
woken by the next release of its key or jobs_unblock; an over-grant would cost the guarantee
(tests/conformance/test_slots.py races 16 threads for the last slot).

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
    sql=f"""
with req as (
    select r.lease_key, r.lim, r.holder, r.ord,
           row_number() over (partition by r.lease_key order by r.lim, r.ord) - 1 as pos
      from unnest(%(keys)s::text[], %(limits)s::int[], %(holders)s::text[])
           with ordinality as r(lease_key, lim, holder, ord)
), {grant_slots_sql("req", "%(ttl_ms)s")}
select lease_key, slot, holder from granted
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

The rows are locked first, in (lease_key, slot) order, SKIP LOCKED: a slot row another
transaction holds this moment is answered `busy` (not renewed, not lost; renewed at the next
round), never waited for (docs/design.md, "Lock order").
""",
    sql=f"""
with {slot_holds_sql("for no key update", live=True)}, renewed as (
    update x_job_leases l
       set expires_at = now() + %(ttl_ms)s::bigint * interval '1 millisecond'
     where l.id in (select id from free) and l.expires_at > now()
    returning l.holder
)
select holder, true from renewed
union all
select v.holder, false
  from v join x_job_leases l
    on l.lease_key = v.lease_key and l.slot = v.slot and l.holder = v.holder
 where l.expires_at > now() and l.id not in (select id from free)
""",
)

SLOTS_RELEASE_IF_HELD = Statement(
    "slots_release_if_held",
    why="""
Hand slots back when their runs ended, however they ended, one statement per settle, and pass
each freed slot on in the same statement: to the next job blocked on its key that the releasing
worker may start itself (the hand-over), else by waking the jobs of those keys that the claim
held back (`blocked`) for any worker to claim.

The hand-over (`take` > 0: the releasing worker has that many runs free; 0: none) takes, per
key, as many of its blocked jobs as it released slots, in claim order (x_jobs_blocked_idx),
SKIP LOCKED, and starts those that need nothing else the claim decides: a job of a queue the
worker serves that is not fair, not capped and not paused (`queues`), due (a debounce or a
cron hold may have moved a blocked job's run_at ahead), on a key not paused, with no rate
budget to spend, not a durable run's resume, under its own limit (key_limit_sql: the slot's
index below it). Such a job goes `blocked` -> `running` as the claim writes it (a fresh lease
token, attempt + 1, the worker in claimed_by and worker_ids, its start counted with its wait),
and its slot row is rewritten for it in place (holder and expiry), never deleted and taken
again: a claim elsewhere sees the slot held throughout. One statement per slot cycle instead
of three (release, NOTIFY, claim; docs/performance.md, "Flow control").

What is not handed over is woken as before: as many blocked jobs per key as the key has free
slots now under the limit the run held it under, in claim order, back to `ready` (or
`suspended`, a durable run's resume), with a NOTIFY of their queues, so a worker anywhere in
the fleet claims them at once, not at its next poll.

The delete is fenced on the holder only: a run may delete its own row even after it lapsed
(nobody else's row carries its holder, which contains its never-reused lease token), and never
touches a row another run took over. The free slots are counted without the rows this statement
releases (its own snapshot still sees them) and with those it handed over. A job the claim
blocks while this runs can miss the wake-up (its block commits after this read); the next
release of its key, or jobs_unblock at the next poll, wakes it
(tests/acceptance/test_slots_fleet.py).

The worker offers a hand-over only while no claim is due (worker/loop.py): otherwise it would
fill its capacity with the keys' backlogs round after round, and the claim, which takes jobs in
priority order across its queues and rescues lapsed leases, would never run. A hand-over whose
answer is lost (the connection dropped after the commit) is what a lost claim's answer is:
its jobs are leased to the worker under tokens it never learned, and are rescued when their
leases lapse.

A worker's release (`take` > 0) commits without waiting for its WAL to reach disk, as the
claim does and for the same reason (async_commit); a release inside a caller's transaction
(JobLease.objects.release) leaves that transaction's commit alone.

Locks, in this order (docs/design.md, "Lock order"): the slot rows, in (lease_key, slot) order,
SKIP LOCKED: a row another transaction holds this moment is not released (its holder is
answered busy, and released again at the next settle), never waited for; then the blocked job
rows, SKIP LOCKED. The answer is one row without a job (slot rows deleted, NOTIFYs sent, busy
holders, jobs woken), then one row per job handed over, in jobs_claim's columns.
""",
    sql=f"""
with async_commit as (
    -- A worker's release (take > 0, never inside a caller's transaction, whose commit this
    -- would change) commits as its claim does. Lost in a crash, its slots lapse and its
    -- hand-overs are claimed again (their runs fenced out by their tokens), the
    -- acknowledgements before it were committed durably, and every later durable commit
    -- flushes it too.
    select set_config('synchronous_commit', 'off', true) where %(take)s > 0
), holds as (
    {RELEASE_HOLDS}
), {release_ctes("holds")}
select {release_summary("holds")} + 0 * (select count(*) from async_commit)
union all
select {HANDED_OVER}
  from handed
""",
)

# ----------------------------------------------------------------------------------- reads --

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

# ----------------------------------------------------------------------------- maintenance --

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
