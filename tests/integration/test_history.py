"""History tables (docs/design.md, "History tables"): finished jobs move out of x_jobs into a
table per finished state and UTC day, every reader still finds them, the worker's statements
never touch them, and retention drops a day in one statement, whatever it holds."""

from __future__ import annotations

import io
import json
import re
import time
import uuid
from datetime import UTC, timedelta

import psycopg
import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_xjobs import api, conf
from django_xjobs.engines import get_engine
from django_xjobs.exceptions import LiveJobExists
from django_xjobs.maintenance import pruner
from django_xjobs.models import Job, JobStep
from django_xjobs.records import Completion, RunOwner
from tests.conformance.conftest import claim, claim_one, enqueue, make_row

pytestmark = pytest.mark.django_db


def settings_with(**overrides: object) -> conf.XJobsSettings:
    return conf.build({**django_settings.XJOBS, **overrides})


def table_of(job_id) -> str:
    with connection.cursor() as cursor:
        cursor.execute("select tableoid::regclass::text from x_jobs where id = %s", [job_id])
        rows = cursor.fetchall()
    assert len(rows) == 1, f"job {job_id} is in {len(rows)} tables"
    return rows[0][0]


def steps_table_of(run_id) -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("select distinct tableoid::regclass::text from x_job_steps"
                       " where run_id = %s", [run_id])
        return {r[0] for r in cursor.fetchall()}


def history_tables() -> list[str]:
    return sorted(t.table for t in get_engine().history_tables())


def statements(ctx: CaptureQueriesContext, name: str) -> int:
    return sum(f"/* {name} */" in q["sql"] for q in ctx.captured_queries)


def finish(engine, n: int = 1, **kwargs) -> list[str]:
    """n jobs enqueued, claimed and acknowledged through the engine: done, as a worker leaves
    them."""
    for _ in range(n):
        enqueue(engine, **kwargs)
    claimed = claim(engine, n=n)
    engine.jobs_complete_if_owned([Completion(claim=c.claim, result_json='{"ok": 1}')
                                   for c in claimed])
    return [c.id for c in claimed]


def day_name(state: str, when) -> str:
    return f"x_jobs_{state}_{when.astimezone(UTC).strftime('%Y%m%d')}"


# ----------------------------------------------------------------------------- the move --


def test_archive_moves_finished_jobs_and_their_steps_into_the_table_of_their_state_and_day():
    engine = get_engine()
    now = engine.db_now()
    old = make_row(engine, state="done", finished_at=now - timedelta(days=2))
    dead = make_row(engine, state="dead", finished_at=now - timedelta(hours=1))
    recent = make_row(engine, state="done", finished_at=now)
    live = [make_row(engine, state=s) for s in ("ready", "delayed", "running", "suspended")]
    for row in (old, dead, recent, *live):
        JobStep.objects.create(run_id=row.run_id, name="s1", status="completed")

    moved = pruner.archive(settings=settings_with(ARCHIVE_AFTER="1m"))

    assert moved == 2
    assert table_of(old.id) == day_name("done", old.finished_at)
    assert table_of(dead.id) == day_name("dead", dead.finished_at)
    assert steps_table_of(old.run_id) == {table_of(old.id).replace("x_jobs_", "x_job_steps_")}
    assert table_of(recent.id) == "x_jobs"
    assert all(table_of(row.id) == "x_jobs" for row in live)
    assert all(steps_table_of(row.run_id) == {"x_job_steps"} for row in (recent, *live))
    # Nothing lost, nothing doubled: every id once, every column as it was.
    assert Job.objects.count() == 7
    assert Job.objects.get(id=old.id).finished_at == old.finished_at
    assert pruner.archive(settings=settings_with(ARCHIVE_AFTER="1m")) == 0


def test_archive_goes_in_bounded_batches_and_archive_after_none_keeps_every_row():
    engine = get_engine()
    now = engine.db_now()
    for i in range(7):
        make_row(engine, state="done", finished_at=now - timedelta(minutes=5, seconds=i))

    assert pruner.archive(settings=settings_with(ARCHIVE_AFTER=None)) == 0
    with CaptureQueriesContext(connection) as ctx:
        moved = pruner.archive(settings=settings_with(ARCHIVE_AFTER="1m"), batch_size=3)

    assert moved == 7
    assert statements(ctx, "jobs_archive") == 3 + 1 + 1 + 1  # 3 + 3 + 1, then 0; dead; cancelled
    assert Job.objects.count() == 7


