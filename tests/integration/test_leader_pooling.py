"""The failure mode of a session advisory lock on a POOLED connection.

A transaction pooler (PgBouncer in transaction mode) lends one server session to many clients,
one transaction at a time. A session advisory lock belongs to the server session, not to the
client that took it, so once the client's transaction ends the lock either goes with the
pooler's reset (``DISCARD ALL``, PgBouncer's ``server_reset_query``) or stays on the session and
passes to whichever client the pooler hands it next. Either way two schedulers end up leading.
The lease row of ``x_scheduler_leader`` belongs to no session, and holds.

``OnePool`` is that pooler reduced to its essence: ONE real server connection that clients
take in turn, optionally reset between them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from django.db import connection

from django_xjobs.engines import get_engine
from django_xjobs.engines.postgres.sessions import advisory_key
from django_xjobs.engines.postgres.statements.scheduler import (
    LEADER_ADVISORY_LOCK_TRY,
    LEADER_ATTEMPT_ELECT,
)
from django_xjobs.scheduler.leadership import LOCK_KEY, AdvisoryLeadership, LeaseLeadership
from tests.conftest import raw_connection

pytestmark = pytest.mark.django_db(transaction=True)


def connect() -> psycopg.Connection:
    return raw_connection(autocommit=True)


class OnePool:
    """One server connection lent to one client at a time; ``reset`` runs when a client's
    transaction ends (None: handed on as it is, PgBouncer's transaction-mode default)."""

    def __init__(self, reset: str | None) -> None:
        self.server = connect()
        self.reset = reset
        self.backend_pids: set[int] = set()

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Connection]:
        with self.server.transaction():
            self.backend_pids.add(self.server.info.backend_pid)
            yield self.server
        if self.reset:
            self.server.execute(self.reset)

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def pool_factory():
    opened: list[Any] = []

    def make(reset: str | None) -> OnePool:
        pool = OnePool(reset)
        opened.append(pool)
        return pool

    yield make
    for pool in opened:
        pool.close()


def try_advisory(conn: psycopg.Connection) -> bool:
    return bool(conn.execute(LEADER_ADVISORY_LOCK_TRY.sql, advisory_key(LOCK_KEY)).fetchone()[0])


def elect(conn: psycopg.Connection, holder: str) -> bool:
    row = conn.execute(LEADER_ATTEMPT_ELECT.sql, {
        "lock_key": LOCK_KEY, "holder": holder, "lease_ms": 60_000}).fetchone()
    return row is not None


# --------------------------------------------------------- what a session lock does on a pool --


def test_a_session_advisory_lock_is_released_when_the_pooler_resets_the_connection(
        pool_factory):
    pool = pool_factory(reset="DISCARD ALL")
    with pool.transaction() as conn:
        a_leads = try_advisory(conn)  # scheduler A took the lock; A believes it leads
    other = connect()  # scheduler B, on a connection of its own
    try:
        b_leads = try_advisory(other)
    finally:
        other.close()

    assert a_leads and b_leads, "two leaders: the reset released A's lock behind its back"


def test_a_session_advisory_lock_passes_to_the_next_client_of_the_same_connection(
        pool_factory):
    pool = pool_factory(reset=None)
    with pool.transaction() as conn:
        a_leads = try_advisory(conn)
    with pool.transaction() as conn:
        b_leads = try_advisory(conn)  # B was lent A's session: the lock is re-entrant

    assert len(pool.backend_pids) == 1, "one server connection, returned and reused"
    assert a_leads and b_leads, "two leaders: B inherited A's session and its lock"


# ------------------------------------------------------------------ the lease row does not --


