"""Step and event operations of the engine: fenced writes, parked waits, event order."""

from __future__ import annotations

from datetime import timedelta

import pytest

from django_xjobs.records import RunOwner
from tests.conftest import wait_until

from .conftest import LONG_LEASE_MS, claim_one, enqueue, wait_lapsed


def owner_of(job) -> RunOwner:
    return RunOwner(claim=job.claim, run_id=job.run_id)


@pytest.mark.django_db(transaction=True)
def test_a_run_that_lost_its_lease_cannot_record_a_step_or_a_suspension(engine):
    enqueue(engine, max_attempts=5)
    old = claim_one(engine, worker="old", lease_ms=1)
    wait_lapsed(engine, old.id)
    new = claim_one(engine, worker="new", lease_ms=LONG_LEASE_MS)
    stale, current = owner_of(old), owner_of(new)

    assert engine.step_complete_if_owned(stale, "s", '{"by": "old"}') is False
    assert engine.step_fail_if_owned(stale, "s", "boom") is None
    assert engine.step_park_if_owned(stale, "nap", status="sleeping", duration_ms=1000) is None
    assert engine.steps_of_run(new.run_id) == []

    assert engine.step_complete_if_owned(current, "s", '{"by": "new"}') is True
    [record] = engine.steps_of_run(new.run_id)
    assert record.output == {"by": "new"} and record.status == "completed"


@pytest.mark.django_db
def test_a_completed_step_keeps_its_output_and_counts_its_failed_attempts(engine):
    enqueue(engine)
    run = owner_of(claim_one(engine))
    assert engine.step_fail_if_owned(run, "s", "first") == 1
    assert engine.step_fail_if_owned(run, "s", "second") == 2
    assert engine.step_complete_if_owned(run, "s", "[1, 2]")
    [record] = engine.steps_of_run(run.run_id)
    assert (record.status, record.output, record.attempts, record.error) == (
        "completed", [1, 2], 3, None)


@pytest.mark.django_db
def test_parking_twice_keeps_the_first_start_and_wake_time(engine):
    enqueue(engine)
    run = owner_of(claim_one(engine))
    first = engine.step_park_if_owned(run, "nap", status="sleeping", duration_ms=60_000)
    again = engine.step_park_if_owned(run, "nap", status="sleeping", duration_ms=1)
    assert first is not None and again is not None
    assert again.started_at == first.started_at and again.wake_at == first.wake_at
    assert first.due is False
    assert engine.step_park_if_owned(run, "now", status="sleeping", duration_ms=0).due is True


@pytest.mark.django_db(transaction=True)
def test_events_come_back_in_publication_order_after_the_cursor(engine):
    start = engine.db_now()
    first = engine.event_publish("evt", '{"n": 1}', "k", 60_000)
    second = engine.event_publish("evt", '{"n": 2}', "k", 60_000)
    engine.event_publish("evt", '{"n": 3}', "other", 60_000)
    assert first.expires_at - first.published_at == timedelta(seconds=60)

    found = engine.event_next(["evt"], "k", start, 0)
    assert (found.id, found.payload) == (first.id, {"n": 1})
    found = engine.event_next(["evt"], "k", first.published_at, first.id)
    assert (found.id, found.payload) == (second.id, {"n": 2})
    assert engine.event_next(["evt"], "k", second.published_at, second.id) is None
    # No key: any key matches.
    assert engine.event_next(["evt"], None, second.published_at, second.id).payload == {"n": 3}
    # Expired events are never returned.
    gone = engine.event_publish("gone", "{}", None, 1)
    wait_until(lambda: engine.db_now() > gone.expires_at, message="the event to expire")
    assert engine.event_next(["gone"], None, start, 0) is None


@pytest.mark.django_db
def test_waking_waiters_touches_only_suspended_jobs_waiting_for_that_event_and_key(engine):
    def parked_waiter(event, key):
        enqueue(engine)
        job = claim_one(engine)
        run = owner_of(job)
        engine.step_park_if_owned(run, "w", status="waiting", duration_ms=600_000, event=event,
                                  correlation_key=key)
        from django_xjobs.records import Suspension

        far = engine.db_now() + timedelta(hours=1)
        engine.job_suspend_if_owned(Suspension(claim=job.claim,
                                               wake_at=far))
        return job

    keyed = parked_waiter("paid", "acme")
    any_key = parked_waiter("paid", None)
    other_key = parked_waiter("paid", "globex")
    other_event = parked_waiter("shipped", "acme")

    assert engine.event_wake_waiters("paid", "acme") == 2
    now = engine.db_now()
    due = {j.id for j in (keyed, any_key, other_key, other_event)
           if engine.job_get(j.id).run_at <= now}
    assert due == {keyed.id, any_key.id}


@pytest.mark.django_db(transaction=True)
def test_in_transaction_says_whether_the_caller_opened_one(engine):
    """A step refuses to suspend inside the job's own transaction (it would be rolled back)."""
    assert engine.in_transaction() is False
    with engine.atomic():
        assert engine.in_transaction() is True
        with engine.atomic():
            assert engine.in_transaction() is True
    assert engine.in_transaction() is False
