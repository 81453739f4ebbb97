"""Blocked jobs (docs/flow-control.md): a job the claim held back on a full concurrency key waits
in ``blocked`` until a slot of its key frees. The release of a slot wakes it at once, with a
NOTIFY of its queue; ``jobs_unblock`` wakes it when the holder's slot lapsed without a release;
a pause of its key keeps it blocked; a durable run's resume goes back to ``suspended``; it can be
cancelled; and every figure of the queue (its stats, `manage.py xjobs`, the dashboard, the
metrics) counts it in a bucket of its own."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from prometheus_client.parser import text_string_to_metric_families

from django_xjobs import api, conf, registry
from django_xjobs.console.reads.dashboard import queue_rows
from django_xjobs.engines import get_engine
from django_xjobs.models import FlowPause, Job
from django_xjobs.records import ALL_STATES, LIVE_STATES, ClaimBatch, SlotHold, SlotRequest
from django_xjobs.worker.flow import claim_flow
from tests.conftest import wait_until
from tests.testapp import jobs

pytestmark = pytest.mark.django_db(transaction=True)

KEY = "slot:b"  # jobs.slotted's key for group "b"; its limit is 2


def claim(queue: str = "default", n: int = 10) -> ClaimBatch:
    """One claim under flow control, as a worker of ``queue`` would send it."""
    flow = claim_flow(conf.get(), registry.all_jobs().values(), [queue])
    return get_engine().jobs_claim(wants={queue: n}, worker_id="w-blocked", lease_ms=30_000,
                                   flow=flow)


def unblock() -> int:
    return get_engine().jobs_unblock(claim_flow(conf.get(), registry.all_jobs().values(),
                                                ["default"]))


def hold(key: str = KEY, n: int = 2, limit: int = 2, ttl_ms: int = 60_000) -> list[SlotHold]:
    """Take ``n`` slots of ``key`` as another worker's runs would."""
    holds = get_engine().slots_acquire(
        [SlotRequest(slot_key=key, limit=limit, holder=f"other-{i}") for i in range(n)], ttl_ms)
    assert len(holds) == n
    return holds


def blocked_job(key: str = KEY):
    """A job of ``key`` blocked by the claim: both slots held elsewhere."""
    handle = jobs.slotted.enqueue(group=key.removeprefix("slot:"), seconds=0)
    assert claim() == []
    row = Job.objects.get(pk=handle.id)
    assert (row.state, row.blocked_on, row.attempt) == ("blocked", key, 0)
    return handle


def state(handle) -> str:
    return Job.objects.get(pk=handle.id).state


def pause(key: str, until=None) -> None:
    FlowPause.objects.create(kind="key", key=key, until=until, reason="tests")


@pytest.fixture
def listener() -> Iterator:
    """A connection LISTENing on the job channel, as a worker's listener does."""
    listening = get_engine().listener("flowtests-listener")
    try:
        yield listening
    finally:
        listening.close()


