"""Backfill passes at the seam: the ``x_backfills`` row a pass's job writes, fenced on the job.

A pass's row is keyed by its job's run_id. The worker's writes (start, progress, complete,
fail) carry the run's ownership (job id, running, lease token) and change nothing for a run
that lost its job; a batch whose progress write is refused is rolled back with it. Rows are
put into arbitrary states through the ORM (engine-neutral set-up); no SQL here.
"""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest

from django_xjobs.models import Backfill
from django_xjobs.records import Claim, RunOwner

from .conftest import claim_one, enqueue, wait_lapsed

pytestmark = pytest.mark.django_db(transaction=True)

CHECKSUM = "a" * 64
OTHER_CODE = "b" * 64


def owned_run(engine, *, lease_ms: int = 60_000, worker: str = "worker-1") -> RunOwner:
    """A job claimed by ``worker``: the owner every fenced backfill write needs."""
    queue = f"q-{uuid.uuid4().hex[:10]}"
    enqueue(engine, queue=queue)
    job = claim_one(engine, queue, worker=worker, lease_ms=lease_ms)
    return RunOwner(claim=job.claim, run_id=job.run_id)


def start(engine, owner: RunOwner, *, name: str = "testapp.count_rows",
          checksum: str = CHECKSUM, app_version: str = "1.0"):
    return engine.backfill_start_if_owned(owner, name=name, checksum=checksum,
                                          app_version=app_version)


def row(owner_or_run_id) -> Backfill:
    run_id = getattr(owner_or_run_id, "run_id", owner_or_run_id)
    return Backfill.objects.get(pk=run_id)


def pass_row(engine, *, status: str, name: str = "testapp.count_rows", job_id=None,
             **fields) -> Backfill:
    now = engine.db_now()
    values = {"run_id": uuid.uuid4(), "name": name, "status": status, "checksum": CHECKSUM,
              "app_version": "1.0", "started_at": now - timedelta(minutes=5),
              "updated_at": now - timedelta(minutes=1), "job_id": job_id}
    if status in ("completed", "failed", "cancelled"):
        values["completed_at"] = now - timedelta(minutes=1)
    values.update(fields)
    return Backfill.objects.create(**values)


# ------------------------------------------------------------------------------- create --


def test_create_records_a_pending_pass_once(engine):
    run_id, job_id = str(uuid.uuid4()), str(uuid.uuid4())

    assert engine.backfill_create(run_id=run_id, name="testapp.count_rows", job_id=job_id,
                                  checksum=CHECKSUM, app_version="1.0") is True
    assert engine.backfill_create(run_id=run_id, name="testapp.count_rows", job_id=job_id,
                                  checksum=OTHER_CODE, app_version="2.0") is False

    created = row(run_id)
    assert (created.status, created.rows_processed, created.last_cursor) == ("pending", 0, None)
    assert (created.checksum, created.app_version, str(created.job_id)) == (
        CHECKSUM, "1.0", job_id)
    assert created.completed_at is None and created.code_changes == []


# -------------------------------------------------------------------------------- start --


def test_start_opens_a_row_for_a_run_that_owns_its_job(engine):
    owner = owned_run(engine)

    record = start(engine, owner)

    assert record is not None
    assert (record.status, record.rows_processed, record.last_cursor) == ("running", 0, None)
    assert (str(record.run_id), str(record.job_id)) == (owner.run_id, owner.claim.job_id)
    assert (record.checksum, record.app_version, record.code_changes) == (CHECKSUM, "1.0", [])
    assert record.completed_at is None


def test_start_adopts_a_pending_row_as_the_pass_really_begins(engine):
    owner = owned_run(engine)
    engine.backfill_create(run_id=owner.run_id, name="testapp.count_rows",
                           job_id=owner.claim.job_id, checksum=OTHER_CODE, app_version="0.9")
    Backfill.objects.filter(pk=owner.run_id).update(
        started_at=engine.db_now() - timedelta(hours=1))

    record = start(engine, owner, checksum=CHECKSUM, app_version="1.0")

    assert record.status == "running"
    # The code that actually runs the pass, and the moment it began, not the operator's.
    assert (record.checksum, record.app_version, record.code_changes) == (CHECKSUM, "1.0", [])
    assert record.started_at > engine.db_now() - timedelta(minutes=1)


