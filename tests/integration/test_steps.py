"""Durable steps and events with the real worker loop (in-process threads) on PostgreSQL.

Crash and kill cases with worker subprocesses are in tests/acceptance/test_steps_faults.py.
"""

from __future__ import annotations

import random
import threading
import time
from contextlib import contextmanager
from datetime import timedelta
from io import StringIO

import pytest
from asgiref.sync import SyncToAsync
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.db.models.functions import Now

from django_xjobs import faults, publish_event
from django_xjobs.models import Job, JobEvent, JobStep
from django_xjobs.steps import purge_expired_events
from django_xjobs.worker.loop import Worker
from django_xjobs.worker.options import WorkerOptions
from tests.conftest import wait_until
from tests.testapp import jobs
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


@contextmanager
def running_worker(concurrency: int = 2, **options):
    """A real worker loop in a background thread (no signals), stopped on the way out;
    ``options`` are more WorkerOptions (``queues=...``)."""
    worker = Worker(WorkerOptions.from_settings(concurrency=concurrency, install_signals=False,
                                                **options))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop("test over")
        thread.join(timeout=30)
        faults.clear()


def job(handle) -> Job:
    return Job.objects.get(pk=handle.id)


def wait_state(handle, *states, timeout=30.0) -> Job:
    return wait_until(lambda: (row := job(handle)).state in states and row, timeout=timeout,
                      message=f"job {handle.id} to reach {states}")


def step(handle, name) -> JobStep:
    return JobStep.objects.get(run_id=job(handle).run_id, name=name)


def wait_waiting(handle, name="wait", suspended=True) -> None:
    """Until the job's wait step is registered (and the job suspended, if asked)."""
    def ready():
        row = job(handle)
        if not JobStep.objects.filter(run_id=row.run_id, name=name, status="waiting").exists():
            return False
        return row.state == "suspended" if suspended else True

    wait_until(ready, timeout=30, message=f"step {name!r} of job {handle.id} to wait")


def effects(handle, tag=None) -> int:
    rows = Effect.objects.filter(job_id=str(handle.id))
    return rows.filter(tag=tag).count() if tag is not None else rows.count()


# ------------------------------------------------------------------------------------ run --


def test_completed_steps_run_once_while_a_failing_third_step_retries_the_job():
    handle = jobs.three_steps.enqueue(fail_third_times=2)
    with running_worker():
        row = wait_state(handle, "done", "dead")
    assert row.state == "done" and row.attempt == 3
    assert row.result == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert effects(handle, "first") == 1
    assert effects(handle, "second") == 1
    assert effects(handle, "third") == 3
    third = step(handle, "third")
    assert third.status == "completed" and third.attempts == 3 and third.error is None
    assert step(handle, "first").attempts == 1


def test_a_failed_step_records_its_error_and_attempts():
    handle = jobs.three_steps.using(max_attempts=2).enqueue(fail_third_times=5)
    with running_worker():
        row = wait_state(handle, "dead")
    third = step(handle, "third")
    assert third.status == "failed" and third.attempts == 2
    assert "third step fails on attempt 2" in third.error
    assert "third step fails on attempt 2" in row.last_error


def test_a_reused_step_name_is_a_clear_error():
    handle = jobs.reused_step_name.enqueue()
    with running_worker():
        row = wait_state(handle, "dead")
    assert row.attempt == 1  # a programming error: not retried
    assert "StepNameReused" in row.last_error and "'same' is used twice" in row.last_error


def test_a_step_output_that_is_not_json_is_a_clear_error():
    handle = jobs.non_json_step.enqueue()
    with running_worker():
        row = wait_state(handle, "dead")
    assert "StepOutputError" in row.last_error and "object" in row.last_error


def test_a_cancelled_run_stops_at_the_next_step_boundary():
    handle = jobs.step_loop.enqueue(steps=200, pause=0.02)
    with running_worker():
        wait_until(lambda: JobStep.objects.filter(run_id=job(handle).run_id).count() >= 3,
                   message="a few steps")
        from django_xjobs import api

        api.cancel(handle.id, reason="enough")
        wait_until(lambda: not Job.objects.filter(pk=handle.id, state="running").exists(),
                   message="the run to stop")
        recorded = JobStep.objects.filter(run_id=job(handle).run_id).count()
    # The worker has exited: its run wrote at most the step it was in when the cancel landed.
    assert JobStep.objects.filter(run_id=job(handle).run_id).count() <= recorded + 1
    assert job(handle).state == "cancelled"
    assert recorded < 200


