"""``ctx.progress`` (docs/observability.md, "Progress"): rate-limited, coalesced, fenced, and the
last values written before the run settles; the attempt history and the progress in
``manage.py xjobs show``.

The statements are counted from the engine's DEBUG log (engines/postgres/instrumentation.py),
one record per statement sent.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db.models.functions import Now

from django_xjobs import api, clock, job
from django_xjobs.context import MAX_PROGRESS_MESSAGE
from django_xjobs.engines import get_engine
from django_xjobs.exceptions import InvalidJobInput
from django_xjobs.models import Job
from django_xjobs.records import ATTEMPT_OUTCOMES, ProgressRecord
from django_xjobs.testing import drain, make_context, travel
from django_xjobs.testing.inline import WORKER_ID
from tests.conftest import wait_until
from tests.testapp import jobs as testapp_jobs

transactional = pytest.mark.django_db(transaction=True)


@pytest.fixture
def inline(settings):
    settings.XJOBS = {**settings.XJOBS, "TEST_MODE": "inline"}


@pytest.fixture
def progress_writes(caplog):
    """The job_progress_if_owned statements sent while the test runs (a list, read at the
    end)."""
    caplog.set_level(logging.DEBUG, logger="django_xjobs.engine")

    def count() -> int:
        return sum(1 for r in caplog.records
                   if r.name == "django_xjobs.engine" and r.args
                   and r.args[0] == "job_progress_if_owned")

    return count


class FakeMonotonic:
    """A monotonic clock the job itself moves forward (clock.override)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


TICKS = FakeMonotonic()


# Jobs of these tests only (registered in this process: the inline mode and drain run here).


@job(name="progress.ticking")
def ticking(ctx, calls=10, step=0.25):
    """Reports 0..calls-1, the clock moving ``step`` seconds before each report after the
    first."""
    for i in range(calls):
        if i:
            TICKS.now += step
        ctx.progress(i, calls - 1, f"item {i}")
    return {"calls": calls}


@job(name="progress.burst")
def burst(ctx, calls=500):
    """Reports ``calls`` times as fast as it can (far under a second)."""
    for i in range(1, calls + 1):
        ctx.progress(i, calls, f"row {i}")


@job(name="progress.async_burst")
async def async_burst(ctx, calls=200):
    for i in range(1, calls + 1):
        ctx.progress(i, calls)
        await asyncio.sleep(0)
    return {"calls": calls}


@job(name="progress.cancels_itself")
def cancels_itself(ctx):
    ctx.progress(1, 10, "before the cancel")
    TICKS.now += 5  # past the interval: the next report writes at once
    api.cancel(ctx.job_id, reason="from inside")
    ctx.progress(2, 10, "after the cancel")  # refused by the fence: this run lost its job
    TICKS.now += 5
    ctx.progress(3, 10, "after the refusal")  # not even sent
    return "finished anyway"


@job(name="progress.then_fails", max_attempts=1)
def then_fails(ctx):
    ctx.progress(1, 4)
    ctx.progress(3, 4, "almost")
    raise RuntimeError("failed at 3 of 4")


def stored(job_id) -> ProgressRecord | None:
    return api.get_job(job_id).progress


# ------------------------------------------------------------------------- rate and coalescing --


@transactional
def test_inline_writes_at_most_once_a_second_and_the_last_values_at_the_end(
        inline, progress_writes):
    with clock.override(monotonic=TICKS):
        handle = ticking.enqueue(calls=10, step=0.25)
    record = api.get_job(handle.id)
    assert record.state == "done"
    # Reports at 0, 0.25 ... 2.25 s: written at 0, 1.0 and 2.0 s, the held-back 2.25 s one when
    # the code returned, before the run settled (a write after it would be refused).
    assert progress_writes() == 4
    assert (record.progress.done, record.progress.total, record.progress.message) == (
        9, 9, "item 9")
    assert record.progress.fraction == 1.0


@transactional
def test_drain_with_worker_threads_keeps_the_last_of_many_quick_reports(progress_writes):
    handle = burst.enqueue(calls=500)
    assert drain()["done"] == 1
    # The first report at once, the rest held back and the newest written as the code ended.
    assert progress_writes() == 2
    progress = stored(handle.id)
    assert (progress.done, progress.total, progress.message) == (500, 500, "row 500")


@transactional
@pytest.mark.parametrize("mode", ["inline", "worker"])
def test_an_async_job_reports_without_blocking_and_keeps_its_last_values(settings, mode):
    if mode == "inline":
        settings.XJOBS = {**settings.XJOBS, "TEST_MODE": "inline"}
    handle = async_burst.enqueue(calls=200)
    if mode == "worker":
        assert drain()["done"] == 1  # on the worker's event loop
    record = api.get_job(handle.id)
    assert record.state == "done"
    assert (record.progress.done, record.progress.total) == (200, 200)


@transactional
def test_a_failed_run_keeps_the_progress_it_made(inline):
    handle = then_fails.enqueue()
    record = api.get_job(handle.id)
    assert record.state == "dead"
    assert (record.progress.done, record.progress.message) == (3, "almost")


