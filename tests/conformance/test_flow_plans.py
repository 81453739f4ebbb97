"""The flow-control statements stay index walks at scale: a claim of a fair queue, a plain
claim and the wake-up of blocked jobs read a bounded number of pages with a million jobs queued,
never the table (docs/flow-control.md; docs/performance.md).

Like test_statements.py this file speaks SQL: the million rows go in with one
``INSERT ... SELECT generate_series`` (the ORM would take minutes), once for the module, and are
deleted after it. Each statement runs under EXPLAIN (ANALYZE, BUFFERS) in a transaction that is
rolled back, so every test sees the same rows.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from django.db import connection, transaction

from tests.conformance.test_statements import claim_params

pytestmark = pytest.mark.django_db

JOBS = 1_000_000
TENANTS = 1_000
BLOCKED = 10_000
BLOCKED_KEYS = 1_000
# Pages a claim of 10 may read: the index probes of a dozen tenants and the 10 rows it takes
# (their heap pages and the index entries of their new versions). A walk of the table or of
# its claim index reads tens of thousands (asserted below, so the bound means something).
CLAIM_PAGES = 400


@pytest.fixture(scope="module")
def million(django_db_setup, django_db_blocker) -> Iterator[dict]:
    """A million due jobs of queue ``fair`` over 1,000 tenants (with a job without tenant every
    1,001st), and 10,000 jobs blocked on 1,000 concurrency keys that are all full (each key's
    only slot held): committed once, deleted after the module."""
    started = time.monotonic()
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute("select count(*) from x_jobs")
        assert cursor.fetchone()[0] == 0, "x_jobs must start empty: the teardown deletes it all"
        # No autovacuum on the table while the module runs: an automatic ANALYZE started by the
        # bulk insert and finishing after the fixture's own would replace its statistics
        # with another sample's, and the plans pinned here with them.
        cursor.execute("alter table x_jobs set (autovacuum_enabled = false)")
        cursor.execute("""
            insert into x_jobs (id, idempotency_key, name, queue, state, tenant_id, priority,
                                run_at)
            select u, u::text, 'testapp.noop', 'fair', 'ready',
                   case when g %% 1001 = 0 then null else 't' || lpad((g %% %(t)s)::text, 4, '0')
                   end,
                   g %% 3, now() - interval '1 hour' + g * interval '1 millisecond'
              from (select gen_random_uuid() as u, g from generate_series(1, %(n)s) g) s
        """, {"n": JOBS, "t": TENANTS})
        cursor.execute("""
            insert into x_jobs (id, idempotency_key, name, queue, state, concurrency_key,
                                blocked_on, run_at)
            select u, u::text, 'testapp.noop', 'blocked', 'blocked', k, k,
                   now() - interval '1 hour' + g * interval '1 millisecond'
              from (select gen_random_uuid() as u, g, 'key:' || (g %% %(k)s)::text as k
                      from generate_series(1, %(n)s) g) s
        """, {"n": BLOCKED, "k": BLOCKED_KEYS})
        cursor.execute("""
            insert into x_job_leases (lease_key, slot, holder, expires_at)
            select 'key:' || k::text, 0, 'outsider-' || k::text, now() + interval '1 hour'
              from generate_series(0, %(k)s - 1) k
        """, {"k": BLOCKED_KEYS})
        cursor.execute("analyze x_jobs")
        cursor.execute("analyze x_job_leases")
        cursor.execute("select pg_relation_size('x_jobs') / current_setting('block_size')::int")
        table_pages = cursor.fetchone()[0]
    setup = time.monotonic() - started
    print(f"\nflow plans: {JOBS:,} jobs + {BLOCKED:,} blocked inserted and analysed in "
          f"{setup:.1f}s ({table_pages:,} pages)")
    yield {"table_pages": table_pages}
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute("truncate x_jobs, x_job_leases, x_rate_units")
        cursor.execute("alter table x_jobs reset (autovacuum_enabled)")
    connection.close()


def explain(sql: str, params: dict) -> dict:
    """The executed plan of ``sql``, its writes rolled back, on a session set up as a worker's
    is (session_label: ``jit`` off, or compiling the plan would cost seconds here)."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("set local jit = off")
        cursor.execute(f"explain (analyze, buffers, format json) {sql.strip()}", params)
        [[[plan]]] = cursor.fetchall()
        transaction.set_rollback(True)
    return plan["Plan"]