def finished_index_entries_read() -> int:
    """The entries of x_jobs_finished_idx this transaction's scans have read, dead or not."""
    with connection.cursor() as cursor:
        cursor.execute("select pg_stat_get_xact_tuples_returned('x_jobs_finished_idx'::regclass)")
        return cursor.fetchone()[0]


def test_an_archive_pass_starts_where_the_last_complete_one_ended():
    """Each job moved leaves a dead entry at the head of the index the archive scans, which no
    vacuum removes while a long transaction holds the horizon (here: this test's own, whose
    deletes are not committed). A pass with floors starts past them; one without reads them."""
    engine = get_engine()
    now = engine.db_now()
    settings = settings_with(ARCHIVE_AFTER="10s")
    for i in range(300):
        make_row(engine, state="done", finished_at=now - timedelta(minutes=5, seconds=i))
    floors: dict = {}
    assert pruner.archive(settings=settings, now=now, floors=floors) == 300
    assert floors == {state: now - timedelta(seconds=10) - pruner.ARCHIVE_FLOOR_SLACK
                      for state in ("done", "dead", "cancelled")}
    later = [make_row(engine, state="done", finished_at=now - timedelta(seconds=i))
             for i in range(1, 6)]

    before = finished_index_entries_read()
    assert pruner.archive(settings=settings, now=now + timedelta(seconds=10), floors=floors) == 5
    floored = finished_index_entries_read() - before
    assert all(table_of(row.id).startswith("x_jobs_done_") for row in later)
    for i in range(1, 6):
        make_row(engine, state="done", finished_at=now + timedelta(seconds=i))
    before = finished_index_entries_read()
    assert pruner.archive(settings=settings, now=now + timedelta(seconds=20)) == 5
    unfloored = finished_index_entries_read() - before

    assert floored < 50, floored
    assert unfloored >= 305, unfloored  # the 300 moved first and the 5 moved second


def test_a_job_finished_behind_the_floor_waits_for_the_pass_without_floors():
    """A job finished by a transaction that stayed open past the floor (its finished_at is its
    transaction's start) is below the floor when it commits: the floored passes leave it, the
    maintenance's full run (every interval) moves it, and sets the floors again."""
    engine = get_engine()
    now = engine.db_now()
    settings = settings_with(ARCHIVE_AFTER="10s")
    floors = {state: now - timedelta(seconds=5) for state in ("done", "dead", "cancelled")}
    late = make_row(engine, state="done", finished_at=now - timedelta(minutes=1))

    assert pruner.archive(settings=settings, now=now, floors=floors) == 0
    assert table_of(late.id) == "x_jobs"
    report = pruner.run_once(settings=settings, archive_floors=floors)

    assert report.archived == 1
    assert table_of(late.id) == day_name("done", late.finished_at)
    assert floors == {state: now - timedelta(seconds=10) - pruner.ARCHIVE_FLOOR_SLACK
                      for state in ("done", "dead", "cancelled")}


def test_a_run_id_another_job_still_has_keeps_its_steps_in_x_job_steps():
    """A resumed backfill pass is a new job with the old pass's run id: archiving the old one
    must not take the steps the new one reads."""
    engine = get_engine()
    now = engine.db_now()
    first = make_row(engine, state="dead", finished_at=now - timedelta(hours=1))
    resumed = make_row(engine, state="ready", run_id=first.run_id)
    JobStep.objects.create(run_id=first.run_id, name="batch-1", status="completed")

    pruner.archive(settings=settings_with(ARCHIVE_AFTER="1m"))

    assert table_of(first.id).startswith("x_jobs_dead_")
    assert table_of(resumed.id) == "x_jobs"
    assert steps_table_of(first.run_id) == {"x_job_steps"}


# -------------------------------------------------------------------------- the readers --


def test_an_archived_job_is_found_by_id_run_id_and_key_by_every_reader():
    engine = get_engine()
    [job_id] = finish(engine, key="invoice-7")
    Job.objects.filter(id=job_id).update(finished_at=engine.db_now() - timedelta(hours=1))
    pruner.archive(settings=settings_with(ARCHIVE_AFTER="1m"))
    assert table_of(job_id).startswith("x_jobs_done_")
    record = engine.job_get(job_id)

    assert record is not None and record.state == "done" and record.result == {"ok": 1}
    assert api.get_job(job_id).state == "done"
    assert Job.objects.get(run_id=record.run_id).id == record.id
    assert [str(j.id) for j in Job.objects.filter(idempotency_key="invoice-7")] == [job_id]
    handle = api.JobHandle(id=record.id, run_id=record.run_id, created=True)
    assert handle.wait(timeout=1).state == "done"


