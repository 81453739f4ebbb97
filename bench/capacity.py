"""How far one PostgreSQL database goes for this job queue (``make bench-capacity``).

    python bench/capacity.py [--noop-jobs 20000] [--sleep-jobs 5000] [--sleep-ms 10]
                             [--single 2000] [--idle-seconds 25] [--steps-jobs 1000]
                             [--concurrency 10] [--prefetch auto]

A capacity model needs what one job costs the database, not only how fast a drain goes: the
rate says how far this machine went; the costs per job say which resource of another machine
runs out first. So, against one fresh database (``xjobs_bench``, as ``make bench``), in ONE run:

* four drains by real ``xjobs_worker`` processes (bench/run.py's ``spawn_workers``): no-op jobs
  and jobs that sleep ``--sleep-ms`` (10 ms), each with 1 and with 2 worker processes at the
  given concurrency (threads per process, 10 by default). Each drain is enqueued with
  ``enqueue_many`` (1,000 a call), the table analysed and a checkpoint taken (as W3 does), the
  workers spawned; its rate is steady (first ``started_at`` -> last ``finished_at``, W3's
  "steady") and spawn -> last finish. The workers keep finished jobs in ``x_jobs``
  (``ARCHIVE_AFTER: None``), and the archive pass that a worker's maintenance runs every
  second runs afterwards in this process (``pruner.archive``, ``ARCHIVE_AFTER`` 0), so each job's
  life falls into three windows measured apart: enqueue, drain (claim, run, acknowledge),
  archive (into the history tables);
* for each window, per job: WAL bytes (``pg_current_wal_lsn()`` difference, server-wide; and
  the records of this database alone, with their full-page images, read back through
  ``pg_walinspect`` where it is available: the difference also holds what other databases of
  the server wrote meanwhile); WAL writes and fsyncs (``pg_stat_wal``, server-wide: it has no
  per-database figure); transactions committed by this database (``pg_stat_database``, less the
  bench's own statements) and commit records in the WAL (transactions that wrote); rows
  inserted, updated (of them HOT) and deleted in the ``x_`` tables, and the dead row versions
  they leave (``pg_stat_user_tables``, read once the workers' backends are gone, which is
  when their statistics are flushed), and whether autovacuum visited them;
* during each drain: the CPU time of the worker processes, of this database's backends and of
  the server's own processes (walwriter, checkpointer ...; /proc), and the machine's busy time:
  on a machine where PostgreSQL shares the cores with the workers, which of them ran out;
* a single enqueue per transaction (``noop.enqueue``, as W1), with the same costs: it waits for
  its commit's WAL flush, the cost the batched enqueue shares among a thousand jobs;
* connections: ``pg_stat_activity`` rows of this database by ``application_name``
  (``xjobs:<worker id>:<role>``), sampled while each drain runs, while 2 workers idle for
  ``--idle-seconds`` (the heartbeat's connection opens at its first round with leases to renew
  or the worker's liveness row to refresh, ``WORKER_SEEN_INTERVAL``, 10 s), and while
  they drain ``--steps-jobs`` three-step jobs, whose steps run on the executor thread's own
  connection, as any job's statements do. Every connection of the bench database but this
  process's own is a worker's; those without an ``xjobs:`` name are counted apart.

Server-wide figures (the LSN difference, ``pg_stat_wal``, machine CPU) include whatever else
the server and the machine did meanwhile; the table prints what other databases committed and
wrote in each window, so a figure taken beside someone's test run can be told apart.

Prints markdown tables. Nothing here is a test; nothing asserts a time.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from run import Bench, compile_sources, setup_database  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
CORES = os.cpu_count() or 1
KEEP = {"XJOBS_BENCH_KEEP_HISTORY": "1"}  # the workers leave the archive to this process
STATS_SETTLE = 1.0  # seconds for the server's own processes to report their statistics

TABLE_STATS = r"""
select relname::text, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del, n_dead_tup,
       autovacuum_count + autoanalyze_count
  from pg_stat_user_tables where relname like 'x\_%'
"""

SERVER_STATS = """
select pg_current_wal_lsn()::text, w.wal_records, w.wal_fpi, w.wal_bytes, w.wal_write,
       w.wal_sync, d.xact_commit,
       (select coalesce(sum(xact_commit), 0) from pg_stat_database o
         where o.datname is distinct from current_database()),
       (select coalesce(sum(tup_inserted + tup_updated + tup_deleted), 0) from pg_stat_database o
         where o.datname is distinct from current_database())
  from pg_stat_wal w, pg_stat_database d where d.datname = current_database()