def explain_generic(sql: str, params: dict) -> dict:
    """As :func:`explain`, with the plan a worker's session runs: the GENERIC plan of the
    prepared statement (session_label sets ``plan_cache_mode = force_generic_plan``), planned
    once for any parameters, not for these. The statement is prepared with ``$n`` parameters
    (in order of first appearance, as psycopg numbers them) and executed with these values."""
    from psycopg import sql as pgsql

    from django_xjobs.engines import numbered

    text, order = numbered(sql.strip())
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("set local jit = off")
        cursor.execute("set local plan_cache_mode = force_generic_plan")
        # With parameters (none), so the driver turns the doubled `%%` back into one: without
        # them it sends the text as it is, and a literal `like 'cron:%'` would reach the
        # planner as 'cron:%%', matching no partial index's predicate.
        cursor.execute(f"prepare xjobs_generic as {text}".replace("%", "%%"), [])
        raw = connection.connection
        values = pgsql.SQL(", ").join(pgsql.Literal(params[name]) for name in order)
        query = pgsql.SQL("explain (analyze, buffers, format json) execute xjobs_generic ({})")
        [[[plan]]] = raw.execute(query.format(values)).fetchall()
        cursor.execute("select generic_plans, custom_plans from pg_prepared_statements"
                       " where name = 'xjobs_generic'")
        assert cursor.fetchone() == (1, 0)
        cursor.execute("deallocate xjobs_generic")
        transaction.set_rollback(True)
    return plan["Plan"]


PLANNERS = {"custom": explain, "generic": explain_generic}


def nodes(plan: dict) -> Iterator[dict]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def buffers(plan: dict) -> int:
    return plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0)


def seq_scans(plan: dict, relation: str) -> list[dict]:
    return [n for n in nodes(plan)
            if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == relation]


def indexes(plan: dict) -> set[str]:
    return {n["Index Name"] for n in nodes(plan) if "Index Name" in n}


def returned(plan: dict) -> int:
    """Rows of the statement's answer (the top node)."""
    return plan["Actual Rows"]


def claimed(plan: dict) -> int:
    """Jobs in a claim's answer: its rows less the row without a job that ends every claim's
    answer (what flow control held back, the database's clock)."""
    return returned(plan) - 1


def test_the_bound_would_fail_for_a_walk_of_the_table(million):
    assert million["table_pages"] > 20 * CLAIM_PAGES, million


@pytest.mark.parametrize("planner", sorted(PLANNERS))
@pytest.mark.parametrize("cursor", ["", "t0500", "t0999"])
def test_a_fair_claim_walks_a_few_tenants_of_a_million_jobs(engine, million, cursor, planner):
    claim = engine.statements()["jobs_claim"]
    plan = PLANNERS[planner](claim.sql, claim_params(["fair"], fair=True, cursor=cursor))

    assert claimed(plan) == 10
    assert "x_jobs_fair_tenant_idx" in indexes(plan), indexes(plan)
    assert seq_scans(plan, "x_jobs") == []
    assert buffers(plan) < CLAIM_PAGES, f"{buffers(plan)} pages read by a fair claim of 10"


@pytest.mark.parametrize("planner", sorted(PLANNERS))
def test_a_plain_claim_reads_its_batch_of_a_million_jobs(engine, million, planner):
    claim = engine.statements()["jobs_claim"]
    plan = PLANNERS[planner](claim.sql, claim_params(["fair"]))

    assert claimed(plan) == 10
    assert "x_jobs_claim_idx" in indexes(plan), indexes(plan)
    assert seq_scans(plan, "x_jobs") == []
    assert buffers(plan) < CLAIM_PAGES, f"{buffers(plan)} pages read by a plain claim of 10"


def executed_indexes(plan: dict) -> set[str]:
    return {n["Index Name"] for n in nodes(plan)
            if "Index Name" in n and n.get("Actual Loops", 0) > 0}


def plain_claim_without_the_claim_index(engine, planner: str, also: str = "") -> dict:
    """The plan of a plain claim of queue ``fair`` with x_jobs_claim_idx dropped (and ``also``
    run first), in a transaction rolled back. Bitmap and sequential scans are off: whatever
    index can serve the due scan, the planner takes it."""
    claim = engine.statements()["jobs_claim"]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("set local enable_bitmapscan = off")
        cursor.execute("set local enable_seqscan = off")
        cursor.execute("drop index x_jobs_claim_idx")
        if also:
            cursor.execute(also)
        plan = PLANNERS[planner](claim.sql, claim_params(["fair"]))
        transaction.set_rollback(True)
    return plan


@pytest.mark.parametrize("planner", sorted(PLANNERS))
def test_a_plain_claim_cannot_walk_the_fair_index(engine, million, planner):
    """The fair index covers the same rows as the claim index, but bounds a scan of a queue
    that is not fair by its queue alone: a floor (worker/floors.py) cannot shorten it, so under
    a held horizon it reads every dead entry of the queue. Its predicate keeps it to the
    statements that name the tenant expression: even with the claim index gone, the plain
    claim does not use it."""
    plan = plain_claim_without_the_claim_index(engine, planner)

    assert "x_jobs_fair_tenant_idx" not in executed_indexes(plan), executed_indexes(plan)
    assert claimed(plan) == 10


