"""A worker whose wall clock is an hour off, either way (docs/guarantees.md, "Clocks").

The worker subprocess runs under libfaketime with ``FAKETIME=+1h`` or ``-1h``: its wall clock
(``time.time``, ``datetime.now``) is shifted; its monotonic clock is not, as in a real clock
step (an NTP correction, a VM restored from a snapshot moves the wall clock only). Leases, due
times and cron occurrences must follow the DATABASE's clock, so with the worker an hour off:

* a job due a few seconds ahead (by the database clock) starts no earlier than its ``run_at``;
* a job longer than the lease, kept by heartbeats, completes once: never rescued (attempt 1);
* the worker, leading the scheduler, fires a seconds cron at the database clock's seconds:
  each occurrence enqueued no earlier than it is (not an hour early), every second between the
  start and the watermark exactly once (not stalled for an hour), and the watermark never ahead
  of the database's now.

Every time compared is a database timestamp (``run_at``, ``started_at``, ``created_at``, the
watermark); the worker's own clock shows only in the Effect rows (``at`` is written by Django in
the worker), which prove the shift is real.

An operator an hour off, either way, pauses and resumes a cron task with ``manage.py xjobs
schedule pause|resume``: the watermark moves to the database's now, never to the operator's.

libfaketime comes from Debian's ``faketime`` package (``make test`` installs it when it may);
without it the tests skip, and ``XJOBS_REQUIRE_FAKETIME=1`` (CI) makes that a failure.
libfaketime 0.9.10 with a faked monotonic clock makes Python's timed waits (``Event.wait``)
hang, so the monotonic clock is excluded (``FAKETIME_DONT_FAKE_MONOTONIC=1``); that version then
fails ``time.sleep`` with EINVAL, which the worker's code paths here never call (the test jobs
wait on events).
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime, timedelta

import pytest

from django_xjobs.engines import get_engine
from django_xjobs.models import Job, SchedulerState
from django_xjobs.scheduler import cron
from tests.conftest import ROOT, wait_until

from .conftest import FAST, SETTLE, SHORT_LEASE, effects, wait_started, wait_state, worker_id

pytestmark = pytest.mark.acceptance

HOUR = timedelta(hours=1)
TICK = {"tick": {"job": "testapp.noop", "cron": "* * * * * *", "misfire": "all"}}
# A real short lease: a job longer than it must be kept by the heartbeats, on the database clock.
SETTINGS = {**FAST, **SHORT_LEASE, "LEADER_LEASE": "1.5s", "LEADER_RENEW": "0.5s",
            "SCHEDULE": TICK, "MAINTENANCE_INTERVAL": None}
EVERY_SECOND = cron.parse("* * * * * *")


def libfaketime() -> str | None:
    """The path of libfaketime.so.1 (Debian's multiarch directory, or dpkg's list)."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")
                   + glob.glob("/usr/lib/faketime/libfaketime.so.1")
                   + glob.glob("/usr/local/lib/faketime/libfaketime.so.1"))
    if found:
        return found[0]
    try:
        listed = subprocess.run(["dpkg", "-L", "libfaketime"], capture_output=True, text=True,
                                timeout=10).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return next((p for p in listed if p.endswith("/libfaketime.so.1")), None)


@pytest.fixture(scope="module")
def faketime_lib() -> str:
    path = libfaketime()
    if path is None:
        why = ("libfaketime is not installed (Debian package 'faketime'; `make test` installs "
               "it as root): the worker clock tests need it")
        if os.environ.get("XJOBS_REQUIRE_FAKETIME") == "1":
            pytest.fail(f"XJOBS_REQUIRE_FAKETIME=1 and {why}")
        pytest.skip(why)
    return path


