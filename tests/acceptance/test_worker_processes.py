"""``xjobs_worker --processes N``: one command, N worker processes, a supervisor that restarts
a child that dies and forwards SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
from datetime import UTC, datetime, timedelta

import pytest

from tests.conftest import wait_until

from .conftest import FAST, SETTLE, wait_effect, wait_exit, wait_log, wait_started, wait_state

pytestmark = pytest.mark.acceptance


def _children(supervisor_pid: int) -> list[int]:
    try:
        with open(f"/proc/{supervisor_pid}/task/{supervisor_pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except FileNotFoundError:
        return []


def _gone(pid: int) -> bool:
    """Exited: no process, or a zombie nobody reaped (an orphan's parent may never wait)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _worker_ids():
    from django_xjobs.models import Job

    return set(Job.objects.filter(state="done").values_list("claimed_by", flat=True))


def test_n_processes_share_the_queue_and_a_dead_child_is_replaced(spawn_worker):
    from tests.testapp import jobs

    supervisor = spawn_worker("--processes", "2", "--concurrency", "2", settings=FAST)
    wait_until(lambda: len(_children(supervisor.pid)) == 2, timeout=SETTLE,
               message="two worker processes")
    first_children = set(_children(supervisor.pid))

    handles = [jobs.sleepy.enqueue(seconds=0.05, tag=str(i)) for i in range(40)]
    for handle in handles:
        wait_state(handle.id, "done")
    # Two processes took part: two different worker ids claimed jobs.
    assert len(_worker_ids()) == 2

    # A child killed from outside (as an OOM kill would) is replaced; the queue keeps moving.
    victim = sorted(first_children)[0]
    os.kill(victim, signal.SIGKILL)
    wait_until(
        lambda: len(_children(supervisor.pid)) == 2 and victim not in _children(supervisor.pid),
        timeout=SETTLE, message="the killed worker process to be replaced",
    )
    later = jobs.record.enqueue(tag="after the kill")
    wait_state(later.id, "done")
    assert "exited with" in supervisor.log() and "restarting" in supervisor.log()

    # SIGTERM reaches every child; all stop gracefully and the supervisor exits 0.
    children = _children(supervisor.pid)
    supervisor.signal(signal.SIGTERM)
    assert wait_exit(supervisor) == 0
    wait_until(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in children),
               timeout=SETTLE, message="every worker process to be gone")


def test_worker_processes_stop_by_themselves_when_their_supervisor_is_sigkilled(spawn_worker):
    """A SIGKILLed supervisor forwards nothing: each worker process sees that its parent is gone
    and stops as on a first SIGTERM, rather than working on as an orphan beside the full set a
    restarted supervisor would start. Killed here the moment both exist, while they are still
    starting up: a child cannot learn its supervisor by looking at its parent then (it may
    already be another process), so the supervisor tells it. The soak's killed workers
    (tests/acceptance/test_soak.py) stop in the middle of their runs."""
    supervisor = spawn_worker("--processes", "2", "--concurrency", "1", settings=FAST,
                              new_session=True)
    wait_until(lambda: len(_children(supervisor.pid)) == 2, timeout=SETTLE, interval=0.005,
               message="two worker processes")
    children = _children(supervisor.pid)
    supervisor.signal(signal.SIGKILL)
    wait_exit(supervisor)
    wait_until(lambda: all(_gone(pid) for pid in children), timeout=SETTLE,
               message="the orphaned worker processes to stop")
    assert supervisor.log().count("stopped (its supervisor is gone)") == 2, supervisor.log()


def test_n_processes_in_burst_mode_drain_the_queue_and_exit(spawn_worker):
    """Each child exits 0 once nothing is left to do; the supervisor does not restart it and
    exits 0 when every child has (scripts and CI use --burst)."""
    from tests.testapp import jobs

    handles = [jobs.record.enqueue(tag=str(i)) for i in range(20)]
    supervisor = spawn_worker("--processes", "2", "--burst", settings=FAST)

    assert wait_exit(supervisor) == 0
    assert {h.get().state for h in handles} == {"done"}
    assert "restarting" not in supervisor.log()
    assert supervisor.log().count("finished its burst") == 2


def test_several_queues_follow_one_queue_flag(spawn_worker):
    from tests.testapp import jobs

    default, other = jobs.record.enqueue(tag="d"), jobs.on_other_queue.enqueue()
    worker = spawn_worker("--burst", "--queue", "default", "other", settings=FAST)

    assert wait_exit(worker) == 0
    assert (default.get().state, other.get().state) == ("done", "done")


