"""django_xjobs.testing (docs/testing.md): the inline test mode, drain() in it, travel(),
enqueued_jobs() and assert_enqueued(), on a real PostgreSQL.

Tests marked ``transactional`` commit, as a project's ``transactional_db`` tests do; the others
run inside one transaction each, as a ``TestCase`` (pytest-django's ``db``) does.
"""

from __future__ import annotations

import os
import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction

from django_xjobs import job, publish_event
from django_xjobs.exceptions import InvalidJobInput, UnknownJob
from django_xjobs.models import Job
from django_xjobs.testing import assert_enqueued, drain, enqueued_jobs, travel
from django_xjobs.testing.inline import WORKER_ID
from tests.testapp import jobs as testapp_jobs
from tests.testapp.models import Effect

transactional = pytest.mark.django_db(transaction=True)
in_a_transaction = pytest.mark.django_db


@pytest.fixture
def inline(settings):
    settings.XJOBS = {**settings.XJOBS, "TEST_MODE": "inline"}


def starts(handle) -> list[int]:
    return list(Effect.objects.filter(job_id=str(handle.id), kind="start")
                .order_by("id").values_list("attempt", flat=True))


# Jobs of these tests only (registered in this process: the inline mode and drain run here).


@job(name="testkit.where")
def where(ctx, tag=""):
    """Says which thread ran it and on which database backend."""
    with connection.cursor() as cursor:
        cursor.execute("select pg_backend_pid()")
        backend = cursor.fetchone()[0]
    return {"thread": threading.get_ident(), "backend": backend, "tag": tag}


@job(name="testkit.parent")
def parent(ctx, children=2):
    """Enqueues children, and records what state they are in when its own code ends."""
    handles = [testapp_jobs.record.enqueue(tag=f"child-{i}") for i in range(children)]
    Effect.objects.create(job_id=ctx.job_id, name=ctx.name, attempt=ctx.attempt,
                          pid=os.getpid(), kind="start", tag="parent")
    return {"children_at_end": [Job.objects.get(id=h.id).state for h in handles],
            "children": [str(h.id) for h in handles]}


@job(name="testkit.duplicate_effect", max_attempts=2)
def duplicate_effect(ctx):
    """Writes a row, then one the database refuses (a unique violation)."""
    Effect.objects.create(job_id=ctx.job_id, name=ctx.name, attempt=ctx.attempt, pid=0,
                          kind="start", tag="kept?")
    Job.objects.create(id=ctx.job_id, name="x", queue="x", idempotency_key="x")


# ------------------------------------------------------------------------- the inline mode --


@transactional
def test_inline_runs_the_job_at_enqueue_in_the_callers_thread_and_connection(inline):
    with connection.cursor() as cursor:
        cursor.execute("select pg_backend_pid()")
        mine = cursor.fetchone()[0]

    handle = where.enqueue(tag="now")

    row = handle.get()
    assert (row.state, row.attempt) == ("done", 1)
    assert row.result == {"thread": threading.get_ident(), "backend": mine, "tag": "now"}
    assert row.claimed_by == WORKER_ID and row.worker_ids == [WORKER_ID]
    assert row.lease_token is not None  # a real claim: the finished row keeps its token
    assert row.started_at is not None and row.finished_at is not None


@transactional
def test_without_the_setting_enqueue_runs_nothing():
    handle = testapp_jobs.record.enqueue(tag="queued")
    assert handle.get().state == "ready"
    assert starts(handle) == []


@transactional
def test_inline_runs_on_commit_of_the_enqueuing_transaction_and_never_after_a_rollback(inline):
    with transaction.atomic():
        handle = testapp_jobs.record.enqueue(tag="later")
        assert handle.get().state == "ready"
        assert starts(handle) == []
    assert handle.get().state == "done"
    assert starts(handle) == [1]

    with pytest.raises(RuntimeError, match="changed my mind"), transaction.atomic():
        gone = testapp_jobs.record.enqueue(tag="never")
        raise RuntimeError("changed my mind")
    assert not Job.objects.filter(id=gone.id).exists()
    assert not Effect.objects.filter(job_id=str(gone.id)).exists()


@transactional
def test_inline_runs_every_job_of_a_bulk_enqueue(inline):
    handles = testapp_jobs.record.bulk_enqueue([{"tag": str(i)} for i in range(3)])
    assert [h.get().state for h in handles] == ["done"] * 3


