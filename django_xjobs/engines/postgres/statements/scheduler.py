"""x_scheduler_leader and x_scheduler_state: leader election and the cron watermark; and the
x_jobs rows of a cron task's live runs, which its overlap policy reads and acts on in the
round's transaction (docs/scheduling.md, "Overlap").

The leader is a lease row or a session advisory lock (XJOBS["LEADER"]); every write of a round
is fenced on still leading (``_LEADING``). See django_xjobs/scheduler/ and docs/scheduling.md.
"""

from __future__ import annotations

from ...base import Statement
from .fragments import CHANNEL, LIVE

# The two-int form of the session advisory lock: (this class, a 31-bit hash of the lock key),
# so it shows in pg_locks as classid/objid with objsubid = 2 and never collides with the
# single-bigint locks an application takes.
ADVISORY_LOCK_CLASS = 1937010803

# The fence every write of a scheduler round carries: this process still leads. Lease mode:
# the lease row names us with more than margin_ms left, so a leader that missed a renewal
# stops writing while it still holds the lease, before anyone else can be elected. Advisory
# mode: our dedicated backend holds the lock (pg_locks is visible from any session, so the
# round's own, possibly pooled, connection can check it).
_LEADING = """(case when %(advisory_pid)s::int is null
        then exists (select 1 from x_scheduler_leader
                      where lock_key = %(lock_key)s and holder = %(holder)s
                        and expires_at > now() + %(margin_ms)s::bigint * interval '1 millisecond')
        else exists (select 1 from pg_locks
                      where locktype = 'advisory' and granted and objsubid = 2
                        and pid = %(advisory_pid)s::int
                        and classid = %(lock_class)s::int::oid
                        and objid = %(lock_id)s::int::oid)
        end)"""

LEADER_ATTEMPT_ELECT = Statement(
    "leader_attempt_elect",
    why="""
Acquire or renew the scheduler's leader lease in ONE statement, safe on a pooled connection
(PgBouncer in transaction mode): the lease is a row, not a session, so it survives the
connection going back to the pool (tests/integration/test_leader_pooling.py). The primary key
makes it atomic: the insert wins an unheld key, and `do update` fires only for the holder itself
(a renewal) or over a lease that already expired. A second node reaching for a live lease
matches neither branch and gets no row back. Expiry is the database clock's now() + lease,
never the caller's.
""",
    sql="""
insert into x_scheduler_leader (lock_key, holder, expires_at)
values (%(lock_key)s, %(holder)s, now() + %(lease_ms)s::bigint * interval '1 millisecond')
on conflict (lock_key) do update
   set holder = excluded.holder, expires_at = excluded.expires_at
 where x_scheduler_leader.holder = excluded.holder
    or x_scheduler_leader.expires_at <= now()
returning expires_at
""",
)

LEADER_RESIGN = Statement(
    "leader_resign",
    why="""
Hand the lease back on a clean stop, so the next leader need not wait for it to expire. Only
the holder may: a node that already lost the lease (it lapsed and another took it) deletes
nothing, and never the new leader's row.
""",
    sql="delete from x_scheduler_leader where lock_key = %(lock_key)s and holder = %(holder)s",
)

LEADER_GET = Statement(
    "leader_get",
    why="""
Who holds the lease, and whether it is still live on the database clock: an expired row is a
leader that stopped renewing (crashed or stopped cleanly without resigning), not a leader.
""",
    sql="""
select lock_key, holder, expires_at, expires_at > now()
  from x_scheduler_leader
 where lock_key = %(lock_key)s
""",
)

LEADER_ADVISORY_LOCK_TRY = Statement(
    "leader_advisory_lock_try",
    why="""
XJOBS["LEADER"] = "advisory": the session advisory lock, on a DEDICATED connection. It is
released when the session ends, so a crashed node's lock frees itself at once; and released just
as surely when a pooled connection goes back to the pool, or handed to whichever client the
pooler gives the session next. Never on a pooled connection
(tests/integration/test_leader_pooling.py shows both ways it breaks). try_ never waits.
""",
    sql="select pg_try_advisory_lock(%(lock_class)s::int, %(lock_id)s::int)",
)

LEADER_ADVISORY_HELD = Statement(
    "leader_advisory_held",
    why="""
Whether this session still holds the advisory lock: asked at every renewal interval instead of
taking the lock again, because advisory locks are re-entrant (each successful try stacks one
more hold that one unlock does not release).
""",
    sql="""
select count(*) > 0
  from pg_locks
 where locktype = 'advisory' and granted and objsubid = 2 and pid = pg_backend_pid()
   and classid = %(lock_class)s::int::oid and objid = %(lock_id)s::int::oid
""",
)

LEADER_ADVISORY_UNLOCK = Statement(
    "leader_advisory_unlock",
    why="""
Release the advisory lock on a clean stop (closing the session would too; this says so
explicitly and lets the next node take over before the connection is torn down).
""",
    sql="select pg_advisory_unlock(%(lock_class)s::int, %(lock_id)s::int)",
)