def test_make_context_keeps_the_values_without_a_database():
    ctx = make_context()
    assert ctx.last_progress is None
    ctx.progress(3, 7, "three")
    ctx.progress(4)
    assert ctx.last_progress == (4.0, None, None)


# -------------------------------------------------------------------------------- the fence --


@transactional
def test_a_run_that_lost_its_job_cannot_write_progress(inline, progress_writes):
    with clock.override(monotonic=TICKS):
        handle = cancels_itself.enqueue()
    record = api.get_job(handle.id)
    assert record.state == "cancelled"
    # The first report landed; the one after the cancel was refused and nothing followed it
    # (neither the third report nor the end-of-run flush).
    assert record.progress.message == "before the cancel"
    assert progress_writes() == 2


@transactional
def test_the_progress_statement_is_fenced_on_the_lease_token():
    handle = testapp_jobs.record.enqueue(tag="fenced")
    engine = get_engine()
    first = engine.job_claim_if_due(str(handle.id), worker_id="w1", lease_ms=100)
    assert engine.job_progress_if_owned(first.claim, done=1, total=2, message="mine")
    # The lease lapses and another worker claims the job: the first run's writes are refused.
    wait_until(lambda: Job.objects.filter(pk=handle.id, visible_at__lt=Now()).exists(),
               message="the first run's lease to lapse")
    second = engine.jobs_claim(wants={"default": 1}, worker_id="w2", lease_ms=30_000)
    assert [c.id for c in second] == [str(handle.id)]
    assert not engine.job_progress_if_owned(first.claim, done=2, total=2, message="stale")
    assert engine.job_progress_if_owned(second[0].claim, done=0, total=2, message="fresh")
    assert stored(handle.id).message == "fresh"


# ------------------------------------------------------------------------------ bad values --


@pytest.mark.parametrize(("args", "words"), [
    ((True,), "must be a number"),
    (("3",), "must be a number"),
    ((None,), "must be a number"),
    ((-1,), "finite number >= 0"),
    ((math.nan,), "finite number >= 0"),
    ((math.inf,), "finite number >= 0"),
    ((10**400,), "finite number >= 0"),
    ((1, 0), "total must be > 0"),
    ((1, -5), "finite number >= 0"),
    ((1, False), "must be a number"),
    ((1, 2, 3), "message must be a string"),
    ((1, 2, "a\x00b"), "NUL"),
    ((1, 2, "\ud800"), "lone surrogate"),
])
def test_bad_values_are_clear_errors(args, words):
    ctx = make_context()
    with pytest.raises(InvalidJobInput, match=words):
        ctx.progress(*args)
    assert ctx.last_progress is None


def test_values_as_stored():
    ctx = make_context()
    ctx.progress(5, 2, "done may pass the total: the work grew")
    assert ctx.last_progress[:2] == (5.0, 2.0)
    ctx.progress(1.5, None, "x" * 500)
    message = ctx.last_progress[2]
    assert len(message) == MAX_PROGRESS_MESSAGE and message.endswith("...")
    ctx.progress(0, 1, "")
    assert ctx.last_progress == (0.0, 1.0, None)


# ------------------------------------------------------------------------------------- ETA --


def test_eta_at_the_pace_since_the_start():
    start = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
    at = start + timedelta(seconds=10)
    p = ProgressRecord(done=25, total=100, message=None, at=at)
    assert p.eta(start) == at + timedelta(seconds=30)
    assert p.fraction == 0.25
    assert ProgressRecord(done=120, total=100, message=None, at=at).eta(start) == at
    assert ProgressRecord(done=120, total=100, message=None, at=at).fraction == 1.0
    # No ETA without a total, before any progress, without a start, or from a report made
    # before this run started (a previous attempt's).
    assert ProgressRecord(done=25, total=None, message=None, at=at).eta(start) is None
    assert ProgressRecord(done=0, total=100, message=None, at=at).eta(start) is None
    assert p.eta(None) is None
    assert p.eta(at + timedelta(seconds=1)) is None


# --------------------------------------------------------------------------------- xjobs show --


def show(*args: str) -> str:
    out = StringIO()
    call_command("xjobs", *args, stdout=out)
    return out.getvalue()


