"""``manage.py xjobs_soak``, as a user runs it: a real soak on the test database, its worker
processes killed, stopped and disconnected, with a fixed seed; then its bad inputs.

The checks themselves are shown to catch their violations in tests/unit/test_soak_invariants.py.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from django_xjobs.models import Job, WorkerRow
from tests.acceptance.test_pooler import MODES
from tests.conftest import wait_until

SEED = "20261204"
INVARIANTS = (
    "nothing lost", "everything finished", "one final transition per job",
    "attempts within bounds", "completed steps never re-run", "slots never exceeded",
    "rate limit never exceeded", "one live job per key", "outbox published exactly once",
    "cancels stick", "sessions and processes clean",
)


def soak_tables() -> list[str]:
    with connection.cursor() as cur:
        cur.execute("select relname from pg_class where relname like 'x_soak_%%'")
        return [r[0] for r in cur.fetchall()]


def health_json() -> dict:
    out = StringIO()
    try:
        call_command("xjobs", "health", "--json", stdout=out)
    except SystemExit:
        pass  # exit 1: a verdict other than healthy; the JSON is printed all the same
    return json.loads(out.getvalue())


def test_a_soak_under_chaos_holds_every_invariant_and_cleans_up(spawn_worker, tmp_path):
    # Under a minute: CI's short soak (a fault every two to three seconds, some fifteen), with a
    # transaction held open for all of it; `make soak` runs five minutes.
    soak = spawn_worker("--duration", "35s", "--seed", SEED, "--hold-transaction",
                        "--log-dir", str(tmp_path / "soak"), command="xjobs_soak",
                        new_session=True)
    # While it runs, `xjobs health` names the transaction it holds open (what holds VACUUM
    # back); the soak checks the same through the health panel's reader at the end.
    def held_in_health():
        text = json.dumps(health_json())
        return "xjobs_soak held transaction" in text
    wait_until(held_in_health, timeout=60, interval=1.0,
               message="the held transaction in `xjobs health --json`")
    code = soak.wait(timeout=300)
    log = soak.log()
    assert code == 0, log
    for name in (*INVARIANTS, "health names the long transaction"):
        assert any(line.startswith(f"  ok    {name}") for line in log.splitlines()), (name, log)
    assert f"every invariant held (seed {SEED})" in log
    faults = next(line for line in log.splitlines() if "faults:" in line)
    assert "faults: none" not in faults, log
    # It cleaned up after itself: no job, worker row or table of its own is left.
    assert not Job.objects.filter(queue="xjobs_soak").exists()
    assert not WorkerRow.objects.filter(id__startswith="soak").exists()
    assert soak_tables() == []


@pytest.mark.parametrize("mode", list(MODES))
def test_a_soak_behind_pgbouncer_holds_every_invariant(spawn_worker, pgbouncer, mode, tmp_path):
    """The soak and all its workers through PgBouncer in transaction mode, in each documented
    mode (docs/deployment.md): NOTIFY off, or the LISTEN sessions straight to PostgreSQL."""
    xjobs, direct = MODES[mode]
    # Long enough for a handful of faults through the pooler; the chaos itself is the test above.
    soak = spawn_worker("--duration", "12s", "--seed", SEED, "--log-dir", str(tmp_path / "soak"),
                        command="xjobs_soak", settings=xjobs, new_session=True,
                        env=pgbouncer.worker_env(listen_direct=direct))
    code = soak.wait(timeout=300)
    log = soak.log()
    assert code == 0, f"{log}\n--- pgbouncer ---\n{pgbouncer.log()[-3000:]}"
    for name in INVARIANTS:
        assert any(line.startswith(f"  ok    {name}") for line in log.splitlines()), (name, log)
    assert not Job.objects.filter(queue="xjobs_soak").exists()
    assert soak_tables() == []


def test_an_interrupted_soak_stops_its_workers_and_cleans_up(spawn_worker, tmp_path):
    """SIGINT reaches the soak at once, even when the kernel hands it to a thread other than
    the main one (here on purpose: a Ctrl-C lands on whichever thread is free). Python would
    run its handler only once the main thread wakes from the run's long wait (minutes here)."""
    soak = spawn_worker("--duration", "300s", "--log-dir", str(tmp_path / "soak"),
                        command="xjobs_soak", new_session=True)
    wait_until(lambda: Job.objects.filter(queue="xjobs_soak", state="done").count() > 20,
               timeout=60, message="the soak's jobs to run")
    to_thread(soak.pid, signal.SIGINT)
    assert soak.wait(timeout=60) == 1
    assert "interrupted: its workers are stopped" in soak.log()
    assert not Job.objects.filter(queue="xjobs_soak").exists()
    assert not WorkerRow.objects.filter(id__startswith="soak").exists()
    assert soak_tables() == []
    workers = [p.name for p in (tmp_path / "soak").iterdir()]
    assert workers  # it started some, and every one of them is gone:
    for name in workers:
        assert not backends_like(f"xjobs:{name.removesuffix('.log')}:%")