@transactional
def test_inline_runs_one_attempt_and_the_retry_waits_for_its_backoff(inline, settings):
    # A backoff no drain outlasts: with the suite's 0.2 s cap, a drain slowed down by a busy
    # machine saw attempt 3 come due while it ran, and ran it too.
    settings.XJOBS = {**settings.XJOBS, "RETRY_BASE": "10m", "RETRY_CAP": "10m"}
    handle = testapp_jobs.flaky.enqueue(fail_times=2)

    row = handle.get()
    assert (row.state, row.attempt) == ("delayed", 1)
    assert "RuntimeError: flaky failure on attempt 1" in row.last_error
    assert starts(handle) == [1]

    travel(timedelta(hours=1))
    assert drain()["delayed"] == 1  # attempt 2 fails too; its backoff starts again
    assert (handle.get().state, starts(handle)) == ("delayed", [1, 2])
    travel(timedelta(hours=1))
    stats = drain()
    row = handle.get()
    assert (row.state, row.result, stats["done"]) == ("done", {"succeeded_on": 3}, 1)
    assert starts(handle) == [1, 2, 3]


@transactional
def test_inline_failures_end_dead_as_with_a_worker(inline):
    permanent = testapp_jobs.permanent.enqueue()
    assert permanent.get().state == "dead"
    assert "no point retrying" in permanent.get().last_error

    exhausted = testapp_jobs.always_fails.enqueue()  # max_attempts=2
    assert exhausted.get().state == "delayed"
    travel(timedelta(hours=1))
    assert drain()["dead"] == 1
    row = exhausted.get()
    assert (row.state, row.attempt) == ("dead", 2)
    assert starts(exhausted) == [1, 2]


@transactional
def test_a_delayed_enqueue_runs_only_once_due(inline):
    handle = testapp_jobs.record.using(delay=timedelta(minutes=10)).enqueue(tag="later")
    assert handle.get().state == "delayed"
    assert drain()["done"] == 0
    travel(timedelta(minutes=10))
    assert drain()["done"] == 1
    assert handle.get().result == {"tag": "later", "attempt": 1}


@transactional
def test_jobs_a_job_enqueues_run_after_it_settles(inline):
    handle = parent.enqueue(children=2)

    row = handle.get()
    assert row.state == "done"
    # The children were enqueued (and committed: the parent autocommits, as in a worker) but
    # had not run when the parent's code ended; they ran after, in order.
    assert row.result["children_at_end"] == ["ready", "ready"]
    children = [Job.objects.get(id=i) for i in row.result["children"]]
    assert [c.state for c in children] == ["done", "done"]
    assert [c.result["tag"] for c in children] == ["child-0", "child-1"]
    assert min(c.started_at for c in children) >= row.finished_at


@transactional
def test_enqueue_on_commit_runs_the_job_when_the_transaction_commits(inline):
    with transaction.atomic():
        staged = testapp_jobs.record.enqueue_on_commit(tag="staged")
        assert staged.job_id() is None
    assert staged.job_id() == staged.id
    job_row = Job.objects.get(id=staged.id)
    assert (job_row.state, job_row.result) == ("done", {"tag": "staged", "attempt": 1})

    with pytest.raises(RuntimeError), transaction.atomic():
        rolled_back = testapp_jobs.record.enqueue_on_commit(tag="never")
        raise RuntimeError("rollback")
    assert rolled_back.status() is None
    assert not Job.objects.filter(id=rolled_back.id).exists()


@transactional
def test_inline_steps_memoise_across_retries(inline):
    handle = testapp_jobs.three_steps.enqueue(fail_third_times=1)
    assert handle.get().state == "delayed"
    travel(timedelta(hours=1))
    drain()
    row = handle.get()
    assert (row.state, row.result) == ("done", [{"n": 1}, {"n": 2}, {"n": 3}])
    steps = list(Effect.objects.filter(job_id=str(handle.id), kind="step")
                 .order_by("id").values_list("tag", "attempt"))
    assert steps == [("first", 1), ("second", 1), ("third", 1), ("third", 2)]


@transactional
def test_inline_durable_sleep_suspends_and_travel_wakes_it(inline):
    handle = testapp_jobs.sleeper.enqueue(seconds=3600, tag="nap")
    row = handle.get()
    assert (row.state, row.attempt) == ("suspended", 1)
    assert drain()["claimed"] == 0  # an hour to go

    travel(timedelta(hours=1))
    stats = drain()
    row = handle.get()
    assert (row.state, row.attempt, stats["done"]) == ("done", 1, 1)
    effects = list(Effect.objects.filter(job_id=str(handle.id)).values_list("kind", flat=True))
    assert sorted(effects) == ["after", "before"]  # "before" ran once, not on the resume


@transactional
def test_inline_event_wait_resumes_on_publish_then_drain(inline):
    handle = testapp_jobs.waiter.enqueue(event="order.paid", key="o-7", timeout=3600)
    assert handle.get().state == "suspended"
    publish_event("order.paid", {"amount": 5}, correlation_key="o-7")
    assert drain()["done"] == 1
    assert handle.get().result == {"payload": {"amount": 5}}


