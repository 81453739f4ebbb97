"""The separate jobs database: XJOBS["DATABASE"] = "jobs", XJobsRouter, two real PostgreSQL
databases (the test databases of the "default" and "jobs" aliases, tests/settings.py).

x_outbox is on "default" beside the business data, the job tables on "jobs". The relay claims
on "default", enqueues on "jobs", marks on "default": a relay that fails between the jobs'
commit and the mark leaves the row pending with its job made, and the next relay finds that
job by id instead of making a second one. Subprocess relays that crash there are in
tests/acceptance/test_outbox_relay.py; the migrate routing runs on two fresh databases.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psycopg
import pytest
from django.conf import settings
from django.db import connections, transaction
from django.test import override_settings

from django_xjobs import enqueue_on_commit, faults
from django_xjobs.engines import get_engine
from django_xjobs.models import Job, OutboxEntry
from django_xjobs.routers import XJobsRouter
from django_xjobs.testing import drain
from tests.conftest import ROOT
from tests.integration.test_outbox import Boom, relay
from tests.testapp import jobs as testapp_jobs
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "jobs"])

record = testapp_jobs.record
ROUTER = "django_xjobs.routers.XJobsRouter"


@pytest.fixture(autouse=True)
def jobs_on_their_own_database():
    with override_settings(XJOBS={**settings.XJOBS, "DATABASE": "jobs"},
                           DATABASE_ROUTERS=[ROUTER]):
        yield
    faults.clear()


def jobs_in(alias: str) -> list:
    return list(Job.objects.using(alias).values_list("id", flat=True))


def test_the_router_sends_job_models_to_the_jobs_alias_and_the_outbox_to_the_app_alias():
    assert Job.objects.all().db == "jobs"
    assert OutboxEntry.objects.all().db == "default"
    router = XJobsRouter()
    assert router.allow_migrate("jobs", "django_xjobs", model_name="job") is True
    assert router.allow_migrate("default", "django_xjobs", model_name="job") is False
    assert router.allow_migrate("default", "django_xjobs", model_name="outboxentry") is True
    assert router.allow_migrate("jobs", "django_xjobs", model_name="outboxentry") is False
    # Operations that name no model (the autovacuum RunSQL) concern x_jobs.
    assert router.allow_migrate("jobs", "django_xjobs") is True
    assert router.allow_migrate("default", "django_xjobs") is False
    assert router.allow_migrate("default", "testapp", model_name="effect") is None
    assert router.db_for_read(Effect) is None


def test_a_committed_staging_becomes_one_job_on_the_jobs_database_and_runs_to_done():
    with transaction.atomic():
        Effect.objects.create(job_id="-", name="business", attempt=0, pid=0, kind="biz")
        staged = record.enqueue_on_commit(tag="two databases")
    assert OutboxEntry.objects.using("default").filter(id=staged.id).exists()
    assert relay() == 1
    assert jobs_in("jobs") == [staged.id]
    assert jobs_in("default") == []  # the x_jobs the test set-up made on "default" stays empty
    entry = OutboxEntry.objects.get(id=staged.id)
    assert entry.published_at is not None and entry.job_id == staged.id

    stats = drain()
    assert stats["done"] == 1
    assert Job.objects.get(id=staged.id).state == "done"
    assert Effect.objects.filter(kind="start", tag="two databases").count() == 1


def test_a_rolled_back_staging_never_reaches_the_jobs_database():
    with pytest.raises(Boom), transaction.atomic():
        record.enqueue_on_commit(tag="gone")
        raise Boom
    for _ in range(3):
        assert relay() == 0
    assert jobs_in("jobs") == [] and not OutboxEntry.objects.exists()


def test_a_relay_failing_between_enqueue_and_mark_is_deduplicated_while_the_job_is_live():
    staged = record.enqueue_on_commit(tag="live")
    faults.inject("before:outbox_mark_published", "raise")
    with pytest.raises(Exception, match="injected fault"):
        relay()
    # The jobs database committed, the outbox's did not: published, yet still pending.
    assert jobs_in("jobs") == [staged.id]
    assert Job.objects.get(id=staged.id).state == "ready"
    assert OutboxEntry.objects.get(id=staged.id).published_at is None

    assert relay() == 1  # publishes it again: finds the live job, makes none
    assert jobs_in("jobs") == [staged.id]
    assert OutboxEntry.objects.get(id=staged.id).job_id == staged.id
    assert relay() == 0


def test_the_dedup_also_holds_once_the_first_job_has_finished():
    staged = record.enqueue_on_commit(tag="finished first")
    faults.inject("before:outbox_mark_published", "raise")
    with pytest.raises(Exception, match="injected fault"):
        relay()
    assert drain(relay=False)["done"] == 1  # the job ran before its row was marked
    assert relay() == 1
    assert jobs_in("jobs") == [staged.id]
    assert Effect.objects.filter(kind="start", tag="finished first").count() == 1


def test_a_failure_between_enqueue_and_mark_with_a_key_relays_to_the_same_live_job():
    staged = record.using(idempotency_key="order:5").enqueue_on_commit(tag="keyed")
    faults.inject("before:outbox_mark_published", "raise")
    with pytest.raises(Exception, match="injected fault"):
        relay()
    assert relay() == 1
    assert jobs_in("jobs") == [staged.id]
    assert staged.job_id() == staged.id


def test_a_batch_mixing_published_and_fresh_rows_makes_only_the_fresh_ones():
    first = record.enqueue_on_commit(tag="1")
    faults.inject("before:outbox_mark_published", "raise")
    with pytest.raises(Exception, match="injected fault"):
        relay()
    second = record.enqueue_on_commit(tag="2")
    assert relay() == 2
    assert sorted(jobs_in("jobs")) == sorted([first.id, second.id])
    assert {e.id: e.job_id for e in OutboxEntry.objects.all()} == {
        first.id: first.id, second.id: second.id}


def test_stats_read_the_outbox_on_the_app_database():
    record.enqueue_on_commit(tag="pending")
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("xjobs", "--json", stdout=out)
    data = json.loads(out.getvalue())
    assert data["outbox"]["pending"] == 1
    assert data["outbox"]["databases"] == {
        "default": {"pending": 1, "oldest_pending_seconds": data["outbox"][
            "oldest_pending_seconds"]}}
    assert get_engine("jobs").outbox_pending() == (0, None)


def test_a_relay_reads_several_outbox_aliases():
    with override_settings(XJOBS={**settings.XJOBS, "DATABASE": "jobs",
                                  "OUTBOX": {"DATABASES": ["default", "jobs"]}}):
        on_default = record.enqueue_on_commit(tag="d")
        on_jobs = enqueue_on_commit("testapp.record", {"tag": "j"}, using="jobs")
        assert relay() == 2
        assert sorted(jobs_in("jobs")) == sorted([on_default.id, on_jobs.id])
        # On "jobs" the outbox shares the jobs' database: that row took the one-transaction path.
        assert OutboxEntry.objects.using("jobs").get(id=on_jobs.id).job_id == on_jobs.id


# ------------------------------------------------------------------------------- migrate --


def _admin_params() -> dict:
    s = connections["default"].settings_dict
    return {k: v for k, v in {"dbname": "postgres", "user": s["USER"], "host": s["HOST"],
                              "port": s["PORT"], "password": s["PASSWORD"]}.items() if v}


def _tables(dbname: str) -> set[str]:
    with psycopg.connect(**{**_admin_params(), "dbname": dbname}) as conn:
        return {r[0] for r in conn.execute(
            "select tablename from pg_tables where schemaname = 'public'")}


@pytest.fixture
def two_fresh_databases():
    base = connections["default"].settings_dict["NAME"]
    names = (f"{base}_outbox_migrate_app", f"{base}_outbox_migrate_jobs")
    with psycopg.connect(**_admin_params(), autocommit=True) as conn:
        for name in names:
            conn.execute(f'drop database if exists "{name}" with (force)')
            conn.execute(f'create database "{name}"')
    yield names
    with psycopg.connect(**_admin_params(), autocommit=True) as conn:
        for name in names:
            conn.execute(f'drop database if exists "{name}" with (force)')


def test_migrate_creates_each_table_only_where_the_router_puts_it(two_fresh_databases):
    app_db, jobs_db = two_fresh_databases
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT),
           "XJOBS_TEST_DB_NAME": app_db, "XJOBS_TEST_JOBS_DB_NAME": jobs_db,
           "XJOBS_TEST_ROUTERS": "1", "XJOBS_TEST_SETTINGS": json.dumps({"DATABASE": "jobs"})}
    for args in ([], ["--database", "jobs"]):
        done = subprocess.run([sys.executable, "-m", "django", "migrate", "-v", "0", *args],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
    job_tables = {"x_jobs", "x_job_steps", "x_job_events", "x_job_leases",
                  "x_scheduler_leader", "x_scheduler_state", "x_backfills"}
    app, jobs = _tables(app_db), _tables(jobs_db)
    assert "x_outbox" in app and not (job_tables & app)
    assert job_tables <= jobs and "x_outbox" not in jobs
    # Other apps are not the router's business: they migrate wherever migrate is told.
    assert "testapp_effect" in app
