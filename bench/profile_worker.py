"""Where a worker's time per job goes (docs/performance.md, "Where a job's time goes").

    python bench/profile_worker.py [--jobs 20000] [--concurrency 10] [--repeat 3]
                                   [--latency 300] [--shape | --shape-indexes]
                                   [--profile OUT.pstats] [--source DIR]

On a fresh database (``xjobs_profile``; ``XJOBS_BENCH_DB`` names another) of the server the
tests use, with the bench project's settings (bench/xbench_project: prefetch auto, LISTEN on):

1. **The drain.** One worker (``Worker``, burst mode, no duties) in this process drains
   ``--jobs`` preloaded no-op jobs, ``--repeat`` times; medians per job of: the wall time, the
   process's CPU time (every thread), the CPU time of the server's backends on this database
   (read from /proc when the server runs on this machine), and the worker's CPU by thread
   (the loop, the executor threads, the heartbeat, the watch, the LISTEN thread).
2. **The parts.** The worker's per-job pieces, each timed alone in one thread over the same
   number of jobs: decoding a claimed row, building a run and its context, the executor
   hand-off (a queue put and get), running the job through ``executor.execute``, recording
   its outcome; and a claim and an acknowledgement of real batches of 500, the worker's CPU in
   them (parameters, the driver, decoding) and their round trip (which adds the server's).
   What the drain's CPU per job has beyond their sum is thread switches, locks, wake-ups and
   the garbage collector.
3. **The latency.** ``--latency`` jobs enqueued at 50/s by another process and picked up by
   one idle worker through NOTIFY (W4 of bench/run.py, one worker), cut at the worker's
   steps: the wake-up, the claim sent and answered, the executor's call, the job's first line
   (p50 / p90 of each step, in ms).

4. **The table's shape** (``--shape``). The raw reference's claim and acknowledgement (its
   update variant: docs/performance.md, "Beside the peers") on a table of its shape, the same two
   statements written for ``x_jobs``, and this package's own claim and acknowledgement, each
   draining ``--jobs`` jobs in batches of 500 on one connection, ``--repeat`` rounds alternated: the
   round trips and the WAL per job of each, so that the gap to the raw reference splits into
   what the table costs and what the statements add. ``--shape-indexes`` adds the x_jobs
   statements on copies of x_jobs (its columns, checks and indexes; not its triggers): one with
   every index, then one without each index but the primary key and the claim's.

``--profile OUT`` also writes a cProfile of one drain (on Python 3.12+ it sees every thread,
their stacks interleaved: read its call counts and own times, not its cumulative ones).
``--source DIR`` measures the package of another checkout (``git archive REV django_xjobs
tests | tar -x -C DIR``), as ``bench/run.py --source`` does. Nothing here is a test; nothing
asserts a time.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import queue
import resource
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]
# Django and django_xjobs are imported inside the functions: only _setup, which sets up the
# bench project (and puts --source first on sys.path), makes them importable.


def _setup(args: argparse.Namespace) -> None:
    os.environ.setdefault("XJOBS_BENCH_DB", "xjobs_profile")
    os.environ["XJOBS_BENCH_CONCURRENCY"] = str(args.concurrency)
    import run  # bench/run.py: the same database set-up and settings as `make bench`

    url = run.setup_database()
    run.Bench(url, argparse.Namespace(quick=False, concurrency=args.concurrency,
                                      prefetch="auto", rate_limit=2000))


def _load(n: int) -> None:
    from django.db import connection

    from django_xjobs import enqueue_many

    with connection.cursor() as cur:
        cur.execute("truncate x_jobs, x_stat_deltas")
    for start in range(0, n, 1000):
        enqueue_many([("bench.noop", {"i": i}) for i in range(start, min(n, start + 1000))])
    with connection.cursor() as cur:
        cur.execute("analyze x_jobs")


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _server_cpu() -> dict[int, float] | None:
    """CPU seconds so far of each of the server's backends on this benchmark's database, by
    process id (None where /proc cannot tell: a server on another machine, another OS). The
    server's shared processes (WAL writer, checkpointer) are left out: other databases use
    them too."""
    found, tick = {}, os.sysconf("SC_CLK_TCK")
    database = f" {os.environ['XJOBS_BENCH_DB']} ".encode()
    try:
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return None
    for pid in pids:
        try:
            if database not in Path(f"/proc/{pid}/cmdline").read_bytes():
                continue
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        found[pid] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return found or None


class ThreadClock:
    """The CPU time of each thread of this process, by thread name, sampled every 10 ms while
    it runs (a thread's last sample stands for its total: it may end before the next)."""

    def __init__(self) -> None:
        self.cpu: dict[int, tuple[str, float]] = {}
        # The server's backends on our database, every 100 ms (by process id): the first and
        # the last sample of each.
        self.server_first: dict[int, float] = _server_cpu() or {}
        self.server_last: dict[int, float] = dict(self.server_first)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="profile-clock", daemon=True)

    def __enter__(self) -> ThreadClock:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.server_last.update(_server_cpu() or {})

    def server(self) -> float:
        """CPU seconds of the server's backends on our database while this clock ran."""
        return sum(cpu - self.server_first.get(pid, 0.0)
                   for pid, cpu in self.server_last.items())

    def _sample(self) -> None:
        rounds = 0
        while True:
            rounds += 1
            if rounds % 10 == 0:
                self.server_last.update(_server_cpu() or {})
            for t in threading.enumerate():
                if t.ident is None or t is self._thread:
                    continue
                try:
                    cpu = time.clock_gettime(time.pthread_getcpuclockid(t.ident))
                except (OSError, ProcessLookupError):
                    continue  # it ended meanwhile
                self.cpu[t.ident] = (t.name, cpu)
            if self._stop.wait(0.01):
                return

    def by_role(self, start: dict[int, float]) -> dict[str, float]:
        """CPU seconds since ``start`` (a sample taken before), summed by the thread's role."""
        roles: dict[str, float] = {}
        for ident, (name, cpu) in self.cpu.items():
            role = ("the loop (claim, dispatch, settle)" if name == "MainThread"
                    else "executor threads (run the jobs)" if name.startswith("xjobs-exec")
                    else "heartbeat" if name.startswith("xjobs-heartbeat")
                    else "watch" if name == "xjobs-watch"
                    else "LISTEN" if name == "xjobs-listener" else "other threads")
            roles[role] = roles.get(role, 0.0) + cpu - start.get(ident, 0.0)
        return roles