def test_the_console_and_the_cli_find_an_archived_job_by_id_run_id_and_key(admin_client):
    from django.core.management import call_command
    from django.urls import reverse

    from tests.integration.test_console_admin import ids_listed
    from tests.testapp import jobs as testapp_jobs

    engine = get_engine()
    handle = testapp_jobs.record.using(idempotency_key="charge:42").enqueue()
    [claimed] = claim(engine)
    engine.jobs_complete_if_owned([Completion(claim=claimed.claim, result_json=None)])
    Job.objects.filter(id=handle.id).update(finished_at=engine.db_now() - timedelta(hours=1))
    pruner.archive(settings=settings_with(ARCHIVE_AFTER="1m"))
    assert table_of(handle.id).startswith("x_jobs_done_")
    jobs = reverse("admin:django_xjobs_job_changelist")

    for term in (handle.id, handle.run_id, "charge:42"):
        assert ids_listed(admin_client.get(jobs, {"q": str(term)})) == {str(handle.id)}, term
    assert ids_listed(admin_client.get(jobs, {"state": "done"})) == {str(handle.id)}
    page = admin_client.get(reverse("admin:django_xjobs_job_change", args=[handle.id]))
    assert page.status_code == 200 and "charge:42" in page.content.decode()
    out = io.StringIO()
    call_command("xjobs", "show", str(handle.id), "--json", stdout=out)
    assert json.loads(out.getvalue())["state"] == "done"
    health = io.StringIO()
    call_command("xjobs", "health", stdout=health)
    assert table_of(handle.id) in health.getvalue()


def test_the_key_of_an_archived_job_is_free_and_its_retry_is_refused_while_another_holds_it():
    engine = get_engine()
    now = engine.db_now()
    dead = make_row(engine, state="dead", idempotency_key="nightly",
                    finished_at=now - timedelta(hours=1))
    pruner.archive(settings=settings_with(ARCHIVE_AFTER="1m"))
    live = enqueue(engine, key="nightly")
    assert live.created  # one LIVE job per key: the archived one is not live

    with pytest.raises(LiveJobExists) as refused:
        engine.job_retry(str(dead.id))

    assert refused.value.live_job_id == str(live.id)
    assert table_of(dead.id).startswith("x_jobs_dead_")  # the move back was undone too
    assert engine.job_get(str(dead.id)).state == "dead"


def test_retry_brings_an_archived_job_and_its_steps_back_and_a_worker_claims_it():
    engine = get_engine()
    dead = make_row(engine, state="dead", finished_at=engine.db_now() - timedelta(hours=1))
    JobStep.objects.create(run_id=dead.run_id, name="charge", status="completed")
    pruner.archive(settings=settings_with(ARCHIVE_AFTER="1m"))

    assert engine.job_retry(str(dead.id)).changed

    assert table_of(dead.id) == "x_jobs"
    assert steps_table_of(dead.run_id) == {"x_job_steps"}
    job = claim_one(engine)
    assert (job.id, job.run_id) == (str(dead.id), str(dead.run_id))


def test_cancel_of_an_archived_dead_job_moves_it_back_then_the_archive_files_it_as_cancelled():
    engine = get_engine()
    dead = make_row(engine, state="dead", finished_at=engine.db_now() - timedelta(hours=1))
    pruner.archive(settings=settings_with(ARCHIVE_AFTER="1m"))

    assert engine.job_cancel(str(dead.id), reason="cancelled: not needed").changed

    assert (table_of(dead.id), engine.job_get(str(dead.id)).state) == ("x_jobs", "cancelled")
    # (The test's transaction has one now(): the cancel's finished_at is not before it.)
    Job.objects.filter(id=dead.id).update(finished_at=engine.db_now() - timedelta(minutes=5))
    pruner.archive(settings=settings_with(ARCHIVE_AFTER="1m"))
    assert table_of(dead.id).startswith("x_jobs_cancelled_")


def test_a_tenant_scope_cannot_move_back_another_tenants_archived_job():
    engine = get_engine()
    dead = make_row(engine, state="dead", tenant_id="globex",
                    finished_at=engine.db_now() - timedelta(hours=1))
    pruner.archive(settings=settings_with(ARCHIVE_AFTER="1m"))

    assert not engine.job_retry(str(dead.id), tenant_ids=["acme"]).changed
    assert table_of(dead.id).startswith("x_jobs_dead_")