# ---------------------------------------------------------------------------------- sleep --


def test_a_sleep_suspends_the_job_and_frees_the_thread_for_another_job():
    sleeping = jobs.sleeper.enqueue(seconds=1.0, tag="s")
    with running_worker(concurrency=1):
        wait_state(sleeping, "suspended")
        other = jobs.record.enqueue(tag="meanwhile")
        done = wait_state(other, "done")
        wake_at = step(sleeping, "nap").wake_at
        assert done.finished_at < wake_at  # ran on the only thread while the sleeper slept
        row = wait_state(sleeping, "done")
    assert row.attempt == 1  # waking from a sleep spends no attempt
    assert row.finished_at >= wake_at
    assert effects(sleeping, "s") == 2  # "before" and "after", once each


def test_a_job_that_sleeps_fifty_times_does_not_run_out_of_attempts():
    handle = jobs.many_naps.enqueue(naps=50)  # max_attempts=1
    # Each 1 ms nap's wake-up is found by the next poll: a short one keeps the test short.
    with running_worker(poll_interval=0.02):
        row = wait_state(handle, "done", "dead", timeout=60)
    assert row.state == "done" and row.attempt == 1
    assert row.result == {"naps": 50, "attempt": 1}


# --------------------------------------------------------------------------------- events --


def test_an_event_published_while_the_waiter_is_suspended_resumes_it_at_once():
    handle = jobs.waiter.enqueue(event="order.paid", key="o-1", timeout=600)
    with running_worker():
        wait_waiting(handle)
        published = publish_event("order.paid", {"amount": 42}, correlation_key="o-1")
        row = wait_state(handle, "done", timeout=20)  # long before the 600 s timeout
    assert row.result == {"payload": {"amount": 42}}
    wait = step(handle, "wait")
    assert wait.event_id == published.id and wait.status == "completed"


def advisory_lock_awaited() -> bool:
    """Whether a session waits for an advisory lock (the event lock), as pg_locks says."""
    with connections["default"].cursor() as cur:
        cur.execute("select count(*) from pg_locks where locktype = 'advisory' and not granted")
        return cur.fetchone()[0] > 0


def test_an_event_published_between_the_check_and_the_suspend_is_not_missed():
    """The race: the waiter looked and found nothing; before it suspends, the event comes.

    The hook runs in the waiter's transaction, after its check: it starts a publisher in
    another thread and returns once that publisher is blocked on the event lock. The waiter
    then suspends and commits; the publisher goes on and must wake it."""
    publisher_done = threading.Event()

    def publish_now(point):
        def publish():
            try:
                publish_event("order.paid", {"race": True}, correlation_key="r-1")
            finally:
                connections.close_all()
                publisher_done.set()

        threading.Thread(target=publish, daemon=True).start()
        wait_until(advisory_lock_awaited, timeout=10,
                   message="the publisher to wait for the lock")

    handle = jobs.waiter.enqueue(event="order.paid", key="r-1", timeout=600)
    faults.inject_hook("step:after-event-check", publish_now)
    with running_worker():
        row = wait_state(handle, "done", timeout=20)
    assert publisher_done.is_set()
    assert row.result == {"payload": {"race": True}}


def test_a_waiter_that_checks_while_a_publisher_holds_the_lock_sees_its_event():
    """The other order: the publisher is inside its transaction (holding the event lock) when
    the waiter checks again. The waiter blocks on the lock and, once the publisher commits,
    finds the event (published after its wait started)."""
    release = threading.Event()
    published = threading.Event()

    def publish_in_a_long_transaction():
        try:
            with transaction.atomic():
                publish_event("order.paid", {"held": True}, correlation_key="p-1")
                published.set()
                release.wait(10)
        finally:
            connections.close_all()

    handle = jobs.waiter.enqueue(event="order.paid", key="p-1", timeout=600)
    with running_worker():
        wait_waiting(handle)  # the wait started and the job is suspended
        # The job is made due again as a retry or a rescue would (its wait row stays): it is
        # not `suspended`, so the publisher's wake-up will not touch (and lock) its row.
        from django.db.models.functions import Now

        Job.objects.filter(pk=handle.id).update(state="ready", run_at=Now())
        publisher = threading.Thread(target=publish_in_a_long_transaction, daemon=True)
        publisher.start()
        assert published.wait(10)
        wait_until(lambda: Job.objects.filter(pk=handle.id, state="running").exists(),
                   message="the waiter to check again")
        wait_until(advisory_lock_awaited, message="the waiter to block on the event lock")
        assert job(handle).state == "running"
        release.set()
        publisher.join(10)
        row = wait_state(handle, "done", timeout=20)
    assert row.result == {"payload": {"held": True}}


