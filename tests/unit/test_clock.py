"""clock.DatabaseClock: the database's time, read now and then, carried on the monotonic clock.

The reading is a plain callable here (what the scheduler passes is ``engine.db_now``; the
integration test of the round on it is in tests/integration/test_scheduler_round.py).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django_xjobs import clock

DB_TIME = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


class Ticks:
    def __init__(self) -> None:
        self.at = 100.0

    def __call__(self) -> float:
        return self.at


def test_it_follows_the_database_and_the_monotonic_clock_never_the_wall_clock():
    ticks, reads = Ticks(), []

    def read() -> datetime:
        reads.append(ticks.at)
        return DB_TIME + timedelta(seconds=ticks.at - 100.0)

    wall = DB_TIME + timedelta(hours=1)  # this machine's wall clock is an hour ahead
    with clock.override(now=lambda: wall, monotonic=ticks):
        db_clock = clock.DatabaseClock(read, every=60.0)
        assert db_clock.now() == wall, "before any reading it can only say the wall clock"
        db_clock.sync()
        assert db_clock.now() == DB_TIME
        ticks.at += 5.5
        wall -= timedelta(hours=2)  # and then steps back two hours: no matter
        assert db_clock.now() == DB_TIME + timedelta(seconds=5.5)
        db_clock.sync()  # fresh enough: no statement
        assert reads == [100.0]
        ticks.at += 60.0
        db_clock.sync()
        assert reads == [100.0, 165.5]
        assert db_clock.now() == DB_TIME + timedelta(seconds=65.5)
