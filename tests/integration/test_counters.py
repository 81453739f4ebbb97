"""The counters are exact at rest, and every run leaves one entry in its job's attempt history.

After random mixes of outcomes (done, retried then done, dead by attempts or at once, snoozed,
cancelled before or while running, a lease that lapsed as a crash leaves it) have been drained,
the all-time counters equal what the rows say, whether or not the rollup ran in between
(docs/observability.md, "Counters"): enqueued = rows, started = runs (entries in the attempt
histories), done / dead / cancelled = rows in that state, failed = failed entries.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import Max
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_xjobs import api, counters
from django_xjobs.engines import get_engine
from django_xjobs.engines.postgres.statements.fragments import histogram_ctes
from django_xjobs.models import Job, Stat, StatDelta
from django_xjobs.records import HISTOGRAM_BOUNDS_MS
from django_xjobs.testing import drain, travel
from tests.conftest import raw_connection, wait_until
from tests.testapp import jobs as testapp_jobs

pytestmark = pytest.mark.django_db(transaction=True)

KINDS = ("done", "flaky", "dies", "permanent", "snooze", "cancel_ready", "cancel_running",
         "lapsed")
QUEUE = "counted"


def enqueue(kind: str):
    on = {"queue": QUEUE}
    if kind == "done":
        return testapp_jobs.record.using(**on).enqueue(tag=kind)
    if kind == "flaky":
        return testapp_jobs.flaky.using(**on).enqueue(fail_times=1)
    if kind == "dies":
        return testapp_jobs.always_fails.using(**on).enqueue()
    if kind == "permanent":
        return testapp_jobs.permanent.using(**on).enqueue()
    if kind == "snooze":
        return testapp_jobs.snoozer.using(**on).enqueue(times=1)
    return testapp_jobs.record.using(**on).enqueue(tag=kind)


def drain_all() -> None:
    for _ in range(40):
        drain(queues=[QUEUE])
        live = Job.objects.filter(queue=QUEUE, state__in=("ready", "delayed", "running"))
        if not live.exists():
            return
        travel(timedelta(seconds=5))
    pytest.fail("jobs still live after draining")


def totals() -> Counter[str]:
    out: Counter[str] = Counter()
    for row in get_engine().stats_totals():
        if row.queue != QUEUE:
            continue
        for field in ("enqueued", "started", "done", "failed", "dead", "cancelled"):
            out[field] += getattr(row, field)
        out["waits"] += sum(row.wait_hist)
        out["runs"] += sum(row.run_hist)
    return out


def expected_from_rows() -> Counter[str]:
    rows = list(Job.objects.filter(queue=QUEUE))
    entries = [{"outcome": a.outcome} for r in rows
               for a in api.get_job(r.id).attempts]
    out: Counter[str] = Counter(
        enqueued=len(rows),
        started=len(entries),
        done=sum(r.state == "done" for r in rows),
        dead=sum(r.state == "dead" for r in rows),
        cancelled=sum(r.state == "cancelled" for r in rows),
        failed=sum(e["outcome"] in ("failed", "timeout") for e in entries),
    )
    return +out


def lapse(handle) -> None:
    """A worker claimed the job and died: the claim is made here, and its lease lapses now."""
    engine = get_engine()
    with connection.cursor() as cur:
        cur.execute("update x_jobs set state = 'running', attempt = attempt + 1,"
                    " lease_token = gen_random_uuid(), claimed_by = 'doomed:1',"
                    " started_at = now() - interval '1 minute',"
                    " visible_at = now() - interval '1 second' where id = %s", [handle.id])
        # The doomed claim's own start, as jobs_claim would have counted it.
        cur.execute("insert into x_stat_deltas (queue, name, started) values (%s, %s, 1)",
                    [QUEUE, "testapp.record"])
    assert engine.job_get(str(handle.id)).state == "running"


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=10),
       rollup_between=st.booleans())
def test_counters_equal_the_rows_after_a_drain(kinds, rollup_between):
    Job.objects.all().delete()
    Stat.objects.all().delete()
    StatDelta.objects.all().delete()
    handles = [(kind, enqueue(kind)) for kind in kinds]
    for kind, handle in handles:
        if kind == "cancel_ready":
            api.cancel(handle.id, reason="not needed")
        elif kind == "lapsed":
            lapse(handle)
        elif kind == "cancel_running":
            lapse(handle)
            with connection.cursor() as cur:  # still within its lease: a live run cancelled
                cur.execute("update x_jobs set visible_at = now() + interval '1 minute'"
                            " where id = %s", [handle.id])
            api.cancel(handle.id, reason="operator")
    if rollup_between:
        counters.rollup()
    drain_all()

    got = totals()
    want = expected_from_rows()
    assert {k: got[k] for k in want} == dict(want), (kinds, got, want)
    # Every start has its wait but the doomed claims' and the rescues of their lapsed leases
    # (which waited a lease, not in the queue).
    doomed = sum(kind in ("lapsed", "cancel_running") for kind in kinds)
    assert got["waits"] == want["started"] - doomed - kinds.count("lapsed")
    # Folding changes nothing a reader sees: counts, sums and histograms bucket by bucket.
    before = get_engine().stats_totals()
    counters.rollup()
    assert StatDelta.objects.count() == 0
    assert get_engine().stats_totals() == before
    assert {k: totals()[k] for k in want} == dict(want)


def test_the_attempt_history_keeps_every_run_with_its_worker_outcome_and_error():
    handle = testapp_jobs.flaky.enqueue(fail_times=2)

    def done_after_a_drain() -> bool:
        drain()  # a retry is due a moment after the failure before it
        return handle.get().state == "done"

    wait_until(done_after_a_drain, message="the job done on its third attempt")
    job = api.get_job(handle.id)
    assert [a.outcome for a in job.attempts] == ["failed", "failed", "done"]
    assert [a.attempt for a in job.attempts] == [1, 2, 3]
    assert all(a.worker and a.started_at and a.finished_at for a in job.attempts)
    assert "flaky failure on attempt 1" in job.attempts[0].error
    assert "flaky failure on attempt 2" in job.attempts[1].error
    assert job.attempts[2].error is None
    assert all(a.duration is not None and a.duration >= 0 for a in job.attempts)


def test_a_snoozed_run_a_lapsed_lease_and_a_cancelled_run_are_named_in_the_history():
    snoozed = testapp_jobs.snoozer.enqueue(times=1)
    drain()
    travel(timedelta(seconds=1))
    drain()
    assert [a.outcome for a in api.get_job(snoozed.id).attempts] == ["snoozed", "done"]

    lapsed = testapp_jobs.record.using(queue=QUEUE).enqueue(tag="x")
    lapse(lapsed)
    drain(queues=[QUEUE])
    entries = api.get_job(lapsed.id).attempts
    assert (entries[0].outcome, entries[0].worker) == ("lost", "doomed:1")
    assert entries[-1].outcome == "done"

    running = testapp_jobs.record.using(queue=QUEUE).enqueue(tag="y")
    lapse(running)
    with connection.cursor() as cur:
        cur.execute("update x_jobs set visible_at = now() + interval '1 minute' where id = %s",
                    [running.id])
    api.cancel(running.id, reason="stop it")
    entries = api.get_job(running.id).attempts
    assert [a.outcome for a in entries] == ["cancelled"]
    assert "stop it" in entries[0].error


def test_the_history_keeps_the_first_and_the_newest_twenty_entries():
    with connection.cursor() as cur:
        cur.execute("select xjobs_attempt_push(%s::jsonb, '{\"attempt\": 30}'::jsonb)",
                    ['[' + ",".join(f'{{"attempt": {i}}}' for i in range(1, 30)) + ']'])
        kept = [e["attempt"] for e in json.loads(cur.fetchone()[0])]
    assert kept == [1, *range(11, 31)]


def test_the_histogram_of_the_statements_has_a_bucket_per_bound_and_one_above():
    """A bound itself falls in its own bucket (<=), one more in the next; 0 in the first; the
    empty buckets are there, as 0."""
    values = [*HISTOGRAM_BOUNDS_MS, *(b + 1 for b in HISTOGRAM_BOUNDS_MS), 0]
    with connection.cursor() as cur:
        cur.execute(f"""with rows as (select 'q' as queue, %s::bigint[] as ms),
                        {histogram_ctes("hist", "rows", "queue", "ms")}
                        select hist from hist""", [values])
        hist = cur.fetchone()[0]
        cur.execute(f"""with rows as (select 'q' as queue, array[7]::bigint[] as ms),
                        {histogram_ctes("hist", "rows", "queue", "ms")}
                        select hist from hist""")
        lone = cur.fetchone()[0]
    assert len(hist) == len(HISTOGRAM_BOUNDS_MS) + 1
    assert hist[0] == 2  # 0 and 5
    assert hist[1:-1] == [2] * (len(HISTOGRAM_BOUNDS_MS) - 1)
    assert hist[-1] == 1  # past the last bound
    assert lone == [0, 1] + [0] * (len(HISTOGRAM_BOUNDS_MS) - 1)


# ---- the rollup's floor (counters.RollupFloor) ----

def add_deltas(n: int, *, cursor=None) -> None:
    sql = ("insert into x_stat_deltas (queue, name, enqueued)"
           " select %s, 'testapp.record', 1 from generate_series(1, %s)")
    if cursor is not None:
        cursor.execute(sql, [QUEUE, n])
        return
    with connection.cursor() as c:
        c.execute(sql, [QUEUE, n])


def delta_entries_read() -> int:
    """The entries of the deltas' primary key this transaction's scans have read, dead or
    not."""
    with connection.cursor() as cursor:
        cursor.execute("select pg_stat_get_xact_tuples_returned('x_stat_deltas_pkey'::regclass)")
        return cursor.fetchone()[0]


@pytest.mark.django_db  # one transaction: the deltas it deletes stay dead entries, as a held
def test_a_rollup_starts_past_the_deltas_its_worker_folded_last():  # horizon keeps them
    StatDelta.objects.all().delete()
    with connection.cursor() as cursor:  # the walk of a big table's rollup, not a small one's
        cursor.execute("set local enable_seqscan = off; set local enable_bitmapscan = off")
    floor = counters.RollupFloor()
    add_deltas(300)
    last = StatDelta.objects.aggregate(m=Max("id"))["m"]
    assert counters.rollup(floor=floor) == 300  # the first: from the first delta
    assert floor.after_id == last
    add_deltas(5)

    before = delta_entries_read()
    assert counters.rollup(floor=floor) == 5
    floored = delta_entries_read() - before
    add_deltas(5)
    floor.full_soon()
    before = delta_entries_read()
    assert counters.rollup(floor=floor) == 5
    full = delta_entries_read() - before

    assert floored <= 10 and full >= 305, (floored, full)  # the dead ones, walked again
    assert totals()["enqueued"] == 310


@pytest.mark.django_db(transaction=True)
def test_a_delta_that_commits_behind_the_floor_is_counted_and_folded_by_a_full_rollup():
    """Ids are handed out at insert: a transaction that inserted first and commits last leaves
    its delta behind a floor already past it. Reads still add it; the next rollup from the
    first delta folds it."""
    StatDelta.objects.all().delete()
    floor = counters.RollupFloor()
    counters.rollup(floor=floor)
    with raw_connection() as late:
        with late.cursor() as cursor:
            add_deltas(1, cursor=cursor)  # its id, before the others'; not committed yet
        add_deltas(3)
        assert counters.rollup(floor=floor) == 3
        late.commit()
    assert totals()["enqueued"] == 4  # counted while unfolded
    assert counters.rollup(floor=floor) == 0  # behind the floor
    assert StatDelta.objects.count() == 1
    floor.full_soon()
    assert counters.rollup(floor=floor) == 1
    assert StatDelta.objects.count() == 0
    assert totals()["enqueued"] == 4
