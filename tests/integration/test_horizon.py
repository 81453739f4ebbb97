"""Under a held horizon (docs/performance.md, "Under a held horizon"): while another session
holds a snapshot, the index entries of the jobs claimed since cannot be removed or marked dead,
and a claim that scans from the start of its ranges walks every one of them; a claim given
floors starts past them and reads a handful of pages however many there are.

Speaks SQL on connections of its own: the held snapshot must be another session's, and the
dead versions must be committed after it. Each claim runs under EXPLAIN (ANALYZE, BUFFERS) in
a transaction that is rolled back.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from tests.conformance.test_statements import claim_params
from tests.conftest import burn_transaction_ids, raw_connection

pytestmark = pytest.mark.django_db(transaction=True)

CLAIMED = 5_000  # jobs claimed and finished while the snapshot is held


def _buffers(plan: dict) -> int:
    return plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0)


def _claim(conn, queue: str, **floors) -> tuple[int, list[str]]:
    """Pages read and job ids taken by one jobs_claim of up to 10 jobs of ``queue``."""
    from django_xjobs.engines import get_engine

    claim = get_engine().statements()["jobs_claim"]
    params = {**claim_params([queue]), **floors}
    with conn.transaction(force_rollback=True):
        cur = conn.execute("explain (analyze, buffers, format json) " + claim.sql, params)
        plan = cur.fetchone()[0][0]["Plan"]
    with conn.transaction(force_rollback=True):
        ids = [r[0] for r in conn.execute(claim.sql, params).fetchall() if r[0]]
    return _buffers(plan), ids


@pytest.fixture
def held_horizon():
    """A queue of its own with CLAIMED jobs claimed and finished after another session took
    its snapshot (still open), and one job due now; yields (connection, queue, due job id)."""
    queue = f"horizon-{uuid.uuid4().hex[:8]}"
    holder = raw_connection()
    conn = raw_connection(autocommit=True)
    try:
        holder.execute("set transaction isolation level repeatable read")
        holder.execute("select count(*) from x_jobs")
        conn.execute(
            "insert into x_jobs (id, idempotency_key, name, queue, input, state, run_at, run_id,"
            "                    max_attempts)"
            " select u, u::text, 'testapp.noop', %s, '{}', 'ready',"
            "        now() - interval '1 minute' + g * interval '1 millisecond',"
            "        gen_random_uuid(), 3"
            "   from (select gen_random_uuid() as u, g from generate_series(1, %s) g) s",
            (queue, CLAIMED))
        # Claimed (a running version: its lease ran out a while ago), then finished: each
        # step a new version of every row and new entries in the claim's two indexes.
        conn.execute("update x_jobs set state = 'running', attempt = 1,"
                     " visible_at = now() - interval '30 seconds' where queue = %s", (queue,))
        conn.execute("update x_jobs set state = 'done', finished_at = now(), visible_at = null"
                     " where queue = %s", (queue,))
        due = conn.execute(
            "insert into x_jobs (id, idempotency_key, name, queue, input, state, run_at, run_id,"
            "                    max_attempts)"
            " select u, u::text, 'testapp.noop', %s, '{}', 'ready', now(), gen_random_uuid(), 3"
            "   from gen_random_uuid() u returning id::text", (queue,)).fetchone()[0]
        yield conn, queue, due
    finally:
        holder.rollback()
        holder.close()
        conn.execute("delete from x_jobs where queue = %s", (queue,))
        conn.close()


def _floors(conn, queue: str, back: timedelta, *, priorities=(0,)) -> dict:
    now = conn.execute("select now()").fetchone()[0]
    return {"floored": [True], "lapsed_from": [now - back],
            "floor_queues": [queue] * len(priorities), "floor_priorities": list(priorities),
            "floor_values": [now - back] * len(priorities)}


def test_a_floored_claim_reads_past_the_jobs_claimed_under_a_held_snapshot(held_horizon):
    conn, queue, due = held_horizon

    whole, whole_ids = _claim(conn, queue)
    floored, floored_ids = _claim(conn, queue, **_floors(conn, queue, timedelta(seconds=5)))

    assert whole_ids == [due] and floored_ids == [due]
    # The whole scans walk the 5,000 claimed jobs' entries twice (the lapsed leases' index and
    # the claim index: its probe of the priorities, then the due scan) and visit their rows.
    assert whole > 200, f"{whole} pages: the held snapshot left nothing to walk?"
    assert floored < 40, f"{floored} pages read by a floored claim (a whole one read {whole})"


def test_what_a_floor_cannot_see_a_claim_without_floors_finds(held_horizon):
    """A job made due with a run_at before the floor (here: an hour back), and one of a
    priority the floors do not list: left to the worker's sweep, which claims without floors."""
    conn, queue, due = held_horizon
    conn.execute("update x_jobs set run_at = now() - interval '1 hour' where id = %s", (due,))
    urgent = conn.execute(
        "insert into x_jobs (id, idempotency_key, name, queue, input, state, run_at, run_id,"
        "                    max_attempts, priority)"
        " select u, u::text, 'testapp.noop', %s, '{}', 'ready', now(), gen_random_uuid(), 3, 5"
        "   from gen_random_uuid() u returning id::text", (queue,)).fetchone()[0]

    _, floored_ids = _claim(conn, queue, **_floors(conn, queue, timedelta(seconds=5)))
    _, known_ids = _claim(conn, queue,
                          **_floors(conn, queue, timedelta(seconds=5), priorities=(5, 0)))
    _, whole_ids = _claim(conn, queue)

    assert floored_ids == []
    assert known_ids == [urgent]
    assert sorted(whole_ids) == sorted([urgent, due])