def test_an_event_published_before_the_wait_started_is_not_taken():
    publish_event("order.paid", {"old": True}, correlation_key="o-2")
    handle = jobs.waiter.enqueue(event="order.paid", key="o-2", timeout=0.5)
    with running_worker():
        row = wait_state(handle, "done")
    assert row.result == {"payload": None}


def test_a_wait_returns_none_after_its_timeout():
    handle = jobs.waiter.enqueue(event="never.published", timeout=0.5)
    with running_worker():
        row = wait_state(handle, "done")
    assert row.result == {"payload": None}
    wait = step(handle, "wait")
    assert wait.status == "completed" and wait.event_id is None


def test_two_events_with_one_key_are_consumed_by_two_waits_in_publication_order():
    handle = jobs.two_waits.enqueue(event="order.paid", key="o-3", timeout=600)
    with running_worker():
        wait_waiting(handle, "first")
        publish_event("order.paid", {"n": 1}, correlation_key="o-3")
        publish_event("order.paid", {"n": 2}, correlation_key="o-3")
        row = wait_state(handle, "done", timeout=20)
    assert row.result == [{"n": 1}, {"n": 2}]


def test_correlation_keys_isolate_tenants():
    acme = jobs.waiter.enqueue(event="invoice.paid", key="acme", timeout=600)
    globex = jobs.waiter.enqueue(event="invoice.paid", key="globex", timeout=600)
    with running_worker():
        wait_waiting(acme)
        wait_waiting(globex)
        publish_event("invoice.paid", {"tenant": "acme"}, correlation_key="acme")
        assert wait_state(acme, "done").result == {"payload": {"tenant": "acme"}}
        # publish_event wakes its waiters in its own transaction: a wrong wake shows already.
        assert job(globex).state == "suspended"
        publish_event("invoice.paid", {"tenant": "globex"}, correlation_key="globex")
        assert wait_state(globex, "done").result == {"payload": {"tenant": "globex"}}


def test_wait_for_any_returns_the_first_event_and_closes_the_other_waits():
    handle = jobs.any_waiter.enqueue(events=["payment.failed", "payment.ok"], key="k",
                                     timeout=600)
    with running_worker():
        wait_waiting(handle, "race")
        publish_event("payment.ok", {"ok": True}, correlation_key="k")
        row = wait_state(handle, "done", timeout=20)
    assert row.result == {"event": "payment.ok", "payload": {"ok": True}}
    run_steps = {s.name: s.status for s in JobStep.objects.filter(run_id=row.run_id)}
    assert run_steps == {"race": "completed", "race#payment.failed": "cancelled",
                         "race#payment.ok": "cancelled"}
    # The losing event, published later, finds no waiter to wake.
    publish_event("payment.failed", {}, correlation_key="k")
    assert job(handle).state == "done"


def test_async_jobs_have_the_same_steps():
    handle = jobs.async_steps.enqueue(event="async.go", key="a-1")
    with running_worker():
        wait_waiting(handle, "go")
        publish_event("async.go", {"go": 1}, correlation_key="a-1")
        row = wait_state(handle, "done", "dead", timeout=20)
    assert row.state == "done", row.last_error
    assert row.result == {"fetched": {"fetched": True}, "got": {"go": 1}}


def test_the_steps_of_async_jobs_get_over_a_connection_the_server_dropped():
    """Async steps do their database work in the event loop's pool threads, which live as long
    as the worker: they must look after their Django connections as executor threads do, or one
    dropped connection fails every later async step on that thread."""
    try:
        with running_worker(concurrency=1):
            first = jobs.async_one_step.enqueue(n=1)
            assert wait_state(first, "done", "dead").state == "done"
            with connection.cursor() as cursor:  # every other session: the pool threads' too
                cursor.execute(
                    "select count(pg_terminate_backend(pid)) from pg_stat_activity"
                    " where datname = current_database() and pid <> pg_backend_pid()")
            later = [jobs.async_one_step.enqueue(n=n) for n in (2, 3)]
            rows = [wait_state(handle, "done", "dead", timeout=30) for handle in later]
    finally:
        # The sessions ended include this process's other threads' own: asgiref's thread for
        # sync_to_async(thread_sensitive=True) keeps its connection from one test to the
        # next, and a later test's await (a docs page's aenqueue) would meet it dead.
        SyncToAsync.single_thread_executor.submit(connections.close_all).result()

    assert [row.state for row in rows] == ["done", "done"], [row.last_error for row in rows]
    assert [row.result for row in rows] == [{"v": 2}, {"v": 3}]


