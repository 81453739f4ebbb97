"""Rate limits (docs/flow-control.md, "Rate limits") against real PostgreSQL: a bad
``RateLimit`` is refused when the job is declared, the key is formatted at enqueue and stored on
the row (through the outbox too), ``try_acquire`` / ``acquire`` spend an exact budget even
under a race, and the claim takes what the budget allows and puts the rest back, due when the
budget frees, without spending an attempt."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connections, transaction

from django_xjobs import RateLimit, clock, conf, job, registry
from django_xjobs.engines import get_engine
from django_xjobs.exceptions import ConfigurationError, InvalidRateKey
from django_xjobs.models import Job, OutboxEntry, RateUnit
from django_xjobs.outbox import relay_pending
from django_xjobs.worker.flow import Flow, claim_flow
from tests.conftest import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

RATED = "t.rated"
QUEUE = "rated"
PERIOD = timedelta(seconds=2)


@pytest.fixture(scope="module")
def rated() -> Iterator:
    """A job limited to 3 starts per 2 s per (tenant, account)."""

    @job(name=RATED, queue=QUEUE,
         rate_limit=RateLimit(key="partner:{tenant_id}:{account}", limit=3, period=PERIOD))
    def rated_job(ctx, account=None, n=0):
        return n

    yield rated_job
    registry.unregister(RATED)


def every_second(limit: int = 5, period: timedelta = timedelta(seconds=1)) -> RateLimit:
    return RateLimit(key="api:{tenant_id}", limit=limit, period=period)


# -------------------------------------------------------------------------- declaration --


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": -3}, "limit"),
        ({"limit": 1.5}, "limit"),
        ({"limit": True}, "limit"),
        ({"limit": "5"}, "limit"),
        ({"cost": 0}, "cost"),
        ({"cost": 2.0}, "cost"),
        ({"limit": 3, "cost": 4}, "more than its limit"),
        ({"period": timedelta(0)}, "period"),
        ({"period": timedelta(seconds=-1)}, "period"),
        ({"period": timedelta(days=32)}, "period"),
        ({"period": 60}, "period"),
        ({"key": ""}, "key"),
        ({"key": "a:{x!r}"}, "plain field"),
        ({"key": "a:{"}, "not valid"),
    ],
)
def test_a_bad_rate_limit_is_refused_where_it_is_declared(options, fragment):
    values = {"key": "k:{tenant_id}", "limit": 5, "period": timedelta(seconds=1), **options}
    with pytest.raises(ConfigurationError, match="RateLimit") as info:

        @job(name="t.bad_rate", rate_limit=RateLimit(**values))
        def bad(ctx):
            pass

    assert fragment in str(info.value)
    assert "t.bad_rate" not in registry.all_jobs()


def test_a_key_field_that_is_no_parameter_of_the_job_is_refused_at_job_time():
    try:
        with pytest.raises(ConfigurationError, match=r"\{account\}.*not a parameter"):

            @job(name="t.bad_rate_key",
                 rate_limit=RateLimit(key="p:{account}", limit=5, period=PERIOD))
            def bad(ctx, acct):
                pass

        assert "t.bad_rate_key" not in registry.all_jobs()
    finally:
        registry.unregister("t.bad_rate_key")


def test_rate_limit_takes_a_rate_limit_only():
    with pytest.raises(ConfigurationError, match="RateLimit"):

        @job(name="t.not_a_rate", rate_limit={"limit": 5})
        def bad(ctx):
            pass


# -------------------------------------------------------------------------------- enqueue --


def test_enqueue_stores_the_key_formatted_from_the_tenant_and_the_input(rated):
    handle = rated.using(tenant_id="acme").enqueue(account=7)

    assert Job.objects.get(pk=handle.id).rate_key == "partner:acme:7"


def test_a_tenant_id_input_field_fills_the_key_when_the_job_has_no_tenant():
    @job(name="t.rated_by_field",
         rate_limit=RateLimit(key="partner:{tenant_id}", limit=3, period=PERIOD))
    def by_field(ctx, tenant_id=None):
        pass

    try:
        handle = by_field.enqueue(tenant_id="globex")
        assert Job.objects.get(pk=handle.id).rate_key == "partner:globex"
    finally:
        registry.unregister("t.rated_by_field")


@pytest.mark.parametrize(("tenant", "input"), [(None, {"account": 7}), ("acme", {}),
                                               ("acme", {"account": ""}),
                                               ("acme", {"account": [1]})])
def test_a_missing_or_bad_key_field_raises_and_writes_nothing(rated, tenant, input):
    with pytest.raises(InvalidRateKey, match=r"partner:\{tenant_id\}:\{account\}"):
        rated.using(tenant_id=tenant).enqueue(**input)

    assert not Job.objects.exists()


def test_one_bad_item_of_a_bulk_enqueue_writes_nothing(rated):
    with pytest.raises(InvalidRateKey):
        rated.bulk_enqueue([{"account": 1}, {"account": 2}, {}], tenant_id="acme")

    assert not Job.objects.exists()


def test_a_job_staged_on_commit_keeps_its_rate_key_through_the_relay(rated):
    with transaction.atomic():
        staged = rated.using(tenant_id="acme").enqueue_on_commit(account=9)

    assert OutboxEntry.objects.get().rate_key == "partner:acme:9"
    assert relay_pending() == 1
    assert Job.objects.get(pk=staged.id).rate_key == "partner:acme:9"


def test_a_staging_without_its_key_field_raises_and_stages_nothing(rated):
    with pytest.raises(InvalidRateKey), transaction.atomic():
        rated.using(tenant_id="acme").enqueue_on_commit()

    assert not OutboxEntry.objects.exists()


# ------------------------------------------------------------------------- ordinary code --


def test_try_acquire_grants_the_limit_then_refuses():
    limit = every_second(limit=5, period=timedelta(minutes=1))

    grants = [limit.try_acquire(tenant_id="acme") for _ in range(7)]

    assert grants == [True] * 5 + [False] * 2
    assert limit.try_acquire(tenant_id="globex")  # another key, another budget
    assert sum(RateUnit.objects.filter(key="api:acme").values_list("cost", flat=True)) == 5


def test_try_acquire_counts_costs_against_the_limit():
    limit = every_second(limit=5, period=timedelta(minutes=1))

    assert limit.try_acquire(3, tenant_id="acme")
    assert not limit.try_acquire(3, tenant_id="acme")
    assert limit.try_acquire(2, tenant_id="acme")
    assert not limit.try_acquire(tenant_id="acme")
    with pytest.raises(ValueError, match="more than the limit"):
        limit.try_acquire(6, tenant_id="acme")
    with pytest.raises(InvalidRateKey):
        limit.try_acquire()  # no tenant: no key


def test_the_budget_frees_after_its_period():
    limit = every_second(limit=5)
    assert [limit.try_acquire(tenant_id="acme") for _ in range(6)] == [True] * 5 + [False]

    first = min(RateUnit.objects.filter(key="api:acme").values_list("at", flat=True))
    wait_until(lambda: get_engine().db_now() > first + timedelta(seconds=1),
               message="the first grant a period old on the database clock")

    assert limit.try_acquire(tenant_id="acme")


def test_acquire_waits_for_room_and_spends_it():
    limit = every_second(limit=5)
    for _ in range(5):
        assert limit.try_acquire(tenant_id="acme")

    started = time.monotonic()
    assert limit.acquire(tenant_id="acme", timeout=10)
    waited = time.monotonic() - started

    assert 0.5 < waited < 5, waited  # it had to wait for the first grant to leave the window
    assert sum(RateUnit.objects.filter(key="api:acme").values_list("cost", flat=True)) >= 1


@pytest.mark.parametrize("hours", [1, -1])
def test_acquire_on_a_machine_whose_wall_clock_is_off_waits_on_the_database_clock(hours):
    """Behind, it slept the hour it believed was left; ahead, it asked the database again every
    millisecond until the budget freed. The wait is for a budget that frees within a second;
    the join's deadline only bounds a failing test."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    limit = every_second(limit=1)
    assert limit.try_acquire(tenant_id="acme")
    result: dict[str, object] = {}

    def acquire() -> None:
        try:
            with CaptureQueriesContext(connection) as queries:
                result["acquired"] = limit.acquire(tenant_id="acme")  # no timeout
            result["statements"] = len(queries)
        finally:
            connection.close()

    with clock.override(now=lambda: datetime.now(UTC) + timedelta(hours=hours)):
        waiter = threading.Thread(target=acquire, daemon=True)
        waiter.start()
        waiter.join(30)

    assert not waiter.is_alive(), "acquire still sleeping on a wall clock an hour behind"
    assert result["acquired"] is True
    assert result["statements"] < 10, f"{result['statements']} statements for one short wait"


