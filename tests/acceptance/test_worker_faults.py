"""Fault injection against real worker processes (docs/guarantees.md).

Faults come from outside (a terminated or stopped backend, a stopped worker, a job that kills its
own process, a hand-written row) or from the named fault points of ``django_xjobs.faults``, armed
in the worker through ``XJOBS_FAULTS``. Assertions read the database: the job rows, and the
``Effect`` rows the test jobs write in autocommit, which survive whatever happens to an ack.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import threading
import uuid
from collections import Counter

import pytest

from tests.conftest import wait_until
from tests.leases import lapse, lapse_worker
from tests.testapp.logs import records

from .conftest import (
    SHORT_LEASE,
    backend_state_change,
    backends,
    effects,
    job_row,
    stopped_backend,
    terminate_backend,
    wait_effect,
    wait_exit,
    wait_given_back,
    wait_log,
    wait_state,
)

pytestmark = pytest.mark.acceptance

FINISHED = ("done", "dead", "cancelled")


# ------------------------------------------------------------------------ connections --


def test_a_terminated_listen_backend_comes_back_and_notifications_resume(start_worker):
    from tests.testapp.jobs import record

    # A poll interval far beyond the waits below: only a NOTIFY (or the wake-up the listener
    # gives after reconnecting) gets these jobs claimed in time.
    a = start_worker("a", settings={"POLL_INTERVAL": "120s"})
    label = f"xjobs:{a.id}:listen"
    [(old_pid, _)] = wait_until(lambda: backends(label), message="the LISTEN backend")
    before = record.enqueue(tag="before")
    wait_state(before.id, "done")

    assert terminate_backend(old_pid)
    during = record.enqueue(tag="during")  # its NOTIFY may well be lost
    [(new_pid, _)] = wait_until(
        lambda: [b for b in backends(label) if b[0] != old_pid],
        message="a new LISTEN backend",
    )
    assert new_pid != old_pid
    after = [record.enqueue(tag=f"after-{i}") for i in range(3)]

    for h in [during, *after]:
        row = wait_state(h.id, *FINISHED)
        assert (row.state, row.attempt, row.claimed_by) == ("done", 1, a.id)
        assert len(effects(h.id, "start")) == 1
    assert a.proc.poll() is None
    assert "LISTEN connection re-established" in a.log()


@pytest.mark.django_db(transaction=True)
def test_a_listen_that_fails_after_the_connect_closes_that_connection():
    """The connection is open when LISTEN fails: it is closed before the error is raised, even
    while something still holds the error (and with it the half-made listener)."""
    from django_xjobs import faults
    from django_xjobs.engines import ListenerLost, get_engine

    label = f"listen-fails-{uuid.uuid4().hex[:8]}"
    faults.inject("before:listen", "raise")
    try:
        with pytest.raises(ListenerLost) as failed:
            get_engine().listener(label)
    finally:
        faults.clear()
    wait_until(lambda: not backends(label), message="the listener's connection to close")
    assert "injected fault at before:listen" in str(failed.value)


def test_a_worker_whose_listen_fails_retries_and_is_woken_by_notify(start_worker):
    from tests.testapp.jobs import record

    # Only a NOTIFY gets the job claimed within the test's deadlines (poll interval 120 s).
    a = start_worker("a", settings={"POLL_INTERVAL": "120s"}, faults="before:listen=raise*2")
    label = f"xjobs:{a.id}:listen"
    wait_until(lambda: "LISTEN connection failed" in a.log() and backends(label),
               message="failed LISTENs, then a listening backend")
    # Two failures in a row, logged once.
    assert a.log().count("LISTEN connection failed (injected fault at before:listen)") == 1
    handle = record.enqueue(tag="woken")
    assert wait_state(handle.id, *FINISHED).state == "done"
    assert len(backends(label)) == 1


def test_a_terminated_heartbeat_backend_reconnects_and_keeps_the_lease(start_worker):
    """The heartbeat's connection is killed mid-job; the next round reconnects and
    renews in time, so the job is neither stopped nor rescued."""
    from tests.testapp.jobs import sleepy_tagged

    a = start_worker("a", "--concurrency", "1", settings={"LEASE": "3s"})
    h = sleepy_tagged.enqueue(seconds=4)
    wait_effect(h.id, "start")
    label = f"xjobs:{a.id}:heartbeat"
    [(old_pid, _)] = wait_until(lambda: backends(label), message="the heartbeat backend")
    assert terminate_backend(old_pid)
    wait_until(lambda: [b for b in backends(label) if b[0] != old_pid],
               message="a new heartbeat backend")

    row = wait_state(h.id, *FINISHED)
    assert (row.state, row.attempt, row.rescues, row.claimed_by) == ("done", 1, 0, a.id)
    [start] = effects(h.id, "start")
    assert row.result == {"run": start.tag}
    assert "heartbeat failed" in a.log()
    assert "no lease renewal" not in a.log()


def test_a_heartbeat_that_fails_for_another_reason_logs_its_traceback(start_worker):
    """An error that is not a lost connection is a bug or a server-side problem: its traceback
    is in the log. The next round renews the lease."""
    from tests.testapp.jobs import sleepy_tagged

    a = start_worker("a", "--concurrency", "1", settings={"LEASE": "3s"},
                     faults="before:jobs_renew_if_owned=raise*1")
    h = sleepy_tagged.enqueue(seconds=2)
    assert wait_state(h.id, *FINISHED).state == "done"
    log = a.log()
    failed = log.index("heartbeat failed (1 leases not renewed this round)")
    assert "Traceback (most recent call last)" in log[failed:]
    assert "injected fault at before:jobs_renew_if_owned" in log[failed:]


def test_a_terminated_dispatcher_backend_reconnects_and_settles_its_runs(start_worker):
    """The dispatcher's connection (claims and acks) is killed while a job runs; the
    worker reconnects, acknowledges the job once, and names its new connection again."""
    from tests.testapp.jobs import record, sleepy_tagged

    a = start_worker("a", "--concurrency", "1", settings={"LEASE": "3s"})
    h = sleepy_tagged.enqueue(seconds=1.5)
    wait_effect(h.id, "start")
    label = f"xjobs:{a.id}:loop"
    [(old_pid, _)] = wait_until(lambda: backends(label), message="the dispatcher backend")
    assert terminate_backend(old_pid)

    row = wait_state(h.id, *FINISHED)
    assert (row.state, row.attempt, row.rescues, row.claimed_by) == ("done", 1, 0, a.id)
    assert len(effects(h.id, "start")) == 1
    h2 = record.enqueue(tag="after")
    assert wait_state(h2.id, *FINISHED).state == "done"
    assert "database connection lost" in a.log()
    # pg_stat_activity still tells which worker and role the new backend serves.
    wait_until(lambda: [b for b in backends(label) if b[0] != old_pid], timeout=10,
               message=f"a new backend named {label!r}")


def test_an_ambiguous_ack_is_recognised_as_already_done(start_worker):
    """The server commits the ack, the connection dies before the worker hears it."""
    from tests.testapp.jobs import record

    a = start_worker("a", faults="after:jobs_complete_if_owned=disconnect*1")
    h = record.enqueue(tag="once")
    wait_log(a, "had already been recorded")
    row = wait_state(h.id, *FINISHED)
    assert (row.state, row.attempt, row.rescues) == ("done", 1, 0)
    assert row.result == {"tag": "once", "attempt": 1}
    assert len(effects(h.id)) == 1

    # The worker carries on with a fresh connection.
    h2 = record.enqueue(tag="next")
    assert wait_state(h2.id, *FINISHED).state == "done"
    assert len(effects(h.id)) == 1
    assert "result discarded" not in a.log()


def test_an_ambiguous_nack_that_buried_the_job_is_recognised_as_already_applied(start_worker):
    """The same for the failure path: the dead-letter write committed, its answer was lost."""
    from tests.testapp.jobs import permanent, record

    a = start_worker("a", faults="after:job_fail_if_owned=disconnect*1")
    h = permanent.enqueue()
    wait_log(a, "had already been recorded")
    row = wait_state(h.id, *FINISHED)
    assert (row.state, row.attempt) == ("dead", 1)
    assert "no point retrying" in row.last_error
    assert len(effects(h.id)) == 1
    h2 = record.enqueue(tag="next")
    assert wait_state(h2.id, *FINISHED).state == "done"
    assert len(effects(h.id)) == 1


def test_a_claim_whose_answer_was_lost_is_rescued_after_its_lease(start_worker):
    """The claim committed but the worker never received the rows. Nobody runs the
    job until its lease lapses; then it is re-claimed and runs once."""
    from tests.testapp.jobs import record

    h = record.enqueue(tag="lost-claim")  # before the worker: its first claim takes it
    a = start_worker("a", "--concurrency", "1", faults="after:jobs_claim=disconnect*1")
    wait_log(a, "database connection lost")
    # The worker goes on claiming (a job enqueued now is done), and the lost claim's job is
    # still leased to it, not run: the worker does not know it has it.
    after = record.enqueue(tag="after")
    assert wait_state(after.id, *FINISHED).state == "done"
    lost = job_row(h.id)
    assert (lost.state, lost.attempt, lost.claimed_by) == ("running", 1, a.id)
    assert effects(h.id) == []
    lapse(h.id)  # nobody renews it: the worker's heartbeat does not know the run

    row = wait_state(h.id, *FINISHED)
    assert row.state == "done"
    # The first claim (attempt 1) lapsed; the rescue is attempt 2 and the only execution.
    assert (row.attempt, row.rescues, row.claimed_by) == (2, 1, a.id)
    assert [e.attempt for e in effects(h.id)] == [2]


# -------------------------------------------------------------------- lease and fencing --


def test_a_hung_heartbeat_connection_makes_the_worker_stop_the_run_itself(start_worker):
    """The heartbeat backend stops answering (SIGSTOP: the TCP connection stays up). After a
    whole lease without renewal the worker stops the run and hands the job back; the stopped
    run's result is never written, and a later run finishes the job."""
    from tests.testapp.jobs import sleepy_tagged

    # A real short lease: the point is the worker's own count of a lease without renewal.
    a = start_worker("a", "--concurrency", "1", settings=SHORT_LEASE)
    h = sleepy_tagged.enqueue(seconds=6, later=0.3)
    [first] = wait_effect(h.id, "start")
    label = f"xjobs:{a.id}:heartbeat"
    wait_until(lambda: backends(label), message="the heartbeat backend")

    with stopped_backend(label) as hung_pid:
        wait_log(a, "no lease renewal for")
        row = wait_state(h.id, *FINISHED)
        stopped_since = backend_state_change(hung_pid)
    # Resumed, the old backend runs the renewal it was sent long ago: it must match nothing.
    wait_until(lambda: backend_state_change(hung_pid) != stopped_since
               and dict(backends(label)).get(hung_pid) != "active",
               message="the resumed backend to run its stale statement")
    after = job_row(h.id)
    assert (after.state, after.result, after.updated_at) == (row.state, row.result,
                                                             row.updated_at)
    assert row.state == "done"
    if row.rescues == 0:  # handed back by the worker itself, not rescued after a lapse
        assert row.attempt == 1
        assert "could not renew the lease" in row.last_error
    starts = effects(h.id, "start")
    assert len(starts) == 2
    assert starts[0].tag == first.tag
    # The result is the second run's; the stopped run's return value was discarded.
    assert row.result == {"run": starts[1].tag}
    assert row.result != {"run": first.tag}
    assert (row.attempt, row.rescues) in ((1, 0), (2, 1))  # handed back, or rescued
    assert a.proc.poll() is None
    # A's heartbeat keeps working afterwards (the hung thread was replaced).
    h2 = sleepy_tagged.enqueue(seconds=3)
    row2 = wait_state(h2.id, *FINISHED)
    assert (row2.state, row2.attempt, row2.rescues) == ("done", 1, 0)
    assert len(effects(h2.id, "start")) == 1


