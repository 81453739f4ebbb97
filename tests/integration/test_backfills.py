"""Backfill passes end to end in this process: ``xjobs_backfill`` commands and the real worker
loop (``testing.drain``), on PostgreSQL.

The test backfills (tests/testapp/jobs.py) add 1 to ``Counted.hits`` of each row of a batch, a
write that is NOT idempotent: a batch committed twice shows as hits = 2, a batch rolled back as
hits = 0. Worker crashes are in tests/acceptance/test_backfills.py.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from datetime import timedelta
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import connections
from django.test import override_settings

from django_xjobs import Batch, backfill, faults, registry
from django_xjobs.backfills import registry as backfill_registry
from django_xjobs.backfills.provenance import app_version, checksum_of, project_version
from django_xjobs.engines import get_engine
from django_xjobs.models import Backfill, Job
from django_xjobs.testing import drain
from tests.conftest import wait_until
from tests.testapp.models import Counted

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def no_faults():
    faults.clear()
    yield
    faults.clear()


def make_rows(n: int, *, poison: tuple[int, ...] = ()) -> list[int]:
    Counted.objects.bulk_create([Counted() for _ in range(n)])
    ids = list(Counted.objects.order_by("pk").values_list("pk", flat=True))
    if poison:
        Counted.objects.filter(pk__in=[ids[i - 1] for i in poison]).update(poison=True)
    return ids


def hits() -> list[int]:
    return list(Counted.objects.order_by("pk").values_list("hits", flat=True))


def run(*args: str) -> str:
    out = StringIO()
    call_command("xjobs_backfill", *args, stdout=out)
    return out.getvalue()


def run_json(*args: str):
    return json.loads(run(*args, "--json"))


def start(name: str = "testapp.count_rows", *args: str) -> dict:
    return run_json("start", name, *args)


def pass_of(started: dict) -> Backfill:
    return Backfill.objects.get(pk=started["run_id"])


def job_of(started: dict) -> Job:
    return Job.objects.get(pk=started["job_id"])


def work() -> dict:
    return dict(drain(queues=["backfills", "default"]))


def xjobs(**changes):
    """override_settings of some XJOBS keys, the suite's others kept."""
    return override_settings(XJOBS={**settings.XJOBS, **changes})


# --------------------------------------------------------------------------- a whole pass --


def test_a_pass_processes_every_row_once_and_completes():
    make_rows(1050)
    started = start()
    assert pass_of(started).status == "pending"

    stats = work()

    done = pass_of(started)
    assert stats["done"] == 1
    assert (done.status, done.rows_processed, done.last_cursor) == ("completed", 1050, None)
    assert done.completed_at is not None and done.error is None
    assert hits() == [1] * 1050
    job = job_of(started)
    assert (job.state, job.name, job.result) == (
        "done", "backfill:testapp.count_rows",
        {"status": "completed", "rows_processed": 1050, "batches": 11})
    assert str(job.run_id) == started["run_id"]


def test_a_pass_takes_its_batch_size_from_start():
    make_rows(250)
    started = start("testapp.count_rows", "--batch-size", "120")

    work()

    assert job_of(started).result["batches"] == 3
    assert hits() == [1] * 250


def test_a_pass_over_no_rows_completes_at_once():
    started = start()

    work()

    assert (pass_of(started).status, pass_of(started).rows_processed) == ("completed", 0)


def test_a_pass_records_the_checksum_of_its_code_and_the_app_version():
    from tests.testapp.jobs import count_rows

    with xjobs(APP_VERSION="2026.12.1"):
        started = start()
        work()

    done = pass_of(started)
    assert done.checksum == count_rows.checksum == checksum_of(count_rows.func)
    assert len(done.checksum) == 64
    assert done.app_version == "2026.12.1"


# ------------------------------------------------------------------------------- failure --


def test_a_batch_that_raises_fails_the_pass_and_keeps_its_cursor():
    ids = make_rows(1000, poison=(550,))
    started = start("testapp.count_rows_once")

    work()

    failed = pass_of(started)
    assert failed.status == "failed"
    assert (failed.rows_processed, failed.last_cursor) == (500, ids[499])
    assert f"poisoned row {ids[549]}" in failed.error and "ValueError" in failed.error
    assert failed.completed_at is not None
    # The failed batch's update ran before it raised: the rollback undid it.
    assert hits() == [1] * 500 + [0] * 500
    assert job_of(started).state == "dead"


