"""Cron overlap (docs/scheduling.md, "Overlap") in real processes: a seconds cron whose runs take
longer than a second, two workers both running the scheduler, and a rolling restart in the
middle (the leader SIGKILLed or stopped with SIGTERM, a third worker started).

A sampler reads the task's live runs every few milliseconds, each read one snapshot, and
checks the policy's bound at every sample. At the end, every second in
``(watermark at the start, watermark at the end]`` was decided exactly once: enqueued once (no
key twice) or counted as skipped on the task's state row, never both and never neither.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
from collections import Counter
from datetime import UTC, datetime

import pytest
from django.db import connection, connections

from django_xjobs.models import Job, SchedulerState
from django_xjobs.scheduler import cron
from tests.conftest import wait_until
from tests.leases import lapse_leader, lapse_worker

from .conftest import LEADER, SETTLE, wait_exit
from .test_scheduler_fleet import kill_the_leader_inside_a_round, lease_holder

pytestmark = pytest.mark.acceptance

TASK = "ov"
EVERY_SECOND = cron.parse("* * * * * *")


def settings_for(policy: str) -> dict:
    # Runs take 1.5 s and a run is due every second: they would overlap without a policy.
    # misfire "all": the seconds a takeover takes are decided late rather than coalesced, so
    # every second is decided. A long leader lease, lapsed when the test kills the leader.
    return {**LEADER, "MAINTENANCE_INTERVAL": None,
            "ARCHIVE_AFTER": None,
            "SCHEDULE": {TASK: {"job": "testapp.sleepy", "cron": "* * * * * *",
                                "input": {"seconds": 1.5}, "misfire": "all",
                                "overlap": policy}}}


def start_row() -> datetime:
    at = datetime.now(UTC)
    SchedulerState.objects.create(task_name=TASK, last_fired_at=at)
    return at


def fired() -> list[Job]:
    return list(Job.objects.filter(enqueued_by=f"cron:{TASK}").order_by("created_at"))


def wait_fired(count: int) -> None:
    wait_until(lambda: len(fired()) >= count, timeout=SETTLE, interval=0.1,
               message=f"{count} runs of {TASK} enqueued")


class LiveSampler(threading.Thread):
    """(running, other live not buffered, buffered) runs of the task, one snapshot per read."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[tuple[int, int, int]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        try:
            while not self.halt.wait(0.01):
                with connection.cursor() as cur:
                    cur.execute(
                        "select count(*) filter (where state = 'running'),"
                        "       count(*) filter (where state <> 'running'"
                        "                          and blocked_on is distinct from enqueued_by),"
                        "       count(*) filter (where state = 'blocked'"
                        "                          and blocked_on = enqueued_by)"
                        "  from x_jobs where enqueued_by = %s"
                        "   and state in ('ready', 'delayed', 'running', 'suspended', 'blocked')",
                        [f"cron:{TASK}"])
                    self.samples.append(cur.fetchone())
        finally:
            connections.close_all()

    def stop(self) -> list[tuple[int, int, int]]:
        self.halt.set()
        self.join(10)
        return self.samples


def rolling_restart(start_worker, policy: str, stop: signal.Signals) -> list:
    """Two schedulers; after a few runs the leader is stopped with ``stop`` and a third worker
    joins; a few runs later everything stops cleanly. The sampler's samples."""
    settings = settings_for(policy)
    sampler = LiveSampler()
    sampler.start()
    a = start_worker("a", settings=settings)
    b = start_worker("b", settings=settings)
    workers = {a.id: a, b.id: b}
    wait_fired(3)

    leader = workers[wait_until(lease_holder, timeout=SETTLE, message="a leader")]
    os.kill(leader.pid, stop)
    if stop == signal.SIGKILL:
        leader.wait(timeout=30)
        lapse_leader(leader)
        lapse_worker(leader, none_ok=True)  # a run of the task it had claimed, if any
    else:
        assert wait_exit(leader) == 0
    c = start_worker("c", settings=settings)
    before = len(fired())
    wait_until(lambda: lease_holder() not in (None, leader.id), timeout=SETTLE, interval=0.05,
               message="another scheduler to take over")
    wait_fired(before + 3)

    rest = [w for w in (a, b, c) if w is not leader]
    for w in rest:
        w.signal(signal.SIGTERM)
    assert [wait_exit(w) for w in rest] == [0, 0]
    return sampler.stop()


