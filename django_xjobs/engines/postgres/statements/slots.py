"""x_job_leases: per-key concurrency slots (docs/concurrency.md).

django_xjobs/slots.py has the protocol (states, transitions, which timeout bounds which). A slot
row is free when it is missing OR lapsed (expires_at <= now()); every write is fenced on the
holder. Only slots_purge_expired, which maintenance runs, deletes lapsed rows of other holders;
it is here, not in maintenance.py, because its grace is part of the renewal's fence.

The claim takes slots itself (jobs_claim, in claim.py); slots_acquire is the same step on its
own, for JobLease.objects.acquire. The release wakes the jobs the claim blocked on its key;
jobs_unblock (flow.py) is the periodic safety net of those wake-ups.
"""

from __future__ import annotations

from ...base import Statement
from .fragments import grant_slots_sql, notify_queues_sql, slot_holds_sql, wake_blocked_sql

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
Hand slots back when their runs ended, however they ended, one statement per settle, and wake
in the same statement the jobs of those keys that the claim held back (`blocked`): as many per
key as the key has free slots now under the limit the run held it under, in claim order
(x_jobs_blocked_idx), back to `ready` (or `suspended`, a durable run's resume), with a NOTIFY
of their queues, so a worker anywhere in the fleet claims them at once, not at its next poll.

The delete is fenced on the holder only: a run may delete its own row even after it lapsed
(nobody else's row carries its holder, which contains its never-reused lease token), and never
touches a row another run took over. The free slots are counted without the rows this statement
deletes (its own snapshot still sees them). A job the claim blocks while this runs can miss the
wake-up (its block commits after this read); the next release of its key, or jobs_unblock at
the next poll, wakes it (tests/acceptance/test_slots_fleet.py).

The rows are locked first, in (lease_key, slot) order, SKIP LOCKED: a row another transaction
holds this moment is not deleted (its holder is answered busy, and released again at the next
settle), never waited for (docs/design.md, "Lock order").
""",
    sql=f"""
with {slot_holds_sql("for update", live=False)}, gone as (
    delete from x_job_leases l
     where l.id in (select id from free)
    returning l.lease_key, l.slot, l.holder
), room as (
    select k.lease_key,
           k.lim - (select count(*) from x_job_leases l
                     where l.lease_key = k.lease_key and l.expires_at > now()
                       and not exists (select 1 from gone g
                                        where g.lease_key = l.lease_key and g.slot = l.slot))
             as n
      from (select v.lease_key, max(v.lim) as lim
              from unnest(%(keys)s::text[], %(limits)s::int[]) as v(lease_key, lim)
             where v.lease_key in (select lease_key from gone)
             group by v.lease_key) k
     -- A paused key's jobs stay blocked: they wait for the resume, not for a slot.
     where not exists (select 1 from x_flow_pauses p
                        where p.kind = 'key' and p.key = k.lease_key
                          and (p.until is null or p.until > now()))
), woken as (
    {wake_blocked_sql("room", "lease_key", "n")}
)
select (select count(*) from gone),
       {notify_queues_sql("woken")},
       (select array_agg(v.holder) from v
          join x_job_leases l
            on l.lease_key = v.lease_key and l.slot = v.slot and l.holder = v.holder
         where l.id not in (select id from free))
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