def test_retry_resumes_a_failed_pass_from_its_cursor():
    ids = make_rows(1000, poison=(550,))
    started = start("testapp.count_rows_once")
    work()
    began = pass_of(started).started_at
    Counted.objects.update(poison=False)  # the data is fixed

    out = run("retry", started["run_id"])
    work()

    assert f"resumes from cursor {ids[499]} at 500 rows" in out
    done = pass_of(started)
    assert (done.status, done.rows_processed, done.last_cursor) == ("completed", 1000, None)
    assert done.started_at == began  # the same pass, adopted
    assert done.completed_at is not None
    assert hits() == [1] * 1000
    # Only the batches after the cursor: five full ones, and the empty one that ends the pass.
    assert job_of(started).result["batches"] == 6


def test_xjobs_retry_of_the_pass_job_resumes_it_too():
    make_rows(300, poison=(150,))
    started = start("testapp.count_rows_once")
    work()
    Counted.objects.update(poison=False)

    call_command("xjobs", "retry", started["job_id"], stdout=StringIO())
    work()

    assert (pass_of(started).status, pass_of(started).rows_processed) == ("completed", 300)
    assert hits() == [1] * 300


def test_a_failed_pass_with_attempts_left_resumes_by_itself():
    make_rows(300, poison=(150,))
    with xjobs(RETRY_BASE="1h", RETRY_CAP="1h"):  # the retry stays due later meanwhile
        started = start("testapp.count_rows")  # max_attempts=10
        work()
        assert pass_of(started).status == "failed"
        assert (job_of(started).state, job_of(started).attempt) == ("delayed", 1)
        with pytest.raises(CommandError, match="it goes on by itself"):
            run("retry", started["run_id"])
        Counted.objects.update(poison=False)

        call_command("xjobs", "run-now", started["job_id"], stdout=StringIO())
        work()

    assert (pass_of(started).status, job_of(started).attempt) == ("completed", 2)
    assert hits() == [1] * 300


def test_a_batch_that_returns_no_batch_fails_the_pass_for_good():
    make_rows(10)
    started = start("testapp.bad_batch")

    work()

    failed = pass_of(started)
    assert failed.status == "failed"
    assert "not Batch(next_cursor, processed)" in failed.error
    assert job_of(started).state == "dead"
    assert hits() == [0] * 10  # its write rolled back


def test_a_bad_batch_is_refused_with_the_reason():
    from django_xjobs.backfills.definition import MAX_CURSOR_BYTES, validate_batch
    from django_xjobs.exceptions import BadBatch
    from tests.testapp.jobs import count_rows

    for bad, reason in [
        (Batch(None, -1), "processed must be an integer >= 0"),
        (Batch(None, True), "processed must be an integer >= 0"),
        (Batch(object(), 1), "not JSON-serialisable"),
        (Batch("x" * (MAX_CURSOR_BYTES + 1), 1), "a cursor is a position"),
        ((5, 10), "not Batch"),
    ]:
        with pytest.raises(BadBatch, match=reason):
            validate_batch(count_rows, bad)


def test_jobs_enqueued_by_a_batch_commit_with_it_and_name_the_backfill():
    make_rows(120, poison=(60,))  # batches of 50: the second one fails
    started = start("testapp.enqueue_per_batch")

    work()

    assert pass_of(started).status == "failed"
    [enqueued] = Job.objects.filter(name="testapp.record")
    assert enqueued.input == {"tag": "after:None"}  # the first batch's; the second rolled back
    assert enqueued.enqueued_by == "backfill:testapp.enqueue_per_batch"


# ----------------------------------------------------------------------- code and versions --