LEADER_ADVISORY_HOLDER = Statement(
    "leader_advisory_holder",
    why="""
Which backend holds the advisory lock, for `manage.py xjobs schedule` and the console: the
session's application_name names the worker (xjobs:<worker id>:leader). pg_locks lists the
whole server's locks and an advisory lock is per database: the filter on this database keeps
another project's (or another test database's) lock of the same key out
(tests/integration/test_leader_pooling.py::test_an_advisory_lock_of_the_same_key_in_another_database_is_not_our_leader).
""",
    sql="""
select l.pid, coalesce(a.application_name, '')
  from pg_locks l
  left join pg_stat_activity a on a.pid = l.pid
 where l.locktype = 'advisory' and l.granted and l.objsubid = 2
   and l.classid = %(lock_class)s::int::oid and l.objid = %(lock_id)s::int::oid
   and l.database = (select oid from pg_database where datname = current_database())
 limit 1
""",
)

SCHEDULER_STATES_ENSURE = Statement(
    "scheduler_states_ensure",
    why="""
A new task starts from now, not from the epoch: its row is created with the round's time as
watermark, so nothing before it fires. `do nothing` leaves an existing watermark alone (the
row, and only `greatest`, moves it). Fenced on leading: a non-leader with a clock far ahead
must not set a watermark in the future.
""",
    sql=f"""
insert into x_scheduler_state (task_name, last_fired_at, updated_at)
select t.name, %(at)s::timestamptz, now()
  from unnest(%(names)s::text[]) as t(name)
 where {_LEADING}
on conflict (task_name) do nothing
""",
)

SCHEDULER_STATES_LOCK_IF_LEADING = Statement(
    "scheduler_states_lock_if_leading",
    why="""
Open a round: lock the state rows of the tasks that are due until the transaction ends, and
read their watermarks UNDER the lock. This, not the leader lease, is what makes two overlapping
rounds safe (a leader whose lease lapsed while it was frozen, and its successor): they
serialise on the rows, and the second reads the watermarks the first committed, so it computes
nothing the first already fired - even when that job has since finished and its key is free
again. SKIP LOCKED: a round never waits behind another one (which may belong to a frozen
process); it leaves those tasks for its next round. Fenced on leading, so a process that no
longer leads locks nothing. Always one row at least, whose first column says whether we lead.
""",
    sql=f"""
select l.leading, s.task_name, s.last_fired_at, s.paused
  from (select {_LEADING} as leading) l
  left join lateral (
      select task_name, last_fired_at, paused
        from x_scheduler_state
       where task_name = any(%(names)s::text[]) and l.leading
       order by task_name
         for update skip locked
  ) s on true
""",
)

SCHEDULER_STATES_MARK_IF_LEADING = Statement(
    "scheduler_states_mark_if_leading",
    why="""
Close a round: move the watermarks to the round's time, in the transaction that enqueued the
round's occurrences, so both commit or neither does (a crash between them would otherwise fire
an occurrence twice once its first job finished). `greatest` and not an assignment: a watermark
only ever moves FORWARD, and an older round must never rewind it - every occurrence between
the two values would fire a second time. Fenced on leading, as the last
statement before the commit: a leader that lost its lease mid-round gets no rows, and its
round is rolled back.
""",
    sql=f"""
update x_scheduler_state
   set last_fired_at = greatest(last_fired_at, %(at)s::timestamptz), updated_at = now()
 where task_name = any(%(names)s::text[]) and {_LEADING}
returning task_name, last_fired_at
""",
)

SCHEDULER_STATES_LIST = Statement(
    "scheduler_states_list",
    why="""
Every task's watermark and pause flag, for `manage.py xjobs schedule` and the console; includes
rows of tasks no longer configured, so an operator can see them. With them, how many
occurrences the task's overlap policy did not enqueue, and the latest of them.
""",
    sql="""
select task_name, last_fired_at, paused, updated_at, overlap_skipped, overlap_skipped_at
  from x_scheduler_state
 order by task_name
""",
)

SCHEDULER_STATE_SET_PAUSED = Statement(
    "scheduler_state_set_paused",
    why="""
An operator pauses or resumes a task. While paused, rounds keep moving the watermark without
firing; resuming also moves it to at least now, so resuming never replays the paused stretch
even if no leader ran meanwhile. A task that never ran gets its row here, starting from now.
Now is the database's `now()`, the clock the rounds run on, never the operator's: a machine an
hour ahead would otherwise skip the next hour's occurrences, one an hour behind replay the last
hour of the pause.
""",
    sql="""
insert into x_scheduler_state (task_name, last_fired_at, updated_at, paused)
values (%(name)s, now(), now(), %(paused)s)
on conflict (task_name) do update
   set paused = excluded.paused,
       last_fired_at = case when excluded.paused then x_scheduler_state.last_fired_at
                            else greatest(x_scheduler_state.last_fired_at,
                                          excluded.last_fired_at) end,
       updated_at = now()
returning task_name, last_fired_at, paused, updated_at
""",
)