# ----------------------------------------------------------------------- the hot path --


# Every statement a worker process sends about jobs and steps: its loop, heartbeat and duties,
# and its runs' steps, backfill batches and children.
WORKER_STATEMENTS = (
    "jobs_claim", "jobs_complete_if_owned", "job_fail_if_owned", "jobs_renew_if_owned",
    "job_suspend_if_owned", "job_requeue_if_owned", "jobs_requeue_if_owned",
    "job_progress_if_owned", "job_pause_key_if_owned", "jobs_fence_check", "jobs_wake_refused",
    "jobs_unblock", "job_claim_if_due", "job_run_now", "steps_of_run", "step_complete_if_owned",
    "step_fail_if_owned", "step_park_if_owned", "step_cancel_siblings",
    "step_invoke_open_if_owned", "step_invoke_pending_if_owned", "jobs_enqueue_children",
    "jobs_children", "jobs_cancel_tree_free", "event_wake_waiters", "cron_runs_live",
    "cron_runs_lock_live", "cron_runs_hold", "cron_runs_release", "backfill_start_if_owned",
    "backfill_progress_if_owned", "backfill_complete_if_owned", "backfill_fail_if_owned",
)


def test_the_worker_statements_name_only_x_jobs_and_only_x_job_steps(engine):
    # Reading or writing x_jobs (x_job_steps) without `only` plans and locks every history
    # table, and waits behind retention's DROP TABLE of one. An insert goes to the parent alone.
    for name in WORKER_STATEMENTS:
        text = " ".join(engine.statements()[name].sql.split())
        for table in ("x_jobs", "x_job_steps"):
            assert not re.search(rf"\b(from|join|update|delete from) {table}\b", text), (
                name, table)
    assert "only x_jobs" in engine.statements()["jobs_claim"].sql


@pytest.mark.django_db(transaction=True)
def test_claims_acks_steps_and_enqueues_go_on_while_a_history_table_is_locked_exclusively(
        engine):
    make_row(engine, state="done", finished_at=engine.db_now() - timedelta(days=1))
    pruner.archive(settings=settings_with(ARCHIVE_AFTER="1m"))
    [table] = history_tables()
    holder = psycopg.connect(**_dsn(), autocommit=False)
    try:
        holder.execute(f"lock table {table} in access exclusive mode")
        with connection.cursor() as cursor:
            # A statement that touched the table would wait for the holder: fail, not hang.
            cursor.execute("set lock_timeout = '3s'")
        enqueue(engine, key="stepping")
        [run] = claim(engine)
        owner = RunOwner(claim=run.claim, run_id=run.run_id)
        assert engine.step_complete_if_owned(owner, "a", "1")  # the step fence: a lock now
        assert engine.steps_of_run(run.run_id)[0].output == 1
        done = [Completion(claim=run.claim, result_json="null")]
        assert engine.jobs_complete_if_owned(done).owned == {run.lease_token}
        # Sent again (as after a lost answer): the fence check reads the row, not the history.
        assert engine.jobs_complete_if_owned(done).already_applied == {run.lease_token}
        [job_id] = finish(engine, key="while-locked")
    finally:
        holder.rollback()
        holder.close()
        with connection.cursor() as cursor:
            cursor.execute("reset lock_timeout")
    assert engine.job_get(job_id).state == "done"


def _dsn() -> dict[str, object]:
    db = connection.settings_dict
    return {"dbname": db["NAME"], "user": db["USER"], "host": db["HOST"] or "127.0.0.1",
            "port": db["PORT"] or 5432, "password": db["PASSWORD"] or None}


# --------------------------------------------------------------------------- retention --


def test_retention_drops_a_whole_day_in_one_statement_however_many_rows_it_holds():
    engine = get_engine()
    now = engine.db_now()
    for days, n in ((10, 50), (9, 5), (2, 1)):
        Job.objects.bulk_create([
            Job(name="testapp.noop", idempotency_key=str(uuid.uuid4()), state="done",
                finished_at=now - timedelta(days=days, minutes=i))
            for i in range(n)
        ])
    pruner.archive(settings=settings_with(ARCHIVE_AFTER="1m"))
    assert len(history_tables()) >= 3
    settings = settings_with(ARCHIVE_AFTER="1m", RETENTION={"done": "7d"})

    with CaptureQueriesContext(connection) as ctx:
        report = pruner.run_once(settings=settings)

    # One call per state, for every day of it, however many rows each day holds.
    assert statements(ctx, "history_drop") == len(settings.retention)
    assert len(report.days) == len({t for t in report.days}) >= 2
    assert Job.objects.count() == 1  # the day two days back is kept
    assert all(t not in history_tables() for t in report.days)
    assert all(not t.startswith("x_jobs_done_") or t in history_tables()
               for t in history_tables())


