"""Operator operations: get, cancel, retry, run now, purge, outbox pending; tenant scopes."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_xjobs.exceptions import LiveJobExists
from django_xjobs.models import Job, JobStep, OutboxEntry
from django_xjobs.records import Completion, Failure, JobRecord

from .conftest import claim, claim_one, enqueue, make_row

# -------------------------------------------------------------------------------- job_get --


@pytest.mark.django_db
def test_job_get_returns_the_whole_row(engine):
    result = enqueue(engine, queue="emails", key="k", tenant="acme", priority=3,
                     input={"user_id": 42})

    record = engine.job_get(str(result.id))

    assert isinstance(record, JobRecord)
    assert str(record.id) == str(result.id)
    assert (record.queue, record.idempotency_key, record.tenant_id, record.priority) == (
        "emails", "k", "acme", 3
    )
    assert record.input == {"user_id": 42}
    assert record.state == "ready" and record.is_live and not record.is_finished


@pytest.mark.django_db
def test_job_get_of_an_unknown_or_malformed_id_is_none(engine):
    enqueue(engine)

    assert engine.job_get(str(uuid.uuid4())) is None
    assert engine.job_get("not-a-uuid") is None


@pytest.mark.django_db
def test_a_tenant_scope_hides_other_tenants_jobs(engine):
    acme = str(enqueue(engine, tenant="acme").id)
    globex = str(enqueue(engine, tenant="globex").id)
    untenanted = str(enqueue(engine).id)

    assert engine.job_get(acme, tenant_ids=["acme"]) is not None
    assert engine.job_get(acme, tenant_ids=["globex", "acme"]) is not None
    assert engine.job_get(globex, tenant_ids=["acme"]) is None
    assert engine.job_get(untenanted, tenant_ids=["acme"]) is None
    assert engine.job_get(acme, tenant_ids=[]) is None
    # No scope at all sees every job.
    assert all(engine.job_get(i) is not None for i in (acme, globex, untenanted))


# ----------------------------------------------------------------------------- job_cancel --


@pytest.mark.django_db
@pytest.mark.parametrize("state", ["ready", "delayed", "running", "suspended", "dead"])
def test_cancel_stops_a_job_in_any_state_but_done(engine, state):
    row = make_row(engine, state=state)

    result = engine.job_cancel(str(row.id), reason="cancelled: no longer needed")

    assert result.changed is True
    assert result.job.state == "cancelled"
    record = engine.job_get(str(row.id))
    assert record.state == "cancelled"
    assert record.last_error == "cancelled: no longer needed"
    assert record.finished_at is not None
    assert record.lease_token is None
    assert claim(engine) == []


@pytest.mark.django_db
def test_cancel_of_a_done_job_changes_nothing(engine):
    row = make_row(engine, state="done", result={"ok": True})
    before = engine.job_get(str(row.id))

    result = engine.job_cancel(str(row.id), reason="cancelled: too late")

    assert result.changed is False
    assert result.job.state == "done"
    assert engine.job_get(str(row.id)) == before


@pytest.mark.django_db
def test_a_second_cancel_keeps_the_first_reason(engine):
    row = make_row(engine)
    assert engine.job_cancel(str(row.id), reason="cancelled: first").changed
    first = engine.job_get(str(row.id))

    again = engine.job_cancel(str(row.id), reason="cancelled: second")

    assert again.changed is False
    assert engine.job_get(str(row.id)) == first
    assert first.last_error == "cancelled: first"


@pytest.mark.django_db
def test_cancel_without_a_reason_keeps_the_last_error(engine):
    row = make_row(engine, state="delayed", last_error="earlier failure")

    assert engine.job_cancel(str(row.id), reason=None).changed
    record = engine.job_get(str(row.id))
    assert record.state == "cancelled"
    assert record.last_error == "earlier failure"


@pytest.mark.django_db
def test_cancel_under_a_tenant_scope_cannot_touch_another_tenants_job(engine):
    globex = make_row(engine, tenant_id="globex")

    result = engine.job_cancel(str(globex.id), reason="nope", tenant_ids=["acme"])

    assert result.changed is False
    assert result.job is None  # not even revealed
    assert Job.objects.get(id=globex.id).state == "ready"
    assert engine.job_cancel(str(globex.id), reason="ok", tenant_ids=["globex"]).changed


@pytest.mark.django_db
def test_cancel_of_an_unknown_job_changes_nothing(engine):
    result = engine.job_cancel(str(uuid.uuid4()), reason="x")
    assert (result.changed, result.job) == (False, None)


# ------------------------------------------------------------------------------ job_retry --


def bury(engine, **kwargs) -> str:
    """A job that ran once and went dead (permanent failure), through the engine."""
    enqueue(engine, **kwargs)
    job = claim_one(engine)
    _report, state = engine.job_fail_if_owned(Failure(
        claim=job.claim, error="PermanentError: bad", retry_delay_ms=0,
        permanent=True,
    ))
    assert state == "dead"
    return job.id


@pytest.mark.django_db
def test_retry_makes_a_dead_job_ready_with_a_fresh_budget_and_the_same_run_id(engine):
    job_id = bury(engine, max_attempts=1)
    dead = engine.job_get(job_id)

    result = engine.job_retry(job_id)

    assert result.changed is True
    record = engine.job_get(job_id)
    assert record.state == "ready"
    assert record.attempt == 0
    assert record.run_id == dead.run_id
    assert record.max_attempts == 1
    assert record.finished_at is None
    assert record.run_at <= engine.db_now()
    assert record.last_error == "PermanentError: bad"  # why it stopped stays on record
    again = claim_one(engine)
    assert (again.id, again.attempt, again.run_id) == (job_id, 1, str(dead.run_id))
    assert again.lease_token != str(dead.lease_token)


@pytest.mark.django_db
def test_retry_makes_a_cancelled_job_ready(engine):
    row = make_row(engine, state="delayed", run_at=engine.db_now() + timedelta(days=1),
                   attempt=2)
    engine.job_cancel(str(row.id), reason="cancelled: oops")

    result = engine.job_retry(str(row.id))

    assert result.changed is True
    record = engine.job_get(str(row.id))
    assert (record.state, record.attempt, record.run_id) == ("ready", 0, row.run_id)
    assert claim_one(engine).id == str(row.id)


@pytest.mark.django_db
def test_retry_is_refused_while_another_live_job_holds_the_key(engine):
    job_id = bury(engine, key="nightly")
    live = enqueue(engine, key="nightly")
    assert live.created
    before = engine.job_get(job_id)

    with pytest.raises(LiveJobExists) as refused:
        engine.job_retry(job_id)

    assert refused.value.live_job_id == str(live.id)
    assert engine.job_get(job_id) == before
    assert engine.job_get(str(live.id)).state == "ready"
    # The caller's transaction is still usable after the refusal.
    assert Job.objects.count() == 2


@pytest.mark.django_db
def test_retry_of_a_done_job_changes_nothing(engine):
    enqueue(engine)
    job = claim_one(engine)
    engine.jobs_complete_if_owned([Completion(claim=job.claim,
                                              result_json='{"r": 1}')])
    before = engine.job_get(job.id)

    result = engine.job_retry(job.id)

    assert result.changed is False
    assert result.job.state == "done"
    assert engine.job_get(job.id) == before


@pytest.mark.django_db
@pytest.mark.parametrize("state", ["ready", "delayed", "running", "suspended"])
def test_retry_of_a_live_job_changes_nothing(engine, state):
    row = make_row(engine, state=state)
    before = engine.job_get(str(row.id))

    result = engine.job_retry(str(row.id))

    assert result.changed is False
    assert engine.job_get(str(row.id)) == before


@pytest.mark.django_db
def test_retry_under_a_tenant_scope_cannot_touch_another_tenants_job(engine):
    row = make_row(engine, state="dead", tenant_id="globex")

    result = engine.job_retry(str(row.id), tenant_ids=["acme"])

    assert (result.changed, result.job) == (False, None)
    assert Job.objects.get(id=row.id).state == "dead"


# ---------------------------------------------------------------------------- job_run_now --


@pytest.mark.django_db
def test_run_now_makes_a_delayed_job_ready_and_due(engine):
    result = enqueue(engine, delay_ms=3_600_000)
    assert claim(engine) == []

    changed = engine.job_run_now(str(result.id))

    assert changed.changed is True
    record = engine.job_get(str(result.id))
    assert record.state == "ready"
    assert record.run_at <= engine.db_now()
    assert claim_one(engine).id == str(result.id)


@pytest.mark.django_db
def test_run_now_wakes_a_suspended_job_without_counting_an_attempt(engine):
    row = make_row(engine, state="suspended", run_at=engine.db_now() + timedelta(days=1),
                   attempt=1)

    assert engine.job_run_now(str(row.id)).changed is True

    assert engine.job_get(str(row.id)).state == "suspended"
    job = claim_one(engine)
    assert (job.id, job.resumed, job.attempt) == (str(row.id), True, 1)


@pytest.mark.django_db
def test_run_now_brings_forward_a_ready_job_due_later(engine):
    row = make_row(engine, state="ready", run_at=engine.db_now() + timedelta(days=1))

    assert engine.job_run_now(str(row.id)).changed is True
    assert claim_one(engine).id == str(row.id)


@pytest.mark.django_db
@pytest.mark.parametrize("state", ["running", "done", "dead", "cancelled"])
def test_run_now_leaves_running_and_finished_jobs_alone(engine, state):
    row = make_row(engine, state=state, run_at=engine.db_now() + timedelta(days=1))
    before = engine.job_get(str(row.id))

    result = engine.job_run_now(str(row.id))

    assert result.changed is False
    assert engine.job_get(str(row.id)) == before


@pytest.mark.django_db
def test_run_now_of_a_ready_job_already_due_changes_nothing(engine):
    row = make_row(engine, state="ready")
    before = engine.job_get(str(row.id))

    assert engine.job_run_now(str(row.id)).changed is False
    assert engine.job_get(str(row.id)) == before


@pytest.mark.django_db
def test_run_now_under_a_tenant_scope_cannot_touch_another_tenants_job(engine):
    row = make_row(engine, state="delayed", tenant_id="globex",
                   run_at=engine.db_now() + timedelta(days=1))

    result = engine.job_run_now(str(row.id), tenant_ids=["acme"])

    assert (result.changed, result.job) == (False, None)
    assert Job.objects.get(id=row.id).state == "delayed"


# ----------------------------------------------------------------------------- jobs_purge --


@pytest.mark.django_db
def test_purge_deletes_only_finished_jobs_past_the_cutoff_in_batches(engine):
    now = engine.db_now()
    old = now - timedelta(days=10)
    purged = [make_row(engine, state=s, finished_at=old)
              for s in ("done", "done", "dead", "cancelled", "done")]
    recent = make_row(engine, state="done", finished_at=now - timedelta(hours=1))
    live = [make_row(engine, state=s, finished_at=old)  # a stale finished_at does not matter
            for s in ("ready", "delayed", "running", "suspended")]
    for row in [*purged, recent, *live]:
        JobStep.objects.create(run_id=row.run_id, name="step", status="completed")

    with CaptureQueriesContext(connection) as ctx:
        deleted = engine.jobs_purge(states=["done", "dead", "cancelled"],
                                    finished_before=now - timedelta(days=1), batch_size=2)

    assert deleted == 5
    assert len(ctx.captured_queries) >= 3  # 5 rows, at most 2 per statement
    remaining = set(Job.objects.values_list("id", flat=True))
    assert remaining == {recent.id, *(r.id for r in live)}
    assert set(JobStep.objects.values_list("run_id", flat=True)) == {
        recent.run_id, *(r.run_id for r in live)
    }


@pytest.mark.django_db
def test_purge_deletes_only_the_states_it_is_given(engine):
    old = engine.db_now() - timedelta(days=10)
    done = make_row(engine, state="done", finished_at=old)
    dead = make_row(engine, state="dead", finished_at=old)

    assert engine.jobs_purge(states=["done"], finished_before=engine.db_now()) == 1

    assert set(Job.objects.values_list("id", flat=True)) == {dead.id}
    assert done.id not in set(Job.objects.values_list("id", flat=True))


@pytest.mark.django_db
def test_purge_with_nothing_to_delete_returns_zero(engine):
    make_row(engine, state="done", finished_at=engine.db_now() - timedelta(minutes=1))
    assert engine.jobs_purge(states=["done", "dead", "cancelled"],
                             finished_before=engine.db_now() - timedelta(days=1)) == 0
    assert Job.objects.count() == 1


# ------------------------------------------------------------------------- outbox_pending --


@pytest.mark.django_db
def test_outbox_pending_of_an_empty_outbox_is_zero_with_no_age(engine):
    assert engine.outbox_pending() == (0, None)


@pytest.mark.django_db
def test_outbox_pending_counts_unpublished_rows_and_the_age_of_the_oldest(engine):
    now = engine.db_now()
    OutboxEntry.objects.create(job="testapp.noop", staged_at=now - timedelta(seconds=120))
    OutboxEntry.objects.create(job="testapp.noop", staged_at=now - timedelta(seconds=30))
    OutboxEntry.objects.create(job="testapp.noop", staged_at=now - timedelta(hours=5),
                               published_at=now - timedelta(hours=4))

    count, age = engine.outbox_pending()

    assert count == 2
    assert age is not None and 115 <= age <= 180  # the oldest UNPUBLISHED row, not the published


@pytest.mark.django_db
def test_outbox_pending_ignores_published_rows(engine):
    now = engine.db_now()
    OutboxEntry.objects.create(job="testapp.noop", staged_at=now - timedelta(hours=1),
                               published_at=now)

    assert engine.outbox_pending() == (0, None)
