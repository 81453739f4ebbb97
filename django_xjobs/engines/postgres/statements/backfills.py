"""x_backfills: the progress row of a resumable backfill pass (docs/backfills.md).

A worker's writes are fenced on its run still owning the pass's job, with that job's row locked
(``_BACKFILL_OWNER``), and run inside the batch's own transaction; an operator's create and
cancel, and the listing, are not fenced.
"""

from __future__ import annotations

from ...base import Statement
from .fragments import RUN_OWNER_BUSY, run_owner_sql

# The fence of every backfill write a worker makes: the pass's job row, still owned by this run,
# LOCKED until the end of the writer's transaction. A plain EXISTS is not enough here: under READ
# COMMITTED it reads a snapshot taken when the statement started, so a re-claim committed a moment
# later would not stop a stale run from committing a whole batch of the user's writes, and the
# new run could read the cursor from before it (and process those rows again). FOR UPDATE
# re-checks the newest row version; once held, no claim (SKIP LOCKED) or cancel can change the
# job before the batch commits. SKIP LOCKED: a row another transaction holds (an operator's
# cancel not committed yet, a request) is not waited for; the write then writes nothing and
# answers `busy` (_BUSY), and the run writes again once the row is free (docs/design.md, "Lock
# order"). The worker's heartbeat, which skips a row held here, keeps the run's lease beside it
# meanwhile. Lock order is x_jobs then x_backfills everywhere (backfills.cancel too).
_BACKFILL_OWNER = run_owner_sql("for update")
# The last column of every fenced answer: nothing written because another transaction holds the
# job's row, which is still this run's.
_BUSY = RUN_OWNER_BUSY

BACKFILL_COLUMNS = (
    "run_id, name, status, rows_processed, last_cursor, checksum, app_version, started_at,"
    " completed_at, updated_at, error, job_id, code_changes"
)

BACKFILL_CREATE = Statement(
    "backfill_create",
    why="""
Record a pass as `pending` in the same transaction that enqueues its job, so `xjobs_backfill
show RUN_ID` and `--list` find it before any worker has claimed it. `do nothing` on a second
create of the same run: the row a worker already opened is never reset by an operator.
""",
    sql="""
insert into x_backfills
    (run_id, name, status, checksum, app_version, job_id, started_at, updated_at)
values (%(run_id)s::uuid, %(name)s, 'pending', %(checksum)s, %(app_version)s, %(job_id)s::uuid,
        now(), now())
on conflict (run_id) do nothing
""",
)

BACKFILL_START_IF_OWNED = Statement(
    "backfill_start_if_owned",
    why="""
Open the pass's row, or adopt the one an earlier attempt of the SAME run (same run_id) left:
`do update` because a failed or killed attempt left it `failed` or `running`, and a cancelled
pass may be resumed by a retry. Adopting keeps started_at, checksum, app_version and the
progress (rows_processed, last_cursor) where the last attempt got to, and clears completed_at,
which a failure or cancel stamped: otherwise a list would show a running pass with a
completion time in the past. A `pending` row (created by `start`) becomes the pass
as it really begins: started_at, checksum and app_version of the code that runs it.

A `completed` row stays completed and is returned as such: its job is running again only
because the ack after the final batch was lost (a crash between the commit and the ack), and
re-opening it with its cleared cursor would start the pass over.

A resume under code whose checksum differs from the code the pass last ran with appends one
entry to code_changes (the audit of which code processed which rows), and only one per change.
Fenced on the job's ownership, locked (see _BACKFILL_OWNER): nothing happens for a stale run.
""",
    sql=f"""
with {_BACKFILL_OWNER}, written as (
insert into x_backfills as b
    (run_id, name, status, checksum, app_version, job_id, started_at, updated_at)
select %(run_id)s::uuid, %(name)s, 'running', %(checksum)s, %(app_version)s, owner.id, now(),
       now()
  from owner
on conflict (run_id) do update
   set status       = case when b.status = 'completed' then 'completed' else 'running' end,
       completed_at = case when b.status = 'completed' then b.completed_at end,
       started_at   = case when b.status = 'pending' then now() else b.started_at end,
       checksum     = case when b.status = 'pending' then excluded.checksum else b.checksum end,
       app_version  = case when b.status = 'pending' then excluded.app_version
                           else b.app_version end,
       code_changes = case
           when b.status in ('pending', 'completed')
             or coalesce(b.code_changes -> -1 ->> 'checksum', b.checksum)
                is not distinct from excluded.checksum
           then b.code_changes
           else b.code_changes || jsonb_build_array(jsonb_build_object(
                    'checksum', excluded.checksum, 'app_version', excluded.app_version,
                    'at', now(), 'rows_processed', b.rows_processed))
       end,
       job_id       = excluded.job_id,
       updated_at   = now()
returning {BACKFILL_COLUMNS}
)
select w.*, {_BUSY} from (select 1) one left join written w on true
""",
)

