"""The wire format itself: every statement is named, explained, and valid on the migrated schema.

This file alone speaks SQL: it EXPLAINs the engine's own statement text with dummy parameters,
so a statement that no longer matches the schema (a renamed column, a dropped index's
``on conflict`` target) fails here rather than in a worker.
"""

from __future__ import annotations

import importlib
import re
import uuid
from datetime import timedelta

import pytest
from django.db import DatabaseError, connection, transaction

from django_xjobs.engines.base import Statement
from django_xjobs.models import Job

PLACEHOLDER = re.compile(r"%\((\w+)\)s(::\w+(\[\]))?")

# Dummy values by placeholder name; a placeholder cast to an array gets a list of one.
SCALARS = {
    "id": uuid.uuid4(), "run_id": uuid.uuid4(), "token": uuid.uuid4(),
    "name": "testapp.noop", "queue": "default", "input": "{}", "key": "k", "error": "boom",
    "tenant_id": "acme", "traceparent": None, "enqueued_by": "tests", "concurrency_key": None,
    "reason": "because", "note": "note", "worker_id": "worker-1", "label": "xjobs-tests",
    "pin": True, "max_attempts": 3, "priority": 0, "delay_ms": 0, "lease_ms": 30_000, "batch": 100,
    "notify": False, "permanent": False, "spent": True, "resumed": False, "results": "[{}]",
    "job_id": uuid.uuid4(), "output": "{}", "event": "evt", "correlation_key": None,
    "event_id": 1, "event_published_at": None, "status": "sleeping", "duration_ms": 1000,
    "prefix": "race#%", "payload": "{}", "ttl_ms": 60_000, "after_id": 0, "limit": 10,
    "meta": '[["0190a1b2-0000-7000-8000-000000000000", "testapp.noop", "default", null,'
            ' "0190a1b2-0000-7000-8000-000000000001", 3, 0, null, 0, null, null, "t", null]]',
    "inputs": "[{}]",
    # scheduler and maintenance
    "lock_key": "scheduler", "holder": "worker-1", "margin_ms": 1000, "advisory_pid": None,
    "lock_class": 1937010803, "lock_id": 12345, "paused": False, "grace_ms": 30_000,
}
SCALARS.update({  # ---- backfills
    "checksum": "0" * 64, "app_version": "1.0", "processed": 100, "cursor": "100",
})
SCALARS.update({"shift_ms": 60_000})  # ---- test support (django_xjobs/testing)
SCALARS.update({  # ---- child jobs
    "parent_id": uuid.uuid4(), "parent_step": "fan", "children": '["0190a1b2-0000-7000-8000-0"]',
    "pending": 1, "timeout_ms": None,
})
SCALARS.update({"rate_key": None, "slot_ttl_ms": 30_000, "host": "h", "pid": 1,
                "queues": '["default"]', "stale_ms": 1000, "take": 1})  # ---- flow control, workers
SCALARS.update({"period_ms": 60_000, "cost": 1})  # ---- why a job is not running
SCALARS.update({"debounce_ms": 5_000, "max_wait_ms": 60_000})  # ---- debounce
SCALARS.update({"state": "done", "floor": None})  # ---- history tables
SCALARS.update({"after_job_id": None})  # ---- deploy check
SCALARS.update({"max_ms": 60_000})  # ---- job names no worker knows
SCALARS.update({"kind": "key", "until": None, "for_ms": 60_000})  # ---- pauses
SCALARS.update({"outcome": "failed", "done": 1.0, "total": 10.0, "message": None,
                "grain": "minute", "since": None, "minute_ms": 1000, "hour_ms": 1000,
                "day_ms": 1000})  # ---- observability
SCALARS.update({"version": "1.0", "concurrency": 4, "running": 1, "finished": 10,
                "claimed_age_ms": 1000, "loop_age_ms": 100,
                "stall_ms": 300_000})  # ---- workers and health probes
SCALARS.update({"unique_for_ms": 3_600_000,
                "job_unique_for_ms": 3_600_000})  # ---- idempotency windows
SCALARS.update({"park": True, "hold_ms": 1000, "compatible_with": "0.1",
                "changed_by": "tests"})  # ---- mixed-version fleets
