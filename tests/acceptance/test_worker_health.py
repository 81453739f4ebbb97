"""Workers and health probes with real worker processes (docs/observability.md, "Workers and
health probes"): the x_workers row a worker's heartbeat writes, ``xjobs workers``, ``xjobs
health`` (its exit status is the probe) and ``xjobs_worker --health-file``; a worker stopped
with SIGSTOP, and one whose loop is wedged while its heartbeat thread runs, read as stalled.
Then the recipes of docs/deployment.md ("Kubernetes") through a database outage, on a cluster
of the test's own that is stopped and started again: the liveness probe on the health file
keeps passing, and the alert on ``xjobs health`` reports the outage (exit status 3).

The workers refresh their row every half second (WORKER_SEEN_INTERVAL), so a stopped one reads
as stalled after ``--max-stall 2s``; a healthy verdict is asked with a roomier max stall, so a
heartbeat late on this small shared machine does not fail the test.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

import django_xjobs
from tests.conftest import ROOT, wait_until

from .conftest import SETTLE, wait_state

pytestmark = pytest.mark.acceptance

REPORTING = {"WORKER_SEEN_INTERVAL": "0.5s"}
ROOMY = "30s"  # --max-stall when the verdict must be healthy


def new_queue() -> str:
    return f"hq-{uuid.uuid4().hex[:8]}"


def row(worker_id: str):
    from django_xjobs.engines import get_engine

    found = [w for w in get_engine().workers_list(max_stall=3600) if w.id == worker_id]
    return found[0] if found else None


def health(*args: str) -> tuple[int, str]:
    """``xjobs health`` in this process: (1 when it ended with its CommandError, else 0,
    its output)."""
    out = StringIO()
    try:
        call_command("xjobs", "health", *args, stdout=out)
    except CommandError as exc:
        assert str(exc).startswith("unhealthy:"), exc
        return 1, out.getvalue()
    return 0, out.getvalue()


def command_env(settings: dict | None = None, env: dict | None = None) -> dict[str, str]:
    """The environment of a ``python -m django`` child on the test database (``env``: on
    another, e.g. a private cluster's ``worker_env()``)."""
    from django.db import connection

    return {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT),
            "XJOBS_TEST_DB_NAME": connection.settings_dict["NAME"],
            "XJOBS_TEST_SETTINGS": json.dumps(settings or {}), **(env or {})}


