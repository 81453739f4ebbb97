"""History leaves the hot table (docs/design.md, "History tables").

Finished jobs move from ``x_jobs`` into one table per finished state and UTC day,
``x_jobs_<state>_<yyyymmdd>``, a child of ``x_jobs`` by PostgreSQL table inheritance; their
runs' steps move with them into ``x_job_steps_<state>_<yyyymmdd>``, a child of ``x_job_steps``.
A read of ``x_jobs`` (``get_job``, the console, ``Job.objects``) sees the children's rows too;
the worker's statements name ``only x_jobs`` and never touch them. Retention drops a whole day
table: one statement per day, however many rows it holds.

Three functions do the moving and the dropping, because their table names depend on the data
(a day, a state) and a statement cannot take a table name as a parameter. The engine calls them
by the statements of ``engines/postgres/statements/history.py``, whose ``why`` explains each.

Reversing this migration drops the functions and every history table, with their rows.
"""

from django.db import migrations

from django_xjobs.migrations._online import RunDDL

# The history table of a state and day, created on first use with the indexes a reader of
# finished jobs needs (by id, by key, by run id, the console's filters and finished order); no
# claim index, since no row in it is live. Returns the job table's name.
HISTORY_TABLE = r"""
create or replace function xjobs_history_table(p_state text, p_day date) returns text
language plpgsql as $fn$
declare
    v_jobs  text := format('x_jobs_%s_%s', p_state, to_char(p_day, 'YYYYMMDD'));
    v_steps text := format('x_job_steps_%s_%s', p_state, to_char(p_day, 'YYYYMMDD'));
begin
    if p_state not in ('done', 'dead', 'cancelled') then
        raise exception 'xjobs_history_table: % is not a finished state', p_state;
    end if;
    if to_regclass(v_jobs) is not null then
        return v_jobs;
    end if;
    -- Two archivers creating the same day at once: one waits here, then finds the table.
    perform pg_advisory_xact_lock(hashtext('xjobs_history_table'), hashtext(v_jobs));
    if to_regclass(v_jobs) is not null then
        return v_jobs;
    end if;
    execute format($ddl$
        create table %1$I (check (state = %2$L)) inherits (x_jobs);
        alter table %1$I add primary key (id);
        create index %3$I on %1$I (finished_at);
        create index %4$I on %1$I (idempotency_key)
            where idempotency_key <> (id)::text;
        create index %5$I on %1$I (run_id)
            where left((run_id)::text, 13) <> left((id)::text, 13);
        create index %6$I on %1$I using brin
            (name text_bloom_ops(n_distinct_per_range = 100),
             queue text_bloom_ops(n_distinct_per_range = 100),
             tenant_id text_bloom_ops(n_distinct_per_range = 1000),
             created_at timestamptz_minmax_multi_ops, run_at timestamptz_minmax_multi_ops);
        alter table %1$I set (autovacuum_vacuum_insert_scale_factor = 0.02);
        create table %7$I () inherits (x_job_steps);
        alter table %7$I add primary key (id);
        create index %8$I on %7$I (run_id);
        $ddl$,
        v_jobs, p_state, v_jobs || '_finished_idx', v_jobs || '_key_idx',
        v_jobs || '_run_apart_idx', v_jobs || '_brin', v_steps, v_steps || '_run_idx');
    return v_jobs;
end
$fn$
"""

