"""Idempotency windows against a real worker (docs/durable.md, "Idempotency windows"): sixteen
threads, each on its own connection, enqueue one key with a short window over and over while a
worker subprocess runs and finishes its jobs, so enqueues race the acks that close a window and
each other at the moment a window ends. The invariant is read from the rows afterwards: one
job per window, never two: each job of the key was created (its transaction's now()) no sooner
than the window after the previous one finished.
"""

from __future__ import annotations

import itertools
import time
from datetime import timedelta

import pytest

from tests.conftest import in_threads, wait_until

pytestmark = pytest.mark.acceptance

WINDOW = timedelta(milliseconds=300)
RACE_FOR = 8.0  # how long the threads keep enqueueing; not a measurement
SETTLE = 60.0


def test_sixteen_threads_racing_a_worker_make_one_job_per_window(start_worker):
    from django_xjobs.models import Job, JobKey
    from tests.testapp.jobs import record

    start_worker("a", "--concurrency", "4")
    key = "race:window"
    stop = time.monotonic() + RACE_FOR
    seen: list = []

    def enqueuer() -> None:
        bound = record.using(idempotency_key=key, unique_for=WINDOW)
        while time.monotonic() < stop:
            seen.append(bound.enqueue(tag="race").id)

    in_threads(enqueuer)

    def all_finished():
        rows = list(Job.objects.filter(name="testapp.record", idempotency_key=key))
        return rows if all(r.state == "done" for r in rows) else None

    jobs = sorted(wait_until(all_finished, timeout=SETTLE, interval=0.1,
                             message="every job of the key done"),
                  key=lambda r: r.created_at)
    # Several windows went by, so the test did race window ends, not only one live job.
    assert len(jobs) >= 2, len(jobs)
    for previous, job in itertools.pairwise(jobs):
        assert job.created_at >= previous.finished_at + WINDOW, (previous.id, job.id)
    # Every answer named one of these jobs, and the key's row names the newest.
    assert set(seen) == {j.id for j in jobs}
    assert JobKey.objects.get(name="testapp.record", key=key).job_id == jobs[-1].id
