"""x_job_steps and x_job_events: durable steps, sleeps and event waits (docs/durable.md).

Every step write is fenced on the run still owning its job, by a lock on the job's row
(``_OWNER``) taken without waiting; events meet their waiters under one advisory lock per event
name (event_lock). The deletion of expired events is
in maintenance.py with the other retention deletes.
"""

from __future__ import annotations

from ...base import Statement
from .fragments import CHANNEL, RUN_OWNER_BUSY, run_owner_sql

# ----------------------------------------------------------------------------------- steps --

# The fence every step write carries (docs/design.md, "Step and backfill writes"): the job's
# row, still this run's, locked FOR SHARE until the write's transaction ends, so no claim or
# cancel can take the job between the check and the commit (a snapshot EXISTS could not stop a
# claim committed a moment after it read). SKIP LOCKED: a row another transaction holds is not
# waited for; the statement answers `busy` (_BUSY) and the run writes again once it is free.
_OWNER = run_owner_sql("for share")
_OWNED = "exists (select 1 from owner)"
_BUSY = f"{RUN_OWNER_BUSY} as busy"

STEPS_OF_RUN = Statement(
    "steps_of_run",
    why="""
Every step a run recorded, read once when the run's code takes its first step, so a job of
twenty steps costs one read, not twenty. `due` compares wake_at with the database clock: a
durable sleep ends by the clock every lease is measured on.
""",
    sql="""
select name, status, output, attempts, error, started_at, completed_at, wake_at, event,
       correlation_key, event_id, event_published_at, coalesce(wake_at <= now(), false) as due,
       kind
  from only x_job_steps
 where run_id = %(run_id)s::uuid
""",
)

STEP_COMPLETE_IF_OWNED = Statement(
    "step_complete_if_owned",
    why="""
Record a step's output (a new row is a `run` step's: the other kinds opened theirs when they
began, and kind says which it is for the deploy check). Fenced on the job's ownership: the
EXISTS on the job row is the fence, so a run whose lease lapsed (and whose job another run
holds) cannot record an output the new run would then take as done. attempts counts the step's
executions: a step that failed twice and then succeeded says 3.
For an event wait, event_id/event_published_at name the event consumed.
""",
    sql=f"""
with {_OWNER}, written as (
    insert into x_job_steps
        (run_id, name, status, output, started_at, completed_at, attempts, event,
         correlation_key, event_id, event_published_at, kind)
    select %(run_id)s::uuid, %(name)s, 'completed', %(output)s::jsonb, now(), now(), 1,
           %(event)s, %(correlation_key)s, %(event_id)s::bigint,
           %(event_published_at)s::timestamptz, %(kind)s
     where {_OWNED}
    on conflict (run_id, name) do update
       set status = 'completed', output = excluded.output, completed_at = now(), error = null,
           attempts = x_job_steps.attempts + (x_job_steps.status = 'failed')::int,
           event = coalesce(excluded.event, x_job_steps.event),
           event_id = excluded.event_id, event_published_at = excluded.event_published_at
    returning name
)
select (select name from written), {_BUSY}
""",
)

STEP_FAIL_IF_OWNED = Statement(
    "step_fail_if_owned",
    why="""
Record a step's failure: `failed`, its error, attempts + 1. The job then fails and retries by
its own policy, and the step runs again on the next attempt. Fenced like every step write.
""",
    sql=f"""
with {_OWNER}, written as (
    insert into x_job_steps (run_id, name, status, started_at, attempts, error, kind)
    select %(run_id)s::uuid, %(name)s, 'failed', now(), 1, %(error)s, 'run'
     where {_OWNED}
    on conflict (run_id, name) do update
       set status = 'failed', error = excluded.error, completed_at = null,
           attempts = x_job_steps.attempts + 1
    returning attempts
)
select (select attempts from written), {_BUSY}
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
with {_OWNER}, written as (
    insert into x_job_steps
        (run_id, name, status, started_at, wake_at, event, correlation_key, attempts, kind)
    select %(run_id)s::uuid, %(name)s, %(status)s, now(),
           coalesce(%(wake_at)s::timestamptz,
                    now() + %(duration_ms)s::bigint * interval '1 millisecond'),
           %(event)s, %(correlation_key)s, 1, %(kind)s
     where {_OWNED}
    on conflict (run_id, name) do update set status = excluded.status
    returning started_at, wake_at, wake_at <= now() as due
)
select w.started_at, w.wake_at, w.due, {_BUSY}
  from (select 1) one
  left join written w on true
""",
)

STEP_CANCEL_SIBLINGS = Statement(
    "step_cancel_siblings",
    why="""
wait_for_any: once one event won, the waits on the others are closed in the SAME transaction
as the win, so no later publish of a losing event wakes the job for a wait that is over.
""",
    sql=f"""
with {_OWNER}, closed as (
    update only x_job_steps
       set status = 'cancelled', completed_at = now()
     where run_id = %(run_id)s::uuid and name like %(prefix)s and status = 'waiting'
       and {_OWNED}
    returning 1
)
select (select count(*) from closed), {_BUSY}
""",
)

# -------------------------------------------------------------------------------- children --
# docs/durable.md, "Child jobs": the parent's step row is the rendezvous between a parent that
# checks its children and a child that finishes. Both lock it before they look at the other.