def test_a_lapsed_lease_past_the_rescue_floor_is_taken_back_one_before_it_by_a_sweep(
        held_horizon):
    conn, queue, due = held_horizon

    def lapsed(ago: str) -> str:
        return conn.execute(
            "insert into x_jobs (id, idempotency_key, name, queue, input, state, run_at, run_id,"
            "                    max_attempts, attempt, visible_at, lease_token, claimed_by)"
            " select u, u::text, 'testapp.noop', %s, '{}', 'running', now(), gen_random_uuid(),"
            "        3, 1, now() - %s::interval, gen_random_uuid(), 'gone'"
            "   from gen_random_uuid() u returning id::text", (queue, ago)).fetchone()[0]

    recent, old = lapsed("1 second"), lapsed("1 hour")

    _, floored_ids = _claim(conn, queue, **_floors(conn, queue, timedelta(seconds=5)))
    _, whole_ids = _claim(conn, queue)

    assert sorted(floored_ids) == sorted([recent, due])
    assert sorted(whole_ids) == sorted([old, recent, due])


def test_the_health_panel_says_what_the_oldest_snapshot_costs_the_queue():
    from django_xjobs.console.reads.health import health
    from django_xjobs.worker.floors import HORIZON_XIDS

    holder = raw_connection(application_name="nightly-report")
    try:
        holder.execute("set transaction isolation level repeatable read")
        holder.execute("select count(*) from x_jobs")
        burn_transaction_ids(HORIZON_XIDS)
        told = health().horizon_cost
    finally:
        holder.rollback()
        holder.close()

    assert told.startswith("x_jobs has ") and "dead row versions VACUUM has not removed" in told
    assert "transaction ids back, so the workers' claims start from floors" in told
    assert health().horizon_cost == ""  # nothing holds an old snapshot any more


def test_the_claim_says_what_its_scans_found_before_a_burial_took_its_place():
    """The floors follow the scans, not the answer: a lapsed lease on its last attempt is read
    and taken (buried, so not answered), and a due job with a key counts as keyed."""
    from django_xjobs.engines import get_engine
    from django_xjobs.records import ClaimFloors

    queue = f"scans-{uuid.uuid4().hex[:8]}"
    conn = raw_connection(autocommit=True)
    try:
        conn.execute(
            "insert into x_jobs (id, idempotency_key, name, queue, input, state, run_at, run_id,"
            "                    max_attempts, attempt, visible_at, lease_token, claimed_by)"
            " select u, u::text, 'testapp.noop', %s, '{}', 'running', now(), gen_random_uuid(),"
            "        1, 1, now() - interval '1 second', gen_random_uuid(), 'gone'"
            "   from gen_random_uuid() u", (queue,))
        conn.execute(
            "insert into x_jobs (id, idempotency_key, name, queue, input, state, run_at, run_id,"
            "                    max_attempts, concurrency_key)"
            " select u, u::text, 'testapp.noop', %s, '{}', 'ready', now() - g * interval '1 s',"
            "        gen_random_uuid(), 3, case when g = 1 then 'scans:k' end"
            "   from (select gen_random_uuid() as u, g from generate_series(1, 2) g) s",
            (queue,))

        batch = get_engine().jobs_claim(wants={queue: 10, f"{queue}-empty": 10},
                                        worker_id="scans", lease_ms=30_000,
                                        floors=ClaimFloors())
    finally:
        conn.execute("delete from x_jobs where queue = %s", (queue,))
        conn.close()

    assert len(batch) == 2  # the two due jobs; the burial is not answered
    scans = batch.scans
    assert scans.queues == {queue, f"{queue}-empty"}
    assert scans.lapsed == {queue: 1} and scans.taken == {queue: 1}
    assert [(d.queue, d.priority, d.found, d.keyed) for d in scans.due] == [(queue, 0, 2, True)]