def test_a_paused_worker_cannot_overwrite_the_result_of_the_worker_that_took_over(start_worker):
    """Worker A is frozen (SIGSTOP) and its lease lapses; B re-claims and completes the job;
    when A resumes, its late writes are fenced off and change nothing. The lease lapses on
    the database's side only (tests/leases.py): the resumed A believes it still holds it, so
    what refuses its writes is the fence alone."""
    from tests.testapp.jobs import sleepy_tagged

    a = start_worker("a", "--concurrency", "1")
    h = sleepy_tagged.enqueue(seconds=3, later=0.3)
    [first] = wait_effect(h.id, "start")
    assert first.pid == a.pid

    os.kill(a.pid, signal.SIGSTOP)
    try:
        lapse(h.id, holder=a)
        b = start_worker("b", "--concurrency", "1")
        done = wait_state(h.id, *FINISHED)
        assert done.state == "done"
        assert (done.attempt, done.rescues, done.claimed_by) == (2, 1, b.id)
        second = effects(h.id, "start")[1]
        assert (second.pid, second.attempt) == (b.pid, 2)
        assert done.result == {"run": second.tag}
    finally:
        os.kill(a.pid, signal.SIGCONT)

    wait_log(a, "result discarded, this run no longer owns the job")
    after = job_row(h.id)
    assert (after.state, after.result, after.attempt, after.claimed_by, after.lease_token) == (
        done.state, done.result, done.attempt, done.claimed_by, done.lease_token)
    assert after.finished_at == done.finished_at
    assert after.updated_at == done.updated_at
    assert a.proc.poll() is None and b.proc.poll() is None