def assert_each_second_decided_once(start: datetime) -> list[Job]:
    runs = fired()
    keys = Counter(j.idempotency_key for j in runs)
    assert {k: n for k, n in keys.items() if n > 1} == {}, "an occurrence fired twice"
    state = SchedulerState.objects.get(task_name=TASK)
    seconds = [cron.occurrence_key(TASK, o)
               for o in EVERY_SECOND.between(start, state.last_fired_at)]
    assert set(keys) <= set(seconds), "only occurrences inside the watermark fire"
    assert len(keys) + state.overlap_skipped == len(seconds), (
        "every second is enqueued once or counted as skipped, never both, never neither")
    return runs


# One way of stopping the leader per policy (SIGKILL: its leases lapse; SIGTERM: it
# resigns), each policy's own restart: the three between them cover both, at a third of the
# suite's time of every pair.
def test_skip_never_enqueues_while_a_run_is_live(start_worker):
    start = start_row()
    samples = rolling_restart(start_worker, "skip", signal.SIGKILL)

    runs = assert_each_second_decided_once(start)
    assert max(r + o + w for r, o, w in samples) == 1, "never two live runs"
    assert SchedulerState.objects.get(task_name=TASK).overlap_skipped > 0
    # Each run was enqueued after the one before it had finished.
    for before, after in itertools.pairwise(runs):
        assert before.finished_at is not None and after.created_at > before.finished_at, (
            before.idempotency_key, after.idempotency_key)


def test_buffer_one_never_holds_two_waiting_nor_runs_two_at_once(start_worker):
    start = start_row()
    samples = rolling_restart(start_worker, "buffer_one", signal.SIGTERM)

    runs = assert_each_second_decided_once(start)
    assert max(w for _, _, w in samples) == 1, "a run was buffered (the test saw one wait)"
    assert max(r for r, _, _ in samples) == 1, "never two running"
    assert max(r + o for r, o, _ in samples) == 1, "one live run besides the buffered one"
    assert all(j.state == "done" for j in runs[:-2]), [j.state for j in runs]
    done = sorted((j.started_at, j.finished_at) for j in runs if j.state == "done")
    for (_, finished), (started, _) in itertools.pairwise(done):
        assert started >= finished, "a buffered run started before the run before it ended"


def test_cancel_previous_leaves_exactly_one_live_run(start_worker):
    start = start_row()
    samples = rolling_restart(start_worker, "cancel_previous", signal.SIGKILL)

    runs = assert_each_second_decided_once(start)
    assert max(r + o + w for r, o, w in samples) == 1, "never two live runs"
    cancelled = [j for j in runs if j.state == "cancelled"]
    assert cancelled, "runs were cancelled"
    assert all("superseded by its occurrence" in j.last_error for j in cancelled)
    assert [j.state for j in runs if j.state not in ("cancelled", "done")] in ([], ["ready"],
                                                                               ["running"])


# The two policies whose round writes rows besides the watermark (holds, cancels); skip's
# count is in the same transaction as the watermark in every case.
@pytest.mark.parametrize("policy", ["buffer_one", "cancel_previous"])
def test_a_leader_killed_inside_a_round_leaves_none_of_its_decisions(start_worker, policy):
    """A lingers in each round's transaction after the mark, before the commit: killed there,
    its cancels, enqueues, holds and skip counts are rolled back together with its watermark,
    and B decides those seconds again, once."""
    start = start_row()
    settings = settings_for(policy)
    sampler = LiveSampler()
    sampler.start()
    kill_the_leader_inside_a_round(start_worker, settings, lambda: len(fired()), more=3)
    samples = sampler.stop()

    assert_each_second_decided_once(start)
    if policy == "buffer_one":
        assert max(w for _, _, w in samples) <= 1 and max(r for r, _, _ in samples) == 1
        assert max(r + o for r, o, _ in samples) == 1
    else:
        assert max(r + o + w for r, o, w in samples) == 1
