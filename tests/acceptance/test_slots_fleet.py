"""Concurrency slots across real worker processes: the limit holds fleet-wide, keys do not
starve each other, a lapsed slot under a stopped worker is taken over and the woken worker
never writes its result (X_JOB_SLOT_LOST), a killed worker's slot frees itself at expiry, and a
graceful shutdown releases its slots at once.

Every run interval is recorded by the job itself (``testapp.slotted``: an Effect row at start
and at end, written in autocommit), so overlaps are read from what actually executed. A run's
recorded interval lies inside the time it held its slot: it starts after the acquire
committed and ends before the release is sent.
"""

from __future__ import annotations

import os
import signal
from collections import defaultdict

import pytest

from tests.conftest import wait_until
from tests.leases import lapse_worker

from .conftest import (
    SETTLE,
    effects,
    job_row,
    wait_effect,
    wait_exit,
    wait_log,
    wait_started,
    wait_state,
)

pytestmark = pytest.mark.acceptance

DRAIN = 180.0  # a generous bound for a whole drain on a loaded machine; not a measurement


def intervals(group: str) -> list[tuple[float, float]]:
    """(start, end) of every run of ``testapp.slotted`` in ``group`` that got to its end."""
    from tests.testapp.models import Effect

    starts: dict[str, float] = {}
    ends: dict[str, float] = {}
    for e in Effect.objects.filter(name="testapp.slotted", tag__startswith=f"{group}|"):
        (starts if e.kind == "start" else ends)[e.tag] = e.at.timestamp()
    return [(starts[tag], ends[tag]) for tag in starts if tag in ends]


def max_overlap(spans: list[tuple[float, float]]) -> int:
    """The most intervals open at one instant (an end and a start at the same instant do not
    overlap: the end is counted first)."""
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans],
                    key=lambda ev: (ev[0], ev[1]))
    peak = open_ = 0
    for _, step in events:
        open_ += step
        peak = max(peak, open_)
    return peak


def live_slots(key: str) -> list:
    from django_xjobs.engines import get_engine

    return get_engine().slots_list(slot_key=key)


def all_done(handles, timeout: float = DRAIN) -> None:
    from django_xjobs.models import Job

    ids = [h.id for h in handles]
    wait_until(lambda: Job.objects.filter(id__in=ids, state="done").count() == len(ids),
               timeout=timeout, interval=0.1, message=f"all {len(ids)} jobs done")


def test_forty_jobs_on_one_key_never_run_more_than_two_at_once_across_two_workers(
        start_worker):
    from django_xjobs.models import Job
    from tests.testapp.jobs import slotted

    handles = slotted.bulk_enqueue([{"group": "fleet", "seconds": 0.15}] * 40)
    a, b = (start_worker(role, "--concurrency", "8", wait=False) for role in ("a", "b"))
    for worker in (a, b):  # started side by side
        wait_started(worker)

    all_done(handles)

    spans = intervals("fleet")
    assert len(spans) == 40
    assert max_overlap(spans) == 2
    rows = list(Job.objects.filter(id__in=[h.id for h in handles]))
    # Every job was refused a slot many times over (16 threads, 2 slots): none spent an attempt.
    assert {(r.state, r.attempt) for r in rows} == {("done", 1)}
    assert {r.claimed_by for r in rows} <= {a.id, b.id}
    wait_until(lambda: live_slots("slot:fleet") == [], message="every slot released")


def test_two_keys_with_limits_one_and_three_hold_independently_and_neither_starves(
        start_worker):
    from tests.testapp.jobs import slotted

    limits = {"CONCURRENCY_LIMITS": {"slot:one": 1, "slot:three": 3}}
    # The saturated key's jobs are enqueued first, so they sit at the head of the queue.
    one = slotted.bulk_enqueue([{"group": "one", "seconds": 0.3}] * 10)
    three = slotted.bulk_enqueue([{"group": "three", "seconds": 0.3}] * 10)
    for worker in [start_worker(role, "--concurrency", "4", settings=limits, wait=False)
                   for role in ("a", "b")]:  # started side by side
        wait_started(worker)

    all_done(one + three)

    spans_one, spans_three = intervals("one"), intervals("three")
    assert (len(spans_one), len(spans_three)) == (10, 10)
    assert max_overlap(spans_one) == 1
    assert max_overlap(spans_three) == 3
    # Not starved: key three's ten jobs (three at a time) were all done while key one's were
    # still going one by one, although key one's were first in line.
    assert max(e for _, e in spans_three) < max(e for _, e in spans_one)


