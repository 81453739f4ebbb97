"""No statement a worker sends waits on a row another transaction holds (docs/design.md, "Lock
order"), and what it finds held it answers busy, writes later, and loses nothing.

Each test holds a row in a session of its own (a request's select for update, an operator's
change not committed yet, a user's rate spend or slot acquire) and runs the worker's statement
through ``never_waits``: the statement runs on a thread of its own, and the test fails the
moment PostgreSQL shows that thread's backend waiting on a lock. Each pair of statements that
could meet in a lock cycle (item 2 and 4 of the issue: the heartbeat and the batched ack, two
claims burying children of one parent, an operator's cancel of a family and the ack of its last
child, slot renewals and releases) meets here with one of them holding its rows.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any
from uuid import UUID

import pytest
from django.db import connection, connections

from django_xjobs import RateLimit, conf
from django_xjobs.engines import get_engine
from django_xjobs.models import Job, JobLease, JobStep, LeaseExtension
from django_xjobs.records import (
    ClaimFlow,
    Completion,
    Failure,
    Fence,
    Requeue,
    RunOwner,
    SlotRequest,
    Suspension,
)
from tests.conformance.conftest import a_parent_waiting_on, claim, enqueue
from tests.conftest import raw_connection, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

LEASE_MS = 60_000


# --------------------------------------------------------------------------------- helpers --


def never_waits(call: Callable[[], Any]) -> Any:
    """``call()`` on a thread with a connection of its own; its answer. Fails the test (after
    cancelling the statement, so nothing hangs) if its backend is seen waiting on a lock."""
    answer: list[Any] = []
    errors: list[BaseException] = []
    pid: list[int] = []

    def run() -> None:
        try:
            with connections["default"].cursor() as cursor:
                cursor.execute("select pg_backend_pid()")
                pid.append(cursor.fetchone()[0])
            answer.append(call())
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    waited = None
    while thread.is_alive():
        thread.join(0.01)
        if pid and thread.is_alive():
            with connection.cursor() as cursor:
                cursor.execute("select wait_event, left(query, 60) from pg_stat_activity"
                               " where pid = %s and wait_event_type = 'Lock'", [pid[0]])
                waited = waited or cursor.fetchone()
                if waited:
                    cursor.execute("select pg_cancel_backend(%s)", [pid[0]])
    thread.join()
    assert waited is None, f"the worker's statement waited on a lock: {waited}"
    if errors:
        raise errors[0]
    return answer[0]


@contextmanager
def held(sql: str, *args: Any) -> Iterator[Any]:
    """A transaction of another session, left open while the block runs, that ran ``sql``."""
    other = raw_connection(application_name="a request")
    try:
        other.execute(sql, args)
        yield other
    finally:
        other.rollback()
        other.close()


@contextmanager
def held_by_django(body: Callable[[], Any]) -> Iterator[None]:
    """``body()`` in a transaction.atomic() of a thread of its own (the application's code, on
    Django's connection), left open while the block runs, committed after it."""
    from django.db import transaction

    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                body()
                locked.set()
                assert release.wait(30), "the test never let the transaction commit"
        finally:
            connections.close_all()

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert locked.wait(30), "the transaction did not take its locks"
        yield
    finally:
        release.set()
        thread.join(30)


def a_running(engine, n: int = 2, queue: str = "locks", *, lease_ms: int = LEASE_MS):
    for _ in range(n):
        enqueue(engine, queue=queue)
    return sorted(claim(engine, queue, n, lease_ms=lease_ms), key=lambda c: c.id)


def step_row(parent) -> JobStep:
    return JobStep.objects.get(run_id=parent.run_id, name="naps")


# ------------------------------------------------------- the heartbeat and the batched ack --


def test_a_renewal_skips_a_held_row_and_keeps_its_lease_beside_it(engine):
    first, second = a_running(engine)
    with held("select id from x_jobs where id = %s for update", second.id):
        renewal = never_waits(lambda: get_engine().jobs_renew_if_owned(
            [first.claim, second.claim], LEASE_MS))
    assert (renewal.renewed, renewal.kept) == ({first.lease_token}, {second.lease_token})
    kept = LeaseExtension.objects.get(lease_token=second.lease_token)
    assert str(kept.job_id) == second.id
    # Free again: renewed on its row.
    assert engine.jobs_renew_if_owned([second.claim], LEASE_MS).renewed == {second.lease_token}


def test_a_lapsed_lease_kept_beside_its_held_row_is_not_claimed(engine):
    [run] = a_running(engine, 1, lease_ms=1)
    wait_until(lambda: Job.objects.filter(id=run.id, visible_at__lte=engine.db_now()).exists())
    with held("select id from x_jobs where id = %s for update", run.id):
        assert engine.jobs_renew_if_owned([run.claim], LEASE_MS).kept == {run.lease_token}
    # The row is free and its lease lapsed on the row, but its extension runs: no rescue.
    assert claim(engine, "locks", 5, worker="thief") == []
    assert Job.objects.get(id=run.id).lease_token == UUID(run.lease_token)
    LeaseExtension.objects.update(until=engine.db_now() - timedelta(seconds=1))
    [rescued] = claim(engine, "locks", 5, worker="thief")
    assert (rescued.id, rescued.lease_token != run.lease_token) == (run.id, True)


def test_an_ack_batch_settles_the_free_rows_and_answers_the_held_one_busy(engine):
    first, second = a_running(engine)
    batch = [Completion(claim=c.claim, result_json="1") for c in (second, first)]
    with held("select id from x_jobs where id = %s for update", second.id):
        report = never_waits(lambda: get_engine().jobs_complete_if_owned(batch))
        assert report.outcome(first.lease_token) is Fence.OWNED
        assert report.outcome(second.lease_token) is Fence.BUSY
        assert Job.objects.get(id=second.id).state == "running"
    report = engine.jobs_complete_if_owned(batch[:1])
    assert report.outcome(second.lease_token) is Fence.OWNED


def test_the_heartbeat_and_an_ack_of_the_same_rows_never_wait_on_each_other(engine):
    """The deadlock of a worker with itself: its heartbeat renewing its rows in one order
    while its ack locks them in another. Each holds a row the other wants here."""
    runs = a_running(engine, 4)
    first, last = runs[0], runs[-1]
    ack = raw_connection()
    try:
        # The ack, part way: it holds the last row (its batch in finish order)...
        ack.execute("update x_jobs set updated_at = now() where id = %s", [last.id])
        # ...while the heartbeat renews them all in id order, and the ack then wants the first.
        renewal = never_waits(lambda: get_engine().jobs_renew_if_owned(
            [r.claim for r in runs], LEASE_MS))
        assert renewal.kept == {last.lease_token}
        assert len(renewal.renewed) == 3
        with held("select id from x_jobs where id = %s for update", first.id):
            report = never_waits(lambda: get_engine().jobs_complete_if_owned(
                [Completion(claim=r.claim, result_json=None) for r in reversed(runs)]))
        assert report.busy == {first.lease_token, last.lease_token}
    finally:
        ack.rollback()
        ack.close()


def test_a_nack_requeue_suspend_and_progress_of_a_held_row_are_busy_not_lost(engine):
    runs = a_running(engine, 4)
    writes = {
        "fail": lambda r: get_engine().job_fail_if_owned(
            Failure(claim=r.claim, error="E", retry_delay_ms=0, permanent=False))[0],
        "requeue": lambda r: get_engine().job_requeue_if_owned(
            Requeue(claim=r.claim, delay_ms=0, spent_attempt=True, resumed=False)),
        "suspend": lambda r: get_engine().job_suspend_if_owned(
            Suspension(claim=r.claim, wake_at=engine.db_now() + timedelta(hours=1))),
    }
    for run, (what, write) in zip(runs, writes.items(), strict=False):
        with held("select id from x_jobs where id = %s for update", run.id):
            report = never_waits(lambda run=run, write=write: write(run))
            assert report.outcome(run.lease_token) is Fence.BUSY, what
        assert write(run).outcome(run.lease_token) is Fence.OWNED, what
    progressed = runs[3]
    with held("select id from x_jobs where id = %s for update", progressed.id):
        # A report of a held row is skipped, and the run is not told it lost its job.
        assert never_waits(lambda: get_engine().job_progress_if_owned(
            progressed.claim, done=1, total=2, message=None)) is True
    assert Job.objects.get(id=progressed.id).progress is None


# ------------------------------------------------------------------- families and burials --


def test_a_claim_leaves_a_lapsed_child_whose_parents_step_row_is_held_and_buries_it_later(
        engine):
    parent, kids = a_parent_waiting_on(engine, 2, max_attempts=1)
    for kid in claim(engine, "kids", 2, lease_ms=1):
        assert kid.attempt == 1
    wait_until(lambda: not Job.objects.filter(id__in=kids,
                                              visible_at__gt=engine.db_now()).exists())
    with held("select id from x_job_steps where run_id = %s for update", parent.run_id):
        # Two claims, each burying the children of one parent, would lock its step row in
        # child order: neither waits now, and the children stay lapsed.
        assert never_waits(lambda: get_engine().jobs_claim(
            wants={"kids": 10}, worker_id="w2", lease_ms=LEASE_MS)) == []
        assert set(Job.objects.filter(id__in=kids).values_list("state", flat=True)) == {
            "running"}
    assert engine.jobs_claim(wants={"kids": 10}, worker_id="w2", lease_ms=LEASE_MS) == []
    assert set(Job.objects.filter(id__in=kids).values_list("state", flat=True)) == {"dead"}
    assert step_row(parent).pending == 0
    assert Job.objects.get(id=parent.id).run_at <= engine.db_now()  # the last one woke it


def test_an_operators_cancel_of_a_family_held_open_turns_the_childs_ack_away_not_waiting(
        engine):
    from django_xjobs import api

    parent, _kids = a_parent_waiting_on(engine, 2)
    children = claim(engine, "kids", 2)
    acks = [Completion(claim=c.claim, result_json="1") for c in children]
    # Children first, then the parent, in a transaction the operator has not committed.
    with held_by_django(lambda: api.cancel(parent.id, reason="operator")):
        report = never_waits(lambda: get_engine().jobs_complete_if_owned(acks))
        assert report.busy == {c.lease_token for c in children}
    report = engine.jobs_complete_if_owned(acks)
    assert report.lost == {c.lease_token for c in children}  # cancelled meanwhile


def test_the_last_childs_ack_never_waits_for_its_parents_row_and_unblock_wakes_the_parent(
        engine):
    parent, _kids = a_parent_waiting_on(engine, 1)
    [child] = claim(engine, "kids", 1)
    park_at = Job.objects.get(id=parent.id).run_at
    with held("select id from x_jobs where id = %s for update", parent.id):
        report = never_waits(lambda: get_engine().jobs_complete_if_owned(
            [Completion(claim=child.claim, result_json="1")]))
        assert report.owned == {child.lease_token}
    # The child's trigger counted the step down but skipped the held parent...
    assert step_row(parent).pending == 0
    assert Job.objects.get(id=parent.id).run_at == park_at
    # ...which the safety net wakes at its next poll.
    assert engine.jobs_unblock(ClaimFlow(slot_ttl_ms=LEASE_MS)) == 1
    assert Job.objects.get(id=parent.id).run_at <= engine.db_now()


def test_a_parents_step_write_skips_its_step_row_held_by_an_operator(engine):
    from django_xjobs.exceptions import RowBusy

    parent, _kids = a_parent_waiting_on(engine, 1)
    assert claim(engine, "parents", 1) == []  # not due: its child is live
    Job.objects.filter(id=parent.id).update(run_at=engine.db_now())  # its timeout, say
    [resumed] = claim(engine, "parents", 1)
    owner = RunOwner(claim=resumed.claim, run_id=resumed.run_id)
    with held("select id from x_job_steps where run_id = %s for update", parent.run_id):
        with pytest.raises(RowBusy):
            never_waits(lambda: get_engine().step_invoke_open_if_owned(
                owner, "naps", children=[], timeout_ms=None))
    assert engine.step_invoke_open_if_owned(owner, "naps", children=[], timeout_ms=None)


# ------------------------------------------------------------------------------ the steps --


def test_a_step_write_of_a_held_row_is_busy_and_lands_once_the_row_is_free(engine):
    from django_xjobs.exceptions import RowBusy

    [run] = a_running(engine, 1)
    owner = RunOwner(claim=run.claim, run_id=run.run_id)
    with held("select id from x_jobs where id = %s for update", run.id):
        with pytest.raises(RowBusy):
            never_waits(lambda: get_engine().step_complete_if_owned(owner, "a", "1"))
    assert not JobStep.objects.filter(run_id=run.run_id).exists()
    assert engine.step_complete_if_owned(owner, "a", "1")
    # The fence is a lock now: a cancel waits for the step's commit and the step, once
    # written, belonged to a run that owned its job.
    assert JobStep.objects.get(run_id=run.run_id, name="a").output == 1


def test_a_step_write_holds_its_job_row_so_a_claim_cannot_take_it_before_the_commit(engine):
    [run] = a_running(engine, 1, lease_ms=1)
    owner = RunOwner(claim=run.claim, run_id=run.run_id)
    wait_until(lambda: Job.objects.filter(id=run.id, visible_at__lte=engine.db_now()).exists())
    from django.db import transaction

    with transaction.atomic():
        assert engine.step_complete_if_owned(owner, "a", "1")  # lapsed, but still its own
        # Until this commits, the row is locked FOR SHARE: a claim skips it.
        assert never_waits(lambda: get_engine().jobs_claim(
            wants={"locks": 5}, worker_id="thief", lease_ms=LEASE_MS)) == []
    [taken] = claim(engine, "locks", 5, worker="thief")
    assert taken.id == run.id


# ------------------------------------------------------------------------------ the slots --


def test_a_slot_renewal_and_release_skip_a_held_slot_row(engine):
    requests = [SlotRequest(slot_key=f"lk:{i}", limit=1, holder=f"h{i}") for i in range(3)]
    holds = sorted(engine.slots_acquire(requests, LEASE_MS), key=lambda h: h.slot_key)
    with held("select id from x_job_leases where lease_key = 'lk:1' for update"):
        renewal = never_waits(lambda: get_engine().slots_renew_if_held(holds, LEASE_MS))
        assert (renewal.renewed, renewal.kept) == ({"h0", "h2"}, {"h1"})
        released, busy = never_waits(lambda: get_engine().slots_release_if_held(holds))
        assert (released, [h.holder for h in busy]) == (2, ["h1"])
    assert engine.slots_release_if_held(busy) == (1, [])
    assert not JobLease.objects.exists()


def test_a_claim_never_waits_on_a_slot_a_users_transaction_is_acquiring(engine):
    from django_xjobs.worker.flow import claim_flow
    from tests.testapp import jobs

    def acquire() -> None:
        [hold] = JobLease.objects.acquire(
            SlotRequest(slot_key="slot:g", limit=2, holder="user"), ttl=60)
        assert hold.slot == 0

    jobs.slotted.using(queue="slotq").enqueue(group="g")
    flow = claim_flow(conf.get(), [jobs.slotted], ["slotq"])
    with held_by_django(acquire):
        [job] = never_waits(lambda: get_engine().jobs_claim(
            wants={"slotq": 1}, worker_id="w", lease_ms=LEASE_MS, flow=flow))
        assert job.slot == 1  # slot 0 is the user's, not committed: not waited for


# ------------------------------------------------------------------------- the rate budget --


def test_a_claim_never_waits_on_a_rate_key_a_users_transaction_is_spending(engine):
    from django_xjobs.worker.flow import claim_flow
    from tests.testapp import jobs

    def spend() -> None:
        assert RateLimit(key="partner", limit=50, period=timedelta(seconds=1)).try_acquire()

    jobs.fleet_rated.using(queue="rated").enqueue()
    flow = claim_flow(conf.get(), [jobs.fleet_rated], ["rated"])
    with held_by_django(spend):
        batch = never_waits(lambda: get_engine().jobs_claim(
            wants={"rated": 1}, worker_id="w", lease_ms=LEASE_MS, flow=flow))
        assert (len(batch), batch.held) == (0, 1)  # due again a moment later
        assert batch.retry_at is not None and batch.retry_at <= batch.now + timedelta(seconds=1)


# ----------------------------------------------------------- a worker's settle of a held row --


def a_locks_worker():
    """A worker of queue locks, built but not started: the tests drive its parts."""
    from django_xjobs.worker.loop import Worker
    from django_xjobs.worker.options import WorkerOptions

    return Worker(WorkerOptions.from_settings(queues=("locks",), concurrency=1, prefetch=0,
                                              install_signals=False))


def a_run(engine, worker, *, finished: bool = True):
    """A run of a job claimed in queue locks, in ``worker``'s table: running, or finished with
    Done and waiting for the worker's settle."""
    from django_xjobs import clock
    from django_xjobs.worker.executor import Done
    from django_xjobs.worker.runs import RUNNING, Run

    [job] = a_running(engine, n=1)
    run = Run(job, None, clock.monotonic(), budget=60.0, on_unproven=lambda r, why: None)
    worker.runs.add([run], queued=0)
    run.phase = RUNNING
    if finished:
        assert worker.runs.finish(run, Done(result_json=None), from_phase=RUNNING)
    return run


@pytest.mark.parametrize("held_for", [0.0, 0.05, 0.3])
def test_a_settle_of_a_held_row_is_written_again_within_milliseconds_and_told_only_if_long(
        engine, caplog, held_for):
    # The usual holder is a sibling worker's claim, for a millisecond or two: the first retry
    # is due 10 ms later at most, and nothing reaches INFO, nor for a hold shorter than
    # BUSY_NOTICE. A hold that lasts (a request's, an operator's) is logged once at INFO, and
    # its settle too. At INFO, as in production: DEBUG would take the settle's slow path.
    import logging

    from django_xjobs import clock
    from django_xjobs.context import BUSY_NOTICE

    worker = a_locks_worker()
    run = a_run(engine, worker)
    settler, now = worker.settler, [1000.0]
    with (clock.override(monotonic=lambda: now[0]),
          caplog.at_level(logging.INFO, logger="django_xjobs.worker")):
        with held("select id from x_jobs where id = %s for update", run.job.id):
            never_waits(lambda: settler.settle(settler.due(now[0])))
            assert worker.runs.busy == [run]
            assert 0 < run.retry_at - now[0] <= 0.01
            while now[0] < 1000.0 + held_for:
                assert settler.due(now[0]) == []
                now[0] = run.retry_at
                never_waits(lambda: settler.settle(settler.due(now[0])))
                assert worker.runs.busy == [run]
        now[0] = run.retry_at
        settler.settle(settler.due(now[0]))
    assert worker.runs.busy == [] and len(worker.runs) == 0
    assert Job.objects.get(id=run.job.id).state == "done"
    assert worker.stats["settles_set_aside"] == 1
    told = [r.getMessage() for r in caplog.records
            if r.levelno >= logging.INFO and "held" in r.getMessage()]
    if held_for >= BUSY_NOTICE:
        assert len(told) == 2 and "its row is held by another transaction" in told[0]
        assert "settled" in told[1]
    else:
        assert told == []


@pytest.mark.parametrize("finished", [False, True])
def test_a_lease_kept_beside_a_held_row_is_told_at_info_only_while_its_run_goes_on(
        engine, caplog, finished):
    # A run whose code has returned is most likely held by the worker's own settle of it, in
    # flight on the loop's connection while the heartbeat renews: a routine race, at DEBUG.
    # While the run goes on, the holder is someone else's transaction: a line at INFO.
    import logging

    from django_xjobs import clock
    from django_xjobs.records import Renewal

    worker = a_locks_worker()
    run = a_run(engine, worker, finished=finished)
    job = run.job
    with caplog.at_level(logging.DEBUG, logger="django_xjobs.worker"):
        worker.watchdog.on_renewed([run], Renewal(kept=frozenset({job.lease_token})),
                                   clock.monotonic())
    told = [r.levelno for r in caplog.records if "held" in r.getMessage()]
    assert told == [logging.DEBUG if finished else logging.INFO]
    assert worker.stats["leases_kept"] == 1 and run.held_since is not None
    assert run.held_told is not finished
    # Free again: the hold ends whatever the phase (a later one is timed on its own), and the
    # end is told where the start was.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="django_xjobs.worker"):
        worker.watchdog.on_renewed([run], Renewal(renewed=frozenset({job.lease_token})),
                                   clock.monotonic())
    assert (run.held_since, run.held_told) == (None, False)
    freed = [r for r in caplog.records if "its row is free again" in r.getMessage()]
    assert len(freed) == (0 if finished else 1)
