"""x_jobs: debounce on the live key (docs/flow-control.md, "Debounce").

A debounced enqueue of (name, tenant, key) runs, in one transaction, job_debounce_live and, when
that found no pending job to move, the keyed insert job_enqueue (enqueue.py) with the debounce as
its delay: the live-key index stays the only arbiter of "one live job per key".
"""

from __future__ import annotations

from ...base import Statement
from .fragments import CHANNEL, LIVE

JOB_DEBOUNCE_LIVE = Statement(
    "job_debounce_live",
    why="""
Move the live job of (name, tenant, key) to the last enqueue, or set it aside for a follow-up.

It locks that row (`for update`, scoped exactly as the live-key index is, its whole predicate
repeated so the index is used, as in job_find_live_by_key), so two debounced enqueues of one key
are serialised and each sees what the other did. Then, by the state of the locked row:

* pending (`ready`, `delayed` or `blocked`, no attempt spent and no durable step recorded):
  it takes the new input (and the last enqueue's traceparent and enqueued_by) and is due
  `debounce` from now, but never later than `max_wait` after its created_at (NULL: no cap;
  `least` ignores it). It stays `blocked` if it was (it waits for its key, and its unblock makes
  it due); else `delayed`, or `ready` with a NOTIFY once the cap has passed. Its concurrency key
  becomes the debounce key, so a job enqueued without debounce under the same key is held to one
  run at a time from then on.
* under way (`running`, `suspended`, or an attempt spent or a step recorded: a retry waiting
  for its turn, a resumed run blocked on its key, a run handed back by Snooze after a step):
  its input belongs to a run that already started, and the steps it completed were computed
  from that input, so it is left alone and only taken out of the live-key index (its
  idempotency key becomes its own id, which that index leaves out). The caller then inserts the
  follow-up with job_enqueue in the same transaction; the follow-up's debounce concurrency key
  (limit 1) keeps it from starting before the run it follows released that slot.

A run under way that holds an idempotency window (unique_for_ms, docs/durable.md, "Idempotency
windows") is neither moved nor set aside: its key's row in x_job_keys follows the job by its key,
so a job taken out of the key would never close its window. It is returned as it is (`held`),
as a live job of the key is to a plain enqueue.

No row: nothing live holds the key (or the one that did finished while we waited for its lock:
the re-check of `for update` drops it); the caller inserts. Its `on conflict do nothing` settles
a race of two first enqueues, and the loser runs this statement again and finds the winner.
""",
    sql=f"""
with live as (
    select id, run_id, state, unique_for_ms is not null as windowed,
           attempt = 0 and state in ('ready', 'delayed', 'blocked')
           and not exists (select 1 from only x_job_steps s where s.run_id = x_jobs.run_id)
             as pending,
           least(now() + %(debounce_ms)s::bigint * interval '1 millisecond',
                 created_at + %(max_wait_ms)s::bigint * interval '1 millisecond') as due
      from only x_jobs
     where name = %(name)s::text
       and coalesce(tenant_id, '') = coalesce(%(tenant_id)s::text, '')
       and idempotency_key = %(key)s::text
       and state in {LIVE}
       and not (idempotency_key = id::text)
     limit 1
       for update
), moved as (
    update only x_jobs j
       set input           = %(input)s::jsonb,
           run_at          = l.due,
           state           = case when j.state = 'blocked' then 'blocked'
                                  when l.due > now() then 'delayed' else 'ready' end,
           concurrency_key = %(concurrency_key)s::text,
           traceparent     = %(traceparent)s::text,
           enqueued_by     = %(enqueued_by)s::text,
           updated_at      = now()
      from live l
     where j.id = l.id and l.pending
    returning j.id, j.run_id, j.state, j.queue
), detached as (
    update only x_jobs j
       set idempotency_key = j.id::text, updated_at = now()
      from live l
     where j.id = l.id and not l.pending and not l.windowed
    returning j.id, j.run_id, j.state
)
select 'moved' as outcome, id, run_id, state,
       case when %(notify)s::boolean and state = 'ready' then pg_notify('{CHANNEL}', queue) end
  from moved
 union all
select 'detached', id, run_id, state, null
  from detached
 union all
select 'held', id, run_id, state, null
  from live
 where not pending and windowed
""",
)
