"""The claim's floors (django_xjobs/worker/floors.py): where they move after each claim, what
is left to a sweep, and when they are off. The SQL side, under a real held snapshot, is
tests/integration/test_horizon.py; a worker turning them on and off, in
tests/acceptance/test_held_horizon.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django_xjobs.records import ClaimBatch, ClaimedJob, ClaimPosition
from django_xjobs.worker.floors import HORIZON_XIDS, LAPSED_MARGIN, MARGIN, SWEEP, Floors

T = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def batch(*found: tuple[str, int, datetime, bool], now: datetime = T, held: int = 0,
          key: str | None = None) -> ClaimBatch:
    b = ClaimBatch(ClaimedJob(id=str(i), lease_token="t", name="n", queue=q, input={},
                              run_id="r", attempt=1, max_attempts=3, tenant_id=None,
                              traceparent=None, concurrency_key=key, resumed=False)
                   for i, (q, *_rest) in enumerate(found))
    b.positions = [ClaimPosition(queue=q, priority=p, run_at=r, rescued=x)
                   for q, p, r, x in found]
    b.now, b.held = now, held
    return b


def held(priorities=(0,), fair=()) -> Floors:
    floors = Floors(priorities=priorities, fair=fair)
    floors.horizon(HORIZON_XIDS)
    assert floors.for_claim({"q": 10}, 0.0) is None  # the first claim sweeps
    return floors


def as_dict(floors) -> dict:
    return {(q, p): v for q, p, v in zip(floors.floor_queues, floors.floor_priorities,
                                         floors.floor_values, strict=True)}


def test_no_floors_while_the_horizon_is_not_held():
    floors = Floors(priorities=[0])
    floors.horizon(HORIZON_XIDS - 1)
    floors.claimed({"q": 10}, batch(("q", 0, T, False)))

    assert floors.for_claim({"q": 10}, 1.0) is None


def test_a_claim_that_ran_dry_moves_every_floor_to_its_now_less_the_margin():
    floors = held(priorities=(0, 5))
    floors.claimed({"q": 10}, batch(("q", 0, T - timedelta(seconds=1), False),
                                    ("q", 1, T, False)))

    sent = floors.for_claim({"q": 10}, 1.0)
    assert sent is not None and sent.queues == {"q"}
    assert as_dict(sent) == {("q", p): T - MARGIN for p in (5, 1, 0)}
    assert sent.floor_priorities == (5, 1, 0)  # highest first, the one met included
    assert sent.lapsed == {"q": T - LAPSED_MARGIN}


def test_a_full_claim_keeps_the_lowest_priority_it_reached_where_it_stopped():
    floors = held(priorities=(0, 5, 9))
    floors.claimed({"q": 3}, batch(("q", 9, T - timedelta(minutes=9), False),
                                   ("q", 5, T - timedelta(minutes=5), False),
                                   ("q", 5, T - timedelta(minutes=4), False)))

    sent = as_dict(floors.for_claim({"q": 3}, 1.0))
    assert sent[("q", 9)] == T - MARGIN  # ran dry: the scan went on to a lower one
    assert sent[("q", 5)] == T - timedelta(minutes=4) - MARGIN  # stopped at the share
    assert sent[("q", 0)] is None  # not reached: from the start


def test_rescues_that_fill_the_claim_leave_the_rescue_floor_where_it_was():
    floors = held()
    floors.claimed({"q": 2}, batch(("q", 0, T, True), ("q", 0, T, True)))

    sent = floors.for_claim({"q": 2}, 1.0)
    assert sent.lapsed == {}
    assert as_dict(sent) == {("q", 0): None}


def test_a_queue_with_jobs_held_back_or_keyed_is_scanned_whole():
    floors = held()
    floors.claimed({"q": 10, "k": 10}, batch(("k", 0, T, False), key="slot:1"))
    sent = floors.for_claim({"q": 10, "k": 10}, 1.0)
    assert sent.queues == {"q"}
    assert set(sent.floor_queues) == {"q"}

    floors.claimed({"q": 10}, batch(held=1))
    assert floors.for_claim({"q": 10}, 2.0).queues == frozenset()


def test_a_fair_queue_is_never_floored():
    floors = held(fair=("f",))
    floors.claimed({"f": 10}, batch())

    assert floors.for_claim({"f": 10}, 1.0).queues == frozenset()


def test_a_sweep_every_sweep_interval_and_after_a_wake():
    floors = held()
    floors.claimed({"q": 10}, batch())
    assert floors.for_claim({"q": 10}, SWEEP - 1) is not None
    assert floors.for_claim({"q": 10}, SWEEP + 1) is None
    assert floors.for_claim({"q": 10}, SWEEP + 2) is not None

    floors.sweep_soon()
    assert floors.for_claim({"q": 10}, SWEEP + 3) is None
    assert floors.sweeps == 3


def test_floors_are_forgotten_when_the_horizon_moves_on():
    floors = held()
    floors.claimed({"q": 10}, batch())
    floors.horizon(0)
    assert floors.for_claim({"q": 10}, 1.0) is None

    floors.horizon(HORIZON_XIDS)
    assert floors.for_claim({"q": 10}, 2.0) is None  # a sweep first, as at the start
    assert as_dict(floors.for_claim({"q": 10}, 3.0)) == {("q", 0): None}
