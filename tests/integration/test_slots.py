"""Concurrency slots with Django and the real worker loop in this process: enqueue writes the
key (or nothing), a run holds its slot from start to settle however it ends, a refused job goes
back without spending an attempt, a slot lost stops the run, a durable sleep releases the slot,
and the statements stay batched (unlimited jobs run none of them)."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from contextlib import contextmanager

import pytest
from django.core import checks
from django.test import override_settings

from django_xjobs import Concurrency, api, enqueue, enqueue_many, faults, job, registry
from django_xjobs.engines import get_engine
from django_xjobs.exceptions import InvalidConcurrencyKey
from django_xjobs.models import Job, JobLease
from django_xjobs.records import SlotHold, SlotRequest
from django_xjobs.testing import drain
from django_xjobs.worker.loop import Worker
from django_xjobs.worker.options import WorkerOptions
from tests.conftest import wait_until
from tests.testapp import jobs
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)

FINISHED = ("done", "dead", "cancelled")
SLOT_STATEMENTS = ("slots_acquire", "slots_renew_if_held", "slots_release_if_held",
                   "jobs_complete_release_if_owned", "jobs_requeue_if_owned",
                   "job_requeue_if_owned")
# The statements that release slots: on its own, or with the acknowledgement of their runs.
RELEASES = ("slots_release_if_held", "jobs_complete_release_if_owned")


@contextmanager
def counting(*names: str):
    """How many times the engine ran each named statement (its ``before:`` fault point)."""
    counts: Counter[str] = Counter()
    lock = threading.Lock()

    def hook(point: str) -> None:
        with lock:
            counts[point.removeprefix("before:")] += 1

    for name in names:
        faults.inject_hook(f"before:{name}", hook, times=None)
    try:
        yield counts
    finally:
        faults.clear()


def drain_until(*handles, timeout: float = 30.0) -> Counter[str]:
    totals: Counter[str] = Counter()
    deadline = time.monotonic() + timeout
    while True:
        totals.update(drain(concurrency=4))
        if all(h.get().state in FINISHED for h in handles):
            return totals
        if time.monotonic() >= deadline:
            pytest.fail(f"jobs still {[h.get().state for h in handles]} after {timeout}s; "
                        f"stats {totals}")
        time.sleep(0.05)  # the poll interval: a slot may be free a moment later


def hold_slots(key: str, limit: int, n: int, who: str = "outsider") -> list[SlotHold]:
    """Take ``n`` slots of ``key`` from outside the worker, as another worker would."""
    return get_engine().slots_acquire(
        [SlotRequest(slot_key=key, limit=limit, holder=f"{who}-{i}") for i in range(n)], 60_000
    )


def live(key: str | None = None) -> list:
    return get_engine().slots_list(slot_key=key)


def effects(handle, kind: str | None = None) -> list[Effect]:
    rows = Effect.objects.filter(job_id=str(handle.id)).order_by("id")
    return list(rows.filter(kind=kind) if kind else rows)


@contextmanager
def running_worker(**overrides):
    """A real worker loop in a background thread (no signals), stopped on the way out."""
    options = WorkerOptions.from_settings(install_signals=False, duties=(), notify=False,
                                          **overrides)
    worker = Worker(options)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop("test over")
        thread.join(timeout=30)


# -------------------------------------------------------------------------------- enqueue --


def test_enqueue_stores_the_key_formatted_from_the_input_and_the_tenant():
    a = jobs.slotted.enqueue(group="a")
    t = jobs.per_tenant.using(tenant_id="acme").enqueue(n=1)
    named = enqueue("testapp.slotted", {"group": "b"})
    explicit = jobs.slotted.using(concurrency_key="slot:manual").enqueue(group="c")

    keys = dict(Job.objects.values_list("id", "concurrency_key"))
    assert keys == {a.id: "slot:a", t.id: "tenant:acme", named.id: "slot:b",
                    explicit.id: "slot:manual"}


def test_a_missing_key_field_writes_no_row_and_leaves_the_transaction_usable():
    from django.db import transaction

    with transaction.atomic():
        jobs.record.enqueue(tag="kept")
        with pytest.raises(InvalidConcurrencyKey, match=r"\{tenant_id\}"):
            jobs.per_tenant.enqueue(n=1)
        jobs.record.enqueue(tag="kept too")

    assert Job.objects.filter(name="testapp.per_tenant").count() == 0
    assert Job.objects.filter(name="testapp.record").count() == 2


def test_one_bad_item_of_a_bulk_enqueue_writes_nothing():
    items = [("testapp.slotted", {"group": str(i)}) for i in range(5)]
    items.insert(3, ("testapp.slotted", {"group": ["not", "a", "key"]}))

    with pytest.raises(InvalidConcurrencyKey, match=r"\{group\}"):
        enqueue_many(items)

    assert Job.objects.count() == 0


def test_bulk_enqueue_writes_every_items_own_key():
    handles = jobs.slotted.bulk_enqueue({"group": str(i % 3)} for i in range(6))

    keys = dict(Job.objects.values_list("id", "concurrency_key"))
    assert [keys[h.id] for h in handles] == ["slot:0", "slot:1", "slot:2"] * 2


def test_an_explicit_key_by_name_needs_a_limit():
    with pytest.raises(InvalidConcurrencyKey, match="no concurrency limit"):
        enqueue("testapp.record", {}, concurrency_key="nolimit:1")
    assert Job.objects.count() == 0


# ---------------------------------------------------------------------- holding a slot --


def test_a_slot_limited_job_runs_and_leaves_no_slot_held():
    handles = [jobs.slotted.enqueue(group="g", seconds=0) for _ in range(3)]

    stats = drain_until(*handles)

    assert {h.get().state for h in handles} == {"done"}
    assert {h.get().attempt for h in handles} == {1}  # held back, never refused after a claim
    # Claimed, or handed a slot its key's previous run released (the hand-over)
    assert stats["claimed"] + stats["handed_over"] == 3
    assert live() == []
    assert not JobLease.objects.exists()  # released, not left to expire
    assert not Job.objects.filter(state="blocked").exists()


@pytest.mark.parametrize(
    ("outcome", "state"),
    [("done", "done"), ("fail", "dead"), ("permanent", "dead"), ("snooze", "done"),
     ("timeout", "dead")],
)
def test_the_slot_is_released_however_the_run_ends(outcome, state):
    handle = jobs.slotted_outcome.enqueue(group=outcome, outcome=outcome)

    drain_until(handle)

    assert handle.get().state == state
    assert live() == []
    assert not JobLease.objects.exists()


def test_a_job_whose_key_is_full_is_not_claimed_and_waits_blocked_without_an_attempt():
    held = hold_slots("slot:busy", 2, 2)
    handle = jobs.slotted.enqueue(group="busy", seconds=0)

    stats = drain()

    row = handle.get()
    assert stats["claimed"] == 0  # never handed to the worker
    assert (row.state, row.attempt, row.worker_ids) == ("blocked", 0, [])
    assert Job.objects.get(pk=handle.id).blocked_on == "slot:busy"
    assert effects(handle) == []
    for _ in range(3):  # claims come and go; it is not even looked at
        assert drain()["claimed"] == 0
    assert handle.get().attempt == 0

    # The release of one slot wakes it in the same statement, wherever it was freed.
    get_engine().slots_release_if_held(held[:1])
    assert handle.get().state == "ready"
    drain_until(handle)
    row = handle.get()
    assert (row.state, row.attempt) == ("done", 1)
    assert [e.attempt for e in effects(handle, "start")] == [1]


def test_a_freed_slot_wakes_the_next_job_at_once_not_a_poll_interval_later():
    # Poll interval far longer than the test: without the wake-up by the release, one drain
    # would stop with the blocked jobs left behind.
    handles = [jobs.slotted.enqueue(group="relay", seconds=0.05) for _ in range(6)]

    with override_settings(XJOBS={"POLL_INTERVAL": "60s",
                                  "CONCURRENCY_LIMITS": {"slot:relay": 1}}), \
            counting(*RELEASES, "jobs_unblock") as counts:
        drain(concurrency=4, prefetch=0)

    assert {h.get().state for h in handles} == {"done"}
    assert sum(counts[name] for name in RELEASES) >= 5
    assert counts["jobs_unblock"] <= 1  # its pass at start-up: the releases woke them
    assert {h.get().attempt for h in handles} == {1}
    # One at a time all along: each run started after the previous one ended.
    marks = [e.kind for e in Effect.objects.filter(tag__startswith="relay|").order_by("at", "id")]
    assert marks == ["start", "end"] * 6


def test_a_claim_takes_its_slots_and_blocks_what_it_cannot_run_in_its_one_statement():
    hold_slots("slot:full", 2, 2)
    blocked = [jobs.slotted.enqueue(group="full", seconds=0) for _ in range(6)]

    with counting("jobs_claim", *SLOT_STATEMENTS) as counts:  # one queue: one claim
        stats = drain(["default"], concurrency=8, prefetch=0)

    assert stats["claimed"] == 0
    assert counts["slots_acquire"] == 0
    assert counts["jobs_requeue_if_owned"] == 0
    assert {h.get().state for h in blocked} == {"blocked"}
    assert {h.get().attempt for h in blocked} == {0}


def test_the_slots_of_a_batch_are_released_in_one_statement():
    handles = [jobs.slotted.enqueue(group=str(i), seconds=0.2) for i in range(6)]

    with counting(*SLOT_STATEMENTS) as counts:  # one queue: the whole batch in one claim
        drain(["default"], concurrency=8, prefetch=0)

    assert {h.get().state for h in handles} == {"done"}
    assert counts["slots_acquire"] == 0  # the claim took them
    assert 1 <= sum(counts[name] for name in RELEASES) <= 6
    assert counts["jobs_requeue_if_owned"] == 0


def test_unlimited_jobs_run_no_slot_statement():
    handles = [jobs.record.enqueue(tag=str(i)) for i in range(20)]

    with counting(*SLOT_STATEMENTS) as counts:
        drain(concurrency=4)

    assert {h.get().state for h in handles} == {"done"}
    assert sum(counts.values()) == 0


def test_a_key_without_a_known_limit_runs_one_at_a_time():
    with override_settings(XJOBS={"CONCURRENCY_LIMITS": {"fallback:": 5}}):
        handles = [jobs.record.using(concurrency_key="fallback:1").enqueue(tag=str(i))
                   for i in range(3)]

    # Enqueued under other settings: no limit applies here, so the claim allows one.
    claimed = get_engine().jobs_claim(wants={"default": 4}, worker_id="w", lease_ms=30_000)

    assert len(claimed) == 1
    assert claimed[0].slot_limit == 1
    assert Job.objects.filter(state="blocked", blocked_on="fallback:1").count() == 2
    assert [h.get().state for h in handles].count("blocked") == 2


def test_a_settings_limit_overrides_the_jobs_own():
    handles = [jobs.slotted.enqueue(group="wide", seconds=0) for _ in range(4)]

    with override_settings(XJOBS={"CONCURRENCY_LIMITS": {"slot:wide": 4}}):
        from django_xjobs import conf
        from django_xjobs.worker.flow import claim_flow
        flow = claim_flow(conf.get(), registry.all_jobs().values(), ["default"])
        claimed = get_engine().jobs_claim(wants={"default": 4}, worker_id="w",
                                          lease_ms=30_000, flow=flow)

    assert len(claimed) == 4
    assert {c.slot_limit for c in claimed} == {4}
    assert sorted(c.slot for c in claimed) == [0, 1, 2, 3]
    assert not any(h.get().state == "blocked" for h in handles)


def test_a_job_unknown_here_gives_its_slot_back():
    handle = jobs.slotted.enqueue(group="ghost", seconds=0)
    Job.objects.filter(pk=handle.id).update(name="testapp.gone")

    drain()

    assert "UnknownJob" in handle.get().last_error
    assert live() == []


# ------------------------------------------------------------------------------ slot lost --


def test_a_refused_renewal_stops_the_run_with_slot_lost_and_requeues_the_job(caplog):
    handle = jobs.slotted_polite.enqueue(group="stolen", seconds=30)
    with override_settings(XJOBS={"LEASE": "30s", "HEARTBEAT": "0.2s", "SLOT_TTL": "30s",
                                  "POLL_INTERVAL": "0.2s"}), \
            caplog.at_level(logging.ERROR, logger="django_xjobs.worker"), \
            running_worker(concurrency=1) as worker:
        wait_until(lambda: effects(handle, "start"), message="the run to start")
        row = JobLease.objects.get(lease_key="slowslot:stolen")
        # Another holder took the slot over (as after a lapse): the run's renewal is refused.
        JobLease.objects.filter(pk=row.pk).update(holder="intruder")

        wait_until(lambda: effects(handle, "end"), message="the run to stop")
        wait_until(lambda: worker.stats["slot_lost"] and handle.get().state != "running",
                   message="the job to be handed back")
        row_after = handle.get()

    assert effects(handle, "end")[0].tag.startswith("X_JOB_SLOT_LOST")
    assert [e.tag for e in effects(handle, "raised")] == ["SlotLost"]
    assert row_after.attempt == 0
    assert row_after.result is None
    assert "X_JOB_SLOT_LOST" in row_after.last_error
    # Its release is fenced on the holder: the intruder's slot is left alone.
    assert list(JobLease.objects.values_list("holder", flat=True)) == ["intruder"]
    assert any("X_JOB_SLOT_LOST" in r.getMessage() for r in caplog.records)


def test_a_run_that_cannot_renew_its_slot_for_a_whole_ttl_stops_itself(caplog):
    handle = jobs.slotted_polite.enqueue(group="hung", seconds=30)
    hung, release = threading.Event(), threading.Event()

    def hang(point: str) -> None:
        hung.set()
        release.wait(10)  # the heartbeat's renewal hangs; the loop must not wait for it

    with override_settings(XJOBS={"LEASE": "30s", "HEARTBEAT": "0.2s", "SLOT_TTL": "0.6s",
                                  "POLL_INTERVAL": "0.2s"}), \
            caplog.at_level(logging.ERROR, logger="django_xjobs.worker"), \
            running_worker(concurrency=1) as worker:
        wait_until(lambda: effects(handle, "start"), message="the run to start")
        faults.inject_hook("before:slots_renew_if_held", hang, times=None)
        try:
            wait_until(lambda: effects(handle, "end"), message="the run to stop")
            wait_until(lambda: handle.get().state != "running", message="the hand-back")
        finally:
            faults.clear()
            release.set()
        stats = dict(worker.stats)

    assert hung.is_set()
    assert stats["slot_lost"] >= 1
    assert effects(handle, "end")[0].tag.startswith("X_JOB_SLOT_LOST: no slot renewal")
    assert "X_JOB_SLOT_LOST" in handle.get().last_error
    assert handle.get().attempt == 0


def test_a_run_that_finishes_after_its_slot_lapsed_never_writes_its_result(caplog):
    handle = jobs.slotted.enqueue(group="late", seconds=1.0)
    started, release = threading.Event(), threading.Event()

    def hang_heartbeat(point: str) -> None:
        release.wait(10)  # no slot renewal lands from here on

    def slow_watch(point: str) -> None:
        # The watch comes too late (the process was frozen, and the executor thread got the
        # CPU first), so it cannot stop the run in time: the run's own outcome is what must
        # be refused. Held until the test saw the hand-back.
        if started.is_set():
            release.wait(10)

    with override_settings(XJOBS={"LEASE": "30s", "HEARTBEAT": "0.2s", "SLOT_TTL": "0.6s",
                                  "POLL_INTERVAL": "0.2s"}), \
            caplog.at_level(logging.ERROR, logger="django_xjobs.worker"), \
            running_worker(concurrency=1) as worker:
        wait_until(lambda: effects(handle, "start"), message="the run to start")
        faults.inject_hook("before:slots_renew_if_held", hang_heartbeat, times=None)
        faults.inject_hook("worker:watch", slow_watch, times=None)
        started.set()
        try:
            wait_until(lambda: effects(handle, "end"), message="the run to end")
            wait_until(lambda: handle.get().state != "running", message="the hand-back")
        finally:
            faults.clear()
            release.set()
        stats = dict(worker.stats)

    row = handle.get()
    assert stats["slot_lost"] >= 1
    assert any("the run ended after its slot lapsed" in r.getMessage() for r in caplog.records)
    assert row.result is None and row.state != "done"
    assert "X_JOB_SLOT_LOST" in row.last_error
    assert row.attempt == 0
    assert any("X_JOB_SLOT_LOST" in r.getMessage() for r in caplog.records)


def test_a_step_that_ends_after_its_runs_slot_lapsed_is_not_recorded():
    from django_xjobs.models import JobStep

    handle = jobs.slotted_step.enqueue(group="late", seconds=1.0)
    started, release = threading.Event(), threading.Event()

    def hang_heartbeat(point: str) -> None:
        release.wait(10)

    def slow_watch(point: str) -> None:  # as above: the step's write must be refused
        if started.is_set():
            release.wait(10)

    with override_settings(XJOBS={"LEASE": "30s", "HEARTBEAT": "0.2s", "SLOT_TTL": "0.6s",
                                  "POLL_INTERVAL": "0.2s"}), \
            running_worker(concurrency=1):
        wait_until(lambda: Job.objects.filter(pk=handle.id, state="running").exists(),
                   message="the run to start")
        faults.inject_hook("before:slots_renew_if_held", hang_heartbeat, times=None)
        faults.inject_hook("worker:watch", slow_watch, times=None)
        started.set()
        try:
            wait_until(lambda: effects(handle, "work"), message="the step's code to end")
            wait_until(lambda: handle.get().state != "running", message="the hand-back")
            handed_back = handle.get()
            steps = list(JobStep.objects.filter(run_id=handed_back.run_id, status="completed"))
        finally:
            faults.clear()
            release.set()

    assert steps == []  # the slow execution's output was never stored
    assert "X_JOB_SLOT_LOST" in handed_back.last_error
    assert handed_back.attempt == 0
    drain_until(handle)
    assert handle.get().result == {"worked": True}
    assert len(effects(handle, "work")) == 2  # the step ran again, under a slot


# --------------------------------------------------------------------------- durable sleep --


def test_a_durably_sleeping_job_releases_its_slot_and_takes_one_again_to_resume():
    sleeper = jobs.slotted_sleeper.enqueue(group="g", seconds=2.0)
    drain()
    assert sleeper.get().state == "suspended"
    assert live("nap:g") == []  # released while it sleeps

    # Another job of the key runs while the first one sleeps.
    other = jobs.slotted_sleeper.enqueue(group="g", seconds=0)
    drain_until(other)
    assert sleeper.get().state == "suspended"

    # Due to resume, but its key's only slot is taken: it is blocked and spends nothing, and
    # the release sends it back to suspended (its resume still counts no attempt).
    wait_until(lambda: get_engine().db_now() >= sleeper.get().run_at, message="wake time")
    held = hold_slots("nap:g", 1, 1)
    stats = drain()
    assert stats["claimed"] == 0
    row = sleeper.get()
    assert (row.state, row.attempt) == ("blocked", 1)
    assert Job.objects.get(pk=sleeper.id).blocked_resume

    get_engine().slots_release_if_held(held)
    assert sleeper.get().state == "suspended"
    drain_until(sleeper)
    assert sleeper.get().state == "done"
    assert sleeper.get().attempt == 1
    assert [e.kind for e in effects(sleeper)] == ["before", "after"]
    assert effects(other, "before")[0].id < effects(sleeper, "after")[0].id
    assert live() == []


# ------------------------------------------------------------------------------- operators --


def test_stats_and_the_slots_command_show_held_slots_per_key():
    import json
    from io import StringIO

    from django.core.management import call_command

    hold_slots("tenant:acme", 3, 2, who="w")
    hold_slots("tenant:zeta", 3, 1, who="w")

    def run(*args: str) -> str:
        out = StringIO()
        call_command("xjobs", *args, stdout=out)
        return out.getvalue()

    with override_settings(XJOBS={"CONCURRENCY_LIMITS": {"tenant:": 3}}):
        text = run()
    assert "tenant:acme  2 / 3" in text and "tenant:zeta  1 / 3" in text
    stats = json.loads(run("--json"))
    assert stats["slots"][0]["key"] == "tenant:acme" and stats["slots"][0]["held"] == 2

    listed = json.loads(run("slots", "--json"))
    assert [(s["key"], s["slot"]) for s in listed] == [
        ("tenant:acme", 0), ("tenant:acme", 1), ("tenant:zeta", 0)]
    assert all(0 < s["expires_in_seconds"] <= 60 for s in listed)
    assert [s["key"] for s in json.loads(run("slots", "--key", "tenant:zeta", "--json"))] == [
        "tenant:zeta"]
    table = run("slots")
    assert "tenant:acme" in table and "expires in" in table

    JobLease.objects.all().delete()
    assert "(no slots held)" in run("slots")
    assert "slots: none held" in run()


def test_the_slots_command_lists_the_job_and_worker_of_each_holder():
    from io import StringIO

    from django.core.management import call_command

    handle = jobs.slotted_polite.enqueue(group="shown", seconds=30)
    with running_worker(concurrency=1, worker_id="w-shown") as _worker:
        wait_until(lambda: effects(handle, "start"), message="the run to start")
        out = StringIO()
        call_command("xjobs", "slots", stdout=out)
        api.cancel(handle.id)
    assert "slowslot:shown" in out.getvalue()
    assert str(handle.id) in out.getvalue() and "w-shown" in out.getvalue()


def test_a_job_whose_keys_get_no_limit_fails_the_system_check():
    @job(name="t.unlimited_template", concurrency=Concurrency(key="acct:{n}"))
    def f(ctx, n):
        return n

    try:
        messages = [m for m in checks.run_checks(tags=["django_xjobs"]) if m.id == "xjobs.E040"]
        assert len(messages) == 1 and "t.unlimited_template" in messages[0].msg
        with override_settings(XJOBS={"CONCURRENCY_LIMITS": {"acct:": 2}}):
            assert [m for m in checks.run_checks(tags=["django_xjobs"])
                    if m.id == "xjobs.E040"] == []
        with override_settings(XJOBS={"CONCURRENCY_LIMITS": {"acct:big": 2}}):
            assert len([m for m in checks.run_checks(tags=["django_xjobs"])
                        if m.id == "xjobs.E040"]) == 1
    finally:
        registry.unregister("t.unlimited_template")


# ------------------------------------------------------------------------- the hot path --


def statements_run(fn):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as ctx:
        result = fn()
    return result, [q["sql"] for q in ctx.captured_queries]


def test_acquiring_renewing_and_releasing_forty_slots_is_one_statement_each():
    engine = get_engine()
    requests = [SlotRequest(slot_key=f"hot:{i % 8}", limit=5, holder=f"h{i}")
                for i in range(40)]

    granted, acquire = statements_run(lambda: engine.slots_acquire(requests, 60_000))
    renewed, renew = statements_run(lambda: engine.slots_renew_if_held(granted, 60_000))
    released, release = statements_run(lambda: engine.slots_release_if_held(granted))

    assert len(granted) == 40 and renewed.renewed == {g.holder for g in granted}
    assert released == (40, [])
    assert [len(acquire), len(renew), len(release)] == [1, 1, 1]
    assert "slots_acquire" in acquire[0] and "slots_release_if_held" in release[0]


def test_handing_back_forty_refused_claims_is_one_statement():
    from django_xjobs.records import Requeue

    engine = get_engine()
    jobs.record.bulk_enqueue({"tag": str(i)} for i in range(40))
    claimed = engine.jobs_claim(wants={"default": 40}, worker_id="tests:hot", lease_ms=60_000)
    batch = [Requeue(claim=c.claim, delay_ms=200, spent_attempt=True,
                     resumed=False) for c in claimed]

    report, sql = statements_run(lambda: engine.jobs_requeue_if_owned(batch))

    assert len(report.owned) == 40
    assert len(sql) == 1


def test_xjobs_show_names_the_jobs_concurrency_key():
    from io import StringIO

    from django.core.management import call_command

    handle = jobs.per_tenant.using(tenant_id="acme").enqueue(n=1)
    out = StringIO()
    call_command("xjobs", "show", str(handle.id), stdout=out)
    assert "concurrency_key: tenant:acme" in out.getvalue()
