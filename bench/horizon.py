"""W15: the queue under a held horizon (``make bench-horizon``).

A steady offered load (``--rate`` no-op jobs a second, each enqueued in its own transaction,
as an application's requests would) is drained by 2 workers of ``--concurrency`` threads (the
scheduler, maintenance and counters running as they do by default). After ``--before``
seconds a REPEATABLE READ transaction reads ``x_jobs`` once and stays open for ``--hold``
seconds, as ``pg_dump``, a long report or a replica with ``hot_standby_feedback`` would: no
row version younger than its snapshot can be vacuumed or marked dead in an index while it is
open. Then ``--after`` seconds without it.

Beside it, in the same database under the same snapshot, the raw reference: the tightest
SKIP LOCKED loop in plain psycopg (a ``raw_jobs`` table, an INSERT + NOTIFY per job, workers
that claim with ``UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED)`` and delete what
they ran), offered the same load by the same number of processes. ``--systems`` runs one of
them alone: ``make bench-horizon`` runs django-xjobs, then the raw reference, each alone with
the same schedule (600 jobs a second together saturate a 2-core machine, and each one's walk
would slow the other).

Printed per ``--bucket`` seconds (a minute by default) and per system: the pick-up latency
(enqueue to the job's first line) p50 / p99 of the jobs enqueued in it, the claim's cost (a
probe: EXPLAIN ANALYZE of one claim, rolled back, every ``--sample`` seconds, with the generic
plan a worker's prepared statement runs (:func:`generic_plan`); its time and
the buffers it touched: for django-xjobs the claim a worker sends while the horizon is held,
with floors, and once a line the sweep, without), the enqueue's own time, the table's dead
tuples and the backlog. The last line compares the
last five minutes of the hold with the minutes before it (docs/performance.md, "Under a held
horizon").

    python bench/horizon.py --systems xjobs          # 2 min, 30 min held, 2 min (about 35 min)
    python bench/horizon.py --systems raw --before 60 --hold 240 --after 60 --bucket 30

Nothing here is a test and nothing asserts a time; tests/acceptance/test_held_horizon.py runs
the mechanism at a CI size, tests/integration/test_horizon.py the claim under a real held
snapshot.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from run import SOURCE, Bench, compile_sources, percentile, setup_database  # noqa: E402

RAW_SCHEMA = """
create table if not exists raw_jobs (
    id          bigserial primary key,
    args        jsonb       not null,
    status      smallint    not null default 0,
    enqueued_at timestamptz not null default now()
);
create index if not exists raw_jobs_todo_idx on raw_jobs (id) where status = 0;
"""
RAW_INSERT = ("with j as (insert into raw_jobs (args) values (%s) returning id) "
              "select pg_notify('raw_jobs', '') from j")
RAW_CLAIM = """
update raw_jobs set status = 1
 where id in (select id from raw_jobs where status = 0 order by id limit %s
                 for update skip locked)