@transactional
def test_inline_event_wait_times_out_after_travel(inline):
    handle = testapp_jobs.waiter.enqueue(event="order.paid", key="o-8", timeout=3600)
    travel(timedelta(hours=1))
    drain()
    assert handle.get().result == {"payload": None}


@transactional
def test_inline_runs_async_jobs(inline):
    handle = testapp_jobs.async_record.enqueue(tag="a")
    assert (handle.get().state, handle.get().result) == ("done", {"tag": "a", "async": True})


@transactional
def test_inline_keeps_the_fence_a_job_cancelled_by_its_own_code_is_not_acknowledged(inline):
    @job(name="testkit.cancels_itself")
    def cancels_itself(ctx):
        from django_xjobs import cancel

        cancel(ctx.job_id, reason="from inside")
        return "finished anyway"

    handle = cancels_itself.enqueue()
    row = handle.get()
    assert row.state == "cancelled"
    assert row.result is None


# --------------------------------------------------------- inline inside a test's transaction --


@in_a_transaction
def test_inline_in_a_testcase_runs_when_the_on_commit_callbacks_run(
        inline, django_capture_on_commit_callbacks):
    handle = testapp_jobs.record.enqueue(tag="captured")
    assert handle.get().state == "ready"  # the test's transaction never commits

    with django_capture_on_commit_callbacks(execute=True):
        other = testapp_jobs.record.enqueue(tag="run")
    assert other.get().state == "done"
    assert other.get().claimed_by == WORKER_ID
    assert_enqueued(testapp_jobs.record, tag="run")