def test_a_job_that_kills_its_worker_ends_dead_after_max_attempts(start_worker):
    """Testapp.crash calls os._exit on every run. Each time the worker dies, a new one
    starts; after max_attempts (3) claims the job is buried with "lease lost", not run a fourth
    time; other jobs of the queue complete meanwhile."""
    from tests.testapp.jobs import crash, record

    h = crash.enqueue()
    others = [record.enqueue(tag=str(i)) for i in range(6)]
    # One job at a time per worker, so a crash never takes another job's run down with it.
    args = ("--concurrency", "1", "--prefetch", "0")
    workers = [start_worker("w0", *args, wait=False)]

    def settled():
        if workers[-1].proc.poll() is not None:
            lapse_worker(workers[-1])  # its run died with it: the lease runs out
            workers.append(start_worker(f"w{len(workers)}", *args, wait=False))
        jobs = [job_row(h.id), *(job_row(o.id) for o in others)]
        return all(j.state in FINISHED for j in jobs)

    wait_until(settled, timeout=90, interval=0.1, message="the crash job and the others to end")

    row = job_row(h.id)
    assert (row.state, row.attempt, row.max_attempts) == ("dead", 3, 3)
    assert "lease lost" in row.last_error
    assert row.lease_token is None
    starts = effects(h.id, "start")
    assert [e.attempt for e in starts] == [1, 2, 3]
    assert len({e.pid for e in starts}) == 3  # three workers died running it
    assert sum(w.proc.poll() is not None for w in workers) == 3
    for o in others:
        o_row = job_row(o.id)
        assert o_row.state == "done"
        assert len(effects(o.id, "start")) == 1


