"""django-xjobs benchmark (``make bench``): the peers' harness workloads, for us alone.

    python bench/run.py [--quick] [--workloads W1,...,W14] [--concurrency 10] [--prefetch auto]
                        [--rate-limit 2000]

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
W11 fair share     20,000 no-op jobs of 1,000 tenants, one tenant half of them (enqueued
                    first), the rest a long tail; 2 workers; a queue with fair_by="tenant"
                    and one without; steady rate, their ratio, and when each tenant's first
                    job started, as a share of the drain (p50, last)   jobs/s, ratio, %
W12 rate limit      20,000 no-op jobs under RateLimit(limit=2,000, period=1 s) (10 s of
                    budget), 2 workers; starts/s as a share of the limit, and the most starts
                    in any 1 s window of started_at (at most the limit)    starts/s, count
W13 slot hand-over  Concurrency(limit=1) on one key, 20 ms jobs, 2 workers: finished_at of
                    one run -> started_at of the next on the other worker, ~200    p50/p95
W14 child jobs      a parent gathers 1,000 no-op children (ctx.step.gather), 2 workers,
                    5 rounds: the gather's start -> the parent's resumed step recorded
                    (children/s), and the last child's settle -> the parent's resumed
                    claim (the wake)                                          jobs/s, p50/max
W8 and W11-W13 print beside them one unlimited no-op drain of the same run.
Spawned workers start from bytecode compiled before the first workload, as an installed
package's would (compile_sources; ``--from-source`` measures them compiling it).

The database is a fresh ``xjobs_bench`` (``XJOBS_BENCH_DB`` names another) on the server
``devdb.py`` picks (the one the tests use). Figures depend on the machine: compare
systems within ONE run of the shared harness (``make bench-peers``), never across runs.
Nothing here is a test; nothing asserts a time.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _source() -> Path:
    """``--source DIR``: measure the django_xjobs package of another checkout (an A/B run of
    bench/ab.py); read before anything imports the package."""
    if "--source" in sys.argv[:-1]:
        return Path(sys.argv[sys.argv.index("--source") + 1]).resolve()
    return ROOT


SOURCE = _source()
sys.path[:0] = [str(HERE), str(SOURCE), str(ROOT)]

FULL = {"w1": 5000, "w2": 50000, "w3": 20000, "w4": 500, "reps": 3, "w9": 100_000}
QUICK = {"w1": 500, "w2": 5000, "w3": 2000, "w4": 50, "reps": 1, "w9": 10_000}


W14_CHILDREN = 1000
W14_ROUNDS = 5


def percentile(values: list[float], p: float) -> float:
    s = sorted(values)
    k = (len(s) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


W11_TENANTS = 1000
# A W11 drain still running after this long (the unfair one takes seconds) is stopped and
# measured over the jobs it finished, with the count it left: a fair queue that slows to a
# crawl is a result to print, not a reason to lose the rest of the table.
W11_LIMIT = 120.0


def tenant_backlog(n: int, tenants: int) -> list[int]:
    """Jobs per tenant for W11: tenant 0 has half of the ``n`` jobs; every other tenant has
    one, and what is left goes to them by 1 / rank (a long tail: of 20,000 jobs, tenant 1 has
    1,204, tenant 100 has 14, half the tenants three or fewer)."""
    big = n // 2
    spare = n - big - (tenants - 1)
    if spare < 0:
        raise ValueError(f"{n} jobs cannot give {tenants} tenants one each")
    weights = [1 / rank for rank in range(1, tenants)]
    total = sum(weights)
    extra = [int(spare * w / total) for w in weights]
    for rank in range(spare - sum(extra)):  # what rounding down left, one each from the top
        extra[rank] += 1
    return [big, *(1 + e for e in extra)]


def compile_sources() -> None:
    """Byte-compile what the spawned workers import from a checkout rather than from an
    installed package: the measured django_xjobs, the benchmark's project and the dev database
    helper, as pip does when it installs a package. A deployed worker starts from that
    bytecode; a checkout run with PYTHONDONTWRITEBYTECODE=1 (as on the bench machine) would
    compile some eighty modules from source at every spawn, a hundred milliseconds of each W3
    start-up that no deployment pays (docs/performance.md, "Worker start-up"). ``--from-source``
    skips this and measures that case."""
    import compileall

    for folder in (SOURCE / "django_xjobs", HERE / "xbench_project"):
        compileall.compile_dir(folder, quiet=1)
    for module in (ROOT / "tests" / "__init__.py", ROOT / "tests" / "devdb.py"):
        compileall.compile_file(module, quiet=1)


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
            "PYTHONPATH": os.pathsep.join([str(HERE), str(SOURCE), str(ROOT)]),
            "XJOBS_BENCH_CONCURRENCY": str(args.concurrency),
            "XJOBS_BENCH_PREFETCH": str(args.prefetch),
            "XJOBS_BENCH_RATE_LIMIT": str(args.rate_limit),
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
        self._unlimited: dict[str, float] | None = None

    # ------------------------------------------------------------------------ helpers --
    def sql(self, statement: str) -> list[tuple]:
        with self.connection.cursor() as cur:
            cur.execute(statement)
            return cur.fetchall() if cur.description else []

    def reset(self) -> None:
        # The counters' tables too where the measured checkout has them (bench/ab.py may
        # measure one from before them).
        tables = [t for (t,) in self.sql(
            "select relname::text from pg_class where relkind = 'r' and relname = any("
            "array['x_jobs', 'x_job_steps', 'x_job_events', 'x_stat_deltas', 'x_stats'])")]
        self.sql(f"truncate {', '.join(sorted(tables))}")
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
    def check_alive(procs, what: str) -> None:
        """A worker that exits (a setting it refuses, a job it cannot import) fails the
        workload at once instead of leaving it to wait out its deadline."""
        for p in procs:
            if p.poll() is not None:
                err = p.stderr.read().decode(errors="replace")[-2000:]
                for q in procs:
                    if q.poll() is None:
                        q.kill()
                raise RuntimeError(f"{what}: a worker exited with {p.returncode}:\n{err}")

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

    def w14(self) -> dict[str, float]:
        """Fan-out / fan-in (docs/durable.md, "Child jobs"): rounds of one parent gathering
        W14_CHILDREN no-op children, drained by 2 workers; every figure is read back from
        the database's own timestamps."""
        self.reset()
        procs = self.spawn_workers()
        time.sleep(3)
        rates, wakes, recorded = [], [], []
        try:
            for _ in range(W14_ROUNDS):
                parent = self.jobs.fan.enqueue(n=W14_CHILDREN)
                deadline = time.monotonic() + 300
                while self.sql(f"select state from x_jobs where id = '{parent.id}'"
                               )[0][0] != "done":
                    self.check_alive(procs, "W14")
                    if time.monotonic() > deadline:
                        raise RuntimeError("W14 parent did not finish in 300 s")
                    time.sleep(0.05)
                opened, done, resumed, last_child, children = self.sql(f"""
                    select extract(epoch from s.started_at), extract(epoch from s.completed_at),
                           extract(epoch from p.started_at),
                           (select extract(epoch from max(c.finished_at)) from x_jobs c
                             where c.parent_id = p.id),
                           (select count(*) from x_jobs c where c.parent_id = p.id
                               and c.state = 'done')
                      from x_jobs p join x_job_steps s on s.run_id = p.run_id
                     where p.id = '{parent.id}' and s.name = 'fan'""")[0]
                assert children == W14_CHILDREN, f"{children} children done"
                rates.append(W14_CHILDREN / (float(done) - float(opened)))
                wakes.append((float(resumed) - float(last_child)) * 1000)
                recorded.append((float(done) - float(last_child)) * 1000)
        finally:
            self.stop_workers(procs)
        return {"rate": statistics.median(rates), "min_rate": min(rates),
                "wake_p50": percentile(wakes, 50), "wake_max": max(wakes),
                "recorded_p50": percentile(recorded, 50)}

    # ---- W8, W11-W13: flow control (docs/flow-control.md) ----
    def _drain(self, items: list[tuple], what: str, *, args: tuple[str, ...] = (),
               extra_env: dict[str, str] | None = None, limit: float = 900,
               partial: bool = False) -> dict[str, float]:
        """Enqueue ``items`` into an empty system, spawn 2 workers, wait until every job is
        done. The rows stay in x_jobs for the caller to read. With ``partial``, a drain still
        running after ``limit`` seconds is stopped and measured over the jobs done
        (``unfinished`` says how many were not)."""
        from django_xjobs import enqueue_many

        self.reset()
        self.sql("truncate x_job_leases, x_rate_units")
        for start in range(0, len(items), 1000):
            enqueue_many(items[start:start + 1000])
        self.sql("analyze x_jobs")
        t0 = time.time()
        procs = self.spawn_workers(extra_env=extra_env, args=args)
        deadline = time.monotonic() + limit
        while left := self.sql("select count(*) from x_jobs where state <> 'done'")[0][0]:
            if time.monotonic() > deadline:
                self.stop_workers(procs)
                if partial:
                    break
                raise RuntimeError(f"{what} did not finish in {limit:.0f} s")
            self.check_alive(procs, what)
            time.sleep(0.1)
        else:
            self.stop_workers(procs)
        first, last, n = self.sql("select extract(epoch from min(started_at)),"
                                  " extract(epoch from max(finished_at)), count(*) from x_jobs"
                                  " where state = 'done'")[0]
        return {"rate": n / (float(last) - t0), "steady": n / (float(last) - float(first)),
                "unfinished": left}

    def unlimited(self) -> dict[str, float]:
        """The baseline the flow-control workloads are read against: a no-op drain without
        any limit, once per run (the same figure beside W8 and W11-W13)."""
        if self._unlimited is None:
            n = max(500, self.sizes["w3"] // 4)
            self._unlimited = self._drain([("bench.noop", {"i": i}) for i in range(n)],
                                          "the unlimited drain")
            self._unlimited["n"] = n
        return self._unlimited

    def w8(self) -> dict[str, dict[str, float]]:
        """The cost of slots: the same no-op drain unlimited, then under Concurrency(limit=2)
        on 20 keys, with the keys interleaved (i % 20: a claimed batch spans every key) and
        clustered (i // (n / 20): a claimed batch is mostly one key, so the claim blocks most
        of it until the key's releases wake it)."""
        n = max(500, self.sizes["w3"] // 4)
        return {
            "unlimited": self.unlimited(),
            "interleaved": self._drain([("bench.keyed", {"i": i, "k": i % 20})
                                        for i in range(n)], "W8 interleaved"),
            "clustered": self._drain([("bench.keyed", {"i": i, "k": i * 20 // n})
                                      for i in range(n)], "W8 clustered"),
        }

    def w11(self) -> dict[str, dict[str, float]]:
        """Fair share: a skewed backlog of 1,000 tenants (tenant_backlog) drained by 2 workers
        from a queue with fair_by="tenant" and from one without; the big tenant's jobs are
        enqueued first, then the others tenant by tenant, so a queue taken in order serves the
        tail only after them. Medians over the reps (3; 1 in --quick). Besides the steady
        rate: when each tenant's first job started, as a share of the drain (first start ->
        last finish; p50 and the last tenant): late in the drain for the median tenant when
        the queue goes in order, near 0 when tenants take turns."""
        n = max(4 * W11_TENANTS, self.sizes["w3"])
        counts = tenant_backlog(n, W11_TENANTS)
        runs: dict[str, list[dict[str, float]]] = {"plain": [], "fair": []}
        for _ in range(self.sizes["reps"]):  # alternated, so drift hits both alike
            for queue in runs:
                options = [{"tenant_id": f"t{t:04d}", "queue": queue}
                           for t in range(len(counts))]
                items = [("bench.noop", {"i": i}, options[t]) for i, t in
                         enumerate(t for t, c in enumerate(counts) for _ in range(c))]
                r = self._drain(items, f"W11 {queue}", args=("--queue", queue),
                                extra_env={"XJOBS_BENCH_FAIR": "1"}, limit=W11_LIMIT,
                                partial=True)
                firsts = sorted(float(t) for (t,) in self.sql(
                    "select extract(epoch from min(started_at)) from x_jobs"
                    " where started_at is not null group by tenant_id"))
                last = float(self.sql("select extract(epoch from max(finished_at)) from x_jobs"
                                      " where state = 'done'")[0][0])
                waits = [(t - firsts[0]) / (last - firsts[0]) for t in firsts]
                r.update(first_p50=percentile(waits, 50), first_max=waits[-1])
                runs[queue].append(r)
        return {queue: {"n": n, **{k: statistics.median(r[k] for r in rs) for k in rs[0]}}
                for queue, rs in runs.items()}

    def w12(self) -> dict[str, float]:
        """A rate-limited drain: RateLimit(key="partner", limit=L, period=1 s) on a no-op job,
        L x 10 jobs (3 s of budget in --quick), 2 workers. Achieved starts per second are
        n / (last start - first start + 1 s): a claim that spent every budget the moment it
        freed starts L jobs in each second of that span, so this is L at full use. The max
        starts in any 1 s window (t - 1 s, t] of the jobs' started_at must not exceed L."""
        if not hasattr(self.jobs, "rated"):
            raise RuntimeError("W12 needs RateLimit (from django_xjobs import RateLimit): this "
                               "checkout has no rate limits")
        limit = self.args.rate_limit
        n = limit * (3 if self.args.quick else 10)
        r = self._drain([("bench.rated", {"i": i}) for i in range(n)], "W12")
        starts = [int(t) for (t,) in self.sql(
            "select (extract(epoch from started_at) * 1000000)::bigint from x_jobs"
            " order by started_at")]
        attempts = self.sql("select max(attempt) from x_jobs")[0][0]
        span = (starts[-1] - starts[0]) / 1e6
        achieved = n / (span + 1.0)
        peak, lo = 0, 0
        for hi, t in enumerate(starts):
            while t - starts[lo] >= 1_000_000:
                lo += 1
            peak = max(peak, hi - lo + 1)
        r.update(n=n, limit=limit, achieved=achieved, utilisation=achieved / limit,
                 max_window=peak, max_attempt=attempts)
        return r

    def w13(self) -> dict[str, float]:
        """Slot hand-over: Concurrency(limit=1) on one key, jobs of about 20 ms, 2 workers.
        Jobs go in batches (the workers go idle between them); within a batch, in started_at
        order, job n+1 waits for job n's release. The hand-over is finished_at of job n (its
        settle, which frees the slot) -> started_at of job n+1 (its claim), both on the
        database clock, counted when the two ran on different workers, until ~200 of them."""
        from django_xjobs import enqueue_many

        target = 50 if self.args.quick else 200
        batch = 2 * target
        self.reset()
        self.sql("truncate x_job_leases, x_rate_units")
        procs = self.spawn_workers()
        try:
            time.sleep(3)  # start-up is not a hand-over
            crossed = 0
            for b in range(10):
                enqueue_many([("bench.handover", {"i": b * batch + k}) for k in range(batch)])
                deadline = time.monotonic() + 300
                while self.sql("select count(*) from x_jobs where state <> 'done'")[0][0]:
                    if time.monotonic() > deadline:
                        raise RuntimeError("W13 batch did not finish in 300 s")
                    self.check_alive(procs, "W13")
                    time.sleep(0.1)
                rows = self._w13_rows(batch)
                crossed = sum(1 for other, _ in rows if other)
                if crossed >= target:
                    break
        finally:
            self.stop_workers(procs)
        cross = [ms for other, ms in rows if other]
        same = [ms for other, ms in rows if not other]
        if not cross:
            raise RuntimeError("W13: no hand-over between the two workers")
        return {"p50": percentile(cross, 50), "p95": percentile(cross, 95), "n": len(cross),
                "same_p50": percentile(same, 50) if same else float("nan"),
                "same_n": len(same), "overlaps": sum(1 for _, ms in rows if ms < 0)}

    def _w13_rows(self, batch: int) -> list[tuple[bool, float]]:
        """(to the other worker?, finished_at of n -> started_at of n + 1 in ms) per pair of
        consecutive runs of one batch."""
        runs = self.sql(
            "select (input->>'i')::int, claimed_by,"
            " (extract(epoch from started_at) * 1000000)::bigint,"
            " (extract(epoch from finished_at) * 1000000)::bigint"
            " from x_jobs order by started_at")
        return [(a[1] != b[1], (b[2] - a[3]) / 1000)
                for a, b in itertools.pairwise(runs) if a[0] // batch == b[0] // batch]

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
    p.add_argument("--workloads",
                   default="W1,W2,W3,W4,W5,W6,W7,W8,W9,W10,W11,W12,W13,W14")
    p.add_argument("--concurrency", type=int, default=10)
    p.add_argument("--prefetch", default="auto")
    p.add_argument("--source", default=str(ROOT),
                   help="the checkout whose django_xjobs is measured (default: this one)")
    p.add_argument("--rate-limit", type=int, default=2000,
                   help="W12's limit, starts per second (high enough to bind)")
    p.add_argument("--from-source", action="store_true",
                   help="do not byte-compile the checkout first: the workers compile what they "
                        "import when PYTHONDONTWRITEBYTECODE is set (see compile_sources)")
    args = p.parse_args()
    if args.rate_limit < 1:
        p.error("--rate-limit must be a positive number of starts per second")
    if not args.from_source:
        compile_sources()
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
    if chosen & {"W11", "W12", "W13"}:
        base_run = bench.unlimited()
        base = base_run["steady"]
        if "W8" not in chosen:  # W8 prints it already
            rows.append((f"W11-W13 baseline: drain of {base_run['n']:,} no-op jobs, no limit "
                         "(steady)", f"{base_run['rate']:,.0f} jobs/s ({base:,.0f})"))
    if "W11" in chosen:
        r11 = bench.w11()
        plain, fair = r11["plain"], r11["fair"]
        for queue, label in (("plain", "a queue without fairness"),
                             ("fair", 'fair_by="tenant"')):
            r = r11[queue]
            rows.append((f"W11 drain of {r['n']:,} jobs, {W11_TENANTS:,} tenants skewed, "
                         f"{label} (steady)",
                         f"{r['rate']:,.0f} jobs/s ({r['steady']:,.0f}; "
                         f"{r['steady'] / base:.0%} of unlimited); a tenant's first start "
                         f"at p50 {r['first_p50']:.0%} of the drain, last {r['first_max']:.0%}"
                         + (f"; STOPPED after {W11_LIMIT:.0f} s with {r['unfinished']:,.0f} "
                            "jobs not done" if r["unfinished"] else "")))
        rows.append(("W11 fair / without fairness (steady)",
                     f"{fair['steady'] / plain['steady']:.3g}"))
    if "W12" in chosen:
        r12 = bench.w12()
        rows.append((f"W12 drain of {r12['n']:,} jobs under RateLimit {r12['limit']:,}/s "
                     "(starts/s)",
                     f"{r12['achieved']:,.0f} starts/s ({r12['utilisation']:.0%} of the limit; "
                     f"unlimited {base:,.0f} jobs/s); max in any 1 s {r12['max_window']:,} "
                     f"(limit {r12['limit']:,}); max attempt {r12['max_attempt']}"))
    if "W13" in chosen:
        r13 = bench.w13()
        rows.append(("W13 slot hand-over to the other worker, limit 1, 20 ms jobs, p50 / p95",
                     f"{r13['p50']:.1f} / {r13['p95']:.1f} ms ({r13['n']} hand-overs; same "
                     f"worker p50 {r13['same_p50']:.1f} ms over {r13['same_n']}; "
                     f"{r13['overlaps']} overlaps)"))
    if "W14" in chosen:
        r14 = bench.w14()
        rows.append((f"W14 gather of {W14_CHILDREN:,} no-op children, 2 workers (gather -> "
                     "resumed)", f"{r14['rate']:,.0f} children/s (slowest round "
                     f"{r14['min_rate']:,.0f})"))
        rows.append(("W14 last child's settle -> parent resumed, p50 / max",
                     f"{r14['wake_p50']:.1f} / {r14['wake_max']:.1f} ms (-> outcome recorded "
                     f"p50 {r14['recorded_p50']:.1f} ms)"))
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
