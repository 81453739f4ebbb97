"""The claim's plans on the table a long hold leaves behind (docs/performance.md, "Under a held
horizon"): its indexes grown large (a B-tree never gives its pages back to the file), the
heap cut back by VACUUM, a few live rows, and the statistics of an ANALYZE taken then. There the
planner, costing an index walk by the index's size, took the console's BRIN index and a bitmap
scan for the plain claim's due scan and a sequential scan of x_jobs for the fair claim's walk,
each reading every page of its range at every claim (a pick-up p50 of 21 ms, from 8, for minutes
after a 10-minute hold in ``make bench-horizon``). A worker's sessions turn both scans off
(session_label), so the claim keeps its index walks whatever the statistics say.

Like test_flow_plans.py this file speaks SQL and builds its table once for the module.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection, transaction

from tests.conformance.test_flow_plans import explain_generic, nodes
from tests.conformance.test_statements import claim_params

pytestmark = pytest.mark.django_db

# The jobs a hold left in the claim's indexes, then removed: enough for the indexes to outgrow
# the heap VACUUM leaves (the bench's 10-minute hold left 400-odd pages in each).
LEFT = 150_000
LIVE = 2_000
# Pages the claims below may read: their index probes and the rows they take.
CLAIM_PAGES = 200


# The table is built in a schema of its own, whose x_jobs the claim reaches by the search path:
# the statistics of its ANALYZE must not outlive the module on the x_jobs other tests plan on.
SCHEMA = "xjobs_after_a_hold"


@pytest.fixture(scope="module")
def after_a_hold(django_db_setup, django_db_blocker) -> Iterator[None]:
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(f"drop schema if exists {SCHEMA} cascade")
        cursor.execute(f"create schema {SCHEMA}")
        cursor.execute(f"create table {SCHEMA}.x_jobs (like public.x_jobs including all)"
                       " with (autovacuum_enabled = false)")
        cursor.execute(f"""
            insert into {SCHEMA}.x_jobs (id, idempotency_key, name, queue, state, tenant_id,
                                         run_at)
            select u, u::text, 'testapp.noop', q, 'ready', 't' || (g %% 50)::text,
                   now() - interval '1 hour' + g * interval '1 millisecond'
              from (select gen_random_uuid() as u, g,
                           case when g %% 2 = 0 then 'plain' else 'fair' end as q
                      from generate_series(1, %(n)s) g) s
        """, {"n": LEFT})
        cursor.execute(f"delete from {SCHEMA}.x_jobs")
        cursor.execute(f"vacuum {SCHEMA}.x_jobs")
        cursor.execute(f"""
            insert into {SCHEMA}.x_jobs (id, idempotency_key, name, queue, state, tenant_id,
                                         run_at, finished_at)
            select u, u::text, 'testapp.noop', 'plain', 'done', 't1', now(), now()
              from (select gen_random_uuid() as u from generate_series(1, %(n)s) g) s
        """, {"n": LIVE})
        cursor.execute(f"""
            insert into {SCHEMA}.x_jobs (id, idempotency_key, name, queue, state, tenant_id,
                                         run_at)
            select u, u::text, 'testapp.noop', q, 'ready', 't' || (g %% 3)::text, now()
              from (select gen_random_uuid() as u, g, q from generate_series(1, 5) g,
                           unnest(array['plain', 'fair']) q) s
        """, {})
        cursor.execute(f"analyze {SCHEMA}.x_jobs")
    yield
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(f"drop schema {SCHEMA} cascade")
    connection.close()


def claim_plan(engine, queue: str, *, worker_session: bool) -> dict:
    """The generic plan of a claim of ``queue`` on that table, on a session set up as a
    worker's (session_label, undone with the transaction) or left at the server's defaults."""
    claim = engine.statements()["jobs_claim"]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"set local search_path = {SCHEMA}, public")
        if worker_session:
            cursor.execute(engine.statements()["session_label"].sql,
                           {"label": None, "pin": True})
        plan = explain_generic(claim.sql, claim_params([queue], fair=queue == "fair"))
        transaction.set_rollback(True)
    return plan


def walks(plan: dict) -> list[str]:
    """The scans of x_jobs that read it whole: sequential, or bitmap (the BRIN index's)."""
    return [n["Node Type"] for n in nodes(plan)
            if n.get("Relation Name") == "x_jobs" and n.get("Actual Loops", 0) > 0
            and n["Node Type"] in ("Seq Scan", "Bitmap Heap Scan")]


def pages(plan: dict) -> int:
    return plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0)


@pytest.mark.parametrize("queue", ["plain", "fair"])
def test_left_to_the_defaults_the_planner_walks_the_table(engine, after_a_hold, queue):
    """What the worker's session settings prevent: this table does mislead the planner."""
    plan = claim_plan(engine, queue, worker_session=False)
    assert walks(plan), f"{pages(plan)} pages, no walk: the fixture no longer reproduces it"


@pytest.mark.parametrize("queue", ["plain", "fair"])
def test_a_workers_claim_keeps_its_index_walks(engine, after_a_hold, queue):
    plan = claim_plan(engine, queue, worker_session=True)
    assert walks(plan) == []
    assert pages(plan) < CLAIM_PAGES
    started = [n for n in nodes(plan) if n.get("Relation Name") == "x_jobs"
               and n["Node Type"] == "ModifyTable"]
    assert started and started[-1].get("Actual Rows", 0) == 5  # one claimed all five


@pytest.mark.parametrize("listen_alias,notify,pinned", [
    (None, True, True), ("direct", True, False), (None, False, False)])
def test_behind_a_pooler_the_scans_stay_as_the_server_has_them(listen_alias, notify, pinned):
    """A transaction pooler lends the session's server connection to other clients, with its
    settings: the scans are turned off only where the worker's sessions are its own (no
    LISTEN_DATABASE of a direct connection, NOTIFY on: docs/deployment.md)."""
    from django_xjobs.engines.postgres import PostgresEngine

    engine = PostgresEngine("default", notify=notify, listen_alias=listen_alias)
    with transaction.atomic(), connection.cursor() as cursor:
        engine.session_label("xjobs-tests-pin")
        cursor.execute("select current_setting('enable_seqscan'),"
                       " current_setting('enable_bitmapscan')")
        assert cursor.fetchone() == (("off", "off") if pinned else ("on", "on"))
        transaction.set_rollback(True)