# ----------------------------------------------------------------------- stored names --


def test_a_row_naming_os_system_is_never_imported(start_worker, tmp_path):
    """A row written by hand names ``os.system``; the worker looks names up in its registry
    only, so the row is given back as unknown (to wait for a worker that knows the name), and
    nothing is executed."""
    from django.db import connection

    marker = f"/tmp/xjobs-os-system-{uuid.uuid4().hex}"
    rows = {}
    with connection.cursor() as cur:
        for name, payload in [
            ("os.system", {"command": f"touch {marker}"}),
            ("subprocess.call", {"args": ["touch", marker]}),
        ]:
            cur.execute(
                "insert into x_jobs (name, idempotency_key, input)"
                " values (%s, %s, %s::jsonb) returning id",
                [name, uuid.uuid4().hex, json.dumps(payload)],
            )
            rows[name] = cur.fetchone()[0]
    a = start_worker("a")

    for name, job_id in rows.items():
        row = wait_given_back(job_id, tries=2)  # claimed, looked up, given back, twice
        assert row.state in ("ready", "delayed") and row.attempt == 0
        assert "UnknownJob" in row.last_error
        assert repr(name) in row.last_error
        assert row.result is None
    assert not os.path.exists(marker)
    assert a.proc.poll() is None


# ------------------------------------------------------------------- cancel and timeout --


