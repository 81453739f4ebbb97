"""enqueue_on_commit and the relay, in this process, on one database (x_outbox and x_jobs side
by side): the job exists if and only if the staging transaction commits, exactly once.

Transactional tests (real commits and rollbacks). The relay runs as it does in production:
``outbox.relay_pending`` / ``relay_batch`` on a thread of its own (so it sees committed rows
only), the ``Relay`` duty on its thread, or ``testing.drain``. Subprocess relays and their
crashes are in tests/acceptance/test_outbox_relay.py.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import connection, connections, transaction
from django.test import override_settings

from django_xjobs import enqueue_on_commit, faults, outbox
from django_xjobs.api import acting_as
from django_xjobs.engines import get_engine
from django_xjobs.exceptions import InvalidJobInput, PayloadTooLarge, UnknownJob
from django_xjobs.models import Job, OutboxEntry
from django_xjobs.testing import drain
from django_xjobs.worker.relay import Relay
from tests.conftest import wait_until
from tests.testapp import jobs as testapp_jobs
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)

record = testapp_jobs.record
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class Boom(Exception):
    pass


def in_thread(fn):
    """Run ``fn`` on another thread (another connection: committed rows only); its result."""
    result: list = []
    error: list[BaseException] = []

    def run():
        try:
            result.append(fn())
        except BaseException as exc:
            error.append(exc)
        finally:
            connections.close_all()

    t = threading.Thread(target=run)
    t.start()
    t.join(timeout=60)
    if error:
        raise error[0]
    assert result, "the thread did not finish"
    return result[0]


def relay() -> int:
    """One relay run over everything committed, as a relay process would see it."""
    return in_thread(outbox.relay_pending)


def business_write(tag: str) -> Effect:
    return Effect.objects.create(job_id="-", name="business", attempt=0, pid=0, kind="biz",
                                 tag=tag)


@pytest.fixture
def clean_faults():
    faults.clear()
    yield faults
    faults.clear()


@pytest.fixture
def running_relay():
    """A Relay duty on its own thread, as a worker runs it (NOTIFY and on_commit wake-ups)."""
    stop = threading.Event()
    relays: list[Relay] = []
    threads: list[threading.Thread] = []

    def start(**kwargs) -> Relay:
        r = Relay(engine=get_engine(), worker_id="tests", stop=stop, **kwargs)
        t = threading.Thread(target=_run_closing, args=(r,), daemon=True)
        t.start()
        relays.append(r)
        threads.append(t)
        wait_until(lambda: r.rounds >= 1, message="the relay's first round")
        return r

    yield start
    stop.set()
    for t in threads:
        t.join(30)


def _run_closing(r: Relay) -> None:
    try:
        r.run()
    finally:
        r.close_connection()


# ------------------------------------------------------------------------ commit / rollback --


def test_a_rolled_back_transaction_never_becomes_a_job_however_often_the_relay_runs():
    with pytest.raises(Boom), transaction.atomic():
        business_write("order 1")
        staged = record.enqueue_on_commit(tag="rolled back")
        assert OutboxEntry.objects.filter(id=staged.id).exists()  # visible to the stager
        assert relay() == 0  # and to no relay before the commit
        raise Boom
    for _ in range(3):
        assert relay() == 0
    assert not OutboxEntry.objects.exists()
    assert not Job.objects.exists()
    assert staged.status() is None and staged.job_id() is None


def test_a_committed_transaction_becomes_exactly_one_job_that_runs_to_done():
    with transaction.atomic():
        business_write("order 2")
        staged = record.enqueue_on_commit(tag="kept")
        assert relay() == 0  # not before the commit
    assert staged.job_id() is None  # committed, not relayed yet
    assert relay() == 1
    assert relay() == 0  # published rows are never relayed again

    job = Job.objects.get()
    assert job.id == staged.id == staged.job_id()
    assert (job.name, job.state, job.input) == ("testapp.record", "ready", {"tag": "kept"})
    entry = OutboxEntry.objects.get(id=staged.id)
    assert entry.published_at is not None and entry.job_id == job.id

    stats = drain()
    assert stats["done"] == 1
    assert Job.objects.get().state == "done"
    assert Effect.objects.filter(kind="start", tag="kept").count() == 1


def test_a_relayed_jobs_run_id_is_minted_in_its_ids_millisecond():
    """The id is staged, the run id minted by the relay later: in the id's millisecond, as the
    API mints both at once, so the console finds the job by run id on the primary key and the
    job never enters x_jobs_run_apart_idx (console.jobs.run_id_match)."""
    with transaction.atomic():
        staged = record.enqueue_on_commit(tag="later")
    # The relay runs in a later millisecond than the staging (the id's): a run id minted from
    # its own clock would not be in the id's millisecond.
    wait_until(lambda: time.time_ns() // 1_000_000 > staged.id.int >> 80,
               message="the clock past the staging's millisecond")
    assert relay() == 1
    job = Job.objects.get()
    assert job.id == staged.id and job.run_id != job.id and job.run_id.version == 7
    assert job.run_id.int >> 80 == job.id.int >> 80
    with connection.cursor() as cursor:
        cursor.execute("select count(*) from x_jobs where not (left(run_id::text, 13) = "
                       "left(id::text, 13))")
        assert cursor.fetchone()[0] == 0


def test_a_rolled_back_savepoint_discards_only_its_own_staging():
    with transaction.atomic():
        outer = record.enqueue_on_commit(tag="outer")
        with pytest.raises(Boom), transaction.atomic():
            inner = record.enqueue_on_commit(tag="inner")
            raise Boom
        with transaction.atomic():
            nested_kept = record.enqueue_on_commit(tag="nested kept")
        assert not OutboxEntry.objects.filter(id=inner.id).exists()
    assert relay() == 2
    assert set(Job.objects.values_list("id", flat=True)) == {outer.id, nested_kept.id}
    assert inner.job_id() is None
    assert not Job.objects.filter(input__tag="inner").exists()


def test_outside_a_transaction_the_staging_commits_at_once_and_a_running_relay_takes_it(
    running_relay,
):
    # A poll interval longer than the test's deadline: only a wake-up can be why it is relayed.
    relay_duty = running_relay(poll_interval=600)
    assert connection.get_autocommit()
    staged = record.enqueue_on_commit(tag="autocommit")
    # The relay counts a batch on its own thread once its commit returned: the job can show a
    # moment before the count does.
    wait_until(lambda: relay_duty.relayed and Job.objects.filter(id=staged.id).exists(),
               timeout=30, message="the relay to publish the autocommit staging")
    assert relay_duty.relayed == 1


def test_a_commit_wakes_a_relay_in_this_process_even_with_notify_off(running_relay):
    with override_settings(XJOBS={**settings.XJOBS, "NOTIFY": False}):
        relay_duty = running_relay(poll_interval=600)
        assert not relay_duty.listeners
        with transaction.atomic():
            staged = record.enqueue_on_commit(tag="on_commit wakes")
        wait_until(lambda: Job.objects.filter(id=staged.id).exists(), timeout=30,
                   message="the on_commit wake-up to relay the staging")


def test_the_relay_hears_another_process_commit_through_notify(running_relay):
    relay_duty = running_relay(poll_interval=600)
    wait_until(lambda: relay_duty.listeners[0].connected.is_set(),
               message="the relay's LISTEN connection")
    outbox.remove_waker(relay_duty.wake)  # as if the staging came from another process
    staged = in_thread(lambda: record.enqueue_on_commit(tag="from elsewhere"))
    wait_until(lambda: Job.objects.filter(id=staged.id).exists(), timeout=30,
               message="the NOTIFY to wake the relay")


def test_a_relay_duty_survives_database_errors_and_relays_afterwards(running_relay,
                                                                    clean_faults, caplog):
    relay_duty = running_relay(poll_interval=0.2)
    clean_faults.inject("before:outbox_claim", "disconnect", times=2)
    staged = record.enqueue_on_commit(tag="after errors")
    # The job shows once the relay's commit returned, its count a moment later (as above).
    wait_until(lambda: relay_duty.relayed and Job.objects.filter(id=staged.id).exists(),
               timeout=30, message="the relay to recover and publish")
    assert "outbox relay: OperationalError" in caplog.text
    assert relay_duty.relayed == 1


def test_a_rolled_back_staging_sends_no_notification():
    listener = get_engine().outbox_listener("tests-outbox-listen")
    try:
        with pytest.raises(Boom), transaction.atomic():
            record.enqueue_on_commit(tag="never announced")
            raise Boom
        # A marker on the same channel after the rollback: had the rolled-back staging been
        # announced, its notification would arrive first (delivery is in commit order).
        with connection.cursor() as cur:
            cur.execute("select pg_notify('xjobs_outbox', 'marker')")
        heard: list[str] = []
        wait_until(lambda: heard.extend(listener.wait(0.5)) or heard, timeout=30,
                   message="the marker notification")
        assert heard == ["marker"]
    finally:
        listener.close()


# ------------------------------------------------------------------------ exactly once --


def test_a_relay_that_fails_between_enqueue_and_mark_leaves_no_job_and_the_row_pending(
    clean_faults,
):
    staged = record.enqueue_on_commit(tag="once")
    clean_faults.inject("before:outbox_mark_published", "raise")
    with pytest.raises(Exception, match="injected fault"):
        relay()
    # One database, one transaction: the jobs went with the failed mark.
    assert not Job.objects.exists()
    assert OutboxEntry.objects.get(id=staged.id).published_at is None
    assert relay() == 1
    assert relay() == 0
    assert list(Job.objects.values_list("id", flat=True)) == [staged.id]


def test_concurrent_relays_publish_each_row_once():
    with transaction.atomic():
        staged = [record.enqueue_on_commit(tag=str(i)) for i in range(300)]
    barrier = threading.Barrier(3)
    counts: list[int] = []

    def relay_concurrently():
        engine = get_engine()
        barrier.wait(timeout=30)
        total = 0
        while moved := outbox.relay_batch(engine, engine, batch_size=7):
            total += moved
        return total

    threads = [threading.Thread(target=lambda: counts.append(in_thread(relay_concurrently)))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sum(counts) == 300
    assert Job.objects.count() == 300
    assert set(Job.objects.values_list("id", flat=True)) == {s.id for s in staged}
    assert not OutboxEntry.objects.filter(published_at__isnull=True).exists()


# ------------------------------------------------------------------------ what travels --


def test_every_enqueue_option_travels_through_the_outbox():
    run_at = datetime.now(UTC) + timedelta(days=1)
    with transaction.atomic():
        a = record.using(queue="emails", priority=7, tenant_id="acme", max_attempts=9,
                         idempotency_key="welcome:1", traceparent=TRACEPARENT,
                         enqueued_by="signup-form", run_at=run_at).enqueue_on_commit(tag="a")
        b = enqueue_on_commit("testapp.record", {"tag": "b"}, delay=timedelta(hours=2))
    assert relay() == 2
    job_a, job_b = Job.objects.get(id=a.id), Job.objects.get(id=b.id)
    assert (job_a.queue, job_a.priority, job_a.tenant_id, job_a.max_attempts,
            job_a.idempotency_key, job_a.traceparent, job_a.enqueued_by, job_a.run_at,
            job_a.state) == ("emails", 7, "acme", 9, "welcome:1", TRACEPARENT, "signup-form",
                             run_at, "delayed")
    staged_at = OutboxEntry.objects.get(id=b.id).staged_at
    assert job_b.state == "delayed"
    assert job_b.run_at == staged_at + timedelta(hours=2)  # the delay counts from the staging
    assert job_b.idempotency_key == str(job_b.id)  # no key given: its own id


def test_enqueued_by_is_the_stagers_when_known_else_outbox():
    with acting_as("admin:ada"):
        by_admin = record.enqueue_on_commit(tag="admin")
    anonymous = record.enqueue_on_commit(tag="nobody")
    named = record.using(enqueued_by="billing").enqueue_on_commit(tag="named")
    relay()
    by = dict(Job.objects.values_list("id", "enqueued_by"))
    assert by == {by_admin.id: "admin:ada", anonymous.id: "outbox", named.id: "billing"}


def test_a_key_held_by_a_live_job_maps_the_staging_to_that_job():
    live = record.using(idempotency_key="pay:1").enqueue(tag="first")
    staged = record.using(idempotency_key="pay:1").enqueue_on_commit(tag="second")
    assert relay() == 1
    assert list(Job.objects.values_list("id", flat=True)) == [live.id]
    assert staged.job_id() == live.id != staged.id
    assert Job.objects.get().input == {"tag": "first"}


def test_two_stagings_of_one_key_in_one_batch_make_one_job():
    with transaction.atomic():
        first = record.using(idempotency_key="k").enqueue_on_commit(tag="1")
        second = record.using(idempotency_key="k").enqueue_on_commit(tag="2")
    assert relay() == 2
    (job,) = Job.objects.all()
    assert first.job_id() == second.job_id() == job.id


def test_enqueue_on_commit_by_name_and_on_a_bound_job():
    with transaction.atomic():
        by_name = enqueue_on_commit("testapp.record", {"tag": "n"}, tenant_id="t1")
        bound = record.using(priority=3).enqueue_on_commit(tag="bound")
        plain = testapp_jobs.noop.enqueue_on_commit()
    relay()
    rows = {j.id: j for j in Job.objects.all()}
    assert (rows[by_name.id].tenant_id, rows[by_name.id].input) == ("t1", {"tag": "n"})
    assert rows[bound.id].priority == 3
    assert rows[plain.id].name == "testapp.noop"


# ------------------------------------------------------------------------------ bad input --

NAIVE = datetime(2030, 1, 1, 12, 0)

BAD_CALLS = {
    "non-JSON input": lambda: record.enqueue_on_commit(when={1, 2}),  # a datetime is stored
    "NaN": lambda: record.enqueue_on_commit(x=float("nan")),
    "naive run_at": lambda: record.using(run_at=NAIVE).enqueue_on_commit(),
    "negative delay": lambda: record.using(delay=-5).enqueue_on_commit(),
    "bad queue": lambda: record.using(queue="no spaces").enqueue_on_commit(),
    "bad key": lambda: record.using(idempotency_key=42).enqueue_on_commit(),
    "bad traceparent": lambda: record.using(traceparent="nope").enqueue_on_commit(),
    "input not a dict": lambda: enqueue_on_commit("testapp.record", ["tag"]),
    "bad name": lambda: enqueue_on_commit("no spaces allowed", {}),
    "name not a string": lambda: enqueue_on_commit(42, {}),
    "unknown option": lambda: enqueue_on_commit("testapp.record", {}, retries=3),
    "alias no relay reads": lambda: enqueue_on_commit("testapp.record", {}, using="jobs"),
    "alias not configured": lambda: enqueue_on_commit("testapp.record", {}, using="nope"),
}


@pytest.mark.parametrize("bad", BAD_CALLS.values(), ids=BAD_CALLS.keys())
def test_bad_input_raises_stages_nothing_and_leaves_the_transaction_usable(bad):
    with transaction.atomic():
        business_write("before")
        with pytest.raises(InvalidJobInput):
            bad()
        assert not OutboxEntry.objects.exists()
        good = record.enqueue_on_commit(tag="after")
    assert list(OutboxEntry.objects.values_list("id", flat=True)) == [good.id]
    assert relay() == 1
    assert list(Job.objects.values_list("id", flat=True)) == [good.id]


def test_an_unknown_job_or_a_payload_over_the_limit_stages_nothing():
    with override_settings(XJOBS={**settings.XJOBS, "MAX_PAYLOAD_BYTES": 64}):
        with transaction.atomic():
            with pytest.raises(UnknownJob):
                enqueue_on_commit("x.y", {})
            with pytest.raises(PayloadTooLarge):
                record.enqueue_on_commit(tag="x" * 100)
            assert not OutboxEntry.objects.exists()
    assert not OutboxEntry.objects.exists()


# -------------------------------------------------------------------------------- drain --


def test_drain_relays_committed_stagings_then_runs_them():
    with transaction.atomic():
        business_write("checkout")
        staged = record.enqueue_on_commit(tag="drained")
    stats = drain()
    assert (stats["relayed"], stats["done"]) == (1, 1)
    assert Job.objects.get(id=staged.id).state == "done"


def test_drain_runs_the_jobs_that_jobs_stage():
    parent = testapp_jobs.stage_child.enqueue_on_commit(tag="p")
    stats = drain()
    assert (stats["relayed"], stats["done"]) == (2, 2)
    child = Job.objects.get(input__tag="child of p")
    assert child.state == "done"
    assert Job.objects.get(id=parent.id).result == {"staged": str(child.id)}


def test_drain_does_not_relay_what_another_open_transaction_staged():
    opened, release = threading.Event(), threading.Event()

    def stage_and_hold():
        with transaction.atomic():
            record.enqueue_on_commit(tag="still open")
            opened.set()
            assert release.wait(30)

    holder = threading.Thread(target=lambda: in_thread(stage_and_hold))
    holder.start()
    try:
        assert opened.wait(30)
        stats = drain()
        assert stats["relayed"] == 0 and stats["done"] == 0
    finally:
        release.set()
        holder.join(30)
    assert drain()["relayed"] == 1


def test_drain_refuses_to_run_inside_a_transaction():
    with transaction.atomic():
        staged = record.enqueue_on_commit(tag="mine")
        with pytest.raises(transaction.TransactionManagementError, match="inside"):
            drain()
        assert OutboxEntry.objects.filter(id=staged.id).exists()  # the transaction lives on
    assert drain()["relayed"] == 1


def test_drain_without_relay_leaves_the_outbox_alone():
    record.enqueue_on_commit(tag="left")
    assert drain(relay=False)["relayed"] == 0
    assert not Job.objects.exists()


# ---------------------------------------------------------------------- commands, stats --


def test_stats_show_pending_stagings_and_the_age_of_the_oldest():
    record.enqueue_on_commit(tag="1")
    oldest = record.enqueue_on_commit(tag="2")
    OutboxEntry.objects.filter(id=oldest.id).update(
        staged_at=get_engine().db_now() - timedelta(minutes=10))
    out = StringIO()
    call_command("xjobs", stdout=out)
    assert "outbox: 2 pending, oldest 10m" in out.getvalue()

    out = StringIO()
    call_command("xjobs", "--json", stdout=out)
    import json

    data = json.loads(out.getvalue())["outbox"]
    assert data["pending"] == 2 and 590 <= data["oldest_pending_seconds"] <= 900
    assert data["databases"]["default"]["pending"] == 2

    relay()
    out = StringIO()
    call_command("xjobs", stdout=out)
    assert "outbox: 0 pending\n" in out.getvalue() + "\n"


def test_xjobs_relay_once_relays_what_is_pending_and_says_how_many():
    with transaction.atomic():
        for i in range(3):
            record.enqueue_on_commit(tag=str(i))
    out = StringIO()
    in_thread(lambda: call_command("xjobs_relay", "--once", stdout=out))
    assert "relayed 3 staged job(s)" in out.getvalue()
    assert Job.objects.count() == 3


@pytest.mark.parametrize(("args", "message"), [
    (["--database", "jobs"], "not in XJOBS"),
    (["--batch-size", "0"], "--batch-size"),
    (["--poll-interval", "soon"], "not a duration"),
    (["--poll-interval", "0"], "greater than zero"),
])
def test_xjobs_relay_refuses_bad_options(args, message):
    with pytest.raises(CommandError, match=message):
        call_command("xjobs_relay", *args)


# ------------------------------------------------------------------------------ the hot path --


def test_relaying_a_batch_is_four_statements_whatever_its_size():
    from django.test.utils import CaptureQueriesContext

    with transaction.atomic():
        for i in range(60):
            record.enqueue_on_commit(tag=str(i))
    engine = get_engine()
    with CaptureQueriesContext(connection) as ctx:
        assert outbox.relay_batch(engine, engine) == 60
    sql = [q["sql"] for q in ctx.captured_queries if q["sql"] not in ("BEGIN", "COMMIT")]
    # One transaction: one claim, the jobs' COPY and its NOTIFY, one mark; none per row.
    assert [q["sql"] for q in ctx.captured_queries].count("COMMIT") == 1
    assert len(sql) == 4, sql
    assert sql[0].startswith("/* outbox_claim */")
    assert sql[1].startswith("copy x_jobs") and sql[1].endswith("-- 60 rows")
    assert sql[2].startswith("/* jobs_notify_queues */")
    assert sql[3].startswith("/* outbox_mark_published */")


def test_staging_is_one_statement_in_the_callers_transaction():
    from django.test.utils import CaptureQueriesContext

    with transaction.atomic(), CaptureQueriesContext(connection) as ctx:
        record.enqueue_on_commit(tag="one")
    sql = [q["sql"] for q in ctx.captured_queries if q["sql"] not in ("BEGIN", "COMMIT")]
    assert len(sql) == 1 and sql[0].startswith("/* outbox_stage */"), sql
