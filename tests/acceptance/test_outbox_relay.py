"""The outbox relay in real processes: ``manage.py xjobs_relay`` and the relay duty of
``xjobs_worker``, killed at the worst moment, run two at a time, and on two databases.

The kill is a fault point (django_xjobs/faults.py): ``before:outbox_mark_published=exit``
ends the process with os._exit right after the batch's jobs were enqueued and before the rows
are marked published — for one database inside the one transaction (which then rolls back),
for two databases after the jobs' database committed. Everything asserted is read from the
databases.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import pytest
from django.db import connections, transaction

from django_xjobs.models import Job, OutboxEntry
from tests.acceptance.conftest import (
    FAST,
    SETTLE,
    backends,
    terminate_backend,
    wait_exit,
    wait_log,
    wait_started,
    worker_id,
)
from tests.conftest import ROOT, WorkerProcess, wait_until
from tests.testapp import jobs as testapp_jobs
from tests.testapp.models import Effect

pytestmark = pytest.mark.acceptance

record = testapp_jobs.record
MARK_CRASH = "before:outbox_mark_published=exit*1"
TWO_DATABASES = pytest.mark.django_db(transaction=True, databases=["default", "jobs"])


class CommandProcess(WorkerProcess):
    """A real ``manage.py <command>`` subprocess on the test database(s)."""

    def __init__(self, command: str, args: list[str], env: dict[str, str], log_path) -> None:
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "django", command, *args],
            cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT,
        )


@pytest.fixture
def spawn(transactional_db, tmp_path):
    """``spawn("xjobs_relay", "--batch-size", "50", settings=..., faults=..., two_db=True)``."""
    started: list[CommandProcess] = []

    def start(command: str, *args: str, settings: dict | None = None, faults: str | None = None,
              two_db: bool = False, wait: bool = True) -> CommandProcess:
        env = dict(os.environ)
        env.update({
            "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT),
            "XJOBS_TEST_DB_NAME": connections["default"].settings_dict["NAME"],
            "XJOBS_LOG_LEVEL": "INFO",
            "XJOBS_TEST_SETTINGS": json.dumps({**FAST, **(settings or {}),
                                               **({"DATABASE": "jobs"} if two_db else {})}),
        })
        env.pop("XJOBS_FAULTS", None)
        if faults:
            env["XJOBS_FAULTS"] = faults
        if two_db:
            env["XJOBS_TEST_JOBS_DB_NAME"] = connections["jobs"].settings_dict["NAME"]
            env["XJOBS_TEST_ROUTERS"] = "1"
        wid = worker_id(command.removeprefix("xjobs_"))
        proc = CommandProcess(command, ["--worker-id", wid, *args], env,
                              tmp_path / f"{command}-{len(started)}.log")
        proc.id = wid
        started.append(proc)
        if wait:
            wait_started(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


def stage(n: int, tag: str = "r") -> list:
    with transaction.atomic():
        return [record.enqueue_on_commit(tag=f"{tag}{i}") for i in range(n)]


def jobs(alias: str = "default"):
    return Job.objects.using(alias)


def relayed_count(proc) -> int:
    match = re.search(r"stopped: (\d+) staged job\(s\) relayed", proc.log())
    assert match, f"no stop line in the relay's log:\n{proc.log()}"
    return int(match.group(1))


def wait_all_done(ids, alias: str = "default") -> None:
    wait_until(lambda: jobs(alias).filter(id__in=ids, state="done").count() == len(ids),
               timeout=SETTLE * 2, interval=0.1, message=f"{len(ids)} jobs to be done")


# ----------------------------------------------------------------------------- one database --


@pytest.mark.django_db(transaction=True)
def test_a_relay_killed_between_enqueue_and_mark_leaves_exactly_one_job_per_row(spawn):
    staged = stage(5)
    crashing = spawn("xjobs_relay", faults=MARK_CRASH, wait=False)
    assert wait_exit(crashing) == 137, crashing.log()
    # One transaction: the enqueue died with the mark.
    assert jobs().count() == 0
    assert OutboxEntry.objects.filter(published_at__isnull=True).count() == 5

    worker = spawn("xjobs_worker", "--concurrency", "2")  # its relay duty takes over
    ids = [s.id for s in staged]
    wait_all_done(ids)
    assert sorted(jobs().values_list("id", flat=True)) == sorted(ids)
    for s in staged:
        assert Effect.objects.filter(job_id=str(s.id), kind="start").count() == 1
    assert not OutboxEntry.objects.filter(published_at__isnull=True).exists()
    worker.signal(signal.SIGTERM)
    assert wait_exit(worker) == 0


@pytest.mark.django_db(transaction=True)
def test_two_relay_processes_over_1000_staged_rows_make_1000_jobs_none_twice(spawn):
    relays = [spawn("xjobs_relay", "--batch-size", "25") for _ in range(2)]
    staged = []
    for start in range(0, 1000, 100):  # ten commits, so the relays are woken while they work
        with transaction.atomic():
            staged += [record.enqueue_on_commit(tag=str(i)) for i in range(start, start + 100)]
    wait_until(lambda: not OutboxEntry.objects.filter(published_at__isnull=True).exists(),
               timeout=SETTLE * 4, interval=0.1, message="the relays to publish 1,000 rows")
    for r in relays:
        r.signal(signal.SIGTERM)
    for r in relays:
        assert wait_exit(r) == 0, r.log()

    ids = {s.id for s in staged}
    assert jobs().count() == 1000
    assert set(jobs().values_list("id", flat=True)) == ids
    assert dict(OutboxEntry.objects.values_list("id", "job_id")) == {i: i for i in ids}
    counts = [relayed_count(r) for r in relays]
    assert sum(counts) == 1000, f"the relays' own counts {counts}: a row counted twice"


@pytest.mark.django_db(transaction=True)
def test_a_worker_without_its_relay_leaves_the_outbox_and_one_with_it_relays(spawn):
    (staged,) = stage(1, "outbox")
    plain = record.enqueue(tag="direct")
    no_relay = spawn("xjobs_worker", "--no-relay")
    wait_all_done([plain.id])  # the worker ran, polled, and claimed for a while...
    assert backends(f"xjobs:{no_relay.id}:relay") == []
    assert backends(f"xjobs:{no_relay.id}:relay-listen") == []
    no_relay.signal(signal.SIGTERM)
    assert wait_exit(no_relay) == 0
    assert OutboxEntry.objects.get(id=staged.id).published_at is None  # ...and relayed nothing

    spawn("xjobs_worker")
    wait_all_done([staged.id])
    assert jobs().count() == 2


@pytest.mark.django_db(transaction=True)
def test_sigterm_stops_a_dedicated_relay_cleanly(spawn):
    relay = spawn("xjobs_relay")
    (staged,) = stage(1, "before stop")
    wait_until(lambda: jobs().filter(id=staged.id).exists(), timeout=SETTLE,
               message="the relay to publish")
    relay.signal(signal.SIGTERM)
    assert wait_exit(relay) == 0, relay.log()
    assert relayed_count(relay) == 1


@pytest.mark.django_db(transaction=True)
def test_the_relay_reconnects_its_listener_and_is_woken_again(spawn):
    # A poll interval far beyond the test's deadlines: only a NOTIFY can wake this relay.
    relay = spawn("xjobs_relay", "--poll-interval", "600s")
    label = f"xjobs:{relay.id}:relay-listen"
    first = wait_until(lambda: backends(label), timeout=SETTLE,
                       message="the relay's LISTEN backend")
    (before,) = stage(1, "before")
    wait_until(lambda: jobs().filter(id=before.id).exists(), timeout=SETTLE,
               message="a NOTIFY to wake the relay")

    assert terminate_backend(first[0][0])
    wait_log(relay, "outbox LISTEN connection lost")
    wait_until(lambda: [b for b in backends(label) if b[0] != first[0][0]], timeout=SETTLE,
               message="the relay to LISTEN again")
    (after,) = stage(1, "after")
    wait_until(lambda: jobs().filter(id=after.id).exists(), timeout=SETTLE,
               message="a NOTIFY on the new connection to wake the relay")


# ---------------------------------------------------------------------------- two databases --


@TWO_DATABASES
def test_two_databases_a_relay_killed_after_the_jobs_committed_still_makes_one_job(spawn):
    staged = stage(3, "two-db")
    ids = [s.id for s in staged]
    crashing = spawn("xjobs_relay", faults=MARK_CRASH, two_db=True, wait=False)
    assert wait_exit(crashing) == 137, crashing.log()
    # The jobs' database committed; the outbox's never heard: jobs made, rows pending.
    assert sorted(jobs("jobs").values_list("id", flat=True)) == sorted(ids)
    assert set(jobs("jobs").values_list("state", flat=True)) == {"ready"}
    assert OutboxEntry.objects.using("default").filter(published_at__isnull=True).count() == 3

    worker = spawn("xjobs_worker", "--concurrency", "2", two_db=True)  # relays again, runs them
    wait_until(lambda: not OutboxEntry.objects.using("default")
               .filter(published_at__isnull=True).exists(),
               timeout=SETTLE, interval=0.1, message="the worker's relay to mark the rows")
    wait_all_done(ids, "jobs")
    assert sorted(jobs("jobs").values_list("id", flat=True)) == sorted(ids)  # none made twice
    assert jobs("default").count() == 0
    assert dict(OutboxEntry.objects.using("default").values_list("id", "job_id")) == {
        i: i for i in ids}
    for i in ids:
        assert Effect.objects.filter(job_id=str(i), kind="start").count() == 1
    worker.signal(signal.SIGTERM)
    assert wait_exit(worker) == 0
