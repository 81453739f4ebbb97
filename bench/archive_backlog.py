"""The first archive after upgrading from 0.1.0: a backlog of finished jobs leaves x_jobs.

    python bench/archive_backlog.py [--jobs 1000000] [--days 7] [--batch 1000]

0.1.0 kept finished jobs in x_jobs until retention deleted them (7 days of ``done`` and
``cancelled``, 30 of ``dead`` by default). From 0.2.0 on, the scheduler leader's maintenance
thread moves them into the history tables (docs/scheduling.md, "History tables"): within a
second of taking the lead, not at the first full maintenance run, and until none is left, one
``jobs_archive`` statement of ``10 x MAINTENANCE_BATCH`` rows after the other. This script
builds that backlog on a scratch database (``XJOBS_BENCH_DB``, default
``xjobs_bench_archive``): ``--jobs`` finished jobs in ``x_jobs`` itself, finished over the last
``--days`` UTC days (90 % done, 5 % dead, 5 % cancelled; one run in ten with 3 steps), then
runs ``maintenance.pruner.archive`` once, as the leader's first tick does, and prints what it
cost: the time, the statements and the longest, the WAL written, the tables created, and
x_jobs's size before and after (a DELETE leaves dead rows: the space is reused, not returned).

Figures depend on the machine; the database is dropped at the end.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

# Finished jobs as 0.1.0 left them in x_jobs: finished_at spread evenly over the last `days`
# days, the state by the row's number.
FILL = """
insert into x_jobs (id, name, queue, input, idempotency_key, run_id, state, run_at,
                    created_at, updated_at, started_at, finished_at, attempt)
select g.id, 'bench.noop', 'default', jsonb_build_object('i', g.n), g.id::text, g.id,
       case when g.n %% 20 = 0 then 'dead' when g.n %% 20 = 1 then 'cancelled' else 'done' end,
       g.at, g.at, g.at, g.at, g.at, 1
  from (select gen_random_uuid() as id, n,
               now() - %(days)s * interval '1 day' * n / %(total)s as at
          from generate_series(%(lo)s, %(hi)s) as n) g
"""
FILL_STEPS = """
insert into x_job_steps (run_id, name, status, output, started_at, completed_at, kind)
select j.run_id, 'step-' || s, 'completed', '{}'::jsonb, j.finished_at, j.finished_at, 'run'
  from only x_jobs j, generate_series(1, 3) as s
 where (hashtext(j.id::text) %% 10) = 0
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=1_000_000)
    p.add_argument("--days", type=int, default=7)
    p.add_argument("--batch", type=int, default=1000, help="XJOBS['MAINTENANCE_BATCH']")
    args = p.parse_args()

    os.environ.setdefault("XJOBS_BENCH_DB", "xjobs_bench_archive")
    from run import setup_database

    url = setup_database()
    os.environ.update({"XJOBS_BENCH_DATABASE_URL": url,
                       "DJANGO_SETTINGS_MODULE": "xbench_project.settings"})
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from django_xjobs import conf
    from django_xjobs.engines import get_engine
    from django_xjobs.maintenance import pruner

    call_command("migrate", verbosity=0)
    try:
        measure(args, connection, conf, get_engine(), pruner)
    finally:
        connection.close()
        import psycopg

        from tests import devdb

        with psycopg.connect(devdb.with_database(url, "postgres"), autocommit=True) as admin:
            admin.execute(f'drop database if exists "{os.environ["XJOBS_BENCH_DB"]}" '
                          "with (force)")


def measure(args, connection, conf, engine, pruner) -> None:
    def sql(statement: str, params: dict | None = None) -> list[tuple]:
        with connection.cursor() as cur:
            cur.execute(statement, params)
            return cur.fetchall() if cur.description else []

    started = time.perf_counter()
    for lo in range(1, args.jobs + 1, 100_000):
        sql(FILL, {"lo": lo, "hi": min(args.jobs, lo + 99_999), "total": args.jobs,
                   "days": args.days})
    sql(FILL_STEPS, {})
    sql("vacuum analyze x_jobs")
    sql("vacuum analyze x_job_steps")
    sql("checkpoint")
    [(steps,)] = sql("select count(*) from only x_job_steps")
    [(size_before,)] = sql(TOTAL_ONLY)
    print(f"bench: {args.jobs:,} finished jobs ({steps:,} steps) in x_jobs over {args.days} "
          f"days, filled in {time.perf_counter() - started:.0f} s", file=sys.stderr)

    settings = conf.build({"MAINTENANCE_BATCH": args.batch})
    ticks: list[float] = []

    def keep_going() -> bool:  # asked before each statement: the statements' boundaries
        ticks.append(time.perf_counter())
        return True

    [(wal_before,)] = sql("select pg_current_wal_lsn()")
    started = time.perf_counter()
    moved = pruner.archive(engine=engine, settings=settings, keep_going=keep_going)
    elapsed = time.perf_counter() - started
    ticks.append(time.perf_counter())
    [(wal,)] = sql("select pg_wal_lsn_diff(pg_current_wal_lsn(), %(lsn)s)", {"lsn": wal_before})
    [(tables,)] = sql("select count(*) from pg_inherits where inhparent = 'x_jobs'::regclass")
    [(left,)] = sql("select count(*) from only x_jobs")
    [(archived_steps,)] = sql("select count(*) from x_job_steps "
                              "where tableoid <> 'x_job_steps'::regclass")
    [(size_after,)] = sql(TOTAL_ONLY)
    [(history_size,)] = sql(HISTORY_SIZE)
    durations = [b - a for a, b in itertools.pairwise(ticks)]
    mib = 1024 * 1024
    batch = args.batch * pruner.ARCHIVE_BATCH_FACTOR
    print(f"archive: {moved:,} jobs and {archived_steps:,} steps moved in {elapsed:.1f} s "
          f"({moved / elapsed:,.0f} jobs/s), {len(durations):,} statements of at most "
          f"{batch:,} rows, the longest {max(durations) * 1000:,.0f} ms; {left:,} left in "
          f"x_jobs")
    print(f"archive: {tables} history tables created (and as many for the steps); "
          f"WAL written {wal / mib:,.0f} MiB")
    print(f"archive: x_jobs itself (table and indexes) {size_before / mib:,.0f} MiB before, "
          f"{size_after / mib:,.0f} MiB after (dead rows until VACUUM, then space for new "
          f"ones); the history tables {history_size / mib:,.0f} MiB")


# x_jobs's own table and indexes, without its children (the history tables).
TOTAL_ONLY = "select pg_table_size('x_jobs') + pg_indexes_size('x_jobs')"
HISTORY_SIZE = """
select coalesce(sum(pg_total_relation_size(inhrelid)), 0)::bigint
  from pg_inherits where inhparent in ('x_jobs'::regclass, 'x_job_steps'::regclass)
"""


if __name__ == "__main__":
    main()
