"""Leases lapsed on demand, for the tests that need a lease to have run out.

A test that needs a job's lease, a concurrency slot or the scheduler's leader lease to have
lapsed moves its expiry to the database's now(), instead of running a short lease and waiting
for it. The workers keep a lease far longer than any test (``FAST`` in
tests/acceptance/conftest.py), which a heartbeat starved on a small shared machine cannot miss,
and the test lapses exactly the lease it means to, when it means to, without waiting seconds.

A lapse here is what the database sees once a holder stopped renewing: the claim
(``visible_at <= now()`` and no live x_lease_extensions row), the heartbeat's fences, the slot
grants (``expires_at <= now()``) and the leader election read the same columns against the
same clock. What it does not change is the holder's own view: a worker measures its leases on
its monotonic clock. Two rules follow.

* Lapse only what its holder can no longer renew: a killed worker's, or a stopped one's (a live
  heartbeat would renew the lease a moment later, as it does a lease that a slow round let
  lapse). The helpers first wait until what the holder sent has landed: a renewal written just
  before the kill or the stop would otherwise land after the lapse (``quiet``).
* A test whose point is the holder's own view keeps a real short lease and waits for it: a
  worker that stops its run after a lease without renewal, a run that proves its lease before a
  body (tests/acceptance/test_lease_proof.py), a slot that a resumed worker must know lapsed.
  A stopped holder resumed after a lapse made here still believes its lease live, so what
  refuses its late writes is the database's fence alone.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.conftest import wait_until


def quiet(worker: Any, timeout: float = 30.0) -> None:
    """Wait until everything the killed or stopped ``worker`` (a WorkerProcess with its
    ``id``) sent has landed: no byte of it is left unread in a socket, neither by the server
    nor by a pooler between them, and none of its sessions (named ``xjobs:<worker id>:<role>``,
    behind a pooler too) is running a statement. A statement written just before the kill or
    the stop is then done; nothing more comes from the worker.

    Read from /proc (Linux): the receive queues of the TCP connections, the worker's own
    sockets (gone once it is dead: its backends, or the pooler's, hold what it sent)."""
    def landed() -> bool:
        sessions = _run("select state, client_port, inet_server_port() from pg_stat_activity"
                        " where datname = current_database() and application_name like %s"
                        "   and pid <> pg_backend_pid()", [f"xjobs:{worker.id}:%"])
        if any(state == "active" for state, _, _ in sessions):
            return False
        queues = _tcp_receive_queues()
        # What the server has not read yet from the sessions' connections...
        if any(queues.get((server, client), 0) for _, client, server in sessions):
            return False
        # ...and what the peers of the worker's own connections have not (the server's
        # backends, or the pooler).
        return not any(queues.get((remote, local), 0) for local, remote in _sockets_of(worker.pid))

    wait_until(landed, timeout=timeout, interval=0.01,
               message=f"what worker {worker.id} sent to land")


def _tcp_receive_queues() -> dict[tuple[int, int], int]:
    """The bytes waiting to be read in each TCP connection of this machine, by (local port,
    remote port)."""
    queues = {}
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        for local, remote, receive, _ in _proc_net(name):
            queues[(local, remote)] = receive
    return queues


def _sockets_of(pid: int) -> list[tuple[int, int]]:
    """(local port, remote port) of the TCP connections process ``pid`` has open; none once it
    has exited."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue  # closed meanwhile
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        return []
    return [(local, remote)
            for name in ("/proc/net/tcp", "/proc/net/tcp6")
            for local, remote, _, inode in _proc_net(name) if inode in inodes]


def _proc_net(name: str) -> list[tuple[int, int, int, str]]:
    """(local port, remote port, receive queue, inode) of each line of /proc/net/tcp{,6}."""
    try:
        with open(name) as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return []
    rows = []
    for line in lines:
        fields = line.split()
        local, remote, queues, inode = fields[1], fields[2], fields[4], fields[9]
        rows.append((int(local.rsplit(":", 1)[1], 16), int(remote.rsplit(":", 1)[1], 16),
                     int(queues.split(":")[1], 16), inode))
    return rows


# The lease of the running jobs the CTE ``chosen`` names (its column ``id``): due now, and a
# lease kept beside the row (x_lease_extensions) gone with it.
_LAPSE_JOBS = """
with chosen as ({chosen}), lapsed as (
    update only x_jobs j set visible_at = now()
      from chosen where j.id = chosen.id and j.state = 'running'
    returning j.id, j.lease_token
), kept as (
    delete from x_lease_extensions e using lapsed where e.job_id = lapsed.id
)
select id::text, lease_token::text from lapsed
"""


def lapse(job_id: Any, *, holder: Any = None) -> str:
    """Lapse the lease of the running job ``job_id``: the next claim takes the job over (a
    rescue). ``holder``: the worker that held it, killed or stopped (see ``quiet``). Returns
    the lapsed run's lease token; fails the test if the job is not running."""
    if holder is not None:
        quiet(holder)
    rows = _run(_LAPSE_JOBS.format(chosen="select %s::uuid as id"), [str(job_id)])
    if not rows:
        pytest.fail(f"job {job_id} is not running: it has no lease to lapse")
    return rows[0][1]


def lapse_worker(worker: Any, *, slots: bool = False, none_ok: bool = False) -> list[str]:
    """Lapse every lease of the killed or stopped ``worker`` (its running jobs), and with
    ``slots`` every concurrency slot its runs hold: what it leaves behind once a lease has
    passed. Returns the ids of the jobs; fails the test if it held none, unless ``none_ok``."""
    quiet(worker)
    if slots:
        _lapse_slots(f"%/{worker.id}")
    rows = _run(_LAPSE_JOBS.format(
        chosen="select id from only x_jobs where claimed_by = %s and state = 'running'"),
        [worker.id])
    if not rows and not none_ok:
        pytest.fail(f"worker {worker.id} holds no lease to lapse")
    return [job_id for job_id, _ in rows]


def lapse_slots(job_id: Any) -> int:
    """Lapse the concurrency slots the runs of ``job_id`` hold (a holder is ``<job id>/<lease
    token>/<worker id>``), whose worker is killed or stopped and quiet: free for the next
    grant, lost to a renewal. Returns how many; fails the test if the job holds none."""
    rows = _lapse_slots(f"{job_id}/%")
    if not rows:
        pytest.fail(f"job {job_id} holds no live slot to lapse")
    return len(rows)


def _lapse_slots(holders: str) -> list[tuple]:
    """Lapse the live slots whose holder (``<job id>/<lease token>/<worker id>``) is LIKE
    ``holders``; their rows."""
    return _run("update x_job_leases set expires_at = now()"
                " where holder like %s and expires_at > now() returning id", [holders])


def lapse_leader(holder: Any, lock_key: str = "scheduler") -> None:
    """Lapse the leader lease of the killed or stopped worker ``holder``: the next election
    takes it over, and the holder's fenced writes, should it resume, are refused. Fails the
    test if it holds no live lease."""
    quiet(holder)
    rows = _run("update x_scheduler_leader set expires_at = now()"
                " where lock_key = %s and holder = %s and expires_at > now() returning holder",
                [lock_key, holder.id])
    if not rows:
        pytest.fail(f"{holder.id} holds no live {lock_key!r} leader lease to lapse")


def _run(sql: str, params: list[Any]) -> list[tuple]:
    """One statement in a transaction of its own on the test's connection; its rows. A row
    lock it meets fails it within seconds (a stopped holder's open transaction, say) rather
    than hang the test."""
    from django.db import connection, transaction

    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("set local lock_timeout = '10s'")
        cur.execute(sql, params)
        return list(cur.fetchall())
