"""The jobs list's filters and searches stay index reads at scale: a filter value no job has, a
"created" or "run at" range days back and a uuid no job has read a bounded number of pages of a
million-row ``x_jobs``, never the table (docs/console.md, "At ten million jobs"; the page times
are ``make bench-admin``'s, not asserted here).

Like tests/conformance/test_flow_plans.py the million rows go in with one ``INSERT ... SELECT
generate_series``, once for the module, and are deleted after it; a vacuum summarizes the BRIN
ranges as autovacuum would. Each page is rendered by Django's test client, and every query it
sent to ``x_jobs`` is run again under EXPLAIN (ANALYZE, BUFFERS).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import date, datetime, timedelta
from datetime import time as clock

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_xjobs.models import Job
from tests.conformance.test_flow_plans import buffers, nodes

pytestmark = pytest.mark.django_db

JOBS = 1_000_000
DAYS = 7
HAND_WRITTEN = 20
JOBS_URL = reverse("admin:django_xjobs_job_changelist")
# Pages one query of a list page may read: the BRIN summaries (a few hundred index pages) and
# the table ranges of a window of rows. A walk of the primary key or of the table reads tens of
# thousands (asserted below, so the bound means something).
PAGE_BOUND = 2_000


@pytest.fixture(scope="module")
def million(django_db_setup, django_db_blocker) -> Iterator[dict]:
    """A million jobs created over the last seven days, newest last, each id and run id a
    UUIDv7 of its creation's millisecond as the API mints them; 12 names, 3 queues, 97 tenants,
    1% dead; and a few rows written by hand with random uuids. Committed once, deleted after
    the module."""
    started = time.monotonic()
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute("select count(*) from x_jobs")
        assert cursor.fetchone()[0] == 0, "x_jobs must start empty: the teardown deletes it all"
        # No autovacuum on the table while the module runs: an automatic ANALYZE started by the
        # bulk insert and finishing after the fixture's own would replace its statistics
        # with another sample's, and the plans pinned here with them.
        cursor.execute("alter table x_jobs set (autovacuum_enabled = false)")
        cursor.execute("""
            insert into x_jobs (id, run_id, idempotency_key, name, queue, state, tenant_id,
                                created_at, updated_at, run_at, finished_at)
            select v.id, v.run_id, v.id::text, 'shop.job_' || (v.n %% 12), 'q' || (v.n %% 3),
                   case when v.n %% 100 = 7 then 'dead' else 'done' end,
                   'tenant-' || (v.n %% 97), v.created, v.created, v.created, v.created
              from (
                select g.n, t.created,
                       (lpad(to_hex((extract(epoch from t.created) * 1000)::bigint), 12, '0')
                        || '7' || substr(md5(g.n::text || 'a'), 1, 3) || '8'
                        || substr(md5(g.n::text || 'b'), 1, 15))::uuid as id,
                       (lpad(to_hex((extract(epoch from t.created) * 1000)::bigint), 12, '0')
                        || '7' || substr(md5(g.n::text || 'c'), 1, 3) || '9'
                        || substr(md5(g.n::text || 'd'), 1, 15))::uuid as run_id
                  from generate_series(1, %(n)s) g(n)
                 cross join lateral (select now() - interval '1 day' * %(days)s
                                            * (1 - g.n::float8 / %(n)s) as created) t
              ) v
        """, {"n": JOBS, "days": DAYS})
        cursor.execute("""
            insert into x_jobs (idempotency_key, name, state, created_at, updated_at,
                                finished_at)
            select 'hand-' || g, 'shop.by_hand', 'done', now() - interval '1 hour' * g,
                   now() - interval '1 hour' * g, now() - interval '1 hour' * g
              from generate_series(1, %(n)s) g
        """, {"n": HAND_WRITTEN})
        # A larger sample than the default 30,000 rows: the plans pinned here must not hang on
        # the luck of ANALYZE's sample (a filter on a tenant no job has once planned a
        # parallel walk of the table in a run, with the default sample).
        cursor.execute("set default_statistics_target = 1000")
        cursor.execute("vacuum analyze x_jobs")
        cursor.execute("reset default_statistics_target")
        cursor.execute("select pg_relation_size('x_jobs') / current_setting('block_size')::int")
        table_pages = cursor.fetchone()[0]
    print(f"\nconsole plans: {JOBS:,} jobs inserted and vacuumed in "
          f"{time.monotonic() - started:.1f}s ({table_pages:,} pages)")
    yield {"table_pages": table_pages}
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute("truncate x_jobs")
        cursor.execute("alter table x_jobs reset (autovacuum_enabled)")
    connection.close()


def explain(sql: str) -> dict:
    """The executed plan of a query a page sent (``jit`` off, as on a worker's session)."""
    with connection.cursor() as cursor:
        cursor.execute("set local jit = off")
        cursor.execute(f"explain (analyze, buffers, format json) {sql}")
        [[[plan]]] = cursor.fetchall()
    return plan["Plan"]


def page_plans(admin_client, params: dict) -> tuple[list[str], list[dict]]:
    """The job ids the list shows, in order, and the plans of its queries of x_jobs."""
    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get(JOBS_URL, params)
    assert response.status_code == 200
    sent = [q["sql"] for q in queries
            if '"x_jobs"' in q["sql"] and not q["sql"].startswith("EXPLAIN")]
    assert sent
    return [str(j.pk) for j in response.context["cl"].result_list], [explain(s) for s in sent]


def assert_bounded(plans: list[dict], index: str) -> None:
    for plan in plans:
        scans = [n for n in nodes(plan)
                 if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "x_jobs"]
        assert scans == [], plan
        assert buffers(plan) < PAGE_BOUND, f"{buffers(plan)} pages read: {plan}"
    used = {n["Index Name"] for p in plans for n in nodes(p) if "Index Name" in n}
    assert index in used, used


def day_range(field: str, day: date) -> dict:
    return {f"{field}__range__gte_0": day.isoformat(), f"{field}__range__gte_1": "00:00:00",
            f"{field}__range__lte_0": day.isoformat(), f"{field}__range__lte_1": "23:59:59"}


def test_the_bound_would_fail_for_a_walk_of_the_table(million):
    assert million["table_pages"] > 10 * PAGE_BOUND, million


@pytest.mark.parametrize("param, value", [
    ("name", "shop.no_such_job"), ("queue", "no-such-queue"), ("tenant", "no-such-tenant")])
def test_a_filter_value_no_job_has_reads_no_table(admin_client, million, param, value):
    listed, plans = page_plans(admin_client, {param: value})

    assert listed == []
    assert_bounded(plans, "x_jobs_console_brin")


@pytest.mark.parametrize("field", ["created_at", "run_at"])
@pytest.mark.parametrize("days_back, page, state", [
    (6, 1, None), (6, 5, None), (3, 1, "dead"), (0, 1, None)])
def test_a_range_lists_its_newest_rows_reading_a_window(admin_client, million, field,
                                                       days_back, page, state):
    """Newest first by the range's column, the same rows as sorting the whole range, while
    each query reads a window of it (EstimatedCountPaginator)."""
    day = timezone.localdate() - timedelta(days=days_back)
    params = {**day_range(field, day), "p": str(page), **({"state": state} if state else {})}
    listed, plans = page_plans(admin_client, params)

    low = timezone.make_aware(datetime.combine(day, clock(0, 0, 0)))
    high = timezone.make_aware(datetime.combine(day, clock(23, 59, 59)))  # as the form sends
    whole = Job.objects.filter(**{f"{field}__gte": low, f"{field}__lte": high},
                               **({"state": state} if state else {}))
    expected = [str(i) for i in whole.order_by(f"-{field}", "-id").values_list("id", flat=True)[
        (page - 1) * 50: page * 50]]
    assert len(expected) == 50
    assert listed == expected
    assert_bounded(plans, "x_jobs_console_brin")


@pytest.mark.parametrize("term", [
    "0190a0b0-c0d0-7e0f-8a0b-0c0d0e0f1a1b",  # a UUIDv7 nothing has
    "2b0e5f0c-8e0a-4f55-9c55-3f7d1f6c2a10",  # a random uuid nothing has
])
def test_a_search_for_a_uuid_no_job_has_reads_no_table(admin_client, million, term):
    listed, plans = page_plans(admin_client, {"q": term})

    assert listed == []
    assert_bounded(plans, "x_jobs_pkey")


def test_a_hand_written_rows_run_id_is_found_on_its_own_index(admin_client, million):
    hand = Job.objects.filter(name="shop.by_hand").first()
    assert hand is not None and hand.run_id.version == 4  # the column's default: random
    listed, plans = page_plans(admin_client, {"q": str(hand.run_id)})

    assert listed == [str(hand.id)]
    assert_bounded(plans, "x_jobs_run_apart_idx")
