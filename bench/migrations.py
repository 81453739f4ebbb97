"""What does each migration cost a live system? (``make bench-migrations``)

    python bench/migrations.py [--jobs 10000000] [--steps 1000000] [--interval-ms 5] [--keep]

Builds a fresh ``xjobs_bench_migrations`` database (``XJOBS_BENCH_DB`` names another) at the
schema of migration 0001 (the first release's), fills ``x_jobs`` with ``--jobs`` rows (97%
finished: done, dead, cancelled; the rest live: ready, delayed, running) and ``x_job_steps``
with ``--steps`` rows, server-side (``generate_series``; ids minted in time order as the
application's are; the indexes 0001 made are built after the fill), then VACUUM ANALYZE.

Then it applies each later migration of django_xjobs one at a time (``migrate django_xjobs
0002``, ``0003``, ...), in this process, while a producer (a connection of its own) enqueues a
job every ``--interval-ms`` with the plain INSERT a client of the 0001 schema sends, timing each
insert. For each migration it prints the wall time, the strongest lock its statements take on
``x_jobs``/``x_job_steps`` (read from the SQL sqlmigrate prints: what each kind of statement
takes, per PostgreSQL's documentation of explicit locking), and the producer's longest insert
while it ran: how long an enqueue stalled. The database is dropped at the end unless ``--keep``.
Figures depend on the machine; nothing here is a test.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import threading
import time
from io import StringIO
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]

FILL_JOBS = """
insert into x_jobs (id, name, queue, idempotency_key, run_id, attempt, state, run_at,
                    created_at, updated_at, started_at, finished_at, enqueued_by, tenant_id)
select g.id, 'shop.job_' || (g.n %% 20), (array['default', 'emails', 'payments'])[1 + g.n %% 3],
       case when g.n %% 3 = 0 then 'order:' || g.n else g.id::text end, g.id, 1,
       case when g.n %% 100 < 95 then 'done' when g.n %% 100 < 96 then 'dead'
            when g.n %% 100 < 97 then 'cancelled' when g.n %% 100 < 98 then 'ready'
            when g.n %% 100 < 99 then 'delayed' else 'running' end,
       g.at, g.at, g.at, g.at,
       case when g.n %% 100 < 97 then g.at + interval '2 seconds' end,
       case when g.n %% 50 = 0 then 'cron:nightly' else 'web-1:4242' end,
       case when g.n %% 10 < 7 then 'tenant-' || (g.n %% 97) end
  from (select n, at, (lpad(to_hex((extract(epoch from at) * 1000)::bigint), 12, '0')
                         || substr(md5(n::text), 1, 20))::uuid as id
          from (select n, now() - interval '7 days' * (1 - n::float8 / %(total)s) as at
                  from generate_series(%(first)s, %(last)s) n) t) g
"""
# The indexes no constraint owns, dropped for the fill and built again after it (bench set-up).
LOOSE_INDEXES = """
select i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid)
  from pg_index i
 where i.indrelid in ('x_jobs'::regclass, 'x_job_steps'::regclass)
   and not exists (select from pg_constraint c where c.conindid = i.indexrelid)
"""
FILL_STEPS = """
insert into x_job_steps (run_id, name, status, output, started_at, completed_at)
select j.run_id, 'step_' || s, 'done', '{"ok": true}', j.created_at, j.created_at
  from (select run_id, created_at, row_number() over () as k from x_jobs
         limit %(runs)s) j, generate_series(1, 4) s
