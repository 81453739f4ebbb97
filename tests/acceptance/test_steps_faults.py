"""Durable steps against real worker crashes."""

from __future__ import annotations

import signal

import pytest

from tests.conftest import wait_until
from tests.leases import lapse_worker

from .conftest import effects, wait_effect, wait_exit, wait_state

pytestmark = pytest.mark.acceptance


def test_a_step_that_committed_is_skipped_by_the_run_that_replaces_a_killed_worker(
    start_worker,
):
    from django_xjobs.models import JobStep
    from tests.testapp import jobs

    handle = jobs.step_then_hang.enqueue(seconds=60)
    first = start_worker("first")
    wait_effect(handle.id, "step")  # step 1 ran...
    wait_state(handle.id, "running")
    row = jobs_row(handle)
    # The effect is written inside the step's body, before the step's row commits: wait for it.
    wait_until(lambda: JobStep.objects.filter(run_id=row.run_id, name="first",
                                              status="completed").exists(),
               message="step 'first' recorded")
    first.signal(signal.SIGKILL)  # ...and committed; then the worker dies mid-run
    wait_exit(first)

    lapse_worker(first)
    start_worker("second")
    done = wait_state(handle.id, "done", timeout=60)
    assert done.attempt == 2 and done.rescues == 1
    assert [e.tag for e in effects(handle.id, "step")] == ["first", "second"]


def jobs_row(handle):
    from django_xjobs.models import Job

    return Job.objects.get(pk=handle.id)