"""

# Each WAL record of the window, as this database's (a block of one of its relations, or the
# transaction id of a record that had one: its commit), another database's, or the server's
# own (checkpoints, running-transactions snapshots).
WAL_SPLIT = r"""
with r as (
    select xid::text::bigint as xid, record_length, fpi_length, resource_manager, record_type,
           (regexp_match(block_ref, 'rel \d+/(\d+)/'))[1]::oid as db
      from pg_get_wal_records_info(%(start)s::pg_lsn, %(end)s::pg_lsn)),
ours as (select distinct xid from r where db = %(db)s and xid <> 0),
k as (select r.*, case when r.db = %(db)s or r.xid in (select xid from ours) then 'ours'
                       when r.db <> 0 or r.xid <> 0 then 'other'
                       else 'server' end as who
        from r)
select who, sum(record_length)::bigint, sum(fpi_length)::bigint,
       count(*) filter (where resource_manager = 'Transaction' and record_type like 'COMMIT%%')
  from k group by who
"""


@dataclass
class Snapshot:
    lsn: str
    wal_records: int
    wal_fpi: int
    wal_bytes: int
    wal_write: int
    wal_sync: int
    commits: int
    other_commits: int
    other_rows: int
    tables: dict[str, tuple[int, ...]]
    statements: int  # the bench's own statements before this snapshot


@dataclass
class Window:
    """What one window (enqueue, drain, archive) cost, for ``n`` jobs."""

    n: int
    seconds: float
    lsn_bytes: int
    wal: dict[str, tuple[int, int, int]] | None  # who -> (bytes, FPI bytes, commit records)
    wal_records: int
    wal_fpi: int
    wal_write: int
    wal_sync: int
    commits: int  # this database's, less the bench's own statements
    other_commits: int
    other_rows: int
    rows: dict[str, tuple[int, int, int, int]]  # table -> inserted, updated, HOT, deleted
    dead: dict[str, int]  # table -> dead row versions at the window's end
    autovacuum: int  # autovacuum and autoanalyze runs on the x_ tables in the window

    def per_job(self, value: float) -> float:
        return value / self.n

    def total_rows(self) -> tuple[int, int, int, int]:
        ins, upd, hot, dele = zip(*self.rows.values(), strict=True) if self.rows else ((0,),) * 4
        return sum(ins), sum(upd), sum(hot), sum(dele)


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process so far (None: gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / TICK


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the machine since boot, every core."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    idle = values[3] + values[4]  # idle, iowait
    return (sum(values) - idle) / TICK, sum(values) / TICK


def postgres_cpu() -> dict[int, float]:
    """CPU seconds of every PostgreSQL process of the machine, by pid."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() != "postgres":
                    continue
            except OSError:
                continue
            seconds = cpu_seconds(int(entry.name))
            if seconds is not None:
                found[int(entry.name)] = seconds
    return found


def role_of(name: str) -> tuple[str | None, str]:
    """(worker id, role) of an application_name ``xjobs:<worker id>:<role>``; (None, name) for a
    connection that has no such name."""
    parts = name.split(":")
    if len(parts) >= 3 and parts[0] == "xjobs":
        return ":".join(parts[1:-1]), parts[-1]
    return None, name


class Connections:
    """Samples of pg_stat_activity for the bench database (every connection but this
    process's own is a worker's): the most seen at once, in all, per worker and per role, and
    of those without an ``xjobs:`` application_name."""

    def __init__(self) -> None:
        self.per_worker: dict[str, int] = {}
        self.per_role: dict[tuple[str, str], int] = {}
        self.unnamed = 0
        self.total = 0
        self.samples = 0

    def add(self, rows: list[tuple[str, int]]) -> None:
        self.samples += 1
        workers: dict[str, int] = {}
        unnamed = 0
        for name, count in rows:
            worker, role = role_of(name)
            if worker is None:
                unnamed += count
                continue
            workers[worker] = workers.get(worker, 0) + count
            key = (worker, role)
            self.per_role[key] = max(self.per_role.get(key, 0), count)
        for worker, count in workers.items():
            self.per_worker[worker] = max(self.per_worker.get(worker, 0), count)
        self.unnamed = max(self.unnamed, unnamed)
        self.total = max(self.total, sum(count for _, count in rows))

    def describe(self) -> str:
        parts = []
        for worker in sorted(self.per_worker):
            roles = ", ".join(f"{role}{f' x{c}' if c > 1 else ''}"
                              for (w, role), c in sorted(self.per_role.items()) if w == worker)
            parts.append(f"{worker}: {self.per_worker[worker]} ({roles})")
        if self.unnamed:
            parts.append(f"without an xjobs: name: {self.unnamed}")
        return "; ".join([*parts, f"all at once: {self.total}"])