def test_cancel_stops_a_running_job_at_the_next_heartbeat_and_a_queued_one_never_runs(
    start_worker,
):
    """A running job stops at its worker's next heartbeat; a queued one is never claimed."""
    from django_xjobs import api
    from tests.testapp.jobs import record, sleepy_polite

    queued = record.enqueue(tag="never")
    assert api.cancel(queued.id, reason="not wanted").changed
    a = start_worker("a", "--concurrency", "1")

    running = sleepy_polite.enqueue(seconds=60)
    wait_effect(running.id, "start")
    result = api.cancel(running.id, reason="stop it")
    assert result.changed and result.job.state == "cancelled"
    # sleepy_polite returns as soon as ctx.cancelled is set: the heartbeat told the run.
    wait_effect(running.id, "end")
    # One line, with the reason the row records (an operator's cancel, not a lost lease).
    wait_log(a, f"job {running.id} (testapp.sleepy_polite) attempt 1: cancelled: stop it; the "
                "run is stopped, its result discarded")

    # A job enqueued after both is claimed and done: the cancelled ones were passed over.
    sentinel = record.enqueue(tag="after")
    assert wait_state(sentinel.id, *FINISHED).state == "done"

    row = job_row(running.id)
    assert (row.state, row.attempt, row.result) == ("cancelled", 1, None)
    assert row.last_error == "cancelled: stop it"
    assert len(effects(running.id, "start")) == 1
    q = job_row(queued.id)
    assert (q.state, q.attempt, q.claimed_by) == ("cancelled", 0, None)
    assert effects(queued.id) == []

    # (d) a finished job: a no-op that says why.
    late = api.cancel(sentinel.id)
    assert not late.changed and "done" in late.reason
    assert job_row(sentinel.id).state == "done"


def test_a_job_past_its_timeout_is_failed_retried_then_dead_while_the_worker_serves_others(
    start_worker,
):
    """Testapp.too_slow sleeps 3 s with a 0.5 s timeout and max_attempts 2. One executor
    thread only: the other jobs can run only because the stuck thread is replaced."""
    from tests.testapp.jobs import record, too_slow
    from tests.testapp.models import Effect

    a = start_worker("a", "--concurrency", "1")
    h = too_slow.enqueue()
    wait_effect(h.id, "start")
    others = [record.enqueue(tag=str(i)) for i in range(5)]

    row = wait_state(h.id, *FINISHED)
    assert (row.state, row.attempt, row.max_attempts) == ("dead", 2, 2)
    assert "TimeoutError" in row.last_error
    assert "ran longer than its timeout" in row.last_error
    assert row.result is None
    assert [e.attempt for e in effects(h.id, "start")] == [1, 2]
    for o in others:
        assert wait_state(o.id, *FINISHED).state == "done"
        assert len(effects(o.id)) == 1
    # The others ran while the first stuck run was still sleeping in its abandoned thread (it
    # sleeps 3 s; they are instant), not after it returned.
    first_end = Effect.objects.filter(job_id=str(h.id), kind="end", attempt=1).first()
    if first_end is not None:
        waited = [str(o.id) for o in others if effects(o.id)[0].id > first_end.id]
        assert not waited, (
            f"{len(waited)} of {len(others)} jobs ran only after the stuck thread returned: the "
            "replacement executor did not keep serving"
        )
    assert a.proc.poll() is None
    a.signal(signal.SIGTERM)
    assert wait_exit(a) == 0
    assert "'timeouts': 2" in a.log()


# ------------------------------------------------------------------------------ startup --


@pytest.mark.parametrize(
    ("args", "settings", "says"),
    [
        pytest.param((), {"LEASE": "1s", "HEARTBEAT": "0.5s"},
                     'XJOBS["LEASE"] (1s) must be at least 3 x',
                     id="settings"),
        # --lease alone derives a heartbeat that fits it (test_commands.py)
        pytest.param(("--lease", "1s", "--heartbeat", "0.5s"), {"LEASE": "2s", "HEARTBEAT": "0.5s"},
                     "--lease (1s) must be at least 3 x",
                     id="command-line"),
    ],
)
def test_a_lease_shorter_than_three_heartbeats_is_refused_at_startup(
    spawn_worker, args, settings, says,
):
    from tests.testapp.jobs import record

    h = record.enqueue(tag="untouched")
    worker = spawn_worker(*args, settings=settings)
    rc = wait_exit(worker)
    assert rc not in (0, None)
    assert says in worker.log()
    assert " started: " not in worker.log()
    row = job_row(h.id)
    assert (row.state, row.attempt) == ("ready", 0)