def test_a_retried_run_adopts_its_failed_row_and_keeps_its_progress(engine):
    owner = owned_run(engine)
    began = engine.db_now() - timedelta(hours=2)
    failed = pass_row(engine, status="failed", run_id=owner.run_id, job_id=owner.claim.job_id,
                      rows_processed=4200, last_cursor=4200, started_at=began,
                      app_version="0.9", error="ValueError: boom")

    record = start(engine, owner, app_version="1.0")

    assert record.status == "running"
    assert record.completed_at is None  # a failure stamped it; a running pass has none
    assert (record.rows_processed, record.last_cursor) == (4200, 4200)
    assert (record.started_at, record.checksum, record.app_version) == (
        began, failed.checksum, "0.9")
    assert record.error == "ValueError: boom"  # the last failure stays on record
    assert row(owner).status == "running"


def test_a_completed_pass_stays_completed_when_its_job_runs_again(engine):
    # The ack after the final batch was lost: the job runs again and must not start over.
    owner = owned_run(engine)
    done = pass_row(engine, status="completed", run_id=owner.run_id, job_id=owner.claim.job_id,
                    rows_processed=10_000, last_cursor=None)

    record = start(engine, owner)

    assert (record.status, record.rows_processed, record.last_cursor) == (
        "completed", 10_000, None)
    assert record.completed_at == done.completed_at
    assert row(owner).status == "completed"


def test_a_cancelled_pass_is_adopted_by_its_retried_job(engine):
    owner = owned_run(engine)
    pass_row(engine, status="cancelled", run_id=owner.run_id, job_id=owner.claim.job_id,
             rows_processed=300, last_cursor={"id": 300})

    record = start(engine, owner)

    assert (record.status, record.completed_at) == ("running", None)
    assert (record.rows_processed, record.last_cursor) == (300, {"id": 300})


def test_a_resume_under_other_code_is_recorded_once_per_change(engine):
    owner = owned_run(engine)
    pass_row(engine, status="failed", run_id=owner.run_id, job_id=owner.claim.job_id,
             rows_processed=500, last_cursor=500)

    first = start(engine, owner, checksum=OTHER_CODE, app_version="2.0")
    again = start(engine, owner, checksum=OTHER_CODE, app_version="2.0")
    back = start(engine, owner, checksum=CHECKSUM, app_version="1.0")

    assert first.checksum == CHECKSUM  # the pass keeps the code it began with
    [change] = first.code_changes
    assert (change["checksum"], change["app_version"], change["rows_processed"]) == (
        OTHER_CODE, "2.0", 500)
    assert again.code_changes == first.code_changes  # same code again: nothing new
    assert [c["checksum"] for c in back.code_changes] == [OTHER_CODE, CHECKSUM]


def test_start_from_a_run_that_lost_its_job_writes_nothing(engine):
    owner = owned_run(engine)
    engine.job_cancel(owner.claim.job_id, reason="operator")

    assert start(engine, owner) is None
    assert not Backfill.objects.filter(pk=owner.run_id).exists()


def test_start_with_a_stale_token_does_not_adopt_the_row(engine):
    owner = owned_run(engine)
    pass_row(engine, status="failed", run_id=owner.run_id, job_id=owner.claim.job_id)
    stale = RunOwner(claim=Claim(job_id=owner.claim.job_id, lease_token=str(uuid.uuid4())),
                     run_id=owner.run_id)

    assert start(engine, stale) is None
    assert row(owner).status == "failed"


# ----------------------------------------------------------------------------- progress --


def test_progress_adds_rows_and_stores_the_cursor(engine):
    owner = owned_run(engine)
    start(engine, owner)

    assert engine.backfill_progress_if_owned(owner, processed=100,
                                             cursor_json=json.dumps({"id": 100})) == 100
    assert engine.backfill_progress_if_owned(owner, processed=100,
                                             cursor_json=json.dumps({"id": 200})) == 200

    saved = row(owner)
    assert (saved.rows_processed, saved.last_cursor, saved.status) == (200, {"id": 200},
                                                                       "running")
    assert saved.updated_at is not None


