"""Workers behind a real PgBouncer in transaction mode (tests/pooler.py), in the two modes
docs/deployment.md documents, "PgBouncer and other connection poolers":

* ``poll``: everything through the pooler, ``NOTIFY`` off (workers poll);
* ``direct-listen``: NOTIFY on, the dedicated sessions (LISTEN, the advisory session) on
  ``XJOBS["LISTEN_DATABASE"]``, an alias straight to PostgreSQL ("direct", tests/settings.py).

Both with ``PREPARED_STATEMENTS`` off (the pooler, Debian's 1.18, keeps none). Each test runs the
worker faults of test_worker_faults.py and test_worker_signals.py behind the pooler and asserts
from the database; while jobs flow, a watcher samples pg_locks: no backend of the pooler holds an
advisory lock between two transactions (a session lock, which the pooler would hand to whichever
client comes next).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from django_xjobs.records import TERMINAL_STATES
from tests.conftest import wait_until
from tests.leases import lapse_worker

from .conftest import (
    FAST,
    effects,
    job_row,
    terminate_backend,
    wait_effect,
    wait_exit,
    wait_log,
    wait_state,
)
from .test_scheduler_fleet import TICK, assert_exactly_once, lease_holder, start_row

pytestmark = pytest.mark.acceptance

FINISHED = TERMINAL_STATES

# mode -> (XJOBS of the worker, whether it gets the "direct" alias)
MODES: dict[str, tuple[dict[str, Any], bool]] = {
    "poll": ({"NOTIFY": False, "PREPARED_STATEMENTS": False}, False),
    "direct-listen": ({"PREPARED_STATEMENTS": False, "LISTEN_DATABASE": "direct"}, True),
}


@pytest.fixture(params=list(MODES))
def mode(request) -> str:
    return request.param


@pytest.fixture
def behind(pgbouncer, start_worker, mode):
    """``behind(role, *args, settings=...)``: start_worker, behind the pooler, in this mode."""
    xjobs, direct = MODES[mode]

    def start(role: str, *args: str, settings: dict[str, Any] | None = None, **kwargs: Any):
        return start_worker(role, *args, settings={**xjobs, **(settings or {})},
                            env=pgbouncer.worker_env(listen_direct=direct), **kwargs)

    return start


# ------------------------------------------------------------------------ the lock watch --

_IDLE = """select pid, state_change from pg_stat_activity
            where datname = current_database() and state = 'idle'"""
_ADVISORY = """select pid, classid, objid, objsubid from pg_locks
                where locktype = 'advisory' and granted
                  and database = (select oid from pg_database where datname = current_database())"""


def session_advisory_locks(conn: Any, pgbouncer: Any) -> list[tuple]:
    """Advisory locks that a backend of the pooler holds outside any transaction: the backend
    was idle, without a state change, from before the read of pg_locks until after it (each
    statement is a transaction of its own, so each read of pg_stat_activity is fresh)."""
    before = dict(conn.execute(_IDLE).fetchall())
    locks = conn.execute(_ADVISORY).fetchall()
    after = dict(conn.execute(_IDLE).fetchall())
    held = [lock for lock in locks if lock[0] in before and before[lock[0]] == after.get(lock[0])]
    if not held:
        return []
    pooled = pgbouncer.server_pids()
    return [lock for lock in held if lock[0] in pooled]


class LockWatch(threading.Thread):
    """Samples :func:`session_advisory_locks` every 50 ms on a direct connection of its own."""

    def __init__(self, pgbouncer: Any) -> None:
        super().__init__(daemon=True)
        self.pgbouncer = pgbouncer
        self.samples = 0
        self.found: list[tuple] = []
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.pgbouncer.direct_url, autocommit=True) as conn:
                while not self.halt.wait(0.05):
                    self.found += session_advisory_locks(conn, self.pgbouncer)
                    self.samples += 1
        except BaseException as exc:  # reported by the test, not lost in the thread
            self.error = exc


@contextmanager
def watching_locks(pgbouncer: Any) -> Iterator[LockWatch]:
    watch = LockWatch(pgbouncer)
    watch.start()
    try:
        wait_until(lambda: watch.samples or not watch.is_alive(), message="the first sample")
        yield watch
    finally:
        watch.halt.set()
        watch.join(10)
    assert watch.error is None, f"the lock watch failed: {watch.error!r}"
    assert watch.samples > 0
    assert watch.found == [], "a pooled backend held an advisory lock outside a transaction"


def test_the_lock_watch_sees_a_session_lock_taken_through_the_pooler(pgbouncer):
    """What the watch looks for, made on purpose: a session advisory lock taken through the
    pooler stays on the server connection after the client's transaction (and, in transaction
    mode, an unlock from the same client may well run on another server connection)."""
    with psycopg.connect(pgbouncer.url, autocommit=True) as client, \
            psycopg.connect(pgbouncer.direct_url, autocommit=True) as direct:
        holder = client.execute(
            "select pg_backend_pid() from (select pg_advisory_lock(4242, 7)) l").fetchone()[0]
        try:
            found = wait_until(lambda: session_advisory_locks(direct, pgbouncer), timeout=10,
                               message="the watch to see the lock")
            assert [(pid, objid) for pid, _, objid, _ in found] == [(holder, 7)]
        finally:
            # The server session holds the lock, whichever client the pooler links to it.
            direct.execute("select pg_terminate_backend(%s)", [holder])


# -------------------------------------------------------------------------- the faults --


def test_sigkill_mid_job_is_rescued_after_the_lease_and_done_once(behind, pgbouncer):
    from tests.testapp.jobs import sleepy_tagged

    a = behind("a", "--concurrency", "2")
    with watching_locks(pgbouncer):
        handles = [sleepy_tagged.enqueue(seconds=30, later=0.2) for _ in range(2)]
        for h in handles:
            wait_effect(h.id, "start")
        a.signal(signal.SIGKILL)
        assert wait_exit(a) == -signal.SIGKILL
        assert sorted(lapse_worker(a)) == sorted(str(h.id) for h in handles)
        b = behind("b", "--concurrency", "2")
        for h in handles:
            row = wait_state(h.id, *FINISHED)
            assert (row.state, row.attempt, row.rescues, row.claimed_by) == ("done", 2, 1, b.id)
            starts = effects(h.id, "start")
            assert [(e.attempt, e.pid) for e in starts] == [(1, a.pid), (2, b.pid)]
            assert [(e.attempt, e.pid) for e in effects(h.id, "end")] == [(2, b.pid)]
            assert row.result == {"run": starts[1].tag}


def test_sigterm_finishes_the_running_job_hands_back_the_waiting_one_and_exits_0(
        behind, pgbouncer):
    from django_xjobs.models import Job
    from tests.testapp.jobs import sleepy

    a = behind("a", "--concurrency", "1", "--prefetch", "1", settings={"SHUTDOWN_GRACE": "30s"})
    with watching_locks(pgbouncer):
        handles = [sleepy.enqueue(seconds=1.5, tag=str(i)) for i in range(2)]
        ids = {str(h.id) for h in handles}
        wait_until(lambda: Job.objects.filter(pk__in=ids, state="running").count() == 2,
                   message="both claimed")
        [running] = wait_until(lambda: {e.job_id for h in handles for e in effects(h.id)},
                               message="one job running")
        a.signal(signal.SIGTERM)
        assert wait_exit(a) == 0
    assert "stopped (SIGTERM)" in a.log()
    row = job_row(running)
    assert (row.state, row.attempt, row.claimed_by) == ("done", 1, a.id)
    [waiting] = ids - {running}
    row = job_row(waiting)
    assert (row.state, row.attempt, row.rescues, row.worker_ids) == ("ready", 0, 0, [])
    assert effects(waiting) == []


def test_a_stale_run_resumed_after_its_lease_is_fenced_off(behind, pgbouncer):
    import os

    from tests.testapp.jobs import sleepy_tagged

    a = behind("a", "--concurrency", "1")
    with watching_locks(pgbouncer):
        h = sleepy_tagged.enqueue(seconds=2.5, later=0.2)
        [first] = wait_effect(h.id, "start")
        assert first.pid == a.pid
        os.kill(a.pid, signal.SIGSTOP)
        try:
            lapse_worker(a)  # the database's side only: the resumed a believes it holds it
            b = behind("b", "--concurrency", "1")
            done = wait_state(h.id, *FINISHED)
            assert (done.state, done.attempt, done.rescues, done.claimed_by) == (
                "done", 2, 1, b.id)
        finally:
            os.kill(a.pid, signal.SIGCONT)
        wait_log(a, "result discarded, this run no longer owns the job")
    after = job_row(h.id)
    assert (after.state, after.result, after.attempt, after.claimed_by, after.lease_token,
            after.updated_at) == (done.state, done.result, done.attempt, done.claimed_by,
                                  done.lease_token, done.updated_at)
    starts = effects(h.id, "start")
    assert [(e.attempt, e.pid) for e in starts] == [(1, a.pid), (2, b.pid)]
    assert after.result == {"run": starts[1].tag}  # the rescuing run's, not the stale one's
    assert a.proc.poll() is None and b.proc.poll() is None


def test_a_terminated_server_backend_of_the_pooler_is_survived(behind, pgbouncer):
    """The server connection a job's open transaction holds is terminated: the run fails with
    it and is retried; the worker lives on, and the pooler opens new server connections."""
    from django.db import connection

    from tests.testapp.jobs import held_transaction, record

    a = behind("a", "--concurrency", "1")
    with watching_locks(pgbouncer):
        h = held_transaction.enqueue(seconds=2)
        wait_effect(h.id, "start")

        def held() -> int | None:
            with connection.cursor() as cur:
                cur.execute("select pid from pg_stat_activity where datname = current_database()"
                            " and state = 'idle in transaction' and query = 'select 1'")
                pids = {pid for (pid,) in cur.fetchall()} & pgbouncer.server_pids()
            return pids.pop() if len(pids) == 1 else None

        pid = wait_until(held, message="the pooled backend of the job's transaction")
        assert terminate_backend(pid)
        row = wait_state(h.id, *FINISHED)
        after = record.enqueue(tag="after")
        assert wait_state(after.id, *FINISHED).state == "done"
    assert (row.state, row.attempt, row.claimed_by) == ("done", 2, a.id)
    assert [e.attempt for e in effects(h.id, "start")] == [1, 2]
    assert [e.attempt for e in effects(h.id, "end")] == [2]
    assert pid not in pgbouncer.server_pids()
    assert a.proc.poll() is None


def test_cron_fires_each_second_once_through_the_pooler(behind, pgbouncer):
    from django_xjobs.models import Job

    start = start_row()
    a = behind("a", settings={"LEADER_LEASE": "1.5s", "LEADER_RENEW": "0.5s", "SCHEDULE": TICK,
                              "MAINTENANCE_INTERVAL": None})
    with watching_locks(pgbouncer):
        wait_until(lambda: lease_holder() == a.id, message="the worker to lead")
        wait_until(lambda: Job.objects.filter(enqueued_by="cron:tick", state="done").count() >= 3,
                   interval=0.1, message="fired jobs run")
        a.signal(signal.SIGTERM)
        assert wait_exit(a) == 0
    assert_exactly_once(start)


# ------------------------------------------------------------------------ the wake-ups --


def worker_backends(worker_id: str) -> list[tuple[int, str]]:
    """(pid, application_name) of the backends named after this worker."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("select pid, application_name from pg_stat_activity"
                    " where datname = current_database() and application_name like %s",
                    [f"xjobs:{worker_id}:%"])
        return list(cur.fetchall())