"""
ENQUEUE = """
insert into x_jobs (name, queue, input, idempotency_key)
values ('shop.bench_enqueue', 'default', '{}', gen_random_uuid()::text)
"""
BATCH = 1_000_000

# What each kind of statement takes on the table it names (PostgreSQL, "Explicit Locking").
LOCKS = [  # (statement pattern, lock), strongest first
    (r"^ALTER TABLE .*(ADD COLUMN|DROP COLUMN|DROP CONSTRAINT|RENAME CONSTRAINT|SET \(|RESET \()",
     "ACCESS EXCLUSIVE"),
    (r"^ALTER TABLE .*ADD CONSTRAINT .* NOT VALID", "ACCESS EXCLUSIVE"),
    (r"^ALTER TABLE .*ADD CONSTRAINT", "ACCESS EXCLUSIVE + scan"),
    (r"^DROP INDEX (?!CONCURRENTLY)", "ACCESS EXCLUSIVE"),
    (r"^CREATE (UNIQUE )?INDEX (?!CONCURRENTLY)", "SHARE + scan"),
    (r"^CREATE TRIGGER", "SHARE ROW EXCLUSIVE"),
    (r"^ALTER TABLE .*VALIDATE CONSTRAINT", "SHARE UPDATE EXCLUSIVE + scan"),
    (r"^CREATE (UNIQUE )?INDEX CONCURRENTLY", "SHARE UPDATE EXCLUSIVE + scan"),
    (r"^DROP INDEX CONCURRENTLY", "SHARE UPDATE EXCLUSIVE"),
    (r"^ALTER INDEX .* RENAME", "SHARE UPDATE EXCLUSIVE"),
]
RANK = ["SHARE UPDATE EXCLUSIVE", "SHARE UPDATE EXCLUSIVE + scan", "SHARE ROW EXCLUSIVE",
        "SHARE + scan", "ACCESS EXCLUSIVE", "ACCESS EXCLUSIVE + scan"]
HOT = re.compile(r'"?(x_jobs|x_job_steps)"?(\s|$|\()', re.I)


def strongest_lock(sql: str) -> str:
    """The strongest lock the statements of ``sql`` take on x_jobs or x_job_steps."""
    found = []
    for statement in sql.split(";\n"):
        text = " ".join(line for line in statement.splitlines()
                        if line.strip() and not line.lstrip().startswith("--")).strip()
        upper = text.upper()
        if not HOT.search(text) or upper.startswith(("CREATE OR REPLACE", "CREATE TABLE")):
            continue
        for pattern, lock in LOCKS:
            if re.search(pattern, upper):
                found.append(lock)
                break
    return max(found, key=RANK.index) if found else "none"


class Producer(threading.Thread):
    """Enqueues one job every ``interval`` seconds and records (start, latency) of each."""

    def __init__(self, url: str, interval: float) -> None:
        super().__init__(daemon=True)
        self.url, self.interval = url, interval
        self.samples: list[tuple[float, float]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        import psycopg

        from tests import devdb

        params = devdb.settings_from_url(self.url)
        with psycopg.connect(host=params["HOST"], port=params["PORT"], user=params["USER"],
                             password=params.get("PASSWORD") or None, dbname=params["NAME"],
                             autocommit=True, application_name="bench producer") as conn:
            while not self.stopping.is_set():
                start = time.monotonic()
                conn.execute(ENQUEUE)
                self.samples.append((start, time.monotonic() - start))
                self.stopping.wait(self.interval)

    def longest(self, since: float, until: float) -> tuple[float, int]:
        window = [lat for start, lat in self.samples if since <= start <= until]
        return (max(window) if window else 0.0), len(window)


def configure(url: str) -> None:
    from django.conf import settings

    from tests import devdb

    db = devdb.settings_from_url(url)
    settings.configure(
        DEBUG=False, SECRET_KEY="bench-migrations-not-secret", USE_TZ=True, TIME_ZONE="UTC",
        DATABASES={"default": db}, DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        INSTALLED_APPS=["django.contrib.auth", "django.contrib.contenttypes", "django_xjobs"])
    import django

    django.setup()


def fill(jobs: int, steps: int) -> None:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(LOOSE_INDEXES)
        indexes = cur.fetchall()
        for name, _definition in indexes:
            cur.execute(f"drop index {name}")
        for first in range(1, jobs + 1, BATCH):
            cur.execute(FILL_JOBS, {"first": first, "last": min(jobs, first + BATCH - 1),
                                    "total": jobs})
            print(f"  x_jobs: {min(jobs, first + BATCH - 1):,} rows", flush=True)
        cur.execute(FILL_STEPS, {"runs": steps // 4})
        cur.execute("set maintenance_work_mem = '1GB'")
        for _name, definition in indexes:
            cur.execute(definition)
        cur.execute("reset maintenance_work_mem")
        cur.execute("vacuum analyze x_jobs")
        cur.execute("vacuum analyze x_job_steps")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--jobs", type=int, default=10_000_000)
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--interval-ms", type=float, default=5.0)
    p.add_argument("--keep", action="store_true", help="leave the database behind")
    args = p.parse_args()

    import psycopg

    from tests import devdb

    url, source = devdb.resolve()
    name = os.environ.get("XJOBS_BENCH_DB", "xjobs_bench_migrations")
    admin = devdb.settings_from_url(url)
    admin_params = {"host": admin["HOST"], "port": admin["PORT"], "user": admin["USER"],
                    "password": admin.get("PASSWORD") or None, "dbname": "postgres",
                    "autocommit": True}
    with psycopg.connect(**admin_params) as conn:
        conn.execute(f'drop database if exists "{name}"')
        conn.execute(f'create database "{name}"')
    url = devdb.with_database(url, name)
    print(f"database {name} ({source})", flush=True)
    configure(url)

    from django.core.management import call_command
    from django.db import connection
    from django.db.migrations.loader import MigrationLoader

    try:
        call_command("migrate", "django_xjobs", "0001", verbosity=0)
        t0 = time.monotonic()
        fill(args.jobs, args.steps)
        print(f"filled {args.jobs:,} jobs, {args.steps:,} steps in "
              f"{time.monotonic() - t0:.0f}s", flush=True)
        names = sorted(n for app, n in MigrationLoader(None).disk_migrations
                       if app == "django_xjobs")[1:]
        sqls = {}
        for migration in names:
            out = StringIO()
            call_command("sqlmigrate", "django_xjobs", migration, stdout=out)
            sqls[migration] = out.getvalue()
        producer = Producer(url, args.interval_ms / 1000)
        producer.start()
        while not producer.samples:
            producer.stopping.wait(0.01)
        rows = []
        for migration in names:
            start = time.monotonic()
            call_command("migrate", "django_xjobs", migration, verbosity=0)
            end = time.monotonic()
            connection.close()
            stall, count = producer.longest(start, end)
            rows.append((migration, end - start, strongest_lock(sqls[migration]), stall, count))
            print(f"  {migration}: {end - start:.2f}s", flush=True)
        producer.stopping.set()
        producer.join()
        print(f"\nmigrations at {args.jobs:,} jobs and {args.steps:,} steps, one enqueue every "
              f"{args.interval_ms:g} ms:\n")
        print("| migration | wall time | strongest lock on x_jobs / x_job_steps "
              "| longest enqueue | enqueues |")
        print("|---|---:|---|---:|---:|")
        for migration, wall, lock, stall, count in rows:
            print(f"| {migration} | {wall:.2f} s | {lock} | {stall * 1000:.0f} ms | {count:,} |")
        baseline = sorted(lat for _, lat in producer.samples)
        print(f"\nall enqueues: {len(baseline):,}, median "
              f"{baseline[len(baseline) // 2] * 1000:.1f} ms, longest {baseline[-1] * 1000:.0f} ms")
    finally:
        connection.close()
        if not args.keep:
            with psycopg.connect(**admin_params) as conn:
                conn.execute(f'drop database if exists "{name}" with (force)')


if __name__ == "__main__":
    main()
