"""Backfill passes against real worker crashes, pauses and cancels (docs/backfills.md).

Every test backfill adds 1 to ``Counted.hits`` for each row of a batch, which is NOT
idempotent: "every row exactly once" is "every hits is 1", whatever happened to the workers.
Kills are real SIGKILLs, or ``os._exit`` at a named point (``XJOBS_FAULTS``): the engine's
``after:<statement>`` points and the pass's own ``backfill:before-progress``,
``backfill:after-commit`` and ``backfill:completed``.
"""

from __future__ import annotations

import os
import signal
from io import StringIO

import pytest
from django.core.management import call_command

from tests.conftest import wait_until
from tests.leases import lapse_worker

from .conftest import SETTLE, job_row, wait_exit, wait_log

pytestmark = pytest.mark.acceptance

ON_BACKFILLS = ("--queue", "backfills")


def make_rows(n: int, *, poison: tuple[int, ...] = ()) -> list[int]:
    from tests.testapp.models import Counted

    Counted.objects.bulk_create([Counted() for _ in range(n)], batch_size=5000)
    ids = list(Counted.objects.order_by("pk").values_list("pk", flat=True))
    if poison:
        Counted.objects.filter(pk__in=[ids[i - 1] for i in poison]).update(poison=True)
    return ids


def hits() -> list[int]:
    from tests.testapp.models import Counted

    return list(Counted.objects.order_by("pk").values_list("hits", flat=True))


def backfill_command(*args: str) -> str:
    out = StringIO()
    call_command("xjobs_backfill", *args, stdout=out)
    return out.getvalue()


def start_pass(name: str, *args: str) -> dict:
    import json

    return json.loads(backfill_command("start", name, *args, "--json"))


def pass_row(started: dict):
    from django_xjobs.models import Backfill

    return Backfill.objects.get(pk=started["run_id"])


def wait_rows(started: dict, at_least: int, timeout: float = SETTLE):
    return wait_until(
        lambda: (row := pass_row(started)).rows_processed >= at_least and row,
        timeout=timeout, interval=0.02, message=f"{at_least} rows processed")


def wait_status(started: dict, status: str, timeout: float = 60):
    return wait_until(lambda: (row := pass_row(started)).status == status and row,
                      timeout=timeout, interval=0.05, message=f"the pass to be {status}")


def wait_job_state(started: dict, state: str, timeout: float = 60):
    """The pass's job once it reached ``state`` (its ack follows the final batch's commit)."""
    return wait_until(lambda: (job := job_row(started["job_id"])).state == state and job,
                      timeout=timeout, interval=0.05, message=f"the pass's job to be {state}")


def test_a_pass_killed_three_times_processes_every_row_exactly_once(start_worker):
    make_rows(10_000)
    started = start_pass("testapp.count_rows", "--batch-size", "100", "--throttle", "20ms")

    # 1. A real SIGKILL, wherever the pass happens to be: in a batch, in its commit, throttled.
    first = start_worker("first", *ON_BACKFILLS)
    wait_rows(started, 2000)
    first.signal(signal.SIGKILL)
    wait_exit(first)
    after_kill = pass_row(started).rows_processed
    assert 2000 <= after_kill < 10_000
    lapse_worker(first)  # each killed worker's lease lapses, and the next one takes over

    # 2. Dies after its first batch's progress statement, before the commit: nothing of that
    #    batch may remain.
    second = start_worker("second", *ON_BACKFILLS,
                          faults="after:backfill_progress_if_owned=exit")
    assert wait_exit(second, timeout=60) == 137
    assert pass_row(started).rows_processed == after_kill
    assert job_row(started["job_id"]).attempt == 2
    lapse_worker(second)

    # 3. Dies right after its first batch committed: exactly that batch remains.
    third = start_worker("third", *ON_BACKFILLS, faults="backfill:after-commit=exit")
    assert wait_exit(third, timeout=60) == 137
    assert pass_row(started).rows_processed == after_kill + 100
    lapse_worker(third)

    fourth = start_worker("fourth", *ON_BACKFILLS)
    done = wait_status(started, "completed", timeout=120)

    assert (done.rows_processed, done.last_cursor, done.error) == (10_000, None, None)
    counts = hits()
    assert len(counts) == 10_000
    assert set(counts) == {1}, {n: counts.count(n) for n in set(counts)}
    job = wait_job_state(started, "done")
    assert (job.attempt, job.claimed_by) == (4, fourth.id)
    assert done.code_changes == []  # the same code resumed it every time
    assert "resuming at" in fourth.log()


