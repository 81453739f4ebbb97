"""The engine operations behind django_xjobs.testing: the inline mode's claim of one job
(``job_claim_if_due``), travel's shift of due times (``jobs_shift_due``) and the listing of
enqueued_jobs / assert_enqueued (``jobs_list``)."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from django.db import transaction

from django_xjobs.models import Job, JobStep
from django_xjobs.records import Completion, Suspension

from .conftest import (
    LONG_LEASE_MS,
    claim,
    claim_one,
    closing_connections,
    enqueue,
    make_row,
)

pytestmark = pytest.mark.django_db


def claim_if_due(engine, job_id, *, worker: str = "inline-1", lease_ms: int = LONG_LEASE_MS):
    return engine.job_claim_if_due(str(job_id), worker_id=worker, lease_ms=lease_ms)


# ------------------------------------------------------------------------ job_claim_if_due --


def test_claim_if_due_writes_what_the_queue_claim_writes(engine):
    by_queue = enqueue(engine, queue="q-a", input={"n": 1}, max_attempts=4)
    by_id = enqueue(engine, queue="q-b", input={"n": 1}, max_attempts=4)

    [a] = claim(engine, "q-a", worker="w")
    b = claim_if_due(engine, by_id.id, worker="w")

    assert b is not None
    assert (b.id, b.queue, b.name) == (str(by_id.id), "q-b", a.name)
    assert (b.attempt, b.max_attempts, b.input, b.resumed) == (
        a.attempt, a.max_attempts, a.input, a.resumed) == (1, 4, {"n": 1}, False)
    assert b.lease_token and b.lease_token != a.lease_token
    row_a, row_b = engine.job_get(str(by_queue.id)), engine.job_get(str(by_id.id))
    for field in ("state", "attempt", "claimed_by", "worker_ids", "rescues"):
        assert getattr(row_b, field) == getattr(row_a, field), field
    assert row_b.state == "running" and row_b.worker_ids == ["w"]
    assert str(row_b.lease_token) == b.lease_token
    assert row_b.started_at is not None
    assert row_b.visible_at - row_b.started_at == timedelta(milliseconds=LONG_LEASE_MS)
    # The token fences the run's writes as a worker's.
    assert engine.jobs_complete_if_owned([Completion(claim=b.claim,
                                                     result_json="7")]).owned == {b.lease_token}
    assert engine.job_get(b.id).state == "done"


def test_claim_if_due_takes_that_job_only_and_only_while_waiting_and_due(engine):
    now = engine.db_now()
    past, future = now - timedelta(minutes=5), now + timedelta(minutes=5)
    due = [
        make_row(engine, state="ready", run_at=past),
        make_row(engine, state="delayed", run_at=past),
        make_row(engine, state="suspended", run_at=past),
    ]
    not_due = [
        make_row(engine, state="ready", run_at=future),
        make_row(engine, state="delayed", run_at=future),
        make_row(engine, state="suspended", run_at=future),
        make_row(engine, state="running", visible_at=past),  # lapsed: the queue claim's business
        make_row(engine, state="running", visible_at=future),
        make_row(engine, state="done", run_at=past),
        make_row(engine, state="dead", run_at=past),
        make_row(engine, state="cancelled", run_at=past),
    ]
    for row in not_due:
        before = Job.objects.get(id=row.id)
        assert claim_if_due(engine, row.id) is None, row.state
        after = Job.objects.get(id=row.id)
        assert (after.state, after.attempt, after.lease_token, after.updated_at) == (
            before.state, before.attempt, before.lease_token, before.updated_at)
    for n, row in enumerate(due, start=1):
        claimed = claim_if_due(engine, row.id)
        assert claimed is not None and claimed.id == str(row.id)
        assert Job.objects.get(id=row.id).state == "running"
        # Only this one: the other due rows wait for their own claim.
        assert Job.objects.filter(id__in=[r.id for r in due], state="running").count() == n
    assert claim_if_due(engine, uuid.uuid4()) is None
    assert engine.job_claim_if_due("not-a-uuid", worker_id="w", lease_ms=1000) is None


def test_claim_if_due_resumes_a_suspended_job_without_counting_an_attempt(engine):
    enqueue(engine, max_attempts=5)
    first = claim_one(engine, worker="w1")
    engine.job_suspend_if_owned(Suspension(claim=first.claim,
                                           wake_at=engine.db_now() - timedelta(seconds=1)))

    resumed = claim_if_due(engine, first.id, worker="inline")

    assert resumed is not None and resumed.resumed is True
    assert resumed.attempt == first.attempt == 1
    assert resumed.lease_token != first.lease_token
    row = engine.job_get(first.id)
    assert (row.state, row.attempt, row.claimed_by, row.worker_ids) == (
        "running", 1, "inline", ["w1"])


@pytest.mark.django_db(transaction=True)
def test_claim_if_due_skips_a_row_another_session_locks(engine):
    if not engine.features.skip_locked:
        pytest.skip("engine does not skip locked rows")
    row = make_row(engine)
    locked, release, gave_up = threading.Event(), threading.Event(), threading.Event()

    @closing_connections
    def hold_lock():
        with transaction.atomic():
            list(Job.objects.select_for_update().filter(id=row.id))
            locked.set()
            if not release.wait(timeout=20):
                gave_up.set()

    with ThreadPoolExecutor(max_workers=1) as pool:
        holder = pool.submit(hold_lock)
        assert locked.wait(timeout=20)
        try:
            claimed = claim_if_due(engine, row.id)
            assert not gave_up.is_set(), "the claim waited for the row lock"
        finally:
            release.set()
            holder.result(timeout=30)

    assert claimed is None
    assert claim_if_due(engine, row.id) is not None


# -------------------------------------------------------------------------- jobs_shift_due --


def test_shift_due_moves_every_waiting_job_by_the_shift_and_leaves_the_rest(engine):
    now = engine.db_now()
    waiting = [
        make_row(engine, state="ready", run_at=now - timedelta(minutes=1)),
        make_row(engine, state="delayed", run_at=now + timedelta(minutes=30)),
        make_row(engine, state="suspended", run_at=now + timedelta(hours=2)),
    ]
    others = [
        make_row(engine, state="running", visible_at=now + timedelta(minutes=5)),
        make_row(engine, state="done"),
        make_row(engine, state="dead"),
        make_row(engine, state="cancelled"),
    ]
    before = {r.id: Job.objects.get(id=r.id) for r in waiting + others}

    assert engine.jobs_shift_due(3_600_000) == len(waiting)

    for row in waiting:
        assert Job.objects.get(id=row.id).run_at == before[row.id].run_at - timedelta(hours=1)
    for row in others:
        after = Job.objects.get(id=row.id)
        assert (after.run_at, after.visible_at, after.state, after.updated_at) == (
            before[row.id].run_at, before[row.id].visible_at, before[row.id].state,
            before[row.id].updated_at)
    # The delayed job is due now; the suspended one, two hours out, is not yet.
    assert {c.id for c in claim(engine, n=10)} == {str(waiting[0].id), str(waiting[1].id)}
    assert engine.jobs_shift_due(0) == 1


def test_shift_due_moves_the_open_waits_of_the_moved_jobs_only(engine):
    enqueue(engine)
    job = claim_one(engine)
    owner = _owner(job)
    nap = engine.step_park_if_owned(owner, "nap", status="sleeping", duration_ms=3_600_000)
    wait = engine.step_park_if_owned(owner, "paid", status="waiting", duration_ms=7_200_000,
                                     event="order.paid")
    assert engine.step_complete_if_owned(owner, "done-step", '"x"')
    engine.job_suspend_if_owned(Suspension(claim=job.claim,
                                           wake_at=nap.wake_at))
    enqueue(engine, queue="q-run")
    running = claim_one(engine, "q-run")
    running_nap = engine.step_park_if_owned(_owner(running), "nap", status="sleeping",
                                            duration_ms=3_600_000)

    assert engine.jobs_shift_due(3_600_000) == 1

    steps = {s.name: s for s in engine.steps_of_run(job.run_id)}
    assert steps["nap"].wake_at == nap.wake_at - timedelta(hours=1)
    assert steps["nap"].due is True
    assert steps["paid"].wake_at == wait.wake_at - timedelta(hours=1)
    assert steps["paid"].due is False
    assert steps["paid"].started_at == wait.started_at  # events after the start still count
    assert steps["done-step"].wake_at is None
    [other] = engine.steps_of_run(running.run_id)
    assert other.wake_at == running_nap.wake_at
    assert JobStep.objects.count() == 4
    resumed = claim_one(engine)
    assert (resumed.id, resumed.resumed) == (job.id, True)


def _owner(job):
    from django_xjobs.records import RunOwner

    return RunOwner(claim=job.claim, run_id=job.run_id)


# ------------------------------------------------------------------------------- jobs_list --


def test_jobs_list_filters_by_name_queue_states_and_tenant_oldest_first(engine):
    now = engine.db_now()
    a = make_row(engine, name="app.a", queue="q1", tenant_id="t1",
                 created_at=now - timedelta(minutes=3))
    b = make_row(engine, name="app.a", queue="q2", state="done",
                 created_at=now - timedelta(minutes=2))
    c = make_row(engine, name="app.b", queue="q1", tenant_id="t2", state="delayed",
                 created_at=now - timedelta(minutes=1))

    def ids(**filters):
        return [str(r.id) for r in engine.jobs_list(**filters)]

    assert ids() == [str(a.id), str(b.id), str(c.id)]
    assert ids(name="app.a") == [str(a.id), str(b.id)]
    assert ids(queue="q1") == [str(a.id), str(c.id)]
    assert ids(states=["done", "delayed"]) == [str(b.id), str(c.id)]
    assert ids(states=[]) == []
    assert ids(tenant_id="t2") == [str(c.id)]
    assert ids(name="app.a", queue="q1", states=["ready"], tenant_id="t1") == [str(a.id)]
    assert ids(name="app.nope") == []
    assert ids(limit=2) == [str(a.id), str(b.id)]
    [record] = engine.jobs_list(name="app.b")
    assert (record.name, record.queue, record.state, record.tenant_id) == (
        "app.b", "q1", "delayed", "t2")
    assert record == engine.job_get(str(c.id))