def test_progress_from_a_lapsed_and_reclaimed_lease_changes_nothing(engine):
    queue = f"q-{uuid.uuid4().hex[:10]}"
    enqueue(engine, queue=queue)
    first = claim_one(engine, queue, worker="worker-1", lease_ms=50)
    old = RunOwner(claim=first.claim, run_id=first.run_id)
    start(engine, old)
    engine.backfill_progress_if_owned(old, processed=100, cursor_json="100")
    wait_lapsed(engine, first.id)
    second = claim_one(engine, queue, worker="worker-2")
    new = RunOwner(claim=second.claim, run_id=second.run_id)

    assert engine.backfill_progress_if_owned(old, processed=100, cursor_json="200") is None
    assert engine.backfill_complete_if_owned(old, processed=5) is None
    assert engine.backfill_fail_if_owned(old, error="late") is False
    assert (row(old).rows_processed, row(old).last_cursor, row(old).status) == (
        100, 100, "running")

    assert start(engine, new).last_cursor == 100  # the new run resumes after the last commit
    assert engine.backfill_progress_if_owned(new, processed=100, cursor_json="200") == 200


def test_progress_of_a_cancelled_job_changes_nothing(engine):
    owner = owned_run(engine)
    start(engine, owner)
    engine.job_cancel(owner.claim.job_id, reason="operator")

    assert engine.backfill_progress_if_owned(owner, processed=100, cursor_json="100") is None
    assert row(owner).rows_processed == 0


def test_progress_of_a_pass_that_is_not_running_changes_nothing(engine):
    owner = owned_run(engine)
    pass_row(engine, status="cancelled", run_id=owner.run_id, job_id=owner.claim.job_id,
             last_cursor=7)

    assert engine.backfill_progress_if_owned(owner, processed=1, cursor_json="8") is None
    assert engine.backfill_complete_if_owned(owner, processed=1) is None
    assert row(owner).last_cursor == 7


def test_a_batch_whose_progress_is_refused_rolls_back_with_it(engine):
    from tests.testapp.models import Effect

    owner = owned_run(engine)
    start(engine, owner)
    engine.job_cancel(owner.claim.job_id, reason="operator")

    with pytest.raises(LookupError), engine.atomic():
        Effect.objects.create(job_id=owner.claim.job_id, name="batch", attempt=1, pid=0, kind="w")
        if engine.backfill_progress_if_owned(owner, processed=1, cursor_json="1") is None:
            raise LookupError("not owned")

    assert not Effect.objects.filter(job_id=owner.claim.job_id).exists()


def test_a_batch_and_its_progress_commit_together(engine):
    from tests.testapp.models import Effect

    owner = owned_run(engine)
    start(engine, owner)

    with engine.atomic():
        Effect.objects.create(job_id=owner.claim.job_id, name="batch", attempt=1, pid=0, kind="w")
        assert engine.backfill_progress_if_owned(owner, processed=1, cursor_json="1") == 1

    assert Effect.objects.filter(job_id=owner.claim.job_id).count() == 1
    assert row(owner).last_cursor == 1


# ---------------------------------------------------------------------- complete, fail --


def test_complete_clears_the_cursor_and_stamps_completed_at(engine):
    owner = owned_run(engine)
    start(engine, owner)
    engine.backfill_progress_if_owned(owner, processed=100, cursor_json="100")

    assert engine.backfill_complete_if_owned(owner, processed=42) == 142

    done = row(owner)
    assert (done.status, done.rows_processed, done.last_cursor) == ("completed", 142, None)
    assert done.completed_at is not None


def test_fail_keeps_the_cursor_and_records_the_error(engine):
    owner = owned_run(engine)
    start(engine, owner)
    engine.backfill_progress_if_owned(owner, processed=100, cursor_json="100")

    assert engine.backfill_fail_if_owned(owner, error="ValueError: poisoned row") is True

    failed = row(owner)
    assert (failed.status, failed.rows_processed, failed.last_cursor) == ("failed", 100, 100)
    assert failed.error == "ValueError: poisoned row"
    assert failed.completed_at is not None


