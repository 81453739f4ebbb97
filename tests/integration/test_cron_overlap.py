"""Cron overlap (docs/scheduling.md, "Overlap") on PostgreSQL: each policy in the scheduler
round, driven by a fake wall clock, with runs claimed and settled through the engine as a
worker would; the trigger that releases a buffered run, and jobs_unblock as its safety net.
The same policies under two real competing schedulers: tests/acceptance/test_cron_overlap_fleet.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from io import StringIO

import pytest
from django.conf import settings
from django.core import checks
from django.core.management import call_command
from django.db import connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_xjobs import api, clock, conf, registry
from django_xjobs import scheduler as scheduler_api
from django_xjobs.engines import get_engine
from django_xjobs.engines.postgres.statements.scheduler import CRON_RUNS_LIVE, CRON_RUNS_LOCK_LIVE
from django_xjobs.models import Job, SchedulerState
from django_xjobs.records import ClaimedJob, Completion, Failure, Fence
from django_xjobs.scheduler import cron
from django_xjobs.scheduler.schedule import Task, configured
from django_xjobs.worker.flow import claim_flow

from .test_scheduler_round import FakeClock, key_of, scheduler, utc, watermark

pytestmark = pytest.mark.django_db(transaction=True)

LIVE = ("ready", "delayed", "running", "suspended", "blocked")


@pytest.fixture
def fake_clock() -> Iterator[FakeClock]:
    fake = FakeClock(datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC))
    with clock.override(now=fake):
        yield fake


def runs(name: str = "t") -> list[Job]:
    return list(Job.objects.filter(enqueued_by=f"cron:{name}").order_by("idempotency_key"))


def live(name: str = "t") -> list[Job]:
    return [j for j in runs(name) if j.state in LIVE]


def claim() -> list[ClaimedJob]:
    flow = claim_flow(conf.get(), registry.all_jobs().values(), ["default"])
    return list(get_engine().jobs_claim(wants={"default": 10}, worker_id="w-overlap",
                                        lease_ms=60_000, flow=flow))


def claim_one() -> ClaimedJob:
    claimed = claim()
    assert len(claimed) == 1, claimed
    return claimed[0]


def ack(job: ClaimedJob) -> Fence:
    report = get_engine().jobs_complete_if_owned([Completion(claim=job.claim, result_json=None)])
    return report.outcome(job.lease_token)


def ack_unseen_by_the_trigger(job: ClaimedJob) -> None:
    """Finish ``job`` with the buffer_one trigger switched off: a release it missed."""
    with connection.cursor() as cur:
        cur.execute("alter table x_jobs disable trigger x_jobs_cron_overlap")
        try:
            assert ack(job) is Fence.OWNED
        finally:
            cur.execute("alter table x_jobs enable trigger x_jobs_cron_overlap")


def nack(job: ClaimedJob, *, delay_ms: int = 0, permanent: bool = False) -> Fence:
    report, _ = get_engine().job_fail_if_owned(Failure(
        claim=job.claim, error="boom", retry_delay_ms=delay_ms, permanent=permanent))
    return report.outcome(job.lease_token)


def skipped(name: str = "t") -> tuple[int, object]:
    row = SchedulerState.objects.get(task_name=name)
    return row.overlap_skipped, row.overlap_skipped_at


def task(name: str, *, overlap: str, misfire: str = "latest") -> Task:
    return Task(name=name, job="testapp.noop", schedule=cron.parse("* * * * *"),
                misfire=misfire, overlap=overlap)


def start(fake_clock, policy: str, **options):
    """A task ``t`` firing every minute under ``policy``; its first round records the
    watermark (a new task starts from now)."""
    s = scheduler(task("t", overlap=policy, **options))
    s.round()
    return s


def next_minute(s, fake_clock):
    fake_clock.advance(minutes=1)
    return s.round()


# ------------------------------------------------------------------------------- skip --


def test_skip_enqueues_nothing_while_a_run_is_live_and_counts_the_skip(fake_clock):
    s = start(fake_clock, "skip")
    first = next_minute(s, fake_clock)  # 12:01
    assert first.fired == {"t": [utc(2026, 1, 1, 12, 1)]}

    running = claim_one()
    second = next_minute(s, fake_clock)  # 12:02, while 12:01 runs
    third = next_minute(s, fake_clock)  # 12:03

    assert (second.fired, second.skipped) == ({}, {"t": [utc(2026, 1, 1, 12, 2)]})
    assert third.skipped == {"t": [utc(2026, 1, 1, 12, 3)]}
    assert [j.idempotency_key for j in runs()] == [key_of("t", utc(2026, 1, 1, 12, 1))]
    assert watermark() == fake_clock.now, "the watermark moves on: a skip is never fired later"
    assert skipped() == (2, utc(2026, 1, 1, 12, 3))

    assert ack(running) is Fence.OWNED
    fourth = next_minute(s, fake_clock)  # nothing live: fires again
    assert fourth.fired == {"t": [utc(2026, 1, 1, 12, 4)]}
    assert len(live()) == 1


def test_skip_counts_a_run_waiting_for_its_retry_as_live(fake_clock):
    s = start(fake_clock, "skip")
    next_minute(s, fake_clock)
    assert nack(claim_one(), delay_ms=3_600_000) is Fence.OWNED  # delayed, an hour away

    assert next_minute(s, fake_clock).fired == {}
    assert [j.state for j in runs()] == ["delayed"]


def test_skip_with_several_occurrences_in_one_round_enqueues_the_first(fake_clock):
    s = start(fake_clock, "skip", misfire="all")
    fake_clock.advance(minutes=3)  # a 3-minute downtime, misfire "all": 3 occurrences
    report = s.round()

    assert report.fired == {"t": [utc(2026, 1, 1, 12, 1)]}
    assert report.skipped == {"t": [utc(2026, 1, 1, 12, 2), utc(2026, 1, 1, 12, 3)]}
    assert len(runs()) == 1


# ------------------------------------------------------------------------- buffer_one --


def test_buffer_one_holds_one_run_behind_the_live_one_and_drops_the_rest(fake_clock):
    s = start(fake_clock, "buffer_one")
    next_minute(s, fake_clock)  # 12:01
    running = claim_one()

    second = next_minute(s, fake_clock)  # 12:02: waits behind 12:01
    third = next_minute(s, fake_clock)  # 12:03: one waits already, dropped

    assert second.held == {"t": [utc(2026, 1, 1, 12, 2)]}
    assert (third.fired, third.skipped) == ({}, {"t": [utc(2026, 1, 1, 12, 3)]})
    assert [(j.state, j.blocked_on) for j in runs()] == [("running", None),
                                                         ("blocked", "cron:t")]
    assert claim() == [], "a worker never claims the buffered run while the first is live"
    assert skipped() == (1, utc(2026, 1, 1, 12, 3))

    # The first run finishes: the trigger releases the buffered one in that transaction.
    assert ack(running) is Fence.OWNED
    waiting = runs()[1]
    assert (waiting.state, waiting.blocked_on) == ("ready", None)
    assert claim_one().id == str(waiting.id)


def test_buffer_one_waits_for_the_retries_of_the_live_run_not_only_its_attempt(fake_clock):
    s = start(fake_clock, "buffer_one")
    next_minute(s, fake_clock)
    assert nack(claim_one()) is Fence.OWNED  # failed, due again now (attempt 1 of 3)
    next_minute(s, fake_clock)  # buffered behind the retrying run

    retried = claim_one()  # only the retry is claimable
    assert [j.state for j in runs()] == ["running", "blocked"]
    assert nack(retried, permanent=True) is Fence.OWNED  # dead: finished, the buffer goes

    assert [j.state for j in runs()] == ["dead", "ready"]


def test_buffer_one_releases_when_the_live_run_is_cancelled(fake_clock):
    s = start(fake_clock, "buffer_one")
    next_minute(s, fake_clock)
    next_minute(s, fake_clock)
    first, buffered = runs()
    assert buffered.state == "blocked"

    api.cancel(first.id, reason="by hand")

    assert Job.objects.get(pk=buffered.pk).state == "ready"


def test_buffer_one_with_several_occurrences_in_one_round_fires_one_and_buffers_one(
        fake_clock):
    s = start(fake_clock, "buffer_one", misfire="all")
    fake_clock.advance(minutes=3)
    report = s.round()

    assert report.fired == {"t": [utc(2026, 1, 1, 12, 1), utc(2026, 1, 1, 12, 2)]}
    assert report.held == {"t": [utc(2026, 1, 1, 12, 2)]}
    assert report.skipped == {"t": [utc(2026, 1, 1, 12, 3)]}
    assert [j.state for j in runs()] == ["ready", "blocked"]


def test_jobs_unblock_releases_a_buffered_run_only_once_no_other_run_is_live(fake_clock):
    s = start(fake_clock, "buffer_one")
    next_minute(s, fake_clock)
    running = claim_one()
    next_minute(s, fake_clock)
    flow = claim_flow(conf.get(), registry.all_jobs().values(), ["default"])

    assert get_engine().jobs_unblock(flow) == 0, "the first run is live: the buffer stays"
    # A finish the trigger did not see (here: the trigger is switched off for it).
    ack_unseen_by_the_trigger(running)
    assert [j.state for j in runs()] == ["done", "blocked"]

    assert get_engine().jobs_unblock(flow) == 1
    assert [j.state for j in runs()] == ["done", "ready"]


def test_a_round_that_finds_a_buffered_run_alone_releases_it_before_the_next_occurrence(
        fake_clock):
    """The trigger's release missed (two runs finishing at once each saw the other live): the
    next round runs the older, buffered occurrence first and buffers the new one behind it."""
    s = start(fake_clock, "buffer_one")
    next_minute(s, fake_clock)  # 12:01
    running = claim_one()
    next_minute(s, fake_clock)  # 12:02, buffered
    ack_unseen_by_the_trigger(running)
    assert [j.state for j in runs()] == ["done", "blocked"]

    report = next_minute(s, fake_clock)  # 12:03

    assert report.held == {"t": [utc(2026, 1, 1, 12, 3)]}
    assert [(j.state, j.blocked_on) for j in runs()] == [
        ("done", None), ("ready", None), ("blocked", "cron:t")]
    assert claim_one().id == str(runs()[1].id)  # 12:02 runs first


# -------------------------------------------------------------------- cancel_previous --


def test_cancel_previous_cancels_the_running_run_and_its_late_ack_changes_nothing(fake_clock):
    s = start(fake_clock, "cancel_previous")
    next_minute(s, fake_clock)
    running = claim_one()

    report = next_minute(s, fake_clock)  # 12:02

    assert report.fired == {"t": [utc(2026, 1, 1, 12, 2)]}
    assert report.cancelled == {"t": 1}
    first, second = runs()
    assert (first.state, first.lease_token, second.state) == ("cancelled", None, "ready")
    assert "superseded by its occurrence at 2026-01-01T12:02:00+00:00" in first.last_error
    assert first.attempts[-1]["outcome"] == "cancelled"
    # The cancelled run's worker learns at its heartbeat; its late ack reads as lost.
    assert get_engine().jobs_renew_if_owned([running.claim], 60_000).held == frozenset()
    assert ack(running) is Fence.LOST
    assert Job.objects.get(pk=first.pk).state == "cancelled"
    assert len(live()) == 1


def test_cancel_previous_cancels_the_child_jobs_of_the_run_it_cancels(fake_clock):
    s = start(fake_clock, "cancel_previous")
    next_minute(s, fake_clock)
    parent = runs()[0]
    # A durable run waiting for a child it invoked (docs/durable.md, "Child jobs").
    child = api.enqueue("testapp.noop", {}, idempotency_key="child")
    Job.objects.filter(pk=child.id).update(parent_id=parent.id, parent_step="invoke")
    Job.objects.filter(pk=parent.id).update(state="suspended")

    next_minute(s, fake_clock)

    assert Job.objects.get(pk=child.id).state == "cancelled"
    assert Job.objects.get(pk=parent.id).state == "cancelled"
    assert [j.state for j in live()] == ["ready"]


def test_cancel_previous_cancels_every_live_run_and_fires_only_the_newest(fake_clock):
    s = start(fake_clock, "cancel_previous", misfire="all")
    # A run of the task from outside the round (`xjobs schedule trigger` enqueues it so).
    api.enqueue("testapp.noop", {}, idempotency_key="by-hand", enqueued_by="cron:t")
    fake_clock.advance(minutes=3)
    report = s.round()

    assert report.fired == {"t": [utc(2026, 1, 1, 12, 3)]}
    assert report.skipped == {"t": [utc(2026, 1, 1, 12, 1), utc(2026, 1, 1, 12, 2)]}
    assert [(j.idempotency_key, j.state) for j in live()] == [
        (key_of("t", utc(2026, 1, 1, 12, 3)), "ready")]


# -------------------------------------------------------------------------------- allow --


def test_allow_fires_beside_live_runs_as_before(fake_clock):
    s = start(fake_clock, "allow")
    next_minute(s, fake_clock)
    claim_one()
    report = next_minute(s, fake_clock)

    assert report.fired == {"t": [utc(2026, 1, 1, 12, 2)]}
    assert (report.skipped, report.held, report.cancelled) == ({}, {}, {})
    assert [j.state for j in runs()] == ["running", "ready"]


def test_allow_sends_no_statement_of_its_own(fake_clock):
    s = start(fake_clock, "allow")
    fake_clock.advance(minutes=1)
    with CaptureQueriesContext(connection) as captured:
        report = s.round()

    assert report.fired == {"t": [utc(2026, 1, 1, 12, 1)]}
    assert not [q for q in captured.captured_queries if "enqueued_by like" in q["sql"]]


# ------------------------------------------------------------------ operators, settings --


def test_the_schedule_command_shows_the_policy_and_the_skips(fake_clock):
    with override_settings(XJOBS={**settings.XJOBS, "SCHEDULE": {
            "t": {"job": "testapp.noop", "cron": "* * * * *", "overlap": "skip"}}}):
        s = scheduler(*configured().values())
        s.round()
        next_minute(s, fake_clock)
        next_minute(s, fake_clock)  # the 12:01 run is still ready: 12:02 is skipped

        info = next(t for t in scheduler_api.describe().tasks if t.name == "t")
        out = StringIO()
        call_command("xjobs", "schedule", stdout=out)

    assert (info.overlap, info.overlap_skipped) == ("skip", 1)
    assert info.overlap_skipped_at == utc(2026, 1, 1, 12, 2)
    assert "skipped (last)" in out.getvalue()
    assert "1 (2026-01-01T12:02:00+00:00)" in out.getvalue()


@pytest.mark.parametrize(("overlap", "fragment"), [
    ("skip_all", "must be one of 'allow', 'skip', 'buffer_one', 'cancel_previous'"),
    (2, "got int 2"),
])
def test_a_bad_overlap_in_the_schedule_stops_start_up(overlap, fragment):
    schedule = {"nightly": {"job": "testapp.noop", "cron": "0 3 * * *", "overlap": overlap}}
    with override_settings(XJOBS={**settings.XJOBS, "SCHEDULE": schedule}):
        found = [m for m in checks.run_checks(tags=["django_xjobs"])
                 if m.id.startswith("xjobs.")]

    assert [m.id for m in found] == ["xjobs.E001"]
    assert fragment in found[0].msg and "'nightly'" in found[0].msg


# ------------------------------------------------------------------------------- plans --


def test_the_live_runs_of_a_task_are_read_through_the_cron_index(fake_clock):
    """The statements repeat x_jobs_cron_live_idx's predicate, so the planner can use it: a
    probe per task, not a walk of the queue's backlog (at 1,000,000 rows the read costs a
    handful of buffers, docs/scheduling.md, "What each policy costs")."""
    for statement in (CRON_RUNS_LIVE, CRON_RUNS_LOCK_LIVE):
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute("set local enable_seqscan = off")
            cur.execute("explain " + statement.sql, {"enqueued_by": ["cron:t"]})
            plan = "\n".join(r[0] for r in cur.fetchall())
        assert "x_jobs_cron_live_idx" in plan, (statement.name, plan)


def test_why_says_a_buffered_run_waits_behind_the_live_one(fake_clock):
    s = start(fake_clock, "buffer_one")
    next_minute(s, fake_clock)
    next_minute(s, fake_clock)
    buffered = runs()[1]
    out = StringIO()
    call_command("xjobs", "why", str(buffered.id), stdout=out)

    assert "waits behind the live run of cron task t (overlap=buffer_one)" in out.getvalue()
