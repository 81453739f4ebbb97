"""The claim's floors (django_xjobs/worker/floors.py): where they move after each claim's scans,
what is left to a sweep, and when they are off. The SQL side, under a real held snapshot, is
tests/integration/test_horizon.py; a worker turning them on and off, in
tests/acceptance/test_held_horizon.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django_xjobs.records import ClaimBatch, ClaimScans, DueScan
from django_xjobs.worker.floors import (
    HORIZON_XIDS,
    LAPSED_MARGIN,
    MARGIN,
    RELEASE_WALK,
    SWEEP,
    SWEEP_SHARE,
    Floors,
)

T = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def batch(*due: tuple[str, int, int, datetime], queues=("q",), lapsed=None, taken=None,
          keyed=()) -> ClaimBatch:
    """A claim's answer whose scans found ``due`` (queue, priority, rows, last run_at)."""
    b = ClaimBatch()
    b.now = T
    b.scans = ClaimScans(
        queues=frozenset(queues), lapsed=lapsed or {}, taken=taken or {},
        due=tuple(DueScan(queue=q, priority=p, found=n, last=last, keyed=q in keyed)
                  for q, p, n, last in due))
    return b


def held(priorities=(0,), fair=(), wants=("q",)) -> Floors:
    floors = Floors(priorities=priorities, fair=fair)
    floors.horizon(HORIZON_XIDS)
    first = floors.for_claim(dict.fromkeys(wants, 10), 0.0)
    assert first is not None and first.queues == frozenset() and first.lapsed == {}  # a sweep
    return floors


def as_dict(floors) -> dict:
    return {(q, p): v for q, p, v in zip(floors.floor_queues, floors.floor_priorities,
                                         floors.floor_values, strict=True)}


def test_no_floors_while_the_horizon_is_not_held():
    floors = Floors(priorities=[0])
    floors.horizon(HORIZON_XIDS - 1)
    floors.claimed({"q": 10}, batch(("q", 0, 1, T)))

    assert floors.for_claim({"q": 10}, 1.0) is None


def test_a_claim_whose_scans_ran_dry_moves_every_floor_to_its_now_less_the_margin():
    floors = held(priorities=(0, 5))
    floors.claimed({"q": 10}, batch(("q", 0, 1, T - timedelta(seconds=1)), ("q", 1, 1, T)))

    sent = floors.for_claim({"q": 10}, 1.0)
    assert sent.queues == {"q"}
    assert as_dict(sent) == {("q", p): T - MARGIN for p in (5, 1, 0)}
    assert sent.floor_priorities == (5, 1, 0)  # highest first, the one met included
    assert sent.lapsed == {"q": T - LAPSED_MARGIN}


def test_a_full_scan_keeps_the_lowest_priority_it_reached_where_it_stopped():
    floors = held(priorities=(0, 5, 9))
    floors.claimed({"q": 3}, batch(("q", 9, 1, T - timedelta(minutes=9)),
                                   ("q", 5, 2, T - timedelta(minutes=4))))

    sent = as_dict(floors.for_claim({"q": 3}, 1.0))
    assert sent[("q", 9)] == T - MARGIN  # ran dry: the scan went on to a lower one
    assert sent[("q", 5)] == T - timedelta(minutes=4) - MARGIN  # stopped at the share
    assert sent[("q", 0)] is None  # not reached: from the start


def test_rows_held_back_or_buried_count_as_found_not_as_missing():
    """The scans' counts come before flow control and burials: two rescues read (one of them
    buried, so not answered) fill n = 2, and the due scan, left no share, learns nothing."""
    floors = held()
    floors.claimed({"q": 2}, batch(lapsed={"q": 2}, taken={"q": 2}))

    sent = floors.for_claim({"q": 2}, 1.0)
    assert sent.lapsed == {}  # the rescue scan stopped at n: from the start next time
    assert as_dict(sent) == {("q", 0): None}


def test_a_queue_not_scanned_keeps_its_floors():
    floors = held(wants=("q", "paused"))
    floors.claimed({"q": 10, "paused": 10}, batch(queues=("q",)))

    sent = floors.for_claim({"q": 10, "paused": 10}, 1.0)
    assert as_dict(sent) == {("paused", 0): None, ("q", 0): T - MARGIN}
    assert sent.lapsed == {"q": T - LAPSED_MARGIN}


def test_a_queue_whose_scan_met_a_keyed_job_is_scanned_whole_but_its_rescues_are_not():
    floors = held(wants=("q", "k"))
    floors.claimed({"q": 10, "k": 10}, batch(("k", 0, 1, T), queues=("q", "k"), keyed=("k",)))

    sent = floors.for_claim({"q": 10, "k": 10}, 1.0)
    assert sent.queues == {"q"}
    assert set(sent.floor_queues) == {"q"}
    assert set(sent.lapsed) == {"q", "k"}


def test_a_fair_queue_has_rescue_floors_only():
    floors = held(fair=("f",), wants=("f",))
    floors.claimed({"f": 10}, batch(queues=("f",)))

    sent = floors.for_claim({"f": 10}, 1.0)
    assert sent.queues == frozenset()
    assert sent.lapsed == {"f": T - LAPSED_MARGIN}


def test_each_queue_sweeps_on_its_own_clock_and_all_after_a_wake():
    floors = held(wants=("q",))
    floors.claimed({"q": 10}, batch())
    assert floors.for_claim({"q": 10, "r": 10}, 1.0).queues == {"q"}  # r: its first, a sweep
    assert floors.for_claim({"q": 10}, SWEEP - 1).queues == {"q"}
    assert floors.for_claim({"q": 10}, SWEEP + 1).queues == frozenset()  # q's sweep
    assert floors.for_claim({"q": 10}, SWEEP + 2).queues == {"q"}

    floors.sweep_soon()
    assert floors.for_claim({"q": 10}, SWEEP + 3).queues == frozenset()
    assert floors.sweeps == 4  # q at 0, r at 1, q at SWEEP + 1 and after the wake