def test_a_crash_after_the_final_commit_ends_the_pass_without_starting_over(start_worker):
    make_rows(500)
    started = start_pass("testapp.count_rows", "--batch-size", "100")

    first = start_worker("first", *ON_BACKFILLS, faults="backfill:completed=exit")
    assert wait_exit(first, timeout=60) == 137
    assert pass_row(started).status == "completed"
    assert job_row(started["job_id"]).state == "running"  # its ack was never sent

    lapse_worker(first)
    start_worker("second", *ON_BACKFILLS)
    job = wait_job_state(started, "done")

    assert job.result == {"status": "completed", "rows_processed": 500, "batches": 0}
    assert job.attempt == 2
    assert hits() == [1] * 500
    assert pass_row(started).rows_processed == 500


def test_a_paused_worker_whose_lease_lapsed_cannot_commit_its_batch(start_worker):
    """The stale run resumes with its batch's writes done and tries to commit them after
    another worker took the job over: its fence refuses and the batch rolls back. The lease
    lapses on the database's side only (tests/leases.py): the resumed run believes it still
    holds it, so what refuses its commit is the fence alone."""
    make_rows(1000)
    started = start_pass("testapp.count_rows", "--batch-size", "100")

    stale = start_worker("stale", *ON_BACKFILLS, faults="backfill:before-progress=stop*1")
    wait_until(lambda: _process_state(stale.pid) == "T", timeout=60, interval=0.05,
               message="the first worker to stop itself mid-batch")
    try:
        lapse_worker(stale)
        fresh = start_worker("fresh", *ON_BACKFILLS)
        # The lease lapsed, the fresh worker re-claims the job; its first batch then waits for
        # the row locks the stopped run still holds.
        wait_until(lambda: job_row(started["job_id"]).claimed_by == fresh.id, timeout=60,
                   message="the fresh worker to re-claim the job")
    finally:
        os.kill(stale.pid, signal.SIGCONT)

    done = wait_status(started, "completed", timeout=60)
    assert done.rows_processed == 1000
    assert hits() == [1] * 1000
    wait_job_state(started, "done")
    wait_log(stale, "result discarded")  # the stale run learnt it had lost the job


def test_a_worker_stopped_by_sigterm_hands_the_pass_back_and_the_next_one_resumes_it(
    start_worker,
):
    make_rows(3000)
    # 30 batches 100 ms apart: the pass outlives the 1 s grace period by far.
    started = start_pass("testapp.count_rows", "--batch-size", "100", "--throttle", "100ms")
    first = start_worker("first", *ON_BACKFILLS, settings={"SHUTDOWN_GRACE": "1s"})
    wait_rows(started, 300)

    first.signal(signal.SIGTERM)  # a deploy: the pass outlives the grace period
    assert wait_exit(first) == 0
    handed_back = pass_row(started)
    assert 300 <= handed_back.rows_processed < 3000
    job = job_row(started["job_id"])
    assert (job.state, job.attempt) == ("ready", 0)  # given back without spending an attempt

    second = start_worker("second", *ON_BACKFILLS)
    done = wait_status(started, "completed", timeout=120)

    assert done.rows_processed == 3000
    assert hits() == [1] * 3000
    assert wait_job_state(started, "done").attempt == 1
    assert "handing it back" in first.log()
    assert f"resuming at {handed_back.rows_processed} rows" in second.log()


def test_cancel_stops_a_running_pass_after_its_current_batch_and_retry_resumes_it(
    start_worker,
):
    make_rows(3000)
    started = start_pass("testapp.count_rows", "--batch-size", "100", "--throttle", "50ms")
    worker = start_worker("worker", *ON_BACKFILLS)
    wait_rows(started, 300)

    out = backfill_command("cancel", started["run_id"])

    assert "is now cancelled" in out
    wait_log(worker, "result discarded")  # the run has stopped
    stopped = pass_row(started)
    assert stopped.status == "cancelled" and 300 <= stopped.rows_processed < 3000
    k = stopped.rows_processed
    assert hits() == [1] * k + [0] * (3000 - k)  # whole batches, none after the cancel
    assert job_row(started["job_id"]).state == "cancelled"

    backfill_command("retry", started["run_id"])
    done = wait_status(started, "completed", timeout=120)

    assert done.rows_processed == 3000
    assert hits() == [1] * 3000
    wait_job_state(started, "done")


def test_a_failing_batch_keeps_the_cursor_and_retry_resumes_from_it(start_worker):
    from tests.testapp.models import Counted

    ids = make_rows(1000, poison=(750,))
    started = start_pass("testapp.count_rows_once")
    start_worker("worker", *ON_BACKFILLS)

    failed = wait_status(started, "failed")
    assert (failed.rows_processed, failed.last_cursor) == (700, ids[699])
    assert "poisoned row" in failed.error
    wait_job_state(started, "dead")
    assert hits() == [1] * 700 + [0] * 300

    Counted.objects.update(poison=False)
    backfill_command("retry", started["run_id"])
    done = wait_status(started, "completed")

    assert done.rows_processed == 1000 and done.started_at == failed.started_at
    assert hits() == [1] * 1000


def _process_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""
