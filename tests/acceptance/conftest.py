"""Helpers for the acceptance tests: real ``xjobs_worker`` subprocesses on the test database.

Everything a test asserts is read from the database (``x_jobs`` rows and the ``Effect`` rows the
test jobs write in autocommit); worker logs only add the "why". Waits poll with generous
deadlines: the machine is small and shared, so no test asserts on a duration.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.conftest import wait_until
from tests.pooler import pgbouncer  # noqa: F401 - the fixture, for test_pooler.py and others
from tests.private_cluster import PrivateCluster, _as_postgres, find_bindir

# A lease far longer than any test, so that no heartbeat delayed by CPU starvation lets a
# healthy lease lapse: a test that needs a lapse makes it (tests/leases.py). Fast heartbeats
# and polls: a cancel, a lost lease, a job enqueued are noticed within a fraction of a second.
FAST = {"LEASE": "60s", "HEARTBEAT": "0.5s", "POLL_INTERVAL": "0.2s"}
# A real short lease, for the tests whose point is its timing as the worker itself measures it
# (its run stopped after a lease without renewal, its lease proven before a body): lease >= 4 x
# heartbeat, so a heartbeat delayed by CPU starvation still renews a healthy lease.
SHORT_LEASE = {"LEASE": "2s", "HEARTBEAT": "0.5s"}
# The scheduler's leader lease, likewise far longer than any test: a takeover happens when the
# test lapses the leader's lease (tests/leases.py), not when a starved renewal comes late.
LEADER = {"LEADER_LEASE": "60s", "LEADER_RENEW": "0.5s"}

# Generous deadlines: they bound a failing test, they are not measurements.
STARTUP = 30.0
SETTLE = 30.0


def worker_id(role: str) -> str:
    """A worker id unique to this test, so its backends are unambiguous in pg_stat_activity."""
    return f"{role}-{uuid.uuid4().hex[:8]}"


def job_row(job_id: Any):
    from django_xjobs.models import Job

    return Job.objects.get(pk=job_id)


def effects(job_id: Any, kind: str | None = None) -> list:
    from tests.testapp.models import Effect

    rows = Effect.objects.filter(job_id=str(job_id)).order_by("id")
    if kind is not None:
        rows = rows.filter(kind=kind)
    return list(rows)


def state_of(job_id: Any) -> str:
    return job_row(job_id).state


def wait_state(job_id: Any, *states: str, timeout: float = SETTLE) -> Any:
    """Wait until the job is in one of ``states``; return its row."""
    def reached():
        row = job_row(job_id)
        return row if row.state in states else None

    return wait_until(reached, timeout=timeout, interval=0.05,
                      message=f"job {job_id} to reach {states}")


def wait_given_back(job_id: Any, *, tries: int = 1, timeout: float = SETTLE) -> Any:
    """Wait until workers that do not know the job's name have given it back ``tries`` times
    (its last attempt entry is the wait's, docs/deployment.md); return its row."""
    def given_back():
        row = job_row(job_id)
        last = row.attempts[-1] if row.attempts else {}
        return row if last.get("outcome") == "unknown_job" and last.get("tries", 0) >= tries \
            else None

    return wait_until(given_back, timeout=timeout, interval=0.05,
                      message=f"job {job_id} given back {tries} time(s) as unknown")


def wait_effect(job_id: Any, kind: str, *, count: int = 1, timeout: float = SETTLE) -> list:
    def present():
        rows = effects(job_id, kind)
        return rows if len(rows) >= count else None

    return wait_until(present, timeout=timeout, interval=0.05,
                      message=f"{count} {kind!r} effect(s) of job {job_id}")


def wait_started(worker, timeout: float = STARTUP) -> None:
    """Until the worker logged its start line (its executors up, about to claim)."""
    def up():
        if worker.proc.poll() is not None:
            pytest.fail(f"worker exited with {worker.proc.returncode} before starting:\n"
                        f"{worker.log()}")
        return " started: " in worker.log()

    wait_until(up, timeout=timeout, interval=0.05, message="the worker to start")


def wait_log(worker, text: str, timeout: float = SETTLE) -> str:
    def logged():
        log = worker.log()
        return log if text in log else None

    return wait_until(logged, timeout=timeout, interval=0.05,
                      message=f"{text!r} in the worker log")


def wait_exit(worker, timeout: float = SETTLE) -> int:
    return wait_until(lambda: worker.proc.poll() is not None, timeout=timeout, interval=0.05,
                      message="the worker to exit") and worker.proc.returncode


def backends(label: str) -> list[tuple[int, str]]:
    """(pid, state) of the backends of this database whose application_name is ``label``."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "select pid, coalesce(state, '') from pg_stat_activity"
            " where datname = current_database() and application_name = %s order by pid",
            [label],
        )
        return list(cur.fetchall())


def backend_state_change(pid: int) -> Any:
    """When the backend ``pid`` last changed state (None once it is gone)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("select state_change from pg_stat_activity where pid = %s", [pid])
        row = cur.fetchone()
        return row[0] if row else None


def terminate_backend(pid: int) -> bool:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("select pg_terminate_backend(%s)", [pid])
        return bool(cur.fetchone()[0])


@contextmanager
def stopped_backend(label: str, timeout: float = SETTLE) -> Iterator[int]:
    """SIGSTOP the backend named ``label`` while it is idle (between statements), so it holds no
    row lock that would block the rest of the test; SIGCONT it on the way out, whatever happens.

    A stopped backend is a hung server: the TCP connection stays up, only a client-side deadline
    notices. The backend runs as the postgres OS user; the tests run as root, so they may
    signal it.
    """
    pid = None

    def stop_when_idle():
        nonlocal pid
        found = backends(label)
        if not found:
            return None
        candidate, _ = found[0]
        os.kill(candidate, signal.SIGSTOP)
        # The state a stopped backend reports is the one it had when it stopped: 'idle' means it
        # was between statements and holds no transaction.
        state = dict(backends(label)).get(candidate)
        if state == "idle":
            pid = candidate
            return candidate
        os.kill(candidate, signal.SIGCONT)
        return None

    try:
        yield wait_until(stop_when_idle, timeout=timeout, interval=0.01,
                         message=f"an idle backend named {label!r} to stop")
    finally:
        if pid is not None:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass


def _private_binaries(*tools: str) -> tuple[Any, list[str]]:
    """The directory of PostgreSQL's server binaries and the prefix that runs them as the
    clusters' owner (tests/private_cluster.py); skips the test, saying why, where they or the
    further ``tools`` are missing."""
    bindir, why = find_bindir()
    if bindir is None:
        pytest.skip(why)
    prefix, why = _as_postgres()
    if why:
        pytest.skip(why)
    missing = [tool for tool in tools if not (bindir / tool).is_file()]
    if missing:
        pytest.skip(f"no {', '.join(missing)} beside initdb in {bindir}")
    return bindir, prefix


@pytest.fixture(scope="module")
def cluster() -> Iterator[PrivateCluster]:
    """A PostgreSQL cluster of the module's own (tests/private_cluster.py), for faults that hit
    the whole server: a restart, an outage. Skips where PostgreSQL's server binaries are not
    installed."""
    bindir, prefix = _private_binaries()
    made = PrivateCluster(bindir, prefix)
    try:
        made.start()
        yield made
    finally:
        made.destroy()


@pytest.fixture
def start_worker(spawn_worker) -> Callable[..., Any]:
    """``start_worker(role, *args, settings=..., faults=..., env=...)``: spawn a named worker
    and wait until it runs; the worker object gets ``.id`` (its ``claimed_by``)."""

    def start(role: str, *args: str, settings: dict[str, Any] | None = None,
              faults: str | None = None, wait: bool = True, env: dict[str, str] | None = None):
        wid = worker_id(role)
        worker = spawn_worker("--worker-id", wid, *args, settings={**FAST, **(settings or {})},
                              faults=faults, env=env)
        worker.id = wid
        if wait:
            wait_started(worker)
        return worker

    return start


@pytest.fixture(scope="module")
def replica_pair() -> Iterator[tuple[PrivateCluster, Any]]:
    """A migrated private primary and a streaming hot standby of it (``Replica``:
    ``pause_replay``, ``wait_caught_up``, ...), the module's own; skips where the server
    binaries or pg_basebackup are missing. A test that pauses replay or stops either server
    puts it back before it ends: the next test of the module gets the same pair. In memory
    where there is room (``scratch_dir``). Under pytest-xdist each process that runs such a
    module makes its own."""
    from tests.private_cluster import Replica, scratch_dir

    bindir, prefix = _private_binaries("pg_basebackup")
    primary = PrivateCluster(bindir, prefix, where=scratch_dir())
    replica: Replica | None = None
    try:
        primary.start()
        replica = primary.replica()
        yield primary, replica
    finally:
        if replica is not None:
            replica.destroy()
        primary.destroy()


@pytest.fixture(scope="module")
def three_shards() -> Iterator[list[PrivateCluster]]:
    """Three migrated private primaries, the module's own: one made with initdb and migrate,
    two started on copies of its data (tests/private_cluster.py, ``start_primaries``: same
    system identifier, storage of their own), in memory where there is room (``scratch_dir``).
    Skips where the server binaries are missing."""
    from tests.private_cluster import scratch_dir, start_primaries

    bindir, prefix = _private_binaries()
    shards = start_primaries(bindir, prefix, 3, where=scratch_dir())
    try:
        yield shards
    finally:
        for shard in shards:
            shard.destroy()