@transactional
def test_xjobs_show_prints_the_attempt_timeline_of_a_job_that_failed_twice():
    handle = testapp_jobs.flaky.enqueue(fail_times=2)
    for _ in range(3):
        drain()
        travel(timedelta(seconds=60))
    record = api.get_job(handle.id)
    assert record.state == "done"
    assert [(a.attempt, a.outcome) for a in record.attempts] == [
        (1, "failed"), (2, "failed"), (3, "done")]
    assert all(a.outcome in ATTEMPT_OUTCOMES for a in record.attempts)

    text = show("show", str(handle.id))
    lines = text[text.index("attempts (3 kept):"):].splitlines()[1:4]
    assert [line.split()[:5] for line in lines] == [
        ["run", "1", "attempt", "1", "failed"], ["run", "2", "attempt", "2", "failed"],
        ["run", "3", "attempt", "3", "done"]]
    for line, entry in zip(lines, record.attempts, strict=True):
        assert entry.worker and entry.worker in line
    assert lines[0].endswith("RuntimeError: flaky failure on attempt 1")
    assert lines[1].endswith("RuntimeError: flaky failure on attempt 2")
    assert "flaky failure" not in lines[2]

    data = json.loads(show("show", str(handle.id), "--json"))
    assert [(a["run"], a["attempt"], a["outcome"]) for a in data["attempts"]] == [
        (1, 1, "failed"), (2, 2, "failed"), (3, 3, "done")]
    assert all(a["duration"] is not None and a["duration"] >= 0 for a in data["attempts"])
    assert "flaky failure on attempt 2" in data["attempts"][1]["error"]
    assert data["progress"] is None


def drained(handle, rounds: int):
    """The job once done: a round runs what is due, then moves the clock past its naps."""
    for _ in range(rounds):
        drain()
        if api.get_job(handle.id).state == "done":
            break
        travel(timedelta(seconds=1))
    record = api.get_job(handle.id)
    assert record.state == "done"
    return record


@transactional
def test_the_runs_of_a_job_that_suspends_are_numbered_apart_from_its_attempt():
    # A suspension spends no attempt: "#1 suspended, #1 suspended, #1 done" read as one run
    # shown three times. Each run has its number; the attempt stays 1.
    record = drained(testapp_jobs.many_naps.enqueue(naps=2), rounds=6)
    assert [(a.run, a.attempt, a.outcome) for a in record.attempts] == [
        (1, 1, "suspended"), (2, 1, "suspended"), (3, 1, "done")]
    text = show("show", str(record.id))
    lines = text[text.index("attempts (3 kept):"):].splitlines()[1:]
    assert [line.split()[:5] for line in lines] == [
        ["run", "1", "attempt", "1", "suspended"], ["run", "2", "attempt", "1", "suspended"],
        ["run", "3", "attempt", "1", "done"]]

    # Past the first and the newest 20, the runs between are not kept: the numbers after the
    # gap are unknown, and the timeline says where the gap is.
    record = drained(testapp_jobs.many_naps.enqueue(naps=25), rounds=30)
    runs = [a.run for a in record.attempts]
    assert len(runs) == 22 and runs[0] == 1 and set(runs[1:]) == {None}
    text = show("show", str(record.id))
    lines = text[text.index("attempts (22 kept):"):].splitlines()[1:4]
    assert lines[0].split()[:2] == ["run", "1"]
    assert lines[1] == "  ... runs not kept: only the first and the newest 20 are"
    assert lines[2].split()[:4] == ["run", "?", "attempt", "1"]


@transactional
def test_xjobs_show_prints_a_running_jobs_progress_with_an_eta():
    handle = testapp_jobs.record.enqueue(tag="shown")
    engine = get_engine()
    claimed = engine.job_claim_if_due(str(handle.id), worker_id="w-show", lease_ms=60_000)
    assert engine.job_progress_if_owned(claimed.claim, done=40, total=160, message="copying")

    text = show("show", str(handle.id))
    assert "progress: 40 of 160 (25.0%): copying, reported " in text
    eta_line = next(line for line in text.splitlines() if line.strip().startswith("eta:"))
    assert "(in " in eta_line or "(due now)" in eta_line

    data = json.loads(show("show", str(handle.id), "--json"))
    assert data["progress"]["done"] == 40 and data["progress"]["total"] == 160
    assert data["progress"]["fraction"] == 0.25
    assert data["progress"]["eta"] is not None
    assert data["progress"]["message"] == "copying"


@transactional
def test_inline_runs_are_in_the_attempt_history_as_inline(inline):
    handle = testapp_jobs.record.enqueue(tag="history")
    (entry,) = api.get_job(handle.id).attempts
    assert (entry.attempt, entry.outcome, entry.worker, entry.error) == (
        1, "done", WORKER_ID, None)
    assert entry.duration is not None and entry.duration >= 0


# -------------------------------------------------------------------------------- backfills --


@transactional
@pytest.mark.parametrize(("name", "total"), [
    ("testapp.count_rows", 250),  # with a total hook: a total, so an ETA while it runs
    ("testapp.count_rows_once", None),  # without one: rows only
])
def test_a_backfill_pass_reports_its_rows_as_the_jobs_progress(name, total):
    from tests.testapp.models import Counted

    Counted.objects.bulk_create([Counted() for _ in range(250)])
    out = StringIO()
    call_command("xjobs_backfill", "start", name, "--batch-size", "100", "--json", stdout=out)
    started = json.loads(out.getvalue())
    assert drain(queues=["backfills"])["done"] == 1
    progress = stored(started["job_id"])
    assert (progress.done, progress.total) == (250, total)
    assert progress.message == "250 rows, 3 batches this attempt"
