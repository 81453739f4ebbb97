"""Flow control beyond slots (docs/flow-control.md): the periodic wake-up of blocked jobs and the
spending of rate-limit budgets. Pauses are in pauses.py; the claim, which applies all of it,
is jobs_claim in claim.py; slots are in slots.py.
"""

from __future__ import annotations

from ...base import Statement
from .fragments import LIVE, key_limit_sql, notify_queues_sql, wake_blocked_sql

JOBS_UNBLOCK = Statement(
    "jobs_unblock",
    why="""
The safety net of blocked jobs, run by each worker once per poll interval (one statement):
wake the jobs blocked on a key that has room again although no release woke them (its holders
crashed and their slots lapsed; a block that raced a release; a limit raised), or whose key
pause ended. Per blocked key (a loose index scan over x_jobs_blocked_idx, one probe per key):
nothing while a pause of the key is in force; else as many as the key's free slots under its
limit (the limit of its first blocked job, as the claim computes it), or up to `batch` when the
key is no concurrency key (a rate-limit key whose pause ended). A run of a cron task buffered
behind the live one (overlap="buffer_one", blocked on its own enqueued_by `cron:<task>`) is
woken, one, only once no other run of the task is live (x_jobs_cron_live_idx; docs/scheduling.md,
"Overlap"): the trigger that normally releases it missed nothing then. Woken jobs go back to `ready`
(or `suspended`) and their queues are NOTIFYed. Over-waking is harmless (the claim blocks a job
again if its key is full); under-waking would leave work idle. While the fleet is kept
compatible with release 0.1 (`park` false: docs/deployment.md, "Mixed versions"), every job
blocked on a concurrency or paused key is woken, up to `batch` per key, pause or not: the claim
no longer parks, and 0.1's workers, which never wake a blocked job, may be all that is left
after a rollback.

The same safety net for a parent whose last child finished while another transaction held the
parent's row (the child's trigger skips such a row rather than wait: migration 0010): a
suspended parent with an invoke step at no live child (x_job_steps_fanin_idx, usually empty)
is made due now. Every wake-up skips rows another transaction holds (SKIP LOCKED): the next
poll tries them again.
""",
    sql=f"""
with recursive keys(k) as (
    (select blocked_on from only x_jobs where state = 'blocked' order by blocked_on limit 1)
    union all
    select (select blocked_on from only x_jobs
             where state = 'blocked' and blocked_on > keys.k order by blocked_on limit 1)
      from keys where keys.k is not null
), room as (
    select ks.k,
           case when f.enqueued_by = ks.k and f.enqueued_by like 'cron:%%'
                then (not exists (select 1 from only x_jobs r
                                   where r.enqueued_by = ks.k and r.enqueued_by like 'cron:%%'
                                     and r.state in {LIVE}
                                     and not (r.state = 'blocked'
                                              and r.blocked_on = r.enqueued_by)))::int
                when f.concurrency_key is distinct from ks.k or not %(park)s then %(batch)s
                else {key_limit_sql("ks.k", "f.name")}
                     -- through the key's own index (`offset 0`), never the expiry's
                     - (select count(*)
                          from (select expires_at from x_job_leases
                                 where lease_key = ks.k offset 0) l
                         where l.expires_at > now())
           end as n
      from keys ks
      cross join lateral (
          select name, concurrency_key, enqueued_by from only x_jobs
           where state = 'blocked' and blocked_on = ks.k
           order by priority desc, run_at limit 1) f
     where ks.k is not null
       and (not %(park)s
            or not exists (select 1 from x_flow_pauses p
                        where p.kind = 'key' and p.key = ks.k
                          and (p.until is null or p.until > now())))
), unblocked as (
    {wake_blocked_sql("room", "k", "n")}
), parents as (
    update only x_jobs j
       set run_at = now(), updated_at = now()
     where j.id = any(array(
               select p.id
                 from only x_job_steps s
                 join only x_jobs p on p.run_id = s.run_id and p.state = 'suspended'
                where s.status = 'invoking' and s.pending <= 0 and p.run_at > now()
                limit %(batch)s
                  for no key update of p skip locked))
       and j.state = 'suspended'
    returning j.queue
), woken as (
    select queue from unblocked
    union all
    select queue from parents
)
select count(*), {notify_queues_sql("woken")}
  from woken
""",
)

RATE_TAKE = Statement(
    "rate_take",
    why="""
Spend rate-limit budget from ordinary code (RateLimit.try_acquire / acquire): the same function
the claim calls, xjobs_rate_take (migration 0003), so a view and the jobs share one budget.
It runs in its own short transaction unless the caller is inside one, and then holds the key's
lock until that transaction ends. One row per request: next_at NULL when granted, else when
the budget has room.
""",
    sql="""
select ord, next_at
  from xjobs_rate_take(%(keys)s::text[], %(limits)s::int[], %(periods)s::bigint[],
                       %(costs)s::int[])
 order by ord
""",
)