BACKFILL_PROGRESS_IF_OWNED = Statement(
    "backfill_progress_if_owned",
    why="""
Advance a pass past one batch, INSIDE the batch's own transaction: the user's writes and the
cursor commit together or not at all, so a crash anywhere resumes exactly after the last
committed batch and no row is processed twice (tests/acceptance/test_backfills.py). A NULL
answer means the run lost its job (cancelled, re-claimed after a lapse) or the pass is no
longer running: the caller rolls the batch back; `busy`, that another transaction holds the
job's row: the caller writes again. Fenced and locked (see _BACKFILL_OWNER).
""",
    sql=f"""
with {_BACKFILL_OWNER}, written as (
update x_backfills b
   set rows_processed = b.rows_processed + %(processed)s::bigint,
       last_cursor    = %(cursor)s::jsonb,
       updated_at     = now()
  from owner
 where b.run_id = %(run_id)s::uuid and b.status = 'running'
returning b.rows_processed as answer
)
select (select answer from written), {_BUSY}
""",
)

BACKFILL_COMPLETE_IF_OWNED = Statement(
    "backfill_complete_if_owned",
    why="""
The final batch: its progress and the completion commit in the batch's transaction. A separate
"finish" after the last batch's commit would leave a crash window in which the pass is
`running` with the final (cleared) cursor, and the resumed pass would start over. Completion
clears the cursor; nothing is left to resume. Fenced and locked like every batch.
""",
    sql=f"""
with {_BACKFILL_OWNER}, written as (
update x_backfills b
   set rows_processed = b.rows_processed + %(processed)s::bigint,
       last_cursor    = null,
       status         = 'completed',
       completed_at   = now(),
       updated_at     = now()
  from owner
 where b.run_id = %(run_id)s::uuid and b.status = 'running'
returning b.rows_processed as answer
)
select (select answer from written), {_BUSY}
""",
)

BACKFILL_FAIL_IF_OWNED = Statement(
    "backfill_fail_if_owned",
    why="""
A batch raised and was rolled back: the pass is `failed` with the error, and KEEPS its cursor
(the last committed batch): where a pass stopped is the first thing anyone asks about one, and
a retry resumes exactly there. completed_at stamps when it stopped; a retry clears it again.
Fenced and locked: a stale run's late failure must not mark the new run's pass failed.
""",
    sql=f"""
with {_BACKFILL_OWNER}, written as (
update x_backfills b
   set status = 'failed', error = %(error)s, completed_at = now(), updated_at = now()
  from owner
 where b.run_id = %(run_id)s::uuid and b.status = 'running'
returning b.run_id as answer
)
select (select answer from written), {_BUSY}
""",
)

BACKFILL_CANCEL = Statement(
    "backfill_cancel",
    why="""
An operator stops a pass (`xjobs_backfill cancel`), in the transaction that also cancels its
job, which comes first (lock order x_jobs, then x_backfills, as in every batch). The job's
cancel is what stops the worker: its next batch's fence finds no owned job and rolls back. A
completed pass has nothing to stop; a pending, running or failed one becomes `cancelled`, its
cursor kept, so `xjobs_backfill retry` can resume it later.
""",
    sql=f"""
update x_backfills
   set status = 'cancelled', completed_at = now(), updated_at = now()
 where run_id = %(run_id)s::uuid and status in ('pending', 'running', 'failed')
returning {BACKFILL_COLUMNS}
""",
)

BACKFILLS_LIST = Statement(
    "backfills_list",
    why="""
Passes for `xjobs_backfill --list` and `show`, newest first, each with the state of its job (a
pass `running` whose job is cancelled or gone is visible as such). Every filter is optional.
The run id parameter is cast to uuid in BOTH places, because run_id IS a uuid: a null test cast
to text would type the parameter as text, and `uuid = text` has no operator, so every call
would fail, filtered or not (tests/conformance/test_backfills.py pins the filter). An
operator types this value by hand: the command checks it is a uuid before it gets here.
""",
    sql="""
select b.run_id, b.name, b.status, b.rows_processed, b.last_cursor, b.checksum, b.app_version,
       b.started_at, b.completed_at, b.updated_at, b.error, b.job_id, b.code_changes,
       j.state, j.attempt
  from x_backfills b
  left join x_jobs j on j.id = b.job_id
 where (%(name)s::text is null or b.name = %(name)s::text)
   and (%(status)s::text is null or b.status = %(status)s::text)
   and (%(run_id)s::uuid is null or b.run_id = %(run_id)s::uuid)
 order by b.started_at desc, b.run_id desc
 limit %(limit)s
""",
)
