"""A real ``xjobs_worker`` claims a batch, on two queues, holding jobs whose input PostgreSQL
accepts but Python's ``json`` module cannot decode: those go ``dead`` at once, with a clear
error and one attempt; every other job of the batch runs.

The bad inputs are written by SQL after the enqueue (``tests/console_data.undecodable``).
"""

from __future__ import annotations

import pytest

from tests.console_data import DEEP_ARRAY_SQL, HUGE_INT_SQL, undecodable

from .conftest import FAST, wait_exit

pytestmark = pytest.mark.acceptance


def _row(job_id) -> dict:
    """Read without decoding the row's JSON (the ORM would, and fail on these rows)."""
    from django_xjobs.models import Job

    return Job.objects.filter(id=job_id).values(
        "state", "attempt", "last_error", "rescues", "worker_ids").get()


def test_a_worker_runs_the_batch_and_buries_the_rows_it_cannot_decode_at_once(spawn_worker):
    from tests.testapp import jobs

    good = [jobs.record.enqueue(tag="a"), jobs.on_other_queue.enqueue(),
            jobs.async_record.enqueue(tag="b"), jobs.record.enqueue(tag="c"),
            jobs.on_other_queue.enqueue()]
    huge, deep, huge_async = (jobs.record.enqueue(tag="bad"), jobs.on_other_queue.enqueue(),
                              jobs.async_record.enqueue(tag="bad"))
    undecodable("x_jobs", huge.id, input=HUGE_INT_SQL)
    undecodable("x_jobs", deep.id, input=DEEP_ARRAY_SQL)
    undecodable("x_jobs", huge_async.id, input=HUGE_INT_SQL)

    # One claim takes everything: room for all eight jobs, on both queues.
    worker = spawn_worker("--burst", "--queue", "default", "other", "--concurrency", "4",
                          "--prefetch", "8", settings=FAST)

    assert wait_exit(worker) == 0, worker.log()
    assert [_row(h.id)["state"] for h in good] == ["done"] * len(good), worker.log()
    for handle, why in ((huge, "Exceeds the limit (4300 digits) for integer string conversion"),
                        (deep, "nested too deeply for Python's json module"),
                        (huge_async, "Exceeds the limit (4300 digits)")):
        row = _row(handle.id)
        assert (row["state"], row["attempt"], row["rescues"]) == ("dead", 1, 0), row
        assert row["last_error"].startswith(f"input cannot be decoded: {why}"), row
        assert len(row["worker_ids"]) == 1
    assert "claim failed" not in worker.log()
