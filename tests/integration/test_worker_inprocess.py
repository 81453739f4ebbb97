"""The real worker loop, in this process (``django_xjobs.testing.drain``), on the test jobs.

Jobs run in executor threads with their own connections, so these tests are transactional.
Retries are delayed (tests/settings.py: RETRY_BASE 0.05 s, RETRY_CAP 0.2 s), so a test that
waits for a retry drains repeatedly until the job is finished; no test asserts on durations.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import Counter
from datetime import timedelta
from uuid import uuid4

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser
from django.http import HttpResponse
from django.test import RequestFactory

from django_xjobs import api
from django_xjobs.api import acting_as
from django_xjobs.middleware import EnqueuedByMiddleware
from django_xjobs.models import Job
from django_xjobs.testing import drain
from tests.conftest import wait_until
from tests.testapp import jobs as testapp_jobs
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
FINISHED = ("done", "dead", "cancelled")


def drain_until(handle, states=FINISHED, timeout: float = 30.0):
    """Drain until the job reaches one of ``states``; return its row and the summed stats."""
    totals: Counter[str] = Counter()
    deadline = time.monotonic() + timeout
    while True:
        totals.update(drain())
        row = handle.get()
        if row.state in states:
            return row, totals
        if time.monotonic() >= deadline:
            pytest.fail(f"job {handle.id} still {row.state} after {timeout}s; stats {totals}")
        time.sleep(0.05)  # the poll interval: a retry may be due a moment later


def retries(stats: Counter[str]) -> int:
    """Failed runs that went back to the queue (the stats count the state each run left)."""
    return stats["delayed"] + stats["ready"]


def starts(job_id) -> list[int]:
    """The attempt number of every run of the job that got as far as its first line."""
    return list(Effect.objects.filter(job_id=str(job_id), kind="start")
                .order_by("id").values_list("attempt", flat=True))


# ----------------------------------------------------------------------------- outcomes --


def test_a_job_that_returns_is_done_with_its_result_stored():
    handle = testapp_jobs.record.enqueue(tag="hello")
    stats = drain()
    row = handle.get()
    assert stats["done"] == 1
    assert row.state == "done"
    assert row.result == {"tag": "hello", "attempt": 1}
    assert row.attempt == 1
    assert row.finished_at is not None and row.visible_at is None
    assert row.claimed_by and row.claimed_by in row.worker_ids
    assert starts(handle.id) == [1]


def test_a_job_returning_none_is_done_without_a_result():
    handle = testapp_jobs.noop.enqueue()
    drain()
    row = handle.get()
    assert (row.state, row.result) == ("done", None)


def test_drain_runs_every_due_job_and_leaves_delayed_ones():
    handles = [testapp_jobs.record.enqueue(tag=str(i)) for i in range(7)]
    later = testapp_jobs.record.using(delay=timedelta(hours=1)).enqueue(tag="later")
    stats = drain(concurrency=3)
    assert stats["done"] == 7
    assert {h.get().state for h in handles} == {"done"}
    assert later.get().state == "delayed"
    assert starts(later.id) == []


def test_drain_with_its_defaults_runs_every_queue_of_many():
    """Two free slots and five queues: the split rotates over the queues, and a burst ends only
    once every queue was asked and had nothing."""
    queues = [f"many-{i}" for i in range(5)]
    handles = [testapp_jobs.record.using(queue=q).enqueue(tag=q) for q in queues for _ in "ab"]
    stats = drain(queues=queues)
    assert stats["done"] == len(handles)
    assert {h.get().state for h in handles} == {"done"}


@pytest.mark.parametrize("queue", ["q-0", "q-1", "q-2"])
def test_a_burst_runs_what_a_run_enqueued_in_a_queue_its_sweep_had_already_asked(queue):
    """A burst may end only on a sweep that began after its last run finished. Here the run
    finishes just after a claim that asked some queue and found it empty, and it had enqueued a
    job there: a sweep counted from before that finish would end the burst with the job due
    (each queue in turn, so one of them is the queue the sweep had already asked; a CI run saw
    it with a parent its children woke)."""
    from django_xjobs import faults
    from django_xjobs.worker.loop import Worker
    from django_xjobs.worker.options import WorkerOptions

    queues = ("q-0", "q-1", "q-2")
    worker = Worker(WorkerOptions.from_settings(
        queues=queues, concurrency=2, prefetch=0, burst=True, install_signals=False,
        notify=False, duties=()))
    running, finish = threading.Event(), threading.Event()
    later: list = []

    def hold_the_run(point: str) -> None:  # the executor thread, before the job's code
        running.set()
        finish.wait(10)

    def enqueue_and_finish(point: str) -> None:  # the loop thread, after a claim
        if not running.is_set() or later:
            return
        later.append(testapp_jobs.record.using(queue=queue).enqueue(tag="later"))
        finish.set()
        # Until the run's outcome waits to be settled: the loop settles it next.
        wait_until(lambda: worker.runs.finished, timeout=10, message="the run's outcome")

    first = testapp_jobs.record.using(queue="q-0").enqueue(tag="first")
    faults.inject_hook("worker:job-start", hold_the_run, times=1)
    faults.inject_hook("after:jobs_claim", enqueue_and_finish, times=None)
    try:
        worker.run()
    finally:
        faults.clear()

    assert first.get().state == "done"
    [handle] = later
    assert handle.get().state == "done", "the burst ended with a job due"
    assert worker.stats["done"] == 2


def test_a_flaky_job_is_retried_then_done():
    handle = testapp_jobs.flaky.enqueue(fail_times=2)
    row, totals = drain_until(handle)
    assert row.state == "done"
    assert row.result == {"succeeded_on": 3}
    assert row.attempt == 3
    assert starts(handle.id) == [1, 2, 3]
    assert retries(totals) == 2
    assert totals["done"] == 1


def test_a_failed_attempt_is_retried_after_a_backoff_within_the_jobs_window():
    handle = testapp_jobs.fails_with_long_backoff.enqueue()

    stats = drain()
    row = handle.get()
    assert stats["delayed"] == 1
    assert (row.state, row.attempt) == ("delayed", 1)
    assert "RuntimeError: failure on attempt 1" in row.last_error
    # run_at and updated_at come from one now(): their gap is the backoff, uniform(0, 30 s).
    # (Not "run_at is still ahead": a backoff drawn under the few ms the drain took to end is
    # due already, as a CI run found.)
    assert timedelta(0) < row.run_at - row.updated_at <= timedelta(seconds=30)
    assert starts(handle.id) == [1]

    api.run_now(handle.id)
    drain()
    row = handle.get()
    assert (row.state, row.attempt) == ("delayed", 2)
    assert "failure on attempt 2" in row.last_error
    assert timedelta(0) < row.run_at - row.updated_at <= timedelta(seconds=60)

    api.run_now(handle.id)
    stats = drain()
    row = handle.get()
    assert stats["dead"] == 1
    assert (row.state, row.attempt) == ("dead", 3)
    assert "failure on attempt 3" in row.last_error
    assert row.finished_at is not None
    assert starts(handle.id) == [1, 2, 3]


def test_a_job_that_always_fails_is_dead_after_max_attempts_with_its_last_error():
    handle = testapp_jobs.always_fails.enqueue()
    row, totals = drain_until(handle)
    assert row.state == "dead"
    assert (row.attempt, row.max_attempts) == (2, 2)
    assert "ValueError: this job always fails" in row.last_error
    assert "Traceback" in row.last_error
    assert starts(handle.id) == [1, 2]
    assert (retries(totals), totals["dead"]) == (1, 1)


def test_a_failed_attempt_is_logged_with_its_traceback(caplog):
    handle = testapp_jobs.always_fails.enqueue()
    with caplog.at_level("WARNING", logger="django_xjobs.worker"):
        drain_until(handle)
    failures = {r.levelname: r.getMessage() for r in caplog.records
                if f"job {handle.id} " in r.getMessage() and " failed -> " in r.getMessage()}
    assert set(failures) == {"WARNING", "ERROR"}  # the retry, then the death
    for message in failures.values():
        assert "Traceback (most recent call last)" in message
        assert 'raise ValueError("this job always fails")' in message
        assert message.rstrip().endswith("ValueError: this job always fails")


def test_a_permanent_error_is_dead_at_the_first_attempt():
    handle = testapp_jobs.permanent.enqueue()
    drain()
    row = handle.get()
    assert row.state == "dead"
    assert (row.attempt, row.max_attempts) == (1, 3)
    assert "PermanentError: no point retrying" in row.last_error
    assert starts(handle.id) == [1]


def test_a_snooze_requeues_without_spending_an_attempt():
    handle = testapp_jobs.snoozer.enqueue(times=2)
    row, totals = drain_until(handle)
    assert row.state == "done"
    assert row.result == {"attempt": 1}
    assert row.attempt == 1
    assert starts(handle.id) == [1, 1, 1]
    assert totals["requeued"] == 2
    assert len(row.worker_ids) == 1  # the snoozed runs gave their entries back too


def test_an_async_job_is_done():
    handle = testapp_jobs.async_record.enqueue(tag="aio")
    stats = drain()
    row = handle.get()
    assert stats["done"] == 1
    assert (row.state, row.result) == ("done", {"tag": "aio", "async": True})


def test_sync_and_async_jobs_run_side_by_side():
    sync = [testapp_jobs.record.enqueue(tag=str(i)) for i in range(3)]
    aio = [testapp_jobs.async_record.enqueue(tag=str(i)) for i in range(3)]
    drain()
    assert [h.get().state for h in sync + aio] == ["done"] * 6


def test_an_async_job_past_its_timeout_fails_with_a_timeout_error():
    handle = testapp_jobs.async_too_slow.enqueue()
    row, _ = drain_until(handle)
    assert row.state == "dead"  # max_attempts=1
    assert row.attempt == 1
    assert "TimeoutError" in row.last_error
    assert "testapp.async_too_slow" in row.last_error
    assert row.result is None


def test_a_sync_job_past_its_timeout_is_stopped_and_fails_with_a_timeout_error():
    handle = testapp_jobs.too_slow.enqueue()
    row, totals = drain_until(handle)
    assert row.state == "dead"  # max_attempts=2: both attempts timed out
    assert row.attempt == 2
    assert "TimeoutError" in row.last_error
    assert "testapp.too_slow" in row.last_error
    assert totals["timeouts"] == 2
    assert starts(handle.id) == [1, 2]


def test_a_result_json_cannot_encode_kills_the_job_with_a_clear_error():
    handle = testapp_jobs.bad_result.enqueue()
    drain()
    row = handle.get()
    assert row.state == "dead"
    assert row.attempt == 1  # re-running cannot fix it
    assert "result of testapp.bad_result" in row.last_error
    assert "not JSON-serialisable" in row.last_error
    assert "['when']" in row.last_error
    assert row.result is None


@pytest.mark.parametrize("job", [testapp_jobs.unprintable_result,
                                 testapp_jobs.async_unprintable_result])
def test_a_result_whose_own_code_raises_while_encoded_still_ends_the_run(job):
    """An exception while the outcome is worked out must not kill the executor thread (or the
    async task) and leave the job running under a lease the heartbeat keeps renewing."""
    handle = job.using(priority=1).enqueue()
    after = testapp_jobs.record.enqueue(tag="after")  # the same single thread runs it next
    result: list[Counter[str]] = []
    draining = threading.Thread(target=lambda: result.append(drain(concurrency=1)), daemon=True)
    draining.start()
    draining.join(timeout=30)
    assert result, f"the run never ended: job {handle.get().state}"
    stats = result[0]
    row = handle.get()

    assert row.state == "dead" and row.attempt == 1, (row.state, row.last_error)
    assert "Unprintable whose repr() raised RuntimeError" in row.last_error
    assert (stats["dead"], stats["done"]) == (1, 1)
    assert after.get().state == "done"


def test_a_row_naming_an_unknown_job_waits_without_spending_an_attempt_and_the_worker_carries_on():
    unknown = Job.objects.create(name="gone.in_the_deploy", idempotency_key=str(uuid4()),
                                 max_attempts=1, input={"a": 1})
    neighbour = testapp_jobs.record.enqueue(tag="neighbour")

    stats = drain()
    assert neighbour.get().state == "done"  # the unknown name did not stop the worker
    first = Job.objects.get(id=unknown.id)
    assert stats["unknown_job"] == 1 and stats["dead"] == 0
    assert (first.state, first.attempt) == ("delayed", 0)  # max_attempts=1, and not dead
    assert "UnknownJob: no job named 'gone.in_the_deploy'" in first.last_error
    assert "jobs.py of app 'gone'" in first.last_error
    assert first.attempts[-1]["outcome"] == "unknown_job"
    assert first.attempts[-1]["tries"] == 1
    assert first.unknown_since is not None
    # The first wait is a second, times a random half to one (so that the worker that gave it
    # back does not always claim it first): the waits then double (the time waited so far).
    assert timedelta(seconds=0.5) <= first.run_at - first.unknown_since < timedelta(seconds=1.5)

    Job.objects.filter(id=unknown.id).update(run_at=first.unknown_since)  # due again now
    drain()
    again = Job.objects.get(id=unknown.id)
    assert (again.state, again.attempt, again.unknown_since) == ("delayed", 0,
                                                                 first.unknown_since)
    assert len(again.attempts) == 1  # one entry for the whole wait
    assert again.attempts[-1]["tries"] == 2
    assert again.attempts[-1]["workers"] == [first.attempts[-1]["worker"],
                                             again.attempts[-1]["worker"]]  # two drains


# -------------------------------------------------------------------------- enqueued_by --


def test_enqueued_by_defaults_to_host_and_pid():
    handle = testapp_jobs.record.enqueue()
    assert handle.get().enqueued_by == f"{socket.gethostname()}:{os.getpid()}"


def test_acting_as_names_who_enqueued_and_ends_with_its_block():
    with acting_as("cron:nightly-report"):
        inside = testapp_jobs.record.enqueue()
        with acting_as("admin:ada"):
            nested = testapp_jobs.record.enqueue()
        after_nested = testapp_jobs.record.enqueue()
    outside = testapp_jobs.record.enqueue()
    assert inside.get().enqueued_by == "cron:nightly-report"
    assert nested.get().enqueued_by == "admin:ada"
    assert after_nested.get().enqueued_by == "cron:nightly-report"
    assert outside.get().enqueued_by == f"{socket.gethostname()}:{os.getpid()}"


def test_an_explicit_enqueued_by_wins():
    with acting_as("cron:nightly-report"):
        handle = testapp_jobs.record.using(enqueued_by="script:backfill-42").enqueue()
    assert handle.get().enqueued_by == "script:backfill-42"


def _view_that_enqueues(handles):
    def view(request):
        handles.append(testapp_jobs.record.enqueue(tag="from a request"))
        return HttpResponse("ok")

    return view


def test_the_middleware_records_the_requests_user():
    user = get_user_model().objects.create_user("ada", password="x")
    request = RequestFactory().post("/signup/")
    request.user = user
    handles: list = []
    response = EnqueuedByMiddleware(_view_that_enqueues(handles))(request)
    assert response.status_code == 200
    assert handles[0].get().enqueued_by == "user:ada"
    # Only for the request: a job enqueued afterwards is the process's again.
    assert testapp_jobs.record.enqueue().get().enqueued_by == (
        f"{socket.gethostname()}:{os.getpid()}"
    )


@pytest.mark.parametrize("user", [AnonymousUser(), None], ids=["anonymous", "no user"])
def test_the_middleware_leaves_anonymous_requests_to_the_default(user):
    request = RequestFactory().get("/")
    if user is not None:
        request.user = user
    handles: list = []
    EnqueuedByMiddleware(_view_that_enqueues(handles))(request)
    assert handles[0].get().enqueued_by == f"{socket.gethostname()}:{os.getpid()}"


def test_the_middleware_resets_the_user_when_the_view_raises():
    request = RequestFactory().get("/")
    request.user = get_user_model().objects.create_user("bob", password="x")

    def view(request):
        testapp_jobs.record.enqueue(tag="before the crash")
        raise RuntimeError("view failed")

    with pytest.raises(RuntimeError):
        EnqueuedByMiddleware(view)(request)
    assert Job.objects.get(input__tag="before the crash").enqueued_by == "user:bob"
    assert testapp_jobs.record.enqueue().get().enqueued_by != "user:bob"


# -------------------------------------------------------------------------------- traces --


@pytest.fixture(scope="module")
def span_exporter():
    """An OpenTelemetry SDK provider whose finished spans are kept in memory."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # the global provider can be set only once
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    assert isinstance(trace.get_tracer_provider(), TracerProvider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.clear()
    exporter.shutdown()  # later spans are no longer kept


def traceparent_of(span_context) -> str:
    return (f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-"
            f"{int(span_context.trace_flags):02x}")


def test_an_explicit_traceparent_is_stored_and_seen_by_the_job():
    handle = testapp_jobs.trace_probe.using(traceparent=TRACEPARENT).enqueue()
    assert handle.get().traceparent == TRACEPARENT
    drain()
    row = handle.get()
    assert row.state == "done"
    assert row.result["traceparent"] == TRACEPARENT
    # Inside the job, the current trace is the enqueuer's trace.
    assert row.result["inside"].split("-")[1] == TRACEPARENT.split("-")[1]


def test_without_a_span_or_an_explicit_value_there_is_no_traceparent():
    handle = testapp_jobs.trace_probe.enqueue()
    assert handle.get().traceparent is None
    drain()
    assert handle.get().result["traceparent"] is None


def test_the_active_span_is_captured_at_enqueue_and_the_job_runs_in_a_child_span(
    span_exporter,
):
    from opentelemetry import trace

    tracer = trace.get_tracer("tests.integration")
    with tracer.start_as_current_span("POST /checkout") as parent:
        handle = testapp_jobs.trace_probe.enqueue()
    parent_ctx = parent.get_span_context()
    expected = traceparent_of(parent_ctx)
    assert handle.get().traceparent == expected

    span_exporter.clear()
    drain()
    row = handle.get()
    assert row.state == "done"
    job_spans = [s for s in span_exporter.get_finished_spans()
                 if s.name == "xjobs testapp.trace_probe"]
    assert len(job_spans) == 1
    span = job_spans[0]
    assert span.context.trace_id == parent_ctx.trace_id
    assert span.parent is not None and span.parent.span_id == parent_ctx.span_id
    assert span.kind == trace.SpanKind.CONSUMER
    assert span.attributes["xjobs.job_id"] == str(handle.id)
    assert span.attributes["xjobs.attempt"] == 1
    assert row.result["traceparent"] == expected
    assert row.result["inside"] == traceparent_of(span.context)


def test_an_explicit_traceparent_wins_over_the_active_span(span_exporter):
    from opentelemetry import trace

    with trace.get_tracer("tests.integration").start_as_current_span("request"):
        handle = testapp_jobs.trace_probe.using(traceparent=TRACEPARENT).enqueue()
    assert handle.get().traceparent == TRACEPARENT
    span_exporter.clear()
    drain()
    (span,) = [s for s in span_exporter.get_finished_spans()
               if s.name == "xjobs testapp.trace_probe"]
    assert f"{span.context.trace_id:032x}" == TRACEPARENT.split("-")[1]
    assert f"{span.parent.span_id:016x}" == TRACEPARENT.split("-")[2]


def test_a_job_enqueued_without_a_trace_runs_in_a_root_span(span_exporter):
    handle = testapp_jobs.trace_probe.enqueue()
    span_exporter.clear()
    drain()
    (span,) = [s for s in span_exporter.get_finished_spans()
               if s.name == "xjobs testapp.trace_probe"]
    assert span.parent is None
    assert handle.get().result["traceparent"] is None


# ---------------------------------------------------------------------- the self-fence --


def test_a_worker_whose_database_stops_answering_stops_its_runs_after_a_lease():
    """The heartbeat AND the loop's own statements hang (the database host is unreachable):
    the watch runs on a thread of its own, so the run is still stopped once a whole lease
    passed without renewal, before another worker can re-claim the job and run it twice."""
    from django_xjobs import faults
    from django_xjobs.worker.loop import Worker
    from django_xjobs.worker.options import WorkerOptions

    release = threading.Event()
    worker = Worker(WorkerOptions.from_settings(
        concurrency=2, prefetch=0, install_signals=False, notify=False, duties=(),
        lease=1.5, heartbeat=0.5, poll_interval=0.2))
    loop = threading.Thread(target=worker.run, daemon=True, name="test-worker-loop")

    def hang(point: str) -> None:
        name = threading.current_thread().name
        if name == loop.name or name.startswith("xjobs-heartbeat"):
            release.wait(30)

    handle = testapp_jobs.sleepy_polite.enqueue(seconds=30)
    loop.start()
    try:
        wait_until(lambda: starts(handle.id), message="the run to start")
        assert starts(handle.id) == [1]
        faults.inject_hook("before:jobs_renew_if_owned", hang, times=None)
        faults.inject_hook("before:jobs_claim", hang, times=None)
        faults.inject_hook("before:jobs_requeue_if_owned", hang, times=None)
        wait_until(lambda: worker.stats["self_fenced"], timeout=10,
                   message="the worker to stop its run")
        assert worker.stats["self_fenced"] == 1, dict(worker.stats)
        # The code saw the stop (ctx.cancelled) and returned early.
        end = wait_until(lambda: Effect.objects.filter(job_id=str(handle.id), kind="end").first(),
                         timeout=5, message="the run to return")
        assert end.attempt == 1
    finally:
        faults.clear()
        release.set()
        worker.stop("test over")
        loop.join(timeout=30)
    # Once the database answers again, the job is handed back without spending an attempt.
    row = handle.get()
    assert row.state in ("ready", "running", "done"), row.state


def test_a_starting_worker_claims_before_it_writes_its_row():
    # The first claim goes first (docs/performance.md, "Worker start-up"): the job it took
    # started (its claim's now()) before the worker's x_workers row was written.
    from django_xjobs.models import WorkerRow
    from django_xjobs.worker.loop import Worker
    from django_xjobs.worker.options import WorkerOptions

    handle = testapp_jobs.record.enqueue(tag="first")
    worker = Worker(WorkerOptions.from_settings(install_signals=False, notify=False,
                                                worker_id="claims-first"))
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_until(lambda: handle.get().state == "done", message="the first job")
        wait_until(lambda: WorkerRow.objects.filter(id="claims-first").exists(),
                   message="the worker's row")
        row = WorkerRow.objects.get(id="claims-first")
        assert handle.get().started_at < row.started_at
    finally:
        worker.stop()
        thread.join(30)
