"""History tables: finished jobs out of the hot table, and retention by the day.

A finished job moves from ``x_jobs`` into ``x_jobs_<state>_<yyyymmdd>`` (its state, the UTC day
it finished), a child of ``x_jobs`` by table inheritance, and its run's steps into
``x_job_steps_<state>_<yyyymmdd>`` (docs/design.md, "History tables"). Reads of ``x_jobs``
and ``x_job_steps`` see the children's rows; every statement a worker runs names ``only x_jobs``,
so no claim, acknowledgement or heartbeat touches, plans or locks a history table. The table
names depend on the data, so the moving and the dropping are SQL functions
(``xjobs_history_table``, ``xjobs_archive``, ``xjobs_history_drop``), made by the migration
``0006_history`` and kept as they are today in routines.py; the statements here call them.
"""

from __future__ import annotations

from ...base import Statement

JOBS_ARCHIVE = Statement(
    "jobs_archive",
    why="""
Move one batch (at most `batch` rows) of a finished state's jobs, finished before `before`,
from x_jobs into the history table of their UTC day, with their runs' steps; returns how many
moved (the caller loops until a batch comes back short). Its scans start at `floor`, a finish
time, when it is not null: where the last complete pass ended, so that they do not read the
dead entries the rows it moved left in the index (docs/performance.md, "Under a held
horizon"). One statement per batch and one
transaction: a job is in x_jobs or in its history table, never both nor neither, whatever
kills the connection. The rows are chosen oldest first through x_jobs_finished_idx with FOR
UPDATE SKIP LOCKED, so a row an operator's retry holds is left for the next batch, and their
deletion is a plain DELETE: a late write of a worker waiting on one of them finds it gone
(0 rows, the fence's answer), never an error. A run's steps stay in x_job_steps while another
job of x_jobs has the same run id (a resumed backfill pass reuses its run id).
""",
    sql="select xjobs_archive(%(state)s, %(before)s, %(batch)s, %(floor)s::timestamptz)",
)

HISTORY_DROP = Statement(
    "history_drop",
    why="""
Retention, by the day: drop the history tables (jobs and steps) of a state whose whole UTC day
ended before `before`. One DROP TABLE per day, whatever it holds, instead of a delete per row.
Each DROP waits at most 200 ms (lock_timeout) for the readers of that table: a day it cannot
take at once is dropped by the next run, and no reader queues behind it for longer. Returns the
names of the job tables dropped.
""",
    sql="select xjobs_history_drop(%(state)s, %(before)s)",
)

HISTORY_TABLES = Statement(
    "history_tables",
    why="""
The history tables, newest first, for the console's health panel and `manage.py xjobs health`:
name, an estimate of its rows (the statistics' live-row count, which counts the archive's
inserts as they commit; the planner's reltuples after a crash reset it; never a count(*), which
would read them all), and the size on disk with indexes and steps.
""",
    sql="""
select c.relname::text,
       coalesce(nullif(s.n_live_tup, 0), greatest(c.reltuples, 0))::bigint,
       pg_total_relation_size(c.oid)
       + coalesce(pg_total_relation_size(to_regclass(replace(c.relname::text, 'x_jobs_',
                                                             'x_job_steps_'))), 0)
  from pg_inherits i
  join pg_class c on c.oid = i.inhrelid
  left join pg_stat_user_tables s on s.relid = c.oid
 where i.inhparent = 'x_jobs'::regclass
 order by right(c.relname::text, 8) desc, c.relname
""",
)

# The end of job_unarchive and jobs_unarchive: the rows of the CTE `moved` (deleted from their
# history table) and their runs' steps back into x_jobs and x_job_steps.
BACK_WITH_STEPS = """), steps_moved as (
    delete from x_job_steps s
     where s.run_id = any(array(select run_id from moved))
       and s.tableoid <> 'x_job_steps'::regclass
    returning s.*
), steps_back as (
    insert into x_job_steps select * from steps_moved
)
insert into x_jobs select * from moved
"""

JOB_UNARCHIVE = Statement(
    "job_unarchive",
    why="""
Bring one finished job back from its history table into x_jobs, with its run's steps, before an
operator's retry or cancel changes it: a history table holds one finished state, and a retried
job is live again (its steps are the memos the retry must not run twice). A job already in
x_jobs, or of another tenant under a tenant scope, is left alone (0 rows). Returns the id.
""",
    sql=f"""
with moved as (
    delete from x_jobs j
     where j.id = %(id)s and j.tableoid <> 'x_jobs'::regclass
       and (%(tenant_ids)s::text[] is null or j.tenant_id = any(%(tenant_ids)s::text[]))
    returning j.*
{BACK_WITH_STEPS}returning id
""",
)

JOBS_UNARCHIVE = Statement(
    "jobs_unarchive",
    why="""
job_unarchive for a batch of ids (an operator's retry over a filter, docs/console.md,
"Acting on thousands"): the dead or cancelled ones among them that are in a history table come
back into x_jobs with their runs' steps, in one statement. Rows another transaction holds are
left where they are (SKIP LOCKED: the archive's batch, another operator), and the retry that
follows skips them. Under a tenant scope another tenant's ids match nothing. Returns how many
came back.
""",
    sql=f"""
with victims as (
    select j.id, j.run_id
      from x_jobs j
     where j.id = any(%(ids)s::uuid[]) and j.tableoid <> 'x_jobs'::regclass
       and j.state in ('dead', 'cancelled')
       and (%(tenant_ids)s::text[] is null or j.tenant_id = any(%(tenant_ids)s::text[]))
     order by j.id
       for update skip locked
), moved as (
    delete from x_jobs j
     where j.id = any(array(select id from victims)) and j.tableoid <> 'x_jobs'::regclass
    returning j.*
{BACK_WITH_STEPS}""",
)