def test_fail_from_a_run_that_lost_its_job_changes_nothing(engine):
    owner = owned_run(engine)
    start(engine, owner)
    engine.job_cancel(owner.claim.job_id, reason="operator")

    assert engine.backfill_fail_if_owned(owner, error="late") is False
    assert (row(owner).status, row(owner).error) == ("running", None)


# ------------------------------------------------------------------------------- cancel --


@pytest.mark.parametrize("status", ["pending", "running", "failed"])
def test_cancel_stops_a_pass_that_is_not_finished_and_keeps_its_cursor(engine, status):
    live = pass_row(engine, status=status, rows_processed=300, last_cursor=300,
                    completed_at=None)

    record = engine.backfill_cancel(str(live.run_id))

    assert (record.status, record.rows_processed, record.last_cursor) == ("cancelled", 300, 300)
    assert record.completed_at is not None
    assert row(live.run_id).status == "cancelled"


@pytest.mark.parametrize("status", ["completed", "cancelled"])
def test_cancel_of_a_finished_pass_changes_nothing(engine, status):
    finished = pass_row(engine, status=status)

    assert engine.backfill_cancel(str(finished.run_id)) is None
    assert row(finished.run_id).completed_at == finished.completed_at


def test_cancel_of_an_unknown_or_malformed_run_id_changes_nothing(engine):
    assert engine.backfill_cancel(str(uuid.uuid4())) is None
    assert engine.backfill_cancel("not-a-uuid") is None


# --------------------------------------------------------------------------------- list --


def test_list_filters_by_run_id(engine):
    # A null test on the parameter alone would type it as text, and `uuid = text` would fail
    # every call.
    wanted = pass_row(engine, status="running")
    pass_row(engine, status="running")

    [found] = engine.backfills_list(run_id=str(wanted.run_id))

    assert found.run_id == wanted.run_id
    assert engine.backfill_get(str(wanted.run_id)).run_id == wanted.run_id
    assert engine.backfills_list(run_id=str(uuid.uuid4())) == []


def test_list_filters_by_name_and_status_and_combines_filters(engine):
    a_run = pass_row(engine, status="running", name="app.a")
    a_done = pass_row(engine, status="completed", name="app.a")
    b_run = pass_row(engine, status="running", name="app.b")

    assert {r.run_id for r in engine.backfills_list(name="app.a")} == {
        a_run.run_id, a_done.run_id}
    assert {r.run_id for r in engine.backfills_list(status="running")} >= {
        a_run.run_id, b_run.run_id}
    assert a_done.run_id not in {r.run_id for r in engine.backfills_list(status="running")}
    [both] = engine.backfills_list(name="app.a", status="completed")
    assert both.run_id == a_done.run_id
    assert engine.backfills_list(name="app.a", run_id=str(b_run.run_id)) == []


def test_list_is_newest_first_and_limited(engine):
    now = engine.db_now()
    made = [pass_row(engine, status="completed", name="app.order",
                     started_at=now - timedelta(minutes=10 - i)) for i in range(5)]

    listed = engine.backfills_list(name="app.order", limit=3)

    assert [r.run_id for r in listed] == [m.run_id for m in reversed(made)][:3]


def test_list_reports_the_state_of_each_pass_job(engine):
    owner = owned_run(engine)
    start(engine, owner)
    orphan = pass_row(engine, status="running", job_id=uuid.uuid4())

    [with_job] = engine.backfills_list(run_id=owner.run_id)
    [without] = engine.backfills_list(run_id=str(orphan.run_id))

    assert (with_job.job_state, with_job.job_attempt) == ("running", 1)
    assert (without.job_state, without.job_attempt) == (None, None)


def test_a_run_id_that_is_not_a_uuid_matches_nothing(engine):
    pass_row(engine, status="running")

    assert engine.backfills_list(run_id="42") == []
    assert engine.backfill_get("42") is None
    assert engine.backfill_get(str(uuid.uuid4())) is None
