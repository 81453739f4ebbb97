"""Worker recycling in the real worker loop, in this process (worker/recycling.py): where the
loop's own decisions are seen, a bound reached and a stop during the drain. The processes
around it (the supervisor, a fresh process): tests/acceptance/test_worker_recycling.py."""

from __future__ import annotations

import threading

import pytest

from django_xjobs.worker.loop import Worker
from django_xjobs.worker.options import WorkerOptions
from tests.conftest import wait_until
from tests.testapp import jobs
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


def _worker(**options) -> Worker:
    return Worker(WorkerOptions.from_settings(install_signals=False, notify=False, duties=(),
                                              **options))


def test_a_worker_at_its_job_bound_leaves_without_claiming_a_job_past_it():
    """Room for 10 runs, a bound of 2: it claims 2, settles them and leaves; the third job was
    never claimed, so nothing was handed back."""
    handles = [jobs.record.enqueue(tag=str(i)) for i in range(3)]
    worker = _worker(concurrency=5, prefetch=5, max_jobs_per_process=2)
    worker.run()

    assert worker.recycled == "recycling after 2 jobs"
    rows = sorted((h.get() for h in handles), key=lambda row: row.state)
    assert [(r.state, r.attempt) for r in rows] == [("done", 1), ("done", 1), ("ready", 0)]
    assert (rows[2].claimed_by, rows[2].attempts) == (None, [])
    assert worker.stats["claimed"] == 2


def test_a_stop_during_a_recycles_drain_is_an_ordinary_stop():
    """Over its memory bound (1 MiB: any process is) after a job, the worker drains with no
    grace period; a stop then gives its running job the grace period, after which the job is
    handed back without spending an attempt, and the worker no longer counts as recycled."""
    slow = jobs.sleepy_polite.enqueue(seconds=60)
    worker = _worker(concurrency=2, prefetch=0, max_memory=1, shutdown_grace=0.1)
    loop = threading.Thread(target=worker.run, name="test-worker")
    loop.start()
    try:
        wait_until(lambda: Effect.objects.filter(job_id=str(slow.id), kind="start").exists(),
                   message="the slow job to start")
        quick = jobs.record.enqueue(tag="quick")
        wait_until(lambda: worker.recycled, message="the recycle")
        assert worker.recycled.startswith("recycling: RSS ")
        assert quick.get().state == "done"
        assert slow.get().state == "running"  # going fine: the recycle does not stop it

        worker.stop("test stop")
    finally:
        loop.join(timeout=30)
    assert not loop.is_alive()
    assert worker.recycled is None
    row = slow.get()
    assert (row.state, row.attempt) == ("ready", 0)
    assert "shut down" in (row.last_error or "")
