"""The outbox operations: stage, claim, mark published, status, find jobs by id, the listener.

Written against the seam (and the ORM models, to put rows into states and read them back).
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest

from django_xjobs.models import Job, OutboxEntry
from django_xjobs.records import OutboxRow, new_id

from .conftest import closing_connections, enqueue, make_row

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def row(**fields) -> OutboxRow:
    values = {
        "id": new_id(), "name": "testapp.record", "queue": "default",
        "input_json": json.dumps({"tag": "t"}), "idempotency_key": None, "max_attempts": 3,
    }
    values.update(fields)
    return OutboxRow(**values)


def staged(engine, **fields) -> OutboxRow:
    r = row(**fields)
    engine.outbox_stage(r)
    return r


def pending_ids() -> set:
    return set(OutboxEntry.objects.filter(published_at__isnull=True)
               .values_list("id", flat=True))


# ------------------------------------------------------------------------------- outbox_stage --


@pytest.mark.django_db
def test_stage_stores_every_field_of_the_row_pending(engine):
    run_at = engine.db_now() + timedelta(hours=1)
    r = staged(engine, queue="emails", idempotency_key="k-1", max_attempts=7, priority=-5,
               run_at=run_at, tenant_id="acme", traceparent=TRACEPARENT, enqueued_by="ada",
               concurrency_key="tenant:acme", input_json=json.dumps({"a": [1, 2]}))

    entry = OutboxEntry.objects.get(id=r.id)
    assert (entry.job, entry.queue, entry.input, entry.idempotency_key, entry.max_attempts,
            entry.priority, entry.run_at, entry.delay_ms, entry.tenant_id, entry.traceparent,
            entry.enqueued_by, entry.concurrency_key) == (
        "testapp.record", "emails", {"a": [1, 2]}, "k-1", 7, -5, run_at, 0, "acme",
        TRACEPARENT, "ada", "tenant:acme")
    assert entry.published_at is None and entry.job_id is None
    assert entry.staged_at is not None


@pytest.mark.django_db(transaction=True)
def test_a_staging_in_a_rolled_back_transaction_leaves_no_row(engine):
    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), engine.atomic():
        r = staged(engine)
        assert OutboxEntry.objects.filter(id=r.id).exists()
        raise Rollback
    assert not OutboxEntry.objects.exists()


# ------------------------------------------------------------------------------- outbox_claim --


@pytest.mark.django_db
def test_claim_takes_pending_rows_oldest_first_up_to_the_batch_size(engine):
    now = engine.db_now()
    rows = [staged(engine) for _ in range(4)]
    for age, r in zip((10, 40, 30, 20), rows, strict=True):
        OutboxEntry.objects.filter(id=r.id).update(staged_at=now - timedelta(seconds=age))
    published = staged(engine)
    OutboxEntry.objects.filter(id=published.id).update(
        staged_at=now - timedelta(hours=1), published_at=now)

    with engine.atomic():
        claimed = engine.outbox_claim(3)

    assert [c.id for c in claimed] == [rows[1].id, rows[2].id, rows[3].id]


@pytest.mark.django_db
def test_claim_returns_the_row_as_staged(engine):
    r = staged(engine, queue="emails", idempotency_key="k-2", max_attempts=4, priority=9,
               tenant_id="acme", traceparent=TRACEPARENT, enqueued_by="ada",
               concurrency_key="c", input_json=json.dumps({"x": "é", "n": None}))
    with engine.atomic():
        (claimed,) = engine.outbox_claim(10)
    assert claimed == OutboxRow(
        id=r.id, name="testapp.record", queue="emails", input_json=claimed.input_json,
        idempotency_key="k-2", max_attempts=4, priority=9, run_at=None, delay_ms=0,
        tenant_id="acme", traceparent=TRACEPARENT, enqueued_by="ada", concurrency_key="c",
    )
    assert json.loads(claimed.input_json) == {"x": "é", "n": None}


@pytest.mark.django_db
def test_claim_counts_a_delay_from_the_staging_and_keeps_an_absolute_run_at(engine):
    now = engine.db_now()
    delayed = staged(engine, delay_ms=90_000)
    OutboxEntry.objects.filter(id=delayed.id).update(staged_at=now - timedelta(seconds=30))
    at = now + timedelta(days=2)
    absolute = staged(engine, run_at=at)
    due_now = staged(engine)

    with engine.atomic():
        claimed = {c.id: c for c in engine.outbox_claim(10)}

    assert claimed[delayed.id].run_at == now - timedelta(seconds=30) + timedelta(seconds=90)
    assert claimed[absolute.id].run_at == at
    assert claimed[due_now.id].run_at is None
    assert {c.delay_ms for c in claimed.values()} == {0}


@pytest.mark.django_db
def test_claim_of_an_empty_outbox_is_empty(engine):
    with engine.atomic():
        assert engine.outbox_claim(10) == []


@pytest.mark.django_db(transaction=True)
def test_claim_skips_rows_another_relay_holds_without_waiting(engine):
    if not engine.features.skip_locked:
        pytest.skip("engine does not skip locked rows")
    first, second, third = (staged(engine) for _ in range(3))
    held, release, gave_up = threading.Event(), threading.Event(), threading.Event()
    seen_by_holder: list = []

    @closing_connections
    def other_relay():
        with engine.atomic():
            seen_by_holder.extend(c.id for c in engine.outbox_claim(2))
            held.set()
            if not release.wait(timeout=20):
                gave_up.set()

    with ThreadPoolExecutor(max_workers=1) as pool:
        holder = pool.submit(other_relay)
        assert held.wait(timeout=20)
        try:
            with engine.atomic():
                mine = [c.id for c in engine.outbox_claim(10)]
            assert not gave_up.is_set(), "the claim waited for the other relay's locks"
        finally:
            release.set()
            holder.result(timeout=30)

    assert seen_by_holder == [first.id, second.id]
    assert mine == [third.id]


# ----------------------------------------------------------------------- outbox_mark_published --


@pytest.mark.django_db
def test_mark_published_records_the_job_of_each_row_once(engine):
    a, b, untouched = staged(engine), staged(engine), staged(engine)
    other_job = new_id()

    with engine.atomic():
        engine.outbox_claim(10)
        assert engine.outbox_mark_published({a.id: a.id, b.id: other_job}) == 2

    rows = {e.id: e for e in OutboxEntry.objects.all()}
    assert rows[a.id].job_id == a.id and rows[a.id].published_at is not None
    assert rows[b.id].job_id == other_job
    assert rows[untouched.id].published_at is None
    first_published = rows[a.id].published_at

    # A second mark of a published row changes nothing: not its time, not its job.
    assert engine.outbox_mark_published({a.id: new_id()}) == 0
    again = OutboxEntry.objects.get(id=a.id)
    assert (again.job_id, again.published_at) == (a.id, first_published)
    assert pending_ids() == {untouched.id}


@pytest.mark.django_db
def test_mark_published_of_nothing_is_zero(engine):
    assert engine.outbox_mark_published({}) == 0


# ------------------------------------------------------------------------------ outbox_status --


@pytest.mark.django_db
def test_status_tells_pending_from_published_and_unknown(engine):
    r = staged(engine, name="testapp.noop")
    pending = engine.outbox_status(r.id)
    assert (pending.id, pending.name, pending.published_at, pending.job_id) == (
        r.id, "testapp.noop", None, None)
    assert pending.staged_at is not None

    engine.outbox_mark_published({r.id: r.id})
    published = engine.outbox_status(str(r.id))
    assert published.job_id == r.id and published.published_at is not None

    assert engine.outbox_status(new_id()) is None
    assert engine.outbox_status("not-a-uuid") is None


# --------------------------------------------------------------------------- jobs_find_by_ids --


@pytest.mark.django_db
def test_find_by_ids_finds_jobs_in_any_state_and_ignores_missing_ids(engine):
    live = enqueue(engine)
    done = make_row(engine, state="done")
    cancelled = make_row(engine, state="cancelled")

    found = engine.jobs_find_by_ids([live.id, done.id, cancelled.id, new_id()])

    assert {(r.id, r.state, r.created) for r in found} == {
        (live.id, "ready", False), (done.id, "done", False),
        (cancelled.id, "cancelled", False)}
    assert {r.run_id for r in found} == set(
        Job.objects.filter(id__in=[live.id, done.id, cancelled.id])
        .values_list("run_id", flat=True))
    assert engine.jobs_find_by_ids([]) == []


# ---------------------------------------------------------------------------- outbox_listener --


@pytest.mark.django_db(transaction=True)
def test_the_listener_hears_a_staging_when_it_commits(engine):
    if not engine.features.listen_notify:
        pytest.skip("engine has no push notifications")
    listener = engine.outbox_listener("conformance-outbox-listen")
    try:
        with engine.atomic():
            staged(engine)
            staged(engine)
        heard: list[str] = []
        for _ in range(100):  # up to 50 s in total: a deadline, not a measurement
            heard = listener.wait(0.5)
            if heard:
                break
        # One transaction, two stagings: one notification (PostgreSQL folds identical ones).
        assert heard == [""]
    finally:
        listener.close()
