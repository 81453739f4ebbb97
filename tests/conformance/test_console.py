"""The console's engine operations: deleting chosen finished jobs, tenant-scoped stats and
outbox counts, who retried a job, the monitoring reads (table health, the xmin horizon), and
what a failed connect says (``xjobs health``: an outage, or a server that turns it away)."""

from __future__ import annotations

import socket
import threading
import uuid

import pytest
from django.db import DatabaseError, connections, transaction

from django_xjobs.models import Job, JobStep, OutboxEntry

from .conftest import claim_one, enqueue, make_row

# ------------------------------------------------------------------- jobs_delete_finished --


@pytest.mark.django_db
def test_delete_finished_deletes_only_the_finished_jobs_it_is_given_and_their_steps(engine):
    done, dead, cancelled = (make_row(engine, state=s) for s in ("done", "dead", "cancelled"))
    live = [make_row(engine, state=s) for s in ("ready", "delayed", "running", "suspended")]
    other_done = make_row(engine, state="done")
    JobStep.objects.create(run_id=done.run_id, name="a", status="completed")
    JobStep.objects.create(run_id=other_done.run_id, name="a", status="completed")

    deleted = engine.jobs_delete_finished([str(j.id) for j in (done, dead, cancelled, *live)])

    assert deleted == 3
    assert set(Job.objects.values_list("id", flat=True)) == {j.id for j in (*live, other_done)}
    assert list(JobStep.objects.values_list("run_id", flat=True)) == [other_done.run_id]


@pytest.mark.django_db
def test_delete_finished_of_unknown_or_malformed_ids_deletes_nothing(engine):
    make_row(engine, state="done")

    assert engine.jobs_delete_finished([str(uuid.uuid4()), "not-a-uuid"]) == 0
    assert engine.jobs_delete_finished([]) == 0
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_delete_finished_under_a_tenant_scope_cannot_touch_another_tenants_job(engine):
    acme = make_row(engine, state="done", tenant_id="acme")
    globex = make_row(engine, state="done", tenant_id="globex")

    assert engine.jobs_delete_finished([str(acme.id), str(globex.id)], tenant_ids=["acme"]) == 1
    assert list(Job.objects.values_list("id", flat=True)) == [globex.id]


@pytest.mark.django_db(transaction=True)
def test_delete_finished_skips_a_row_another_transaction_holds(engine):
    held = make_row(engine, state="dead")
    free = make_row(engine, state="dead")
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                list(Job.objects.select_for_update().filter(id=held.id))
                locked.set()
                release.wait(30)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(30)
        assert engine.jobs_delete_finished([str(held.id), str(free.id)]) == 1
    finally:
        release.set()
        holder.join(30)
    assert list(Job.objects.values_list("id", flat=True)) == [held.id]


# ------------------------------------------------------------------- tenant-scoped counts --


@pytest.mark.django_db
def test_queue_stats_under_a_tenant_scope_counts_only_those_tenants_rows(engine):
    for tenant in ("acme", "acme", "globex", None):
        enqueue(engine, queue="scoped-q", tenant=tenant)
    make_row(engine, state="dead", queue="scoped-q", tenant_id="acme")

    (acme,) = engine.queue_stats(tenant_ids=["acme"])
    (everyone,) = engine.queue_stats()

    assert (acme.queue, acme.ready, acme.dead) == ("scoped-q", 2, 1)
    assert (everyone.ready, everyone.dead) == (4, 1)
    assert engine.queue_stats(tenant_ids=["nobody"]) == []


@pytest.mark.django_db
def test_outbox_pending_under_a_tenant_scope_counts_only_those_tenants_rows(engine):
    for tenant in ("acme", "globex", "globex"):
        OutboxEntry.objects.create(job="testapp.noop", tenant_id=tenant)

    assert engine.outbox_pending(tenant_ids=["acme"])[0] == 1
    assert engine.outbox_pending(tenant_ids=["globex", "acme"])[0] == 3
    assert engine.outbox_pending(tenant_ids=["nobody"]) == (0, None)


# --------------------------------------------------------------------------- job_retry --


@pytest.mark.django_db
def test_retry_records_who_retried_only_when_told(engine):
    first, second = (make_row(engine, state="dead", enqueued_by="user:ada") for _ in range(2))

    engine.job_retry(str(first.id), enqueued_by="admin:grace")
    engine.job_retry(str(second.id))

    assert Job.objects.get(id=first.id).enqueued_by == "admin:grace"
    assert Job.objects.get(id=second.id).enqueued_by == "user:ada"


# ------------------------------------------------------------------- monitoring reads --


@pytest.mark.django_db
def test_tables_health_reports_every_job_table(engine):
    enqueue(engine)

    tables = {t.table: t for t in engine.tables_health()}

    assert set(tables) == {"x_jobs", "x_job_steps", "x_job_events", "x_outbox", "x_job_leases",
                           "x_scheduler_leader", "x_scheduler_state", "x_backfills"}
    jobs = tables["x_jobs"]
    assert jobs.xid_age > 0 and jobs.freeze_max_age >= 100_000 and jobs.size_bytes > 0
    assert 0.0 <= jobs.dead_ratio <= 1.0


@pytest.mark.django_db(transaction=True)
def test_xmin_horizon_names_an_open_transaction_of_another_session(engine):
    opened, release = threading.Event(), threading.Event()

    def idle_in_transaction() -> None:
        try:
            engine.session_label("xjobs-tests-idle")
            with transaction.atomic():
                OutboxEntry.objects.create(job="testapp.noop")  # a write: the xact has an xid
                opened.set()
                release.wait(30)
        finally:
            connections.close_all()

    thread = threading.Thread(target=idle_in_transaction)
    thread.start()
    try:
        assert opened.wait(30)
        holders = engine.xmin_horizon(limit=50)
    finally:
        release.set()
        thread.join(30)

    (mine,) = [h for h in holders if h.name == "xjobs-tests-idle"]
    assert mine.kind == "transaction" and mine.pid is not None
    assert mine.state is not None and mine.state.startswith("idle in transaction")
    assert mine.age_seconds is not None and mine.age_seconds >= 0
    assert mine.xmin_age is not None


@pytest.mark.django_db
def test_a_claimed_then_deleted_job_is_not_deleted_while_running(engine):
    enqueue(engine, queue="del-q")
    claimed = claim_one(engine, "del-q")

    assert engine.jobs_delete_finished([claimed.id]) == 0
    assert Job.objects.get(id=claimed.id).state == "running"


# ------------------------------------------------------------------------- failed connects --


def connect_error(**changes: str) -> DatabaseError:
    """What Django raises when a connection with the test database's settings, but for
    ``changes``, cannot be opened."""
    default = connections["default"]
    wrapper = type(default)({**default.settings_dict, **changes}, "xjobs_connect_test")
    with pytest.raises(DatabaseError) as failed:
        wrapper.ensure_connection()
    return failed.value


@pytest.mark.django_db
def test_a_server_that_is_not_there_is_no_refusal(engine):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = str(s.getsockname()[1])
    assert not engine.connection_refused(connect_error(HOST="127.0.0.1", PORT=closed))


@pytest.mark.django_db
def test_a_role_the_server_does_not_know_is_a_refusal(engine):
    assert engine.connection_refused(connect_error(USER="xjobs_no_such_role"))