def test_a_pass_resumed_under_different_code_warns_and_records_it(caplog):
    from tests.testapp import jobs

    make_rows(300, poison=(150,))
    started = start("testapp.count_rows_once")
    work()
    original = backfill_registry.get("testapp.count_rows_once")
    Counted.objects.update(poison=False)
    backfill_registry.unregister("testapp.count_rows_once")
    try:
        # A deploy: the same backfill, other code.
        @backfill("testapp.count_rows_once", batch_size=100, max_attempts=1)
        def count_rows_once_v2(ctx, cursor):
            return jobs.count_batch(ctx, cursor)

        run("retry", started["run_id"])
        with caplog.at_level(logging.WARNING, logger="django_xjobs.backfill"):
            work()
    finally:
        backfill_registry.unregister("testapp.count_rows_once")
        backfill_registry.register(original)

    done = pass_of(started)
    assert done.status == "completed" and hits() == [1] * 300
    assert done.checksum == original.checksum  # the code the pass began with
    [change] = done.code_changes
    assert change["checksum"] == count_rows_once_v2.checksum != original.checksum
    assert change["rows_processed"] == 100
    assert "resumed under different code" in caplog.text
    assert "at 100 rows" in caplog.text


def test_the_project_version_is_the_installed_distribution_of_its_top_package():
    from importlib.metadata import version

    assert project_version(("django.conf.global_settings",)) == version("Django")
    assert project_version(("tests.settings", "django.db")) == version("Django")
    assert project_version(("tests.settings",)) == ""


def test_without_a_setting_the_app_version_comes_from_the_project():
    from tests.testapp.jobs import count_rows

    # The test project (tests.settings, tests.testapp) is not an installed distribution.
    assert app_version(count_rows.func) == ""
    with xjobs(APP_VERSION="7"):
        assert app_version(count_rows.func) == "7"


def test_a_backfill_starts_its_own_pass_and_a_second_start_returns_the_live_one():
    from tests.testapp.jobs import count_rows

    first = count_rows.start(batch_size=5)
    again = count_rows.start()

    assert (first.name, first.created) == ("testapp.count_rows", True)
    assert (again.run_id, again.created) == (first.run_id, False)
    assert Backfill.objects.get(run_id=first.run_id).status == "pending"


# ----------------------------------------------------------------------------- fencing --


def _cancel_job_elsewhere(job_id: str, *, locked: threading.Event | None = None,
                          release: threading.Event | None = None) -> threading.Thread:
    """Cancel the job on another connection; with events, hold the cancel open until told."""
    def cancel():
        try:
            engine = get_engine()
            with engine.atomic():
                engine.job_cancel(job_id, reason="cancelled: from another session")
                if locked is not None and release is not None:
                    locked.set()
                    assert release.wait(30), "the test never released the cancel"
        finally:
            connections.close_all()

    thread = threading.Thread(target=cancel)
    thread.start()
    return thread


def test_a_run_that_loses_its_job_mid_batch_commits_nothing_of_it():
    make_rows(500)
    started = start()
    seen = []

    def cancel_during_third_batch(point):
        seen.append(point)
        if len(seen) == 3:  # the batch's writes are done, its progress not yet written
            _cancel_job_elsewhere(started["job_id"]).join()

    faults.inject_hook("backfill:before-progress", cancel_during_third_batch, times=None)
    stats = work()

    assert stats["lost"] == 1
    assert hits() == [1] * 200 + [0] * 300  # the third batch rolled back
    stopped = pass_of(started)
    assert (stopped.rows_processed, stopped.status) == (200, "running")
    assert job_of(started).state == "cancelled"


def test_the_fence_never_waits_for_a_cancel_in_flight_and_refuses_once_it_commits():
    make_rows(300)
    started = start()
    locked, release = threading.Event(), threading.Event()
    holder: list[threading.Thread] = []
    tries: list[str] = []

    def hold_a_cancel_open(point):
        holder.append(_cancel_job_elsewhere(started["job_id"], locked=locked, release=release))
        assert locked.wait(30)

    def before_the_fence(point):
        # Each try of the batch's progress write: the first finds the job's row held by the
        # cancel and returns at once (busy); a write that waited in the lock queue instead
        # would never come back for a third try while the cancel is held.
        tries.append(point)
        if len(tries) == 3:
            release.set()

    faults.inject_hook("backfill:before-progress", hold_a_cancel_open, times=1)
    faults.inject_hook("before:backfill_progress_if_owned", before_the_fence, times=None)
    stats = work()
    holder[0].join(30)

    assert len(tries) >= 3  # the write came back busy, twice, while the cancel was held...
    assert stats["lost"] == 1  # ...and then matched no owned job
    assert hits() == [0] * 300
    assert pass_of(started).rows_processed == 0


