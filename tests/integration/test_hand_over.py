"""The hand-over (docs/flow-control.md, "Slots"): the release of a slot passes it, in the same
statement, to the next job blocked on its key that the releasing worker can start itself,
leased to that worker as a claim leases it; what it cannot start is woken for any worker to
claim, as before. These tests send the release as a worker does and read the rows it wrote."""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections import Counter
from datetime import timedelta

import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.test import override_settings

from django_xjobs import conf, registry, slots
from django_xjobs.engines import get_engine
from django_xjobs.models import FlowPause, Job, JobLease
from django_xjobs.records import Completion, HandOver, SlotHold, SlotRelease
from django_xjobs.testing import drain
from django_xjobs.worker.flow import claim_flow
from tests.conftest import wait_until
from tests.integration.test_blocked import KEY, blocked_job, claim, hold, state
from tests.integration.test_lock_order import held, never_waits
from tests.testapp import jobs

pytestmark = pytest.mark.django_db(transaction=True)

WORKER = "w-hand"


def offer(take: int = 10, queues: tuple[str, ...] = ("default",), **flow) -> HandOver:
    params = claim_flow(conf.get(), registry.all_jobs().values(), list(queues))
    return HandOver(worker_id=WORKER, lease_ms=30_000, take=take, queues=queues,
                    flow=dataclasses.replace(params, **flow))


def release(holds: list[SlotHold], take: int = 10, **kwargs) -> SlotRelease:
    return get_engine().slots_release_hand_over(holds, offer(take, **kwargs))