def shifted_env(lib: str, shift: str) -> dict[str, str]:
    return {"LD_PRELOAD": lib, "FAKETIME": shift, "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "DONT_FAKE_MONOTONIC": "1"}  # the older name of the same switch


def shifted_clock(lib: str, shift: str, sign: int) -> dict[str, str]:
    """shifted_env, checked: a Python child under it reads its wall clock ``shift`` off."""
    env = shifted_env(lib, shift)
    offset = child_clock_offset(env)
    assert abs(offset - sign * 3600) < 600, f"the child's clock is not {shift}: {offset:+.0f}s"
    return env


def child_clock_offset(env: dict[str, str]) -> float:
    """Seconds a Python child under ``env`` reads ahead of this process's wall clock."""
    before = time.time()
    out = subprocess.run([sys.executable, "-c", "import time; print(time.time())"], cwd=ROOT,
                         env={**os.environ, **env}, capture_output=True, text=True, timeout=30,
                         check=True).stdout
    return float(out) - (before + time.time()) / 2


def db_now() -> datetime:
    return get_engine().db_now()


def occurrence_of(key: str) -> datetime:
    return datetime.fromisoformat(key.removeprefix("cron:tick:"))


@pytest.mark.parametrize("shift,sign", [("+1h", 1), ("-1h", -1)], ids=["ahead", "behind"])
def test_a_worker_an_hour_off_keeps_due_times_leases_and_cron_on_the_database_clock(
        spawn_worker, faketime_lib, shift, sign):
    from tests.testapp.jobs import record, sleepy_polite

    env = shifted_clock(faketime_lib, shift, sign)

    start = db_now()
    SchedulerState.objects.create(task_name="tick", last_fired_at=start)
    wid = worker_id(f"clock{sign:+d}")
    worker = spawn_worker("--worker-id", wid, "--concurrency", "4", settings=SETTINGS, env=env)
    # Enqueued now, due a few seconds later by the database clock (delay: run_at = now() +
    # delay, computed by the database).
    delayed = [record.using(delay=1.5 + n * 0.5).enqueue(tag=f"delayed-{n}") for n in range(3)]
    long = sleepy_polite.enqueue(seconds=5.0, tag="long")  # 2.5 leases of 2s
    wait_started(worker)

    for handle in delayed:
        row = wait_state(handle.id, "done")
        assert row.started_at >= row.run_at, f"started {row.run_at - row.started_at} early"
        assert row.attempt == 1
    # The worker's clock really is off: Django stamps the Effect in the worker.
    [effect] = effects(delayed[0].id, "start")
    skew = effect.at - Job.objects.get(pk=delayed[0].id).started_at
    assert abs(skew - sign * HOUR) < timedelta(minutes=10), f"worker clock skew {skew}"

    row = wait_state(long.id, "done", "dead", "cancelled")
    assert (row.state, row.attempt, row.rescues, row.claimed_by) == ("done", 1, 0, wid)
    assert row.result == {"stopped": False}, "the run was stopped (its lease was lost)"
    assert len(effects(long.id, "start")) == 1

    # Cron: a few seconds of occurrences, fired at the database clock.
    def fired() -> list[tuple[str, datetime]]:
        return list(Job.objects.filter(enqueued_by="cron:tick")
                    .values_list("idempotency_key", "created_at"))

    wait_until(lambda: len(fired()) >= 4, timeout=SETTLE, interval=0.1,
               message="4 cron occurrences enqueued")
    mark = SchedulerState.objects.get(task_name="tick").last_fired_at
    keys = fired()  # read after the mark: every occurrence up to it is committed
    assert mark <= db_now(), f"the watermark {mark} is ahead of the database clock"
    early = [(k, at) for k, at in keys if occurrence_of(k) > at]
    assert early == [], "occurrences enqueued before they were due"
    doubled = {k: n for k, n in Counter(k for k, _ in keys).items() if n > 1}
    assert doubled == {}
    expected = {cron.occurrence_key("tick", o) for o in EVERY_SECOND.between(start, mark)}
    upto_mark = {k for k, _ in keys if occurrence_of(k) <= mark}
    assert upto_mark == expected, "every second once, from the start to the mark"
    assert worker.proc.poll() is None


def operator(env: dict[str, str], *args: str) -> str:
    """``python -m django xjobs <args>`` on the test database (with the tick task configured)
    under ``env``; its output."""
    from django.db import connection

    child = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT),
             "XJOBS_TEST_DB_NAME": connection.settings_dict["NAME"],
             "XJOBS_TEST_SETTINGS": json.dumps({"SCHEDULE": TICK}), **env}
    done = subprocess.run([sys.executable, "-m", "django", "xjobs", *args], cwd=ROOT,
                          env=child, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.parametrize("shift,sign", [("+1h", 1), ("-1h", -1)], ids=["ahead", "behind"])
def test_an_operator_an_hour_off_pauses_and_resumes_cron_on_the_database_clock(
        transactional_db, faketime_lib, shift, sign):
    env = shifted_clock(faketime_lib, shift, sign)

    # A task that never ran: pausing gives it a row, from the database's now (an hour ahead, it
    # would fire nothing for an hour once resumed).
    before = db_now()
    operator(env, "schedule", "pause", "tick")
    after = db_now()
    row = SchedulerState.objects.get(task_name="tick")
    assert row.paused and before <= row.last_fired_at <= after, (before, row.last_fired_at)

    # Paused two hours ago by the database's clock, and no round since: resuming moves the
    # watermark to the database's now, neither an hour ahead (the next hour's occurrences
    # skipped) nor an hour behind (the pause's last hour replayed).
    SchedulerState.objects.filter(task_name="tick").update(last_fired_at=db_now() - 2 * HOUR)
    before = db_now()
    resumed = json.loads(operator(env, "schedule", "resume", "tick", "--json"))["task"]
    after = db_now()
    row = SchedulerState.objects.get(task_name="tick")
    assert not row.paused and before <= row.last_fired_at <= after, (before, row.last_fired_at)
    # What the command says next: the next second after that watermark.
    next_fire = datetime.fromisoformat(resumed["next_fire_at"])
    assert row.last_fired_at < next_fire <= row.last_fired_at + timedelta(seconds=1)