SCALARS.update({"scans": True})  # ---- the claim's floors (worker/floors.py)
SCALARS.update({"error_prefix": "exception-class: x.Failed\n"})  # ---- a workflow's resume
LISTS = {
    "enqueued_by": "cron:nightly",  # ---- cron overlap
    "ids": uuid.uuid4(), "run_ids": uuid.uuid4(), "tokens": uuid.uuid4(),
    "names": "testapp.noop", "queues": "default", "inputs": "{}", "keys": "k",
    "results": "{}", "tenant_ids": "acme", "traceparents": None, "enqueued_bys": "tests",
    "concurrency_keys": None, "max_attempts": 3, "priorities": 0, "delays_ms": 0, "limits": 10,
    "states": "done", "run_ats": None,
    "job_ids": uuid.uuid4(),  # outbox_mark_published
    "parents": uuid.uuid4(),  # jobs_cancel_tree
    "holders": "job/token/worker", "slots": 0, "spent": True, "resumed": False,  # slots
    "hold_tokens": uuid.uuid4(),
    "notes": None, "outcomes": "handed_back", "counts": 1,
    # ---- flow control
    "fair": False, "cursors": "", "limit_names": "testapp.noop", "limit_values": 2,
    "prefixes": "slot:", "prefix_limits": 2, "rate_names": "testapp.noop", "rate_limits": 10,
    "rate_periods": 1000, "rate_costs": 1, "weight_queues": "default", "weight_tenants": "acme",
    "weight_values": 2, "periods": 1000, "costs": 1,
    # ---- the claim's floors (worker/floors.py)
    "floored": True, "floor_queues": "default", "floor_priorities": 0,
    "step_ids": 1,  # ---- a workflow's resume
}
# Filled with the database clock.
TIMES = {"run_at", "wake_at", "before", "after_at", "at", "ats", "lapsed_from", "floor_values"}


def placeholders(sql: str) -> dict[str, bool]:
    """Placeholder name -> whether the statement casts it to an array."""
    found: dict[str, bool] = {}
    for match in PLACEHOLDER.finditer(sql):
        found[match.group(1)] = found.get(match.group(1), False) or bool(match.group(3))
    return found


def dummy_params(sql: str, now) -> dict[str, object]:
    values: dict[str, object] = {}
    for name, is_array in placeholders(sql).items():
        if name in TIMES:
            values[name] = [now] if is_array else now
        elif is_array:
            values[name] = [LISTS[name]]
        else:
            values[name] = SCALARS[name]
    return values


def statements_module(engine):
    """``engines/<engine>/statements``: the wire-format module (or package) of this engine."""
    package = type(engine).__module__.rsplit(".", 1)[0]
    return importlib.import_module(f"{package}.statements")


def test_every_statement_is_named_by_its_key_and_says_why(engine):
    statements = engine.statements()

    assert statements, "the engine declares no statements"
    for key, statement in statements.items():
        assert isinstance(statement, Statement), key
        assert statement.name == key
        assert re.fullmatch(r"[a-z][a-z0-9_]*", statement.name), statement.name
        assert statement.why.strip(), f"{key} has no why"
        assert statement.sql.strip(), f"{key} has no text"


def test_no_two_statements_share_a_name(engine):
    # engine.statements() is a mapping, so a duplicated name would silently hide a statement:
    # count the Statement constants the wire-format package's family modules declare.
    module = statements_module(engine)
    declared = [v for family in module.FAMILIES for v in vars(family).values()
                if isinstance(v, Statement)]
    names = [s.name for s in declared]

    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert set(names) == set(engine.statements())
    assert all(engine.statements()[s.name] is s for s in declared)


@pytest.mark.django_db
def test_every_statement_runs_under_explain_on_the_migrated_schema(engine):
    now = engine.db_now()
    failures = {}
    checked = 0
    for name, statement in engine.statements().items():
        params = dummy_params(statement.sql, now)
        text = statement.sql.strip()
        utility = re.match(r"(listen|unlisten|notify)\b", text, re.IGNORECASE)
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                # EXPLAIN plans without executing; a utility statement cannot be explained, so
                # it runs inside a savepoint that is rolled back. COPY runs with no rows.
                if text.lower().startswith("copy"):
                    with cursor.cursor.copy(text):
                        pass
                else:
                    cursor.execute(text if utility else f"explain {text}", params)
                    if not utility:
                        assert cursor.fetchall(), f"{name}: EXPLAIN returned no plan"
                transaction.set_rollback(True)
        except DatabaseError as exc:
            failures[name] = str(exc).strip().splitlines()[0]
        checked += 1

    assert checked == len(engine.statements())
    assert failures == {}