def started_counted(name: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("select coalesce(sum(started), 0) from x_stat_deltas where name = %s",
                       [name])
        return int(cursor.fetchone()[0])


def test_a_freed_slot_goes_to_the_next_blocked_job_of_its_key_leased_to_the_releaser():
    held_slots = hold()
    first, second = blocked_job(), blocked_job()
    urgent = jobs.slotted.using(priority=5).enqueue(group="b", seconds=0)
    assert claim() == []  # blocked as well, ahead of the others in claim order
    counted = started_counted(jobs.slotted.name)

    done = release(held_slots[:1])

    assert (done.released, done.woken, done.busy) == (0, 0, [])
    [run] = done.started
    assert (run.id, run.attempt, run.slot, run.slot_limit) == (str(urgent.id), 1,
                                                               held_slots[0].slot, 2)
    row = Job.objects.get(pk=urgent.id)
    assert (row.state, row.claimed_by, str(row.lease_token), row.blocked_on) == (
        "running", WORKER, run.lease_token, None)
    assert row.worker_ids == [WORKER] and row.started_at is not None
    # The slot row was rewritten for the new run, never deleted: no claim saw it free.
    lease = JobLease.objects.get(lease_key=KEY, slot=held_slots[0].slot)
    assert lease.holder == slots.holder(run, WORKER)
    assert [state(h) for h in (first, second)] == ["blocked", "blocked"]
    assert started_counted(jobs.slotted.name) == counted + 1
    # The new holder renews and releases it like any slot a claim granted.
    mine = SlotHold(slot_key=KEY, slot=run.slot, holder=lease.holder, limit=2)
    assert get_engine().slots_renew_if_held([mine], 30_000).renewed == {lease.holder}


def test_it_hands_over_no_more_than_the_worker_can_take_and_wakes_the_rest():
    held_slots = hold()
    waiting = [blocked_job() for _ in range(3)]

    done = release(held_slots, take=1)

    assert (len(done.started), done.released, done.woken) == (1, 1, 1)
    assert sorted(state(h) for h in waiting) == ["blocked", "ready", "running"]
    assert JobLease.objects.filter(lease_key=KEY).count() == 1


def test_without_an_offer_it_releases_and_wakes_as_before():
    held_slots = hold()
    handle = blocked_job()

    done = get_engine().slots_release_hand_over(held_slots[:1])

    assert (done.released, done.woken, done.started) == (1, 1, [])
    assert state(handle) == "ready"


@pytest.mark.parametrize("why", ["another queue", "a rate budget", "a resume", "queue paused",
                                 "over its own limit", "not due yet"])
def test_a_job_the_claim_would_have_to_decide_is_woken_not_handed_over(why):
    held_slots = hold()
    handle = blocked_job()
    kwargs: dict = {}
    if why == "another queue":
        kwargs["queues"] = ("other",)
    elif why == "a rate budget":
        Job.objects.filter(pk=handle.id).update(rate_key="partner")
    elif why == "a resume":
        Job.objects.filter(pk=handle.id).update(blocked_resume=True)
    elif why == "queue paused":
        FlowPause.objects.create(kind="queue", key="default", reason="tests")
    elif why == "not due yet":  # a debounce or a cron hold moved it on while it was blocked
        Job.objects.filter(pk=handle.id).update(run_at=get_engine().db_now() + timedelta(hours=1))
    else:  # the settings give the key one slot: slot #1 is not under the job's own limit
        kwargs["prefixes"], kwargs["prefix_limits"] = ("slot:",), (1,)

    done = release([h for h in held_slots if h.slot == 1], **kwargs)

    assert done.started == []
    assert (done.released, done.woken) == (1, 1)
    assert state(handle) == ("suspended" if why == "a resume" else "ready")


def test_a_paused_key_neither_hands_over_nor_wakes():
    held_slots = hold()
    handle = blocked_job()
    FlowPause.objects.create(kind="key", key=KEY, reason="tests")

    done = release(held_slots[:1])

    assert (done.started, done.released, done.woken) == ([], 1, 0)
    assert state(handle) == "blocked"


def test_a_blocked_job_another_transaction_holds_is_passed_over_never_waited_for():
    held_slots = hold()
    first, second = blocked_job(), blocked_job()
    with held("select id from x_jobs where id = %s for update", str(first.id)):
        done = never_waits(lambda: release(held_slots[:1]))
    assert [run.id for run in done.started] == [str(second.id)]
    assert (state(first), state(second)) == ("blocked", "running")


def test_a_worker_drains_a_one_slot_key_through_hand_overs_one_run_at_a_time():
    handles = [jobs.fleet_handover.enqueue(group="g", seconds=0) for _ in range(12)]

    stats = drain(["default"], concurrency=4, prefetch=4)

    assert stats["done"] == 12
    assert stats["handed_over"] >= 1
    rows = sorted(Job.objects.filter(pk__in=[h.id for h in handles]).values_list(
        "started_at", "finished_at", "state"))
    assert {r[2] for r in rows} == {"done"}
    for (_, finished, _), (started, _, _) in itertools.pairwise(rows):
        assert started >= finished  # one slot: a run starts only after the previous one ended
    assert not JobLease.objects.filter(expires_at__gt=get_engine().db_now()).exists()


@pytest.mark.parametrize("take", [0, 1])
def test_only_a_workers_release_commits_asynchronously(take):
    # A release inside a caller's transaction (JobLease.objects.release) leaves its commit as
    # it was; a worker's, with an offer, commits as its claims do (without waiting for the WAL).
    from django.db import transaction

    held_slots = hold()
    blocked_job()
    with transaction.atomic():
        get_engine().slots_release_hand_over(held_slots[:1], offer(take) if take else None)
        with connection.cursor() as cursor:
            cursor.execute("show synchronous_commit")
            assert cursor.fetchone()[0] == ("off" if take else "on")


def test_a_keys_backlog_never_keeps_the_claim_from_its_turns():
    # A worker whose whole capacity is the key's limit, behind a backlog other workers blocked:
    # were every release to hand it the key's next job, it would never have room to claim, and
    # the job of its other queue would wait for the whole backlog. A round whose claim is due
    # (a NOTIFY, the poll interval, a claim that came back full) hands nothing over.
    from django_xjobs.worker.loop import Worker
    from django_xjobs.worker.options import WorkerOptions

    hold(n=2, ttl_ms=300)  # the other workers' runs, which die: their slots lapse
    backlog = [jobs.slotted.enqueue(group="b", seconds=0.1) for _ in range(40)]
    assert claim(n=40) == []  # blocked by another worker's claim
    worker = Worker(WorkerOptions.from_settings(
        queues=("default", "other"), concurrency=2, prefetch=0, install_signals=False,
        worker_id="w-starve"))
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        ids = [h.id for h in backlog]
        wait_until(lambda: Job.objects.filter(pk__in=ids, state="done").count() >= 2,
                   message="the backlog under way")
        other = jobs.on_other_queue.enqueue()
        wait_until(lambda: other.get().state == "done", message="the other queue's job")
        wait_until(lambda: Job.objects.filter(pk__in=ids, state="done").count() == 40,
                   message="the backlog's end")
        after = Job.objects.filter(pk__in=ids, started_at__gt=other.get().started_at).count()
        assert after >= 20, f"the other queue's job started behind {40 - after} of 40"
    finally:
        worker.stop()
        thread.join(30)


def test_a_queue_with_a_cap_is_not_handed_over():
    from django_xjobs.worker.flow import Flow

    with override_settings(XJOBS={**django_settings.XJOBS, "QUEUES": {
            "default": {}, "capped": {"concurrency": 1}}}):
        flow = Flow(engine=get_engine(), settings=conf.get(), worker_id=WORKER,
                    queues=["default", "capped"], poll_interval=0.2, stats=Counter())
        assert flow._hand_over_queues == ("default",)


def test_a_worker_offers_its_room_only_in_a_round_that_does_not_claim_and_never_leaving():
    from django_xjobs.worker.loop import Worker
    from django_xjobs.worker.options import WorkerOptions

    worker = Worker(WorkerOptions.from_settings(concurrency=3, prefetch=0,
                                                install_signals=False))
    assert worker.flow.offer is not None
    assert worker.flow.offer(0) == 0  # the first round claims
    worker._claim_first = False
    assert worker.flow.offer(2) == 5  # its free capacity and what the settle frees
    worker._leaving = True  # out of the loop (a burst's end): nothing would run what it gets
    assert worker.flow.offer(2) == 0
    worker._leaving, worker._stopping = False, True
    assert worker.flow.offer(2) == 0


# ------------------------------------------- the acknowledgement that carries the release --


def running_with_slots(group: str = "m", n: int = 2):
    """``n`` runs of jobs.slotted holding their key's slots (limit 2), claimed as a worker's,
    with their holds, and two more jobs of the key blocked behind them."""
    handles = [jobs.slotted.enqueue(group=group, seconds=0) for _ in range(n)]
    runs = sorted(claim(n=n), key=lambda r: r.id)
    assert [r.id for r in runs] == sorted(str(h.id) for h in handles)
    behind = [jobs.slotted.enqueue(group=group, seconds=0) for _ in range(2)]
    assert claim() == []
    holds = [SlotHold(slot_key=f"slot:{group}", slot=r.slot, holder=slots.holder(r, "w-blocked"),
                      limit=2) for r in runs]
    return runs, holds, behind


def ack_and_release(runs, holds, take: int = 10):
    return get_engine().jobs_complete_release_if_owned(
        [Completion(claim=r.claim, result_json='{"ok": 1}') for r in runs], holds, offer(take))


def test_the_ack_of_slot_holding_runs_hands_their_slots_over_in_the_same_statement():
    runs, holds, behind = running_with_slots()

    report, done = ack_and_release(runs, holds)

    assert report.owned == {r.lease_token for r in runs}
    assert {Job.objects.get(pk=r.id).state for r in runs} == {"done"}
    assert sorted(r.id for r in done.started) == sorted(str(h.id) for h in behind)
    assert (done.released, done.woken, done.busy) == (0, 0, [])
    assert sorted(JobLease.objects.values_list("holder", flat=True)) == sorted(
        slots.holder(r, WORKER) for r in done.started)


def test_a_run_whose_row_is_held_elsewhere_is_not_settled_and_keeps_its_slot():
    runs, holds, behind = running_with_slots()
    with held("select id from x_jobs where id = %s for update", runs[0].id):
        report, done = never_waits(lambda: ack_and_release(runs, holds))

    assert (report.busy, report.owned) == ({runs[0].lease_token}, {runs[1].lease_token})
    assert Job.objects.get(pk=runs[0].id).state == "running"
    assert JobLease.objects.get(slot=runs[0].slot).holder == holds[0].holder  # still its own
    [started] = done.started  # the other run's slot went to the first job behind
    assert JobLease.objects.get(slot=runs[1].slot).holder == slots.holder(started, WORKER)
    assert sorted(state(h) for h in behind) == ["blocked", "running"]


def test_a_run_that_lost_its_job_lets_go_of_its_slot_with_the_others():
    runs, holds, behind = running_with_slots()
    assert get_engine().job_cancel(runs[0].id, reason="operator")  # the run lost it

    report, done = ack_and_release(runs, holds)

    assert report.lost == {runs[0].lease_token} and report.owned == {runs[1].lease_token}
    assert len(done.started) == 2  # both slots handed over
    assert sorted(state(h) for h in behind) == ["running", "running"]


def test_a_release_reaches_each_job_it_hands_over_through_one_key_probe():
    # 20 keys, their 2 slots each held, 2 jobs of each blocked: the release of the 40 holds
    # hands over the 40 jobs. The update that starts them reaches their rows through the
    # primary key alone. Joined to the hand-over's CTE, as it was, the planner (which cannot
    # estimate a CTE) could nest a scan of all the ids inside a loop over them: with the
    # bench's statistics it read 300 rows to start 24 (docs/performance.md, "Flow control").
    from django_xjobs.engines.postgres.params import in_slot_order, release_params
    from django_xjobs.engines.postgres.statements.slots import SLOTS_RELEASE_IF_HELD
    from tests.conformance.test_flow_plans import explain_generic, nodes

    keys = [f"slot:g{i:02d}" for i in range(20)]
    holds = [h for key in keys for h in hold(key)]
    for key in keys:
        blocked_job(key), blocked_job(key)
    params = release_params(in_slot_order(holds), offer(take=40), get_engine().notify)
    with connection.cursor() as cursor:  # the scans a worker's session leaves out
        cursor.execute("set enable_seqscan = off; set enable_bitmapscan = off")
    try:
        plan = explain_generic(SLOTS_RELEASE_IF_HELD.sql, params)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("reset enable_seqscan; reset enable_bitmapscan")

    [start] = [n for n in nodes(plan) if n["Node Type"] == "ModifyTable"
               and n.get("Relation Name") == "x_jobs" and n["Actual Rows"] > 0]
    assert start["Actual Rows"] == 40  # the hand-over; nothing else was woken
    [scan] = [n for n in start["Plans"] if n["Parent Relationship"] == "Outer"]
    assert (scan["Node Type"], scan.get("Index Name")) == ("Index Scan", "x_jobs_pkey")
    assert scan["Actual Rows"] * scan["Actual Loops"] == 40
