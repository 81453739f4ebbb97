"""Claim: which rows are eligible, how many, in which order, and what a claim writes."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from django.db import connection, transaction

from django_xjobs.models import Job
from django_xjobs.records import Failure, Requeue, Suspension

from .conftest import (
    LONG_LEASE_MS,
    claim,
    claim_one,
    closing_connections,
    enqueue,
    make_row,
    wait_lapsed,
)


def ids(claimed) -> set[str]:
    return {c.id for c in claimed}


# ---------------------------------------------------------------------------- eligibility --


@pytest.mark.django_db
def test_claim_takes_only_due_waiting_rows_and_lapsed_running_rows(engine):
    now = engine.db_now()
    past, future = now - timedelta(minutes=5), now + timedelta(minutes=5)
    eligible = {
        make_row(engine, state="ready", run_at=past),
        make_row(engine, state="ready", run_at=now),  # due exactly now
        make_row(engine, state="delayed", run_at=past),
        make_row(engine, state="suspended", run_at=past),
        make_row(engine, state="running", visible_at=past),  # lease lapsed
    }
    not_eligible = {
        make_row(engine, state="ready", run_at=future),
        make_row(engine, state="delayed", run_at=future),
        make_row(engine, state="suspended", run_at=future),
        make_row(engine, state="running", visible_at=future),  # lease still held
        make_row(engine, state="done", run_at=past),
        make_row(engine, state="dead", run_at=past),
        make_row(engine, state="cancelled", run_at=past),
    }

    claimed = claim(engine, n=100)

    assert ids(claimed) == {str(r.id) for r in eligible}
    assert len(claimed) == len(eligible)
    for row in not_eligible:
        fresh = Job.objects.get(id=row.id)
        assert (fresh.state, fresh.lease_token, fresh.attempt) == (
            row.state, row.lease_token, row.attempt
        )


@pytest.mark.django_db
@pytest.mark.parametrize("finished", ["done", "dead", "cancelled"])
def test_a_finished_job_is_never_claimed_whatever_its_times_say(engine, finished):
    past = engine.db_now() - timedelta(hours=1)
    row = make_row(engine, state=finished, run_at=past, visible_at=past)

    assert claim(engine, n=10) == []
    assert Job.objects.get(id=row.id).state == finished


@pytest.mark.django_db
def test_claim_takes_only_the_queues_it_asks_for(engine):
    mine = make_row(engine, queue="mine")
    make_row(engine, queue="theirs")
    make_row(engine, queue="theirs", state="running",
             visible_at=engine.db_now() - timedelta(minutes=1))

    claimed = engine.jobs_claim(wants={"mine": 10}, worker_id="w", lease_ms=LONG_LEASE_MS)

    assert ids(claimed) == {str(mine.id)}
    assert claimed[0].queue == "mine"
    assert Job.objects.filter(queue="theirs", state="ready").count() == 1


@pytest.mark.django_db
def test_claim_takes_at_most_the_asked_number_per_queue(engine):
    for _ in range(5):
        make_row(engine, queue="a")
        make_row(engine, queue="b")
        make_row(engine, queue="c")

    claimed = engine.jobs_claim(wants={"a": 2, "b": 3, "c": 0}, worker_id="w",
                                lease_ms=LONG_LEASE_MS)

    by_queue = {q: sum(c.queue == q for c in claimed) for q in ("a", "b", "c")}
    assert by_queue == {"a": 2, "b": 3, "c": 0}
    assert Job.objects.filter(state="running").count() == 5


@pytest.mark.django_db
def test_lapsed_rows_count_towards_the_asked_number(engine):
    lapsed_at = engine.db_now() - timedelta(minutes=1)
    for _ in range(3):
        make_row(engine, state="running", visible_at=lapsed_at)
        make_row(engine)

    claimed = claim(engine, n=4)

    assert len(claimed) == 4
    assert len(claim(engine, n=4)) == 2
    assert claim(engine, n=4) == []


@pytest.mark.django_db
def test_an_empty_or_zero_wish_claims_nothing(engine):
    make_row(engine)

    assert engine.jobs_claim(wants={}, worker_id="w", lease_ms=LONG_LEASE_MS) == []
    assert engine.jobs_claim(wants={"default": 0}, worker_id="w", lease_ms=LONG_LEASE_MS) == []
    assert Job.objects.get().state == "ready"


# ---------------------------------------------------------------------------------- order --


@pytest.mark.django_db
def test_claim_order_is_priority_first_then_run_at(engine):
    now = engine.db_now()
    rows = {
        "p0-old": make_row(engine, priority=0, run_at=now - timedelta(hours=3)),
        "p5-new": make_row(engine, priority=5, run_at=now - timedelta(hours=1)),
        "p5-old": make_row(engine, priority=5, run_at=now - timedelta(hours=2)),
        "p-1-oldest": make_row(engine, priority=-1, run_at=now - timedelta(hours=9)),
        "p9-future": make_row(engine, priority=9, run_at=now + timedelta(hours=1)),
        "p0-new": make_row(engine, priority=0, run_at=now - timedelta(minutes=1),
                           state="suspended"),
    }
    label = {str(row.id): name for name, row in rows.items()}

    order = []
    while claimed := claim(engine, n=1):
        order.append(label[claimed[0].id])

    assert order == ["p5-old", "p5-new", "p0-old", "p0-new", "p-1-oldest"]


@pytest.mark.django_db
def test_a_partial_claim_takes_the_highest_priorities(engine):
    now = engine.db_now()
    low = [make_row(engine, priority=0, run_at=now - timedelta(hours=5)) for _ in range(4)]
    high = [make_row(engine, priority=10, run_at=now - timedelta(minutes=1)) for _ in range(2)]

    claimed = claim(engine, n=3)

    assert ids(claimed) >= {str(r.id) for r in high}
    assert len(ids(claimed) & {str(r.id) for r in low}) == 1


@pytest.mark.django_db
def test_a_lapsed_lease_in_the_batch_does_not_let_a_lower_priority_job_pass_a_higher_one(engine):
    now = engine.db_now()
    make_row(engine, state="running", visible_at=now - timedelta(minutes=1))
    urgent = make_row(engine, priority=10, run_at=now - timedelta(minutes=1))
    make_row(engine, priority=0, run_at=now - timedelta(hours=1))

    claimed = claim(engine, n=2)

    assert len(claimed) == 2
    assert str(urgent.id) in ids(claimed), (
        "a lower-priority due job was claimed while a higher-priority one was left waiting"
    )


# ------------------------------------------------------------------------------ skip locked --


@pytest.mark.django_db(transaction=True)
def test_a_row_locked_by_another_session_is_skipped_not_waited_for(engine):
    if not engine.features.skip_locked:
        pytest.skip("engine does not skip locked rows")
    locked_due = make_row(engine, priority=10)
    locked_lapsed = make_row(engine, state="running",
                             visible_at=engine.db_now() - timedelta(minutes=1))
    free = make_row(engine)
    locked, release, gave_up = threading.Event(), threading.Event(), threading.Event()

    @closing_connections
    def hold_locks():
        with transaction.atomic():
            list(Job.objects.select_for_update().filter(id__in=[locked_due.id,
                                                                locked_lapsed.id]))
            locked.set()
            if not release.wait(timeout=20):
                gave_up.set()  # set before the commit that would let a waiting claim go on

    with ThreadPoolExecutor(max_workers=1) as pool:
        holder = pool.submit(hold_locks)
        assert locked.wait(timeout=20)
        try:
            claimed = claim(engine, n=10)
            # The claim came back while the other session still held its locks.
            assert not gave_up.is_set(), "the claim waited for the row locks"
        finally:
            release.set()
            holder.result(timeout=30)

    assert ids(claimed) == {str(free.id)}
    assert Job.objects.get(id=locked_due.id).state == "ready"
    assert ids(claim(engine, n=10)) == {str(locked_due.id), str(locked_lapsed.id)}


@pytest.mark.django_db(transaction=True)
def test_concurrent_claims_never_hand_out_one_job_twice(engine):
    rows = {str(make_row(engine).id) for _ in range(24)}
    claimers = 4
    barrier = threading.Barrier(claimers)

    @closing_connections
    def claim_all(worker: str) -> list[str]:
        connection.ensure_connection()
        barrier.wait(timeout=30)
        got: list[str] = []
        while batch := claim(engine, n=3, worker=worker):
            got.extend(c.id for c in batch)
        return got

    with ThreadPoolExecutor(max_workers=claimers) as pool:
        futures = [pool.submit(claim_all, f"worker-{i}") for i in range(claimers)]
        results = [f.result(timeout=60) for f in futures]

    everything = [job_id for got in results for job_id in got]
    assert len(everything) == len(set(everything)), "a job was claimed twice"
    assert set(everything) == rows
    assert Job.objects.filter(state="running", attempt=1).count() == len(rows)


@pytest.mark.django_db
def test_a_claim_is_one_statement(engine, django_assert_num_queries):
    for queue in ("a", "b"):
        for _ in range(3):
            make_row(engine, queue=queue)

    with django_assert_num_queries(1):
        claimed = engine.jobs_claim(wants={"a": 5, "b": 5}, worker_id="w",
                                    lease_ms=LONG_LEASE_MS)
    assert len(claimed) == 6


# --------------------------------------------------------------------------- what it writes --


@pytest.mark.django_db
def test_a_claim_leases_the_job_to_the_worker(engine):
    result = enqueue(engine, input={"x": 1}, tenant="acme", max_attempts=4)
    before = engine.db_now()

    job = claim_one(engine, worker="worker-7", lease_ms=LONG_LEASE_MS)

    assert job.id == str(result.id)
    assert job.run_id == str(result.run_id)
    assert job.input == {"x": 1}
    assert job.tenant_id == "acme"
    assert (job.attempt, job.max_attempts, job.resumed) == (1, 4, False)
    record = engine.job_get(job.id)
    assert record.state == "running"
    assert record.claimed_by == "worker-7"
    assert str(record.lease_token) == job.lease_token
    assert before + timedelta(seconds=59) <= record.visible_at <= before + timedelta(seconds=65)


@pytest.mark.django_db
def test_each_job_of_a_claimed_batch_gets_its_own_input_whatever_its_json(engine):
    # The PostgreSQL engine decodes a batch's inputs in one go, and each row alone when that
    # cannot hold (an input that is a JSON string): either way every job gets its own input.
    def objects(n: int) -> dict[str, object]:
        return {str(enqueue(engine, input={"i": i, "s": "x" * i, "n": [i, None]}).id):
                {"i": i, "s": "x" * i, "n": [i, None]} for i in range(n)}

    given = objects(5)
    assert {c.id: c.input for c in claim(engine, n=20)} == given

    given = objects(2)
    for value in ("a JSON string", [1, 2], 7, True):
        given[str(make_row(engine, input=value).id)] = value
    claimed = claim(engine, n=20)
    assert {c.id: c.input for c in claimed} == given
    assert all(c.input_error is None for c in claimed)


@pytest.mark.django_db
def test_every_claim_writes_a_fresh_lease_token(engine):
    result = enqueue(engine, max_attempts=50)
    tokens = []
    for i in range(6):
        job = claim_one(engine)
        assert job.id == str(result.id)
        assert str(engine.job_get(job.id).lease_token) == job.lease_token
        tokens.append(job.lease_token)
        if i % 2:
            engine.job_requeue_if_owned(Requeue(claim=job.claim,
                                                delay_ms=0, spent_attempt=True, resumed=False))
        else:
            engine.job_fail_if_owned(Failure(claim=job.claim,
                                             error="boom", retry_delay_ms=0))

    assert len(set(tokens)) == len(tokens)
    assert all(tokens)


@pytest.mark.django_db
def test_attempt_counts_each_claim(engine):
    enqueue(engine, max_attempts=5)
    attempts = []
    for _ in range(3):
        job = claim_one(engine)
        attempts.append(job.attempt)
        engine.job_fail_if_owned(Failure(claim=job.claim,
                                          error="boom", retry_delay_ms=0))

    assert attempts == [1, 2, 3]
    assert engine.job_get(job.id).attempt == 3


@pytest.mark.django_db
def test_resuming_a_suspended_job_does_not_count_an_attempt(engine):
    enqueue(engine, max_attempts=5)
    first = claim_one(engine)
    engine.job_suspend_if_owned(Suspension(claim=first.claim,
                                           wake_at=engine.db_now() - timedelta(seconds=1)))

    resumed = claim_one(engine)

    assert resumed.id == first.id
    assert resumed.resumed is True
    assert resumed.attempt == first.attempt == 1
    assert resumed.lease_token != first.lease_token
    assert engine.job_get(first.id).attempt == 1
    assert engine.job_get(first.id).state == "running"


@pytest.mark.django_db
def test_a_suspended_job_is_not_claimed_before_it_wakes(engine):
    enqueue(engine)
    job = claim_one(engine)
    engine.job_suspend_if_owned(Suspension(claim=job.claim,
                                           wake_at=engine.db_now() + timedelta(hours=1)))

    assert claim(engine) == []


@pytest.mark.django_db(transaction=True)
def test_a_lapsed_lease_is_reclaimed_with_one_more_rescue(engine):
    enqueue(engine, max_attempts=3)
    first = claim_one(engine, worker="worker-a", lease_ms=1)
    wait_lapsed(engine, first.id)

    second = claim_one(engine, worker="worker-b")

    assert second.id == first.id
    assert second.lease_token != first.lease_token
    assert second.attempt == first.attempt + 1
    assert second.resumed is False
    record = engine.job_get(second.id)
    assert record.state == "running"
    assert record.rescues == 1
    assert record.claimed_by == "worker-b"
    assert str(record.lease_token) == second.lease_token


@pytest.mark.django_db(transaction=True)
def test_a_lapsed_lease_on_the_last_attempt_buries_the_job_as_lease_lost(engine):
    result = enqueue(engine, max_attempts=1)
    first = claim_one(engine, worker="worker-a", lease_ms=1)
    wait_lapsed(engine, first.id)

    claimed = claim(engine, worker="worker-b")

    assert first.id not in ids(claimed)
    record = engine.job_get(str(result.id))
    assert record.state == "dead"
    assert "lease lost" in (record.last_error or "")
    assert record.attempt == 1
    assert record.finished_at is not None
    assert record.lease_token is None or str(record.lease_token) != first.lease_token
    assert claim(engine, worker="worker-c") == []
    assert engine.job_get(str(result.id)).state == "dead"
