"""Debounce with real workers (docs/flow-control.md, "Debounce"): a burst of enqueues runs once
with the last input, and enqueues that arrive while that run is under way are not lost: they
yield exactly one further run, which starts only after the first one ended, even with a second
worker free to take it.

What ran is read from the Effect rows ``testapp.sleepy`` writes itself (in autocommit) at the
start and at the end of each run.
"""

from __future__ import annotations

import pytest

from tests.conftest import wait_until

from .conftest import wait_effect, wait_state

pytestmark = pytest.mark.acceptance

DRAIN = 120.0  # a generous bound on a loaded machine; not a measurement


def sleepy_runs() -> list:
    from tests.testapp.models import Effect

    return list(Effect.objects.filter(name="testapp.sleepy").order_by("at", "id"))


def test_a_burst_runs_once_with_the_last_input(start_worker):
    from django_xjobs.models import Job
    from tests.testapp.jobs import sleepy

    start_worker("a", "--concurrency", "4")
    bound = sleepy.using(idempotency_key="burst", debounce=0.5)
    handles = [bound.enqueue(seconds=0, tag=str(n)) for n in range(20)]
    assert len({h.id for h in handles}) == 1
    wait_state(handles[0].id, "done", timeout=DRAIN)
    starts = [e for e in sleepy_runs() if e.kind == "start"]
    assert [e.tag for e in starts] == ["19"]
    assert Job.objects.filter(name="testapp.sleepy").count() == 1


def test_enqueues_during_a_run_yield_exactly_one_more_run_after_it(start_worker):
    from django_xjobs.models import Job
    from tests.testapp.jobs import sleepy

    start_worker("a", "--concurrency", "4")
    start_worker("b", "--concurrency", "4")
    bound = sleepy.using(idempotency_key="report", debounce=0.2)
    first = bound.enqueue(seconds=3, tag="first")
    wait_effect(first.id, "start", timeout=DRAIN)
    assert wait_state(first.id, "running").state == "running"

    follow = bound.enqueue(seconds=0, tag="second")
    again = bound.enqueue(seconds=0, tag="third")
    assert follow.created and follow.id != first.id
    assert (again.id, again.created) == (follow.id, False)

    wait_state(first.id, "done", timeout=DRAIN)
    wait_state(follow.id, "done", timeout=DRAIN)
    wait_until(lambda: len(sleepy_runs()) >= 4, timeout=DRAIN, interval=0.1,
               message="both runs recorded")

    runs = sleepy_runs()
    assert [(e.job_id, e.kind, e.tag) for e in runs] == [
        (str(first.id), "start", "first"), (str(first.id), "end", "first"),
        (str(follow.id), "start", "third"), (str(follow.id), "end", "third"),
    ]
    # The follow-up started after the first run's last line, although a worker was free.
    assert runs[2].at >= runs[1].at
    assert Job.objects.filter(name="testapp.sleepy").count() == 2
