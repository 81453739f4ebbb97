"""x_flow_pauses: pauses of queues and keys, and the PauseKey circuit breaker
(docs/flow-control.md, "Pause and circuit breakers").

A pause is in force while its `until` is NULL or later than now(): an expired row is no pause,
and the next pause of the same queue or key replaces it. The claim reads the pauses in force
(claim.py); these statements write and list them, and the resume of a key hands back the jobs the
claim blocked on it.
"""

from __future__ import annotations

from ...base import Statement
from .fragments import (
    CHANNEL,
    REQUEUE_SET,
    WAKE_SET,
    free_runs_sql,
    held_runs_sql,
    notify_queues_sql,
)

# The columns of a pause row, decoded by rows.pause_record (engines/postgres/rows.py) in
# this order.
PAUSE_COLUMNS = "kind, key, until, reason, paused_at"

PAUSE_UPSERT = Statement(
    "pause_upsert",
    why="""
Pause a queue or a key, or change the end and the reason of its pause, in one upsert on the
(kind, key) unique index: two operators pausing at once leave one row, the last write's. `until`
is the given time, or now() plus the given duration on the database clock (the clock the claim
compares it with), or NULL: until resumed. A given time that is not in the future writes nothing
and returns no row, so the caller reports it instead of recording a pause that never held. A row
whose pause had already ended counts as a new pause (paused_at now()).
""",
    sql=f"""
with t as (
    select coalesce(%(until)s::timestamptz,
                    now() + %(for_ms)s::bigint * interval '1 millisecond') as until
)
insert into x_flow_pauses as p (kind, key, until, reason)
select %(kind)s, %(key)s, t.until, %(reason)s
  from t
 where t.until is null or t.until > now()
on conflict (kind, key) do update
   set until     = excluded.until,
       reason    = excluded.reason,
       paused_at = case when p.until is null or p.until > now() then p.paused_at
                        else now() end
returning {PAUSE_COLUMNS}
""",
)

PAUSE_RESUME_QUEUE = Statement(
    "pause_resume_queue",
    why="""
End a queue's pause: delete its row, and NOTIFY the queue so that idle workers claim at once
instead of at their next poll (the claim reads the pauses, so the row's absence is the whole
resume). The answer says whether a pause was in force; the NOTIFY is sent either way, a hint
costs nothing.
""",
    sql=f"""
with gone as (
    delete from x_flow_pauses where kind = 'queue' and key = %(queue)s
    returning until
)
select (select count(*) from gone where until is null or until > now()),
       case when %(notify)s then pg_notify('{CHANNEL}', %(queue)s) end
""",
)

PAUSE_RESUME_KEY = Statement(
    "pause_resume_key",
    why="""
End a key's pause and hand back, in the same statement, every job the claim blocked on that key:
back to `ready`, or to `suspended` when it was blocked while resuming (`blocked_resume`), its
run_at untouched, so it keeps its place. Without the unblock, those jobs would wait for the
periodic unblock although nothing holds them back. A job blocked on the same text as a full
concurrency key is handed back too: the claim blocks it again if no slot is free, which costs a
claim, never a slot. One NOTIFY per queue of the jobs handed back.
""",
    sql=f"""
with gone as (
    delete from x_flow_pauses where kind = 'key' and key = %(key)s
    returning until
), unblocked as (
    update only x_jobs
       {WAKE_SET}
     where state = 'blocked' and blocked_on = %(key)s
    returning queue
)
select (select count(*) from gone where until is null or until > now()),
       (select count(*) from unblocked),
       {notify_queues_sql("unblocked")}
""",
)

PAUSES_LIST = Statement(
    "pauses_list",
    why="""
The pauses in force, for `manage.py xjobs pauses`, the console and `pauses()`: expired rows are
no pause and are left out (the next pause of their queue or key replaces them). For a key, how
many jobs are blocked on it now, through the partial index of blocked jobs.
""",
    sql=f"""
select {PAUSE_COLUMNS},
       case when kind = 'key'
            then (select count(*) from only x_jobs j
                   where j.state = 'blocked' and j.blocked_on = p.key)
            else 0 end
  from x_flow_pauses p
 where (until is null or until > now())
   and (%(kind)s::text is null or kind = %(kind)s)
 order by kind, key
 limit %(limit)s
""",
)

JOB_PAUSE_KEY_IF_OWNED = Statement(
    "job_pause_key_if_owned",
    why="""
The settle of a run that raised PauseKey: give the job back due now without spending an attempt
(as job_requeue_if_owned: the attempt the claim counted and its worker_ids entry are taken
back, a resumed job returns to `suspended`), and pause its key until now() plus the given time,
in ONE statement. Fenced on (id, running, token), and the pause is written only from the row the
fenced update returned: a run that lost its job (cancelled, re-claimed after a lapse) pauses
nothing. The pause only grows: a key already paused until resumed stays so, and a later end
stays; the reason is the latest. Locked as the ack locks, the key's pause row too (SKIP
LOCKED): a job or pause row another transaction holds answers `busy`, and the worker settles the
run again later (docs/design.md, "Lock order").
""",
    sql=f"""
with one as (
    select %(id)s::uuid as id, %(token)s::uuid as token
), free as materialized (
    {free_runs_sql("one")}
), pause_row as materialized (
    select id from x_flow_pauses
     where kind = 'key' and key = %(key)s
       for no key update skip locked
), requeued as (
    update only x_jobs
       {REQUEUE_SET}
     where id = any(array(select id from free))
       and not exists (select 1 from x_flow_pauses
                        where kind = 'key' and key = %(key)s
                          and id not in (select id from pause_row))
    returning id, state
), paused as (
    insert into x_flow_pauses as p (kind, key, until, reason)
    select 'key', %(key)s, now() + %(for_ms)s::bigint * interval '1 millisecond', %(reason)s
      from requeued
    on conflict (kind, key) do update
       set until     = case when p.until is null then null
                            else greatest(p.until, excluded.until) end,
           reason    = excluded.reason,
           paused_at = case when p.until is null or p.until > now() then p.paused_at
                            else now() end
    returning until
)
select r.state, (select until from paused) from requeued r
union all
select 'busy', null from ({held_runs_sql("one", "requeued")}) busy
""",
)
