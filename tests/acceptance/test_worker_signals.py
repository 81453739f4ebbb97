"""Worker processes meet real signals: SIGKILL, SIGTERM (graceful), a second SIGTERM (hard)."""

from __future__ import annotations

import signal

import pytest

from tests.conftest import wait_until
from tests.leases import lapse_worker

from .conftest import effects, job_row, wait_effect, wait_exit, wait_log, wait_state

pytestmark = pytest.mark.acceptance


def test_sigkill_mid_job_the_lease_lapses_and_another_worker_finishes_it(start_worker):
    from tests.testapp.jobs import sleepy_tagged

    a = start_worker("a", "--concurrency", "3")
    handles = [sleepy_tagged.enqueue(seconds=30, later=0.2) for _ in range(3)]
    for h in handles:
        wait_effect(h.id, "start")
    assert all(job_row(h.id).claimed_by == a.id for h in handles)

    a.signal(signal.SIGKILL)
    assert wait_exit(a) == -signal.SIGKILL
    assert sorted(lapse_worker(a)) == sorted(str(h.id) for h in handles)
    b = start_worker("b", "--concurrency", "3")

    for h in handles:
        row = wait_state(h.id, "done", "dead", "cancelled")
        assert row.state == "done"
        assert (row.attempt, row.rescues, row.claimed_by) == (2, 1, b.id)
        starts = effects(h.id, "start")
        assert [(e.attempt, e.pid) for e in starts] == [(1, a.pid), (2, b.pid)]
        # The killed run never finished; the result is the rescuing run's.
        assert [(e.attempt, e.pid) for e in effects(h.id, "end")] == [(2, b.pid)]
        assert row.result == {"run": starts[1].tag}


def test_sigterm_lets_in_flight_jobs_finish_and_claims_nothing_new(start_worker):
    from django_xjobs.models import Job
    from tests.testapp.jobs import record, sleepy
    from tests.testapp.models import Effect

    # Two executor threads, four jobs claimed: two run, two wait in the worker's queue.
    a = start_worker("a", "--concurrency", "2", "--prefetch", "2",
                     settings={"SHUTDOWN_GRACE": "30s"})
    slow = [sleepy.enqueue(seconds=1.5, tag=str(i)) for i in range(4)]
    ids = {str(h.id) for h in slow}
    wait_until(lambda: Effect.objects.filter(kind="start").count() == 2,
               message="two jobs running")
    wait_until(lambda: Job.objects.filter(state="running").count() == 4,
               message="all four claimed")
    started = set(Effect.objects.filter(kind="start").values_list("job_id", flat=True))
    waiting = ids - started

    a.signal(signal.SIGTERM)
    wait_log(a, "stopping (SIGTERM)")
    # Enqueued after the worker stopped claiming: it must leave these alone.
    later = [record.enqueue(tag=f"later-{i}") for i in range(3)]

    assert wait_exit(a) == 0
    assert "stopped (SIGTERM)" in a.log()
    for job_id in started:  # in flight: allowed to finish
        row = job_row(job_id)
        assert (row.state, row.attempt, row.claimed_by) == ("done", 1, a.id)
        assert [e.pid for e in effects(job_id, "end")] == [a.pid]
    for job_id in waiting:  # claimed but not started: handed back at once, attempt returned
        row = job_row(job_id)
        assert (row.state, row.attempt, row.rescues, row.worker_ids) == ("ready", 0, 0, [])
        assert effects(job_id) == []
    for h in later:
        row = job_row(h.id)
        assert (row.state, row.attempt, row.claimed_by) == ("ready", 0, None)
        assert effects(h.id) == []

    # What it left is there for the next worker, at once (no lease to wait for).
    b = start_worker("b")
    for job_id in [*waiting, *(str(h.id) for h in later)]:
        row = wait_state(job_id, "done")
        assert (row.attempt, row.rescues, row.claimed_by) == (1, 0, b.id)
        assert len(effects(job_id, "start")) == 1


def test_sigterm_hands_back_a_job_still_running_after_the_grace_without_spending_an_attempt(
    start_worker,
):
    from tests.testapp.jobs import sleepy_tagged

    a = start_worker("a", "--concurrency", "1", settings={"SHUTDOWN_GRACE": "0.5s"})
    h = sleepy_tagged.enqueue(seconds=30, later=0.2)
    wait_effect(h.id, "start")
    assert job_row(h.id).attempt == 1

    a.signal(signal.SIGTERM)
    assert wait_exit(a) == 0
    assert "still running after the 0.5s grace period" in a.log()
    row = job_row(h.id)
    # Handed back: ready at once, the attempt the claim counted taken back, not a lease lapse.
    assert (row.state, row.attempt, row.rescues) == ("ready", 0, 0)
    assert row.worker_ids == []
    assert "shut down" in (row.last_error or "")
    assert effects(h.id, "end") == []

    b = start_worker("b", "--concurrency", "1")
    row = wait_state(h.id, "done", "dead", "cancelled", timeout=60)
    assert row.state == "done"
    assert (row.attempt, row.rescues, row.claimed_by) == (1, 0, b.id)
    starts = effects(h.id, "start")
    assert [(e.attempt, e.pid) for e in starts] == [(1, a.pid), (1, b.pid)]
    assert row.result == {"run": starts[1].tag}


def test_a_second_sigterm_exits_at_once_and_the_job_is_rescued_after_its_lease(start_worker):
    from tests.testapp.jobs import sleepy_tagged

    a = start_worker("a", "--concurrency", "1", settings={"SHUTDOWN_GRACE": "60s"})
    h = sleepy_tagged.enqueue(seconds=30, later=0.2)
    wait_effect(h.id, "start")

    a.signal(signal.SIGTERM)
    wait_log(a, "stopping (SIGTERM)")
    a.signal(signal.SIGTERM)
    rc = wait_exit(a)
    assert rc not in (0, None)
    assert "SIGTERM received again: exiting now" in a.log()
    # It did not wait for its run: the job is still leased to it, with nothing written back.
    row = job_row(h.id)
    assert (row.state, row.attempt, row.claimed_by) == ("running", 1, a.id)
    assert effects(h.id, "end") == []

    lapse_worker(a)
    b = start_worker("b", "--concurrency", "1")
    row = wait_state(h.id, "done", "dead", "cancelled")
    assert row.state == "done"
    assert (row.attempt, row.rescues, row.claimed_by) == (2, 1, b.id)
    starts = effects(h.id, "start")
    assert [(e.attempt, e.pid) for e in starts] == [(1, a.pid), (2, b.pid)]
    assert row.result == {"run": starts[1].tag}
