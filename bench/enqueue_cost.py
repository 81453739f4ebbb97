"""What one enqueue costs on the server and in Python (docs/performance.md, "What a single
enqueue costs"): µs per statement, ``--n`` statements in ONE transaction (no commit flush,
which costs every variant alike), ``--rounds`` rounds in shuffled order: the least of them (the
round least disturbed by the rest of a shared machine) and their median.

    python bench/enqueue_cost.py [--n 1500] [--rounds 7]

Rows: the raw reference's INSERT + NOTIFY (the peers' harness); ``job_enqueue_unkeyed`` as
it is; without its counters' delta insert; that, into a copy of ``x_jobs`` with every index and
into one with its primary key only; the bare statement through psycopg and ``noop.enqueue``
through the whole API, on Django's connection. The database is a fresh ``xjobs_bench_enqueue``
(``XJOBS_BENCH_DB`` names another) on the server ``tests/devdb.py`` picks. Nothing here is a
test; nothing asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]

RAW = ("WITH j AS (INSERT INTO raw_jobs (task, args) VALUES (%s, %s) RETURNING id) "
       "SELECT pg_notify('rawq', '') FROM j")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=1500, help="statements per measurement")
    p.add_argument("--rounds", type=int, default=9)
    args = p.parse_args()
    os.environ.setdefault("XJOBS_BENCH_DB", "xjobs_bench_enqueue")
    import run  # bench/run.py: its fresh database

    url = run.setup_database()
    os.environ.update(XJOBS_BENCH_DATABASE_URL=url,
                      DJANGO_SETTINGS_MODULE="xbench_project.settings")
    import django
    import psycopg

    django.setup()
    from django.core.management import call_command
    from django.db import connection, transaction
    from xbench_project.benchjobs.jobs import noop

    from django_xjobs.engines.postgres.statements import enqueue as statements
    from django_xjobs.records import new_ids

    call_command("migrate", verbosity=0)
    noop.enqueue(i=-1)  # Django's connection open, the API's statement prepared
    # Server-side binding, each statement prepared once, as the engine runs them: Django's own
    # cursors (and so conn.execute) bind on the client, parsing and planning every statement.
    conn = connection.connection
    conn.prepare_threshold = 0
    cursor = psycopg.Cursor(conn)
    for ddl in ("create table xc_all (like x_jobs including all)",
                "create table xc_pk (like x_jobs including defaults including constraints)",
                "alter table xc_pk add primary key (id)",
                "create table raw_jobs (id bigserial primary key, task text not null, "
                "args jsonb not null, created_at timestamptz default now())"):
        conn.execute(ddl)
    full = statements.JOB_ENQUEUE_UNKEYED.sql
    no_delta = re.sub(r"\), tallied as \(.*?having count\(\*\) > 0\n\)", ")", full, flags=re.S)
    assert "x_stat_deltas" not in no_delta, "the statement's shape changed: update this script"

    def statement(sql: str) -> Callable[[int], None]:
        def one(i: int) -> None:
            job_id, run_id = new_ids(2)
            cursor.execute(sql, {
                "id": job_id, "run_id": run_id, "name": "bench.noop", "queue": "default",
                "input": json.dumps({"i": i}), "max_attempts": 25, "priority": 0,
                "run_at": None, "delay_ms": 0, "tenant_id": None, "traceparent": None,
                "enqueued_by": "bench", "concurrency_key": None, "rate_key": None,
                "notify": True,
            }).fetchone()
        return one

    rows: dict[str, Callable[[int], None]] = {
        "raw reference: insert + notify": lambda i: cursor.execute(
            RAW, ("noop", json.dumps({"i": i}))).fetchone(),
        "job_enqueue_unkeyed": statement(full),
        "  without the counters' delta insert": statement(no_delta),
        "  that, into a copy of x_jobs with every index": statement(
            no_delta.replace("insert into x_jobs", "insert into xc_all")),
        "  that, into a copy with the primary key only": statement(
            no_delta.replace("insert into x_jobs", "insert into xc_pk")),
        "noop.enqueue(i=i), the whole API": lambda i: noop.enqueue(i=i),
    }
    timings: dict[str, list[float]] = {label: [] for label in rows}
    for _ in range(args.rounds):
        order = list(rows.items())
        random.shuffle(order)
        for label, one in order:
            conn.execute("truncate x_jobs, x_stat_deltas, xc_all, xc_pk, raw_jobs")
            with transaction.atomic():
                t0 = time.perf_counter()
                for i in range(args.n):
                    one(i)
                timings[label].append((time.perf_counter() - t0) / args.n * 1e6)
    print(f"\n| in one transaction, µs per statement ({args.n} a round) | least of {args.rounds} "
          "| median |")
    print("|---|---:|---:|")
    for label, values in timings.items():
        print(f"| {label.strip()} | {min(values):.0f} | {statistics.median(values):.0f} |")


if __name__ == "__main__":
    main()
