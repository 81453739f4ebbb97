"""Enqueue: one live job per (name, tenant, key), created vs existing, ready vs delayed, bulk."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from django.db import connection, transaction

from django_xjobs import api, job, registry
from django_xjobs.exceptions import InvalidJobInput
from django_xjobs.models import Job, OutboxEntry
from django_xjobs.records import LIVE_STATES, Completion

from .conftest import claim_one, closing_connections, enqueue, params


def live_jobs(name: str, key: str) -> list[Job]:
    return list(Job.objects.filter(name=name, idempotency_key=key, state__in=LIVE_STATES))


# ---------------------------------------------------------------------- created vs existing --


@pytest.mark.django_db
def test_a_new_key_creates_a_job_and_the_same_key_returns_the_live_one(engine):
    first = enqueue(engine, key="k1", input={"n": 1})
    second = enqueue(engine, key="k1", input={"n": 2})

    assert first.created is True
    assert second.created is False
    assert str(second.id) == str(first.id)
    assert str(second.run_id) == str(first.run_id)
    assert second.state == first.state == "ready"
    assert Job.objects.count() == 1
    # The second call wrote nothing: the live job keeps the first input.
    assert engine.job_get(str(first.id)).input == {"n": 1}


@pytest.mark.django_db
def test_the_same_key_under_another_job_name_is_another_job(engine):
    a = enqueue(engine, name="testapp.noop", key="shared")
    b = enqueue(engine, name="testapp.record", key="shared")

    assert a.created and b.created
    assert str(a.id) != str(b.id)


@pytest.mark.django_db
def test_the_default_key_is_the_job_id_and_never_deduplicates(engine):
    p1, p2 = params(input={"same": True}), params(input={"same": True})
    r1, r2 = engine.job_enqueue(p1), engine.job_enqueue(p2)

    assert r1.created and r2.created
    assert {str(r1.id), str(r2.id)} == {str(p1.id), str(p2.id)}
    assert engine.job_get(str(p1.id)).idempotency_key == str(p1.id)
    assert engine.job_get(str(p2.id)).idempotency_key == str(p2.id)


@pytest.mark.django_db
def test_the_result_names_the_callers_own_ids_when_it_creates(engine):
    p = params(key="mine")
    result = engine.job_enqueue(p)

    assert result.created
    assert str(result.id) == str(p.id)
    assert str(result.run_id) == str(p.run_id)


@pytest.mark.django_db
@pytest.mark.parametrize("finished", ["done", "dead", "cancelled"])
def test_the_same_key_runs_again_once_the_first_job_is_finished(engine, finished):
    first = enqueue(engine, key="daily")
    Job.objects.filter(id=first.id).update(state=finished)

    again = enqueue(engine, key="daily")

    assert again.created is True
    assert str(again.id) != str(first.id)
    assert engine.job_get(str(first.id)).state == finished  # history is kept
    assert [str(j.id) for j in live_jobs("testapp.noop", "daily")] == [str(again.id)]


@pytest.mark.django_db
@pytest.mark.parametrize("live", ["ready", "delayed", "running", "suspended"])
def test_a_key_held_by_a_job_in_any_live_state_is_not_enqueued_again(engine, live):
    first = enqueue(engine, key="busy")
    Job.objects.filter(id=first.id).update(state=live)

    again = enqueue(engine, key="busy")

    assert again.created is False
    assert str(again.id) == str(first.id)
    assert again.state == live
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_the_key_of_a_job_finished_through_the_engine_is_free_again(engine):
    first = enqueue(engine, key="k")
    job = claim_one(engine)
    engine.jobs_complete_if_owned([Completion(claim=job.claim,
                                              result_json=None)])

    again = enqueue(engine, key="k")
    assert again.created and str(again.id) != str(first.id)


# --------------------------------------------------------------------------------- tenants --


@pytest.mark.django_db
def test_one_tenants_key_never_blocks_another_tenants_job(engine):
    acme = enqueue(engine, key="invoice:7", tenant="acme")
    globex = enqueue(engine, key="invoice:7", tenant="globex")

    assert acme.created and globex.created
    assert str(acme.id) != str(globex.id)
    assert len(live_jobs("testapp.noop", "invoice:7")) == 2


@pytest.mark.django_db
def test_one_tenants_key_is_not_revealed_to_another_tenant(engine):
    acme = enqueue(engine, key="secret", tenant="acme")

    assert engine.job_find_live_by_key("testapp.noop", "globex", "secret") is None
    assert engine.job_find_live_by_key("testapp.noop", None, "secret") is None
    found = engine.job_find_live_by_key("testapp.noop", "acme", "secret")
    assert found is not None and str(found.id) == str(acme.id) and found.created is False


@pytest.mark.django_db
def test_the_null_tenant_is_its_own_tenant_not_a_wildcard(engine):
    untenanted = enqueue(engine, key="k", tenant=None)
    acme = enqueue(engine, key="k", tenant="acme")
    untenanted_again = enqueue(engine, key="k", tenant=None)
    acme_again = enqueue(engine, key="k", tenant="acme")

    assert untenanted.created and acme.created
    assert str(untenanted.id) != str(acme.id)
    # NULL dedupes against NULL (it is not "distinct from everything") ...
    assert untenanted_again.created is False
    assert str(untenanted_again.id) == str(untenanted.id)
    # ... and never against a named tenant.
    assert acme_again.created is False
    assert str(acme_again.id) == str(acme.id)


# -------------------------------------------------------------------------- ready / delayed --


@pytest.mark.django_db
def test_a_run_at_in_the_future_makes_the_job_delayed(engine):
    run_at = engine.db_now() + timedelta(hours=1)
    result = enqueue(engine, run_at=run_at)

    assert result.state == "delayed"
    record = engine.job_get(str(result.id))
    assert record.state == "delayed"
    assert record.run_at == run_at


@pytest.mark.django_db
def test_a_run_at_in_the_past_makes_the_job_ready(engine):
    run_at = engine.db_now() - timedelta(hours=1)
    result = enqueue(engine, run_at=run_at)

    assert result.state == "ready"
    assert engine.job_get(str(result.id)).run_at == run_at


@pytest.mark.django_db
def test_a_run_at_of_exactly_now_is_due_and_ready(engine):
    result = enqueue(engine, run_at=engine.db_now())

    assert result.state == "ready"
    assert claim_one(engine).id == str(result.id)


@pytest.mark.django_db
def test_a_delay_makes_the_job_delayed_until_now_plus_the_delay(engine):
    before = engine.db_now()
    result = enqueue(engine, delay_ms=3_600_000)

    assert result.state == "delayed"
    run_at = engine.job_get(str(result.id)).run_at
    assert before + timedelta(minutes=59) <= run_at <= before + timedelta(minutes=61)


@pytest.mark.django_db
def test_no_delay_makes_the_job_ready_and_due_now(engine):
    before = engine.db_now()
    result = enqueue(engine)

    assert result.state == "ready"
    run_at = engine.job_get(str(result.id)).run_at
    assert before - timedelta(seconds=5) <= run_at <= before + timedelta(seconds=5)


@pytest.mark.django_db
def test_enqueue_records_what_the_caller_gave(engine):
    p = params(queue="emails", key="k", tenant="acme", priority=7, max_attempts=9,
               input={"user_id": 42, "tags": ["a", "b"]})
    engine.job_enqueue(p)

    record = engine.job_get(str(p.id))
    assert record.name == p.name
    assert record.queue == "emails"
    assert record.input == {"user_id": 42, "tags": ["a", "b"]}
    assert record.idempotency_key == "k"
    assert str(record.run_id) == str(p.run_id)
    assert record.tenant_id == "acme"
    assert record.priority == 7
    assert record.max_attempts == 9
    assert record.attempt == 0
    assert record.enqueued_by == "conformance"
    assert record.lease_token is None


# ------------------------------------------------------------------------------------ races --


@pytest.mark.django_db(transaction=True)
def test_sixteen_threads_racing_on_one_key_make_exactly_one_live_job(engine):
    racers = 16
    barrier = threading.Barrier(racers)
    batch = [params(key="race") for _ in range(racers)]

    @closing_connections
    def race(p):
        connection.ensure_connection()  # connect before the barrier: race the insert only
        barrier.wait(timeout=30)
        return engine.job_enqueue(p)

    with ThreadPoolExecutor(max_workers=racers) as pool:
        results = [f.result(timeout=60) for f in [pool.submit(race, p) for p in batch]]

    live = live_jobs("testapp.noop", "race")
    assert len(live) == 1
    assert Job.objects.count() == 1
    winner = str(live[0].id)
    assert sum(r.created for r in results) == 1
    assert {str(r.id) for r in results} == {winner}
    assert [str(p.id) for p, r in zip(batch, results, strict=True) if r.created] == [winner]


@pytest.mark.django_db(transaction=True)
def test_a_concurrent_inserter_that_rolls_back_does_not_block_the_key(engine):
    inserted, release = threading.Event(), threading.Event()
    loser, winner = params(key="contended"), params(key="contended")

    class Rollback(Exception):
        pass

    @closing_connections
    def insert_then_roll_back():
        try:
            with transaction.atomic():
                assert engine.job_enqueue(loser).created
                inserted.set()
                release.wait(timeout=20)
                raise Rollback
        except Rollback:
            return "rolled back"

    @closing_connections
    def insert():
        return engine.job_enqueue(winner)

    with ThreadPoolExecutor(max_workers=2) as pool:
        first = pool.submit(insert_then_roll_back)
        assert inserted.wait(timeout=20)
        second = pool.submit(insert)
        # Give the second inserter time to meet the first one's uncommitted row, then let go.
        try:
            second.result(timeout=0.5)
        except TimeoutError:
            pass
        release.set()
        assert first.result(timeout=30) == "rolled back"
        result = second.result(timeout=30)

    assert result.created is True
    assert str(result.id) == str(winner.id)
    assert [str(j.id) for j in live_jobs("testapp.noop", "contended")] == [str(winner.id)]
    assert not Job.objects.filter(id=loser.id).exists()


# ------------------------------------------------------------------------------------- bulk --


@pytest.mark.django_db
def test_bulk_enqueue_of_an_empty_batch_returns_nothing(engine):
    assert engine.jobs_enqueue([]) == []


@pytest.mark.django_db
def test_bulk_enqueue_returns_results_in_input_order(engine):
    batch = [params(key=f"k{i}", input={"i": i}) for i in range(25)]
    results = engine.jobs_enqueue(batch)

    assert [str(r.id) for r in results] == [str(p.id) for p in batch]
    assert [str(r.run_id) for r in results] == [str(p.run_id) for p in batch]
    assert all(r.created for r in results)
    for p in batch[::6]:
        assert engine.job_get(str(p.id)).input == {"i": int(p.idempotency_key[1:])}


@pytest.mark.django_db
def test_bulk_enqueue_dedupes_within_the_batch(engine):
    batch = [params(key="a"), params(key="b"), params(key=None), params(key="a"),
             params(key=None), params(key="b"), params(key="a")]
    results = engine.jobs_enqueue(batch)

    assert len(results) == len(batch)
    assert [r.created for r in results] == [True, True, True, False, True, False, False]
    assert str(results[3].id) == str(results[6].id) == str(batch[0].id)
    assert str(results[5].id) == str(batch[1].id)
    assert str(results[3].run_id) == str(batch[0].run_id)
    assert str(results[2].id) == str(batch[2].id)
    assert str(results[4].id) == str(batch[4].id)
    assert Job.objects.count() == 4


@pytest.mark.django_db
def test_bulk_enqueue_dedupes_against_live_jobs_but_not_finished_ones(engine):
    live = enqueue(engine, key="live")
    finished = enqueue(engine, key="finished")
    Job.objects.filter(id=finished.id).update(state="done")

    batch = [params(key="new"), params(key="live"), params(key="finished")]
    results = engine.jobs_enqueue(batch)

    assert [r.created for r in results] == [True, False, True]
    assert str(results[0].id) == str(batch[0].id)
    assert str(results[1].id) == str(live.id)
    assert results[1].state == "ready"
    assert str(results[2].id) == str(batch[2].id)


@pytest.mark.django_db
def test_bulk_enqueue_keys_are_scoped_by_tenant(engine):
    enqueue(engine, key="k", tenant="acme")
    batch = [params(key="k", tenant="globex"), params(key="k", tenant=None),
             params(key="k", tenant="acme"), params(key="k", tenant="globex")]
    results = engine.jobs_enqueue(batch)

    assert [r.created for r in results] == [True, True, False, False]
    assert str(results[3].id) == str(batch[0].id)


@pytest.mark.django_db
def test_bulk_enqueue_makes_each_job_ready_or_delayed_by_its_own_time(engine):
    now = engine.db_now()
    batch = [params(), params(delay_ms=3_600_000), params(run_at=now + timedelta(hours=2)),
             params(run_at=now - timedelta(hours=2))]
    results = engine.jobs_enqueue(batch)

    assert [r.state for r in results] == ["ready", "delayed", "delayed", "ready"]
    assert [engine.job_get(str(p.id)).state for p in batch] == [
        "ready", "delayed", "delayed", "ready"
    ]
    assert engine.job_get(str(batch[2].id)).run_at == now + timedelta(hours=2)


@pytest.mark.django_db
def test_bulk_enqueue_of_new_jobs_is_one_statement(engine, django_assert_num_queries):
    batch = [params(key=f"k{i}") for i in range(200)]
    with django_assert_num_queries(1):
        results = engine.jobs_enqueue(batch)
    assert len(results) == 200


@pytest.mark.django_db
def test_bulk_enqueue_with_duplicates_costs_the_same_statements_at_any_size(engine):
    from django.test.utils import CaptureQueriesContext

    def statements_for(size: int) -> int:
        existing = [enqueue(engine, key=f"{size}-old-{i}") for i in range(size // 2)]
        assert len(existing) == size // 2
        batch = [params(key=f"{size}-old-{i}") for i in range(size // 2)]
        batch += [params(key=f"{size}-new-{i % 3}") for i in range(size - size // 2)]
        with CaptureQueriesContext(connection) as ctx:
            results = engine.jobs_enqueue(batch)
        assert sum(r.created for r in results) == 3
        return len(ctx.captured_queries)

    small, large = statements_for(10), statements_for(300)
    assert small == large
    assert large <= 2


# ------------------------------------------------------------ input bound to the signature --
# Through the public API: an input the job's function cannot take used to be stored and then
# fail every attempt with a TypeError in the worker.

ADD = "conformance.add"


@pytest.fixture
def add():
    @job(name=ADD)
    def add(ctx, a, b):
        return a + b

    yield add
    registry.unregister(ADD)


BAD_CALLS = {
    "job.enqueue": lambda add: add.enqueue(c=1),
    "job.using().enqueue": lambda add: add.using(tenant_id="acme").enqueue(a=1, c=1),
    "enqueue(name)": lambda add: api.enqueue(ADD, {"c": 1}, priority=2),
    "enqueue_many": lambda add: api.enqueue_many([(ADD, {"a": 1, "b": 2}), (ADD, {"a": 1})]),
    "job.bulk_enqueue": lambda add: add.bulk_enqueue([{"a": 1, "b": 2}, {"b": 2, "c": 3}]),
    "job.enqueue_on_commit": lambda add: add.enqueue_on_commit(a=1),
    "enqueue_on_commit(name)": lambda add: api.enqueue_on_commit(ADD, {"b": 1, "c": 2}),
}


@pytest.mark.django_db
@pytest.mark.parametrize("call", BAD_CALLS)
def test_every_enqueue_refuses_an_input_the_function_cannot_take_and_sends_nothing(
    add, call, django_assert_num_queries
):
    with transaction.atomic():
        with django_assert_num_queries(0), pytest.raises(
            InvalidJobInput, match=r"input of conformance\.add does not fit add\(ctx, a, b\): "
        ) as info:
            BAD_CALLS[call](add)
        assert "missing required argument(s)" in str(info.value) or "unexpected" in str(info.value)
        # The caller's transaction is still usable, and holds no job and no staging.
        assert Job.objects.count() == 0
        assert OutboxEntry.objects.count() == 0


@pytest.mark.django_db
def test_an_input_that_binds_is_stored_as_keyword_arguments(add, engine):
    by_keyword = add.enqueue(a=1, b=2)
    by_position = add.using(priority=3).enqueue(1, b=2)  # stored under the parameters' names
    by_name = api.enqueue(ADD, {"b": 2, "a": 1})

    for handle in (by_keyword, by_position, by_name):
        assert engine.job_get(str(handle.id)).input == {"a": 1, "b": 2}
    assert engine.job_get(str(by_position.id)).priority == 3