# Move one batch of a state's finished jobs, finished before p_before, from x_jobs into the
# history table of their day, with their steps; returns how many moved. One day per call (the
# oldest), ordered by finished_at, so history tables fill in order. SKIP LOCKED: a row an
# operator or a late worker write holds is left for the next batch. A run's steps stay while
# another row of x_jobs has the same run id (a resumed backfill pass reuses it).
ARCHIVE = r"""
create or replace function xjobs_archive(p_state text, p_before timestamptz, p_batch integer)
returns integer
language plpgsql as $fn$
declare
    v_first timestamptz;
    v_day   date;
    v_from  timestamptz;
    v_to    timestamptz;
    v_jobs  text;
    v_moved integer;
begin
    select finished_at into v_first
      from only x_jobs
     where state = p_state and state in ('done', 'dead', 'cancelled')
       and finished_at < p_before
     order by finished_at
     limit 1;
    if v_first is null then
        return 0;
    end if;
    v_day := (v_first at time zone 'UTC')::date;
    v_from := v_day::timestamp at time zone 'UTC';
    v_to := least(p_before, (v_day + 1)::timestamp at time zone 'UTC');
    v_jobs := xjobs_history_table(p_state, v_day);
    execute format($move$
        with victims as (
            select id, run_id
              from only x_jobs
             where state = $1 and state in ('done', 'dead', 'cancelled')
               and finished_at >= $2 and finished_at < $3
             order by finished_at
             limit $4
               for update skip locked
        ), steps_moved as (
            delete from only x_job_steps s
             where s.run_id = any(array(select v.run_id from victims v
                                         where not exists (
                                             select 1 from only x_jobs o
                                              where o.run_id = v.run_id and o.id <> v.id
                                                and (o.id between
                                                       (left(v.run_id::text, 13)
                                                        || '-0000-0000-000000000000')::uuid
                                                   and (left(v.run_id::text, 13)
                                                        || '-ffff-ffff-ffffffffffff')::uuid
                                                     or left(o.run_id::text, 13)
                                                        <> left(o.id::text, 13)))))
            returning s.*
        ), steps_kept as (
            insert into %2$I select * from steps_moved
        ), moved as (
            delete from only x_jobs j
             where j.id = any(array(select id from victims))
            returning j.*
        )
        insert into %1$I select * from moved
        $move$,
        v_jobs, replace(v_jobs, 'x_jobs_', 'x_job_steps_'))
    using p_state, v_from, v_to, p_batch;
    get diagnostics v_moved = row_count;
    return v_moved;
end
$fn$
"""

# Drop the history tables of a state whose whole day ended before p_before (jobs and steps):
# one DROP per table. A short lock_timeout: a DROP waits for the readers of the table (a console
# page, get_job) and, while it waits, queues the next ones; a day it cannot take at once is
# left for the next run. Returns the names dropped.
DROP_EXPIRED = r"""
create or replace function xjobs_history_drop(p_state text, p_before timestamptz)
returns setof text
language plpgsql as $fn$
declare
    v_table text;
    v_steps text;
begin
    perform set_config('lock_timeout', '200ms', true);
    for v_table in
        select c.relname::text
          from pg_inherits i
          join pg_class c on c.oid = i.inhrelid
         where i.inhparent = 'x_jobs'::regclass
           and c.relname::text ~ ('^x_jobs_' || p_state || '_[0-9]{8}$')
           and (to_date(right(c.relname::text, 8), 'YYYYMMDD') + 1)::timestamp
               at time zone 'UTC' <= p_before
         order by c.relname
    loop
        v_steps := replace(v_table, 'x_jobs_', 'x_job_steps_');
        begin
            execute format('drop table if exists %I, %I', v_table, v_steps);
        exception when lock_not_available then
            continue;
        end;
        return next v_table;
    end loop;
end
$fn$
"""

REVERSE = r"""
do $rev$
declare
    v_table text;
begin
    for v_table in
        select c.relname::text from pg_inherits i join pg_class c on c.oid = i.inhrelid
         where i.inhparent in ('x_jobs'::regclass, 'x_job_steps'::regclass)
    loop
        execute format('drop table %I', v_table);
    end loop;
end
$rev$;
drop function if exists xjobs_history_drop(text, timestamptz);
drop function if exists xjobs_archive(text, timestamptz, integer);
drop function if exists xjobs_history_table(text, date);
"""


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('django_xjobs', '0005_console_indexes'),
    ]

    operations = [
        RunDDL(
            sql=[HISTORY_TABLE, ARCHIVE, DROP_EXPIRED],
            reverse_sql=REVERSE,
            hints={"model_name": "job"},
        ),
    ]
