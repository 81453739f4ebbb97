"""Retention (maintenance/pruner.py): only what is past its retention goes, in batches, and live
jobs are never touched."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from io import StringIO

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_xjobs import conf
from django_xjobs.engines import get_engine
from django_xjobs.maintenance import pruner
from django_xjobs.models import Job, JobEvent, JobLease, JobStep, OutboxEntry
from tests.conformance.conftest import make_row

pytestmark = pytest.mark.django_db

RETENTION = {"done": "1d", "cancelled": "2d", "dead": "7d"}


def settings_with(**overrides: object) -> conf.XJobsSettings:
    """Retention with finished jobs kept in x_jobs (ARCHIVE_AFTER: None), deleted row by row;
    the history tables' retention, a day at a time, is pinned by test_history.py."""
    return conf.build({**django_settings.XJOBS, "RETENTION": RETENTION,
                       "ARCHIVE_AFTER": None, **overrides})


def ago(**delta: float):
    return get_engine().db_now() - timedelta(**delta)


@pytest.fixture
def history():
    """Finished jobs on both sides of each state's retention, live jobs from long ago, and a
    step for every job."""
    engine = get_engine()
    rows = {
        "done_old": make_row(engine, state="done", finished_at=ago(days=1, hours=1)),
        "done_new": make_row(engine, state="done", finished_at=ago(hours=23)),
        "cancelled_old": make_row(engine, state="cancelled", finished_at=ago(days=3)),
        "cancelled_new": make_row(engine, state="cancelled", finished_at=ago(days=1)),
        "dead_old": make_row(engine, state="dead", finished_at=ago(days=8)),
        "dead_new": make_row(engine, state="dead", finished_at=ago(days=3)),
    }
    for state in ("ready", "delayed", "running", "suspended"):
        rows[state] = make_row(engine, state=state, run_at=ago(days=30))
    Job.objects.filter(id__in=[r.id for r in rows.values()]).update(created_at=ago(days=60))
    for row in rows.values():
        JobStep.objects.create(run_id=row.run_id, name="s", status="completed")
    return rows


def test_only_finished_jobs_past_their_states_retention_go_with_their_steps(history):
    report = pruner.run_once(settings=settings_with())

    assert dict(report.jobs) == {"done": 1, "cancelled": 1, "dead": 1}
    kept = {name for name, row in history.items() if Job.objects.filter(id=row.id).exists()}
    assert kept == {"done_new", "cancelled_new", "dead_new", "ready", "delayed", "running",
                    "suspended"}
    steps = set(JobStep.objects.values_list("run_id", flat=True))
    assert steps == {history[name].run_id for name in kept}


def test_live_jobs_are_untouched_even_with_a_zero_retention(history):
    pruner.run_once(settings=settings_with(RETENTION={"done": 0, "cancelled": 0, "dead": 0}))

    remaining = dict(Job.objects.values_list("id", "state"))
    assert sorted(remaining.values()) == ["delayed", "ready", "running", "suspended"]
    assert all(Job.objects.filter(id=history[s].id, state=s).exists()
               for s in ("ready", "delayed", "running", "suspended"))


def test_every_delete_runs_in_batches_of_the_configured_size():
    engine = get_engine()
    for i in range(7):
        make_row(engine, state="done", finished_at=ago(days=2, minutes=i))
    for i in range(5):
        JobEvent.objects.create(name="e", expires_at=ago(minutes=i + 1))

    with CaptureQueriesContext(connection) as ctx:
        report = pruner.run_once(settings=settings_with(MAINTENANCE_BATCH=3))

    batches = [q["sql"].split("*/")[0] for q in ctx.captured_queries if "purge" in q["sql"]]
    assert report.jobs["done"] == 7 and report.events == 5
    assert batches.count("/* jobs_purge ") == 3 + 1 + 1  # done 3+3+1, then one each for the
    assert batches.count("/* events_purge ") == 2  # other states; events 3+2


def test_outbox_rows_go_after_the_outbox_retention_and_pending_ones_never():
    old = OutboxEntry.objects.create(id=uuid.uuid4(), job="testapp.noop",
                                     published_at=ago(days=2))
    recent = OutboxEntry.objects.create(id=uuid.uuid4(), job="testapp.noop",
                                        published_at=ago(hours=2))
    pending = OutboxEntry.objects.create(id=uuid.uuid4(), job="testapp.noop")

    report = pruner.run_once(settings=settings_with(OUTBOX_RETENTION="1d"))

    assert report.outbox == 1
    assert set(OutboxEntry.objects.values_list("id", flat=True)) == {recent.id, pending.id}
    assert not OutboxEntry.objects.filter(id=old.id).exists()


def test_expired_slots_go_after_the_grace_and_live_ones_stay():
    stale = JobLease.objects.create(lease_key="k", slot=0, holder="w", expires_at=ago(minutes=5))
    lapsing = JobLease.objects.create(lease_key="k", slot=1, holder="w",
                                      expires_at=ago(seconds=10))
    live = JobLease.objects.create(lease_key="k", slot=2, holder="w",
                                   expires_at=ago(seconds=-30))

    report = pruner.run_once(settings=settings_with(SLOT_PURGE_GRACE="1m"))

    assert report.slots == 1
    assert set(JobLease.objects.values_list("id", flat=True)) == {lapsing.id, live.id}
    assert not JobLease.objects.filter(id=stale.id).exists()


def test_a_run_that_loses_the_leadership_stops_between_deletes(history):
    answers = iter([True, False])

    report = pruner.run_once(settings=settings_with(), keep_going=lambda: next(answers))

    assert report.stopped and dict(report.jobs) == {"cancelled": 1}  # states run sorted
    assert Job.objects.filter(id=history["dead_old"].id).exists()


def test_manage_py_xjobs_maintenance_runs_it_once_and_reports(history):
    out = StringIO()
    with override_settings(XJOBS={**django_settings.XJOBS, "RETENTION": RETENTION,
                                  "ARCHIVE_AFTER": None}):
        call_command("xjobs", "maintenance", "--json", stdout=out)
        text = StringIO()
        call_command("xjobs", "maintenance", stdout=text)

    assert json.loads(out.getvalue()) == {
        "jobs": {"cancelled": 1, "dead": 1, "done": 1}, "archived": 0,
        "history_tables_dropped": [], "events": 0, "outbox": 0, "slots": 0}
    assert text.getvalue().startswith("maintenance: archived 0 finished jobs; deleted jobs: 0")