# ------------------------------------------------------------------------------ cron overlap --
# docs/scheduling.md, "Overlap". A run of task T is a job with enqueued_by = 'cron:T' (what the
# round and `xjobs schedule trigger` write). Every read of a task's runs repeats the predicate
# of x_jobs_cron_live_idx (migration 0009), so the planner can prove the index applies.
_CRON_RUN = "enqueued_by like 'cron:%%'"
# The live runs of some cron tasks (cron_runs_live, and locked, cron_runs_lock_live).
_CRON_RUNS_LIVE_SQL = f"""
select enqueued_by, id::text, state, blocked_on, false as held
  from only x_jobs
 where enqueued_by = any(%(enqueued_by)s::text[]) and {_CRON_RUN}
   and state in {LIVE}
 order by id
"""

CRON_RUNS_LIVE = Statement(
    "cron_runs_live",
    why="""
A round's view of the live runs of its due tasks whose overlap policy is skip, read AFTER the
round locked their state rows (scheduler_states_lock_if_leading), so two overlapping rounds
(two leaders across a rolling restart) decide one after the other, the second seeing the runs
the first enqueued. Not locked: skip only looks. Through x_jobs_cron_live_idx (the predicate
`enqueued_by like 'cron:%'` is that index's): a probe per task, whatever the size of x_jobs.
""",
    sql=_CRON_RUNS_LIVE_SQL,
)

CRON_RUNS_LOCK_LIVE = Statement(
    "cron_runs_lock_live",
    why="""
cron_runs_live for the tasks whose overlap policy is buffer_one or cancel_previous, locked.
buffer_one: a run that is finishing right now finishes either before this read (and is not live
here) or after the round commits (and then its finish, through the trigger x_jobs_cron_overlap,
sees the run the round buffered behind it and releases it); without the lock, a finish between
this read and the commit would leave the buffered run blocked until jobs_unblock.
cancel_previous: the runs the round cancels are its own until it commits.

SKIP LOCKED, in id order: a run another transaction holds (a request's lock, an operator's
change not committed yet) is answered `held`, never waited for; the round then leaves that task
for a later round (docs/design.md, "Lock order"). A run that finished after the round's
snapshot is found finished on the row it locks, and is answered held as well: the next round
sees it gone. Through x_jobs_cron_live_idx: a probe per task.
""",
    sql=f"""
with live as materialized (
    select enqueued_by, id, state, blocked_on
      from only x_jobs
     where enqueued_by = any(%(enqueued_by)s::text[]) and {_CRON_RUN}
       and state in {LIVE}
), locked as materialized (
    select id from only x_jobs
     where id in (select id from live) and state in {LIVE}
     order by id
       for no key update skip locked
)
select enqueued_by, id::text, state, blocked_on, id not in (select id from locked) as held
  from live
 order by id
""",
)

CRON_RUNS_HOLD = Statement(
    "cron_runs_hold",
    why="""
overlap="buffer_one": the run a round just enqueued (in this transaction, so no worker has
seen it) waits behind its task's live run: `blocked`, on its own enqueued_by, so no claim picks
it (a claim never takes a `blocked` row). It is released by the trigger x_jobs_cron_overlap
when the last other live run of the task finishes, or by jobs_unblock, the safety net. Only a
row still `ready` or `delayed` and a run of a cron task (`enqueued_by like 'cron:%'`) is held.
""",
    sql=f"""
update only x_jobs
   set state = 'blocked', blocked_on = enqueued_by, blocked_resume = false, updated_at = now()
 where id = any(%(ids)s::uuid[]) and state in ('ready', 'delayed') and {_CRON_RUN}
returning id::text
""",
)

CRON_RUNS_RELEASE = Statement(
    "cron_runs_release",
    why="""
overlap="buffer_one": a round that finds a task's buffered run alone (the run it waited for
finished, and its trigger's release was missed: two runs of the task that finished at once each
saw the other still live) releases it first, in the round's transaction, before it enqueues
anything newer: the older occurrence runs first. Then NOTIFY its queue. The rows were locked by
cron_runs_lock_live in this transaction.
""",
    sql=f"""
with released as (
    update only x_jobs
       set state = case when blocked_resume then 'suspended' else 'ready' end,
           blocked_on = null, blocked_resume = false, updated_at = now()
     where id = any(%(ids)s::uuid[]) and state = 'blocked' and blocked_on = enqueued_by
       and {_CRON_RUN}
    returning id, queue
)
select r.id::text, pg_notify('{CHANNEL}', r.queue) from released r
""",
)

SCHEDULER_STATES_NOTE_SKIPS_IF_LEADING = Statement(
    "scheduler_states_note_skips_if_leading",
    why="""
Record, in the round that decided it, the occurrences a task's overlap policy did not enqueue
(skip; buffer_one's drops; cancel_previous's superseded ones): a count and the latest, for
`manage.py xjobs schedule`. Fenced on leading like every write of the round, and sent only by a
round that skipped something.
""",
    sql=f"""
update x_scheduler_state s
   set overlap_skipped = s.overlap_skipped + k.n,
       overlap_skipped_at = greatest(s.overlap_skipped_at, k.at)
  from unnest(%(names)s::text[], %(counts)s::int[], %(ats)s::timestamptz[]) as k(name, n, at)
 where s.task_name = k.name and {_LEADING}
returning s.task_name
""",
)