def health_process(*args: str, settings: dict | None = None,
                   env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m django xjobs health`` as a Kubernetes exec probe runs it: its exit status."""
    return subprocess.run([sys.executable, "-m", "django", "xjobs", "health", *args],
                          cwd=ROOT, env=command_env(settings, env), capture_output=True,
                          text=True, timeout=120)


def wait_health(code: int, *args: str, text: str = "") -> str:
    def reached():
        got, out = health(*args)
        return out if got == code and text in out else None

    return wait_until(reached, timeout=SETTLE, interval=0.2,
                      message=f"xjobs health {' '.join(args)} to exit {code} with {text!r}")


def mtime(path: Path) -> float:
    return path.stat().st_mtime


def wait_touched(path: Path) -> None:
    """Until the file's mtime moves (the loop touches it once a second; while the database is
    down, once per round of retries)."""
    before = mtime(path) if path.exists() else None
    wait_until(lambda: path.exists() and mtime(path) != before, timeout=SETTLE, interval=0.1,
               message=f"{path} to be touched")


def wait_stale(path: Path, seconds: float = 2.5) -> None:
    """Until the file was last touched ``seconds`` ago, more than twice the touch interval (what
    a liveness probe on its age sees); a file that keeps being touched fails the test."""
    wait_until(lambda: time.time() - mtime(path) > seconds, timeout=SETTLE, interval=0.1,
               message=f"{path} to be left alone for {seconds}s")


def test_a_working_worker_reports_its_row_and_is_healthy(start_worker):
    from tests.testapp import jobs

    queue = new_queue()
    worker = start_worker("health", "-c", "2", "--queue", queue, settings=REPORTING)
    first = wait_until(lambda: row(worker.id), timeout=SETTLE, message="the worker's row")
    assert (first.pid, first.queues, first.concurrency) == (worker.pid, (queue,), 2)
    assert first.version == django_xjobs.__version__ != ""
    assert (first.running, first.finished, first.claimed_at) == (0, 0, None)

    handle = jobs.sleepy.using(queue=queue).enqueue(seconds=3)
    wait_until(lambda: row(worker.id).running == 1, timeout=SETTLE,
               message="the row to count the run in flight")
    wait_state(handle.id, "done")
    after = wait_until(lambda: (lambda r: r if r.finished == 1 and r.running == 0 else None)(
        row(worker.id)), timeout=SETTLE, message="the row to count the finished run")
    assert after.claimed_at is not None and after.stalled is None

    listing = StringIO()
    call_command("xjobs", "workers", stdout=listing)
    (line,) = [ln for ln in listing.getvalue().splitlines() if ln.startswith(worker.id)]
    assert f" {worker.pid} " in line and " 0/2 " in line and line.rstrip().endswith("ok")
    listing = StringIO()
    call_command("xjobs", "workers", "--json", stdout=listing)
    (listed,) = [w for w in json.loads(listing.getvalue()) if w["id"] == worker.id]
    assert (listed["finished"], listed["stalled"], listed["queues"]) == (1, None, [queue])

    code, out = health("--queue", queue, "--max-stall", ROOMY)
    assert code == 0 and out.startswith("healthy: 1 worker(s), none stalled")
    probe = health_process("--queue", queue, "--max-stall", ROOMY)
    assert probe.returncode == 0, probe.stdout + probe.stderr


def test_a_stopped_worker_is_stalled_and_recovers_when_continued(start_worker, tmp_path):
    queue = new_queue()
    health_file = tmp_path / "alive"
    worker = start_worker("stopped", "--queue", queue, "--health-file", str(health_file),
                          settings=REPORTING)
    wait_touched(health_file)
    wait_touched(health_file)  # and again: the loop keeps touching it
    wait_health(0, "--queue", queue, "--max-stall", ROOMY)

    worker.signal(signal.SIGSTOP)
    try:
        out = wait_health(1, "--queue", queue, "--max-stall", "2s", text="no heartbeat for")
        assert f"worker {worker.id} (" in out
        probe = health_process("--queue", queue, "--max-stall", "2s")
        assert probe.returncode == 1, probe.stdout + probe.stderr
        assert f"worker {worker.id} (" in probe.stdout and "no heartbeat for" in probe.stdout
        wait_stale(health_file)
    finally:
        worker.signal(signal.SIGCONT)
    wait_touched(health_file)
    wait_health(0, "--queue", queue, "--max-stall", ROOMY)


def test_a_wedged_loop_is_stalled_while_its_heartbeat_runs(start_worker, tmp_path):
    """The loop blocks after acknowledging its first job (a fault that sleeps there); the
    heartbeat thread keeps the row fresh, and it reports the loop's age."""
    from tests.testapp import jobs

    queue = new_queue()
    health_file = tmp_path / "alive"
    worker = start_worker("wedged", "--queue", queue, "--health-file", str(health_file),
                          settings=REPORTING, faults="after:jobs_complete_if_owned=sleep:120*1")
    wait_touched(health_file)
    handle = jobs.record.using(queue=queue).enqueue(tag="last before the wedge")
    wait_state(handle.id, "done")

    out = wait_health(1, "--queue", queue, "--max-stall", "2s",
                      text="loop has not gone round for")
    assert f"worker {worker.id} (" in out and "no heartbeat" not in out
    seen = row(worker.id).seen_at
    wait_until(lambda: row(worker.id).seen_at > seen, timeout=SETTLE,
               message="the heartbeat to refresh the row of the wedged worker")
    wait_stale(health_file)


def test_a_queue_with_due_jobs_and_no_worker_is_unhealthy(start_worker):
    from tests.testapp import jobs

    served, orphan = new_queue(), new_queue()
    start_worker("served", "--queue", served, settings=REPORTING)
    jobs.record.using(queue=orphan).enqueue(tag="nobody takes me")

    # Asked by --queue, or by XJOBS["QUEUES"]; by default only the queues workers serve.
    wait_health(0, "--max-stall", ROOMY)
    code, out = health("--queue", served, orphan, "--max-stall", ROOMY)
    # Only its job names the queue (not XJOBS["QUEUES"], a registered job or a worker): the
    # reason lists the names they give, in case --queue was mistyped.
    assert code == 1 and out.splitlines()[0].startswith(
        f"queue {orphan!r}: no worker serves it, and neither XJOBS['QUEUES']")
    assert "overall: bad" in out.splitlines()
    probe = health_process("--max-stall", ROOMY, settings={"QUEUES": [served, orphan]})
    assert probe.returncode == 1, probe.stdout + probe.stderr
    assert probe.stdout.splitlines()[0] == f"queue {orphan!r}: no worker serves it"
    # Bad input is not a verdict: exit status 2, as for any bad argument of the command line.
    refused = health_process("--max-stall", "abc")
    assert refused.returncode == 2 and "'abc' is not a duration" in refused.stderr


