"""``XJOBS["MAX_PAYLOAD_BYTES"]`` bounds what a run stores too: a job's result and a step's
output, with a clear error (docs/guide.md), through the real worker loop (``testing.drain``)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from django_xjobs.models import Job, JobStep
from django_xjobs.testing import drain, travel
from tests.testapp import jobs
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)

LIMIT = 1000


@pytest.fixture(autouse=True)
def small_limit(settings):
    settings.XJOBS = {**settings.XJOBS, "MAX_PAYLOAD_BYTES": LIMIT}


def row(handle) -> Job:
    return Job.objects.get(pk=handle.id)


def ran(handle, tag: str) -> int:
    return Effect.objects.filter(job_id=str(handle.id), kind="step", tag=tag).count()


def test_a_result_over_the_limit_buries_the_job_with_an_error_naming_its_size_and_the_setting():
    small = jobs.big_result.enqueue(size=LIMIT - 100)
    big = jobs.big_result.enqueue(size=LIMIT)  # {"blob": "x...x"}: 11 bytes more
    drain()

    assert (row(small).state, row(small).result) == ("done", {"blob": "x" * (LIMIT - 100)})
    buried = row(big)
    assert (buried.state, buried.attempt, buried.result) == ("dead", 1, None)  # not retried
    assert (f"result of testapp.big_result is {LIMIT + 11} bytes as JSON, over "
            f"XJOBS['MAX_PAYLOAD_BYTES'] = {LIMIT}") in buried.last_error


def test_a_step_output_over_the_limit_fails_the_step_and_the_job_retries_by_its_policy():
    handle = jobs.big_step_output.enqueue(size=LIMIT)
    drain()
    travel(timedelta(hours=1))  # the retry's backoff, if the first drain did not reach it
    drain()
    last = row(handle)
    assert (last.state, last.attempt, last.result) == ("dead", 2, None)  # max_attempts=2
    error = (f"output of step 'fetch' is {LIMIT + 11} bytes as JSON, over "
             f"XJOBS['MAX_PAYLOAD_BYTES'] = {LIMIT}")
    assert "StepOutputTooLarge" in last.last_error and error in last.last_error
    step = JobStep.objects.get(run_id=last.run_id, name="fetch")
    assert (step.status, step.attempts, step.output) == ("failed", 2, None)
    assert error in step.error
    # The step before it completed once; the too-large step ran on each attempt, stored nothing.
    assert (ran(handle, "small"), ran(handle, "fetch")) == (1, 2)


def test_a_step_output_within_the_limit_is_stored():
    handle = jobs.big_step_output.enqueue(size=LIMIT - 100)
    drain()
    done = row(handle)
    assert (done.state, done.result) == ("done", {"size": LIMIT - 100})
    step = JobStep.objects.get(run_id=done.run_id, name="fetch")
    assert (step.status, step.output) == ("completed", {"blob": "x" * (LIMIT - 100)})