@pytest.mark.django_db
def test_the_claim_walks_the_claim_index(engine):
    now = engine.db_now()
    states = ["done"] * 6 + ["ready", "delayed", "suspended", "dead", "cancelled", "running"]
    Job.objects.bulk_create([
        Job(name="testapp.noop", queue=f"q{i % 4}", idempotency_key=f"k{i}",
            state=states[i % len(states)], priority=i % 7,
            run_at=now + timedelta(seconds=(i % 200) - 100),
            visible_at=now + timedelta(seconds=30) if states[i % len(states)] == "running"
            else None)
        for i in range(2000)
    ])
    with connection.cursor() as cursor:
        cursor.execute("analyze x_jobs")
        claim = engine.statements()["jobs_claim"]
        cursor.execute(f"explain {claim.sql.strip()}", claim_params(["q1"]))
        plan = "\n".join(row[0] for row in cursor.fetchall())

    assert "x_jobs_claim_idx" in plan, plan


def claim_params(queues: list[str], *, fair: bool = False, cursor: str = "") -> dict:
    """jobs_claim's parameters for up to 10 jobs of each queue, without flow-control limits."""
    empty = ("limit_names", "limit_values", "prefixes", "prefix_limits", "rate_names",
             "rate_limits", "rate_periods", "rate_costs", "weight_queues", "weight_tenants",
             "weight_values")
    return {"queues": queues, "limits": [10] * len(queues), "fair": [fair] * len(queues),
            "cursors": [cursor] * len(queues), "worker_id": "worker-1", "lease_ms": 30_000,
            "slot_ttl_ms": 30_000, "park": True, "hold_ms": 1000,
            "floored": [False] * len(queues), "lapsed_from": [None] * len(queues),
            "floor_queues": [], "floor_priorities": [], "floor_values": [], "scans": False,
            **{name: [] for name in empty}}


def _buffers(plan: dict) -> int:
    return plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0)


@pytest.mark.django_db
def test_a_publish_visits_its_own_waiters_not_every_waiter_of_the_event(engine):
    """event_wake_waiters stays linear: with many jobs waiting on one event under other
    correlation keys, waking one key's waiter reads a handful of pages. As a semi-join on fresh,
    unanalysed tables it walked every suspended job times every waiting step (48,000 pages at
    250 waiters), so each publish cost more the more jobs were waiting."""
    from django_xjobs.models import JobStep

    now = engine.db_now()
    waiters = 400
    jobs = [Job(name="testapp.noop", queue="default", idempotency_key=f"w{i}",
                state="suspended", run_at=now + timedelta(hours=1), run_id=uuid.uuid4())
            for i in range(waiters)]
    Job.objects.bulk_create(jobs)
    JobStep.objects.bulk_create([
        JobStep(run_id=job.run_id, name="wait", status="waiting", event="evt",
                correlation_key=str(i), wake_at=now + timedelta(hours=1))
        for i, job in enumerate(jobs)
    ])
    wake = engine.statements()["event_wake_waiters"]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"explain (analyze, buffers, format json) {wake.sql.strip()}",
                       {"name": "evt", "correlation_key": "7"})
        [[[plan]]] = cursor.fetchall()
        transaction.set_rollback(True)

    root = plan["Plan"]
    assert root["Plans"][0]["Actual Rows"] == 1  # the woken job: only key 7's waiter
    # The woken row's new version enters every index of x_jobs (a BRIN summary among them):
    # tens of pages; the walk this guards against read 48,000.
    assert _buffers(root) < 150, f"{_buffers(root)} pages read to wake one of {waiters} waiters"


