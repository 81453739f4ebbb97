"""Fencing: a run writes about its job only while it owns it, and finished writes are recognised.

Every worker write (ack, nack, requeue, suspend, heartbeat) is fenced on the claim's lease
token. A run whose lease lapsed and whose job another claim took must change nothing and hear
LOST; the new owner's writes succeed. An ack retried after an ambiguous commit is ALREADY_APPLIED.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import OperationalError

from django_xjobs.records import (
    Claim,
    Completion,
    Failure,
    Fence,
    FenceReport,
    Renewal,
    Requeue,
    Suspension,
)

from .conftest import LONG_LEASE_MS, claim, claim_one, enqueue, wait_lapsed


def ack(engine, job, result_json: str | None = None) -> Fence:
    report = engine.jobs_complete_if_owned(
        [Completion(claim=job.claim, result_json=result_json)]
    )
    assert isinstance(report, FenceReport)
    return report.outcome(job.lease_token)


def nack(engine, job, *, error: str = "boom", delay_ms: int = 0,
         permanent: bool = False) -> tuple[Fence, str | None]:
    report, state = engine.job_fail_if_owned(Failure(
        claim=job.claim, error=error, retry_delay_ms=delay_ms,
        permanent=permanent,
    ))
    return report.outcome(job.lease_token), state


def requeue(engine, job, *, delay_ms: int = 0, note: str | None = None) -> Fence:
    report = engine.job_requeue_if_owned(Requeue(
        claim=job.claim, delay_ms=delay_ms,
        spent_attempt=not job.resumed, resumed=job.resumed, note=note,
    ))
    return report.outcome(job.lease_token)


def suspend(engine, job, wake_at) -> Fence:
    return engine.job_suspend_if_owned(
        Suspension(claim=job.claim, wake_at=wake_at)
    ).outcome(job.lease_token)


def renew(engine, *jobs, lease_ms: int = LONG_LEASE_MS) -> frozenset[str]:
    """The lease tokens renewed on their rows (none of these rows is held elsewhere)."""
    renewal = engine.jobs_renew_if_owned([j.claim for j in jobs], lease_ms)
    assert renewal.kept == frozenset()
    return renewal.renewed


@pytest.fixture
def stolen(engine):
    """(old, new): run ``old`` let its lease lapse and run ``new`` re-claimed the job.

    Tests using it need ``django_db(transaction=True)``: the lease lapses on the database clock,
    which does not move inside one transaction.
    """
    enqueue(engine, max_attempts=5)
    old = claim_one(engine, worker="worker-old", lease_ms=1)
    wait_lapsed(engine, old.id)
    new = claim_one(engine, worker="worker-new", lease_ms=LONG_LEASE_MS)
    assert new.id == old.id and new.lease_token != old.lease_token
    return old, new


# -------------------------------------------------------------- a lapsed run that lost its job --


@pytest.mark.django_db(transaction=True)
def test_two_runs_of_one_job_in_one_batch_are_answered_per_lease_token(engine, stolen):
    # One worker can hold both: the stale run still executes when it re-claims the job. An
    # answer keyed by job id would renew (and acknowledge) the stale run along with the new one.
    old, new = stolen

    assert renew(engine, old, new) == frozenset({new.lease_token})

    report = engine.jobs_complete_if_owned([
        Completion(claim=old.claim, result_json='{"by": "old"}'),
        Completion(claim=new.claim, result_json='{"by": "new"}'),
    ])
    assert report.outcome(old.lease_token) is Fence.LOST
    assert report.outcome(new.lease_token) is Fence.OWNED
    assert engine.job_get(new.id).result == {"by": "new"}


@pytest.mark.django_db(transaction=True)
def test_ack_from_a_lapsed_lease_changes_nothing_and_reports_lost(engine, stolen):
    old, new = stolen
    before = engine.job_get(new.id)

    assert ack(engine, old, '{"by": "old"}') is Fence.LOST
    assert engine.job_get(new.id) == before

    assert ack(engine, new, '{"by": "new"}') is Fence.OWNED
    record = engine.job_get(new.id)
    assert record.state == "done"
    assert record.result == {"by": "new"}


@pytest.mark.django_db(transaction=True)
def test_nack_from_a_lapsed_lease_changes_nothing_and_reports_lost(engine, stolen):
    old, new = stolen
    before = engine.job_get(new.id)

    assert nack(engine, old, error="old failure", permanent=True) == (Fence.LOST, None)
    assert engine.job_get(new.id) == before

    assert nack(engine, new, error="new failure") == (Fence.OWNED, "ready")
    record = engine.job_get(new.id)
    assert record.state == "ready"
    assert record.last_error == "new failure"


@pytest.mark.django_db(transaction=True)
def test_requeue_from_a_lapsed_lease_changes_nothing_and_reports_lost(engine, stolen):
    old, new = stolen
    before = engine.job_get(new.id)

    assert requeue(engine, old, note="old note") is Fence.LOST
    assert engine.job_get(new.id) == before

    assert requeue(engine, new) is Fence.OWNED
    record = engine.job_get(new.id)
    assert record.state == "ready"
    assert record.attempt == new.attempt - 1


@pytest.mark.django_db(transaction=True)
def test_suspend_from_a_lapsed_lease_changes_nothing_and_reports_lost(engine, stolen):
    old, new = stolen
    before = engine.job_get(new.id)
    wake_at = engine.db_now() + timedelta(hours=1)

    assert suspend(engine, old, wake_at) is Fence.LOST
    assert engine.job_get(new.id) == before

    assert suspend(engine, new, wake_at) is Fence.OWNED
    record = engine.job_get(new.id)
    assert record.state == "suspended"
    assert record.run_at == wake_at


@pytest.mark.django_db(transaction=True)
def test_heartbeat_from_a_lapsed_lease_renews_nothing_and_leaves_the_id_out(engine, stolen):
    old, new = stolen
    before = engine.job_get(new.id)

    assert renew(engine, old) == frozenset()
    assert engine.job_get(new.id) == before

    assert renew(engine, new, lease_ms=3_600_000) == frozenset({new.lease_token})
    assert engine.job_get(new.id).visible_at > before.visible_at


@pytest.mark.django_db(transaction=True)
def test_writes_from_a_run_whose_job_was_buried_as_lease_lost_read_as_lost(engine):
    enqueue(engine, max_attempts=1)
    old = claim_one(engine, worker="worker-old", lease_ms=1)
    wait_lapsed(engine, old.id)
    assert claim(engine, worker="worker-new") == []
    buried = engine.job_get(old.id)
    assert buried.state == "dead"

    assert ack(engine, old) is Fence.LOST
    assert nack(engine, old) == (Fence.LOST, None)
    assert requeue(engine, old) is Fence.LOST
    assert renew(engine, old) == frozenset()
    assert engine.job_get(old.id) == buried


@pytest.mark.django_db
def test_a_heartbeat_renews_only_the_leases_still_owned(engine):
    enqueue(engine)
    enqueue(engine)
    kept, cancelled = claim(engine, n=2)
    engine.job_cancel(cancelled.id, reason="stop")

    assert renew(engine, kept, cancelled) == frozenset({kept.lease_token})


@pytest.mark.django_db
def test_a_batch_ack_reports_each_job_on_its_own(engine):
    enqueue(engine)
    enqueue(engine)
    owned, cancelled = claim(engine, n=2)
    engine.job_cancel(cancelled.id, reason="stop")

    report = engine.jobs_complete_if_owned([
        Completion(claim=owned.claim, result_json="1"),
        Completion(claim=cancelled.claim, result_json="2"),
    ])

    assert report.outcome(owned.lease_token) is Fence.OWNED
    assert report.outcome(cancelled.lease_token) is Fence.LOST
    assert cancelled.lease_token not in report.owned | report.already_applied
    assert engine.job_get(owned.id).state == "done"
    assert engine.job_get(cancelled.id).state == "cancelled"


@pytest.mark.django_db
def test_an_ack_with_a_made_up_token_changes_nothing(engine):
    enqueue(engine)
    job = claim_one(engine)
    before = engine.job_get(job.id)
    forged = Completion(
        claim=Claim(job_id=job.id, lease_token="00000000-0000-4000-8000-000000000000"),
        result_json=None)

    assert engine.jobs_complete_if_owned([forged]).outcome(job.lease_token) is Fence.LOST
    assert engine.job_get(job.id) == before


@pytest.mark.django_db
def test_a_heartbeat_is_one_statement_for_all_leases(engine, django_assert_num_queries):
    for _ in range(5):
        enqueue(engine)
    jobs = claim(engine, n=5)

    with django_assert_num_queries(1):
        renewed = renew(engine, *jobs)
    assert renewed == frozenset(j.lease_token for j in jobs)


@pytest.mark.django_db
def test_an_ack_of_owned_runs_is_one_statement(engine, django_assert_num_queries):
    for _ in range(5):
        enqueue(engine)
    jobs = claim(engine, n=5)

    with django_assert_num_queries(1):
        report = engine.jobs_complete_if_owned([
            Completion(claim=j.claim, result_json="null") for j in jobs
        ])
    assert report.owned == frozenset(j.lease_token for j in jobs)


@pytest.mark.django_db
def test_empty_batches_of_fenced_writes_report_nothing(engine):
    assert engine.jobs_complete_if_owned([]) == FenceReport()
    assert engine.jobs_renew_if_owned([], LONG_LEASE_MS) == Renewal()


# ------------------------------------------------------------------------------- cancellation --


@pytest.mark.django_db
def test_a_cancelled_running_job_is_lost_to_its_worker(engine):
    enqueue(engine)
    job = claim_one(engine)

    cancelled = engine.job_cancel(job.id, reason="cancelled: operator")
    assert cancelled.changed and cancelled.job.state == "cancelled"
    after_cancel = engine.job_get(job.id)

    assert renew(engine, job) == frozenset()  # told at its next heartbeat
    assert ack(engine, job, '{"late": true}') is Fence.LOST
    assert nack(engine, job, error="late failure") == (Fence.LOST, None)
    assert requeue(engine, job) is Fence.LOST
    assert suspend(engine, job, engine.db_now() + timedelta(hours=1)) is Fence.LOST
    assert engine.job_get(job.id) == after_cancel
    assert after_cancel.last_error == "cancelled: operator"
    assert claim(engine) == []


@pytest.mark.django_db
def test_cancel_on_a_done_job_changes_nothing(engine):
    enqueue(engine)
    job = claim_one(engine)
    assert ack(engine, job, '{"ok": 1}') is Fence.OWNED
    before = engine.job_get(job.id)

    result = engine.job_cancel(job.id, reason="too late")

    assert result.changed is False
    assert result.job is not None and result.job.state == "done"
    assert engine.job_get(job.id) == before


# --------------------------------------------------------------------------- ambiguous commits --


@pytest.mark.django_db(transaction=True)
def test_an_ack_retried_after_an_ambiguous_commit_is_already_applied(engine, clean_faults):
    enqueue(engine)
    job = claim_one(engine)
    clean_faults.inject("after:jobs_complete_if_owned", "disconnect")

    with pytest.raises(OperationalError) as lost_connection:
        ack(engine, job, '{"n": 1}')
    assert engine.is_connection_error(lost_connection.value)
    engine.reset_connection()

    assert ack(engine, job, '{"n": 1}') is Fence.ALREADY_APPLIED
    record = engine.job_get(job.id)
    assert record.state == "done"
    assert record.attempt == job.attempt == 1
    assert record.result == {"n": 1}
    assert str(record.lease_token) == job.lease_token


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("delay_ms", "permanent", "went_to"), [
    (0, False, "ready"), (60_000, False, "delayed"), (0, True, "dead"),
])
def test_a_nack_retried_after_an_ambiguous_commit_is_already_applied(
    engine, clean_faults, delay_ms, permanent, went_to
):
    enqueue(engine)
    job = claim_one(engine)
    clean_faults.inject("after:job_fail_if_owned", "disconnect")

    with pytest.raises(OperationalError) as lost_connection:
        nack(engine, job, error="boom", delay_ms=delay_ms, permanent=permanent)
    assert engine.is_connection_error(lost_connection.value)
    engine.reset_connection()

    fence, _state = nack(engine, job, error="boom", delay_ms=delay_ms, permanent=permanent)
    assert fence is Fence.ALREADY_APPLIED
    record = engine.job_get(job.id)
    assert record.state == went_to
    assert record.attempt == job.attempt == 1
    assert record.last_error == "boom"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("write", ["requeue", "suspend"])
def test_a_requeue_or_suspend_retried_after_an_ambiguous_commit_is_already_applied(
    engine, clean_faults, write
):
    enqueue(engine)
    job = claim_one(engine)
    wake_at = engine.db_now() + timedelta(hours=1)
    point, do, went_to, attempt = {
        "requeue": ("job_requeue_if_owned", lambda: requeue(engine, job, delay_ms=60_000),
                    "delayed", 0),
        "suspend": ("job_suspend_if_owned", lambda: suspend(engine, job, wake_at),
                    "suspended", 1),
    }[write]
    clean_faults.inject(f"after:{point}", "disconnect")

    with pytest.raises(OperationalError):
        do()
    engine.reset_connection()

    assert do() is Fence.ALREADY_APPLIED
    record = engine.job_get(job.id)
    assert (record.state, record.attempt) == (went_to, attempt)


@pytest.mark.django_db(transaction=True)
def test_an_ack_whose_connection_died_before_the_write_is_owned_on_retry(engine, clean_faults):
    enqueue(engine)
    job = claim_one(engine)
    clean_faults.inject("before:jobs_complete_if_owned", "disconnect")

    with pytest.raises(OperationalError):
        ack(engine, job, '"late"')
    engine.reset_connection()
    assert engine.job_get(job.id).state == "running"  # nothing was written

    assert ack(engine, job, '"late"') is Fence.OWNED
    assert engine.job_get(job.id).result == "late"


@pytest.mark.django_db
def test_a_retried_nack_that_was_already_applied_names_the_state_the_job_went_to(engine):
    # The seam's contract: job_fail_if_owned returns "the state the job went to (None if
    # lost)". An already-applied nack is not lost: the caller needs to know retry vs dead.
    enqueue(engine)
    job = claim_one(engine)
    assert nack(engine, job, permanent=True) == (Fence.OWNED, "dead")

    assert nack(engine, job, permanent=True) == (Fence.ALREADY_APPLIED, "dead")


@pytest.mark.django_db
def test_an_ack_sent_twice_is_already_applied_the_second_time(engine):
    enqueue(engine)
    job = claim_one(engine)

    assert ack(engine, job, '"first"') is Fence.OWNED
    assert ack(engine, job, '"second"') is Fence.ALREADY_APPLIED
    assert engine.job_get(job.id).result == "first"


@pytest.mark.django_db
def test_an_ack_after_a_nack_of_the_same_run_is_lost_not_already_applied(engine):
    enqueue(engine)
    job = claim_one(engine)
    assert nack(engine, job, delay_ms=60_000) == (Fence.OWNED, "delayed")

    assert ack(engine, job) is Fence.LOST
    assert engine.job_get(job.id).state == "delayed"


# ---------------------------------------------------------------------------- ack semantics --


@pytest.mark.django_db
def test_an_ack_stores_the_result_and_keeps_the_finishing_runs_fence(engine):
    enqueue(engine)
    job = claim_one(engine, worker="worker-9")

    assert ack(engine, job, '{"sent": true, "n": [1, 2]}') is Fence.OWNED

    record = engine.job_get(job.id)
    assert record.state == "done"
    assert record.result == {"sent": True, "n": [1, 2]}
    assert record.finished_at is not None
    assert record.claimed_by == "worker-9"
    assert record.attempt == job.attempt
    assert str(record.lease_token) == job.lease_token
    assert claim(engine) == []


@pytest.mark.django_db
def test_an_ack_without_a_result_stores_none(engine):
    enqueue(engine)
    job = claim_one(engine)

    assert ack(engine, job, None) is Fence.OWNED
    assert engine.job_get(job.id).result is None


# --------------------------------------------------------------------------- nack semantics --


@pytest.mark.django_db
def test_a_nack_with_attempts_left_and_no_delay_makes_the_job_ready_again(engine):
    enqueue(engine, max_attempts=3)
    job = claim_one(engine)

    assert nack(engine, job, error="ValueError: nope") == (Fence.OWNED, "ready")

    record = engine.job_get(job.id)
    assert record.state == "ready"
    assert record.last_error == "ValueError: nope"
    assert record.attempt == 1
    assert record.finished_at is None
    again = claim_one(engine)
    assert (again.id, again.attempt) == (job.id, 2)


@pytest.mark.django_db
def test_a_nack_with_a_backoff_delays_the_job_until_the_backoff_ends(engine):
    enqueue(engine, max_attempts=3)
    job = claim_one(engine)
    now = engine.db_now()

    assert nack(engine, job, delay_ms=90_000) == (Fence.OWNED, "delayed")

    record = engine.job_get(job.id)
    assert record.state == "delayed"
    assert now + timedelta(seconds=85) <= record.run_at <= now + timedelta(seconds=100)
    assert claim(engine) == []


@pytest.mark.django_db
def test_a_nack_on_the_last_attempt_buries_the_job(engine):
    enqueue(engine, max_attempts=2)
    first = claim_one(engine)
    assert nack(engine, first, error="one") == (Fence.OWNED, "ready")
    last = claim_one(engine, worker="worker-last")

    assert nack(engine, last, error="two", delay_ms=60_000) == (Fence.OWNED, "dead")

    record = engine.job_get(last.id)
    assert record.state == "dead"
    assert record.last_error == "two"
    assert record.attempt == 2
    assert record.finished_at is not None
    assert record.claimed_by == "worker-last"
    assert str(record.lease_token) == last.lease_token
    assert claim(engine) == []


@pytest.mark.django_db
def test_a_permanent_nack_buries_the_job_with_attempts_left(engine):
    enqueue(engine, max_attempts=10)
    job = claim_one(engine)

    assert nack(engine, job, error="PermanentError: no", permanent=True) == (Fence.OWNED, "dead")

    record = engine.job_get(job.id)
    assert record.state == "dead"
    assert record.last_error == "PermanentError: no"
    assert record.attempt == 1


# ------------------------------------------------------------------------- requeue semantics --


@pytest.mark.django_db
def test_a_requeue_gives_the_attempt_back(engine):
    enqueue(engine, max_attempts=1)
    job = claim_one(engine)
    assert job.attempt == 1

    assert requeue(engine, job, note="snoozed") is Fence.OWNED

    record = engine.job_get(job.id)
    assert record.state == "ready"
    assert record.attempt == 0
    assert record.last_error == "snoozed"
    again = claim_one(engine)  # max_attempts=1: only possible because no attempt was spent
    assert (again.id, again.attempt) == (job.id, 1)


@pytest.mark.django_db
def test_a_requeue_with_a_delay_makes_the_job_delayed(engine):
    enqueue(engine)
    job = claim_one(engine)
    now = engine.db_now()

    assert requeue(engine, job, delay_ms=120_000) is Fence.OWNED

    record = engine.job_get(job.id)
    assert record.state == "delayed"
    assert now + timedelta(seconds=115) <= record.run_at <= now + timedelta(seconds=130)
    assert record.attempt == 0
    assert claim(engine) == []


@pytest.mark.django_db
def test_a_requeue_of_a_resumed_job_sends_it_back_to_suspended_without_touching_attempt(engine):
    enqueue(engine, max_attempts=5)
    first = claim_one(engine)
    assert suspend(engine, first, engine.db_now() - timedelta(seconds=1)) is Fence.OWNED
    resumed = claim_one(engine)
    assert resumed.resumed is True and resumed.attempt == 1

    assert requeue(engine, resumed, delay_ms=60_000) is Fence.OWNED

    record = engine.job_get(resumed.id)
    assert record.state == "suspended"
    assert record.attempt == 1
    assert claim(engine) == []


@pytest.mark.django_db
def test_a_suspend_parks_the_job_until_its_wake_time(engine):
    enqueue(engine)
    job = claim_one(engine)
    wake_at = engine.db_now() + timedelta(minutes=10)

    assert suspend(engine, job, wake_at) is Fence.OWNED

    record = engine.job_get(job.id)
    assert record.state == "suspended"
    assert record.run_at == wake_at
    assert record.attempt == 1
    assert renew(engine, job) == frozenset()  # a parked job has no lease to renew
