"""Does the hot path stay flat as the table grows? (``make bench-scale``)

    python bench/scale.py [--depths 10000,100000,1000000] [--history 1000000] [--rss-drain N]

For each queue depth D (jobs ready in the queue), and for H finished jobs of history on top of a
small queue (none, H in the history tables where the archive leaves them, and with
``--history-in x_jobs`` also H in x_jobs itself, as with ``ARCHIVE_AFTER: None``), it measures
in ONE process against the same database:

* claim latency: median and p95 of ``jobs_claim`` asking for 100 jobs (then acknowledged),
  20 rounds;
* drain rate: 20,000 jobs drained by 2 ``xjobs_worker`` processes from the front of the queue,
  steady (first started_at -> last finished_at), median of two drains; the rest of the queue
  is left in place.

With history in the tables it also times retention's drop of the oldest day (one statement,
``history_drop``) beside the row-by-row delete of the same number of rows from x_jobs
(``jobs_purge``, what retention did before the history tables).

``--rss-drain N`` also drains N jobs with 2 workers and samples their RSS every second, to show
it stays flat (the first and last samples and the maximum are printed).

Rows are generated with one INSERT ... SELECT per 100,000 (bench set-up, not the enqueue path).
Figures depend on the machine; compare the rows of one run with each other.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from run import Bench, percentile, setup_database  # noqa: E402

FILL = """
insert into x_jobs (id, name, queue, input, idempotency_key, run_id, state, run_at,
                    created_at, updated_at, finished_at, attempt)
select g.id, 'bench.noop', 'default', jsonb_build_object('i', g.n), g.id::text,
       gen_random_uuid(), %(state)s, now() - interval '1 hour',
       now() - interval '1 hour', now(), case when %(state)s = 'done' then now() end,
       case when %(state)s = 'done' then 1 else 0 end
  from (select gen_random_uuid() as id, n from generate_series(1, %(n)s) as n) g
"""


# Finished jobs as the archive leaves them: in the history table of their state and UTC day,
# created by the migration's own function, with time-ordered ids (UUIDv7 layout: 48 bits of
# milliseconds first) and finished_at spread over the day.
FILL_HISTORY = """
insert into {table} (id, name, queue, input, idempotency_key, run_id, state, run_at,
                     created_at, updated_at, started_at, finished_at, attempt)
select g.id, 'bench.noop', 'default', jsonb_build_object('i', g.n), g.id::text, g.id, 'done',
       g.at, g.at, g.at, g.at, g.at, 1
  from (select (lpad(to_hex((extract(epoch from t.at) * 1000)::bigint), 12, '0')
                || substr(md5(n::text || random()::text), 1, 20))::uuid as id, n, t.at
          from generate_series(1, %(n)s) as n,
               lateral (select %(day)s::timestamptz + (n * interval '86399 seconds' / %(n)s)
                        as at) t) g
