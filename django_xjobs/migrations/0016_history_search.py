"""The history tables answer the console's searches and filters by index (docs/console.md,
"Finding the job"; docs/performance.md, "The console at ten million jobs").

Every history table gets, besides the indexes of 0006:

* b-tree indexes on ``(queue, id)``, ``(name text_pattern_ops, id)``, ``(tenant_id, id)`` and
  ``(claimed_by text_pattern_ops, id)``: the jobs list filtered by one of them is read newest
  first from the index, and a value no job has costs one probe per table. (0006's BRIN bloom
  summary answered them by reading every range of every table, and every range the archive had
  filled since the last vacuum: 148 to 437 ms at two million jobs.) ``text_pattern_ops``
  answers a pattern's literal prefix (``shop.%``, a host's workers) whatever the collation;
* GIN indexes on the words of the input's values (``_input_words_idx``) and on those of the
  last error (``_error_words_idx``), which the search box and the error filter use; two, not
  one over both, so that the planner has each one's statistics (an error's words are common
  among the dead jobs and absent from the rest);

and every history steps table an index on ``(status, id)``: the steps list filtered by status.

x_jobs itself gets none of them: every index of the hot table is written by each claim and
acknowledgement; its rows are the live jobs and those finished in the last ARCHIVE_AFTER.

``xjobs_history_table`` creates them with each new table. The tables already there get them
CONCURRENTLY, one statement each, under the lock timeout of ``_online``: the archive's inserts
into today's table and the readers go on meanwhile; then each table is analyzed, so the planner
knows which words are common (the archive's new tables are analyzed by autovacuum). A migration interrupted midway resumes
where it stopped (``if not exists``; an invalid index left by an interrupted build is dropped
first).
"""

import importlib

from django.db import migrations

from django_xjobs.migrations._online import RunDDL, _drop_invalid_index, run_ddl

# (index name suffix, what follows "on <table>") of the job tables, then of the steps tables.
JOB_INDEXES = [
    ("queue_idx", "(queue, id)"),
    ("name_idx", "(name text_pattern_ops, id)"),
    ("tenant_idx", "(tenant_id, id)"),
    ("worker_idx", "(claimed_by text_pattern_ops, id)"),
    ("input_words_idx", "using gin (jsonb_to_tsvector('simple'::regconfig, input, "
                        "'[\"string\", \"numeric\"]'::jsonb))"),
    ("error_words_idx", "using gin (to_tsvector('simple'::regconfig, last_error)) "
                        "where last_error is not null"),
]
STEP_INDEXES = [("status_idx", "(status, id)")]

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
        create index %9$I on %1$I (queue, id);
        create index %10$I on %1$I (name text_pattern_ops, id);
        create index %11$I on %1$I (tenant_id, id);
        create index %12$I on %1$I (claimed_by text_pattern_ops, id);
        create index %13$I on %1$I using gin
            (jsonb_to_tsvector('simple'::regconfig, input, '["string", "numeric"]'::jsonb));
        create index %15$I on %1$I using gin (to_tsvector('simple'::regconfig, last_error))
            where last_error is not null;
        alter table %1$I set (autovacuum_vacuum_insert_scale_factor = 0.02);
        create table %7$I () inherits (x_job_steps);
        alter table %7$I add primary key (id);
        create index %8$I on %7$I (run_id);
        create index %14$I on %7$I (status, id);
        $ddl$,
        v_jobs, p_state, v_jobs || '_finished_idx', v_jobs || '_key_idx',
        v_jobs || '_run_apart_idx', v_jobs || '_brin', v_steps, v_steps || '_run_idx',
        v_jobs || '_queue_idx', v_jobs || '_name_idx', v_jobs || '_tenant_idx',
        v_jobs || '_worker_idx', v_jobs || '_input_words_idx', v_steps || '_status_idx',
        v_jobs || '_error_words_idx');
    return v_jobs;
end
$fn$
"""

HISTORY_TABLES = """
select c.relname::text, i.inhparent = 'x_jobs'::regclass
  from pg_inherits i join pg_class c on c.oid = i.inhrelid
 where i.inhparent in ('x_jobs'::regclass, 'x_job_steps'::regclass)
 order by 1
"""


def index_existing(apps, schema_editor):
    """The new indexes on the history tables already there, one CONCURRENTLY each."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(HISTORY_TABLES)
        tables = cursor.fetchall()
    for table, of_jobs in tables:
        for suffix, definition in JOB_INDEXES if of_jobs else STEP_INDEXES:
            sql = (f'create index concurrently if not exists "{table}_{suffix}" '
                   f'on "{table}" {definition}')
            _drop_invalid_index(schema_editor, sql)  # left by an interrupted build
            run_ddl(schema_editor, sql)
        # The statistics of the words index's expression, which only ANALYZE gathers: without
        # them the planner guesses every word rare, and reads a common one's every match.
        run_ddl(schema_editor, f'analyze "{table}"')


def unindex_existing(apps, schema_editor):
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(HISTORY_TABLES)
        tables = cursor.fetchall()
    for table, of_jobs in tables:
        for suffix, _definition in JOB_INDEXES if of_jobs else STEP_INDEXES:
            run_ddl(schema_editor, f'drop index concurrently if exists "{table}_{suffix}"')


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('django_xjobs', '0015_fair_tenant_index'),
    ]

    operations = [
        RunDDL(sql=[HISTORY_TABLE],
               reverse_sql=[importlib.import_module(
                   "django_xjobs.migrations.0006_history").HISTORY_TABLE],
               hints={"model_name": "job"}),
        migrations.RunPython(index_existing, unindex_existing, hints={"model_name": "job"}),
    ]