def _thread_cpu() -> dict[int, float]:
    return {t.ident: time.clock_gettime(time.pthread_getcpuclockid(t.ident))
            for t in threading.enumerate() if t.ident is not None}


def _drain(n: int, profile: cProfile.Profile | None = None
           ) -> tuple[float, float, float, dict[str, float]]:
    """One burst drain of ``n`` loaded jobs: wall, the worker's CPU and the database server's
    CPU (when on this machine, else nan), in µs per job."""
    from django_xjobs.worker.loop import Worker
    from django_xjobs.worker.options import WorkerOptions

    _load(n)
    worker = Worker(WorkerOptions.from_settings(burst=True, install_signals=False, duties=()))
    start = _thread_cpu()
    t0, c0 = time.perf_counter(), _cpu()
    with ThreadClock() as clock:
        if profile is not None:
            profile.enable()
        worker.run()
        if profile is not None:
            profile.disable()
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    done = worker.stats["done"]
    if done != n:
        raise SystemExit(f"the drain finished {done} of {n} jobs")
    server = clock.server() if _server_cpu() is not None else float("nan")
    roles = {k: v / n * 1e6 for k, v in clock.by_role(start).items()}
    return wall / n * 1e6, cpu / n * 1e6, server / n * 1e6, roles


def _per_job(fn, n: int) -> float:
    """µs per call of ``fn(i)`` for i in range(n), best of three."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for i in range(n):
            fn(i)
        best = min(best, time.perf_counter() - t0)
    return best / n * 1e6


def _parts(n: int) -> dict[str, float]:
    from django_xjobs import clock, conf, registry
    from django_xjobs.engines import get_engine
    from django_xjobs.engines.postgres import rows as pg_rows
    from django_xjobs.records import Completion
    from django_xjobs.worker import executor
    from django_xjobs.worker.loop import Worker
    from django_xjobs.worker.options import WorkerOptions
    from django_xjobs.worker.runs import Run

    _load(n)
    engine = get_engine()
    engine.session_label("xjobs:profile")  # set up as a worker's loop connection (JIT off)
    # Real rows of a real claim, as the loop gets them (then handed back untouched).
    batch = engine.jobs_claim(wants={"default": min(n, 1000)}, worker_id="profile",
                              lease_ms=60_000)
    rows = [(j.id, j.lease_token, j.name, j.queue, '{"i": 1}', j.run_id, j.attempt,
             j.max_attempts, j.tenant_id, j.traceparent, j.concurrency_key, j.resumed)
            for j in batch]
    jobs = [pg_rows.claimed_job(rows[i % len(rows)]) for i in range(n)]
    settings = conf.get()
    definition = registry.lookup("bench.noop")
    assert definition is not None
    worker = Worker(WorkerOptions.from_settings(install_signals=False, duties=()))
    # A lease budget no part outlives: the parts time the work, not the lease proof's outcome.
    runs = [Run(jobs[i], definition, clock.monotonic(), budget=1e9,
                on_unproven=worker.executors.unproven) for i in range(n)]
    work: queue.SimpleQueue[object] = queue.SimpleQueue()

    def hand_off(i: int) -> None:
        work.put(runs[i])
        work.get()

    def run_job(i: int) -> None:
        r = runs[i]
        executor.execute(definition, r.job, r.ctx, settings, fresh_connections=False)

    def finish(i: int) -> None:
        worker.runs.finish(runs[i], executor.Done(None), from_phase=runs[i].phase)
        worker.runs.finished.clear()

    # The claim and the acknowledgement of real batches (loaded again: the claim above took
    # some): the worker's CPU (this thread's) and the round trip, per job.
    _load(n)
    claim_cpu = claim_wall = ack_cpu = ack_wall = 0.0
    done = 0
    while done < n:
        t0, c0 = time.perf_counter(), time.thread_time()
        claimed = engine.jobs_claim(wants={"default": 500}, worker_id="profile",
                                    lease_ms=60_000)
        t1, c1 = time.perf_counter(), time.thread_time()
        if not claimed:
            break
        engine.jobs_complete_if_owned([Completion(claim=j.claim, result_json=None)
                                       for j in claimed])
        t2, c2 = time.perf_counter(), time.thread_time()
        claim_wall, claim_cpu = claim_wall + t1 - t0, claim_cpu + c1 - c0
        ack_wall, ack_cpu = ack_wall + t2 - t1, ack_cpu + c2 - c1
        done += len(claimed)
    return {
        "build the run and its ctx (Run)": _per_job(
            lambda i: Run(jobs[i], definition, 0.0, budget=1.0,
                          on_unproven=worker.executors.unproven), n),
        "executor hand-off (queue put + get, one thread)": _per_job(hand_off, n),
        "run it (executor.execute, no connection check)": _per_job(run_job, n),
        "record the outcome (Runs.finish)": _per_job(finish, n),
        "claim, batches of 500: the worker's CPU": claim_cpu / done * 1e6,
        "  of which decoding one claimed row alone (claimed_job)":
            _per_job(lambda i: pg_rows.claimed_job(rows[i % len(rows)]), n),
        "claim, batches of 500: the round trip": claim_wall / done * 1e6,
        "acknowledge, batches of 500: the worker's CPU": ack_cpu / done * 1e6,
        "acknowledge, batches of 500: the round trip": ack_wall / done * 1e6,
    }


# The table shape (--shape): the raw reference's two statements (its update variant:
# docs/performance.md, "Beside the peers") on a table of its shape, the same two statements
# written for x_jobs (its rows, indexes and triggers), and this package's claim and
# acknowledgement; all in batches of 500 on one connection, alternated.
RAW_TABLE = """
drop table if exists raw_shape;
create table raw_shape (
    id          bigserial primary key,
    task        text        not null,
    args        jsonb       not null,
    status      smallint    not null default 0,
    enqueued_at timestamptz not null default now(),
    started_at  timestamptz,
    finished_at timestamptz
);
create index raw_shape_todo_idx on raw_shape (id) where status = 0;
"""
RAW_LOAD = ("insert into raw_shape (task, args) select 'bench.noop', jsonb_build_object('i', i)"
            " from generate_series(1, %s) i")
RAW_CLAIM = """
update raw_shape set status = 1, started_at = clock_timestamp()
 where id in (select id from raw_shape where status = 0
               order by id limit %s for update skip locked)
