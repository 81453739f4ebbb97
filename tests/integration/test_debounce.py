"""Debounce on the live key (docs/flow-control.md, "Debounce"): a burst of enqueues of one
(name, tenant, key) collapses into one pending job with the last input, due ``debounce`` after
the last enqueue and never later than ``debounce_max_wait`` after the first.

Real PostgreSQL, no worker (tests/acceptance/test_debounce_runs.py runs them): these tests read
the rows an enqueue leaves. Due times are compared with the database's own clock, read in the
same transaction as the row, so no assertion depends on how fast the test runs.
"""

from __future__ import annotations

import re
import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, connections

from django_xjobs import enqueue, enqueue_many, enqueue_on_commit
from django_xjobs.exceptions import InvalidJobInput
from django_xjobs.models import Job
from django_xjobs.slots import debounce_key
from tests.testapp import jobs as testapp_jobs

pytestmark = pytest.mark.django_db(transaction=True)

record = testapp_jobs.record


def db_now() -> datetime:
    with connection.cursor() as cur:
        cur.execute("select now()")
        return cur.fetchone()[0]


def live(key: str, tenant: str | None = None) -> list[Job]:
    return list(Job.objects.filter(
        name="testapp.record", idempotency_key=key, tenant_id=tenant,
        state__in=("ready", "delayed", "running", "suspended", "blocked"),
    ))


# ------------------------------------------------------------------------------- collapse --


def test_a_hundred_enqueues_of_one_key_leave_one_job_with_the_last_input():
    bound = record.using(idempotency_key="burst", debounce=timedelta(seconds=5),
                         debounce_max_wait=timedelta(minutes=1))
    first = bound.enqueue(tag="0")
    assert first.created
    created_at = Job.objects.get(id=first.id).created_at
    previous_run_at = Job.objects.get(id=first.id).run_at
    for n in range(1, 100):
        handle = bound.enqueue(tag=str(n))
        assert (handle.id, handle.created) == (first.id, False)
        row = Job.objects.get(id=first.id)
        # Each enqueue moves the due time to its own now() + 5 s (never backwards) ...
        assert row.run_at >= previous_run_at
        assert row.run_at <= created_at + timedelta(minutes=1)
        previous_run_at = row.run_at
    rows = live("burst")
    assert [r.id for r in rows] == [first.id]
    row = rows[0]
    assert row.input == {"tag": "99"}
    assert row.state == "delayed"
    assert row.created_at == created_at
    assert row.concurrency_key == debounce_key("testapp.record", None, "burst")
    # ... to 5 s after the last enqueue: the transaction of the last one began before this read.
    now = db_now()
    assert now - timedelta(seconds=5) < row.run_at - timedelta(seconds=5) <= now
    assert Job.objects.count() == 1


def test_the_due_time_never_passes_created_at_plus_max_wait():
    bound = record.using(idempotency_key="capped", debounce=timedelta(seconds=30),
                         debounce_max_wait=timedelta(seconds=40))
    first = bound.enqueue(tag="first")
    row = Job.objects.get(id=first.id)
    # created_at is the insert's statement time, run_at counts from its transaction's now().
    assert (row.run_at - row.created_at).total_seconds() == pytest.approx(30, abs=1)
    # Make the pending job 20 s old: the next enqueue's now() + 30 s is past the 40 s cap.
    Job.objects.filter(id=first.id).update(created_at=row.created_at - timedelta(seconds=20))
    handle = bound.enqueue(tag="second")
    assert handle.id == first.id
    row = Job.objects.get(id=first.id)
    assert row.run_at == row.created_at + timedelta(seconds=40)
    assert (row.state, row.input) == ("delayed", {"tag": "second"})


def test_a_job_older_than_max_wait_is_made_due_now():
    bound = record.using(idempotency_key="overdue", debounce=5, debounce_max_wait=60)
    first = bound.enqueue(tag="first")
    Job.objects.filter(id=first.id).update(created_at=db_now() - timedelta(minutes=2))
    handle = bound.enqueue(tag="last")
    row = Job.objects.get(id=handle.id)
    assert handle.id == first.id
    assert (row.state, row.input) == ("ready", {"tag": "last"})
    assert row.run_at == row.created_at + timedelta(seconds=60)


def test_without_max_wait_the_due_time_keeps_moving():
    bound = record.using(idempotency_key="uncapped", debounce="5s")
    first = bound.enqueue(tag="first")
    Job.objects.filter(id=first.id).update(created_at=db_now() - timedelta(days=1))
    bound.enqueue(tag="second")
    row = Job.objects.get(id=first.id)
    assert row.run_at > db_now()
    assert (row.state, row.input) == ("delayed", {"tag": "second"})


def test_durations_are_taken_as_timedelta_seconds_or_strings():
    for n, (debounce, max_wait, expected) in enumerate([
        (timedelta(seconds=2), timedelta(seconds=3), 2.0),
        (2.5, 10, 2.5),
        ("1500ms", "1m", 1.5),
    ]):
        handle = record.using(idempotency_key=f"dur-{n}", debounce=debounce,
                              debounce_max_wait=max_wait).enqueue()
        row = Job.objects.get(id=handle.id)
        assert (row.run_at - row.created_at).total_seconds() == pytest.approx(expected, abs=0.2)


