"""What the dashboard and the metrics read does not grow with the history: with 300,000
finished jobs and 1,000 live ones, the live depth reads the live rows' indexes only and the
counters read their own handful of rows, never x_jobs (docs/observability.md, "Counters").

The rows go in with ``INSERT ... SELECT generate_series``, once for the module; each statement
runs under EXPLAIN (ANALYZE, BUFFERS) (tests/conformance/test_flow_plans.py says how).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.db import connection

from tests.conformance.test_flow_plans import buffers, explain, indexes, seq_scans

pytestmark = pytest.mark.django_db

FINISHED = 300_000
LIVE = 1_000
# Pages the depth may read for 1,000 live rows: their index entries and heap pages (more when
# the visibility map is not set yet, or a parallel plan splits the scans). A walk of the table
# reads several times that (asserted below, so the bound means something).
DEPTH_PAGES = 1_200


@pytest.fixture(scope="module")
def history(django_db_setup, django_db_blocker) -> Iterator[dict]:
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute("select count(*) from x_jobs")
        assert cursor.fetchone()[0] == 0, "x_jobs must start empty: the teardown deletes it all"
        cursor.execute("""
            insert into x_jobs (id, idempotency_key, name, queue, state, run_at, started_at,
                                finished_at)
            select u, u::text, 'testapp.noop', 'q' || (g %% 4), 'done',
                   now() - interval '2 days', now() - interval '2 days',
                   now() - interval '2 days' + g * interval '1 millisecond'
              from (select gen_random_uuid() as u, g from generate_series(1, %(n)s) g) s
        """, {"n": FINISHED})
        cursor.execute("""
            insert into x_jobs (id, idempotency_key, name, queue, state, run_at, visible_at,
                                lease_token)
            select u, u::text, 'testapp.noop', 'q' || (g %% 4),
                   (array['ready', 'delayed', 'running', 'suspended', 'blocked'])[1 + g %% 5],
                   now() + (g %% 3 - 1) * interval '1 minute',
                   case when g %% 5 = 2 then now() + interval '1 minute' end,
                   case when g %% 5 = 2 then gen_random_uuid() end
              from (select gen_random_uuid() as u, g from generate_series(1, %(n)s) g) s
        """, {"n": LIVE})
        cursor.execute("""
            insert into x_stats (grain, at, queue, name, done, started, wait_hist, run_hist)
            select 'minute', date_trunc('minute', now()) - m * interval '1 minute',
                   'q' || q, 'testapp.noop', 10, 10, null, null
              from generate_series(0, 2879) m, generate_series(0, 3) q
        """)
        cursor.execute("analyze x_jobs")
        cursor.execute("analyze x_stats")
        cursor.execute("select pg_relation_size('x_jobs') / current_setting('block_size')::int")
        table_pages = cursor.fetchone()[0]
        cursor.execute("select max(at) from x_stats")
        newest = cursor.fetchone()[0]
    yield {"table_pages": table_pages, "newest": newest}
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute("truncate x_jobs, x_stats, x_stat_deltas")
        # Leave the planner statistics of empty tables, as the modules after this one expect
        # (their plans are pinned on tables that never held these rows).
        cursor.execute("analyze x_jobs, x_stats")
    connection.close()


def test_the_bound_would_fail_for_a_walk_of_the_table(history):
    assert history["table_pages"] > 3 * DEPTH_PAGES, history


def test_the_live_depth_reads_the_live_rows_only(engine, history):
    depth = engine.statements()["queue_depth"]
    plan = explain(depth.sql, {"tenant_ids": None})

    assert seq_scans(plan, "x_jobs") == []
    used = indexes(plan)
    # the waiting rows through either index over exactly them (the claim's or the fair one)
    assert {"x_jobs_lapsed_idx", "x_jobs_blocked_idx"} <= used, used
    assert used & {"x_jobs_claim_idx", "x_jobs_fair_tenant_idx"}, used
    assert buffers(plan) < DEPTH_PAGES, f"{buffers(plan)} pages read for {LIVE} live rows"
    rows = engine.queue_depth()
    assert sum(r.ready + r.delayed + r.running + r.suspended + r.blocked for r in rows) == LIVE


def test_an_hour_of_counters_reads_its_own_rows_not_two_days_of_them(engine, history):
    series = engine.statements()["stats_series"]
    # From the newest bucket, not from now: the clock may pass a minute's end between the
    # fixture and this test (a CI run saw 60 buckets a queue instead of 61).
    since = history["newest"] - timedelta(hours=1)
    plan = explain(series.sql, {"grain": "minute", "since": since, "queue": None})

    assert seq_scans(plan, "x_jobs") == []
    assert seq_scans(plan, "x_stats") == []
    rows = engine.stats_series("minute", since)
    assert {r.queue for r in rows} == {"q0", "q1", "q2", "q3"}
    assert len(rows) == 4 * 61
