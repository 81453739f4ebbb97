"""Several real worker processes sharing one queue: every job runs exactly once."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.conftest import wait_until

pytestmark = pytest.mark.acceptance

N = 300


def test_two_workers_drain_the_queue_and_run_every_job_exactly_once(start_worker):
    from django_xjobs.models import Job
    from tests.testapp.jobs import record
    from tests.testapp.models import Effect

    # Concurrency 2 keeps each claim small (2 + prefetch), so the two workers take turns.
    a = start_worker("a", "--concurrency", "2", "--prefetch", "4")
    b = start_worker("b", "--concurrency", "2", "--prefetch", "4")
    handles = record.bulk_enqueue([{"tag": str(i)} for i in range(N)])
    ids = {str(h.id) for h in handles}
    assert len(ids) == N

    wait_until(lambda: Job.objects.filter(state="done").count() == N, timeout=60,
               message=f"all {N} jobs done")

    jobs = list(Job.objects.all())
    assert {str(j.id) for j in jobs} == ids
    assert all(j.state == "done" and j.attempt == 1 and j.rescues == 0 for j in jobs)
    assert all(j.result == {"tag": j.input["tag"], "attempt": 1} for j in jobs)
    # Exactly once: one execution per job, as the jobs themselves recorded it.
    runs = Counter(Effect.objects.filter(kind="start").values_list("job_id", flat=True))
    assert set(runs) == ids
    assert set(runs.values()) == {1}
    # Both workers took part, and nobody else did.
    by_worker = Counter(j.claimed_by for j in jobs)
    assert set(by_worker) == {a.id, b.id}, by_worker
    pids = set(Effect.objects.values_list("pid", flat=True))
    assert pids == {a.pid, b.pid}
