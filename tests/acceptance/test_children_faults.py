"""Child jobs (ctx.step.invoke / gather) with real worker processes, under faults."""

from __future__ import annotations

import pytest

from tests.leases import lapse, lapse_worker

from .conftest import effects, wait_exit, wait_started, wait_state

pytestmark = pytest.mark.acceptance


def children(parent_id):
    from django_xjobs.models import Job

    return list(Job.objects.filter(parent_id=parent_id).order_by("id"))


def test_a_worker_killed_between_the_childs_enqueue_and_the_parents_record_makes_one_child(
    start_worker,
):
    from tests.testapp import jobs

    parent = jobs.parent_invoke.using(max_attempts=3).enqueue(n=7)
    # The parent's worker dies inside the transaction that inserted the child and was about
    # to record the step and suspend the parent: neither the child nor the record may remain.
    first = start_worker("first", faults="step:children-enqueued=exit*1")
    wait_exit(first)
    assert children(parent.id) == []
    lapse(parent.id, holder=first)
    start_worker("second")
    done = wait_state(parent.id, "done", timeout=60)
    [child] = children(parent.id)
    assert child.state == "done"
    assert done.result["got"] == {"n": 7, "square": 49}
    assert [e.tag for e in effects(child.id, "child")] == ["7"]  # the child ran once


def test_a_child_that_dies_fails_the_parents_step_after_the_childs_own_attempts(start_worker):
    from tests.testapp import jobs

    parent = jobs.parent_invoke.enqueue(n=3, fail=True)
    for worker in [start_worker(role, wait=False) for role in ("one", "two")]:
        wait_started(worker)  # started side by side
    done = wait_state(parent.id, "done", timeout=60)
    [child] = children(parent.id)
    assert (child.state, child.attempt) == ("dead", 2)
    assert len(effects(child.id, "child")) == 2
    assert done.result["state"] == "dead" and done.result["child_id"] == str(child.id)
    assert "child 3 failed" in done.result["error"]


def test_a_killed_childs_worker_is_replaced_and_the_parent_gets_the_result_once(start_worker):
    import signal

    from tests.testapp import jobs

    parent = jobs.parent_invoke.using(max_attempts=3).enqueue(n=5, seconds=3.0)
    first = start_worker("first")
    child = None
    from tests.conftest import wait_until

    child = wait_until(lambda: (c := children(parent.id)) and c[0].state == "running" and c[0],
                       message="the child to run")
    first.signal(signal.SIGKILL)
    wait_exit(first)
    assert lapse_worker(first) == [str(child.id)]  # the parent waits, suspended
    start_worker("second")
    done = wait_state(parent.id, "done", timeout=60)
    assert done.result["got"] == {"n": 5, "square": 25}
    assert wait_state(child.id, "done").rescues == 1


def deadlocks() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("select pg_stat_force_next_flush()")
        cursor.execute("select deadlocks from pg_stat_database where datname = current_database()")
        return cursor.fetchone()[0]


def test_fan_out_of_500_children_over_two_workers_returns_in_order(start_worker):
    from django_xjobs.models import JobStep
    from tests.testapp import jobs

    before = deadlocks()
    # Both workers up before the work exists: a worker started first drained all 700 children
    # before the second had started, in a CI run. Their heartbeats renew the children's leases
    # (2 s) while their batched acknowledgements settle them: neither waits on the other
    # (docs/design.md, "Lock order").
    workers = [start_worker(role, "--concurrency", "8", wait=False) for role in ("one", "two")]
    for worker in workers:
        wait_started(worker)
    parent = jobs.parent_gather.enqueue(count=500)
    # A second fan-out at the same time: the two workers' acknowledgements of children of two
    # parents must never lock the parents' step rows in opposite orders.
    other = jobs.parent_gather.enqueue(count=200)
    assert wait_state(other.id, "done", "dead", timeout=120).state == "done"
    done = wait_state(parent.id, "done", "dead", timeout=120)
    assert done.state == "done", done.last_error
    assert done.result == {"squares": [i * i for i in range(500)]}
    kids = children(parent.id)
    assert len(kids) == 500 and {k.state for k in kids} == {"done"}
    assert len({k.claimed_by for k in kids}) == 2  # both workers ran children
    step = JobStep.objects.get(run_id=done.run_id, name="fan")
    assert step.status == "completed" and step.pending == 0
    assert deadlocks() == before