def test_a_pass_job_enqueued_by_hand_with_unknown_input_goes_dead_at_once():
    from django_xjobs import enqueue

    handle = enqueue("backfill:testapp.count_rows", {"cursor": 500})
    work()

    job = Job.objects.get(pk=handle.id)
    assert (job.state, job.attempt) == ("dead", 1)
    assert "unknown pass option(s) ['cursor']" in job.last_error
    assert not Backfill.objects.exists()


def test_a_pass_run_outside_a_worker_is_refused():
    from django_xjobs.context import JobContext
    from django_xjobs.exceptions import PermanentError

    job = registry.get("backfill:testapp.count_rows")
    ctx = JobContext(job_id=str(uuid.uuid4()), run_id=str(uuid.uuid4()), name=job.name,
                     queue="backfills", attempt=1, max_attempts=1, tenant_id=None,
                     traceparent=None)

    with pytest.raises(PermanentError, match="runs only in a worker"):
        job.func(ctx)
    assert not Backfill.objects.exists()


# ------------------------------------------------------------------------------- cancel --


def test_cancel_between_batches_stops_the_pass_and_retry_resumes_it():
    make_rows(400)
    # A throttle of an hour: the pass can only stop in time if the cancel ends the wait.
    started = start("testapp.count_rows", "--throttle", "1h")
    result: dict = {}
    worker = threading.Thread(target=lambda: result.update(work()))
    worker.start()
    try:
        wait_until(lambda: pass_of(started).rows_processed == 100, timeout=30,
                   message="the first batch")
        out = run("cancel", started["run_id"])
        worker.join(60)
        assert not worker.is_alive(), "the pass did not stop during its throttle"
    finally:
        release = _cancel_job_elsewhere(started["job_id"])  # never leave it running
        release.join()
        worker.join(60)

    assert "is now cancelled at 100 rows" in out
    cancelled = pass_of(started)
    assert (cancelled.status, cancelled.rows_processed) == ("cancelled", 100)
    assert cancelled.last_cursor is not None
    assert job_of(started).state == "cancelled"
    assert result["lost"] == 1
    assert hits() == [1] * 100 + [0] * 300

    run("retry", started["run_id"])
    job = job_of(started)
    Job.objects.filter(pk=job.pk).update(input={})  # resume without the hour-long throttle
    work()

    assert (pass_of(started).status, pass_of(started).rows_processed) == ("completed", 400)
    assert hits() == [1] * 400


def test_cancel_of_a_pending_pass_cancels_its_job_before_any_worker_runs_it():
    make_rows(10)
    started = start()

    out = run("cancel", started["run_id"])
    work()

    assert "is now cancelled" in out
    assert pass_of(started).status == "cancelled"
    assert job_of(started).state == "cancelled"
    assert hits() == [0] * 10


def test_cancel_of_a_completed_pass_changes_nothing():
    started = start()
    work()

    result = run_json("cancel", started["run_id"])

    assert (result["changed"], result["reason"]) == (False, "already completed")
    assert pass_of(started).status == "completed" and job_of(started).state == "done"


def test_cancel_json_reports_the_pass():
    started = start()

    result = run_json("cancel", started["run_id"])

    assert result["changed"] is True
    assert result["pass"]["status"] == "cancelled"
    assert result["pass"]["run_id"] == started["run_id"]


# -------------------------------------------------------------------------------- start --


def test_a_second_start_while_a_pass_is_live_returns_that_pass():
    first = start()
    second = start()

    assert (second["created"], second["run_id"], second["job_id"]) == (
        False, first["run_id"], first["job_id"])
    assert "already live" in run("start", "testapp.count_rows")
    assert Backfill.objects.count() == 1 and Job.objects.count() == 1


def test_a_start_after_a_pass_completed_begins_a_new_pass():
    first = start()
    work()

    second = start()

    assert second["created"] is True and second["run_id"] != first["run_id"]
    assert pass_of(second).status == "pending"