def test_an_index_shaped_like_the_fair_one_without_its_predicate_would_be_walked(engine,
                                                                                 million):
    # The test above can fail: the fair index as migration 0003 made it (the same key, the
    # claim's predicate alone) is what the planner picks then.
    plan = plain_claim_without_the_claim_index(engine, "generic", also="""
        create index x_jobs_fair_before_0015 on x_jobs
               (queue, coalesce(tenant_id, ''), priority desc, run_at)
         where state in ('ready', 'delayed', 'suspended')""")

    assert "x_jobs_fair_before_0015" in executed_indexes(plan), executed_indexes(plan)


def unblock_params(**overrides) -> dict:
    params = {name: [] for name in ("prefixes", "prefix_limits", "limit_names", "limit_values")}
    params.update({"batch": 1000, "park": True, "notify": False})
    params.update(overrides)
    return params


@pytest.mark.parametrize("planner", sorted(PLANNERS))
def test_the_unblock_safety_net_probes_each_blocked_key_once(engine, million, planner):
    """All 1,000 keys are full: nothing to wake, and the statement reads a few pages per key
    (one probe of the blocked index, one of the key's slots), not the blocked jobs one by one
    nor the table."""
    unblock = engine.statements()["jobs_unblock"]
    plan = PLANNERS[planner](unblock.sql, unblock_params())

    assert "x_jobs_blocked_idx" in indexes(plan), indexes(plan)
    assert seq_scans(plan, "x_jobs") == []
    pages = buffers(plan)
    assert pages < 12 * BLOCKED_KEYS, f"{pages} pages read to look at {BLOCKED_KEYS} keys"
    assert million["table_pages"] > 12 * BLOCKED_KEYS


def test_the_unblock_wakes_what_has_room_reading_only_that(engine, million):
    """Ten keys' slots lapsed: the statement wakes one job of each, the first in line."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("update x_job_leases set expires_at = now() - interval '1 second'"
                       " where lease_key = any(%s)", [[f"key:{k}" for k in range(10)]])
        unblock = engine.statements()["jobs_unblock"]
        cursor.execute(unblock.sql, unblock_params())
        woken = cursor.fetchone()[0]
        cursor.execute("select count(*) from x_jobs where queue = 'blocked' and state = 'ready'")
        ready = cursor.fetchone()[0]
        transaction.set_rollback(True)

    assert (woken, ready) == (10, 10)


# ---------------------------------------------------------------- the fenced writes of runs --
# docs/design.md, "Lock order": each first locks its rows SKIP LOCKED (a CTE the planner cannot
# estimate), then writes them. The write must still reach its rows through the primary key,
# not hash the table to the CTE.

RUNNING = 50
# Running in the table: the statistics, taken before they were claimed, count none of them, as a
# generic plan made while few jobs ran does. A fenced write that walked the partial index of
# running rows (rather than one key probe per run) would read all of them per run.
CLAIMED = 5_000


@pytest.fixture(scope="module")
def running(million, django_db_blocker) -> Iterator[list[tuple[str, str]]]:
    """CLAIMED of the million jobs claimed (running, a lease and a token each), unknown to the
    statistics: (id, token) of RUNNING of them."""
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute("analyze x_jobs")
        cursor.execute("""
            update x_jobs set state = 'running', lease_token = gen_random_uuid(), attempt = 1,
                              visible_at = now() + interval '1 hour', started_at = now()
             where id in (select id from x_jobs where queue = 'fair' order by run_at desc
                          limit %(n)s)
            returning id::text, lease_token::text""", {"n": CLAIMED})
        pairs = cursor.fetchall()
    yield sorted(pairs)[:RUNNING]


def fenced(pairs: list[tuple[str, str]]) -> dict:
    return {"ids": "{" + ",".join(i for i, _ in pairs) + "}",
            "tokens": "{" + ",".join(t for _, t in pairs) + "}",
            "id": pairs[0][0], "token": pairs[0][1]}


FENCED_WRITES = {
    "jobs_complete_if_owned": {"results": "[" + ",".join(["null"] * RUNNING) + "]"},
    "jobs_renew_if_owned": {"lease_ms": 60_000},
    "job_fail_if_owned": {"error": "E", "delay_ms": 0, "permanent": False, "outcome": "failed",
                          "max_attempts": None},
    "job_requeue_if_owned": {"delay_ms": 0, "spent": True, "resumed": False, "note": None,
                             "outcome": "handed_back"},
    "job_suspend_if_owned": {"wake_at": "2100-01-01T00:00:00Z"},
}


@pytest.mark.parametrize("planner", sorted(PLANNERS))
@pytest.mark.parametrize("name", sorted(FENCED_WRITES))
def test_a_fenced_write_reaches_its_rows_by_key_among_a_million(engine, running, name, planner):
    stmt = engine.statements()[name]
    plan = PLANNERS[planner](stmt.sql, {**fenced(running), **FENCED_WRITES[name]})

    assert seq_scans(plan, "x_jobs") == []
    assert returned(plan) == (RUNNING if name.startswith("jobs_") else 1)
    pages = buffers(plan)
    assert pages < 30 * RUNNING, f"{pages} pages read by {name} of {RUNNING} runs"