returning id, task, args
"""
RAW_ACK = ("update raw_shape set status = 2, finished_at = clock_timestamp()"
           " where id = any(%s)")
X_CLAIM = """
update only x_jobs set state = 'running', attempt = attempt + 1,
       lease_token = gen_random_uuid(), visible_at = now() + interval '60 seconds',
       claimed_by = 'profile', started_at = now(), updated_at = now()
 where id in (select id from only x_jobs
               where queue = 'default' and state in ('ready', 'delayed', 'suspended')
                 and run_at <= now()
               order by priority desc, run_at limit %s for update skip locked)
returning id, lease_token, name, input
"""
X_ACK = ("update only x_jobs set state = 'done', finished_at = now(), lease_token = null,"
         " updated_at = now() where id = any(%s)")


def _shape(n: int, *, indexes: bool, rounds: int = 3
           ) -> dict[str, tuple[float, float, float, float]]:
    """Per lane, µs per job of the claims' and the acknowledgements' round trips, and WAL
    bytes per job of each (medians of ``rounds`` alternated drains of ``n`` jobs). With
    ``indexes``, the x_jobs statements also run on copies of x_jobs (its columns, defaults,
    checks and indexes, not its triggers) that each lack one index, beside a copy with all."""
    import psycopg
    from django.db import connection

    from django_xjobs.engines import get_engine
    from django_xjobs.records import Completion

    engine = get_engine()
    engine.session_label("xjobs:profile")
    db = connection.settings_dict
    # The lanes' plain statements on a connection of their own, as the raw reference's worker
    # has (psycopg's defaults: a statement is prepared from its fifth execution).
    raw = psycopg.connect(dbname=db["NAME"], user=db["USER"] or None,
                          host=db["HOST"] or None, port=db["PORT"] or None,
                          password=db["PASSWORD"] or None, autocommit=True)

    def wal() -> int:
        row = raw.execute("select pg_current_wal_insert_lsn() - '0/0'").fetchone()
        assert row is not None
        return int(row[0])

    def drain(claim, ack) -> tuple[float, float, float, float]:
        times, wals, done = [0.0, 0.0], [0, 0], 0
        while True:  # the WAL position is read outside the timed intervals
            w0 = wal()
            t0 = time.perf_counter()
            claimed = claim()
            t1 = time.perf_counter()
            w1 = wal()
            if not claimed:
                break
            t2 = time.perf_counter()
            ack(claimed)
            t3 = time.perf_counter()
            w2 = wal()
            times[0], times[1] = times[0] + t1 - t0, times[1] + t3 - t2
            wals[0], wals[1] = wals[0] + w1 - w0, wals[1] + w2 - w1
            done += len(claimed)
        if done != n:
            raise SystemExit(f"a shape lane finished {done} of {n} jobs")
        return (times[0] / n * 1e6, times[1] / n * 1e6, wals[0] / n, wals[1] / n)

    def raw_lane(claim_sql: str, ack_sql: str):
        def claim():
            rows = raw.execute(claim_sql, [500]).fetchall()
            return rows

        def ack(rows):
            raw.execute(ack_sql, [[r[0] for r in rows]])
        return claim, ack

    def load_raw() -> None:
        raw.execute(RAW_TABLE)
        raw.execute(RAW_LOAD, [n])
        raw.execute("analyze raw_shape")

    def engine_lane():
        def claim():
            return engine.jobs_claim(wants={"default": 500}, worker_id="profile",
                                     lease_ms=60_000)

        def ack(claimed):
            engine.jobs_complete_if_owned([Completion(claim=j.claim, result_json=None)
                                           for j in claimed])
        return claim, ack

    definitions: dict[str, str] = dict(raw.execute(
        "select indexname, indexdef from pg_indexes where tablename = 'x_jobs'").fetchall())
    copies: list[str] = []

    def copy_lane(*skip: str):
        """The x_jobs statements on a copy of x_jobs without the indexes ``skip``."""
        table = f"x_shape_{len(copies)}"
        copies.append(table)

        def load() -> None:
            _load(n)
            raw.execute(f"drop table if exists {table}")
            raw.execute(f"create table {table} (like x_jobs including defaults"
                        " including constraints)")
            raw.execute(f"insert into {table} select * from only x_jobs")
            for name, definition in definitions.items():
                if name not in skip:
                    raw.execute(definition.replace(" ON public.x_jobs ", f" ON {table} ")
                                .replace(f"INDEX {name} ", f"INDEX {table}_{name} "))
            raw.execute(f"analyze {table}")
            raw.execute("truncate x_jobs")
        return load, raw_lane(X_CLAIM.replace("x_jobs", table), X_ACK.replace("x_jobs", table))

    lanes = {
        "the raw reference's statements on its own table": (load_raw, raw_lane(RAW_CLAIM,
                                                                               RAW_ACK)),
        "the same statements written for x_jobs": (lambda: _load(n), raw_lane(X_CLAIM, X_ACK)),
        "this package's claim and acknowledgement": (lambda: _load(n), engine_lane()),
    }
    if indexes:
        kept = ("x_jobs_pkey", "x_jobs_claim_idx")
        others = sorted(name for name in definitions if name not in kept)
        lanes["the x_jobs statements, a copy of x_jobs with all its indexes"] = copy_lane()
        lanes["  ... with only the primary key and the claim's index"] = copy_lane(*others)
        for name in others:
            lanes[f"  ... without {name}"] = copy_lane(name)
    results: dict[str, list[tuple[float, float, float, float]]] = {k: [] for k in lanes}
    try:
        for _ in range(rounds):
            for label, (load, (claim, ack)) in lanes.items():
                load()
                results[label].append(drain(claim, ack))
    finally:
        for table in ("raw_shape", *copies):
            raw.execute(f"drop table if exists {table}")
        raw.close()

    def median(runs: list[tuple[float, float, float, float]]
               ) -> tuple[float, float, float, float]:
        claim_us, ack_us, claim_wal, ack_wal = (statistics.median(column)
                                                for column in zip(*runs, strict=True))
        return claim_us, ack_us, claim_wal, ack_wal

    return {label: median(runs) for label, runs in results.items()}


ENQUEUER = """
import sys, time
import django
django.setup()
from xbench_project.benchjobs import jobs
jobs.lat.enqueue(i=-1, t=time.time())  # connection open, statement prepared
start = time.monotonic() + 0.05
for i in range({n}):
    delay = start + i / 50 - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    jobs.lat.enqueue(i=i, t=time.time())