def test_start_says_when_no_configured_queue_runs_the_pass():
    with xjobs(QUEUES=["default"]):
        out = run("start", "testapp.count_rows")

    assert "started backfill testapp.count_rows: run" in out
    assert "queue 'backfills' is not in XJOBS['QUEUES']" in out
    assert "--queue backfills" in out
    with xjobs(QUEUES=["default", "backfills"]):
        run("cancel", str(Backfill.objects.get().run_id))
        assert "is not in XJOBS" not in run("start", "testapp.count_rows")
    # Without XJOBS["QUEUES"], workers work every queue a registered job names.
    run("cancel", str(Backfill.objects.filter(status="pending").get().run_id))
    assert "is not in XJOBS" not in run("start", "testapp.count_rows")


@pytest.mark.parametrize(("args", "fragment"), [
    (["start", "testapp.nope"], "No backfill named 'testapp.nope'"),
    (["start", "testapp.count_rows", "--batch-size", "0"], "batch size must be an integer"),
    (["start", "testapp.count_rows", "--batch-size", "ten"], "invalid int value"),
    (["start", "testapp.count_rows", "--throttle", "fast"], "is not a duration"),
    (["start", "testapp.count_rows", "--throttle=-1s"], "is not a duration"),
    (["start", "testapp.count_rows", "--throttle", "2h"], "at most 3600s"),
    (["start", "testapp.count_rows", "--batches", "3"], "--batches only goes with --dry-run"),
    (["start", "testapp.count_rows", "--dry-run", "--throttle", "1s"], "no meaning"),
    (["start", "testapp.count_rows", "--dry-run", "--batches", "0"], "batches must be"),
])
def test_start_refuses_bad_input_and_writes_nothing(args, fragment):
    with pytest.raises(CommandError, match=fragment):
        run(*args)
    assert not Job.objects.exists() and not Backfill.objects.exists()


def test_a_backfill_that_cannot_share_a_transaction_with_its_progress_is_refused():
    with xjobs(DATABASE="jobs"), pytest.raises(
        CommandError, match="one transaction on one database"
    ):
        run("start", "testapp.count_rows")
    assert not Job.objects.exists()


# ------------------------------------------------------------------------------- dry run --


def test_a_dry_run_runs_batches_here_and_writes_nothing():
    make_rows(250)

    out = run("start", "testapp.count_rows", "--dry-run", "--batches", "2")

    assert "every batch was rolled back, nothing was written" in out
    assert "batch 1: cursor - -> " in out and "batch 2: cursor " in out
    assert "2 batch(es), 200 rows" in out and "more batches to go" in out
    assert "total(): 250 rows" in out
    assert hits() == [0] * 250
    assert not Job.objects.exists() and not Backfill.objects.exists()


def test_a_dry_run_to_the_end_says_the_pass_would_end():
    make_rows(150)

    report = run_json("start", "testapp.count_rows", "--dry-run", "--batches", "5",
                      "--batch-size", "100")

    assert (report["finished"], report["rows"], len(report["batches"])) == (True, 150, 2)
    assert report["batches"][1]["next_cursor"] is None
    assert hits() == [0] * 150


def test_a_dry_run_stops_when_the_cursor_does_not_advance():
    @backfill("testapp.finds_rows_by_what_it_changed", batch_size=10)
    def by_state(ctx, cursor):
        ids = list(Counted.objects.filter(hits=0).values_list("pk", flat=True)[:10])
        Counted.objects.filter(pk__in=ids).update(hits=1)
        return Batch("more" if ids else None, len(ids))

    make_rows(30)
    try:
        out = run("start", "testapp.finds_rows_by_what_it_changed", "--dry-run",
                  "--batches", "5")
    finally:
        backfill_registry.unregister("testapp.finds_rows_by_what_it_changed")

    assert "2 batch(es)" in out
    assert "stopped: a batch returned the cursor it was given" in out
    assert hits() == [0] * 30