@pytest.mark.parametrize("job_fn, what", [(jobs.sleep_in_atomic, "sleep('nap')"),
                                          (jobs.wait_in_atomic, "wait_for_event('wait')")])
def test_a_suspension_inside_the_jobs_own_atomic_block_is_refused_clearly(job_fn, what):
    """It would be rolled back with the block it unwinds, leaving the job running until its
    lease lapsed, on every attempt."""
    handle = job_fn.enqueue()
    with running_worker():
        row = wait_state(handle, "dead", "suspended", timeout=20)

    assert row.state == "dead" and row.attempt == 1
    assert f"ctx.step.{what} was called inside transaction.atomic()" in row.last_error
    assert not JobStep.objects.filter(run_id=row.run_id, status__in=["sleeping", "waiting"])


def test_every_one_of_many_waiters_resumes_exactly_once_under_randomised_publishing():
    rng = random.Random(20261202)
    n = 200
    handles = [jobs.waiter.enqueue(event="stress", key=f"k{i}", timeout=600) for i in range(n)]

    def publisher(chunk):
        try:
            for i in chunk:
                handle = handles[i]
                # Publish only once the wait has started (an earlier event is not the wait's),
                # at a random moment around its check-then-suspend.
                wait_until(
                    lambda h=handle: JobStep.objects.filter(run_id=job(h).run_id, name="wait")
                    .exists(), timeout=120, message="the wait to start")
                time.sleep(rng.random() * 0.005)  # a random moment around the wait's start
                publish_event("stress", {"i": i}, correlation_key=f"k{i}")
        finally:
            connections.close_all()

    order = list(range(n))
    rng.shuffle(order)
    with running_worker(concurrency=8):
        threads = [threading.Thread(target=publisher, args=(order[j::4],), daemon=True)
                   for j in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        wait_until(lambda: Job.objects.filter(pk__in=[h.id for h in handles], state="done")
                   .count() == n, timeout=120, message="every waiter to finish")
    for i, handle in enumerate(handles):
        assert job(handle).result == {"payload": {"i": i}}
    resumed = Effect.objects.filter(kind="resumed", job_id__in=[str(h.id) for h in handles])
    assert resumed.count() == n  # the code after each wait ran exactly once


# ------------------------------------------------------------------------- housekeeping --


def test_expired_events_are_purged_and_live_ones_kept():
    publish_event("short.lived", {}, ttl=0.05)
    kept = publish_event("long.lived", {}, ttl=timedelta(days=1))
    wait_until(lambda: JobEvent.objects.filter(name="short.lived", expires_at__lt=Now()).exists(),
               message="the short-lived event to expire")
    assert purge_expired_events() == 1
    assert list(JobEvent.objects.values_list("id", flat=True)) == [kept.id]


def test_a_rolled_back_publish_never_happened():
    with transaction.atomic():
        publish_event("rolled.back", {})
        transaction.set_rollback(True)
    assert not JobEvent.objects.filter(name="rolled.back").exists()


def test_xjobs_show_lists_the_steps_of_a_job():
    handle = jobs.three_steps.enqueue(fail_third_times=0)
    with running_worker():
        wait_state(handle, "done")
    out = StringIO()
    call_command("xjobs", "show", str(handle.id), stdout=out)
    text = out.getvalue()
    assert "steps (3):" in text
    for name in ("first", "second", "third"):
        assert name in text
    assert "completed" in text
    out = StringIO()
    call_command("xjobs", "show", str(handle.id), "--json", stdout=out)
    assert '"steps"' in out.getvalue()


def test_xjobs_events_lists_recent_events():
    publish_event("listed.event", {"a": 1}, correlation_key="c")
    out = StringIO()
    call_command("xjobs", "events", "--name", "listed.event", stdout=out)
    assert "listed.event" in out.getvalue() and "key=c" in out.getvalue()


def test_publish_event_refuses_bad_input_and_writes_nothing():
    from django_xjobs.exceptions import InvalidJobInput

    for bad in (lambda: publish_event("bad name", {}),
                lambda: publish_event("ok", {"x": object()}),
                lambda: publish_event("ok", {}, ttl=-1),
                lambda: publish_event("ok", {}, correlation_key="")):
        with pytest.raises(InvalidJobInput):
            bad()
    assert not JobEvent.objects.exists()
    with connection.cursor() as cur:
        cur.execute("select 1")
