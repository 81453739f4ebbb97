"""The archive starts where its last pass ended (docs/performance.md, "Under a held horizon").

``xjobs_archive(state, before, batch, from)``: the archive of 0006 with a floor, ``from``, on
the finish time its scans of ``x_jobs_finished_idx`` start at. Every row it moves leaves a dead
entry at the head of that index, which nothing can remove while a long transaction holds the
database's horizon; a scan from the start of the day read all of them at every batch. The
maintenance passes where its last complete pass ended, and no floor once an interval
(django_xjobs/maintenance/pruner.py). The three-argument form, what a worker of the previous
release calls during a rolling deploy, becomes this one without a floor.
"""

import importlib

from django.db import migrations

from django_xjobs.migrations._online import RunDDL

ARCHIVE = r"""
create or replace function xjobs_archive(p_state text, p_before timestamptz, p_batch integer,
                                         p_from timestamptz)
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
       and finished_at >= coalesce(p_from, '-infinity') and finished_at < p_before
     order by finished_at
     limit 1;
    if v_first is null then
        return 0;
    end if;
    v_day := (v_first at time zone 'UTC')::date;
    v_from := greatest(v_day::timestamp at time zone 'UTC', p_from);
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

WITHOUT_FLOOR = r"""
create or replace function xjobs_archive(p_state text, p_before timestamptz, p_batch integer)
returns integer
language sql as $fn$
    select xjobs_archive(p_state, p_before, p_batch, null::timestamptz)
$fn$
"""

# The reverse: the four-argument form dropped, the three-argument one as 0006 made it.
REVERSE = ["drop function if exists xjobs_archive(text, timestamptz, integer, timestamptz)",
           importlib.import_module("django_xjobs.migrations.0006_history").ARCHIVE]


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('django_xjobs', '0013_unknown_jobs'),
    ]

    operations = [
        RunDDL(sql=[ARCHIVE, WITHOUT_FLOOR], reverse_sql=REVERSE, hints={"model_name": "job"}),
    ]