returning id, args
"""
RAW_COMPLETE = "delete from raw_jobs where id = any(%s)"


# A probe's plan is kept (--logs) when it took longer than this.
SLOW_PLAN_MS = 50


def generic_plan(conn, sql: str, params: dict) -> dict:
    """EXPLAIN ANALYZE of ``sql`` as a worker runs it: prepared, with the generic plan its
    connection keeps (statement session_label sets plan_cache_mode), not a plan made for these
    values, and without JIT, as the worker's session runs it. A custom plan can pick another
    index than the workers' generic one, and did: the probe read 150 pages while the workers'
    claims walked the fair claim's index. With JIT on, once autovacuum had analyzed `x_jobs`
    after a long hold, every probe compiled the claim for 4 to 6 seconds, a core of the two the
    workers had (docs/performance.md, "Under a held horizon")."""
    import re

    from psycopg import sql as pgsql

    order: list[str] = []

    def number(match: re.Match) -> str:
        if match.group(1) not in order:
            order.append(match.group(1))
        return f"${order.index(match.group(1)) + 1}"

    text = re.sub(r"%\((\w+)\)s", number, sql.strip()).replace("%%", "%")
    conn.execute("set local plan_cache_mode = force_generic_plan")
    conn.execute("set local jit = off")
    conn.execute(pgsql.SQL("prepare xjobs_probe as {}").format(pgsql.SQL(text)))
    values = pgsql.SQL(", ").join(pgsql.Literal(params[name]) for name in order)
    plan = conn.execute(pgsql.SQL(
        "explain (analyze, buffers, format json) execute xjobs_probe ({})").format(values)
    ).fetchone()[0][0]
    conn.execute("deallocate xjobs_probe")
    return plan


# ------------------------------------------------------------------------ raw reference --


def raw_worker(url: str, lat_dir: str, batch: int) -> None:
    """The raw reference's worker: claim a batch, run it (record each start), delete it; wait
    on LISTEN (1 s fallback) when nothing is due."""
    import psycopg

    fd = os.open(os.path.join(lat_dir, f"{os.getpid()}.txt"),
                 os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    listen = psycopg.connect(url, autocommit=True)
    listen.execute("listen raw_jobs")
    conn = psycopg.connect(url)
    while True:
        with conn.transaction():
            rows = conn.execute(RAW_CLAIM, (batch,)).fetchall()
        if not rows:
            select.select([listen.fileno()], [], [], 1.0)
            for _ in listen.notifies(timeout=0):
                pass
            continue
        now = time.time()
        os.write(fd, "".join(f"{a['i']} {a['t']:.6f} {now:.6f}\n" for _, a in rows).encode())
        with conn.transaction():
            conn.execute(RAW_COMPLETE, ([r[0] for r in rows],))


# ------------------------------------------------------------------------------ the run --


class Horizon:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        os.environ.setdefault("XJOBS_BENCH_DB", "xjobs_horizon")
        self.url = setup_database()
        self.env = dict(os.environ)
        self.env.update({
            "XJOBS_BENCH_DATABASE_URL": self.url,
            "DJANGO_SETTINGS_MODULE": "xbench_project.settings",
            "PYTHONPATH": os.pathsep.join([str(HERE), str(SOURCE), str(HERE.parent)]),
            "XJOBS_BENCH_CONCURRENCY": str(args.concurrency),
        })
        os.environ.update(self.env)
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as c:
            c.execute(RAW_SCHEMA)
        self.systems = [s for s in args.systems.split(",") if s]
        self.dirs = {s: tempfile.mkdtemp(prefix=f"horizon-{s}-") for s in self.systems}
        # The workers' logs (a file, never a pipe nobody reads while they run: a full pipe
        # would stop a worker at its next log line) and the probe's slow plans.
        self.logs = Path(args.logs or tempfile.mkdtemp(prefix="horizon-logs-"))
        self.logs.mkdir(parents=True, exist_ok=True)
        self.samples: list[dict] = []
        # (when, ms) of each enqueue: the offered load's own cost, per system.
        self.enqueues: dict[str, list[tuple[float, float]]] = {s: [] for s in self.systems}
        self.stop = threading.Event()
        self.t0 = 0.0
        self.errors: list[str] = []

    # ---- processes ----
    def spawn(self) -> list[subprocess.Popen]:
        procs = []
        for i in range(self.args.workers):
            if "xjobs" in self.systems:
                env = dict(self.env, XJOBS_BENCH_LAT_DIR=self.dirs["xjobs"],
                           XJOBS_BENCH_LOG_LEVEL="INFO")
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "django", "xjobs_worker", "--worker-id",
                     f"horizon-w{i}"], env=env, cwd=HERE, stdout=subprocess.DEVNULL,
                    stderr=self._log(f"xjobs-w{i}")))
            if "raw" in self.systems:
                procs.append(subprocess.Popen(
                    [sys.executable, __file__, "raw-worker", "--url", self.url,
                     "--lat-dir", self.dirs["raw"], "--batch", str(self.args.raw_batch)],
                    env=self.env, stdout=subprocess.DEVNULL, stderr=self._log(f"raw-w{i}")))
        return procs

    def _log(self, name: str):
        return open(self.logs / f"{name}.log", "ab")

    # ---- the offered load ----
    def offer(self, system: str) -> None:
        """Enqueue at --rate, paced on the clock, one transaction per job, until stopped."""
        import psycopg

        rate = self.args.rate
        i = 0
        if system == "xjobs":
            from django.db import connection
            from xbench_project.benchjobs import jobs

            def enqueue(i: int) -> None:
                jobs.lat.enqueue(i=i, t=time.time())
        else:
            conn = psycopg.connect(self.url, autocommit=True)

            def enqueue(i: int) -> None:
                conn.execute(RAW_INSERT, (json.dumps({"i": i, "t": time.time()}),))
        try:
            while not self.stop.is_set():
                due = self.t0 + i / rate
                delay = due - time.time()
                if delay > 0:
                    time.sleep(delay)  # pacing the offered load
                started = time.time()
                enqueue(i)
                self.enqueues[system].append((started - self.t0,
                                              (time.time() - started) * 1000))
                i += 1
        except Exception as e:  # reported at the end; the run stops
            self.errors.append(f"{system} enqueue: {e!r}")
            self.stop.set()
        finally:
            if system == "xjobs":
                connection.close()

    # ---- the probe ----
    def probe(self) -> None:
        """Every --sample seconds: one claim of each system, EXPLAIN ANALYZE'd and rolled back
        (its time and buffers), the tables' dead tuples, the backlog."""
        import psycopg

        try:
            from django_xjobs.engines.postgres.statements.claim import JOBS_CLAIM
        except ImportError:  # --source: a checkout from before the claim had its own module
            from django_xjobs.engines.postgres.statements.jobs import JOBS_CLAIM
        try:
            from django_xjobs.worker.floors import LAPSED_MARGIN, MARGIN
        except ImportError:  # --source: a checkout from before the floors; its claim, whole
            LAPSED_MARGIN = MARGIN = None

        params = {
            "queues": ["default"], "limits": [1], "fair": [False], "cursors": [""],
            "worker_id": "horizon-probe", "lease_ms": 30000, "slot_ttl_ms": 30000,
            "limit_names": [], "limit_values": [], "prefixes": [], "prefix_limits": [],
            "rate_names": [], "rate_limits": [], "rate_periods": [], "rate_costs": [],
            "weight_queues": [], "weight_tenants": [], "weight_values": [],
            "park": True, "hold_ms": 1000, "floored": [False], "lapsed_from": [None],
            "floor_queues": [], "floor_priorities": [], "floor_values": [], "scans": True,
        }
        conn = psycopg.connect(self.url, autocommit=True)
        # The sweep is probed once a report line, as rarely as a worker sends one: at the end of
        # a long hold it reads the whole index, and the probe must not load the server more
        # than the workers do.
        next_sweep = 0.0
        while not self.stop.wait(self.args.sample):
            sample: dict = {"t": time.time() - self.t0}
            sweep = sample["t"] >= next_sweep
            if sweep:
                next_sweep = sample["t"] + self.args.bucket
            # The claim as a worker sends it while the horizon is held (floors a margin back,
            # worker/floors.py) and as it sends a sweep (no floors): both, for the same rows.
            back, lapsed = conn.execute("select now() - %s, now() - %s",
                                        (MARGIN or timedelta(0),
                                         LAPSED_MARGIN or timedelta(0))).fetchone()
            floored = dict(params, floored=[True], lapsed_from=[lapsed],
                           floor_queues=["default"], floor_priorities=[0], floor_values=[back])
            for key, sql, args in (("xjobs", JOBS_CLAIM.sql, floored if MARGIN else params),
                                   ("xjobs_sweep", JOBS_CLAIM.sql, params),
                                   ("raw", RAW_CLAIM, (1,))):
                if key.split("_")[0] not in self.systems or (key.endswith("_sweep")
                                                             and not sweep):
                    continue
                with conn.transaction(force_rollback=True):
                    if key.startswith("xjobs"):
                        plan = generic_plan(conn, sql, args)
                    else:
                        plan = conn.execute("explain (analyze, buffers, format json) " + sql,
                                            args).fetchone()[0][0]
                sample[f"{key}_claim_ms"] = plan["Execution Time"]
                if plan["Execution Time"] > SLOW_PLAN_MS:
                    path = self.logs / f"{key}-{sample['t']:07.1f}s.json"
                    path.write_text(json.dumps(plan, indent=1))
                sample[f"{key}_claim_buffers"] = (plan["Plan"].get("Shared Hit Blocks", 0)
                                                  + plan["Plan"].get("Shared Read Blocks", 0))
            for system, table, backlog in (
                    ("xjobs", "x_jobs", "state in ('ready', 'delayed')"),
                    ("raw", "raw_jobs", "status = 0")):
                if system not in self.systems:
                    continue
                dead, = conn.execute(
                    "select n_dead_tup from pg_stat_user_tables where relname = %s",
                    (table,)).fetchone()
                waiting, = conn.execute(
                    f"select count(*) from {table} where {backlog}").fetchone()
                sample[f"{system}_dead"], sample[f"{system}_backlog"] = dead, waiting
            self.samples.append(sample)

    def run(self) -> None:
        a = self.args
        compile_sources()
        procs = self.spawn()
        import psycopg

        holder = psycopg.connect(self.url)
        time.sleep(3)  # the workers' start-up, before the offered load begins
        self.t0 = time.time()
        threads = [threading.Thread(target=self.offer, args=(s,), daemon=True)
                   for s in self.systems]
        threads.append(threading.Thread(target=self.probe, daemon=True))
        for t in threads:
            t.start()
        phases = ((a.before, "before"), (a.hold, "hold"), (a.after, "after"))
        self.marks = {}
        try:
            for length, phase in phases:
                self.marks[phase] = time.time() - self.t0
                if phase == "hold":
                    holder.execute("set transaction isolation level repeatable read")
                    holder.execute("select count(*) from x_jobs")
                    holder.execute("select count(*) from raw_jobs")
                if phase == "after":
                    holder.rollback()
                end = self.t0 + self.marks[phase] + length
                while time.time() < end and not self.stop.is_set():
                    for p in procs:
                        if p.poll() is not None:
                            raise RuntimeError(f"a worker exited with {p.returncode}: its log "
                                               f"is in {self.logs}")
                    time.sleep(1)  # the phase's length, checked once a second
            self.marks["end"] = time.time() - self.t0
        finally:
            self.stop.set()
            holder.rollback()
            for t in threads:
                t.join(timeout=30)
            time.sleep(2)  # the last jobs enqueued are picked up
            Bench.stop_workers(procs)
        if self.errors:
            raise RuntimeError("; ".join(self.errors))

    # ---- the report ----
    def latencies(self, system: str) -> list[tuple[float, float]]:
        """(enqueued, ms to its first line) of every job started, relative to the start."""
        seen: dict[int, tuple[float, float]] = {}
        for f in Path(self.dirs[system]).iterdir():
            for line in f.read_text().splitlines():
                i, te, ts = line.split()
                seen.setdefault(int(i), (float(te) - self.t0, (float(ts) - float(te)) * 1000))
        return list(seen.values())

    def report(self) -> None:
        a = self.args
        lat = {s: self.latencies(s) for s in self.systems}
        end = self.marks["end"]
        print(f"W15 held horizon: {a.rate} jobs/s offered per system, {a.workers} workers each "
              f"(xjobs concurrency {a.concurrency}), snapshot held from {self.marks['hold']:.0f} s "
              f"to {self.marks['after']:.0f} s, {end:.0f} s in all")
        head = ["from s", "phase"]
        for s in self.systems:
            claim = ("xjobs claim ms (buffers), floored / sweep" if s == "xjobs"
                     else f"{s} claim ms (buffers)")
            head += [f"{s} p50 / p99 ms", f"{s} started", f"{s} enqueue p50 / p99 ms", claim,
                     f"{s} dead tuples", f"{s} backlog"]
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        start = 0.0
        while start < end - 1:
            stop = min(start + a.bucket, end)
            middle = (start + stop) / 2  # a line's phase is its middle's
            phase = ("before" if middle < self.marks["hold"]
                     else "hold" if middle < self.marks["after"] else "after")
            row = [f"{start:.0f}", phase]
            for s in self.systems:
                ms = [m for te, m in lat[s] if start <= te < stop]
                probes = [x for x in self.samples if start <= x["t"] < stop and f"{s}_dead" in x]
                row.append(f"{percentile(ms, 50):.1f} / {percentile(ms, 99):.1f}" if ms else "-")
                row.append(str(len(ms)))
                enq = [m for te, m in self.enqueues[s] if start <= te < stop]
                row.append(f"{percentile(enq, 50):.2f} / {percentile(enq, 99):.2f}"
                           if enq else "-")
                cells = []
                for key in (s, f"{s}_sweep") if s == "xjobs" else (s,):
                    claim = [x[f"{key}_claim_ms"] for x in probes if f"{key}_claim_ms" in x]
                    bufs = [x[f"{key}_claim_buffers"] for x in probes
                            if f"{key}_claim_buffers" in x]
                    if claim:
                        cells.append(f"{statistics.median(claim):.2f} "
                                     f"({statistics.median(bufs):,.0f})")
                row.append(" / ".join(cells) or "-")
                row.append(f"{probes[-1][f'{s}_dead']:,}" if probes else "-")
                row.append(f"{max(x[f'{s}_backlog'] for x in probes):,}" if probes else "-")
            print("| " + " | ".join(row) + " |")
            start = stop
        hold, after = self.marks["hold"], self.marks["after"]
        for s in self.systems:
            before = [m for te, m in lat[s] if min(30.0, hold / 2) <= te < hold]
            last = [m for te, m in lat[s] if max(hold, after - 300) <= te < after]
            if before and last:
                print(f"{s}: p99 before the hold {percentile(before, 99):.1f} ms, last "
                      f"{min(300, after - hold):.0f} s of the hold {percentile(last, 99):.1f} ms "
                      f"({percentile(last, 99) / percentile(before, 99):.2f}x); "
                      f"{len(lat[s]):,} of the {len(self.enqueues[s]):,} jobs enqueued "
                      "started")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "raw-worker":
        p = argparse.ArgumentParser()
        p.add_argument("raw-worker")
        p.add_argument("--url", required=True)
        p.add_argument("--lat-dir", required=True)
        p.add_argument("--batch", type=int, default=1000)
        a = p.parse_args()
        try:
            raw_worker(a.url, a.lat_dir, a.batch)
        except KeyboardInterrupt:
            pass
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=int, default=300, help="jobs offered a second, per system")
    p.add_argument("--before", type=float, default=120, help="seconds before the hold")
    p.add_argument("--hold", type=float, default=1800, help="seconds the snapshot is held")
    p.add_argument("--after", type=float, default=120, help="seconds after the release")
    p.add_argument("--bucket", type=float, default=60, help="seconds per line of the report")
    p.add_argument("--sample", type=float, default=10, help="seconds between claim probes")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--raw-batch", type=int, default=1000)
    p.add_argument("--systems", default="xjobs,raw", help="xjobs, raw, or both")
    p.add_argument("--source", help="measure the django_xjobs of another checkout (a folder)")
    p.add_argument("--logs", help="a folder for the workers' logs and the plans of the probes "
                                  f"slower than {SLOW_PLAN_MS} ms (default: a new temporary one)")
    args = p.parse_args()
    bad = set(args.systems.split(",")) - {"xjobs", "raw"}
    if bad:
        p.error(f"--systems: unknown {sorted(bad)}; choose from xjobs, raw")
    h = Horizon(args)
    h.run()
    h.report()
    print(f"the workers' logs and the slow probes' plans: {h.logs}")


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    main()