# ------------------------------------------------------------------------ a database away --


class _Proxy:
    """A TCP proxy in front of the test's PostgreSQL that the test takes down and brings back.

    Down, it drops every connection it carries and answers each new one by closing it (and
    counts those attempts): to its clients the server is gone. Up, it forwards bytes both ways.
    """

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.up = True
        self.refused = 0
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.up:
                client.close()
                with self._lock:
                    self.refused += 1
                continue
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for sock in (source, sink):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def down(self) -> None:
        self.up = False
        with self._lock:
            dropped, self._open = self._open, []
        for sock in dropped:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def close(self) -> None:
        self._closed = True
        self.down()
        self.listener.close()


@pytest.fixture
def proxy():
    from django.db import connection

    params = connection.settings_dict
    p = _Proxy(params["HOST"] or "127.0.0.1", int(params["PORT"] or 5432))
    yield p
    p.close()


def test_a_database_that_goes_away_is_logged_once_and_once_again_when_back(
        spawn_worker, proxy):
    """Every thread retries on its own while the database is away; the log says so once
    ("database unreachable"), not once per attempt, each thread says at most one line of its
    own (its connection broke), and the database being back is one INFO line with how long the
    outage lasted (docs/observability.md, "Logs"). The log is JSON lines at DEBUG, where the
    attempts kept quiet are, naming their thread: the test waits for the counters' rollup and
    the maintenance to have tried again while the database was away."""
    from django.db import connection

    from tests.testapp.jobs import record

    params = connection.settings_dict
    url = f"postgresql://{params['USER']}@127.0.0.1:{proxy.port}/{params['NAME']}"
    # A leader lease longer than the outage: its maintenance keeps trying, every second.
    worker = spawn_worker("--concurrency", "1", env={"DATABASE_URL": url,
                                                     "XJOBS_TEST_LOG_JSON": "1"},
                          log_level="DEBUG",
                          settings={"LEASE": "2s", "HEARTBEAT": "0.5s", "POLL_INTERVAL": "0.2s",
                                    "LEADER_LEASE": "60s", "LEADER_RENEW": "0.5s"})
    wait_log(worker, " started: ")
    wait_log(worker, "is now the leader")
    before = record.enqueue(tag="before")
    assert wait_state(before.id, *FINISHED).state == "done"

    since = len(records(worker.log()))
    proxy.down()

    def quiet_tries() -> Counter[str]:
        return Counter(m.group(1) for r in records(worker.log())[since:]
                       if (m := re.match(r"database still unreachable \((.+?): ", r["message"])))

    # Many attempts to connect, by every thread: without the fix, the rollup (every 5 s) and
    # the maintenance (every second) each warned at every one.
    wait_until(lambda: proxy.refused >= 40 and (tries := quiet_tries())["stats rollup"] >= 1
               and tries["maintenance"] >= 2, timeout=60,
               message="the rollup and the maintenance trying again while the database is away")
    away = [r for r in records(worker.log())[since:] if r["level"] in ("WARNING", "ERROR")]
    unreachable = [r for r in away if r["message"].startswith("database unreachable (")]
    assert len(unreachable) == 1, away
    per_thread = Counter(r["thread"] for r in away if r not in unreachable)
    assert all(n == 1 for n in per_thread.values()), away

    proxy.up = True
    wait_log(worker, "database reachable again")
    after = record.enqueue(tag="after")
    assert wait_state(after.id, *FINISHED).state == "done"
    lines = records(worker.log())
    [back] = [r for r in lines if r["message"].startswith("database reachable again")]
    assert back["level"] == "INFO"
    assert re.fullmatch(r"database reachable again after \d+\.\ds \(\d+ failed attempts to "
                        r"connect\)", back["message"]), back
    assert sum(r["message"].startswith("database unreachable (") for r in lines) == 1
