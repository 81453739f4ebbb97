"""The soak's session check (django_xjobs/soak/observe.py) on real sessions: a worker session of
the soak held in a transaction past a lease is one finding about its backend, however many
samples see it and whatever names it bears, that says what tells a stalled client from a
transaction left open and from a statement waiting on a lock, and which sessions block it;
another soak's session and an excused worker's are not findings."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection

from django_xjobs.models import Job
from django_xjobs.soak.observe import Observer
from tests.conftest import raw_connection, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 0.2


def observer(**options: Any) -> Observer:
    return Observer("soak1", "xjobs_soak", lease=LEASE, stop=threading.Event(), **options)


def past_the_lease(*pids: int, waiting: bool = False) -> None:
    """Until pg_stat_activity shows each of ``pids`` in a transaction open longer than the lease
    (and, ``waiting``, waiting on a lock)."""

    def seen() -> bool:
        with connection.cursor() as cur:
            cur.execute(
                "select count(*) from pg_stat_activity where pid = any(%s)"
                " and now() - xact_start > make_interval(secs => %s)"
                " and (not %s or wait_event_type = 'Lock')", [list(pids), LEASE, waiting])
            return cur.fetchone()[0] == len(pids)

    wait_until(seen, message=f"sessions {pids} in a transaction past the lease")


def test_a_session_in_a_transaction_past_a_lease_is_one_finding_that_says_how_it_stands():
    held, other, excused = (raw_connection(application_name=f"xjobs:{name}:heartbeat")
                            for name in ("soak1-w0.1", "soak2-w0.1", "soak1-w1.1"))
    pid = held.info.backend_pid
    try:
        for conn in (held, other, excused):
            conn.execute("select txid_current()")  # a write's xid, in an open transaction
        past_the_lease(*(conn.info.backend_pid for conn in (held, other, excused)))
        watch = observer(excused=lambda worker_id: worker_id == "soak1-w1.1")
        watch._sessions(connection.alias)
        watch._sessions(connection.alias)  # the same backend again: the same finding
    finally:
        for conn in (held, other, excused):
            conn.close()

    [finding] = watch.seen.long_transactions()
    assert finding.startswith(f"xjobs:soak1-w0.1:heartbeat (pid {pid}) idle in transaction, "
                              f"transaction open ")
    assert "(last statement 'select txid_current()', begun " in finding
    assert "; wrote)" in finding
    assert finding.endswith("; seen in 2 samples")
    assert "blocked by" not in finding
    assert watch.seen.listen_transactions() == []


def test_a_session_waiting_on_a_row_lock_names_the_session_that_blocks_it():
    """A heartbeat's renewal waits on a job's row, locked by a request's transaction left open:
    the finding says it waits on a lock, and names the request's session, its state, and the
    statement that took the lock."""
    job = Job.objects.create(name="xjobs_soak.plain", queue="xjobs_soak", idempotency_key="k")
    holder = raw_connection(application_name="request")
    waiter = raw_connection(application_name="xjobs:soak1-w0.1:heartbeat", autocommit=True)
    holder_pid, waiter_pid = holder.info.backend_pid, waiter.info.backend_pid
    renewal = threading.Thread(target=waiter.execute, args=(
        "update x_jobs set visible_at = now() where id = %s", [job.id]))
    try:
        holder.execute("select id from x_jobs where id = %s for update", [job.id])
        renewal.start()
        past_the_lease(waiter_pid, waiting=True)
        watch = observer()
        watch._sessions(connection.alias)
    finally:
        holder.rollback()  # the renewal goes through
        if renewal.is_alive():
            renewal.join()
        holder.close()
        waiter.close()

    [finding] = watch.seen.long_transactions()
    assert finding.startswith(f"xjobs:soak1-w0.1:heartbeat (pid {waiter_pid}) "
                              f"waiting on a lock (Lock/transactionid), transaction open ")
    assert "(statement 'update x_jobs set visible_at = now() where id = " in finding
    assert (f"; blocked by pid {holder_pid} (application_name 'request', "
            f"idle in transaction, transaction open ") in finding
    assert "s: 'select id from x_jobs where id = $1 for update')" in finding


def test_a_backend_is_one_finding_whatever_names_it_bears():
    """Behind a transaction pooler a name set with SET stays on the server connection and
    names whoever uses it next: the finding follows the backend, and says which other names it
    bore and which other session bears its name."""
    held = raw_connection(application_name="xjobs:soak1-w0.1:loop")
    namesake = raw_connection(application_name="xjobs:soak1-w0.1:heartbeat", autocommit=True)
    pid, namesake_pid = held.info.backend_pid, namesake.info.backend_pid
    try:
        held.execute("select 1")  # opens its transaction
        past_the_lease(pid)
        watch = observer()
        watch._sessions(connection.alias)
        held.execute("set application_name = 'xjobs:soak1-w0.1:heartbeat'")
        watch._sessions(connection.alias)
    finally:
        held.close()
        namesake.close()

    [finding] = watch.seen.long_transactions()
    assert finding.startswith(f"xjobs:soak1-w0.1:heartbeat (pid {pid}) idle in transaction, ")
    assert '(last statement "set application_name = ' in finding
    assert "; seen in 2 samples; the same backend also named 'xjobs:soak1-w0.1:loop'" in finding
    assert finding.endswith(f"; its name also on pid {namesake_pid}")


def test_an_advisory_lock_held_outside_a_transaction_is_found_at_its_second_sample():
    """One sample cannot tell a lock held outside a transaction from a claim's transaction-level
    lock whose commit fell between the reads of pg_locks and pg_stat_activity: a session idle
    with an advisory lock is a finding once two samples in a row have seen it."""
    leaked = raw_connection(application_name="xjobs:soak1-w0.1:loop", autocommit=True)
    try:
        leaked.execute("select pg_advisory_lock(4242)")
        watch = observer()
        watch._sessions("default")
        assert watch.seen.advisory_outside == []
        watch._sessions("default")
        pid = leaked.info.backend_pid
        assert watch.seen.advisory_outside == [f"xjobs:soak1-w0.1:loop (pid {pid})"]
    finally:
        leaked.close()
