"""A drain over three shards beside the same drain on one database (``make bench-sharded``).

    python bench/sharded_drain.py [--jobs 30000] [--processes 3] [--seconds 0]

Starts three PostgreSQL clusters of its own (the tests' helper, tests/private_cluster.py:
``initdb`` under a temporary directory, free ports, fsync on; needs PostgreSQL's server
binaries), migrated with the tests' settings, and runs two drains of ``--jobs`` jobs
(``testapp.noop``, or for ``--seconds`` > 0 ``testapp.nap``, which only sleeps) with real
``xjobs_worker --burst`` processes:

* **one database**: every job on the first cluster, ``--processes`` worker processes on it;
* **three shards**: the same jobs spread over the three clusters by tenant
  (``XJOBS["SHARDS"]``, ``XJOBS["TENANT_SHARDS"]``), one ``xjobs_worker --burst`` with no
  ``--shard``, which runs a process per shard: the same number of worker processes in all.

Each drain is timed from the first job started to the last finished (read from the rows, the
finished jobs kept in ``x_jobs``: ``ARCHIVE_AFTER`` None), and the WAL each server wrote during
it is read from ``pg_current_wal_lsn()``. Enqueueing is outside the timing (one
``enqueue_many`` per drain). On one machine the shards share its cores: the comparison shows
what sharding costs or saves in the queue's own work (one claim and WAL stream per database,
smaller indexes, no contention between the shards' claims), not what three servers would do.
Figures depend on the machine; nothing here is a test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT)]

from tests.private_cluster import (  # noqa: E402
    PrivateCluster,
    _as_postgres,
    env_for,
    find_bindir,
    run_child,
    scratch_dir,
    start_primaries,
)

ALIASES = ("default", "shard_b", "shard_c")
TENANTS = {"t_b": "shard_b", "t_c": "shard_c"}  # tenant None lives on "default"


def settings(sharded: bool) -> dict:
    base = {"ARCHIVE_AFTER": None, "LEASE": "60s", "HEARTBEAT": "5s", "POLL_INTERVAL": "0.2s"}
    if sharded:
        base.update(SHARDS=list(ALIASES), TENANT_SHARDS=TENANTS)
    return base


def env(shards: list[PrivateCluster], sharded: bool) -> dict[str, str]:
    found = env_for(shards[0], dict(zip(ALIASES[1:], shards[1:], strict=True)),
                    xjobs=settings(sharded))
    found["XJOBS_TEST_ROUTERS"] = "1"
    return found


def enqueue(shards: list[PrivateCluster], jobs: int, seconds: float, sharded: bool) -> None:
    tenants = [None, "t_b", "t_c"] if sharded else [None]
    name = "testapp.nap" if seconds else "testapp.noop"
    payload = {"ms": seconds * 1000} if seconds else {}
    run_child(f"""
from django_xjobs import enqueue_many
tenants = {tenants!r}
items = [({name!r}, {payload!r}, {{"tenant_id": tenants[n % len(tenants)]}})
         for n in range({jobs})]
for start in range(0, len(items), 10000):
    enqueue_many(items[start:start + 10000])
""", env(shards, sharded), timeout=600)


def drain(shards: list[PrivateCluster], processes: int, sharded: bool) -> None:
    args = [sys.executable, "-m", "django", "xjobs_worker", "--burst", "--no-scheduler"]
    if not sharded and processes > 1:
        args += ["--processes", str(processes)]
    full = {**os.environ, **env(shards, sharded)}
    done = subprocess.run(args, cwd=ROOT, env=full, capture_output=True, text=True,
                          timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"the drain failed:\n{done.stderr[-3000:]}")


def window(shard: PrivateCluster) -> tuple[float, float, int] | None:
    """(first started, last finished, jobs done) of the shard's rows, epoch seconds."""
    (first, last, count), = shard.sql(
        "select extract(epoch from min(started_at)), extract(epoch from max(finished_at)),"
        " count(*) from x_jobs where state = 'done'")
    return (float(first), float(last), int(count)) if count else None


def wal(shard: PrivateCluster) -> int:
    return int(shard.sql("select pg_current_wal_lsn() - '0/0'::pg_lsn")[0][0])


def run_one(shards: list[PrivateCluster], jobs: int, processes: int, seconds: float,
            sharded: bool) -> dict:
    for shard in shards:
        shard.sql("truncate x_jobs, x_job_steps, x_stat_deltas, x_stats")
    enqueue(shards, jobs, seconds, sharded)
    for shard in shards:
        shard.sql("checkpoint")
    wal_before = [wal(s) for s in shards]
    drain(shards, processes, sharded)
    windows = [window(s) for s in shards]
    wal_bytes = [wal(s) - before for s, before in zip(shards, wal_before, strict=True)]
    used = [w for w in windows if w is not None]
    total = sum(w[2] for w in used)
    if total != jobs:
        raise SystemExit(f"{total} of {jobs} jobs done")
    elapsed = max(w[1] for w in used) - min(w[0] for w in used)
    return {"jobs": total, "seconds": elapsed, "rate": total / elapsed,
            "per_shard": [(a, w[2], w[2] / (w[1] - w[0]) if w[1] > w[0] else 0.0)
                          for a, w in zip(ALIASES, windows, strict=True) if w is not None],
            "wal_per_job": sum(wal_bytes) / total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--jobs", type=int, default=30000)
    parser.add_argument("--processes", type=int, default=3,
                        help="worker processes on the one database (the shards get one each)")
    parser.add_argument("--seconds", type=float, default=0.0,
                        help="each job sleeps this long (0: a no-op job)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    bindir, why = find_bindir()
    prefix, why_not = _as_postgres()
    if bindir is None or why_not:
        raise SystemExit(why or why_not)
    started = time.monotonic()
    shards = start_primaries(bindir, prefix, 3, where=scratch_dir())
    try:
        one = run_one(shards, args.jobs, args.processes, args.seconds, sharded=False)
        three = run_one(shards, args.jobs, args.processes, args.seconds, sharded=True)
    finally:
        for shard in shards:
            shard.destroy()
    if args.json:
        print(json.dumps({"one": one, "three": three}))
        return
    kind = f"{args.seconds * 1000:g} ms jobs" if args.seconds else "no-op jobs"
    print(f"\n{args.jobs:,} {kind}, {args.processes} worker processes in all "
          f"(set-up and both drains {time.monotonic() - started:.0f} s)\n")
    print("| layout | jobs/s | drain | WAL per job |")
    print("|---|---:|---:|---:|")
    for label, r in (("one database", one), ("three shards", three)):
        print(f"| {label} | {r['rate']:,.0f} | {r['seconds']:.1f} s | "
              f"{r['wal_per_job']:,.0f} B |")
    print()
    for alias, count, rate in three["per_shard"]:
        print(f"  shard {alias}: {count:,} jobs, {rate:,.0f} jobs/s on its own")
    print(f"\nthree shards / one database: {three['rate'] / one['rate']:.2f}x")


if __name__ == "__main__":
    main()