def test_a_dry_run_whose_batch_raises_is_a_command_error_and_writes_nothing():
    make_rows(10, poison=(3,))

    with pytest.raises(CommandError, match=r"batch 1 \(cursor None\) raised ValueError: "
                                           "poisoned row"):
        run("start", "testapp.count_rows", "--dry-run")
    assert hits() == [0] * 10


# ------------------------------------------------------------------------------ list, show --


@pytest.fixture
def three_passes():
    """A completed pass of count_rows, a failed one of count_rows_once, a pending count_rows."""
    make_rows(300, poison=(250,))
    failed = start("testapp.count_rows_once")
    work()
    Counted.objects.update(poison=False)
    completed = start("testapp.count_rows")
    work()
    pending = start("testapp.count_rows")
    return {"completed": completed, "failed": failed, "pending": pending}


def test_list_shows_every_pass_newest_first(three_passes):
    out = run("--list")

    lines = out.splitlines()
    assert lines[0].split() == ["run_id", "name", "status", "rows", "cursor", "started",
                                "finished", "job"]
    order = [three_passes[k]["run_id"] for k in ("pending", "completed", "failed")]
    assert [line.split()[0] for line in lines[2:]] == order
    assert "dead #1" in out and "done #1" in out and "ready #0" in out
    assert run() == out  # no action lists too


def test_list_filters_by_name_status_and_run_id(three_passes):
    by_name = run_json("--list", "--name", "testapp.count_rows_once")
    by_status = run_json("--list", "--status", "completed")
    by_run = run_json("--list", "--run-id", three_passes["pending"]["run_id"])
    combined = run_json("--list", "--name", "testapp.count_rows", "--status", "failed")

    assert [r["run_id"] for r in by_name] == [three_passes["failed"]["run_id"]]
    assert [r["run_id"] for r in by_status] == [three_passes["completed"]["run_id"]]
    assert [r["run_id"] for r in by_run] == [three_passes["pending"]["run_id"]]
    assert by_run[0]["status"] == "pending"
    assert combined == []
    assert len(run_json("--list", "--limit", "2")) == 2
    assert "(no backfill passes)" in run("--list", "--run-id", str(uuid.uuid4()))