def test_one_free_thread_serves_the_last_of_six_queues(spawn_worker):
    """-c 1 --prefetch 0 with six queues: one free slot per claim, and the split rotates, so a
    ready job of the sixth queue runs on an otherwise idle worker."""
    from tests.testapp import jobs

    queues = [f"six-{i}" for i in range(6)]
    worker = spawn_worker("-c", "1", "--prefetch", "0", "--queue", *queues, settings=FAST)
    wait_started(worker)
    last = jobs.record.using(queue=queues[-1]).enqueue(tag="sixth")
    assert wait_state(last.id, "done").result == {"tag": "sixth", "attempt": 1}


def _closed_port() -> int:
    """A local TCP port nothing listens on: connecting to it is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_burst_with_the_database_unreachable_exits_non_zero(spawn_worker):
    url = f"postgresql://postgres@127.0.0.1:{_closed_port()}/postgres"
    worker = spawn_worker("--burst", settings=FAST, env={"DATABASE_URL": url})

    assert wait_exit(worker) != 0
    log = worker.log()
    assert "burst: the database cannot be reached" in log
    assert "nothing left to do" not in log


def test_burst_runs_the_cron_jobs_its_own_scheduler_fires(spawn_worker):
    """The burst's scheduler fires a missed occurrence in its first round; the burst runs that
    job before it decides that nothing is due."""
    from django_xjobs.models import Job, SchedulerState

    SchedulerState.objects.create(task_name="nightly",
                                  last_fired_at=datetime.now(UTC) - timedelta(days=2))
    schedule = {"nightly": {"job": "testapp.record", "cron": "0 3 * * *",
                            "input": {"tag": "cron"}}}
    worker = spawn_worker("--burst", settings={**FAST, "SCHEDULE": schedule,
                                                "MAINTENANCE_INTERVAL": None})

    assert wait_exit(worker) == 0
    [row] = Job.objects.filter(enqueued_by="cron:nightly")
    assert (row.state, row.result) == ("done", {"tag": "cron", "attempt": 1})


def test_a_group_wide_sigterm_stops_the_processes_gracefully(spawn_worker):
    """SIGTERM to the whole process group (Ctrl-C in a terminal, systemd's control-group kill)
    reaches each worker process twice: directly and forwarded by the supervisor. That is one
    stop: the running job finishes, and the supervisor exits 0."""
    from tests.testapp import jobs

    supervisor = spawn_worker("--processes", "2", "--concurrency", "1", settings=FAST,
                              new_session=True)
    wait_until(lambda: len(_children(supervisor.pid)) == 2, timeout=SETTLE,
               message="two worker processes")
    handle = jobs.sleepy_tagged.enqueue(seconds=2)
    wait_effect(handle.id, "start")

    os.killpg(supervisor.pid, signal.SIGTERM)
    assert wait_exit(supervisor) == 0, supervisor.log()
    row = handle.get()
    assert (row.state, row.attempt) == ("done", 1)
    assert "received again" not in supervisor.log()


def test_a_stop_during_a_restart_backoff_exits_0(spawn_worker):
    """A child that died and waits out its restart backoff when SIGTERM comes is not restarted;
    its earlier death (logged when it happened) is not this stop's failure."""
    supervisor = spawn_worker("--processes", "2", "--concurrency", "1", settings=FAST)
    wait_until(lambda: len(_children(supervisor.pid)) == 2, timeout=SETTLE,
               message="two worker processes")
    # Each child killed young doubles the backoff (1 s, 2 s, 4 s): a window no test misses.
    victim = min(_children(supervisor.pid))
    for backoff in ("1.0", "2.0", "4.0"):
        before = set(_children(supervisor.pid)) - {victim}
        os.kill(victim, signal.SIGKILL)
        wait_log(supervisor, f"restarting in {backoff}s")
        if backoff != "4.0":
            [victim] = wait_until(
                lambda before=before, victim=victim: set(_children(supervisor.pid)) - before
                - {victim},
                timeout=SETTLE, message="the killed worker process to be replaced")
    supervisor.signal(signal.SIGTERM)
    assert wait_exit(supervisor) == 0, supervisor.log()
    assert supervisor.log().count("started worker process") == 4  # 2, then 2 of 3 restarts


def test_n_processes_in_burst_mode_with_the_database_unreachable_exit_non_zero(spawn_worker):
    url = f"postgresql://postgres@127.0.0.1:{_closed_port()}/postgres"
    supervisor = spawn_worker("--processes", "2", "--burst", settings=FAST,
                              env={"DATABASE_URL": url})

    assert wait_exit(supervisor) != 0
    log = supervisor.log()
    assert log.count("could not finish its burst") == 2
    assert "restarting" not in log
