"""The models' managers (django_xjobs/managers.py): each method runs its engine method on the
manager's database and answers as the engine does (docs/managers.md).

The claim, fencing, slot and scheduler modules also run whole through the managers
(``[managers]`` in their test ids, tests/conformance/conftest.py); here: what the managers add
on top of the engine (their database, their arguments) and one pin per method.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.db import transaction
from django.db.migrations.state import ModelState
from django.test import override_settings

from django_xjobs.engines import get_engine
from django_xjobs.managers import (
    JobManager,
    LeaderManager,
    SlotManager,
    milliseconds,
)
from django_xjobs.models import Job, JobLease, SchedulerLeader
from django_xjobs.records import (
    Claim,
    Completion,
    Failure,
    Fence,
    Requeue,
    SlotHold,
    SlotRequest,
    Suspension,
)

from .conftest import LONG_LEASE_MS, enqueue, make_row

LEASE = timedelta(milliseconds=LONG_LEASE_MS)


def claim(worker: str = "shell", **kwargs):
    kwargs.setdefault("lease", LEASE)
    return Job.objects.claim("default", worker_id=worker, **kwargs)


# ---------------------------------------------------------------------- the managers --


def test_each_model_has_its_manager_as_objects_and_default_manager():
    for model, manager in ((Job, JobManager), (JobLease, SlotManager),
                           (SchedulerLeader, LeaderManager)):
        assert type(model.objects) is manager
        assert model._default_manager is model.objects


def test_the_managers_stay_out_of_the_migration_state():
    # Without use_in_migrations a manager is not part of the state: makemigrations --check
    # stays clean (tests/integration/test_checks.py runs it).
    for model in (Job, JobLease, SchedulerLeader):
        assert ModelState.from_model(model).managers == []


@pytest.mark.django_db
def test_the_orm_reads_through_the_managers_as_before(engine):
    made = make_row(engine, state="ready")
    assert list(Job.objects.filter(state="ready").values_list("id", flat=True)) == [made.id]
    assert Job.objects.get(id=made.id).name == made.name
    assert JobLease.objects.count() == 0 and SchedulerLeader.objects.count() == 0


def test_the_alias_is_the_managers_database():
    assert Job.objects.alias == "default"
    assert Job.objects.db_manager("jobs").alias == "jobs"
    assert JobLease.objects.db_manager("jobs").engine() is get_engine("jobs")
    with override_settings(XJOBS={**settings.XJOBS, "DATABASE": "jobs"},
                           DATABASE_ROUTERS=["django_xjobs.routers.XJobsRouter"]):
        assert Job.objects.alias == "jobs"
        assert SchedulerLeader.objects.alias == "jobs"


# ------------------------------------------------------------------------------ durations --


@pytest.mark.parametrize(("given", "ms"), [
    (30, 30_000), (1.5, 1_500), (0.001, 1), (timedelta(minutes=2), 120_000),
    (timedelta(milliseconds=1), 1), ("250ms", 250), ("30s", 30_000), ("5m", 300_000),
])
def test_a_duration_is_seconds_a_timedelta_or_text_in_whole_milliseconds(given, ms):
    assert milliseconds(given, what="lease") == ms


@pytest.mark.parametrize(("given", "message"), [
    (0, "at least 1ms"), (0.0004, "at least 1ms"), (-1, "must not be negative"),
    (timedelta(seconds=-1), "must not be negative"), (float("inf"), "finite"),
    (True, "expected a duration"), (None, "expected a duration"), ("soon", "not a duration"),
])
def test_a_bad_duration_is_refused_naming_the_argument(given, message):
    with pytest.raises(ValueError, match=message) as raised:
        milliseconds(given, what="claim(lease=)")
    assert str(raised.value).startswith("claim(lease=):")


@pytest.mark.django_db
def test_a_bad_lease_writes_nothing(engine):
    enqueue(engine)
    with pytest.raises(ValueError, match=r"claim\(lease=\)"):
        claim(lease=-5)
    with pytest.raises(ValueError, match=r"acquire\(ttl=\)"):
        JobLease.objects.acquire(SlotRequest(slot_key="k", limit=1, holder="h"), ttl="never")
    assert Job.objects.get().state == "ready" and JobLease.objects.count() == 0


# ------------------------------------------------------------------------------ the claim --


@pytest.mark.django_db
def test_a_claim_leases_the_jobs_as_the_engines_claim_does(engine, django_assert_num_queries):
    enqueue(engine, priority=1)
    enqueue(engine)

    with django_assert_num_queries(1):
        claimed = Job.objects.claim("default", worker_id="shell", lease=30)

    assert len(claimed) == 1  # limit defaults to one job of each queue named
    job = claimed[0]
    row = engine.job_get(job.id)
    assert row.state == "running" and row.claimed_by == "shell" and row.priority == 1
    assert str(row.lease_token) == job.lease_token and row.attempt == job.attempt == 1
    assert timedelta(seconds=29) < row.visible_at - engine.db_now() <= timedelta(seconds=30)


@pytest.mark.django_db
def test_a_claim_takes_a_name_names_or_how_many_of_each(engine):
    for queue in ("a", "a", "a", "b", "b", "c"):
        enqueue(engine, queue=queue)

    assert len(Job.objects.claim(["a", "b"], limit=2, worker_id="w", lease=LEASE)) == 4
    assert [j.queue for j in Job.objects.claim({"a": 5, "c": 0}, worker_id="w",
                                               lease=LEASE)] == ["a"]
    assert [j.queue for j in Job.objects.claim("c", limit=3, worker_id="w",
                                               lease=LEASE)] == ["c"]
    assert Job.objects.claim([], worker_id="w", lease=LEASE) == []


@pytest.mark.parametrize(("queues", "limit", "error"), [
    ({"a": 1}, 2, TypeError), ("a", -1, ValueError), ("a", True, ValueError),
    ({"a": "2"}, None, ValueError),
])
def test_a_claim_refuses_an_unclear_wish(queues, limit, error):
    with pytest.raises(error):
        Job.objects.claim(queues, limit=limit, worker_id="w", lease=LEASE)


@pytest.mark.django_db
def test_a_claim_joins_the_callers_transaction(engine):
    enqueue(engine)
    with transaction.atomic():
        assert len(claim()) == 1
        assert Job.objects.get().state == "running"  # seen inside the transaction
        transaction.set_rollback(True)

    assert Job.objects.get().state == "ready"


# --------------------------------------------------------------------------- fenced writes --


@pytest.mark.django_db
def test_complete_takes_completions_claims_or_claimed_jobs_and_fences_each(engine):
    for _ in range(4):
        enqueue(engine)
    with_result, as_claim, as_job, cancelled = claim(limit=4)
    engine.job_cancel(cancelled.id, reason="stop")

    report = Job.objects.complete([
        Completion(claim=with_result.claim, result_json='{"n": 1}'),
        as_claim.claim, as_job, cancelled,
    ])

    assert report.owned == {with_result.lease_token, as_claim.lease_token, as_job.lease_token}
    assert report.outcome(cancelled.lease_token) is Fence.LOST
    assert engine.job_get(with_result.id).result == {"n": 1}
    assert engine.job_get(as_claim.id).result is None
    assert engine.job_get(cancelled.id).state == "cancelled"
    # One record alone is a batch of one; a second ack is recognised as applied.
    assert Job.objects.complete(as_job).outcome(as_job.lease_token) is Fence.ALREADY_APPLIED


@pytest.mark.django_db
def test_fail_retries_or_buries_under_the_fence(engine):
    enqueue(engine, max_attempts=1)
    job = claim()[0]

    report, state = Job.objects.fail(Failure(claim=job.claim, error="boom", retry_delay_ms=0))

    assert report.outcome(job.lease_token) is Fence.OWNED and state == "dead"
    assert engine.job_get(job.id).last_error == "boom"
    again, state = Job.objects.fail(Failure(claim=job.claim, error="boom", retry_delay_ms=0))
    assert again.outcome(job.lease_token) is Fence.ALREADY_APPLIED and state == "dead"


@pytest.mark.django_db
def test_requeue_one_or_many_gives_the_attempt_back(engine):
    for _ in range(3):
        enqueue(engine)
    one, *many = claim(limit=3)

    def back(job):
        return Requeue(claim=job.claim, delay_ms=0, spent_attempt=True, resumed=False)

    assert Job.objects.requeue(back(one)).outcome(one.lease_token) is Fence.OWNED
    assert Job.objects.requeue(back(j) for j in many).owned == {j.lease_token for j in many}
    for job in (one, *many):
        row = engine.job_get(job.id)
        assert (row.state, row.attempt) == ("ready", 0)


@pytest.mark.django_db
def test_suspend_parks_the_job_and_a_lost_run_changes_nothing(engine):
    enqueue(engine)
    enqueue(engine)
    job, lost = claim(limit=2)
    engine.job_cancel(lost.id, reason="stop")
    wake_at = engine.db_now() + timedelta(hours=1)

    report = Job.objects.suspend(Suspension(claim=job.claim, wake_at=wake_at))

    assert report.outcome(job.lease_token) is Fence.OWNED
    assert (engine.job_get(job.id).state, engine.job_get(job.id).run_at) == ("suspended", wake_at)
    before = engine.job_get(lost.id)
    assert Job.objects.suspend(Suspension(claim=lost.claim, wake_at=wake_at)).outcome(
        lost.lease_token) is Fence.LOST
    assert engine.job_get(lost.id) == before


@pytest.mark.django_db
def test_renew_extends_the_leases_still_owned(engine):
    enqueue(engine)
    enqueue(engine)
    kept, cancelled = claim(limit=2, lease=10)
    engine.job_cancel(cancelled.id, reason="stop")

    renewed = Job.objects.renew([kept, cancelled.claim], lease=timedelta(hours=1))

    assert renewed == {kept.lease_token}
    assert engine.job_get(kept.id).visible_at - engine.db_now() > timedelta(minutes=59)
    assert Job.objects.renew([], lease=LEASE) == frozenset()


@pytest.mark.django_db
def test_wake_refused_makes_a_refused_job_due_now(engine):
    enqueue(engine)
    job = claim()[0]
    Job.objects.requeue([Requeue(claim=job.claim, delay_ms=60_000, spent_attempt=True,
                                 resumed=False)])
    assert claim() == []

    assert Job.objects.wake_refused(job) == 1

    assert [j.id for j in claim()] == [job.id]


@pytest.mark.parametrize(("call", "given"), [
    (lambda: Job.objects.complete("not a claim"), "str"),
    (lambda: Job.objects.complete([Claim(job_id="x", lease_token="y"), 3]), "int"),
    (lambda: Job.objects.fail([Failure(claim=Claim(job_id="x", lease_token="y"), error="e",
                                       retry_delay_ms=0)]), "list"),
    (lambda: Job.objects.renew({"job": "token"}, lease=1), "dict"),
    (lambda: JobLease.objects.release(SlotRequest(slot_key="k", limit=1, holder="h")),
     "SlotRequest"),
])
def test_a_wrong_record_is_refused_before_anything_runs(call, given):
    with pytest.raises(TypeError, match=given):
        call()


# ------------------------------------------------------------------------------- slots --


@pytest.mark.django_db
def test_slots_are_acquired_renewed_listed_and_released_as_by_the_engine(engine):
    first, second, refused = (SlotRequest(slot_key="k", limit=2, holder=h) for h in "abc")

    holds = JobLease.objects.acquire([first, second, refused], ttl=60)

    assert holds == [SlotHold(slot_key="k", slot=0, holder="a", limit=2),
                     SlotHold(slot_key="k", slot=1, holder="b", limit=2)]
    assert JobLease.objects.live(slot_key="k") == engine.slots_list(slot_key="k")
    assert [(u.slot_key, u.held) for u in JobLease.objects.usage()] == [("k", 2)]
    stranger = SlotHold(slot_key="k", slot=0, holder="z")
    assert JobLease.objects.renew([*holds, stranger], ttl="2m") == {"a", "b"}
    assert all(r.expires_in > 60 for r in engine.slots_list(slot_key="k"))

    assert JobLease.objects.release(holds[0]) == 1
    assert JobLease.objects.release(stranger) == 0
    assert [r.holder for r in engine.slots_list(slot_key="k")] == ["b"]


# ------------------------------------------------------------------------------ leader --


@pytest.mark.django_db
def test_the_leader_lease_is_elected_renewed_read_and_resigned(engine):
    expires = SchedulerLeader.objects.elect("sched", "a", lease=30)

    assert expires is not None
    assert SchedulerLeader.objects.elect("sched", "b", lease=30) is None
    assert SchedulerLeader.objects.current("sched") == engine.leader_get("sched")
    assert SchedulerLeader.objects.current("sched").holder == "a"
    assert SchedulerLeader.objects.elect("sched", "a", lease=timedelta(minutes=1)) > expires
    assert SchedulerLeader.objects.resign("sched", "b") is False
    assert SchedulerLeader.objects.resign("sched", "a") is True
    assert SchedulerLeader.objects.current("sched") is None


# ----------------------------------------------------------------- another database --


@pytest.mark.django_db(databases=["default", "jobs"])
def test_db_manager_runs_every_operation_on_that_database():
    here, there = get_engine("default"), get_engine("jobs")
    enqueue(there)
    jobs = Job.objects.db_manager("jobs")

    assert Job.objects.claim("default", worker_id="w", lease=LEASE) == []  # "default" is empty
    job = jobs.claim("default", worker_id="w", lease=LEASE)[0]
    assert there.job_get(job.id).state == "running" and here.job_get(job.id) is None
    assert jobs.renew(job, lease=LEASE) == {job.lease_token}
    assert Job.objects.renew(job, lease=LEASE) == frozenset()
    assert jobs.complete(job).outcome(job.lease_token) is Fence.OWNED
    assert there.job_get(job.id).state == "done"

    slots = JobLease.objects.db_manager("jobs")
    hold = slots.acquire(SlotRequest(slot_key="k", limit=1, holder="h"), ttl=60)[0]
    assert [r.holder for r in there.slots_list()] == ["h"] and here.slots_list() == []
    assert slots.release(hold) == 1

    leader = SchedulerLeader.objects.db_manager("jobs")
    assert leader.elect("sched", "a", lease=30) is not None
    assert there.leader_get("sched").holder == "a" and here.leader_get("sched") is None


@pytest.mark.django_db(databases=["default", "jobs"])
def test_with_the_router_the_managers_follow_xjobs_database():
    there = get_engine("jobs")
    with override_settings(XJOBS={**settings.XJOBS, "DATABASE": "jobs"},
                           DATABASE_ROUTERS=["django_xjobs.routers.XJobsRouter"]):
        enqueue(get_engine())
        job = claim()[0]
        assert Job.objects.complete(job).outcome(job.lease_token) is Fence.OWNED
    assert there.job_get(job.id).state == "done"
