"""Fair share between tenants (docs/flow-control.md, "Fair share between tenants"): a queue with
``fair_by = "tenant"`` is claimed tenant by tenant, each taking up to its weight per turn, so a
tenant that enqueues a flood does not starve one that enqueues a little after it. Claims go
through the worker's own :class:`~django_xjobs.worker.flow.Flow` (its cursors included) against
real PostgreSQL, and every claimed run is completed as a worker would."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
from django.test import override_settings

from django_xjobs import conf
from django_xjobs.engines import get_engine
from django_xjobs.exceptions import ConfigurationError
from django_xjobs.records import Claim, ClaimBatch, Completion
from django_xjobs.worker.flow import Flow
from tests.testapp import jobs

pytestmark = pytest.mark.django_db(transaction=True)

FAIR = {"QUEUES": {"fair": {"fair_by": "tenant"}, "plain": {}}}


def flow(queue: str = "fair") -> Flow:
    """A worker's flow control for ``queue``, built from the settings in force."""
    return Flow(engine=get_engine(), settings=conf.get(), worker_id="w-fair", queues=[queue],
                poll_interval=60.0, stats=Counter())


def claim_and_complete(f: Flow, queue: str = "fair", n: int = 10) -> ClaimBatch:
    """One claim of up to ``n`` jobs, every run of it completed."""
    batch = f.claim({queue: n}, 30_000)
    if batch:
        get_engine().jobs_complete_if_owned([
            Completion(claim=Claim(job_id=c.id, lease_token=c.lease_token), result_json=None)
            for c in batch])
    return batch


def claims(f: Flow, queue: str = "fair", n: int = 10) -> Iterator[ClaimBatch]:
    """Claims until one comes back empty."""
    while batch := claim_and_complete(f, queue, n):
        yield batch


def enqueue(count: int, tenant: str | None, queue: str = "fair", **options) -> list:
    return jobs.noop.using(queue=queue, tenant_id=tenant, **options).bulk_enqueue(
        [{"n": i} for i in range(count)])


# ------------------------------------------------------------------------------ fairness --


def test_a_small_tenant_is_served_before_a_flooding_one_gets_ten_percent_further():
    enqueue(20_000, "A")
    b_ids = {str(h.id) for h in enqueue(20, "B")}  # enqueued after all of A's: later run_at

    served: Counter[str] = Counter()
    with override_settings(XJOBS=FAIR):
        f = flow()
        for batch in claims(f):
            served.update(c.tenant_id for c in batch)
            b_ids -= {c.id for c in batch}
            if not b_ids:
                break

    assert not b_ids, "B's jobs were never all claimed"
    assert served["B"] == 20
    assert served["A"] < 2_000, f"A had {served['A']} jobs claimed before B's 20 were"


def test_weights_share_the_claims_in_proportion_when_both_tenants_are_backlogged():
    enqueue(1_000, "A")
    enqueue(1_000, "B")

    served: Counter[str] = Counter()
    with override_settings(XJOBS={"QUEUES": {"fair": {"fair_by": "tenant",
                                                      "weights": {"A": 3}}}}):
        f = flow()
        for batch in claims(f):
            served.update(c.tenant_id for c in batch)
            if sum(served.values()) >= 400:
                break

    total = served["A"] + served["B"]
    assert total >= 400
    assert served["A"] / total == pytest.approx(0.75, abs=0.075), served  # 3:1 within 10 %


def test_jobs_without_a_tenant_are_one_tenant_among_the_others():
    enqueue(200, None)
    enqueue(200, "A")
    enqueue(200, "B")

    served: Counter[str | None] = Counter()
    with override_settings(XJOBS=FAIR):
        f = flow()
        for batch in claims(f):
            served.update(c.tenant_id for c in batch)
            if sum(served.values()) >= 60:
                break

    # Not 200 tenants of one job each, nor last in line: a third of the claims, like A and B.
    assert set(served) == {None, "A", "B"}
    assert max(served.values()) - min(served.values()) <= 2, served