@pytest.mark.parametrize("reset", ["DISCARD ALL", None])
def test_the_lease_leader_holds_across_a_pooled_connection_returned_and_reused(
        pool_factory, reset):
    pool = pool_factory(reset=reset)
    with pool.transaction() as conn:
        a_leads = elect(conn, "scheduler-a")
    with pool.transaction() as conn:  # B gets A's very session
        b_leads = elect(conn, "scheduler-b")
    other = connect()
    try:
        b_leads_elsewhere = elect(other, "scheduler-b")
    finally:
        other.close()
    with pool.transaction() as conn:  # A renews, on whatever connection it is lent
        a_renews = elect(conn, "scheduler-a")

    assert len(pool.backend_pids) == 1
    assert a_leads and a_renews
    assert not b_leads and not b_leads_elsewhere


# ------------------------------------------------------------- the schedulers' own classes --


def test_lease_leadership_survives_its_django_connection_being_closed_and_reset():
    engine = get_engine()
    a = LeaseLeadership(engine=engine, holder="scheduler-a", lease=60, renew=15)
    b = LeaseLeadership(engine=engine, holder="scheduler-b", lease=60, renew=15)
    assert a.tick()
    with connection.cursor() as cursor:
        cursor.execute("discard all")  # what a pooler's reset does to the session
    connection.close()  # and the connection goes back: the next statement gets another one

    assert b.tick() is False
    b.lost("test: ask again at once")
    a.lost("test: renew at once")
    assert a.tick() is True and b.tick() is False
    assert engine.leader_get(LOCK_KEY).holder == "scheduler-a"


def test_advisory_leadership_holds_its_lock_on_a_dedicated_connection_not_djangos():
    engine = get_engine()
    a = AdvisoryLeadership(engine=engine, holder="scheduler-a", lease=60, renew=15)
    b = AdvisoryLeadership(engine=engine, holder="scheduler-b", lease=60, renew=15)
    try:
        assert a.tick()
        connection.close()  # the thread's (possibly pooled) Django connection comes and goes

        assert b.tick() is False
        holder = engine.leader_advisory_holder(LOCK_KEY)
        assert holder is not None and holder.holder == "xjobs:scheduler-a:leader"
        a.resign()  # a clean stop releases it; the next attempt of B wins
        b.lost("test: ask again at once")
        assert b.tick() is True
    finally:
        a.close()
        b.close()


def test_the_advisory_sessions_statements_are_instrumented_and_a_fault_there_loses_the_session():
    """The dedicated session's statements go through the engine's one instrumentation, like
    those on Django's connection: they have fault points, and a fault injected there reads as
    the session lost (the leader demotes itself and opens a new session), never as a driver
    error escaping the scheduler."""
    from django_xjobs import faults
    from django_xjobs.engines import SessionLost

    reached: list[str] = []
    session = get_engine().leader_advisory_session(LOCK_KEY, "tests-advisory-faults")
    try:
        faults.inject_hook("after:leader_advisory_lock_try", reached.append)
        assert session.try_lock()
        assert reached == ["after:leader_advisory_lock_try"]
        faults.inject("before:leader_advisory_held", "raise")
        with pytest.raises(SessionLost, match="injected fault at before:leader_advisory_held"):
            session.holds()
        assert session.holds()  # the fault raised before the statement: the session is intact
    finally:
        faults.clear()
        session.unlock()
        session.close()


def test_an_advisory_lock_of_the_same_key_in_another_database_is_not_our_leader():
    """Advisory locks live per database: a project sharing the server (or another test
    database) may hold the same key. Its holder is not this database's leader, and the lock
    does not stop ours from being taken."""
    key = advisory_key(LOCK_KEY)
    with raw_connection(dbname="postgres", autocommit=True) as elsewhere:
        elsewhere.execute("select set_config('application_name', 'another-project', false)")
        assert elsewhere.execute("select pg_try_advisory_lock(%(lock_class)s::int, "
                                 "%(lock_id)s::int)", key).fetchone() == (True,)
        engine = get_engine()
        assert engine.leader_advisory_holder(LOCK_KEY) is None
        ours = AdvisoryLeadership(engine=engine, holder="scheduler-a", lease=60, renew=15)
        try:
            assert ours.tick() is True
            assert engine.leader_advisory_holder(LOCK_KEY).holder == "xjobs:scheduler-a:leader"
        finally:
            ours.close()