STEP_INVOKE_OPEN_IF_OWNED = Statement(
    "step_invoke_open_if_owned",
    why="""
Open an invoke or gather step, or lock the one already open: the row (status `invoking`, kind
`invoke`) records the children's ids in its output and, in `pending`, how many are live. A
child that finishes updates this row (its trigger), so holding the row's lock while the parent
reads its children's states means no child can finish unseen between that read and the
parent's suspension: a child finishing meanwhile waits for the lock, then finds the parent
suspended and wakes it. `opened` tells a new step (enqueue the children now, in this
transaction) from one already open (read them). wake_at is the timeout (NULL: none); park_at
is when the parent is claimed again if no child wakes it first: the timeout, else a re-check
an hour on (a safety net only: the children's trigger is what wakes it). Fenced like every step
write. The open row is locked SKIP LOCKED first (a child's settle, or an operator's cancel of a
child, may hold it a moment): one held elsewhere answers `busy`, never waited for.
""",
    sql=f"""
with {_OWNER}, step as materialized (
    select id from only x_job_steps
     where run_id = %(run_id)s::uuid and name = %(name)s
       for no key update skip locked
), held as (
    select 1 from only x_job_steps
     where run_id = %(run_id)s::uuid and name = %(name)s
       and id not in (select id from step)
), written as (
    insert into x_job_steps
        (run_id, name, status, kind, output, pending, started_at, wake_at, attempts)
    select %(run_id)s::uuid, %(name)s, 'invoking', 'invoke',
           jsonb_build_object('children', %(children)s::jsonb), %(pending)s::int, now(),
           now() + %(timeout_ms)s::bigint * interval '1 millisecond', 1
     where {_OWNED} and not exists (select 1 from held)
    on conflict (run_id, name) do update set pending = x_job_steps.pending
    returning output, xmax = 0 as opened, coalesce(wake_at <= now(), false) as due,
              coalesce(wake_at, now() + interval '1 hour') as park_at
)
select w.output, w.opened, w.due, w.park_at,
       {RUN_OWNER_BUSY} or exists (select 1 from held) as busy
  from (select 1) one
  left join written w on true
""",
)

STEP_INVOKE_PENDING_IF_OWNED = Statement(
    "step_invoke_pending_if_owned",
    why="""
An open invoke step's count of live children, as the parent just read it under the step row's
lock (step_invoke_open_if_owned): each child that finishes after this counts one down, and the
one that reaches 0 wakes the parent. The parent re-counts at every check, so a count that
drifted (an operator retried a child after the parent had counted it finished) is mended at the
next one. Fenced like every step write.
""",
    sql=f"""
with {_OWNER}, counted as (
    update only x_job_steps
       set pending = %(pending)s::int
     where run_id = %(run_id)s::uuid and name = %(name)s and status = 'invoking'
       and {_OWNED}
    returning pending
)
select (select pending from counted), {_BUSY}
""",
)

JOBS_CHILDREN = Statement(
    "jobs_children",
    why="""
The children of an invoke or gather step, in the step's order: state, result and last error.
`only x_jobs`: the worker's statements never plan the history tables; a child that finished
long enough ago to be archived is not found here, and the engine then reads the children again
with jobs_children_archived. A child found nowhere (purged) comes back with no state.
""",
    sql="""
select c.id, j.name, j.state, j.result, j.last_error
  from unnest(%(ids)s::uuid[]) with ordinality as c(id, n)
  left join only x_jobs j on j.id = c.id
 order by c.n
""",
)

JOBS_CHILDREN_ARCHIVED = Statement(
    "jobs_children_archived",
    why="""
jobs_children for the children it did not find in x_jobs itself: a read of x_jobs with its
history tables (docs/design.md, "History tables"), one primary-key probe per table, made only
when a child was archived before its parent checked it.
""",
    sql="""
select c.id, j.name, j.state, j.result, j.last_error
  from unnest(%(ids)s::uuid[]) with ordinality as c(id, n)
  left join x_jobs j on j.id = c.id
 order by c.n
""",
)

# ---------------------------------------------------------------------------------- events --

EVENT_LOCK = Statement(
    "event_lock",
    why="""
The rendezvous between a waiter and a publisher of one event name, held to the end of the
transaction (pooler-safe: transaction-scoped). The waiter registers its wait, looks for an
event and suspends under it; the publisher inserts the event and wakes waiters under it. So
whichever comes second sees what the first committed: an event published at any moment
relative to the waiter's check-then-suspend is never missed (tests/integration/test_steps.py).
Several names (wait_for_any) are locked in sorted order, so two waiters never deadlock.
Whichever comes second sees the other's commit only under READ COMMITTED (each statement a new
snapshot, taken after the lock): in a REPEATABLE READ or SERIALIZABLE transaction, whose
snapshot predates the lock, a waiter could be missed, so the lock is refused there
(xjobs_require_read_committed, migration 0010; docs/guarantees.md, "Isolation levels").
""",
    sql="""
select xjobs_require_read_committed('waiting for or publishing an event'),
       count(pg_advisory_xact_lock(1937010802, hashtext(n)))
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
and their run_ids handed to the suspended-run index as one array. As a semi-join, the planner
may walk every suspended job and, for each, every waiting step of the event: quadratic in the
number of waiters (docs/performance.md, "What the simpler forms cost").
""",
    sql=f"""
with woken as (
    update only x_jobs j
       set run_at = now(), updated_at = now()
     where j.state = 'suspended'
       and j.run_id = any(array(
             select s.run_id from only x_job_steps s
              where s.status = 'waiting' and s.event = %(name)s
                and s.correlation_key = %(correlation_key)s
             union all
             select s.run_id from only x_job_steps s
              where s.status = 'waiting' and s.event = %(name)s
                and s.correlation_key is null))
    returning j.queue
)
select (select count(*) from woken),
       (select count(*) from (select pg_notify('{CHANNEL}', d.queue)
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
order: the planner would read and sort every event of the names since the wait began.
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