@pytest.mark.parametrize(("args", "fragment"), [
    (["--list", "--run-id", "42"], "run id '42' is not a UUID"),
    (["--list", "--status", "paused"], "invalid choice: 'paused'"),
    (["--list", "--limit", "0"], "limit must be a positive integer"),
    (["show", "nope"], "run id 'nope' is not a UUID"),
    (["show", str(uuid.UUID(int=1))], "no backfill pass with run id"),
    (["cancel", "nope"], "is not a UUID"),
    (["cancel", str(uuid.UUID(int=1))], "no backfill pass with run id"),
    (["retry", str(uuid.UUID(int=1))], "no backfill pass with run id"),
    (["--name", "x", "show", str(uuid.UUID(int=1))], "--name only go(es) with --list"),
    (["--list", "cancel", str(uuid.UUID(int=1))], "--list only go(es) with --list"),
])
def test_bad_input_is_a_command_error(args, fragment):
    with pytest.raises(CommandError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        run(*args)


def test_retry_of_a_completed_pass_or_one_whose_job_is_live_is_refused(three_passes):
    with pytest.raises(CommandError, match="is completed: there is nothing to resume"):
        run("retry", three_passes["completed"]["run_id"])
    with pytest.raises(CommandError, match=r"is pending and its job .* is ready: it goes on"):
        run("retry", three_passes["pending"]["run_id"])


def test_retry_resumes_a_running_pass_whose_job_was_cancelled_under_it():
    make_rows(500)
    started = start()
    seen = []

    def cancel_the_job_only(point):  # `xjobs cancel JOB_ID`: the pass cannot record it
        seen.append(point)
        if len(seen) == 2:
            call_command("xjobs", "cancel", started["job_id"], stdout=StringIO())

    faults.inject_hook("backfill:after-commit", cancel_the_job_only, times=None)
    work()
    faults.clear()
    orphan = pass_of(started)
    assert (orphan.status, orphan.rows_processed, job_of(started).state) == (
        "running", 200, "cancelled")

    run("retry", started["run_id"])
    work()

    assert (pass_of(started).status, pass_of(started).rows_processed) == ("completed", 500)
    assert hits() == [1] * 500


def test_retry_refuses_while_another_pass_of_the_backfill_is_live(three_passes):
    failed = three_passes["failed"]
    start("testapp.count_rows_once")  # a new live pass holds the backfill's key

    with pytest.raises(CommandError, match="holds its idempotency key"):
        run("retry", failed["run_id"])


def test_retry_of_a_pass_whose_job_was_purged_enqueues_it_under_its_run_id(three_passes):
    failed = three_passes["failed"]
    Job.objects.filter(pk=failed["job_id"]).delete()  # retention deleted the dead job
    assert "gone" in run("show", failed["run_id"])

    result = run_json("retry", failed["run_id"])
    work()

    assert result["job_id"] != failed["job_id"]
    new_job = Job.objects.get(pk=result["job_id"])
    assert str(new_job.run_id) == failed["run_id"]
    done = pass_of(failed)
    assert (done.status, done.rows_processed, str(done.job_id)) == (
        "completed", 300, result["job_id"])


def test_show_gives_progress_rate_and_eta():
    make_rows(1000)
    started = start()
    run_id = started["run_id"]
    # A pass halfway, as a worker left it: 400 rows in 40 seconds.
    Backfill.objects.filter(pk=run_id).update(status="running", rows_processed=400,
                                              last_cursor=400)
    now = get_engine().db_now()
    Backfill.objects.filter(pk=run_id).update(started_at=now - timedelta(seconds=40),
                                              updated_at=now)

    out = run("show", run_id)
    data = run_json("show", run_id)

    assert "rows_processed: 400" in out
    assert "total: 1,000 (40.0%)" in out
    assert "rate: 10 rows/s (average since the pass began)" in out
    assert "eta: 1m00s" in out
    progress = data["progress"]
    assert (progress["total"], progress["fraction"]) == (1000, 0.4)
    assert progress["rate"] == pytest.approx(10, rel=0.05)
    assert progress["eta"] == pytest.approx(60, rel=0.05)
    assert data["status"] == "running" and data["last_cursor"] == 400


def test_show_of_a_completed_pass_has_a_rate_and_no_eta(three_passes):
    data = run_json("show", three_passes["completed"]["run_id"])

    assert data["status"] == "completed" and data["rows_processed"] == 300
    assert data["progress"]["eta"] is None
    assert data["progress"]["fraction"] == 1.0


def test_show_of_a_failed_pass_prints_its_error_and_cursor(three_passes):
    out = run("show", three_passes["failed"]["run_id"])

    assert "status: failed" in out
    assert "last_cursor: " in out and "poisoned row" in out
    assert "(dead, attempt 1)" in out


def test_show_survives_a_total_hook_that_fails():
    from tests.testapp.jobs import count_rows

    started = start()
    hook = count_rows.total_hook
    count_rows.total_hook = lambda: 1 / 0
    try:
        out = run("show", started["run_id"])
    finally:
        count_rows.total_hook = hook

    assert "total: unavailable: ZeroDivisionError" in out


def test_a_throttle_comes_from_start_then_the_backfill_then_the_setting():
    from django_xjobs.backfills import BackfillDefinition
    from django_xjobs.backfills.passes import Pass
    from django_xjobs.context import JobContext

    ctx = JobContext(job_id="j", run_id="r", name="n", queue="q", attempt=1, max_attempts=1,
                     tenant_id=None, traceparent=None)
    plain = BackfillDefinition(func=lambda c, cur: None, name="t.plain")
    slow = BackfillDefinition(func=lambda c, cur: None, name="t.slow", throttle=0.25)
    with override_settings(XJOBS={"BACKFILL_THROTTLE": "50ms"}):
        assert Pass(plain, ctx, batch_size=None, throttle=None).throttle == 0.05
        assert Pass(slow, ctx, batch_size=None, throttle=None).throttle == 0.25
        assert Pass(slow, ctx, batch_size=None, throttle=0.0).throttle == 0.0
    assert Pass(plain, ctx, batch_size=None, throttle=None).throttle == 0.0
    assert Pass(plain, ctx, batch_size=7, throttle=None).batch_size == 7
