"""PostgreSQL restarted under a running fleet (docs/guarantees.md, "PostgreSQL restarts").

Three worker subprocesses drain ~200 short jobs on a cluster of the test's own
(tests/private_cluster.py: the shared server is never restarted), and the cluster is restarted
with ``pg_ctl restart`` while they run: ``-m immediate`` (a crash: every backend dies at once,
recovery replays the WAL) and ``-m fast`` (a clean shutdown). Afterwards, read from the database:

* the workers reconnected by themselves: the same processes, still running, claim and settle;
* every job ends ``done``; a job has Effect rows of more than one run only if its first run
  started before the restart (it was in flight when the server went away);
* each worker's LISTEN session is back, and a job enqueued to the idle fleet (whose poll
  interval is far beyond the test's waits) is woken by NOTIFY and runs;
* no worker session is left ``idle in transaction``.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import wait_until
from tests.private_cluster import PrivateCluster

from .conftest import FAST, SETTLE, SHORT_LEASE, STARTUP, wait_started, worker_id

pytestmark = pytest.mark.acceptance

JOBS = 200
WORKERS = 3
# A poll interval far beyond every wait of the test: once the fleet is idle, only a NOTIFY
# (or the wake-up a reconnected listener gives) gets a job claimed in time. A real short lease:
# a claim the restart committed but whose answer it lost is rescued after its lease, which
# must lapse by itself within the test.
SETTINGS = {**FAST, **SHORT_LEASE, "POLL_INTERVAL": "120s", "LEADER_LEASE": "1.5s",
            "LEADER_RENEW": "0.5s"}


def enqueue(cluster: PrivateCluster, items: list[tuple[str, dict]]) -> list[str]:
    """Enqueue through the public API, in a child on the cluster's database; the job ids."""
    out = cluster.run(
        "import json, sys\nfrom django_xjobs import enqueue_many\n"
        f"handles = enqueue_many(json.loads({json.dumps(json.dumps(items))}))\n"
        "print(json.dumps([str(h.id) for h in handles]))\n")
    return json.loads(out.strip().splitlines()[-1])


def states(cluster: PrivateCluster, ids: list[str]) -> dict[str, int]:
    rows = cluster.sql("select state, count(*) from x_jobs where id = any(%s::uuid[])"
                       " group by state", [ids])
    return dict(rows)


def sessions(cluster: PrivateCluster, wids: list[str]) -> list[tuple[str, str]]:
    """(application_name, state) of the fleet's backends."""
    return cluster.sql(
        "select application_name, coalesce(state, '') from pg_stat_activity"
        " where datname = current_database() and application_name = any(%s)",
        [[f"xjobs:{w}:{role}" for w in wids for role in
          ("loop", "listen", "heartbeat", "scheduler", "relay", "stats")]])


@pytest.mark.parametrize("mode", ["immediate", "fast"])
def test_workers_ride_out_a_postgres_restart_and_every_job_ends_done(
        cluster, spawn_worker, mode):
    ids = enqueue(cluster, [("testapp.sleepy", {"seconds": 0.1, "tag": str(n)})
                            for n in range(JOBS)])
    env = cluster.worker_env()
    wids = [worker_id(f"w{n}") for n in range(WORKERS)]
    workers = [spawn_worker("--worker-id", wid, "--concurrency", "4", settings=SETTINGS,
                            env=env) for wid in wids]
    for w in workers:
        wait_started(w, timeout=STARTUP)
    pids = {w.pid for w in workers}

    # Mid-flow: some jobs done, some running, most still queued.
    wait_until(lambda: states(cluster, ids).get("done", 0) >= 30, timeout=SETTLE, interval=0.02,
               message="30 jobs done before the restart")
    before = states(cluster, ids)
    assert before.get("done", 0) < JOBS, f"the flow was over before the restart: {before}"
    cluster.restart(mode)
    [(restarted_at,)] = cluster.sql("select pg_postmaster_start_time()")

    def all_done():
        now = states(cluster, ids)
        return now if now.get("done", 0) == JOBS else None

    wait_until(all_done, timeout=60, interval=0.1, message=f"all {JOBS} jobs done")
    assert [w.proc.poll() for w in workers] == [None] * WORKERS, "a worker exited"
    assert {w.pid for w in workers} == pids

    # Done exactly once: settled rows; a second run only for a job in flight at the restart.
    [(unsettled,)] = cluster.sql(
        "select count(*) from x_jobs where id = any(%s::uuid[])"
        " and (finished_at is null or result is null or claimed_by <> all(%s))", [ids, wids])
    assert unsettled == 0
    runs = cluster.sql(
        "select job_id, count(*), min(at) from testapp_effect"
        " where kind = 'start' and job_id = any(%s) group by job_id", [ids])
    assert len(runs) == JOBS, "every job ran"
    rerun_late = [job for job, count, first in runs if count > 1 and first >= restarted_at]
    assert rerun_late == [], "a job that had not started before the restart ran twice"
    [(ran_since,)] = cluster.sql(
        "select count(*) from testapp_effect where job_id = any(%s) and at >= %s", [ids,
                                                                                    restarted_at])
    assert ran_since > 0, "nothing ran after the restart: the restart was not mid-flow"
    foreign = cluster.sql("select distinct pid from testapp_effect where job_id = any(%s)"
                          " and not (pid = any(%s))", [ids, list(pids)])
    assert foreign == [], "every run was in one of the three original worker processes"

    # LISTEN is back on every worker, and NOTIFY wakes the idle fleet.
    listening = wait_until(
        lambda: {n for n, _ in sessions(cluster, wids) if n.endswith(":listen")}
        == {f"xjobs:{w}:listen" for w in wids} or None,
        timeout=SETTLE, interval=0.1, message="every worker's LISTEN session")
    assert listening
    [late] = enqueue(cluster, [("testapp.record", {"tag": "after-restart"})])
    wait_until(lambda: states(cluster, [late]).get("done") == 1, timeout=SETTLE, interval=0.05,
               message="the job enqueued after the restart to be done")
    [(claimed_by, attempt)] = cluster.sql(
        "select claimed_by, attempt from x_jobs where id = %s", [late])
    assert claimed_by in wids and attempt == 1

    # No worker session holds a transaction open.
    wait_until(lambda: not [s for s in sessions(cluster, wids)
                            if s[1].startswith("idle in transaction")],
               timeout=SETTLE, interval=0.1, message="no worker session idle in transaction")
    [(finished,)] = cluster.sql("select finished_at from x_jobs where id = %s", [late])
    [(stuck,)] = cluster.sql(
        "select count(*) from pg_stat_activity where datname = current_database()"
        " and application_name = any(%s) and state like 'idle in transaction%%'"
        " and xact_start < %s", [[f"xjobs:{w}:{r}" for w in wids for r in ("loop", "heartbeat")],
                                 finished])
    assert stuck == 0