def test_the_tenant_without_an_id_takes_the_weight_named_by_the_empty_string():
    enqueue(500, None)
    enqueue(500, "A")

    served: Counter[str | None] = Counter()
    with override_settings(XJOBS={"QUEUES": {"fair": {"fair_by": "tenant",
                                                      "weights": {"": 2}}}}):
        f = flow()
        for batch in claims(f):
            served.update(c.tenant_id for c in batch)
            if sum(served.values()) >= 150:
                break

    total = served[None] + served["A"]
    assert served[None] / total == pytest.approx(2 / 3, abs=0.07), served


def test_priority_still_orders_the_jobs_of_one_tenant():
    enqueue(30, "A", priority=0)
    urgent = enqueue(3, "A", priority=5)  # enqueued last, must be claimed first
    enqueue(30, "B", priority=0)

    with override_settings(XJOBS=FAIR):
        first = next(iter(claims(flow())))

    # The first claim takes A's share in A's own order: its three urgent jobs first.
    from_a = {c.id for c in first if c.tenant_id == "A"}
    assert len(from_a) >= 3
    assert {str(h.id) for h in urgent} <= from_a, from_a


def test_a_queue_without_fair_by_is_claimed_in_plain_order():
    first = enqueue(30, "A", queue="plain")
    enqueue(30, "B", queue="plain")

    with override_settings(XJOBS=FAIR):
        batch = claim_and_complete(flow("plain"), "plain", n=10)

    assert len(batch) == 10
    assert {c.tenant_id for c in batch} == {"A"}  # the oldest first, whoever enqueued them
    assert {c.id for c in batch} <= {str(h.id) for h in first}


def test_a_fair_queue_claims_for_every_tenant_up_to_the_share():
    """Ten tenants with work and a claim of 10: one job of each, in one claim."""
    for t in range(10):
        enqueue(5, f"t{t}")

    with override_settings(XJOBS=FAIR):
        batch = claim_and_complete(flow(), n=10)

    assert sorted(c.tenant_id for c in batch) == [f"t{t}" for t in range(10)]


# ------------------------------------------------------------------------------ settings --


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"fair_by": "x"}, "fair_by"),
        ({"fair_by": "tenant_id"}, "fair_by"),
        ({"weights": {"A": 3}}, "fair_by"),
        ({"fair_by": None, "weights": {"A": 3}}, "fair_by"),
        ({"fair_by": "tenant", "weights": {"A": 0}}, "weights"),
        ({"fair_by": "tenant", "weights": {"A": -1}}, "weights"),
        ({"fair_by": "tenant", "weights": {"A": 1.5}}, "weights"),
        ({"fair_by": "tenant", "weights": {"A": "3"}}, "weights"),
        ({"fair_by": "tenant", "weights": {"A": True}}, "weights"),
        ({"fair_by": "tenant", "weights": {1: 3}}, "weights"),
        ({"fair_by": "tenant", "weights": ["A"]}, "weights"),
    ],
)
def test_bad_fair_share_settings_are_refused_naming_the_queue(options, fragment):
    with pytest.raises(ConfigurationError, match="QUEUES") as info:
        conf.build({"QUEUES": {"fair": options}})
    assert fragment in str(info.value)
    assert "fair" in str(info.value)


def test_fair_share_settings_are_read():
    s = conf.build({"QUEUES": {"fair": {"fair_by": "tenant", "weights": {"A": 3, "": 2}},
                               "plain": {}}})
    assert s.fair_queues == frozenset({"fair"})
    assert dict(s.queue_weights["fair"]) == {"A": 3, "": 2}
    assert "plain" not in s.queue_weights


def test_a_claim_of_a_fair_queue_fills_its_share_from_the_tenants_there_are():
    """Fair share orders the claims; it must not shrink them. With one or two tenants
    backlogged a claim of 10 takes 10 (turn after turn), or a worker gets one job per tenant
    per claim, sees a claim that was not full and waits for the next poll: a fair queue with
    few tenants would run at a fraction of the workers' capacity."""
    enqueue(50, "A")

    with override_settings(XJOBS=FAIR):
        f = flow()
        alone = claim_and_complete(f, n=10)
        enqueue(50, "B")
        both = claim_and_complete(f, n=10)

    assert len(alone) == 10, f"a claim of 10 took {len(alone)} with one tenant backlogged"
    assert len(both) == 10, f"a claim of 10 took {len(both)} with two tenants backlogged"
    assert Counter(c.tenant_id for c in both) == {"A": 5, "B": 5}