def test_different_tenants_never_merge():
    bound = record.using(idempotency_key="per-tenant", debounce=5)
    acme = bound.using(tenant_id="acme").enqueue(tag="acme")
    globex = bound.using(tenant_id="globex").enqueue(tag="globex")
    untenanted = bound.enqueue(tag="none")
    assert len({acme.id, globex.id, untenanted.id}) == 3
    assert all(h.created for h in (acme, globex, untenanted))
    again = bound.using(tenant_id="acme").enqueue(tag="acme 2")
    assert (again.id, again.created) == (acme.id, False)
    assert Job.objects.get(id=acme.id).input == {"tag": "acme 2"}
    assert Job.objects.get(id=globex.id).input == {"tag": "globex"}
    assert Job.objects.get(id=untenanted.id).input == {"tag": "none"}
    assert Job.objects.get(id=acme.id).concurrency_key != Job.objects.get(
        id=globex.id).concurrency_key


def test_a_blocked_job_stays_blocked_with_the_new_input():
    first = record.using(idempotency_key="held", debounce=5).enqueue(tag="first")
    Job.objects.filter(id=first.id).update(state="blocked", blocked_on="debounce:x")
    handle = record.using(idempotency_key="held", debounce=5).enqueue(tag="second")
    row = Job.objects.get(id=first.id)
    assert handle.id == first.id
    assert (row.state, row.input, row.blocked_on) == ("blocked", {"tag": "second"}, "debounce:x")


@pytest.mark.parametrize("state", ["running", "suspended"])
def test_an_enqueue_while_a_run_is_under_way_adds_one_follow_up(state):
    bound = record.using(idempotency_key="under-way", debounce=5)
    first = bound.enqueue(tag="first")
    Job.objects.filter(id=first.id).update(state=state, run_at=db_now())
    follow = bound.enqueue(tag="second")
    assert follow.created and follow.id != first.id
    again = bound.enqueue(tag="third")
    assert (again.id, again.created) == (follow.id, False)
    under_way = Job.objects.get(id=first.id)
    # The run under way keeps its input and leaves the key; the follow-up holds it.
    assert (under_way.state, under_way.input) == (state, {"tag": "first"})
    assert under_way.idempotency_key == str(first.id)
    assert [r.id for r in live("under-way")] == [follow.id]
    row = Job.objects.get(id=follow.id)
    assert (row.state, row.input) == ("delayed", {"tag": "third"})
    assert row.concurrency_key == under_way.concurrency_key == debounce_key(
        "testapp.record", None, "under-way")


def test_a_job_waiting_for_a_retry_keeps_its_input_and_gets_a_follow_up():
    # A run that failed once is under way: its completed steps were computed from its input.
    bound = record.using(idempotency_key="retrying", debounce=5)
    first = bound.enqueue(tag="first")
    Job.objects.filter(id=first.id).update(attempt=1)
    follow = bound.enqueue(tag="second")
    assert follow.created and follow.id != first.id
    row = Job.objects.get(id=first.id)
    assert (row.state, row.input, row.idempotency_key) == ("delayed", {"tag": "first"},
                                                           str(first.id))
    assert [r.id for r in live("retrying")] == [follow.id]


def test_a_job_handed_back_with_a_completed_step_keeps_its_input():
    # Snooze and a shutdown give the attempt back; a step it completed still used its input.
    from django_xjobs.models import JobStep

    bound = record.using(idempotency_key="stepped", debounce=5)
    first = bound.enqueue(tag="first")
    row = Job.objects.get(id=first.id)
    JobStep.objects.create(run_id=row.run_id, name="fetch", status="completed", output=1)
    follow = bound.enqueue(tag="second")
    assert follow.created and follow.id != first.id
    assert Job.objects.get(id=first.id).input == {"tag": "first"}


def test_a_blocked_job_on_its_way_back_from_a_durable_sleep_gets_a_follow_up():
    bound = record.using(idempotency_key="resuming", debounce=5)
    first = bound.enqueue(tag="first")
    Job.objects.filter(id=first.id).update(state="blocked", attempt=1, blocked_resume=True,
                                           blocked_on="debounce:x")
    follow = bound.enqueue(tag="second")
    assert follow.created and follow.id != first.id
    assert Job.objects.get(id=first.id).input == {"tag": "first"}


def test_a_plain_enqueue_of_a_debounced_key_still_deduplicates():
    first = record.using(idempotency_key="mixed", debounce=5).enqueue(tag="first")
    plain = record.using(idempotency_key="mixed").enqueue(tag="plain")
    assert (plain.id, plain.created) == (first.id, False)
    assert Job.objects.get(id=first.id).input == {"tag": "first"}


def test_a_long_key_gets_a_hashed_concurrency_key_within_the_limit():
    key = "k" * 1000
    handle = record.using(idempotency_key=key, tenant_id="t" * 200, debounce=5).enqueue()
    row = Job.objects.get(id=handle.id)
    assert row.concurrency_key.startswith("debounce:testapp.record:" + "t" * 200 + ":sha256:")
    assert len(row.concurrency_key) <= 500
    assert record.using(idempotency_key=key, tenant_id="t" * 200,
                        debounce=5).enqueue().id == handle.id


