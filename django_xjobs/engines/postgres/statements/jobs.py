"""x_jobs: a claimed job's run to its fenced settlement, and what else changes a job after its
enqueue (docs/architecture.md).

In the order a run meets them: the fenced writes of a run, its heartbeat and the fence check;
then an operator's actions and the queue counts, the early wake-up of jobs handed back
(jobs_wake_refused, Job.objects.wake_refused), and the test kit's shift of due times. The
enqueue is in enqueue.py, the claim (and the test kit's claim of one job) in claim.py, the
deletion of finished jobs in maintenance.py, the reads of whole job rows in reads.py.
"""

from __future__ import annotations

from ...base import Statement
from .fragments import (
    CHANNEL,
    JOB_COLUMNS,
    LIVE,
    REQUEUE_SET,
    RUN_PAIRS,
    SETTLE_COLUMNS,
    attempt_entry_sql,
    by_key,
    cancel_set_sql,
    count_sql,
    elapsed_ms_sql,
    free_runs_sql,
    held_runs_sql,
    notify_queues_sql,
    settle_locks_sql,
)
from .slots import HANDED_OVER, release_ctes, release_summary

# --------------------------------------------------------------------------- fenced writes --

# jobs_complete_if_owned's CTEs (`v`, the runs' pairs and results; `free`, their rows locked;
# the settle locks; `settled`, the rows written; `tallied`, the counters), shared with
# jobs_complete_release_if_owned.
COMPLETE_CTES = f"""v as (
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
)"""

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
with {COMPLETE_CTES}
select lease_token::text, true from settled
union all
select token::text, false from ({held_runs_sql("v", "settled")}) busy
""",
)

JOBS_COMPLETE_RELEASE_IF_OWNED = Statement(
    "jobs_complete_release_if_owned",
    why="""
jobs_complete_if_owned and slots_release_if_held in one statement: the settle of runs that
held concurrency slots, and the release of their slots with its hand-over, so a slot's cycle
is one statement (run -> this -> the next run of the key; docs/performance.md, "Flow control").

The acknowledgement is jobs_complete_if_owned's, word for word, and comes first in the lock
order (its x_jobs rows by id, their parents' step rows, their windows' key rows); the release
is slots_release_if_held's (the slot rows by (lease_key, slot), then the blocked job rows it
hands over or wakes), all SKIP LOCKED. A run whose row another transaction holds (`busy`) is
not settled, and keeps its slot: its hold is left out of the release (`hold_tokens`, the lease
token of the run that holds each slot), and the worker releases it with that run's later
settle. A run that lost its job (cancelled, re-claimed) releases its slot here, as after any
settle. The commit is the acknowledgement's: synchronous.

The answer: one row per run (`landed` or `busy`, its token), then the release's (`release`,
as slots_release_if_held answers) and one row per job handed over (`job`), each after a first
column that says which.
""",
    sql=f"""
with {COMPLETE_CTES}, busy_runs as materialized (
    {held_runs_sql("v", "settled")}
), holds as (
    select h.lease_key, h.slot, h.holder, h.lim
      from unnest(%(keys)s::text[], %(slots)s::int[], %(holders)s::text[], %(limits)s::int[],
                  %(hold_tokens)s::uuid[]) as h(lease_key, slot, holder, lim, token)
     where h.token not in (select token from busy_runs)
), {release_ctes("holds")}
select 'release', {release_summary("holds")}
union all
select 'job', {HANDED_OVER}
  from handed
union all
select 'landed', lease_token::text, null, null, null, null, null, null, null, null, null, null,
       null, null, null, null, null, null, null, null
  from settled