"""
HISTORY_DAYS = 7


class Scale(Bench):
    def fill(self, n: int, state: str) -> None:
        for start in range(0, n, 100_000):
            with self.connection.cursor() as cur:
                cur.execute(FILL, {"n": min(100_000, n - start), "state": state})
        self.sql("vacuum analyze x_jobs")
        self.sql("checkpoint")

    def fill_history(self, n: int) -> list[str]:
        """n done jobs in the history tables of the HISTORY_DAYS days before today (UTC)."""
        from psycopg import sql

        tables = []
        for back in range(HISTORY_DAYS, 0, -1):
            day = self.sql(f"select (now() at time zone 'UTC')::date - {back}")[0][0]
            [(table,)] = self.sql(f"select xjobs_history_table('done', '{day}')")
            per_day = n // HISTORY_DAYS
            for start in range(0, per_day, 200_000):
                with self.connection.cursor() as cur:
                    cur.execute(sql.SQL(FILL_HISTORY).format(table=sql.Identifier(table)),
                                {"n": min(200_000, per_day - start),
                                 "day": f"{day} 00:00:00+00"})
            self.sql(f"vacuum analyze {table}")
            tables.append(table)
        self.sql("checkpoint")
        return tables

    def drop_history(self) -> None:
        if self.sql("select to_regproc('xjobs_history_drop') is not null")[0][0]:
            for state in ("done", "dead", "cancelled"):
                self.sql(f"select xjobs_history_drop('{state}', 'infinity')")

    def time_day_drop(self) -> tuple[int, float]:
        """Rows in the oldest history day, and the milliseconds retention takes to drop it."""
        from django_xjobs.engines import get_engine

        [(oldest, rows)] = self.sql(
            "select c.relname::text, c.reltuples::bigint from pg_inherits i"
            " join pg_class c on c.oid = i.inhrelid where i.inhparent = 'x_jobs'::regclass"
            " order by c.relname limit 1")
        day_end = self.sql(f"select (to_date(right('{oldest}', 8), 'YYYYMMDD') + 1)::timestamp"
                           " at time zone 'UTC'")[0][0]
        t0 = time.perf_counter()
        dropped = get_engine().history_drop(state="done", finished_before=day_end)
        elapsed = (time.perf_counter() - t0) * 1000
        assert dropped == [oldest], dropped
        return rows, elapsed

    def time_row_purge(self, n: int) -> float:
        """Milliseconds of deleting n finished rows of x_jobs the way retention does without
        the history tables (jobs_purge, batches of 1,000)."""
        from django_xjobs.engines import get_engine

        self.fill(n, "done")
        t0 = time.perf_counter()
        deleted = get_engine().jobs_purge(states=["done"], finished_before=self.sql(
            "select now()")[0][0], batch_size=1000)
        elapsed = (time.perf_counter() - t0) * 1000
        assert deleted == n, deleted
        return elapsed

    def claim_latency(self) -> tuple[float, float]:
        from django_xjobs.engines import get_engine
        from django_xjobs.records import Completion

        engine = get_engine()
        engine.session_label("xjobs:bench-scale:claim")  # as a worker's connection (no JIT)
        times = []
        for _ in range(20):
            t0 = time.perf_counter()
            claimed = engine.jobs_claim(wants={"default": 100}, worker_id="scale", lease_ms=30000)
            times.append((time.perf_counter() - t0) * 1000)
            engine.jobs_complete_if_owned([
                Completion(claim=c.claim, result_json=None) for c in claimed
            ])
        return statistics.median(times), percentile(times, 95)

    def drain_front(self, n: int = 20_000) -> float:
        """Steady drain rate of (at least) n jobs from the front of the queue.

        The workers are stopped once n jobs are done; what they finish meanwhile counts too,
        over the same window (first start -> last finish of every job done in this drain)."""
        started = self.sql("select now()")[0][0]
        # Counted by finished_at (history tables included: the archive may move this drain's
        # first jobs while it runs), never over the whole history.
        done_since = ("select count(*) from x_jobs where state = 'done'"
                      f" and finished_at >= '{started.isoformat()}'")
        procs = self.spawn_workers()
        deadline = time.monotonic() + 600
        while self.sql(done_since)[0][0] < n:
            if time.monotonic() > deadline:
                self.stop_workers(procs)
                raise RuntimeError("drain did not finish in 600 s")
            time.sleep(0.05)
        self.stop_workers(procs)
        with self.connection.cursor() as cur:
            cur.execute("select count(*), extract(epoch from min(started_at)),"
                        " extract(epoch from max(finished_at)) from x_jobs"
                        " where state = 'done' and finished_at >= %s", [started])
            done, first, last = cur.fetchone()
        # Steady rate (first start -> last finish): worker start-up, which varies by a second
        # on a shared machine, is not what this table is about.
        return done / (float(last) - float(first))

    def rss_drain(self, n: int) -> list[int]:
        self.reset()
        self.fill(n, "ready")
        procs = self.spawn_workers()
        samples: list[int] = []
        while self.sql("select count(*) from x_jobs where state <> 'done'")[0][0]:
            rss = 0
            for p in procs:
                for line in Path(f"/proc/{p.pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        rss = max(rss, int(line.split()[1]) // 1024)
            samples.append(rss)
            time.sleep(1)
        self.stop_workers(procs)
        return samples


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--depths", default="10000,100000,1000000")
    p.add_argument("--history", type=int, default=1_000_000)
    p.add_argument("--history-in", default="tables",
                   help="where the history goes: tables (as the archive leaves it), x_jobs "
                        "(ARCHIVE_AFTER: None), or both, comma-separated")
    p.add_argument("--rss-drain", type=int, default=0)
    p.add_argument("--concurrency", type=int, default=10)
    p.add_argument("--prefetch", default="auto")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    args.rate_limit = 2000  # the W12 job's limit, which the bench project's settings read
    bench = Scale(setup_database(), args)
    rows = []
    for depth in (int(d) for d in args.depths.split(",") if d):
        bench.reset()
        bench.fill(depth + 80_000, "ready")
        p50, p95 = bench.claim_latency()
        rate = statistics.median([bench.drain_front(), bench.drain_front()])
        rows.append((f"{depth:,} queued", p50, p95, rate))
        print(f"scale: {rows[-1]}", file=sys.stderr)
    retention = None
    if args.history:
        places = args.history_in.split(",")

        def measure(label: str, keep_history: bool = False) -> None:
            bench.env["XJOBS_BENCH_KEEP_HISTORY"] = "1" if keep_history else "0"
            bench.fill(80_000, "ready")
            p50, p95 = bench.claim_latency()
            rate = statistics.median([bench.drain_front(), bench.drain_front()])
            rows.append((label, p50, p95, rate))
            print(f"scale: {rows[-1]}", file=sys.stderr)

        bench.drop_history()
        bench.reset()
        measure("no history")
        if "tables" in places:
            bench.reset()
            bench.fill_history(args.history)
            measure(f"{args.history:,} done in the history tables")
            day_rows, drop_ms = bench.time_day_drop()
            bench.drop_history()
            bench.reset()
            retention = (day_rows, drop_ms, bench.time_row_purge(day_rows))
        if "x_jobs" in places:
            bench.reset()
            bench.fill(args.history, "done")
            measure(f"{args.history:,} done in x_jobs itself (ARCHIVE_AFTER: None)",
                    keep_history=True)
    print("\n| table | claim 100: p50 / p95 ms | drain 20,000 with 2 workers, steady jobs/s |")
    print("|---|---:|---:|")
    for label, p50, p95, rate in rows:
        print(f"| {label} | {p50:.1f} / {p95:.1f} | {rate:,.0f} |")
    if retention:
        day_rows, drop_ms, purge_ms = retention
        print(f"\nretention of one day ({day_rows:,} rows): history_drop {drop_ms:,.0f} ms in "
              f"1 statement; jobs_purge of as many rows from x_jobs {purge_ms:,.0f} ms in "
              f"{-(-day_rows // 1000):,} statements")
    if args.rss_drain:
        samples = bench.rss_drain(args.rss_drain)
        marks = [samples[min(len(samples) - 1, round(f * (len(samples) - 1)))]
                 for f in (0.1, 0.25, 0.5, 0.75, 1.0)]
        print(f"\nworker RSS over a {args.rss_drain:,}-job drain, at 10/25/50/75/100 % of the "
              f"drain: {' / '.join(map(str, marks))} MiB (max {max(samples)} MiB, "
              f"{len(samples)} samples, 1/s)")


if __name__ == "__main__":
    main()