def test_acquire_gives_up_after_its_timeout_without_spending():
    limit = every_second(limit=5, period=timedelta(minutes=1))
    for _ in range(5):
        assert limit.try_acquire(tenant_id="acme")

    started = time.monotonic()
    assert limit.acquire(tenant_id="acme", timeout=timedelta(seconds=0.3)) is False
    waited = time.monotonic() - started

    assert 0.3 <= waited < 10, waited
    assert RateUnit.objects.filter(key="api:acme").count() == 5


def test_sixteen_threads_racing_on_one_key_get_exactly_the_limit():
    limit = every_second(limit=5, period=timedelta(minutes=1))
    start = threading.Barrier(16)
    grants: list[bool] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def race() -> None:
        try:
            start.wait()
            for _ in range(3):
                granted = limit.try_acquire(tenant_id="race")
                with lock:
                    grants.append(granted)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=race) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)

    assert errors == []
    assert len(grants) == 48
    assert grants.count(True) == 5
    assert RateUnit.objects.filter(key="api:race").count() == 5


# ---------------------------------------------------------------------------------- claim --


def test_a_claim_takes_what_the_budget_allows_and_puts_the_rest_back_until_it_frees(rated):
    handles = rated.using(tenant_id="acme").bulk_enqueue([{"account": 1}] * 10)
    flow = claim_flow(conf.get(), registry.all_jobs().values(), [QUEUE])
    engine = get_engine()

    batch = engine.jobs_claim(wants={QUEUE: 10}, worker_id="w", lease_ms=30_000, flow=flow)

    assert len(batch) == 3
    rows = list(Job.objects.filter(pk__in=[h.id for h in handles]))
    held = [r for r in rows if r.state != "running"]
    units = list(RateUnit.objects.filter(key="partner:acme:1"))
    assert len(units) == 3
    frees_at = min(u.at for u in units) + PERIOD
    assert batch.retry_at == frees_at
    assert len(held) == 7
    assert {r.state for r in held} == {"delayed"}
    assert {r.attempt for r in held} == {0}  # held back, not run: no attempt spent
    assert {r.run_at for r in held} == {frees_at}
    assert {r.worker_ids == [] for r in held} == {True}

    # Nothing is due before then: a claim right away takes nothing and spends nothing.
    again = engine.jobs_claim(wants={QUEUE: 10}, worker_id="w", lease_ms=30_000, flow=flow)
    assert len(again) == 0
    assert RateUnit.objects.filter(key="partner:acme:1").count() == 3

    # Once the budget frees, the next claim takes the next three.
    wait_until(lambda: engine.db_now() >= frees_at, message="the budget to free")
    later = engine.jobs_claim(wants={QUEUE: 10}, worker_id="w", lease_ms=30_000, flow=flow)
    assert len(later) == 3
    assert {c.attempt for c in later} == {1}