def test_a_slot_lapsed_under_a_stopped_worker_is_taken_and_the_woken_run_is_discarded(
        start_worker):
    from tests.testapp.jobs import slotted

    # The job lease is long and the slot TTL short: the slot lapses, the job does not. A real
    # TTL, which lapses by the clock while a is stopped (not on demand, tests/leases.py): a
    # run that ends after its slot lapsed knows it by its own clock, and must not write.
    timing = {"LEASE": "20s", "HEARTBEAT": "0.5s", "SLOT_TTL": "2s",
              "CONCURRENCY_LIMITS": {"slot:stop": 1}}
    a = start_worker("a", "--concurrency", "2", settings=timing)
    first = slotted.enqueue(group="stop", seconds=5, later=0.1)
    frozen_run = wait_effect(first.id, "start")[0].tag

    os.kill(a.pid, signal.SIGSTOP)
    try:
        second = slotted.enqueue(group="stop", seconds=0.2)
        b = start_worker("b", "--concurrency", "2", settings=timing)
        # b takes the slot once a's lapsed: the second job runs while a still "holds" it.
        assert wait_state(second.id, "done", "dead").state == "done"
        assert job_row(second.id).claimed_by == b.id
        assert job_row(first.id).state == "running" and job_row(first.id).claimed_by == a.id
    finally:
        os.kill(a.pid, signal.SIGCONT)

    wait_log(a, "X_JOB_SLOT_LOST")
    row = wait_state(first.id, "done", "dead", "cancelled")
    assert row.state == "done"
    # The result written is the later run's, never the frozen one's; and losing the slot did
    # not cost the job an attempt.
    assert row.result["run"] != frozen_run.split("|")[1]
    assert (row.attempt, row.result["attempt"]) == (1, 1)
    runs = [e.tag for e in effects(first.id, "start")]
    assert runs[0] == frozen_run and len(runs) == 2
    assert row.result["run"] == runs[1].split("|")[1]
    # The frozen run and the second job never held the slot at the same time on the
    # database's side: the second job started after the frozen run's slot had lapsed, and the
    # frozen run's end (if it got there) is discarded.
    assert "X_JOB_SLOT_LOST" in a.log()
    wait_until(lambda: live_slots("slot:stop") == [], message="every slot released")


def test_a_killed_workers_slot_frees_itself_at_expiry(start_worker):
    from tests.testapp.jobs import slotted

    timing = {"CONCURRENCY_LIMITS": {"slot:kill": 1}}
    a = start_worker("a", "--concurrency", "2", settings=timing)
    first = slotted.enqueue(group="kill", seconds=30, later=0.1)
    wait_effect(first.id, "start")
    assert len(live_slots("slot:kill")) == 1

    a.signal(signal.SIGKILL)
    assert wait_exit(a) == -signal.SIGKILL
    # Its slot and its lease expire (tests/leases.py): nobody released either.
    assert lapse_worker(a, slots=True) == [str(first.id)]
    assert live_slots("slot:kill") == []
    second = slotted.enqueue(group="kill", seconds=0.1)
    b = start_worker("b", "--concurrency", "2", settings=timing)

    for h in (first, second):
        assert wait_state(h.id, "done", "dead").state == "done"
        assert job_row(h.id).claimed_by == b.id
    assert job_row(first.id).rescues == 1  # its lease lapsed too: the crash cost an attempt
    spans = intervals("kill")
    assert len(spans) == 2 and max_overlap(spans) == 1
    wait_until(lambda: live_slots("slot:kill") == [], message="every slot released")


def test_a_graceful_shutdown_hands_its_jobs_back_and_releases_their_slots_at_once(
        start_worker):
    from tests.testapp.jobs import slotted_polite

    # Slot TTL and lease far longer than the test: only a release can free the slot.
    timing = {"LEASE": "60s", "HEARTBEAT": "0.5s", "SLOT_TTL": "60s", "SHUTDOWN_GRACE": "0.5s"}
    a = start_worker("a", "--concurrency", "2", settings=timing)
    handle = slotted_polite.enqueue(group="term", seconds=60)
    wait_effect(handle.id, "start")
    assert len(live_slots("slowslot:term")) == 1

    a.signal(signal.SIGTERM)
    assert wait_exit(a, timeout=SETTLE) == 0

    assert live_slots("slowslot:term") == []
    row = job_row(handle.id)
    assert (row.state, row.attempt) == ("ready", 0)


def test_slots_of_many_keys_stay_under_their_limits_across_a_fleet(start_worker):
    """Twelve keys of limit 2 at once, two workers: no key ever runs three."""
    from tests.testapp.jobs import slotted

    groups = [f"many{i}" for i in range(12)]
    handles = slotted.bulk_enqueue([{"group": g, "seconds": 0.1} for g in groups] * 5)
    for worker in [start_worker(role, "--concurrency", "8", wait=False)
                   for role in ("a", "b")]:  # started side by side
        wait_started(worker)

    all_done(handles)

    peaks = defaultdict(int)
    for g in groups:
        spans = intervals(g)
        assert len(spans) == 5
        peaks[g] = max_overlap(spans)
    assert max(peaks.values()) <= 2
