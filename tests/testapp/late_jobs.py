"""A job type that reaches the workers after the code that enqueues it
(tests/acceptance/test_unknown_jobs_worker.py): imported by ``TestAppConfig.ready`` only in a
worker started with ``XJOBS_TEST_LATE_JOBS`` set, so every other worker does not know it."""

from __future__ import annotations

from django_xjobs import job

ENV = "XJOBS_TEST_LATE_JOBS"


@job(name="testapp.arrives_late")
def arrives_late(ctx, n: int) -> int:
    return n * 2
