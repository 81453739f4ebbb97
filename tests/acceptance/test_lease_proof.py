"""A run proves its lease before it starts a body (docs/guarantees.md), against real pauses.

The worker under test stops itself (SIGSTOP, through a fault point) at an exact moment: right
after a step's output committed, or right after a claim returned. Another worker takes the job
over once the lease lapses and finishes it; then the stopped worker is resumed. Its watch thread
is held off for the whole test (a fault makes its first round sleep), so what keeps the resumed
worker from starting a body is the run's own proof, not the watch thread winning a race
against the resumed thread.

The worker under test runs a real short lease, which lapses by the clock while it is stopped
(not on demand, tests/leases.py): the proof is the worker's own count of its lease's age, so
the lease must really have run out by the time it resumes.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.conftest import wait_until

from .conftest import SHORT_LEASE, effects, job_row, wait_effect, wait_log, wait_state

pytestmark = pytest.mark.acceptance

# The watch thread's first round sleeps longer than any of these tests lasts.
HOLD_WATCH = "worker:watch=sleep:120*1"
DISCARDED = "result discarded, this run no longer owns the job"


def stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP): its state in /proc is 'T'."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] == "T"


@pytest.mark.parametrize("name", ["two_steps", "async_two_steps"])
def test_a_worker_resumed_after_its_job_moved_on_does_not_run_the_next_step_again(
        start_worker, name):
    from django_xjobs.models import JobStep
    from tests.testapp import jobs

    handle = getattr(jobs, name).enqueue()
    a = start_worker("a", "--concurrency", "1", settings=SHORT_LEASE,
                     faults=f"after:step_complete_if_owned=stop*1;{HOLD_WATCH}")
    # Step "first" ran and its output committed; then a stopped itself, before step "second".
    wait_until(lambda: stopped(a.pid), message="worker a to stop after step 'first'")
    try:
        row = job_row(handle.id)
        assert JobStep.objects.filter(run_id=row.run_id, name="first",
                                      status="completed").exists()
        assert [e.tag for e in effects(handle.id, "step")] == ["first"]

        b = start_worker("b", "--concurrency", "1")
        done = wait_state(handle.id, "done", "dead")
        assert (done.state, done.claimed_by, done.attempt, done.rescues) == ("done", b.id, 2, 1)
        assert done.result == {"attempt": 2}
        wait_effect(handle.id, "exit")  # b's run is through
    finally:
        os.kill(a.pid, signal.SIGCONT)

    # a's run goes on from where it stopped, and is through with the code at its "exit".
    wait_effect(handle.id, "exit", count=2)
    wait_log(a, DISCARDED)
    steps = [(e.tag, e.pid, e.attempt) for e in effects(handle.id, "step")]
    # Step "second" ran once, in b's run; a's resumed run did not start it again.
    assert steps == [("first", a.pid, 1), ("second", b.pid, 2)]
    after = job_row(handle.id)
    assert (after.state, after.result, after.claimed_by, after.lease_token, after.updated_at) == (
        done.state, done.result, done.claimed_by, done.lease_token, done.updated_at)
    assert a.proc.poll() is None and b.proc.poll() is None


@pytest.mark.parametrize("name", ["record", "async_record_effect"])
def test_a_worker_resumed_after_its_claim_lapsed_does_not_start_the_job(start_worker, name):
    from tests.testapp import jobs

    handle = getattr(jobs, name).enqueue(tag="once")
    a = start_worker("a", "--concurrency", "1", settings=SHORT_LEASE,
                     faults=f"after:jobs_claim=stop*1;{HOLD_WATCH}")
    # a claimed the job and stopped before starting it.
    wait_until(lambda: stopped(a.pid), message="worker a to stop after its claim")
    try:
        assert (job_row(handle.id).state, job_row(handle.id).claimed_by) == ("running", a.id)
        assert effects(handle.id) == []

        b = start_worker("b", "--concurrency", "1")
        done = wait_state(handle.id, "done", "dead")
        assert (done.state, done.claimed_by, done.attempt, done.rescues) == ("done", b.id, 2, 1)
    finally:
        os.kill(a.pid, signal.SIGCONT)

    # a settles the claim it could not prove: handed back, fenced off (b's run owns the job).
    wait_log(a, DISCARDED)
    assert [(e.pid, e.attempt) for e in effects(handle.id, "start")] == [(b.pid, 2)]
    after = job_row(handle.id)
    assert (after.state, after.result, after.claimed_by, after.updated_at) == (
        done.state, done.result, done.claimed_by, done.updated_at)
    assert a.proc.poll() is None and b.proc.poll() is None
