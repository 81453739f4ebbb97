"""django-xjobs benchmark (``make bench``): the peers' harness workloads, for us alone.

    python bench/run.py [--quick] [--workloads W1,...,W10] [--concurrency 10] [--prefetch auto]

W1 enqueue-single   5,000 no-op jobs, one enqueue = one transaction, one process      jobs/s x3
W2 enqueue-bulk     50,000 no-op jobs through enqueue_many, 1,000 per call               jobs/s
W3 drain            20,000 preloaded no-op jobs, 2 worker processes spawned; time from
                    spawn to the last finished_at in the database; steady = first
                    started_at -> last finished_at                                       jobs/s x3
W4 latency          2 idle workers; 500 jobs enqueued at 50/s; enqueue -> job start      p50/p95/p99
W5 event wake-up    250 jobs suspended in wait_for_event; publish_event at 50/s;
                    publish -> the step after the wait                                p50/p95/p99
W6 multi-step       5,000 jobs of three durable steps each, 2 workers                 jobs/s
W7 relay lag        a dedicated xjobs_relay; 500 enqueue_on_commit at 50/s, each its own
                    transaction; staging commit -> the relay's commit that makes the job
                    claimable (the job channel's NOTIFY, sent on that commit)     p50/p95/p99
W8 slot-limited     5,000 no-op jobs under Concurrency(limit=2) over 20 keys, 2 workers,
                    keys interleaved and keys clustered, beside the same 5,000 unlimited  jobs/s
W9 backfill         one pass over a real 100,000-row table, keyset batches of 1,000
                    (val + 1 per row, each batch committed with its progress), 1 worker  rows/s
W10 scheduler       in-process: one round over 100 due cron tasks; a catch-up of 1,000
                    missed occurrences (misfire "all"); maintenance deleting 100,000 finished
                    jobs with a step each, 1,000 rows per statement               ms, rows/s

The database is a fresh ``xjobs_bench`` (``XJOBS_BENCH_DB`` names another) on the server
``devdb.py`` picks (the one the tests use). Figures depend on the machine: compare
systems within ONE run of the shared harness (``make bench-peers``), never across runs.
Nothing here is a test; nothing asserts a time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]

FULL = {"w1": 5000, "w2": 50000, "w3": 20000, "w4": 500, "reps": 3, "w9": 100_000}
QUICK = {"w1": 500, "w2": 5000, "w3": 2000, "w4": 50, "reps": 1, "w9": 10_000}


def percentile(values: list[float], p: float) -> float:
    s = sorted(values)
    k = (len(s) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def setup_database() -> str:
    from tests import devdb

    url, source = devdb.resolve()
    name = os.environ.get("XJOBS_BENCH_DB", "xjobs_bench")
    url = devdb.with_database(url, name)
    entry = devdb.settings_from_url(url)
    import psycopg
    from psycopg import sql

    admin = {k: v for k, v in {
        "dbname": "postgres", "user": entry["USER"] or None, "host": entry["HOST"] or None,
        "port": entry["PORT"] or None, "password": entry["PASSWORD"] or None,
    }.items() if v}
    with psycopg.connect(**admin, autocommit=True) as conn:
        conn.execute(sql.SQL("drop database if exists {} with (force)").format(
            sql.Identifier(name)))
        conn.execute(sql.SQL("create database {}").format(sql.Identifier(name)))
    print(f"bench: database {name} on {source}", file=sys.stderr)
    return url


class Bench:
    def __init__(self, url: str, args: argparse.Namespace) -> None:
        self.url = url
        self.args = args
        self.sizes = QUICK if args.quick else FULL
        self.env = dict(os.environ)
        self.env.update({
            "XJOBS_BENCH_DATABASE_URL": url,
            "DJANGO_SETTINGS_MODULE": "xbench_project.settings",
            "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)]),
            "XJOBS_BENCH_CONCURRENCY": str(args.concurrency),
            "XJOBS_BENCH_PREFETCH": str(args.prefetch),
        })
        os.environ.update(self.env)
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        from django.db import connection
        from xbench_project.benchjobs import jobs

        self.jobs = jobs
        self.connection = connection

    # ------------------------------------------------------------------------ helpers --
    def sql(self, statement: str) -> list[tuple]:
        with self.connection.cursor() as cur:
            cur.execute(statement)
            return cur.fetchall() if cur.description else []

    def reset(self) -> None:
        self.sql("truncate x_jobs, x_job_steps, x_job_events")
        self.sql("analyze x_jobs")
        self.sql("checkpoint")

    def spawn_workers(self, n: int = 2, extra_env: dict[str, str] | None = None,
                      args: tuple[str, ...] = ()):
        env = dict(self.env, **(extra_env or {}))
        return [
            subprocess.Popen(
                [sys.executable, "-m", "django", "xjobs_worker", "--worker-id", f"bench-w{i}",
                 *args],
                env=env, cwd=HERE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            )
            for i in range(n)
        ]

    @staticmethod
    def stop_workers(procs) -> int:
        peak = 0
        for p in procs:
            try:
                for line in Path(f"/proc/{p.pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        peak = max(peak, int(line.split()[1]) // 1024)
            except OSError:
                pass
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        return peak

    # ---------------------------------------------------------------------- workloads --
    def w1(self) -> float:
        self.reset()
        noop, n = self.jobs.noop, self.sizes["w1"]
        noop.enqueue(i=-1)  # connection open, statement warm
        t0 = time.perf_counter()
        for i in range(n):
            noop.enqueue(i=i)
        return n / (time.perf_counter() - t0)

    def w2(self) -> float:
        from django_xjobs import enqueue_many

        self.reset()
        n = self.sizes["w2"]
        t0 = time.perf_counter()
        for start in range(0, n, 1000):
            enqueue_many([("bench.noop", {"i": i}) for i in range(start, min(n, start + 1000))])
        return n / (time.perf_counter() - t0)

    def w3(self) -> dict[str, float]:
        from django_xjobs import enqueue_many

        self.reset()
        n = self.sizes["w3"]
        for start in range(0, n, 1000):
            enqueue_many([("bench.noop", {"i": i}) for i in range(start, min(n, start + 1000))])
        self.sql("analyze x_jobs")
        self.sql("checkpoint")
        t0 = time.time()
        procs = self.spawn_workers()
        deadline = time.monotonic() + 600
        while self.sql("select count(*) from x_jobs where state <> 'done'")[0][0]:
            if time.monotonic() > deadline:
                raise RuntimeError("W3 drain did not finish in 600 s")
            time.sleep(0.1)
        peak = self.stop_workers(procs)
        first, last, done = self.sql(
            "select extract(epoch from min(started_at)), extract(epoch from max(finished_at)),"
            " count(*) from x_jobs where state = 'done'"
        )[0]
        assert done == n, f"only {done} of {n} jobs done"
        return {"rate": n / (float(last) - t0), "steady": n / (float(last) - float(first)),
                "startup": float(first) - t0, "rss": peak}

    def w4(self) -> dict[str, float]:
        self.reset()
        n = self.sizes["w4"]
        with tempfile.TemporaryDirectory() as lat_dir:
            procs = self.spawn_workers(extra_env={"XJOBS_BENCH_LAT_DIR": lat_dir})
            time.sleep(3)
            lat = self.jobs.lat
            start = time.monotonic() + 0.05
            for i in range(n):
                delay = start + i / 50 - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                lat.enqueue(i=i, t=time.time())
            deadline = time.monotonic() + 60
            while self.sql("select count(*) from x_jobs where state <> 'done'")[0][0]:
                if time.monotonic() > deadline:
                    raise RuntimeError("W4 jobs did not finish in 60 s")
                time.sleep(0.05)
            peak = self.stop_workers(procs)
            seen: dict[int, float] = {}
            for f in Path(lat_dir).iterdir():
                for line in f.read_text().splitlines():
                    i, te, ts = line.split()
                    seen.setdefault(int(i), float(ts) - float(te))
        ms = [v * 1000 for v in seen.values()]
        return {"p50": percentile(ms, 50), "p95": percentile(ms, 95), "p99": percentile(ms, 99),
                "rss": peak}


    def w6(self) -> dict[str, float]:
        """A multi-step job: 5,000 jobs of three durable steps, drained by 2 workers."""
        from django_xjobs import enqueue_many

        self.reset()
        n = max(100, self.sizes["w3"] // 4)
        for start in range(0, n, 1000):
            enqueue_many([("bench.three_steps", {"i": i})
                          for i in range(start, min(n, start + 1000))])
        self.sql("analyze x_jobs")
        t0 = time.time()
        procs = self.spawn_workers()
        deadline = time.monotonic() + 600
        while self.sql("select count(*) from x_jobs where state <> 'done'")[0][0]:
            if time.monotonic() > deadline:
                raise RuntimeError("W6 drain did not finish in 600 s")
            time.sleep(0.1)
        self.stop_workers(procs)
        first, last = self.sql("select extract(epoch from min(started_at)),"
                               " extract(epoch from max(finished_at)) from x_jobs")[0]
        steps = self.sql("select count(*) from x_job_steps where status = 'completed'")[0][0]
        assert steps == 3 * n, f"{steps} steps for {n} jobs"
        return {"rate": n / (float(last) - t0), "steady": n / (float(last) - float(first))}

    # ---- W8: concurrency slots (slots.py) ----
    def _drain(self, items: list[tuple[str, dict]], what: str) -> dict[str, float]:
        from django_xjobs import enqueue_many

        self.reset()
        self.sql("truncate x_job_leases")
        for start in range(0, len(items), 1000):
            enqueue_many(items[start:start + 1000])
        self.sql("analyze x_jobs")
        t0 = time.time()
        procs = self.spawn_workers()
        deadline = time.monotonic() + 900
        while self.sql("select count(*) from x_jobs where state <> 'done'")[0][0]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"W8 {what} did not finish in 900 s")
            time.sleep(0.1)
        self.stop_workers(procs)
        first, last = self.sql("select extract(epoch from min(started_at)),"
                               " extract(epoch from max(finished_at)) from x_jobs")[0]
        n = len(items)
        return {"rate": n / (float(last) - t0), "steady": n / (float(last) - float(first))}

    def w8(self) -> dict[str, dict[str, float]]:
        """The cost of slots: the same no-op drain unlimited, then under Concurrency(limit=2)
        on 20 keys, with the keys interleaved (i % 20: a claimed batch spans every key) and
        clustered (i // (n / 20): a claimed batch is mostly one key, so most of it is refused
        and waits a poll interval)."""
        n = max(500, self.sizes["w3"] // 4)
        return {
            "unlimited": self._drain([("bench.noop", {"i": i}) for i in range(n)], "unlimited"),
            "interleaved": self._drain([("bench.keyed", {"i": i, "k": i % 20})
                                        for i in range(n)], "interleaved"),
            "clustered": self._drain([("bench.keyed", {"i": i, "k": i * 20 // n})
                                      for i in range(n)], "clustered"),
        }
    def w10(self) -> dict[str, float]:
        """The scheduler's round and catch-up, and the maintenance purge (in this process)."""
        from datetime import timedelta

        from django_xjobs import clock, conf
        from django_xjobs.engines import get_engine
        from django_xjobs.maintenance import pruner
        from django_xjobs.scheduler import cron
        from django_xjobs.scheduler.leadership import LeaseLeadership
        from django_xjobs.scheduler.runner import Scheduler
        from django_xjobs.scheduler.schedule import Task

        self.reset()
        self.sql("truncate x_scheduler_state, x_scheduler_leader")
        engine = get_engine()
        leader = LeaseLeadership(engine=engine, holder="bench", lease=600, renew=150)
        assert leader.tick()
        settings = conf.build({**conf.get().raw, "CRON_MAX_CATCHUP": 1000,
                               "CRON_MISFIRE_GRACE": 0})
        every_second = cron.parse("* * * * * *")

        def tasks(n: int, prefix: str) -> list[Task]:
            return [Task(name=f"{prefix}-{i}", job="bench.noop", schedule=every_second,
                         misfire="all", input={"i": i}) for i in range(n)]

        now = clock.now().replace(microsecond=0)
        many = Scheduler(engine=engine, leadership=leader, tasks=tasks(100, "t"),
                         settings=settings)
        many.round(now)  # the tasks start from here
        t0 = time.perf_counter()
        fired = many.round(now + timedelta(seconds=1)).total
        round_ms = (time.perf_counter() - t0) * 1000
        assert fired == 100, fired

        one = Scheduler(engine=engine, leadership=leader, tasks=tasks(1, "catchup"),
                        settings=settings)
        one.round(now - timedelta(seconds=1000))
        t0 = time.perf_counter()
        fired = one.round(now).total
        catchup = fired / (time.perf_counter() - t0)
        assert fired == 1000, fired

        self.reset()
        n = self.sizes["w2"] * 2
        self.sql(f"""
            with j as (
                insert into x_jobs (id, name, input, idempotency_key, run_id, state, run_at,
                                    finished_at, attempt)
                select gen_random_uuid(), 'bench.noop', '{{}}', g::text, gen_random_uuid(),
                       'done', now() - interval '31 days', now() - interval '30 days', 1
                  from generate_series(1, {n}) g
                returning run_id)
            insert into x_job_steps (run_id, name, status) select run_id, 's', 'completed' from j
        """)
        self.sql("vacuum analyze x_jobs")
        self.sql("vacuum analyze x_job_steps")
        t0 = time.perf_counter()
        report = pruner.run_once(settings=conf.build({**conf.get().raw, "RETENTION": {
            "done": "7d"}, "MAINTENANCE_BATCH": 1000}))
        purge = report.jobs["done"] / (time.perf_counter() - t0)
        assert report.jobs["done"] == n
        return {"round_ms": round_ms, "catchup": catchup, "purge": purge, "purged": n}

    def w5(self) -> dict[str, float]:
        """Event wake-up: suspended waiters, publish_event at 50/s, publish -> resumed step."""
        from django_xjobs import publish_event

        self.reset()
        self.sql("truncate x_job_events")
        n = self.sizes["w4"] // 2
        with tempfile.TemporaryDirectory() as lat_dir:
            procs = self.spawn_workers(extra_env={"XJOBS_BENCH_LAT_DIR": lat_dir})
            for i in range(n):
                self.jobs.wait_lat.enqueue(i=i)
            deadline = time.monotonic() + 120
            while self.sql("select count(*) from x_jobs where state = 'suspended'")[0][0] < n:
                if time.monotonic() > deadline:
                    raise RuntimeError("W5 waiters did not all suspend in 120 s")
                time.sleep(0.05)
            start = time.monotonic() + 0.05
            for i in range(n):
                delay = start + i / 50 - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                publish_event("bench.go", {"t": time.time()}, correlation_key=str(i))
            while self.sql("select count(*) from x_jobs where state <> 'done'")[0][0]:
                if time.monotonic() > deadline + 60:
                    raise RuntimeError("W5 waiters did not all resume")
                time.sleep(0.05)
            self.stop_workers(procs)
            seen: dict[int, float] = {}
            for f in Path(lat_dir).iterdir():
                for line in f.read_text().splitlines():
                    i, te, ts = line.split()
                    seen.setdefault(int(i), float(ts) - float(te))
        ms = [v * 1000 for v in seen.values()]
        return {"p50": percentile(ms, 50), "p95": percentile(ms, 95), "p99": percentile(ms, 99)}

    # ---- outbox ----
    def w7(self) -> dict[str, float]:
        """Relay lag: commit of an enqueue_on_commit -> the job is claimable.

        "Claimable" is the commit of the relay transaction that inserted the job; that commit
        delivers the job channel's NOTIFY (one per relay transaction), which a listener here
        timestamps. The k-th notification is the k-th relay transaction, whose rows share one
        published_at (the transaction's now()): that is how each row finds its moment.
        """
        import threading

        import psycopg

        from tests import devdb

        self.reset()
        self.sql("truncate x_outbox")
        n = self.sizes["w4"]
        entry = devdb.settings_from_url(self.url)
        params = {k: v for k, v in {
            "dbname": entry["NAME"], "user": entry["USER"] or None,
            "host": entry["HOST"] or None, "port": entry["PORT"] or None,
            "password": entry["PASSWORD"] or None}.items() if v}
        heard: list[float] = []
        stop = threading.Event()
        listener = psycopg.connect(**params, autocommit=True)
        listener.execute("listen xjobs")

        def listen() -> None:
            while not stop.is_set():
                for _ in listener.notifies(timeout=0.2):
                    heard.append(time.time())

        thread = threading.Thread(target=listen, daemon=True)
        thread.start()
        relay = subprocess.Popen(
            [sys.executable, "-m", "django", "xjobs_relay", "--worker-id", "bench-relay"],
            env=self.env, cwd=HERE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        try:
            time.sleep(3)  # the relay's start-up is not part of the lag
            committed: dict[str, float] = {}
            noop = self.jobs.noop
            start = time.monotonic() + 0.05
            for i in range(n):
                delay = start + i / 50 - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                staged = noop.enqueue_on_commit(i=i)  # autocommit: committed on return
                committed[str(staged.id)] = time.time()
            deadline = time.monotonic() + 60
            while self.sql("select count(*) from x_outbox where published_at is null")[0][0]:
                if time.monotonic() > deadline:
                    raise RuntimeError("W7 relay did not publish everything in 60 s")
                time.sleep(0.05)
            groups = self.sql("select published_at, array_agg(id::text) from x_outbox"
                              " group by published_at order by published_at")
            deadline = time.monotonic() + 10
            while len(heard) < len(groups) and time.monotonic() < deadline:
                time.sleep(0.05)
            heard_for_lag = list(heard)  # the backlog's relay transactions notify as well
            throughput = self._w7_throughput()
        finally:
            relay.terminate()
            relay.wait(timeout=30)
            stop.set()
            thread.join(5)
            listener.close()
        if len(heard_for_lag) != len(groups):
            raise RuntimeError(f"W7: {len(heard_for_lag)} notifications for {len(groups)} "
                               "relay transactions; cannot attribute them")
        ms = [(t_claimable - committed[i]) * 1000
              for (_, ids), t_claimable in zip(groups, heard_for_lag, strict=True) for i in ids]
        return {"p50": percentile(ms, 50), "p95": percentile(ms, 95), "p99": percentile(ms, 99),
                "batches": len(groups), "rate": throughput}

    def _w7_throughput(self) -> float:
        """A backlog: 10,000 stagings (1,000 quick) committed at once; commit -> all published,
        by the relay that is running (batches of XJOBS["OUTBOX"]["BATCH_SIZE"])."""
        from django.db import transaction

        n = self.sizes["w2"] // 5
        with transaction.atomic():
            for i in range(n):
                self.jobs.noop.enqueue_on_commit(i=i)
        t0 = time.monotonic()
        deadline = t0 + 300
        while self.sql("select count(*) from x_outbox where published_at is null")[0][0]:
            if time.monotonic() > deadline:
                raise RuntimeError("W7 backlog was not published in 300 s")
            time.sleep(0.01)
        return n / (time.monotonic() - t0)


    # ------------------------------------------------------------------------ backfills --
    def w9(self) -> dict[str, float]:
        """One backfill pass over a real table; the pass's own time (started_at -> completed_at
        in x_backfills) and spawn -> completed."""
        from django_xjobs import backfills

        self.reset()
        n = self.sizes["w9"]
        self.sql("drop table if exists bench_rows")
        self.sql("create table bench_rows (id bigint generated always as identity primary key,"
                 " val int not null default 0, payload text not null)")
        self.sql(f"insert into bench_rows (payload) select md5(g::text)"
                 f" from generate_series(1, {n}) g")
        self.sql("truncate x_backfills")
        self.sql("vacuum analyze bench_rows")
        self.sql("checkpoint")
        t0 = time.time()
        handle = backfills.start("bench.touch_rows")
        procs = self.spawn_workers(1, args=("--queue", "backfills"))
        deadline = time.monotonic() + 600
        while self.sql(f"select status from x_backfills where run_id = '{handle.run_id}'")[0][0] \
                != "completed":
            if time.monotonic() > deadline:
                raise RuntimeError("W9 pass did not complete in 600 s")
            time.sleep(0.05)
        self.stop_workers(procs)
        rows, began, ended = self.sql(
            "select rows_processed, extract(epoch from started_at),"
            f" extract(epoch from completed_at) from x_backfills where run_id = '{handle.run_id}'"
        )[0]
        touched = self.sql("select count(*) from bench_rows where val = 1")[0][0]
        assert rows == n == touched, f"{rows} rows processed, {touched} touched of {n}"
        return {"rate": n / (float(ended) - float(began)), "overall": n / (float(ended) - t0)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--workloads", default="W1,W2,W3,W4,W5,W6,W7,W8,W9,W10")
    p.add_argument("--concurrency", type=int, default=10)
    p.add_argument("--prefetch", default="auto")
    args = p.parse_args()
    bench = Bench(setup_database(), args)
    chosen = {w.strip().upper() for w in args.workloads.split(",")}
    reps = bench.sizes["reps"]
    rows: list[tuple[str, str]] = []
    if "W1" in chosen:
        r = [bench.w1() for _ in range(reps)]
        rows.append(("W1 enqueue one-per-transaction", f"{statistics.median(r):,.0f} jobs/s "
                     f"({min(r):,.0f}-{max(r):,.0f})"))
    if "W2" in chosen:
        rows.append(("W2 bulk enqueue (enqueue_many, 1,000/call)", f"{bench.w2():,.0f} jobs/s"))
    if "W3" in chosen:
        r3 = [bench.w3() for _ in range(reps)]
        rows.append(("W3 drain, 2 workers (spawn -> last done)",
                     f"{statistics.median(x['rate'] for x in r3):,.0f} jobs/s "
                     f"({min(x['rate'] for x in r3):,.0f}-{max(x['rate'] for x in r3):,.0f})"))
        rows.append(("W3 steady (first start -> last done)",
                     f"{statistics.median(x['steady'] for x in r3):,.0f} jobs/s"))
        rows.append(("W3 worker start-up (spawn -> first start)",
                     f"{statistics.median(x['startup'] for x in r3):.2f} s"))
        rows.append(("worker peak RSS (W3)", f"{max(x['rss'] for x in r3)} MiB"))
    if "W4" in chosen:
        r4 = bench.w4()
        rows.append(("W4 enqueue -> start p50 / p95 / p99 (50 jobs/s)",
                     f"{r4['p50']:.1f} / {r4['p95']:.1f} / {r4['p99']:.1f} ms"))
    if "W5" in chosen:
        r5 = bench.w5()
        rows.append(("W5 publish_event -> resumed step p50 / p95 / p99 (50/s)",
                     f"{r5['p50']:.1f} / {r5['p95']:.1f} / {r5['p99']:.1f} ms"))
    if "W6" in chosen:
        r6 = bench.w6()
        rows.append(("W6 drain of 3-step jobs, 2 workers (steady)",
                     f"{r6['rate']:,.0f} jobs/s ({r6['steady']:,.0f})"))
    if "W9" in chosen:
        r9 = bench.w9()
        rows.append((f"W9 backfill pass, {bench.sizes['w9']:,} rows, batches of 1,000",
                     f"{r9['rate']:,.0f} rows/s (spawn -> completed {r9['overall']:,.0f})"))
    if "W7" in chosen:
        r7 = bench.w7()
        rows.append(("W7 enqueue_on_commit commit -> claimable p50 / p95 / p99 (50/s)",
                     f"{r7['p50']:.1f} / {r7['p95']:.1f} / {r7['p99']:.1f} ms"))
        rows.append(("W7 relay of a committed backlog (one relay process)",
                     f"{r7['rate']:,.0f} jobs/s"))
    if "W8" in chosen:
        r8 = bench.w8()
        base = r8["unlimited"]["steady"]
        for variant, label in (("unlimited", "no limit"),
                               ("interleaved", "limit 2 x 20 keys, interleaved"),
                               ("clustered", "limit 2 x 20 keys, clustered")):
            r = r8[variant]
            rows.append((f"W8 drain, {label} (steady)",
                         f"{r['rate']:,.0f} jobs/s ({r['steady']:,.0f}; "
                         f"{r['steady'] / base:.0%} of unlimited)"))
    if "W10" in chosen:
        r10 = bench.w10()
        rows.append(("W10 scheduler round, 100 due cron tasks", f"{r10['round_ms']:.0f} ms"))
        rows.append(("W10 catch-up of 1,000 missed occurrences (misfire all)",
                     f"{r10['catchup']:,.0f} occurrences/s"))
        rows.append((f"W10 maintenance purge of {r10['purged']:,} done jobs + steps",
                     f"{r10['purge']:,.0f} jobs/s"))
    width = max(len(k) for k, _ in rows)
    print(f"\ndjango-xjobs bench ({'quick' if args.quick else 'full'}; concurrency "
          f"{args.concurrency}, prefetch {args.prefetch}, 2 worker processes)\n")
    print(f"| {'workload'.ljust(width)} | result |")
    print(f"|{'-' * (width + 2)}|--------|")
    for k, v in rows:
        print(f"| {k.ljust(width)} | {v} |")


if __name__ == "__main__":
    main()
