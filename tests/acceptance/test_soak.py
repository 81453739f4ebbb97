"""``manage.py xjobs_soak``, as a user runs it: a real soak on the test database, its worker
processes killed, stopped and disconnected, with a fixed seed; then its bad inputs.

The checks themselves are shown to catch their violations in tests/unit/test_soak_invariants.py.
"""

from __future__ import annotations

import json
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
    # About a minute: CI's short soak, with a transaction held open for all of it.
    soak = spawn_worker("--duration", "45s", "--seed", SEED, "--hold-transaction",
                        "--log-dir", str(tmp_path / "soak"), command="xjobs_soak")
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
    soak = spawn_worker("--duration", "20s", "--seed", SEED, "--log-dir", str(tmp_path / "soak"),
                        command="xjobs_soak", settings=xjobs,
                        env=pgbouncer.worker_env(listen_direct=direct))
    code = soak.wait(timeout=300)
    log = soak.log()
    assert code == 0, f"{log}\n--- pgbouncer ---\n{pgbouncer.log()[-3000:]}"
    for name in INVARIANTS:
        assert any(line.startswith(f"  ok    {name}") for line in log.splitlines()), (name, log)
    assert not Job.objects.filter(queue="xjobs_soak").exists()
    assert soak_tables() == []


def test_an_interrupted_soak_stops_its_workers_and_cleans_up(spawn_worker, tmp_path):
    soak = spawn_worker("--duration", "60s", "--log-dir", str(tmp_path / "soak"),
                        command="xjobs_soak")
    wait_until(lambda: Job.objects.filter(queue="xjobs_soak", state="done").count() > 20,
               timeout=60, message="the soak's jobs to run")
    soak.signal(signal.SIGINT)
    assert soak.wait(timeout=60) == 1
    assert "interrupted: its workers are stopped" in soak.log()
    assert not Job.objects.filter(queue="xjobs_soak").exists()
    assert not WorkerRow.objects.filter(id__startswith="soak").exists()
    assert soak_tables() == []
    workers = [p.name for p in (tmp_path / "soak").iterdir()]
    assert workers  # it started some, and every one of them is gone:
    for name in workers:
        assert not backends_like(f"xjobs:{name.removesuffix('.log')}:%")


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