union all
select 'busy', token::text, null, null, null, null, null, null, null, null, null, null, null,
       null, null, null, null, null, null, null
  from busy_runs
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
A run that raised Retry(max_attempts=n) gives the bound itself (`bound`: dead at attempt n,
lower or higher than the row's), and a higher one is kept as the row's max_attempts.
Answers the state and run_at it wrote: a retry's line in the worker's log says when the next
attempt is due, on the database's clock.
""",
    sql=f"""
with {_ONE_RUN}, free as materialized (
    {free_runs_sql("one", SETTLE_COLUMNS)}
), {settle_locks_sql("free")}, settled as (
    update only x_jobs
       set state       = case when %(permanent)s
                                   or attempt >= coalesce(%(max_attempts)s::int, max_attempts)
                              then 'dead'
                              when %(delay_ms)s > 0 then 'delayed' else 'ready' end,
           run_at      = case when %(permanent)s
                                   or attempt >= coalesce(%(max_attempts)s::int, max_attempts)
                              then run_at
                              else now() + %(delay_ms)s * interval '1 millisecond' end,
           finished_at = case when %(permanent)s
                                   or attempt >= coalesce(%(max_attempts)s::int, max_attempts)
                              then now() end,
           max_attempts = greatest(max_attempts, coalesce(%(max_attempts)s::int, 0)),
           visible_at  = null,
           last_error  = %(error)s,
           attempts    = {attempt_entry_sql("%(outcome)s::text", error="%(error)s::text")},
           updated_at  = now()
     where id = any(array(select id from free where id not in (select id from stuck)))
    returning id, state, queue, name, run_at, {elapsed_ms_sql("started_at")} as run_ms
), tallied as (
    {count_sql("settled", failed="count(*)", dead="count(*) filter (where state = 'dead')",
               run_ms="array_agg(run_ms)", run_ms_sum="sum(run_ms)")}
)
select state, run_at from settled
union all
select 'busy', null::timestamptz from ({held_runs_sql("one", "settled")}) busy
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


# docs/durable.md, "Repairing a dead workflow": the failed step of a workflow that died of a
# ChildFailed, the latest invoke or gather step (in the order first reached) whose recorded
# outcome names a failed child.
def _failed_step_sql(flow: str) -> str:
    """The failed step of the workflow ``flow`` (a row of job_resume_plan's tree), if any."""
    return f"""select s.id, s.name, s.output -> 'children' as children
          from x_job_steps s
         where s.run_id = {flow}.run_id and {flow}.child_failed and s.kind = 'invoke'
           and s.status = 'completed' and s.output ? 'failed'
         order by s.id desc
         limit 1"""


JOB_RESUME_PLAN = Statement(
    "job_resume_plan",
    why="""
What a resume of a dead workflow would change, read before it changes anything. One row per
child of each failed step, with the child's state and tenant (none: the child is gone): the
failed step of the job (`dead`, in the tenant scope), when its recorded error is a
ChildFailed, then the same for each of those children that is itself a dead workflow, down
the tree (at most `limit` levels). The job's own row comes back in any case, with no step when
its failure was not a child's, and says whether its run recorded any step. x_jobs and
x_job_steps with their history tables: a dead family may have been archived. No lock:
job_resume takes the locks and checks all of it again.
""",
    sql=f"""
with recursive flow(id, run_id, depth, child_failed) as (
    select j.id, j.run_id, 0, coalesce(starts_with(j.last_error, %(error_prefix)s), false)
      from x_jobs j
     where j.id = %(id)s and j.state = 'dead'
       and (%(tenant_ids)s::text[] is null or j.tenant_id = any(%(tenant_ids)s::text[]))
    union all
    select c.id, c.run_id, f.depth + 1, true
      from flow f
      cross join lateral ({_failed_step_sql("f")}) s
      cross join lateral jsonb_array_elements_text(s.children) as ch(id)
      join x_jobs c on c.id = ch.id::uuid
     where f.depth < %(limit)s
       and c.state = 'dead' and starts_with(c.last_error, %(error_prefix)s)
)
select f.id, f.depth = 0 and exists (select 1 from x_job_steps where run_id = f.run_id),
       s.id, s.name, ch.n, ch.id::uuid, c.state, c.tenant_id
  from flow f
  left join lateral ({_failed_step_sql("f")}) s on true
  left join lateral jsonb_array_elements_text(s.children) with ordinality as ch(id, n) on true
  left join x_jobs c on c.id = ch.id::uuid
 order by f.depth, f.id, ch.n
""",
)

JOB_RESUME = Statement(
    "job_resume",
    why="""
An operator's resume of a dead workflow (docs/durable.md, "Repairing a dead workflow"), in one
statement, as the plan (job_resume_plan) read it: the workflow and each child to retry (`ids`,
the workflow first) become `ready` with a fresh attempt budget and the SAME run_id, as
job_retry makes them, and each failed invoke or gather step (`step_ids`) is opened again, so
that the replay waits for the same children instead of raising the recorded ChildFailed:
`invoking`, its outcome cleared (the children's ids kept), `pending` the children live before
this statement (x_jobs_transition counts one more for each child retried here), and, if it had
a timeout, a fresh one of the same length. Every job must still be `dead` or `cancelled` (and
in the tenant scope) and every step still the failed one, or nothing is written (no row: the
caller says the family changed meanwhile). Locks in the order of docs/design.md ("Lock order"),
waiting as an operator's statement does: the jobs' rows by id; then the step rows by (run_id,
name), those reopened and the invoke steps of the jobs' parents, which the trigger counts; then
the key rows of the jobs' idempotency windows. As for job_retry, the live-key index refuses a
job whose key another live job holds (the engine reports that job).
""",
    sql=f"""
with locked as materialized (
    select {SETTLE_COLUMNS} from only x_jobs
     where id = any(%(ids)s::uuid[]) and state in ('dead', 'cancelled')
       and (%(tenant_ids)s::text[] is null or tenant_id = any(%(tenant_ids)s::text[]))
     order by id
       for no key update
), steps_locked as materialized (
    select s.id, s.status = 'completed' and s.output ? 'failed' as failed
      from only x_job_steps s
     where s.id = any(%(step_ids)s::bigint[])
        or (s.status = 'invoking' and (s.run_id, s.name) in (
                select p.run_id, l.parent_step
                  from locked l join only x_jobs p on p.id = l.parent_id))
     order by s.run_id, s.name
       for no key update
), keys_locked as materialized (
    select k.id
      from x_job_keys k
      join locked l on k.name = l.name and k.tenant = coalesce(l.tenant_id, '')
                   and k.key = l.idempotency_key and k.job_id = l.id
     where l.unique_for_ms is not null
     order by k.id
       for no key update of k
), checked as (
    select (select count(*) from locked) = cardinality(%(ids)s::uuid[])
       and (select count(*) from steps_locked
             where failed and id = any(%(step_ids)s::bigint[]))
           = cardinality(%(step_ids)s::bigint[])
       and (select count(*) from keys_locked) >= 0 as ok
), retried as (
    update only x_jobs
       set state = 'ready', attempt = 0, run_at = now(), visible_at = null, lease_token = null,
           finished_at = null, result = null, updated_at = now(),
           enqueued_by = coalesce(%(enqueued_by)s, enqueued_by)
     where id in (select id from locked) and (select ok from checked)
    returning {JOB_COLUMNS}
), reopened as (
    update only x_job_steps s
       set status = 'invoking', output = jsonb_build_object('children', s.output -> 'children'),
           pending = (select count(*)
                        from jsonb_array_elements_text(s.output -> 'children') as ch(id)
                        join only x_jobs c on c.id = ch.id::uuid
                       where c.state in {LIVE}),
           started_at = now(), completed_at = null, wake_at = now() + (s.wake_at - s.started_at)
     where s.id = any(%(step_ids)s::bigint[]) and (select ok from checked)
    returning s.id
)
select {JOB_COLUMNS}, {notify_queues_sql("retried")}
  from retried
 where id = %(id)s and (select count(*) from reopened) >= 0
""",
)

JOBS_RETRY_MANY = Statement(
    "jobs_retry_many",
    why="""
job_retry for a batch of ids, in one statement (an operator's retry over a filter,
docs/console.md, "Acting on thousands"): the dead and cancelled ones become `ready` with a fresh
attempt budget and the same run_id, due now. The rows are locked in id order (docs/design.md,
"Lock order") with SKIP LOCKED: a row another transaction holds is skipped, never waited for,
and reported as not retried. A keyed job is retried only when no live job holds its key and,
of the batch's jobs with one key, only the newest: the live-key unique index would refuse the
whole statement otherwise. (An enqueue of the same key committed between this statement's
snapshot and its update still makes the index refuse it; the engine then retries that batch
one job at a time.) Returns the ids retried, and one NOTIFY per queue.
""",
    sql=f"""
with locked as (
    select id, name, tenant_id, idempotency_key
      from only x_jobs
     where id = any(%(ids)s::uuid[]) and state in ('dead', 'cancelled')
       and (%(tenant_ids)s::text[] is null or tenant_id = any(%(tenant_ids)s::text[]))
     order by id
       for no key update skip locked
), keyed as (
    select distinct on (k.name, coalesce(k.tenant_id, ''), k.idempotency_key) k.id
      from locked k
     where k.idempotency_key <> k.id::text
       and not exists (select 1 from only x_jobs l
                        where l.name = k.name
                          and coalesce(l.tenant_id, '') = coalesce(k.tenant_id, '')
                          and l.idempotency_key = k.idempotency_key
                          and l.idempotency_key <> l.id::text
                          and l.state in {LIVE})
     order by k.name, coalesce(k.tenant_id, ''), k.idempotency_key, k.id desc
), chosen as (
    select id from locked where idempotency_key = id::text
    union all
    select id from keyed
), retried as (
    update only x_jobs j
       set state = 'ready', attempt = 0, run_at = now(), visible_at = null, lease_token = null,
           finished_at = null, result = null, updated_at = now(),
           enqueued_by = coalesce(%(enqueued_by)s, enqueued_by)
     where {by_key("chosen")}
    returning j.id, j.queue
)
select id, {notify_queues_sql("retried")} from retried
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
# django_xjobs.testing (docs/testing.md): travel()'s shift of due times (the inline test mode's
# claim of the one job it runs is in claim.py). It runs on the caller's connection like every
# statement, so inside a TestCase's transaction too.

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