class Capacity(Bench):
    ACTIVITY = """
        select coalesce(nullif(application_name, ''), backend_type), count(*)
          from pg_stat_activity
         where datname = current_database() and pid <> pg_backend_pid() group by 1
    """

    def __init__(self, url: str, args: argparse.Namespace) -> None:
        self.statements = 0
        super().__init__(url, args)
        self.db_oid = self.sql("select oid::bigint from pg_database"
                               " where datname = current_database()")[0][0]
        try:
            self.sql("create extension if not exists pg_walinspect")
            self.walinspect = True
        except Exception as exc:  # not installed, or not a superuser: the LSN difference only
            print(f"capacity: no pg_walinspect ({exc}); WAL by database not measured",
                  file=sys.stderr)
            self.walinspect = False

    def sql(self, statement: str, params: dict | None = None) -> list[tuple]:
        self.statements += 1
        with self.connection.cursor() as cur:
            cur.execute(statement, params)
            return cur.fetchall() if cur.description else []

    # ------------------------------------------------------------------ measuring --
    def snapshot(self) -> Snapshot:
        self.sql("select pg_stat_force_next_flush()")  # this session's counts, at its next idle
        time.sleep(STATS_SETTLE)
        self.sql("select pg_stat_clear_snapshot()")
        statements = self.statements
        server = self.sql(SERVER_STATS)[0]
        tables = {name: tuple(rest) for name, *rest in self.sql(TABLE_STATS)}
        return Snapshot(*server, tables=tables, statements=statements)

    def window(self, a: Snapshot, b: Snapshot, n: int, seconds: float) -> Window:
        [(lsn_bytes,)] = self.sql("select pg_wal_lsn_diff(%(b)s, %(a)s)::bigint",
                                  {"a": a.lsn, "b": b.lsn})
        rows, dead, autovacuum = {}, {}, 0
        for name, after in b.tables.items():
            before = a.tables.get(name, (0,) * len(after))
            delta = tuple(x - y for x, y in zip(after, before, strict=True))
            if any(delta[:4]):
                rows[name] = delta[:4]
            if after[4]:
                dead[name] = after[4]
            autovacuum += delta[5]
        return Window(
            n=n, seconds=seconds, lsn_bytes=lsn_bytes, wal=self.wal_split(a.lsn, b.lsn),
            wal_records=b.wal_records - a.wal_records, wal_fpi=b.wal_fpi - a.wal_fpi,
            wal_write=b.wal_write - a.wal_write, wal_sync=b.wal_sync - a.wal_sync,
            commits=b.commits - a.commits - (b.statements - a.statements),
            other_commits=b.other_commits - a.other_commits,
            other_rows=b.other_rows - a.other_rows, rows=rows, dead=dead,
            autovacuum=autovacuum)

    def wal_split(self, start: str, end: str) -> dict[str, tuple[int, int, int]] | None:
        """WAL of the window by whom it was written, read back with pg_walinspect (None when
        it is not there, or the window's WAL was already recycled by a checkpoint)."""
        if not self.walinspect:
            return None
        deadline = time.monotonic() + 10
        while not self.sql("select pg_current_wal_flush_lsn() >= %(end)s::pg_lsn",
                           {"end": end})[0][0]:
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)
        try:
            rows = self.sql(WAL_SPLIT, {"start": start, "end": end, "db": self.db_oid})
        except Exception as exc:
            print(f"capacity: WAL {start}..{end} not readable: {exc}", file=sys.stderr)
            return None
        return {who: (size or 0, fpi or 0, commits) for who, size, fpi, commits in rows}

    def wait_backends_gone(self) -> None:
        """Until the workers' backends have exited: each flushes its statistics as it does."""
        deadline = time.monotonic() + 30
        while self.sql("select count(*) from pg_stat_activity where datname = current_database()"
                       " and pid <> pg_backend_pid()")[0][0]:
            if time.monotonic() > deadline:
                raise RuntimeError("the workers' backends did not exit in 30 s")
            time.sleep(0.05)

    # ------------------------------------------------------------------- windows --
    def enqueue_batched(self, items: list[tuple]) -> tuple[Window, float]:
        from django_xjobs import enqueue_many

        a = self.snapshot()
        t0 = time.perf_counter()
        for start in range(0, len(items), 1000):
            enqueue_many(items[start:start + 1000])
        seconds = time.perf_counter() - t0
        return self.window(a, self.snapshot(), len(items), seconds), len(items) / seconds

    def enqueue_single(self, n: int) -> tuple[Window, float]:
        self.reset()
        noop = self.jobs.noop
        noop.enqueue(i=-1)  # connection open, statement prepared
        a = self.snapshot()
        t0 = time.perf_counter()
        for i in range(n):
            noop.enqueue(i=i)
        seconds = time.perf_counter() - t0
        return self.window(a, self.snapshot(), n, seconds), n / seconds

    def drain(self, n: int, workers: int) -> dict:
        """Spawn ``workers`` processes on the ``n`` queued jobs; wait until every one is done.
        CPU is counted from the first job done (the workers' start-up left out) to the last,
        read before the workers are stopped."""
        conns = Connections()
        t0 = time.time()
        procs = self.spawn_workers(workers, extra_env=KEEP)
        cpu0: dict | None = None
        deadline = time.monotonic() + 600
        while True:
            [(left, done)] = self.sql("select count(*) filter (where state <> 'done'),"
                                      " count(*) filter (where state = 'done') from x_jobs")
            if cpu0 is None and done:
                cpu0 = self.cpu(procs)
            if not left:
                break
            if time.monotonic() > deadline:
                self.stop_workers(procs)
                raise RuntimeError(f"the drain of {n:,} jobs did not finish in 600 s")
            self.check_alive(procs, "drain")
            conns.add(self.sql(self.ACTIVITY))
            time.sleep(0.05)
        cpu1 = self.cpu(procs)
        elapsed = time.time() - t0
        kinds = dict(self.sql("select pid, case when datname = current_database() then 'ours'"
                              " when datname is null then 'server' else 'other' end"
                              " from pg_stat_activity"))
        peak = self.stop_workers(procs)
        self.wait_backends_gone()
        first, last, done = self.sql(
            "select extract(epoch from min(started_at)), extract(epoch from max(finished_at)),"
            " count(*) from x_jobs where state = 'done'")[0]
        assert done == n, f"only {done} of {n} jobs done"
        assert cpu0 is not None
        span = cpu1["wall"] - cpu0["wall"]
        pg = {"ours": 0.0, "server": 0.0, "other": 0.0}
        for pid, seconds in cpu1["postgres"].items():
            kind = kinds.get(pid, "server")  # the postmaster is not in pg_stat_activity
            pg[kind] += seconds - cpu0["postgres"].get(pid, 0.0)
        cpu = {"busy": cpu1["machine"] - cpu0["machine"], "workers": cpu1["workers"]
               - cpu0["workers"], "bench": cpu1["bench"] - cpu0["bench"], **pg}
        cpu["rest"] = cpu["busy"] - sum(v for k, v in cpu.items() if k != "busy")
        return {
            "steady": n / (float(last) - float(first)), "rate": n / (float(last) - t0),
            "startup": float(first) - t0, "seconds": elapsed, "rss": peak,
            "cpu": {k: v / span for k, v in cpu.items()}, "cpu_span": span,
            "connections": conns, "workers": workers,
        }

    @staticmethod
    def cpu(procs) -> dict:
        """CPU seconds so far: the machine's busy time, the workers', this process's, every
        PostgreSQL process's by pid."""
        return {"wall": time.monotonic(), "machine": machine_cpu()[0],
                "workers": sum(cpu_seconds(p.pid) or 0.0 for p in procs),
                "bench": cpu_seconds(os.getpid()) or 0.0, "postgres": postgres_cpu()}

    def archive(self) -> tuple[int, float]:
        """The maintenance's archive pass over every finished job, in this process."""
        from django_xjobs import conf
        from django_xjobs.maintenance import pruner

        settings = conf.build({**conf.get().raw, "ARCHIVE_AFTER": 0})
        t0 = time.perf_counter()
        moved = pruner.archive(settings=settings)
        return moved, time.perf_counter() - t0

    def scenario(self, name: str, input_of, n: int, workers: int) -> dict:
        self.reset()
        items = [(name, input_of(i)) for i in range(n)]
        enqueue, enqueue_rate = self.enqueue_batched(items)
        self.sql("analyze x_jobs")
        self.sql("checkpoint")
        before = self.snapshot()
        drained = self.drain(n, workers)
        after_drain = self.snapshot()
        drain = self.window(before, after_drain, n, drained["seconds"])
        moved, seconds = self.archive()
        archive = self.window(after_drain, self.snapshot(), n, seconds)
        if moved != n:
            print(f"capacity: the archive moved {moved:,} of {n:,} jobs", file=sys.stderr)
        return {"enqueue": enqueue, "enqueue_rate": enqueue_rate, "drain": drain,
                "archive": archive, "archived": moved, "archive_rate": moved / seconds,
                **drained}

    def connections(self, idle_seconds: float, steps_jobs: int) -> tuple[Connections,
                                                                           Connections]:
        """2 workers idle for ``idle_seconds``, then draining ``steps_jobs`` three-step jobs."""
        from django_xjobs import enqueue_many

        self.reset()
        procs = self.spawn_workers(2, extra_env=KEEP)
        try:
            idle = Connections()
            until = time.monotonic() + idle_seconds
            while time.monotonic() < until:
                self.check_alive(procs, "idle")
                idle.add(self.sql(self.ACTIVITY))
                time.sleep(0.25)
            busy = Connections()
            for start in range(0, steps_jobs, 1000):
                enqueue_many([("bench.three_steps", {"i": i})
                              for i in range(start, min(steps_jobs, start + 1000))])
            deadline = time.monotonic() + 300
            while self.sql("select count(*) from x_jobs where state <> 'done'")[0][0]:
                if time.monotonic() > deadline:
                    raise RuntimeError("the three-step jobs did not finish in 300 s")
                self.check_alive(procs, "three-step drain")
                busy.add(self.sql(self.ACTIVITY))
                time.sleep(0.05)
        finally:
            self.stop_workers(procs)
        self.wait_backends_gone()
        return idle, busy