def test_which_connections_bypass_the_pooler_and_how_an_idle_worker_finds_a_job(
        behind, pgbouncer, mode):
    """``poll``: none; a new job is found by polling. ``direct-listen``: the LISTEN sessions
    (the worker's and the relay's) are direct backends, and with a poll interval far beyond
    the wait, only their NOTIFY gets a new job started."""
    from tests.testapp.jobs import record

    poll = "120s" if mode == "direct-listen" else FAST["POLL_INTERVAL"]
    a = behind("a", settings={"POLL_INTERVAL": poll})
    listen = f"xjobs:{a.id}:listen"
    if mode == "direct-listen":
        wait_until(lambda: any(name == listen for _, name in worker_backends(a.id)),
                   message="the LISTEN backend")
    with watching_locks(pgbouncer):
        h = record.enqueue(tag="wake")
        row = wait_state(h.id, *FINISHED)
    assert (row.state, row.attempt, row.claimed_by) == ("done", 1, a.id)
    named = worker_backends(a.id)
    pooled = pgbouncer.server_pids()
    direct = sorted(name for pid, name in named if pid not in pooled)
    if mode == "direct-listen":
        assert direct == [listen, f"xjobs:{a.id}:relay-listen"]
    else:
        assert named, "the worker's pooled backends carry its name"
        assert direct == []
        assert listen not in {name for _, name in named}


def test_an_advisory_leader_holds_its_lock_on_the_direct_connection(pgbouncer, start_worker):
    """With LISTEN_DATABASE direct, the advisory leader mode is usable behind the pooler: the
    lock is held by a direct backend (the lock watch would flag a pooled one), and cron fires
    each second once."""
    from django_xjobs.engines import get_engine
    from django_xjobs.models import Job

    xjobs, _ = MODES["direct-listen"]
    start = start_row()
    a = start_worker("a", settings={**xjobs, "LEADER": "advisory", "LEADER_RENEW": "0.5s",
                                    "SCHEDULE": TICK, "MAINTENANCE_INTERVAL": None},
                     env=pgbouncer.worker_env(listen_direct=True))
    with watching_locks(pgbouncer):
        holder = wait_until(lambda: get_engine().leader_advisory_holder("scheduler"),
                            message="an advisory leader")
        assert holder.holder == f"xjobs:{a.id}:leader"
        assert holder.pid not in pgbouncer.server_pids()
        wait_until(lambda: Job.objects.filter(enqueued_by="cron:tick", state="done").count() >= 3,
                   interval=0.1, message="fired jobs run")
        a.signal(signal.SIGTERM)
        assert wait_exit(a) == 0
    assert_exactly_once(start)