"""


def _latency(n: int) -> dict[str, list[float]]:
    """W4's path, cut at the worker's steps: ``n`` jobs enqueued at 50/s by another process,
    one idle worker here (LISTEN on); the wall clock at the NOTIFY's wake-up, the claim's
    start and end, and the executor's call (``executor.execute``), for each job, before the
    job's first line writes its own time (bench/xbench_project/benchjobs/jobs.py, ``lat``)."""
    import bisect
    import subprocess
    import tempfile

    from django.db import connection

    from django_xjobs.worker import executor, flow, loop, options

    with connection.cursor() as cur:
        cur.execute("truncate x_jobs, x_stat_deltas")
    marks: dict[str, list[float]] = {"notify": [], "claim": [], "claimed": [], "execute": []}
    notify, claim, execute = loop.Worker.notify, flow.Flow.claim, executor.execute

    def notify_marked(self: Any) -> None:
        marks["notify"].append(time.time())
        notify(self)

    def claim_marked(self: Any, *args: Any) -> Any:
        marks["claim"].append(time.time())
        try:
            return claim(self, *args)
        finally:
            marks["claimed"].append(time.time())

    def execute_marked(*args: Any, **kwargs: Any) -> Any:
        marks["execute"].append(time.time())
        return execute(*args, **kwargs)

    loop.Worker.notify = notify_marked  # type: ignore[method-assign]
    flow.Flow.claim = claim_marked  # type: ignore[method-assign]
    executor.execute = execute_marked
    with tempfile.TemporaryDirectory() as lat_dir:
        os.environ["XJOBS_BENCH_LAT_DIR"] = lat_dir
        worker = loop.Worker(options.WorkerOptions.from_settings(install_signals=False, duties=()))
        thread = threading.Thread(target=worker.run, name="profile-worker")
        thread.start()
        worker.started.wait(30)
        time.sleep(1)
        try:
            subprocess.run([sys.executable, "-c", ENQUEUER.format(n=n)], check=True,
                           env=dict(os.environ), cwd=HERE)
            time.sleep(0.5)
        finally:
            worker.stop()
            thread.join()
            loop.Worker.notify, flow.Flow.claim = notify, claim  # type: ignore[method-assign]
            executor.execute = execute
        starts = [tuple(map(float, line.split()[1:])) for f in Path(lat_dir).iterdir()
                  for line in f.read_text().splitlines() if not line.startswith("-")]

    def last_before(name: str, t: float) -> float:
        values = marks[name]
        return values[bisect.bisect_right(values, t) - 1]

    steps: dict[str, list[float]] = {
        "enqueue -> the worker's wake-up (commit, NOTIFY, LISTEN thread)": [],
        "wake-up -> claim sent (the loop's round)": [],
        "the claim (one statement)": [],
        "claimed -> the executor's call (runs built, hand-off)": [],
        "the executor's call -> the job's first line": [],
        "enqueue -> the job's first line": [],
    }
    for marks_list in marks.values():
        marks_list.sort()
    for enqueued, first_line in starts:
        try:
            woke, sent = last_before("notify", first_line), last_before("claim", first_line)
            got, called = last_before("claimed", first_line), last_before("execute", first_line)
        except IndexError:
            continue
        if not enqueued <= woke <= sent <= got <= called <= first_line:
            continue  # picked up by a poll or an earlier claim: not this path
        for label, ms in zip(steps, (woke - enqueued, sent - woke, got - sent, called - got,
                                     first_line - called, first_line - enqueued), strict=True):
            steps[label].append(ms * 1000)
    return steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--concurrency", type=int, default=10)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--profile", metavar="OUT", help="write a cProfile of one drain here")
    p.add_argument("--latency", type=int, default=300, metavar="N",
                   help="jobs of the enqueue -> first line breakdown (0: skip it)")
    p.add_argument("--shape", action="store_true",
                   help="also time the raw reference's statements on its table and on x_jobs")
    p.add_argument("--shape-indexes", action="store_true",
                   help="--shape, and on copies of x_jobs each without one of its indexes")
    p.add_argument("--source", metavar="DIR",
                   help="measure the django_xjobs package of another checkout (as bench/run.py)")
    args = p.parse_args()
    _setup(args)
    drains = [_drain(args.jobs) for _ in range(args.repeat)]
    wall = statistics.median(d[0] for d in drains)
    cpu = statistics.median(d[1] for d in drains)
    server = statistics.median(d[2] for d in drains)
    print(f"\none worker, concurrency {args.concurrency}, {args.jobs:,} no-op jobs, "
          f"median of {args.repeat}")
    print(f"  drain: {wall:6.1f} µs wall per job ({1e6 / wall:,.0f} jobs/s), "
          f"{cpu:6.1f} µs CPU per job in the worker process (every thread), "
          f"{server:6.1f} µs in the server's backends")
    print("  the worker's CPU by thread (µs per job):")
    for role in drains[0][3]:
        print(f"    {statistics.median(d[3].get(role, 0.0) for d in drains):6.2f}  {role}")
    parts = _parts(args.jobs)
    print("  the parts, each alone in one thread (µs per job):")
    for label, us in parts.items():
        print(f"    {us:6.2f}  {label}")
    client = sum(v for k, v in parts.items()
                 if "round trip" not in k and not k.startswith(" "))
    print(f"    {client:6.2f}  the worker's CPU of the parts above (all but the round trips)")
    if args.shape or args.shape_indexes:
        shape = _shape(args.jobs, indexes=args.shape_indexes, rounds=args.repeat)
        print(f"  the table's shape, {args.jobs:,} jobs claimed and acknowledged in batches of "
              "500 on one connection (µs per job: claim / ack round trip; WAL bytes per job: "
              f"claim / ack; medians of {args.repeat} alternated):")
        for label, (claim_us, ack_us, claim_wal, ack_wal) in shape.items():
            print(f"    {claim_us:6.2f} / {ack_us:6.2f} µs   {claim_wal:5.0f} / {ack_wal:5.0f} B"
                  f"   {label}")
    if args.latency:
        from run import percentile  # imported by _setup, after its --source is on sys.path

        steps = _latency(args.latency)
        n = len(steps["enqueue -> the job's first line"])
        print(f"  enqueue -> the job's first line, one idle worker, {n} of {args.latency} jobs at "
              "50/s through NOTIFY (ms, p50 / p90):")
        for label, values in steps.items():
            if values:
                print(f"    {percentile(values, 50):6.2f} / {percentile(values, 90):6.2f}  {label}")
    if args.profile:
        prof = cProfile.Profile()
        _drain(args.jobs, prof)
        prof.dump_stats(args.profile)
        print(f"  cProfile of one drain written to {args.profile}")


if __name__ == "__main__":
    main()