# ------------------------------------------------------------------------- report --
def n0(x: float) -> str:
    return f"{x:,.0f}"


def n2(x: float) -> str:
    """Two decimals from 1 up, three significant digits below (a per-job share of a batch)."""
    if x == 0:
        return "0"
    return f"{x:,.2f}" if abs(x) >= 1 else f"{x:.3g}"


def wal_cell(w: Window) -> str:
    """LSN difference per job (this database's records; of them full-page images)."""
    cell = n0(w.per_job(w.lsn_bytes))
    if w.wal and "ours" in w.wal:
        size, fpi, _ = w.wal["ours"]
        cell += f" ({n0(w.per_job(size))}; FPI {n0(w.per_job(fpi))})"
    return cell


def life_cell(windows: list[Window]) -> str:
    cell = n0(sum(w.per_job(w.lsn_bytes) for w in windows))
    if all(w.wal and "ours" in w.wal for w in windows):
        cell += f" ({n0(sum(w.per_job(w.wal['ours'][0]) for w in windows))})"
    return cell


def commit_cell(w: Window) -> str:
    cell = n2(w.per_job(w.commits))
    if w.wal and "ours" in w.wal:
        cell += f" ({n2(w.per_job(w.wal['ours'][2]))})"
    return cell


def rows_cell(w: Window) -> str:
    ins, upd, hot, dele = w.total_rows()
    return (f"{n2(w.per_job(ins))} / {n2(w.per_job(upd))} ({n2(w.per_job(hot))}) / "
            f"{n2(w.per_job(dele))}")


