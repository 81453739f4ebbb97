"""queue_stats: a bucket per state, exclusive, the same numbers on every engine.

`ready` (ready and due), `delayed` (delayed, or ready not yet due), `running`, `suspended`,
`blocked`, `dead`; plus `done` and `cancelled` (docs/design.md, "Stats buckets are
exclusive"). A row lands in exactly one bucket, so the buckets of a queue sum to its row count.
A bare `run_at > now()` would count a sleeping suspended job (or a dead one with a future
run_at) twice; random mixes of states and times pin it here. Jobs really blocked on a slot, as
every surface counts them: tests/integration/test_blocked.py.
"""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_xjobs.models import Job
from django_xjobs.records import ALL_STATES, LIVE_STATES, QueueStats

QUEUES = ("alpha", "beta", "gamma")
WHEN = {"past": timedelta(hours=-1), "now": timedelta(0), "future": timedelta(hours=1)}
BUCKETS = ("ready", "delayed", "running", "suspended", "blocked", "dead", "done", "cancelled")


def bucket_of(state: str, when: str) -> str:
    """The bucket a row belongs in (`now` is due: run_at <= now())."""
    if state == "ready":
        return "delayed" if when == "future" else "ready"
    return state


def counts(stats: QueueStats) -> dict[str, int]:
    return {b: getattr(stats, b) for b in BUCKETS}


row = st.tuples(st.sampled_from(QUEUES), st.sampled_from(ALL_STATES), st.sampled_from(list(WHEN)),
                st.sampled_from(list(WHEN)))


@pytest.mark.django_db
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(rows=st.lists(row, max_size=40))
def test_every_row_lands_in_exactly_the_one_bucket_spec_names(engine, rows):
    Job.objects.all().delete()  # each example starts from an empty table
    now = engine.db_now()
    Job.objects.bulk_create([
        Job(name="testapp.noop", queue=queue, idempotency_key=str(uuid.uuid4()), state=state,
            run_at=now + WHEN[when],
            # a running row's lease, lapsed or not, must not move it out of `running`
            visible_at=now + WHEN[lease] if state == "running" else None,
            lease_token=uuid.uuid4() if state == "running" else None)
        for queue, state, when, lease in rows
    ])

    stats = {s.queue: s for s in engine.queue_stats()}

    expected: dict[str, Counter[str]] = {}
    for queue, state, when, _lease in rows:
        expected.setdefault(queue, Counter())[bucket_of(state, when)] += 1
    for queue in QUEUES:
        if queue not in expected:
            assert queue not in stats or sum(counts(stats[queue]).values()) == 0
            continue
        got = counts(stats[queue])
        assert got == {b: expected[queue][b] for b in BUCKETS}, (queue, rows)
        assert sum(got.values()) == sum(1 for r in rows if r[0] == queue)
        live = sum(1 for q, s, _w, _l in rows
                   if q == queue and s in LIVE_STATES)
        assert stats[queue].live == live
    assert len(engine.queue_stats()) == len({s.queue for s in engine.queue_stats()})


@pytest.mark.django_db
def test_stats_of_an_empty_table_name_no_queue(engine):
    assert engine.queue_stats() == []


@pytest.mark.django_db
def test_stats_follow_rows_through_the_engine_operations(engine):
    from .conftest import claim_one, enqueue

    enqueue(engine, queue="q")
    enqueue(engine, queue="q", delay_ms=3_600_000)
    enqueue(engine, queue="q")
    claim_one(engine, "q")

    (stats,) = engine.queue_stats()
    assert stats.queue == "q"
    assert counts(stats) == {"ready": 1, "delayed": 1, "running": 1, "suspended": 0, "blocked": 0,
                             "dead": 0, "done": 0, "cancelled": 0}