def notified(listening, timeout: float = 5.0) -> list[str]:
    """The queues NOTIFYed within ``timeout`` (all that arrived by the first one)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = listening.wait(0.1)
        if got:
            return got
    return []


# ------------------------------------------------------------------------------ wake-ups --


def test_the_release_of_a_slot_of_its_key_wakes_it_and_notifies_its_queue(listener):
    held = hold()
    handle = blocked_job()
    listener.wait(0.2)  # the enqueue's own NOTIFY, if any, out of the way
    assert notified(listener, timeout=0.3) == []

    get_engine().slots_release_if_held(held[:1])

    row = Job.objects.get(pk=handle.id)
    assert (row.state, row.blocked_on, row.attempt) == ("ready", None, 0)
    assert notified(listener) == ["default"]
    [run] = claim()
    assert (run.id, run.attempt, run.slot_limit) == (str(handle.id), 1, 2)


def test_a_release_wakes_as_many_as_it_frees_first_in_line_first():
    held = hold()
    low = [blocked_job() for _ in range(2)]
    high = jobs.slotted.using(priority=5).enqueue(group="b", seconds=0)
    assert claim() == []
    assert state(high) == "blocked"

    get_engine().slots_release_if_held(held[:1])

    assert state(high) == "ready"  # the higher priority first, though enqueued last
    assert [state(h) for h in low] == ["blocked", "blocked"]


def test_the_release_of_another_keys_slot_does_not_wake_it():
    hold()
    other = hold("slot:other")
    handle = blocked_job()

    get_engine().slots_release_if_held(other)

    assert state(handle) == "blocked"


def test_unblock_wakes_it_when_the_holders_slot_lapsed_without_a_release(listener):
    hold(n=2, ttl_ms=300)  # holders that die: nobody releases
    handle = blocked_job()
    assert unblock() == 0  # still held: nothing to wake
    assert state(handle) == "blocked"

    wait_until(lambda: not get_engine().slots_list(slot_key=KEY), message="slots to lapse")
    listener.wait(0.2)
    assert unblock() == 1

    assert state(handle) == "ready"
    assert notified(listener) == ["default"]
    assert len(claim()) == 1


def test_unblock_wakes_no_more_than_the_key_has_room_for():
    hold(n=2, ttl_ms=300)
    handles = [blocked_job() for _ in range(4)]
    wait_until(lambda: not get_engine().slots_list(slot_key=KEY), message="slots to lapse")

    assert unblock() == 2  # the key's limit is 2

    assert sorted(state(h) for h in handles) == ["blocked", "blocked", "ready", "ready"]


def test_unblock_never_wakes_it_while_its_key_is_paused():
    hold(n=2, ttl_ms=300)
    handle = blocked_job()
    pause(KEY)
    wait_until(lambda: not get_engine().slots_list(slot_key=KEY), message="slots to lapse")

    assert unblock() == 0
    assert state(handle) == "blocked"

    FlowPause.objects.filter(key=KEY).delete()  # resumed
    assert unblock() == 1
    assert state(handle) == "ready"


def test_unblock_wakes_it_when_its_keys_pause_ends():
    handle = jobs.slotted.enqueue(group="p", seconds=0)
    pause("slot:p", until=get_engine().db_now() + timedelta(seconds=1))
    assert claim() == []
    row = Job.objects.get(pk=handle.id)
    assert (row.state, row.blocked_on, row.attempt) == ("blocked", "slot:p", 0)
    assert unblock() == 0

    wait_until(lambda: unblock() == 1, timeout=10, message="the pause to end")

    assert state(handle) == "ready"
    assert len(claim()) == 1


def test_a_blocked_job_is_never_claimed_while_its_key_is_paused():
    held = hold()
    handle = blocked_job()
    pause(KEY)

    get_engine().slots_release_if_held(held)
    unblock()
    assert claim() == []

    row = Job.objects.get(pk=handle.id)
    assert (row.state, row.attempt, row.worker_ids) == ("blocked", 0, [])


# ------------------------------------------------------------------------------- resume --


def test_a_blocked_resume_goes_back_to_suspended_when_woken():
    held = hold()
    handle = jobs.slotted.enqueue(group="b", seconds=0)
    # A durable run asleep, due to resume now (its first attempt already spent).
    Job.objects.filter(pk=handle.id).update(state="suspended", attempt=1)

    assert claim() == []
    row = Job.objects.get(pk=handle.id)
    assert (row.state, row.blocked_on, row.blocked_resume, row.attempt) == (
        "blocked", KEY, True, 1)

    get_engine().slots_release_if_held(held[:1])

    row = Job.objects.get(pk=handle.id)
    assert (row.state, row.blocked_on, row.blocked_resume, row.attempt) == (
        "suspended", None, False, 1)
    [run] = claim()
    assert run.resumed and run.attempt == 1  # the resume still spends no attempt


def test_a_blocked_resume_woken_by_unblock_goes_back_to_suspended():
    hold(n=2, ttl_ms=300)
    handle = jobs.slotted.enqueue(group="b", seconds=0)
    Job.objects.filter(pk=handle.id).update(state="suspended", attempt=1)
    assert claim() == []
    wait_until(lambda: not get_engine().slots_list(slot_key=KEY), message="slots to lapse")

    assert unblock() == 1

    assert state(handle) == "suspended"
    assert not Job.objects.get(pk=handle.id).blocked_resume


# ----------------------------------------------------------------------------- operators --


def test_a_blocked_job_can_be_cancelled_and_no_release_revives_it():
    held = hold()
    handle = blocked_job()

    result = api.cancel(handle.id, reason="not needed")

    assert result.changed
    assert state(handle) == "cancelled"
    get_engine().slots_release_if_held(held)
    assert unblock() == 0
    assert state(handle) == "cancelled"
    assert claim() == []


def test_every_surface_counts_each_job_in_exactly_one_bucket_blocked_included(client):
    """Jobs really blocked on a slot (one running holds it with another holder, the claim held
    the rest back) are counted once, in `blocked`, by the engine's reads, `manage.py xjobs` and
    its --json, the dashboard and the metrics: the same numbers everywhere."""
    hold(n=1)
    running = jobs.slotted.enqueue(group="b", seconds=0)
    [run] = claim()
    assert run.id == str(running.id)
    blocked = [blocked_job() for _ in range(3)]
    jobs.noop.enqueue()
    jobs.noop.using(delay=3600).enqueue()
    expected = {**dict.fromkeys(ALL_STATES, 0),
                "ready": 1, "delayed": 1, "running": 1, "blocked": 3}

    [stats] = [s for s in get_engine().queue_stats() if s.queue == "default"]
    assert {b: getattr(stats, b) for b in ALL_STATES} == expected
    assert stats.live == Job.objects.filter(queue="default").count() == 6
    [depth] = [d for d in get_engine().queue_depth() if d.queue == "default"]
    assert {b: getattr(depth, b) for b in LIVE_STATES} == {b: expected[b] for b in LIVE_STATES}

    out = StringIO()
    call_command("xjobs", stdout=out)
    header, _rule, *lines = out.getvalue().splitlines()
    assert set(header.split()) == {"queue", *ALL_STATES}
    [row] = [line.split() for line in lines if line.split()[:1] == ["default"]]
    assert dict(zip(header.split()[1:], map(int, row[1:]), strict=True)) == expected
    out = StringIO()
    call_command("xjobs", "--json", stdout=out)
    [queue] = [q for q in json.loads(out.getvalue())["queues"] if q["queue"] == "default"]
    assert queue == {"queue": "default", **expected}

    [board] = [r for r in queue_rows() if r.queue == "default"]
    assert {b: getattr(board, b) for b in LIVE_STATES} == {b: expected[b] for b in LIVE_STATES}
    response = client.get("/metrics")
    assert response.status_code == 200
    samples = {s.labels["state"]: s.value
               for family in text_string_to_metric_families(response.content.decode())
               for s in family.samples
               if s.name == "xjobs_queue_depth" and s.labels["queue"] == "default"}
    assert samples == {b: expected[b] for b in LIVE_STATES}

    api.cancel(blocked[0].id)
    [stats] = [s for s in get_engine().queue_stats() if s.queue == "default"]
    assert (stats.blocked, stats.cancelled) == (2, 1)


def test_the_release_of_a_slot_of_a_paused_key_leaves_its_blocked_jobs_blocked(listener):
    """The release wakes as jobs_unblock does, and jobs_unblock wakes nothing of a paused key:
    a pause keeps its jobs blocked whoever frees a slot (no ready row for the claim to block
    again, no NOTIFY for workers to claim nothing)."""
    held = hold()
    handle = blocked_job()
    pause(KEY)
    listener.wait(0.2)

    get_engine().slots_release_if_held(held[:1])

    row = Job.objects.get(pk=handle.id)
    assert (row.state, row.blocked_on) == ("blocked", KEY)
    assert notified(listener, timeout=0.5) == []
