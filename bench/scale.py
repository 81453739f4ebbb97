"""Does the hot path stay flat as the table grows? (``make bench-scale``)

    python bench/scale.py [--depths 10000,100000,1000000] [--history 1000000] [--rss-drain N]

For each queue depth D (jobs ready in the queue) and for a table holding H finished jobs of
history on top of a small queue, it measures in ONE process against the same database:

* claim latency: median and p95 of ``jobs_claim`` asking for 100 jobs (then acknowledged),
  20 rounds;
* drain rate: 20,000 jobs drained by 2 ``xjobs_worker`` processes from the front of the queue,
  steady (first started_at -> last finished_at), median of two drains; the rest of the queue
  is left in place.

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


class Scale(Bench):
    def fill(self, n: int, state: str) -> None:
        for start in range(0, n, 100_000):
            with self.connection.cursor() as cur:
                cur.execute(FILL, {"n": min(100_000, n - start), "state": state})
        self.sql("vacuum analyze x_jobs")
        self.sql("checkpoint")

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
        before = self.sql("select count(*) from x_jobs where state = 'done'")[0][0]
        procs = self.spawn_workers()
        deadline = time.monotonic() + 600
        while self.sql("select count(*) from x_jobs where state = 'done'")[0][0] < before + n:
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
    p.add_argument("--rss-drain", type=int, default=0)
    p.add_argument("--concurrency", type=int, default=10)
    p.add_argument("--prefetch", default="auto")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    bench = Scale(setup_database(), args)
    rows = []
    for depth in (int(d) for d in args.depths.split(",")):
        bench.reset()
        bench.fill(depth + 80_000, "ready")
        p50, p95 = bench.claim_latency()
        rate = statistics.median([bench.drain_front(), bench.drain_front()])
        rows.append((f"{depth:,} queued", p50, p95, rate))
        print(f"scale: {rows[-1]}", file=sys.stderr)
    if args.history:
        bench.reset()
        bench.fill(args.history, "done")
        bench.fill(80_000, "ready")
        p50, p95 = bench.claim_latency()
        rate = statistics.median([bench.drain_front(), bench.drain_front()])
        rows.append((f"{args.history:,} done in history", p50, p95, rate))
    print("\n| table | claim 100: p50 / p95 ms | drain 20,000 with 2 workers, steady jobs/s |")
    print("|---|---:|---:|")
    for label, p50, p95, rate in rows:
        print(f"| {label} | {p50:.1f} / {p95:.1f} | {rate:,.0f} |")
    if args.rss_drain:
        samples = bench.rss_drain(args.rss_drain)
        marks = [samples[min(len(samples) - 1, round(f * (len(samples) - 1)))]
                 for f in (0.1, 0.25, 0.5, 0.75, 1.0)]
        print(f"\nworker RSS over a {args.rss_drain:,}-job drain, at 10/25/50/75/100 % of the "
              f"drain: {' / '.join(map(str, marks))} MiB (max {max(samples)} MiB, "
              f"{len(samples)} samples, 1/s)")


if __name__ == "__main__":
    main()