@in_a_transaction
def test_a_database_error_in_an_inline_job_leaves_the_tests_transaction_usable(
        inline, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        handle = duplicate_effect.enqueue()

    row = handle.get()  # the transaction still answers
    assert (row.state, row.attempt) == ("delayed", 1)
    assert "IntegrityError" in row.last_error or "UniqueViolation" in row.last_error
    # Django rolled the failed job back to its savepoint (the ORM marks the block), with the
    # write before the error: a worker's autocommit would have kept that one.
    assert not Effect.objects.filter(job_id=str(handle.id)).exists()


@in_a_transaction
def test_durable_steps_run_inline_inside_a_testcase(inline, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        handle = testapp_jobs.sleeper.enqueue(seconds=60, tag="t")
    assert handle.get().state == "suspended"
    travel(timedelta(minutes=1))
    assert drain()["done"] == 1
    assert handle.get().result == {"slept": 60}

    with django_capture_on_commit_callbacks(execute=True):
        waiting = testapp_jobs.waiter.enqueue(event="tc.paid", key="k", timeout=60)
    assert waiting.get().state == "suspended"
    publish_event("tc.paid", "yes", correlation_key="k")
    drain()
    assert waiting.get().result == {"payload": "yes"}


@in_a_transaction
def test_a_sleep_inside_the_jobs_own_atomic_block_is_still_refused_inline(
        inline, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        handle = testapp_jobs.sleep_in_atomic.enqueue()
    row = handle.get()
    assert row.state == "dead"
    assert "SuspendInTransaction" in row.last_error


@in_a_transaction
def test_drain_inline_runs_due_jobs_in_this_thread_inside_a_testcase(inline):
    handles = [testapp_jobs.record.enqueue(tag=str(i)) for i in range(3)]
    other = testapp_jobs.on_other_queue.enqueue()
    later = testapp_jobs.record.using(delay=timedelta(hours=1)).enqueue(tag="later")

    stats = drain()

    assert (stats["claimed"], stats["done"]) == (4, 4)
    assert {h.get().state for h in [*handles, other]} == {"done"}
    assert later.get().state == "delayed"
    assert drain(queues=["other"])["claimed"] == 0


# ---------------------------------------------------------------------------------- travel --


@transactional
def test_travel_makes_a_delay_and_a_backoff_due_for_a_worker_drain():
    delayed = testapp_jobs.record.using(delay=timedelta(hours=2)).enqueue(tag="d")
    failing = testapp_jobs.fails_with_long_backoff.enqueue()  # backoff up to 30 s
    assert drain()["delayed"] == 1
    assert failing.get().attempt == 1

    assert travel(timedelta(hours=1)) == 2
    assert drain()["done"] == 0
    assert starts(failing) == [1, 2]
    assert delayed.get().state == "delayed"

    travel(timedelta(hours=1, minutes=1))
    assert drain()["done"] == 1
    assert delayed.get().result == {"tag": "d", "attempt": 1}


@in_a_transaction
def test_travel_rejects_a_bad_delta_and_moves_nothing():
    handle = testapp_jobs.record.using(delay=60).enqueue()
    run_at = handle.get().run_at
    for bad in (timedelta(seconds=-1), -5, float("nan"), "1h", True, None):
        with pytest.raises(InvalidJobInput, match="travel delta"):
            travel(bad)
    assert handle.get().run_at == run_at
    assert travel(0) == 1 and handle.get().run_at == run_at
    assert travel(30.5) == 1
    assert handle.get().run_at == run_at - timedelta(seconds=30.5)


# ------------------------------------------------------------ enqueued_jobs / assert_enqueued --


@in_a_transaction
def test_enqueued_jobs_reads_the_tests_own_transaction_and_filters():
    a = testapp_jobs.record.enqueue(tag="a")
    b = testapp_jobs.record.using(queue="other", tenant_id="t1").enqueue(tag="b")
    c = testapp_jobs.noop.using(delay=60).enqueue()

    def ids(*args, **kwargs):
        return {r.id for r in enqueued_jobs(*args, **kwargs)}

    assert ids() == {a.id, b.id, c.id}
    assert ids(testapp_jobs.record) == {a.id, b.id}
    assert ids("testapp.record") == ids(testapp_jobs.record.using(delay=1)) == {a.id, b.id}
    assert ids(queue="other") == {b.id}
    assert ids(tenant_id="t1") == {b.id}
    assert ids(state="delayed") == {c.id}
    assert ids(state=["ready", "delayed"]) == {a.id, b.id, c.id}
    assert ids(testapp_jobs.noop, state="ready") == set()
    [record] = enqueued_jobs(testapp_jobs.record, queue="other")
    assert (record.input, record.tenant_id, record.state) == ({"tag": "b"}, "t1", "ready")


@in_a_transaction
def test_enqueued_jobs_rejects_bad_filters():
    with pytest.raises(InvalidJobInput, match="state must be one of"):
        enqueued_jobs(state="finished")
    with pytest.raises(InvalidJobInput, match="state must be one of"):
        enqueued_jobs(state=[])
    with pytest.raises(InvalidJobInput, match="queue"):
        enqueued_jobs(queue="no spaces")
    with pytest.raises(UnknownJob, match=r"testapp\.recrod"):
        enqueued_jobs("testapp.recrod")
    with pytest.raises(InvalidJobInput, match="registered job"):
        enqueued_jobs(42)


@in_a_transaction
def test_assert_enqueued_matches_at_least_the_given_input_in_any_state():
    handle = testapp_jobs.record.enqueue(tag="x", extra=[1, 2], flag=True)
    Job.objects.filter(id=handle.id).update(state="done")  # it ran

    assert assert_enqueued(testapp_jobs.record, tag="x").id == handle.id
    assert assert_enqueued("testapp.record", tag="x", extra=(1, 2), flag=True).id == handle.id
    assert assert_enqueued(testapp_jobs.record).id == handle.id
    with pytest.raises(AssertionError):
        assert_enqueued(testapp_jobs.record, flag=1)  # True is not 1 in JSON
    with pytest.raises(AssertionError):
        assert_enqueued(testapp_jobs.record, extra=[1])  # nested values compare whole


@in_a_transaction
def test_a_failing_assert_enqueued_lists_what_is_enqueued():
    testapp_jobs.record.enqueue(tag="a")
    testapp_jobs.record.using(delay=60).enqueue(tag="b")

    # Two jobs of one transaction may be listed in either order (same created_at).
    with pytest.raises(AssertionError) as info:
        assert_enqueued(testapp_jobs.record, tag="c")
    header, *rows = str(info.value).splitlines()
    assert header == ('assert_enqueued: no job testapp.record with input including '
                      '{"tag": "c"}; its jobs (2):')
    assert sorted(rows) == ['  delayed   {"tag": "b"}', '  ready     {"tag": "a"}']

    with pytest.raises(AssertionError) as info:
        assert_enqueued(testapp_jobs.noop)
    header, *rows = str(info.value).splitlines()
    assert header == "assert_enqueued: no job testapp.noop (any input); other jobs:"
    assert sorted(rows) == ['  testapp.record delayed   {"tag": "b"}',
                            '  testapp.record ready     {"tag": "a"}']


@in_a_transaction
def test_assert_enqueued_on_an_empty_table_and_with_bad_arguments():
    with pytest.raises(AssertionError, match="no job is enqueued at all"):
        assert_enqueued(testapp_jobs.noop)
    with pytest.raises(UnknownJob):
        assert_enqueued("testapp.nope")
    with pytest.raises(InvalidJobInput, match="not JSON-serialisable"):
        assert_enqueued(testapp_jobs.noop, when=object())