def _rows_read(plan: dict, relation: str) -> int:
    """Rows that the plan's scans of ``relation`` returned, over all their loops."""
    own = 0
    if plan.get("Relation Name") == relation and "Scan" in plan["Node Type"]:
        own = plan["Actual Rows"] * plan["Actual Loops"]
    return own + sum(_rows_read(child, relation) for child in plan.get("Plans", []))


def _explain_analyze(sql: str, params: dict) -> dict:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"explain (analyze, buffers, format json) {sql.strip()}", params)
        [[[plan]]] = cursor.fetchall()
        transaction.set_rollback(True)
    return plan["Plan"]


@pytest.mark.django_db
def test_an_idle_claim_does_not_walk_the_jobs_that_are_not_due(engine):
    """With many delayed jobs and none due, a claim probes each priority once and stops: a
    single (priority desc, run_at) scan cannot stop at the first row not yet due, and read
    every delayed row of the queue on every poll of an idle worker."""
    now = engine.db_now()
    Job.objects.bulk_create([
        Job(name="testapp.noop", queue="default", idempotency_key=f"d{i}", state="delayed",
            priority=i % 3, run_at=now + timedelta(hours=1, seconds=i))
        for i in range(20_000)
    ])
    with connection.cursor() as cursor:
        cursor.execute("analyze x_jobs")
    claim = engine.statements()["jobs_claim"]
    plan = _explain_analyze(claim.sql, claim_params(["default"]))

    # A walk of the 20,000 delayed rows reads hundreds of pages; the probes of the priorities,
    # the lapsed branch and the queue's pause read a few dozen.
    assert _buffers(plan) < 80, f"{_buffers(plan)} pages read by a claim that found nothing"


@pytest.mark.django_db
def test_a_purge_batch_reads_its_batch_not_every_finished_job(engine):
    now = engine.db_now()
    Job.objects.bulk_create([
        Job(name="testapp.noop", queue="default", idempotency_key=f"f{i}",
            state=("done", "dead", "cancelled")[i % 3], run_at=now,
            finished_at=now - timedelta(days=30, seconds=i))
        for i in range(6_000)
    ])
    with connection.cursor() as cursor:
        cursor.execute("analyze x_jobs")
    purge = engine.statements()["jobs_purge"]
    plan = _explain_analyze(purge.sql, {"states": ["done", "dead", "cancelled"],
                                        "before": now - timedelta(days=7), "batch": 100})

    # At most a batch per state to choose from, then the batch itself to delete.
    assert _rows_read(plan, "x_jobs") <= 4 * 100, _rows_read(plan, "x_jobs")


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["job_find_live_by_key", "jobs_find_live_by_keys"])
def test_the_live_job_of_a_key_is_found_through_the_live_key_index(engine, name):
    """Its filters must imply the partial index's predicate, or the index cannot serve them."""
    statement = engine.statements()[name]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("set local enable_seqscan = off")
        cursor.execute(f"explain {statement.sql.strip()}", dummy_params(statement.sql,
                                                                         engine.db_now()))
        plan = "\n".join(row[0] for row in cursor.fetchall())

    assert "x_jobs_live_key_uniq" in plan, plan


# ---- idempotency windows (docs/durable.md, "Idempotency windows")


@pytest.mark.django_db
def test_a_window_purge_batch_reads_its_batch_not_every_key_row(engine):
    from django_xjobs.models import JobKey

    now = engine.db_now()
    JobKey.objects.bulk_create([
        JobKey(name="testapp.noop", key=f"k{i}", job_id=uuid.uuid4(),
               unique_for_ms=None if i % 3 == 0 else 1000,  # "forever" rows stay
               finished_at=None if i % 3 == 1 else now - timedelta(days=30, seconds=i))
        for i in range(6_000)
    ])
    with connection.cursor() as cursor:
        cursor.execute("analyze x_job_keys")
    purge = engine.statements()["job_keys_purge_expired"]
    plan = _explain_analyze(purge.sql, {"batch": 100})

    # Only rows with a finished window are candidates (the partial expiry index), oldest first:
    # the batch to choose, then the batch to delete.
    assert _rows_read(plan, "x_job_keys") <= 2 * 100, _rows_read(plan, "x_job_keys")
    assert plan["Actual Rows"] == 0 and engine.job_keys_purge_expired(batch_size=100) == 2_000
