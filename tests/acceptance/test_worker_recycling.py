"""Worker recycling (``xjobs_worker --max-jobs-per-process N``, ``--max-memory M``): a worker
process leaves after N jobs, or once its resident memory passes M MiB, having finished what it
held; a fresh process takes its place, and the command runs on (docs/deployment.md, "Recycling
worker processes")."""

from __future__ import annotations

import signal
from collections import Counter

import pytest

from tests.conftest import wait_until

from .conftest import FAST, effects, job_row, wait_effect, wait_exit, wait_log, wait_state

pytestmark = pytest.mark.acceptance


def _workers() -> set[str]:
    """The ids of the x_workers rows: the worker processes that have not stopped."""
    from django_xjobs.models import WorkerRow

    return set(WorkerRow.objects.values_list("id", flat=True))


def _ran_once_each(handles) -> Counter:
    """Every job done, on its first attempt, its code run once; the jobs each worker did."""
    done = Counter()
    for handle in handles:
        row = job_row(handle.id)
        assert (row.state, row.attempt, row.rescues) == ("done", 1, 0)
        assert len(effects(handle.id, "start")) == 1
        done[row.claimed_by] += 1
    return done


def _recycled_every_third_job(done: Counter, log: str) -> set[str]:
    """With --max-jobs-per-process 3 and 10 jobs: each process took 3 jobs at most (it claims
    none it would hand back), so at least 4 did; each one that did 3 left, saying why."""
    assert len(done) >= 4 and max(done.values()) <= 3, done
    recycled = {wid for wid, n in done.items() if n == 3}
    assert len(recycled) >= 2, done
    for wid in recycled:
        assert f"worker {wid} stopped (recycling after 3 jobs)" in log, log
    assert log.count("recycled itself; starting a fresh one") >= len(recycled), log
    # Not a crash: no warning, no restart backoff.
    assert "restarting in" not in log
    return recycled


def test_one_process_recycled_every_3_jobs_runs_each_job_once_and_keeps_running(spawn_worker):
    """Without --processes: the command supervises its one worker process and starts the next
    whenever one recycles; a recycled process's x_workers row is gone as after any graceful
    stop."""
    from tests.testapp import jobs

    handles = [jobs.record.enqueue(tag=str(i)) for i in range(10)]
    command = spawn_worker("--max-jobs-per-process", "3", "--concurrency", "2", settings=FAST)
    for handle in handles:
        wait_state(handle.id, "done")
    done = _ran_once_each(handles)
    wait_until(lambda: command.log().count("recycled itself") >= 3, message="three recycles")
    recycled = _recycled_every_third_job(done, command.log())

    # One worker process at a time, never one that recycled: the command runs on.
    wait_until(lambda: len(_workers()) == 1 and not _workers() & recycled,
               message="the recycled processes' rows gone, a fresh process's there")
    assert command.proc.poll() is None
    later = jobs.record.enqueue(tag="later")
    assert wait_state(later.id, "done").claimed_by not in recycled

    command.signal(signal.SIGTERM)
    assert wait_exit(command) == 0, command.log()


def test_n_processes_in_burst_mode_recycle_and_finish_the_burst(spawn_worker):
    """--burst with recycling: a process that recycles is replaced, and the fresh one goes on
    with the burst; the command exits 0 once the processes find nothing left to do."""
    from tests.testapp import jobs

    handles = [jobs.record.enqueue(tag=str(i)) for i in range(10)]
    command = spawn_worker("--processes", "2", "--burst", "--max-jobs-per-process", "3",
                           settings=FAST)

    assert wait_exit(command) == 0, command.log()
    log = command.log()
    _recycled_every_third_job(_ran_once_each(handles), log)
    assert log.count("finished its burst") == 2
    assert _workers() == set()


def test_a_process_over_its_memory_bound_finishes_its_runs_and_is_replaced(spawn_worker):
    """The resident memory is read after each job: past --max-memory the process stops
    claiming, lets its runs in flight finish however long they take (no grace period: they
    are going fine), and leaves; the next job runs in a fresh process."""
    from tests.testapp import jobs

    command = spawn_worker("--max-memory", "0.25GiB", "--concurrency", "2",
                           settings={**FAST, "SHUTDOWN_GRACE": "0.2s"})
    slow = jobs.sleepy_tagged.enqueue(seconds=2)
    [started] = wait_effect(slow.id, "start")
    big = jobs.hoard.enqueue(mib=300)  # its process now holds 300 MiB more than at start
    hog = wait_state(big.id, "done")
    assert effects(big.id)[0].pid == started.pid
    wait_log(command, "recycled itself")
    log = command.log()
    assert f"worker {hog.claimed_by} stopping (recycling: RSS " in log
    assert "MiB over --max-memory 256): no new claims; 1 runs in flight finish first" in log

    # The run in flight outlived SHUTDOWN_GRACE and was not handed back: one run, done.
    row = job_row(slow.id)
    assert (row.state, row.attempt, row.claimed_by) == ("done", 1, hog.claimed_by)
    assert [(e.kind, e.pid) for e in effects(slow.id)] == [("start", started.pid),
                                                          ("end", started.pid)]
    assert hog.claimed_by not in _workers()

    # The next jobs run in the fresh process, which stays under the bound and keeps them.
    after = [jobs.hoard.enqueue(mib=0) for _ in range(2)]
    rows = [wait_state(h.id, "done") for h in after]
    assert started.pid not in {r.result["pid"] for r in rows}
    assert len({r.claimed_by for r in rows}) == 1