# ----------------------------------------------------------------------------------- race --


def test_sixteen_threads_enqueueing_one_key_leave_exactly_one_live_job():
    barrier = threading.Barrier(16)
    errors: list[BaseException] = []
    ids: list[object] = []

    def enqueue_some(n: int) -> None:
        try:
            barrier.wait(timeout=30)
            for i in range(10):
                ids.append(record.using(idempotency_key="race", debounce=5,
                                        debounce_max_wait=60).enqueue(tag=f"{n}-{i}").id)
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=enqueue_some, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert len(ids) == 160
    rows = live("race")
    assert len(rows) == 1
    assert set(ids) == {rows[0].id}
    assert Job.objects.count() == 1


def test_a_race_with_a_run_under_way_yields_exactly_one_follow_up():
    first = record.using(idempotency_key="race-running", debounce=5).enqueue(tag="first")
    Job.objects.filter(id=first.id).update(state="running")
    barrier = threading.Barrier(16)
    errors: list[BaseException] = []

    def enqueue_one(n: int) -> None:
        try:
            barrier.wait(timeout=30)
            record.using(idempotency_key="race-running", debounce=5).enqueue(tag=str(n))
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=enqueue_one, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert Job.objects.count() == 2
    assert len(live("race-running")) == 1
    assert Job.objects.get(id=first.id).input == {"tag": "first"}


# ------------------------------------------------------------------------------ bad input --

BAD = {
    "no key": (lambda: record.using(debounce=5).enqueue(), "needs idempotency_key"),
    "max wait alone": (lambda: record.using(idempotency_key="k", debounce_max_wait=5).enqueue(),
                       "debounce_max_wait needs debounce"),
    "max wait below debounce": (
        lambda: record.using(idempotency_key="k", debounce=10, debounce_max_wait=5).enqueue(),
        "must be at least debounce"),
    "zero": (lambda: record.using(idempotency_key="k", debounce=0).enqueue(),
             "more than zero"),
    "negative": (lambda: record.using(idempotency_key="k", debounce=-1).enqueue(),
                 "must not be negative"),
    "negative max wait": (
        lambda: record.using(idempotency_key="k", debounce=1,
                             debounce_max_wait=timedelta(seconds=-1)).enqueue(),
        "must not be negative"),
    "not a duration": (lambda: record.using(idempotency_key="k", debounce="soon").enqueue(),
                       "is not a duration"),
    "a bool": (lambda: record.using(idempotency_key="k", debounce=True).enqueue(),
               "expected a duration"),
    "with delay": (lambda: record.using(idempotency_key="k", debounce=1, delay=5).enqueue(),
                   "give debounce or delay"),
    "with run_at": (lambda: record.using(idempotency_key="k", debounce=1,
                                         run_at=datetime(2030, 1, 1, tzinfo=UTC)).enqueue(),
                    "give debounce or run_at"),
    "job with concurrency": (
        lambda: testapp_jobs.slotted.using(idempotency_key="k", debounce=1).enqueue(group="g"),
        "debounce cannot be combined with concurrency"),
    "with concurrency_key": (
        lambda: record.using(idempotency_key="k", debounce=1,
                             concurrency_key="slot:x").enqueue(),
        "debounce cannot be combined with concurrency"),
    "enqueue_many": (
        lambda: enqueue_many([("testapp.record", {}, {"idempotency_key": "k", "debounce": 1})]),
        "enqueue_many (and bulk_enqueue) does not take debounce"),
    "bulk_enqueue": (
        lambda: record.bulk_enqueue([{"tag": "a"}], idempotency_key="k", debounce=1),
        "enqueue_many (and bulk_enqueue) does not take debounce"),
    "enqueue_on_commit": (
        lambda: record.using(idempotency_key="k", debounce=1).enqueue_on_commit(),
        "enqueue_on_commit does not take debounce"),
    "enqueue_on_commit by name": (
        lambda: enqueue_on_commit("testapp.record", {}, idempotency_key="k", debounce=1),
        "enqueue_on_commit does not take debounce"),
    "by name": (lambda: enqueue("testapp.record", {}, debounce=1), "needs idempotency_key"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_debounce_options_raise_a_clear_error_and_insert_nothing(case):
    call, message = BAD[case]
    with pytest.raises(InvalidJobInput, match=re.escape(message)):
        call()
    assert Job.objects.count() == 0


def test_a_bad_enqueue_leaves_the_pending_job_as_it_was():
    bound = record.using(idempotency_key="kept", debounce=5)
    first = bound.enqueue(tag="first")
    before = Job.objects.get(id=first.id)
    with pytest.raises(InvalidJobInput):
        bound.using(debounce_max_wait=1).enqueue(tag="second")
    after = Job.objects.get(id=first.id)
    assert (after.input, after.run_at, after.updated_at) == (
        before.input, before.run_at, before.updated_at)