def others_cell(windows: list[Window]) -> str:
    commits = sum(w.other_commits for w in windows)
    rows = sum(w.other_rows for w in windows)
    wal = sum(w.wal["other"][0] for w in windows if w.wal and "other" in w.wal)
    return f"{commits:,} commits, {rows:,} rows, {wal:,} WAL bytes"


def print_table(header: list[str], rows: list[list[str]], align: str = "---:") -> None:
    print("| " + " | ".join(header) + " |")
    print("|---" + f"|{align}" * (len(header) - 1) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()


def report(args: argparse.Namespace, server: dict[str, str], runs: list[tuple[str, dict]],
           single: tuple[Window, float] | None, conns: tuple[Connections, Connections] | None,
           started: float, load: tuple[float, float]) -> None:
    print(f"\n## django-xjobs capacity, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC\n")
    print(f"{CORES} CPUs shared by PostgreSQL {server['server_version']}, the workers and this "
          f"process; fsync {server['fsync']}, synchronous_commit {server['synchronous_commit']}, "
          f"full_page_writes {server['full_page_writes']}, wal_compression "
          f"{server['wal_compression']}, autovacuum {server['autovacuum']}, shared_buffers "
          f"{server['shared_buffers']}. Workers: concurrency {args.concurrency} threads, prefetch "
          f"{args.prefetch}. Load average before {load[0]:.2f}, after {load[1]:.2f}; "
          f"{time.monotonic() - started:.0f} s in all.\n")
    header = ["per job (unless said)", *(label for label, _ in runs)]
    col = [r for _, r in runs]
    phases = (("enqueue", "enqueue_many"), ("drain", "drain"), ("archive", "archive"))
    rows = [
        ["drain, steady (first start -> last finish), jobs/s", *(n0(r["steady"]) for r in col)],
        ["drain, spawn -> last finish, jobs/s", *(n0(r["rate"]) for r in col)],
        [f"CPU, first job done -> last, cores busy of {CORES}: the machine",
         *(n2(r["cpu"]["busy"]) for r in col)],
        ["... of it: workers / this database's backends / server processes (walwriter, "
         "checkpointer ...) / other databases' backends / this process / the rest",
         *(" / ".join(n2(r["cpu"][k]) for k in ("workers", "ours", "server", "other", "bench",
                                                  "rest")) for r in col)],
        ["worker peak RSS, MiB", *(str(r["rss"]) for r in col)],
        ["enqueue_many (1,000 a call), jobs/s", *(n0(r["enqueue_rate"]) for r in col)],
        ["archive pass (in one process), jobs/s", *(n0(r["archive_rate"]) for r in col)],
    ]
    for key, label in phases:
        rows.append([f"WAL bytes, {label}: LSN difference (this database's records; of them "
                     "full-page images)", *(wal_cell(r[key]) for r in col)])
    rows.append(["WAL bytes, a job's whole life (the three above): LSN difference (this "
                 "database's records)", *(life_cell([r[k] for k, _ in phases]) for r in col)])
    for key, label in phases:
        rows.append([f"commits, {label} (commit records in the WAL)",
                     *(commit_cell(r[key]) for r in col)])
    for key, label in phases:
        rows.append([f"WAL fsyncs / writes, {label} (server-wide)",
                     *(f"{n2(r[key].per_job(r[key].wal_sync))} / "
                       f"{n2(r[key].per_job(r[key].wal_write))}" for r in col)])
    for key, label in phases:
        rows.append([f"rows inserted / updated (HOT) / deleted, {label}",
                     *(rows_cell(r[key]) for r in col)])
    rows += [
        ["dead row versions left after the drain / after the archive",
         *(f"{n2(r['drain'].per_job(sum(r['drain'].dead.values())))} / "
           f"{n2(r['archive'].per_job(sum(r['archive'].dead.values())))}" for r in col)],
        ["autovacuum / autoanalyze runs on the x_ tables (count, whole scenario)",
         *(str(sum(r[k].autovacuum for k, _ in phases)) for r in col)],
        ["connections of the bench database, most at once during the drain (per worker "
         "process)", *(f"{r['connections'].total} ({r['connections'].total / r['workers']:.1f})"
                       for r in col)],
        ["other databases meanwhile (whole scenario)",
         *(others_cell([r[k] for k, _ in phases]) for r in col)],
    ]
    print_table(header, rows)

    if single:
        w, rate = single
        print(f"Single enqueue, one transaction each ({w.n:,} no-op jobs, one process):\n")
        print_table(["per job", "single enqueue"], [
            ["jobs/s", n0(rate)],
            ["WAL bytes: LSN difference (this database's; FPI)", wal_cell(w)],
            ["commits (commit records in the WAL)", commit_cell(w)],
            ["WAL fsyncs / writes (server-wide)",
             f"{n2(w.per_job(w.wal_sync))} / {n2(w.per_job(w.wal_write))}"],
            ["rows inserted / updated (HOT) / deleted", rows_cell(w)],
            ["other databases meanwhile", others_cell([w])],
        ])

    if conns:
        idle, busy = conns
        print("Connections of the bench database by worker (`application_name` "
              "xjobs:<worker>:<role>), the most seen at once:\n")
        print_table(["2 worker processes", "connections"], [
            [f"idle, {args.idle_seconds:g} s ({idle.samples} samples)", idle.describe()],
            [f"draining {args.steps_jobs:,} three-step jobs ({busy.samples} samples)",
             busy.describe()],
            *([f"draining {label}", r["connections"].describe()] for label, r in runs),
        ], align="---")

    print("Rows per job by table (inserted / updated (HOT) / deleted; dead left at the end):\n")
    detail = []
    for label, r in runs:
        for key, phase in phases:
            w = r[key]
            cells = [f"{t} {n2(w.per_job(i))} / {n2(w.per_job(u))} ({n2(w.per_job(h))}) / "
                     f"{n2(w.per_job(d))}, dead {n2(w.per_job(w.dead.get(t, 0)))}"
                     for t, (i, u, h, d) in sorted(w.rows.items())]
            detail.append([label, phase, "; ".join(cells) or "none"])
    print("| scenario | window | tables |\n|---|---|---|")
    for row in detail:
        print("| " + " | ".join(row) + " |")
    if runs and runs[0][1]["drain"].wal:
        print("\nWAL of other databases and of the server itself, bytes per window: "
              + "; ".join(f"{label} {phase}: other {r[key].wal.get('other', (0,))[0]:,}, "
                          f"server {r[key].wal.get('server', (0,))[0]:,}"
                          for label, r in runs for key, phase in phases if r[key].wal))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--noop-jobs", type=int, default=20_000)
    p.add_argument("--sleep-jobs", type=int, default=5_000)
    p.add_argument("--sleep-ms", type=int, default=10)
    p.add_argument("--single", type=int, default=2_000,
                   help="no-op jobs enqueued one per transaction (0: not measured)")
    p.add_argument("--idle-seconds", type=float, default=25.0,
                   help="how long 2 idle workers' connections are sampled (0: not measured); "
                        "the heartbeat's opens at its first round with something to do")
    p.add_argument("--steps-jobs", type=int, default=1_000,
                   help="three-step jobs drained after the idle sampling")
    p.add_argument("--workers", default="1,2", help="worker processes of each drain")
    p.add_argument("--concurrency", type=int, default=10)
    p.add_argument("--prefetch", default="auto")
    args = p.parse_args()
    args.quick = False
    args.rate_limit = 2000  # the W12 job's limit, which the bench project's settings read
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    print(f"capacity: load average {os.getloadavg()}", file=sys.stderr)
    compile_sources()
    bench = Capacity(setup_database(), args)
    names = ("server_version", "fsync", "synchronous_commit", "full_page_writes",
             "wal_compression", "autovacuum", "shared_buffers")
    server = {name: bench.sql(f"show {name}")[0][0] for name in names}

    single = bench.enqueue_single(args.single) if args.single else None
    runs = []
    kinds = [("no-op", "bench.noop", lambda i: {"i": i}, args.noop_jobs),
             (f"{args.sleep_ms} ms", "bench.sleep_ms",
              lambda i: {"i": i, "ms": args.sleep_ms}, args.sleep_jobs)]
    for label, name, input_of, n in kinds:
        if not n:
            continue
        for workers in (int(w) for w in args.workers.split(",")):
            column = f"{label}, {workers} worker{'s' if workers > 1 else ''}"
            print(f"capacity: {column}, {n:,} jobs", file=sys.stderr)
            result = bench.scenario(name, input_of, n, workers)
            print(f"capacity: {column}: steady {result['steady']:,.0f} jobs/s", file=sys.stderr)
            runs.append((f"{column} ({n:,} jobs)", result))
    conns = bench.connections(args.idle_seconds, args.steps_jobs) if args.idle_seconds else None
    report(args, server, runs, single, conns, started, (load_before, os.getloadavg()[0]))


if __name__ == "__main__":
    main()
