"""The hot path is pinned: one statement per claim, per ack batch, per heartbeat round, and two
(COPY, NOTIFY) per bulk enqueue of jobs due now, whatever the number of jobs
(docs/performance.md, "What the hot path costs")."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_xjobs import RateLimit, api, conf, enqueue_many, job, registry
from django_xjobs.engines import get_engine
from django_xjobs.models import Job
from django_xjobs.records import Completion, SlotHold
from django_xjobs.worker.flow import claim_flow
from tests.testapp import jobs as testapp_jobs

pytestmark = pytest.mark.django_db

N = 40
LEASE_MS = 60_000


def statements_run(fn):
    with CaptureQueriesContext(connection) as ctx:
        result = fn()
    return result, [q["sql"] for q in ctx.captured_queries]


def due_jobs(n: int, queue: str = "hot") -> set[str]:
    handles = testapp_jobs.record.using(queue=queue).bulk_enqueue({"tag": i} for i in range(n))
    return {str(h.id) for h in handles}


def claim(wants: dict[str, int]):
    return get_engine().jobs_claim(wants=wants, worker_id="tests:hot", lease_ms=LEASE_MS)


def test_claiming_n_jobs_is_one_statement():
    ids = due_jobs(N)
    claimed, sql = statements_run(lambda: claim({"hot": N}))
    assert {c.id for c in claimed} == ids
    assert len(sql) == 1
    assert Job.objects.filter(state="running").count() == N


def test_claiming_from_several_queues_is_one_statement():
    ids = due_jobs(10, "hot-a") | due_jobs(10, "hot-b") | due_jobs(10, "hot-c")
    claimed, sql = statements_run(lambda: claim({"hot-a": 10, "hot-b": 10, "hot-c": 10}))
    assert {c.id for c in claimed} == ids
    assert len(sql) == 1


def test_completing_n_jobs_is_one_statement():
    due_jobs(N)
    claimed = claim({"hot": N})
    batch = [Completion(claim=c.claim, result_json=f'{{"n": {i}}}')
             for i, c in enumerate(claimed)]
    report, sql = statements_run(lambda: get_engine().jobs_complete_if_owned(batch))
    assert report.owned == {c.lease_token for c in claimed}
    assert len(sql) == 1
    assert Job.objects.filter(state="done").count() == N


def test_one_heartbeat_round_for_n_leases_is_one_statement():
    due_jobs(N)
    claimed = claim({"hot": N})
    leases = [c.claim for c in claimed]
    renewed, sql = statements_run(lambda: get_engine().jobs_renew_if_owned(leases, LEASE_MS))
    assert renewed.renewed == {c.lease_token for c in claimed}
    assert len(sql) == 1


def test_a_heartbeat_round_reports_a_lost_lease_in_the_same_one_statement():
    due_jobs(N)
    claimed = claim({"hot": N})
    lost = claimed[7]
    api.cancel(lost.id)
    leases = [c.claim for c in claimed]
    renewed, sql = statements_run(lambda: get_engine().jobs_renew_if_owned(leases, LEASE_MS))
    assert renewed.renewed == {c.lease_token for c in claimed} - {lost.lease_token}
    assert len(sql) == 1


@pytest.mark.parametrize("n", [50, 500])
def test_bulk_enqueue_of_jobs_due_now_is_one_copy_and_one_notify(n):
    handles, sql = statements_run(
        lambda: testapp_jobs.record.bulk_enqueue({"tag": str(i)} for i in range(n))
    )
    assert len(handles) == n
    assert all(h.created for h in handles)
    assert len({h.id for h in handles}) == n
    assert len(sql) == 2
    assert sql[0].lower().startswith("copy x_jobs")
    assert "jobs_notify_queues" in sql[1] and "pg_notify" in sql[1]
    assert Job.objects.count() == n


def test_enqueue_many_of_500_mixed_jobs_costs_the_same_two_statements():
    items = [("testapp.record" if i % 2 else "testapp.noop", {"i": i}) for i in range(500)]
    handles, sql = statements_run(lambda: enqueue_many(items))
    assert len(handles) == 500
    assert len(sql) == 2
    assert Job.objects.filter(name="testapp.noop").count() == 250


def test_a_single_enqueue_is_one_statement():
    handle, sql = statements_run(lambda: testapp_jobs.record.enqueue(tag="one"))
    assert handle.created
    assert len(sql) == 1


# ------------------------------------------------------------------------- flow control --

@job(name="tests.hot.rated", queue="hot",
     rate_limit=RateLimit(key="hot-partner", limit=5, period=timedelta(seconds=30)))
def rated(ctx, tag):
    return tag


def test_a_claim_under_flow_control_is_one_statement_whatever_the_mix():
    """Unlimited, slot-limited (some keys full) and rate-limited (budget short) jobs in one
    batch: still one claim statement, one ack, one release of every slot of the settle."""
    unlimited = due_jobs(10)
    slotted = {str(testapp_jobs.slotted.using(queue="hot").enqueue(group=str(i % 3)).id)
               for i in range(12)}
    limited = {str(rated.enqueue(tag=i).id) for i in range(10)}
    flow = claim_flow(conf.get(), registry.all_jobs().values(), ["hot"])

    claimed, sql = statements_run(lambda: get_engine().jobs_claim(
        wants={"hot": 40}, worker_id="tests:hot", lease_ms=LEASE_MS, flow=flow))

    assert len(sql) == 1
    ids = {c.id for c in claimed}
    assert unlimited <= ids
    assert len(ids & slotted) == 6  # 2 slots x 3 keys; the other 6 are blocked
    assert len(ids & limited) == 5  # the budget; the other 5 are due when it frees
    assert Job.objects.filter(state="blocked").count() == 6
    assert claimed.retry_at is not None

    batch = [Completion(claim=c.claim, result_json="null") for c in claimed]
    _report, sql = statements_run(lambda: get_engine().jobs_complete_if_owned(batch))
    assert len(sql) == 1
    holds = [SlotHold(slot_key=c.concurrency_key, slot=c.slot, holder=f"{c.id}/{c.lease_token}"
                      "/tests:hot", limit=2)
             for c in claimed if c.slot is not None and c.concurrency_key is not None]
    _released, sql = statements_run(lambda: get_engine().slots_release_if_held(holds))
    assert len(sql) == 1
    assert Job.objects.filter(state="blocked").count() == 0  # each freed slot woke one
