"""Enqueue joins the caller's transaction; bad input writes nothing and leaves it usable.

Transactional tests (real commits and rollbacks): a second connection, in another thread, is
what tells "committed" from "visible inside my own transaction".
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.conf import settings
from django.db import connection, connections, transaction
from django.test import override_settings

from django_xjobs import enqueue, enqueue_many
from django_xjobs.exceptions import InvalidJobInput, PayloadTooLarge, UnknownJob
from django_xjobs.models import Job
from tests.testapp import jobs as testapp_jobs
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)

record = testapp_jobs.record


class Boom(Exception):
    pass


def visible_elsewhere(job_id) -> bool:
    """Whether another connection (another thread) sees the job: i.e. it was committed."""
    seen: list[bool] = []

    def look() -> None:
        try:
            seen.append(Job.objects.filter(id=job_id).exists())
        finally:
            connections.close_all()

    t = threading.Thread(target=look)
    t.start()
    t.join(timeout=30)
    assert seen, "the second connection did not answer"
    return seen[0]


def business_write(tag: str) -> Effect:
    return Effect.objects.create(job_id="-", name="business", attempt=0, pid=0, kind="biz",
                                 tag=tag)


# --------------------------------------------------------------------------- transactions --


def test_a_job_enqueued_in_a_transaction_that_rolls_back_never_exists():
    with pytest.raises(Boom), transaction.atomic():
        business_write("order 1")
        handle = record.enqueue(tag="rolled back")
        assert Job.objects.filter(id=handle.id).exists()  # visible inside the transaction
        assert not visible_elsewhere(handle.id)  # and to no one else
        raise Boom
    assert not Job.objects.filter(id=handle.id).exists()
    assert not visible_elsewhere(handle.id)
    assert Job.objects.count() == 0
    assert Effect.objects.count() == 0


def test_a_job_enqueued_in_a_committed_transaction_exists_with_the_business_write():
    with transaction.atomic():
        business_write("order 2")
        handle = record.enqueue(tag="kept")
        assert not visible_elsewhere(handle.id)  # not before the commit
    assert visible_elsewhere(handle.id)
    row = Job.objects.get(id=handle.id)
    assert (row.name, row.state, row.input) == ("testapp.record", "ready", {"tag": "kept"})
    assert handle.created is True
    assert Effect.objects.filter(tag="order 2").count() == 1


def test_a_rolled_back_savepoint_takes_only_its_own_jobs():
    with transaction.atomic():
        kept = record.enqueue(tag="outer")
        with pytest.raises(Boom), transaction.atomic():
            dropped = record.enqueue(tag="inner")
            raise Boom
        assert not Job.objects.filter(id=dropped.id).exists()
    assert visible_elsewhere(kept.id)
    assert not visible_elsewhere(dropped.id)


def test_outside_a_transaction_enqueue_commits_at_once():
    assert connection.get_autocommit()
    handle = record.enqueue(tag="autocommit")
    assert visible_elsewhere(handle.id)


def test_an_idempotency_key_returns_the_live_job_instead_of_a_second_one():
    first = record.using(idempotency_key="order:9").enqueue(tag="a")
    second = record.using(idempotency_key="order:9").enqueue(tag="b")
    assert first.created is True
    assert second.created is False
    assert (second.id, second.run_id) == (first.id, first.run_id)
    assert Job.objects.filter(idempotency_key="order:9").count() == 1
    assert Job.objects.get(id=first.id).input == {"tag": "a"}


# ------------------------------------------------------------------------------ bad input --

NAIVE = datetime(2030, 1, 1, 12, 0)

BAD_CALLS = {
    "non-JSON input": lambda: record.enqueue(when={1, 2}),  # a datetime is stored (typed)
    "NaN": lambda: record.enqueue(x=float("nan")),
    "NUL": lambda: record.enqueue(tag="a\x00b"),
    "naive run_at": lambda: record.using(run_at=NAIVE).enqueue(),
    "negative delay": lambda: record.using(delay=timedelta(seconds=-5)).enqueue(),
    "delay and run_at": lambda: record.using(delay=1, run_at=datetime.now(UTC)).enqueue(),
    "bad queue": lambda: record.using(queue="no spaces allowed").enqueue(),
    "bad key": lambda: record.using(idempotency_key=42).enqueue(),
    "bad tenant": lambda: record.using(tenant_id="").enqueue(),
    "bad traceparent": lambda: record.using(traceparent="nope").enqueue(),
    "input not a dict": lambda: enqueue("testapp.record", ["tag"]),
    "bad name": lambda: enqueue("no spaces allowed", {}),
    "unknown option": lambda: enqueue("testapp.record", {}, retries=3),
}


@pytest.mark.parametrize("bad", BAD_CALLS.values(), ids=BAD_CALLS.keys())
def test_bad_input_in_a_transaction_raises_writes_nothing_and_leaves_it_usable(bad):
    with transaction.atomic():
        business_write("before")
        with pytest.raises(InvalidJobInput):
            bad()
        # The transaction is not aborted: a query and another enqueue still work in it.
        assert Job.objects.count() == 0
        good = record.enqueue(tag="after")
    assert list(Job.objects.values_list("id", flat=True)) == [good.id]
    assert Effect.objects.filter(tag="before").count() == 1


def test_a_payload_over_the_limit_raises_writes_nothing_and_leaves_the_transaction_usable():
    with override_settings(XJOBS={**settings.XJOBS, "MAX_PAYLOAD_BYTES": 64}):
        with transaction.atomic():
            with pytest.raises(PayloadTooLarge):
                record.enqueue(tag="x" * 100)
            good = record.enqueue(tag="small")
    assert list(Job.objects.values_list("id", flat=True)) == [good.id]


@pytest.mark.parametrize(
    "bad",
    [
        lambda: record.using(delay=timedelta.max).enqueue(),
        lambda: record.using(idempotency_key="order\ud800").enqueue(),
    ],
    ids=["delay past the end of time", "lone surrogate in the key"],
)
def test_input_the_database_would_refuse_is_refused_before_it_is_sent(bad):
    # Bugs pinned here: validation lets these through, so the database (or the driver) fails
    # instead of InvalidJobInput, and a failed statement aborts the caller's transaction.
    with transaction.atomic():
        business_write("before")
        with pytest.raises(InvalidJobInput):
            bad()
        assert Job.objects.count() == 0  # the transaction must still be usable
    assert Effect.objects.filter(tag="before").count() == 1


def test_an_unknown_job_name_raises_unknown_job_and_writes_nothing():
    with transaction.atomic():
        with pytest.raises(UnknownJob, match=r"'x\.y'"):
            enqueue("x.y", {"a": 1})
        assert Job.objects.count() == 0
        good = enqueue("testapp.record", {"tag": "by name"})
    row = Job.objects.get()
    assert (row.id, row.name, row.input) == (good.id, "testapp.record", {"tag": "by name"})


def test_enqueue_by_name_applies_options():
    handle = enqueue("testapp.record", {"tag": "n"}, tenant_id="acme", priority=5,
                     delay=timedelta(hours=1))
    row = Job.objects.get(id=handle.id)
    assert (row.tenant_id, row.priority, row.state) == ("acme", 5, "delayed")


# ------------------------------------------------------------------------------ enqueue_many --


def test_enqueue_many_writes_every_item_and_returns_handles_in_order():
    handles = enqueue_many([
        ("testapp.record", {"tag": "1"}),
        ("testapp.noop", None),
        ("testapp.record", {"tag": "3"}, {"tenant_id": "acme", "priority": 2}),
    ])
    rows = {r.id: r for r in Job.objects.all()}
    assert len(handles) == 3
    assert set(rows) == {h.id for h in handles}
    assert [rows[h.id].name for h in handles] == ["testapp.record", "testapp.noop",
                                                  "testapp.record"]
    assert [rows[h.id].input for h in handles] == [{"tag": "1"}, {}, {"tag": "3"}]
    assert (rows[handles[2].id].tenant_id, rows[handles[2].id].priority) == ("acme", 2)
    assert all(h.created for h in handles)


@pytest.mark.parametrize(
    "bad_item",
    [
        ("testapp.record", {"when": {1, 2}}),
        ("testapp.record", {"tag": "x"}, {"delay": -1}),
        ("testapp.record", {"tag": "x"}, {"retries": 3}),
        ("no spaces allowed", {}),
    ],
    ids=["non-JSON input", "negative delay", "unknown option", "bad name"],
)
def test_enqueue_many_validates_every_item_before_writing_any(bad_item):
    items = [("testapp.record", {"tag": str(i)}) for i in range(5)]
    items.insert(3, bad_item)
    with transaction.atomic():
        with pytest.raises(InvalidJobInput):
            enqueue_many(items)
        assert Job.objects.count() == 0
    assert Job.objects.count() == 0


def test_enqueue_many_with_an_unknown_name_writes_nothing():
    items = [("testapp.record", {"tag": "1"}), ("x.y", {}), ("testapp.record", {"tag": "2"})]
    with pytest.raises(UnknownJob, match=r"'x\.y'"):
        enqueue_many(items)
    assert Job.objects.count() == 0


def test_enqueue_many_validates_items_of_every_batch_before_the_first_statement():
    items = [("testapp.record", {"tag": str(i)}) for i in range(10)]
    items.append(("testapp.record", {"tag": float("inf")}))
    with pytest.raises(InvalidJobInput):
        enqueue_many(items, batch_size=3)
    assert Job.objects.count() == 0


def test_a_key_repeated_inside_one_batch_gives_one_job():
    a, b, c = enqueue_many([
        ("testapp.record", {"tag": "a"}, {"idempotency_key": "same"}),
        ("testapp.record", {"tag": "b"}, {"idempotency_key": "same"}),
        ("testapp.record", {"tag": "c"}, {"idempotency_key": "other"}),
    ])
    assert a.created and not b.created and c.created
    assert b.id == a.id and c.id != a.id
    assert Job.objects.count() == 2
    assert Job.objects.get(id=a.id).input == {"tag": "a"}