def test_a_sweep_that_costs_more_than_its_share_of_the_loop_comes_less_often():
    """A sweep reads every entry pinned since the horizon was held: once it takes longer than
    SWEEP_SHARE of SWEEP, the next one waits its duration over that share."""
    floors = Floors(priorities=[0])
    floors.horizon(HORIZON_XIDS)
    assert floors.for_claim({"q": 10}, 0.0).queues == frozenset()  # the first: a sweep
    slow = 2.0  # seconds, so the next is due 200 s after this one was sent
    floors.claimed({"q": 10}, batch(), sent=0.0, done=slow)
    assert slow / SWEEP_SHARE > SWEEP
    assert floors.for_claim({"q": 10}, SWEEP + 1).queues == {"q"}  # floored, not swept
    assert floors.for_claim({"q": 10}, slow / SWEEP_SHARE - 1).queues == {"q"}
    at = slow / SWEEP_SHARE + 1
    assert floors.for_claim({"q": 10}, at).queues == frozenset()  # its sweep
    floors.claimed({"q": 10}, batch(), sent=at, done=at + 0.01)  # cheap again: SWEEP apart
    assert floors.for_claim({"q": 10}, at + SWEEP - 1).queues == {"q"}
    assert floors.for_claim({"q": 10}, at + SWEEP + 1).queues == frozenset()
    floors.claimed({"q": 10}, batch(), sent=at + SWEEP + 1, done=at + SWEEP + 1)
    assert floors.for_claim({"q": 10}, at + SWEEP + 2).queues == {"q"}  # a floored claim's
    floors.claimed({"q": 10}, batch(), sent=at + SWEEP + 2, done=at + 100)  # time is not a sweep's
    assert floors.for_claim({"q": 10}, at + 2 * SWEEP + 2).queues == frozenset()


def test_floors_are_forgotten_when_the_horizon_moves_on():
    floors = held()
    floors.claimed({"q": 10}, batch())
    floors.horizon(0)
    assert floors.for_claim({"q": 10}, 1.0) is None

    floors.horizon(HORIZON_XIDS)
    assert floors.for_claim({"q": 10}, 2.0).queues == frozenset()  # a sweep first
    assert as_dict(floors.for_claim({"q": 10}, 3.0)) == {("q", 0): None}


def test_a_queue_whose_last_sweep_was_long_keeps_its_floors_until_its_next_sweep():
    """The horizon moved on, but what the hold left is still to walk: a queue whose last sweep
    took longer than RELEASE_WALK keeps its floors (the other workers' claims, which read the
    horizon at the same moment, keep picking up) until its next sweep, on the hold's schedule,
    has walked it; a queue whose sweep was cheap scans from the start at once."""
    floors = Floors(priorities=[0])
    floors.horizon(HORIZON_XIDS)
    wants = {"slow": 10, "fast": 10}
    assert floors.for_claim({"fast": 10}, 0.0).queues == frozenset()  # fast's first: a sweep
    floors.claimed({"fast": 10}, batch(queues=("fast",)), sent=0.0, done=RELEASE_WALK / 2)
    slow = RELEASE_WALK * 40
    assert floors.for_claim(wants, 1.0).queues == {"fast"}  # slow's first: a sweep
    floors.claimed(wants, batch(queues=("slow", "fast")), sent=1.0, done=1.0 + slow)
    floors.horizon(0)
    next_slow = 1.0 + slow / SWEEP_SHARE
    kept = floors.for_claim(wants, 2.0)
    assert kept is not None
    assert kept.queues == {"slow"} and set(kept.floor_queues) == {"slow"}
    assert set(kept.lapsed) == {"slow"}  # fast: from the start, and not counted as a sweep
    floors.claimed(wants, batch(queues=("slow", "fast")), sent=2.0, done=2.0)
    assert floors.for_claim(wants, next_slow - 1).queues == {"slow"}
    sweeps = floors.sweeps

    swept = floors.for_claim(wants, next_slow + 1)  # slow's sweep, on its schedule
    assert swept is not None and swept.queues == frozenset() and swept.lapsed == {}
    assert floors.sweeps == sweeps + 1
    floors.claimed(wants, batch(queues=("slow", "fast")), sent=next_slow + 1,
                   done=next_slow + 1 + slow)
    assert floors.for_claim(wants, next_slow + 2 + slow) is None  # off

    floors.horizon(HORIZON_XIDS)  # held again: every queue sweeps first, as at the start
    again = floors.for_claim(wants, next_slow + 3 + slow)
    assert again.queues == frozenset() and as_dict(again) == {}


def test_a_hold_taken_again_before_the_release_sweep_floors_every_queue_again():
    floors = Floors(priorities=[0])
    floors.horizon(HORIZON_XIDS)
    wants = {"slow": 10, "fast": 10}
    floors.for_claim(wants, 0.0)
    floors.claimed(wants, batch(queues=("slow", "fast")), sent=0.0, done=1.0)
    floors.horizon(0)
    assert floors.for_claim(wants, 1.0).queues == {"slow", "fast"}  # both walked long

    floors.horizon(HORIZON_XIDS)
    floors.for_claim(wants, 2.0)
    floors.claimed(wants, batch(queues=("slow", "fast")), sent=2.0, done=2.0)
    floors.horizon(0)
    # The sweep at 0.0 set both schedules; a sweep under the hold never lets a queue go.
    assert floors.for_claim(wants, 3.0).queues == {"slow", "fast"}
