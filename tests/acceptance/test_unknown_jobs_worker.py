"""A new job type deployed to web before the workers (docs/deployment.md, "New job types before
their workers"): a worker that does not know the name gives the job back, no attempt spent, and
reports the wait once it passes its bound; a worker that knows the name then runs it."""

from __future__ import annotations

import pytest

from .conftest import job_row, wait_given_back, wait_log, wait_state

pytestmark = pytest.mark.acceptance

NAME = "testapp.arrives_late"
# Short waits so a test sees two give-backs and the report: the cap on the backoff, and the
# bound after which the wait is reported.
SHORT = {"UNKNOWN_JOB_RETRY_MAX": "0.5s", "UNKNOWN_JOB_REPORT_AFTER": "1s"}


def test_an_old_worker_gives_a_new_job_type_back_and_a_new_worker_runs_it(start_worker):
    from django_xjobs import why
    from django_xjobs.models import Job

    row = Job.objects.create(name=NAME, idempotency_key="late-1", max_attempts=1,
                             input={"n": 21})
    old = start_worker("old", settings=SHORT)

    waiting = wait_given_back(row.id, tries=2)
    assert waiting.state in ("ready", "delayed") and waiting.attempt == 0  # max_attempts=1
    assert "UnknownJob: no job named 'testapp.arrives_late'" in waiting.last_error
    assert "the jobs.py of app 'testapp'" in waiting.last_error
    texts = [r.text for r in why.for_job(row.id) if r.kind == "unknown_job"]
    assert texts and f"workers {old.id} do not know it" in texts[0]

    logged = wait_log(old, "have waited since")  # the report past UNKNOWN_JOB_REPORT_AFTER
    assert f"job(s) named '{NAME}' on queue 'default'" in logged
    assert job_row(row.id).state != "dead"

    # The new code reaches the workers: one that knows the name runs it, beside the old one.
    new = start_worker("new", settings=SHORT, env={"XJOBS_TEST_LATE_JOBS": "1"})
    done = wait_state(row.id, "done", "dead")
    assert (done.state, done.attempt, done.claimed_by, done.result) == ("done", 1, new.id, 42)
