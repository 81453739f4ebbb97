"""Maintenance operations: relayed outbox rows, expired concurrency slots, expired events.

(jobs_purge, with the steps of the purged runs, is pinned in test_operators.py.) Rows are put
into states through the ORM models; every delete is counted per statement to show the batches.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_xjobs.models import JobEvent, JobLease, OutboxEntry


def statements(ctx: CaptureQueriesContext, name: str) -> int:
    return sum(f"/* {name} */" in q["sql"] for q in ctx.captured_queries)


def outbox_row(published_at=None) -> OutboxEntry:
    return OutboxEntry.objects.create(id=uuid.uuid4(), job="testapp.noop",
                                      published_at=published_at)


# ------------------------------------------------------------------------- outbox rows --


@pytest.mark.django_db
def test_outbox_purge_deletes_rows_published_before_the_cutoff_in_batches(engine):
    now = engine.db_now()
    old = [outbox_row(now - timedelta(days=3, minutes=i)) for i in range(5)]
    recent = outbox_row(now - timedelta(hours=1))
    pending = outbox_row(None)

    with CaptureQueriesContext(connection) as ctx:
        deleted = engine.outbox_purge_published(published_before=now - timedelta(days=1),
                                                batch_size=2)

    assert deleted == len(old)
    assert statements(ctx, "outbox_purge_published") == 3  # 2 + 2 + 1
    assert set(OutboxEntry.objects.values_list("id", flat=True)) == {recent.id, pending.id}


@pytest.mark.django_db
def test_outbox_purge_never_touches_a_pending_row_however_old(engine):
    pending = OutboxEntry.objects.create(id=uuid.uuid4(), job="testapp.noop")
    OutboxEntry.objects.filter(id=pending.id).update(
        staged_at=engine.db_now() - timedelta(days=365))

    assert engine.outbox_purge_published(published_before=engine.db_now()) == 0
    assert OutboxEntry.objects.filter(id=pending.id).exists()


# ------------------------------------------------------------------- concurrency slots --


def slot(key: str, n: int, expires_at) -> JobLease:
    return JobLease.objects.create(lease_key=key, slot=n, holder=f"worker-{n}",
                                   expires_at=expires_at)


@pytest.mark.django_db
def test_slots_purge_deletes_slots_expired_longer_than_the_grace_in_batches(engine):
    now = engine.db_now()
    long_expired = [slot("tenant:a", n, now - timedelta(minutes=10 + n)) for n in range(3)]
    within_grace = slot("tenant:b", 0, now - timedelta(seconds=5))
    live = slot("tenant:c", 0, now + timedelta(seconds=30))

    with CaptureQueriesContext(connection) as ctx:
        deleted = engine.slots_purge_expired(grace_ms=60_000, batch_size=2)

    assert deleted == len(long_expired)
    assert statements(ctx, "slots_purge_expired") == 2
    assert set(JobLease.objects.values_list("id", flat=True)) == {within_grace.id, live.id}


@pytest.mark.django_db
def test_slots_purge_with_no_grace_takes_every_expired_slot_and_no_live_one(engine):
    now = engine.db_now()
    expired = slot("k", 0, now - timedelta(milliseconds=1))
    at_expiry = slot("k", 1, now)  # expires_at <= now(): expired
    live = slot("k", 2, now + timedelta(milliseconds=500))

    assert engine.slots_purge_expired(grace_ms=0) == 2

    remaining = set(JobLease.objects.values_list("id", flat=True))
    assert remaining == {live.id} and not {expired.id, at_expiry.id} & remaining


# ---------------------------------------------------------------------------- events --


@pytest.mark.django_db
def test_events_purge_deletes_expired_events_in_batches_and_keeps_live_ones(engine):
    now = engine.db_now()
    for i in range(5):
        JobEvent.objects.create(name="e", expires_at=now - timedelta(minutes=i + 1))
    live = JobEvent.objects.create(name="e", expires_at=now + timedelta(days=1))

    with CaptureQueriesContext(connection) as ctx:
        deleted = engine.events_purge(batch_size=2)

    assert deleted == 5
    assert statements(ctx, "events_purge") == 3
    assert list(JobEvent.objects.values_list("id", flat=True)) == [live.id]