def test_a_soak_killed_outright_leaves_no_worker_running(spawn_worker, tmp_path):
    """SIGKILL gives the soak no chance to stop its workers: each sees its parent gone and stops
    by itself. What the soak enqueued stays (documented); this test cleans it up as a user
    would after reading the docs."""
    from django_xjobs.soak.run import abandon
    from tests.acceptance.test_worker_processes import _children, _gone

    soak = spawn_worker("--duration", "60s", "--no-chaos", "--log-dir", str(tmp_path / "soak"),
                        command="xjobs_soak", new_session=True)
    logs = tmp_path / "soak"
    wait_until(lambda: logs.exists() and any(logs.iterdir()), timeout=60,
               message="the soak's first worker")
    soak_id = next(logs.iterdir()).name.split("-w")[0]
    # Running, not starting up: each has its heartbeat session (this soak's own, by name).
    wait_until(lambda: len(backends_like(f"xjobs:{soak_id}-%:heartbeat")) == 4, timeout=60,
               message="the soak's four workers")
    workers = _children(soak.pid)
    assert len(workers) == 4
    soak.signal(signal.SIGKILL)
    wait_until(lambda: all(_gone(pid) for pid in workers), timeout=30,
               message="the killed soak's workers to stop by themselves")
    # A backend ends a moment after its client's process: PostgreSQL notices the socket closed.
    wait_until(lambda: not backends_like(f"xjobs:{soak_id}-%"), timeout=30,
               message="the killed soak's workers' sessions to end")
    for log in (tmp_path / "soak").iterdir():
        assert "stopping (its supervisor is gone)" in log.read_text(), log.read_text()
    abandon(soak_id, "xjobs_soak")
    assert soak_tables() == []


def to_thread(pid: int, sig: int) -> None:
    """Send ``sig`` to one thread of ``pid`` that is not its main thread (tgkill(2))."""
    tid = next(int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.tgkill(pid, tid, sig) != 0:
        raise OSError(ctypes.get_errno(), "tgkill failed")


def backends_like(pattern: str) -> list[int]:
    with connection.cursor() as cur:
        cur.execute("select pid from pg_stat_activity where application_name like %s",
                    [pattern])
        return [r[0] for r in cur.fetchall()]


@pytest.mark.django_db
@pytest.mark.parametrize("args, message", [
    (["--duration", "5s"], "--duration must be between 10s"),
    (["--duration", "soon"], "duration"),
    (["--workers", "0"], "--workers must be an integer from 1"),
    (["--queue", "no spaces"], "invalid queue name"),
    (["--seed", "-1"], "--seed must be an integer"),
    (["--lease", "0.1s"], "--lease must be between"),
])
def test_bad_arguments_are_refused_before_anything_starts(args, message):
    with pytest.raises(CommandError, match=message):
        call_command("xjobs_soak", *args)
    assert soak_tables() == []


@pytest.mark.django_db(transaction=True)
def test_a_queue_with_live_jobs_is_refused_and_left_alone():
    from django_xjobs import enqueue

    handle = enqueue("testapp.noop", {}, queue="busy")
    with pytest.raises(CommandError, match=r"has live jobs.*--queue"):
        call_command("xjobs_soak", "--queue", "busy", "--duration", "10s")
    assert Job.objects.get(pk=handle.id).state == "ready"
    assert soak_tables() == []