@pytest.mark.parametrize("hours", [1, -1])
def test_a_worker_whose_wall_clock_is_off_waits_for_the_budget_on_the_database_clock(rated, hours):
    """Ahead, it would claim again and again until the budget frees; behind, it would wait
    until its next poll (tests/acceptance/test_worker_clock.py shifts a real worker's clock)."""
    rated.using(tenant_id="acme").bulk_enqueue([{"account": 1}] * 4)
    flow = Flow(engine=get_engine(), settings=conf.get(), worker_id="w", queues=[QUEUE],
                poll_interval=60.0, stats=Counter())

    with clock.override(now=lambda: datetime.now(UTC) + timedelta(hours=hours)):
        batch = flow.claim({QUEUE: 10}, 30_000)
        wait = flow.wait_limit(clock.monotonic())

    assert len(batch) == 3 and batch.now is not None and batch.retry_at is not None
    assert batch.now < batch.retry_at <= batch.now + PERIOD
    assert wait is not None and 0 < wait <= PERIOD.total_seconds()


def test_each_key_has_its_own_budget_in_one_claim(rated):
    rated.using(tenant_id="acme").bulk_enqueue([{"account": 1}] * 4)
    rated.using(tenant_id="globex").bulk_enqueue([{"account": 1}] * 4)
    flow = claim_flow(conf.get(), registry.all_jobs().values(), [QUEUE])

    batch = get_engine().jobs_claim(wants={QUEUE: 10}, worker_id="w", lease_ms=30_000,
                                    flow=flow)

    assert sorted(c.tenant_id for c in batch) == ["acme"] * 3 + ["globex"] * 3
    assert Job.objects.filter(state="delayed", attempt=0).count() == 2


def test_a_claim_and_ordinary_code_share_one_budget(rated):
    limit = RateLimit(key="partner:{tenant_id}:{account}", limit=3, period=PERIOD)
    assert limit.try_acquire(tenant_id="acme", account=1)
    assert limit.try_acquire(tenant_id="acme", account=1)
    rated.using(tenant_id="acme").bulk_enqueue([{"account": 1}] * 3)
    flow = claim_flow(conf.get(), registry.all_jobs().values(), [QUEUE])

    batch = get_engine().jobs_claim(wants={QUEUE: 10}, worker_id="w", lease_ms=30_000,
                                    flow=flow)

    assert len(batch) == 1
    assert batch.retry_at is not None