# ---------------------------------------------------------- a database outage, the recipes --


def kubernetes_recipes() -> tuple[str, str]:
    """From docs/deployment.md, "Kubernetes": the liveness probe's shell command (on the
    health file) and the alert script on ``xjobs health``."""
    doc = (ROOT / "docs/deployment.md").read_text()
    section = doc.split("\n## Kubernetes\n", 1)[1].split("\n## ", 1)[0]
    probe = re.search(r"livenessProbe:\s*exec:\s*command: (\[.*?\])", section, re.S)
    alert = re.search(r"```sh\n(.*?)```", section, re.S)
    assert probe and alert, "the Kubernetes section lost its liveness probe or its alert"
    shell, flag, liveness = json.loads(probe.group(1))
    assert (shell, flag) == ("sh", "-c") and "/tmp/xjobs-alive" in liveness, liveness
    assert "xjobs health" in alert.group(1)
    return liveness, alert.group(1)


def run_alert(script: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """The alert script, its ``python manage.py`` this test's interpreter on the tests'
    settings, its ``notify`` a line on stdout."""
    shim = (f'python() {{ shift; {shlex.quote(sys.executable)} -m django "$@"; }}\n'
            'notify() { echo "$*"; }\n')
    return subprocess.run(["sh", "-c", shim + script], cwd=ROOT, env=command_env(env=env),
                          capture_output=True, text=True, timeout=120)


def test_a_database_outage_restarts_nothing_and_the_alert_reports_it(cluster, start_worker,
                                                                        tmp_path):
    liveness, alert = kubernetes_recipes()
    health_file = tmp_path / "alive"
    liveness = liveness.replace("/tmp/xjobs-alive", str(health_file))
    env = cluster.worker_env()
    queue = new_queue()
    worker = start_worker("outage", "--queue", queue, "--health-file", str(health_file),
                          settings=REPORTING, env=env)
    wait_until(lambda: cluster.sql("select 1 from x_workers where id = %s", [worker.id]),
               timeout=SETTLE, message="the worker's row on the private cluster")
    wait_touched(health_file)
    assert subprocess.run(["sh", "-c", liveness]).returncode == 0
    up = health_process("--queue", queue, "--max-stall", ROOMY, env=env)
    assert up.returncode == 0, up.stdout + up.stderr

    cluster.stop()
    try:
        down = health_process("--queue", queue, "--max-stall", ROOMY, env=env)
        assert (down.returncode, down.stdout) == (3, ""), down.stdout + down.stderr
        (line,) = down.stderr.splitlines()
        assert line.startswith("CommandError: database unreachable (alias 'default'): "), line
        assert f"port {cluster.port} failed: Connection refused" in line
        paged = run_alert(alert, env)
        assert paged.stdout == "xjobs: the database is unreachable\n", paged.stdout + paged.stderr

        # The worker saw the outage, and its loop still goes round: the file is touched again
        # after that (a round of retries is up to 5 s apart) and the documented probe passes,
        # while the server is down.
        wait_until(lambda: "database unreachable" in worker.log(), timeout=SETTLE,
                   interval=0.1, message="the worker to log the outage")
        wait_touched(health_file)
        assert subprocess.run(["sh", "-c", liveness]).returncode == 0
        assert worker.proc.poll() is None, worker.log()
    finally:
        cluster.resume()

    # The same process goes on: it claims and runs a job enqueued after the outage.
    job_id = cluster.run(
        "from tests.testapp import jobs\n"
        f"print(jobs.record.using(queue={queue!r}).enqueue(tag='after the outage').id)\n"
    ).strip().splitlines()[-1]
    wait_until(lambda: cluster.sql("select 1 from x_jobs where id = %s and state = 'done'"
                                   " and claimed_by = %s", [job_id, worker.id]),
               timeout=SETTLE, message="the job enqueued after the outage to be done by the "
                                       "worker that rode it out")
    assert worker.proc.poll() is None, worker.log()
    wait_until(lambda: health_process("--queue", queue, "--max-stall", ROOMY,
                                      env=env).returncode == 0,
               timeout=SETTLE, interval=0.5, message="xjobs health to exit 0 again")