@pytest.mark.django_db(transaction=True)
def test_a_day_a_reader_holds_is_left_for_the_next_run_without_waiting_long():
    engine = get_engine()
    make_row(engine, state="done", finished_at=engine.db_now() - timedelta(days=9))
    pruner.archive(settings=settings_with(ARCHIVE_AFTER="1m"))
    [table] = history_tables()
    reader = psycopg.connect(**_dsn(), autocommit=False)
    try:
        reader.execute(f"select count(*) from {table}").fetchone()  # holds ACCESS SHARE
        started = time.monotonic()
        dropped = engine.history_drop(state="done", finished_before=engine.db_now())
        waited = time.monotonic() - started
    finally:
        reader.rollback()
        reader.close()

    assert dropped == []
    assert waited < 3  # the DROP's lock_timeout, not the reader's whole transaction
    assert history_tables() == [table]
    assert engine.history_drop(state="done", finished_before=engine.db_now()) == [table]
    assert history_tables() == [] and Job.objects.count() == 0


def test_an_operators_purge_cuts_exactly_at_its_age_in_the_history_tables_too():
    engine = get_engine()
    now = engine.db_now()
    old = [make_row(engine, state="done", finished_at=now - timedelta(days=3, hours=h + 1))
           for h in range(3)]
    young = make_row(engine, state="done", finished_at=now - timedelta(days=2, hours=23))
    for row in (*old, young):
        JobStep.objects.create(run_id=row.run_id, name="s1", status="completed")
    pruner.archive(settings=settings_with(ARCHIVE_AFTER="1m"))
    in_x_jobs = make_row(engine, state="done", finished_at=now - timedelta(days=4))

    assert api.purge(older_than=timedelta(days=3), batch_size=2) == len(old) + 1

    assert list(Job.objects.values_list("id", flat=True)) == [young.id]
    assert not JobStep.objects.filter(run_id__in=[r.run_id for r in (*old, in_x_jobs)]).exists()
    assert JobStep.objects.filter(run_id=young.run_id).exists()


HISTORY_INDEXES_SQL = """
select indexrelid::regclass::text from pg_index
 where indrelid in ('x_jobs_done_20010101'::regclass, 'x_job_steps_done_20010101'::regclass)
"""


@pytest.mark.django_db(transaction=True)  # CREATE INDEX CONCURRENTLY: no transaction block
def test_the_history_tables_made_before_0016_get_its_search_indexes():
    """Migration 0016 gives the history tables already there the indexes its
    xjobs_history_table gives every new one (docs/console.md, "At ten million jobs"), and may
    run again."""
    import importlib

    migration = importlib.import_module("django_xjobs.migrations.0016_history_search")
    before = importlib.import_module("django_xjobs.migrations.0006_history").HISTORY_TABLE
    wanted = {f"x_jobs_done_20010101_{suffix}" for suffix, _ in migration.JOB_INDEXES} | {
        f"x_job_steps_done_20010101_{suffix}" for suffix, _ in migration.STEP_INDEXES}
    with connection.cursor() as cursor:
        cursor.execute(before)  # the function as a database before 0016 has it
        cursor.execute("select xjobs_history_table('done', '2001-01-01')")
    try:
        with connection.cursor() as cursor:
            cursor.execute(HISTORY_INDEXES_SQL)
            assert not wanted & {row[0] for row in cursor.fetchall()}
        for _ in range(2):  # a migration resumed after a failure runs it again
            with connection.schema_editor(atomic=False) as editor:
                migration.index_existing(None, editor)
        with connection.cursor() as cursor:
            cursor.execute(HISTORY_INDEXES_SQL)
            assert wanted <= {row[0] for row in cursor.fetchall()}
    finally:
        with connection.cursor() as cursor:
            cursor.execute(migration.HISTORY_TABLE)
            cursor.execute("drop table if exists x_jobs_done_20010101, "
                           "x_job_steps_done_20010101")
