"""django_xjobs.signals (docs/observability.md, "Signals") in this process: job_enqueued from
enqueue, enqueue_many and the outbox relay; the whole life of a run in the inline test mode and
in the in-process worker loop (``testing.drain``); a receiver that raises.

Transactional tests: the relay and ``drain`` read committed rows on connections of their own.
Real worker processes are in tests/acceptance/test_signals_worker.py.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

import pytest
from django.db import connections, transaction

from django_xjobs import api, enqueue_many, outbox, signals
from django_xjobs.api import JobHandle
from django_xjobs.models import Job
from django_xjobs.outbox import StagedJob
from django_xjobs.records import ClaimedJob
from django_xjobs.testing import drain, travel
from tests.conftest import wait_until
from tests.testapp import jobs as testapp_jobs
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)

SIGNALS = {"job_enqueued": signals.job_enqueued, "job_started": signals.job_started,
           "job_finished": signals.job_finished, "job_dead": signals.job_dead}


class Heard:
    """Every signal received, as (signal name, sender, keyword arguments), in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, object, dict]] = []
        self._lock = threading.Lock()

    def receiver(self, name: str):
        def receive(sender, signal, **kwargs):
            with self._lock:
                self.events.append((name, sender, kwargs))
        return receive

    def of(self, name: str) -> list[dict]:
        with self._lock:
            return [kwargs for n, _, kwargs in self.events if n == name]

    def senders(self, name: str) -> list[object]:
        with self._lock:
            return [sender for n, sender, _ in self.events if n == name]

    def run(self, job_id) -> list[tuple[str, object]]:
        """(signal, attempt or outcome) of the runs of one job, in order; job_enqueued first."""
        with self._lock:
            events = list(self.events)
        told = []
        for name, _, kw in events:
            if name == "job_enqueued" and str(kw["handle"].id) == str(job_id):
                told.append((name, None))
            elif name != "job_enqueued" and kw["job"].id == str(job_id):
                told.append((name, kw.get("outcome", kw.get("attempt"))))
        return told


@pytest.fixture
def heard():
    listener = Heard()
    receivers = [(signal, listener.receiver(name)) for name, signal in SIGNALS.items()]
    for signal, receive in receivers:
        signal.connect(receive, weak=False)
    yield listener
    for signal, receive in receivers:
        signal.disconnect(receive)


@pytest.fixture
def raising():
    """A receiver of every signal that raises, connected before the others hear anything."""
    def boom(sender, signal, **kwargs):
        raise RuntimeError("receiver broke")

    for signal in SIGNALS.values():
        signal.connect(boom, weak=False)
    yield boom
    for signal in SIGNALS.values():
        signal.disconnect(boom)


@pytest.fixture
def inline(settings):
    settings.XJOBS = {**settings.XJOBS, "TEST_MODE": "inline"}


def in_thread(fn):
    """Run ``fn`` on another thread (its own connections: committed rows only)."""
    result: list = []

    def run():
        try:
            result.append(fn())
        finally:
            connections.close_all()

    t = threading.Thread(target=run)
    t.start()
    t.join(timeout=60)
    return result[0]


# ------------------------------------------------------------------------------ enqueue --


def test_an_enqueue_sends_job_enqueued_with_its_handle_and_the_job_as_sender(heard):
    handle = testapp_jobs.record.using(idempotency_key="once").enqueue(tag="a")

    assert heard.of("job_enqueued") == [{"handle": handle}]
    assert isinstance(handle, JobHandle) and handle.created
    assert heard.senders("job_enqueued") == [testapp_jobs.record]

    # The key names the live job: nothing new was enqueued, nothing is sent.
    again = testapp_jobs.record.using(idempotency_key="once").enqueue(tag="b")
    assert again.id == handle.id and not again.created
    assert len(heard.of("job_enqueued")) == 1


def test_enqueue_many_sends_one_job_enqueued_per_job_it_made(heard):
    name = testapp_jobs.record.name
    handles = enqueue_many([
        (name, {"tag": "keyed"}, {"idempotency_key": "k"}),
        (name, {"tag": "same key"}, {"idempotency_key": "k"}),  # the first one's job
        (testapp_jobs.noop.name, {}),
    ])
    assert handles[0].id == handles[1].id
    told = heard.of("job_enqueued")
    assert [t["handle"].id for t in told] == [handles[0].id, handles[2].id]
    assert heard.senders("job_enqueued") == [testapp_jobs.record, testapp_jobs.noop]


def test_a_receiver_for_one_job_hears_only_that_job():
    got = []

    def receive(sender, handle, **kwargs):
        got.append(handle.id)

    signals.job_enqueued.connect(receive, sender=testapp_jobs.record, weak=False)
    try:
        testapp_jobs.noop.enqueue()
        mine = testapp_jobs.record.enqueue(tag="x")
    finally:
        signals.job_enqueued.disconnect(receive, sender=testapp_jobs.record)
    assert got == [mine.id]


def test_job_enqueued_is_sent_inside_the_callers_transaction(heard):
    """Sent right after the insert, like the row: a rollback undoes the job, not the send (a
    receiver that must see committed jobs only uses transaction.on_commit)."""
    with pytest.raises(RuntimeError), transaction.atomic():
        handle = testapp_jobs.record.enqueue(tag="rolled back")
        assert heard.of("job_enqueued") == [{"handle": handle}]
        raise RuntimeError("rollback")
    assert not Job.objects.filter(id=handle.id).exists()


