"""Whatever the caller's isolation level, rate limits stay exact, wake-ups happen, or the call
refuses with a clear error naming the level (docs/guarantees.md, "Isolation levels").

Each call is made inside a transaction opened at READ COMMITTED, REPEATABLE READ and
SERIALIZABLE. What is exact only under READ COMMITTED (a rate budget's spending, an event's
rendezvous) refuses the other two, writing nothing; what works at any level (enqueue, an
operator's cancel of a child, which wakes its parent) is shown to.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.db import connection, transaction

from django_xjobs import RateLimit, api, publish_event
from django_xjobs.engines import get_engine
from django_xjobs.exceptions import IsolationLevelRefused
from django_xjobs.models import Job, JobEvent, JobStep, RateUnit
from tests.conformance.conftest import a_parent_waiting_on, claim

pytestmark = pytest.mark.django_db(transaction=True)

LEVELS = ["read committed", "repeatable read", "serializable"]


@contextmanager
def a_transaction_at(level: str) -> Iterator[None]:
    """A transaction.atomic() whose transaction runs at ``level``."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"set transaction isolation level {level}")
            cursor.execute("select current_setting('transaction_isolation')")
            assert cursor.fetchone()[0] == level
        yield


@pytest.mark.parametrize("level", LEVELS)
def test_a_rate_budget_is_spent_under_read_committed_only_and_refused_naming_the_level(level):
    limit = RateLimit(key="iso", limit=1, period=timedelta(minutes=1))
    if level == "read committed":
        with a_transaction_at(level):
            assert limit.try_acquire()
            assert not limit.try_acquire()  # exact: one unit per window
        assert RateUnit.objects.count() == 1
        return
    with pytest.raises(IsolationLevelRefused, match=f"this transaction is {level.upper()}"):
        with a_transaction_at(level):
            limit.try_acquire()
    assert RateUnit.objects.count() == 0  # nothing spent
    assert limit.try_acquire()  # and outside the transaction it spends as usual


@pytest.mark.parametrize("level", LEVELS)
def test_publishing_an_event_happens_under_read_committed_only_and_is_refused_otherwise(level):
    if level == "read committed":
        with a_transaction_at(level):
            publish_event("iso.paid", {"n": 1})
        assert JobEvent.objects.count() == 1
        return
    with pytest.raises(IsolationLevelRefused, match="READ COMMITTED"):
        with a_transaction_at(level):
            publish_event("iso.paid", {"n": 1})
    assert JobEvent.objects.count() == 0


@pytest.mark.parametrize("level", LEVELS)
def test_an_enqueue_and_an_operators_cancel_of_the_last_child_wake_the_parent_at_any_level(
        level):
    engine = get_engine()
    parent, [kid] = a_parent_waiting_on(engine, 1)
    with a_transaction_at(level):
        handle = api.enqueue("testapp.nap", {"ms": 1})
        assert api.cancel(kid, reason="not needed").changed
    assert Job.objects.get(id=handle.id).state == "ready"
    assert JobStep.objects.get(run_id=parent.run_id, name="naps").pending == 0
    assert Job.objects.get(id=parent.id).run_at <= engine.db_now()  # woken
    assert [j.id for j in claim(engine, "parents")] == [parent.id]


def test_the_engines_own_transactions_run_at_read_committed_whatever_django_opens_them_at():
    engine = get_engine()
    options = connection.settings_dict.setdefault("OPTIONS", {})
    connection.close()
    options["isolation_level"] = 3  # psycopg.IsolationLevel.REPEATABLE_READ
    try:
        with connection.cursor() as cursor, transaction.atomic():
            cursor.execute("select current_setting('transaction_isolation')")
            assert cursor.fetchone()[0] == "repeatable read"  # Django's, as configured
        with engine.atomic(), connection.cursor() as cursor:
            cursor.execute("select current_setting('transaction_isolation')")
            assert cursor.fetchone()[0] == "read committed"  # django-xjobs's own
        # So an event is published from a transaction of its own as on any database.
        publish_event("iso.own", None)
        assert JobEvent.objects.filter(name="iso.own").exists()
    finally:
        del options["isolation_level"]
        connection.close()


@pytest.mark.parametrize("level", LEVELS[1:])
def test_a_worker_whose_sessions_default_to_another_isolation_level_refuses_to_start(
        spawn_worker, level):
    # PGOPTIONS: as ALTER ROLE ... SET default_transaction_isolation would, for every session.
    worker = spawn_worker("--burst", env={
        "PGOPTIONS": f"-c default_transaction_isolation={level.replace(' ', chr(92) + ' ')}"})
    assert worker.wait(60) == 1
    log = worker.log()
    assert f"the worker's database sessions run at {level.upper()}" in log
    assert "need READ COMMITTED" in log and "Traceback" not in log