def test_a_receiver_that_raises_is_logged_and_the_enqueue_lands(raising, heard, caplog):
    with caplog.at_level(logging.ERROR, logger="django_xjobs.signals"):
        handle = testapp_jobs.record.enqueue(tag="lands")

    assert handle.get().state == "ready"
    assert heard.of("job_enqueued") == [{"handle": handle}]  # the next receiver still heard it
    [logged] = [r for r in caplog.records if r.name == "django_xjobs.signals"]
    assert "job_enqueued receiver" in logged.getMessage() and "receiver broke" in (
        logged.getMessage())
    assert logged.exc_info is not None and logged.exc_info[0] is RuntimeError


def test_enqueue_on_commit_sends_job_enqueued_when_the_relay_makes_the_job(heard):
    with transaction.atomic():
        staged = testapp_jobs.record.enqueue_on_commit(tag="staged")
    with pytest.raises(RuntimeError), transaction.atomic():
        testapp_jobs.record.enqueue_on_commit(tag="never")
        raise RuntimeError("rollback")
    assert heard.of("job_enqueued") == []  # staged and committed, but no job yet

    assert in_thread(outbox.relay_pending) == 1
    assert heard.of("job_enqueued") == [{"handle": StagedJob(id=staged.id, using="default")}]
    assert heard.senders("job_enqueued") == [testapp_jobs.record]
    assert staged.job_id() == staged.id


# -------------------------------------------------------------------------- inline mode --


def test_the_inline_mode_sends_every_signal_of_a_runs_life(inline, heard):
    handle = testapp_jobs.flaky.enqueue(fail_times=1)
    assert heard.run(handle.id) == [("job_enqueued", None), ("job_started", 1),
                                    ("job_finished", "failed")]
    [failed] = heard.of("job_finished")
    assert isinstance(failed["job"], ClaimedJob) and failed["job"].name == testapp_jobs.flaky.name
    assert failed["attempt"] == 1
    assert isinstance(failed["exception"], RuntimeError)
    assert str(failed["exception"]) == "flaky failure on attempt 1"
    assert heard.senders("job_finished") == [testapp_jobs.flaky]

    travel(timedelta(hours=1))
    drain()
    assert heard.run(handle.id)[3:] == [("job_started", 2), ("job_finished", "done")]
    assert heard.of("job_finished")[-1]["exception"] is None
    assert heard.of("job_dead") == []


def test_the_inline_mode_sends_job_dead_when_the_last_attempt_fails(inline, heard):
    handle = testapp_jobs.always_fails.enqueue()  # max_attempts=2
    travel(timedelta(hours=1))
    drain()
    assert handle.get().state == "dead"
    assert [t for t in heard.run(handle.id) if t[0] != "job_started"] == [
        ("job_enqueued", None), ("job_finished", "failed"), ("job_finished", "failed"),
        ("job_dead", None)]
    [dead] = heard.of("job_dead")
    assert dead["job"].attempt == 2
    assert dead["error"] == handle.get().last_error
    assert "this job always fails" in dead["error"]


def test_the_inline_mode_reports_a_snooze(inline, heard):
    handle = testapp_jobs.snoozer.enqueue(times=1)
    travel(timedelta(seconds=1))
    drain()
    assert handle.get().state == "done"
    outcomes = [kw["outcome"] for kw in heard.of("job_finished")]
    assert outcomes == ["snoozed", "done"]
    assert type(heard.of("job_finished")[0]["exception"]).__name__ == "Snooze"


# ---------------------------------------------------------------- the in-process worker --


def test_the_worker_sends_started_and_finished_from_its_threads(heard):
    handles = [testapp_jobs.record.enqueue(tag=str(i)) for i in range(5)]
    assert drain(concurrency=3)["done"] == 5
    for handle in handles:
        assert heard.run(handle.id) == [("job_enqueued", None), ("job_started", 1),
                                        ("job_finished", "done")]


def test_an_async_run_past_its_timeout_finishes_as_timeout_and_dies(heard):
    handle = testapp_jobs.async_too_slow.enqueue()  # timeout=0.3, max_attempts=1
    drain()
    assert handle.get().state == "dead"
    assert heard.run(handle.id) == [("job_enqueued", None), ("job_started", 1),
                                    ("job_finished", "timeout"), ("job_dead", None)]
    assert heard.of("job_finished")[0]["exception"] is None
    [dead] = heard.of("job_dead")
    assert dead["error"] == handle.get().last_error
    assert dead["error"].startswith("TimeoutError")


def test_a_cancelled_run_finishes_as_cancelled(heard, settings):
    settings.XJOBS = {**settings.XJOBS, "LEASE": "2s", "HEARTBEAT": "0.2s"}
    handle = testapp_jobs.sleepy_polite.enqueue(seconds=30)
    drained = threading.Thread(target=lambda: in_thread(drain))
    drained.start()
    wait_until(lambda: Effect.objects.filter(job_id=str(handle.id), kind="start").exists(),
               timeout=30, message="the job to start")
    api.cancel(handle.id)
    drained.join(timeout=60)
    assert not drained.is_alive()
    assert heard.run(handle.id)[1:] == [("job_started", 1), ("job_finished", "cancelled")]


def test_a_raising_receiver_never_breaks_the_worker(raising, heard, caplog):
    handle = testapp_jobs.record.enqueue(tag="still done")
    with caplog.at_level(logging.ERROR, logger="django_xjobs.signals"):
        assert drain()["done"] == 1
    assert handle.get().state == "done"
    assert heard.run(handle.id)[1:] == [("job_started", 1), ("job_finished", "done")]
    logged = [r.getMessage() for r in caplog.records if r.name == "django_xjobs.signals"]
    assert any(m.startswith("job_started receiver") for m in logged)
    assert any(m.startswith("job_finished receiver") for m in logged)

