"""Interval occurrences (``every=45s``). Pure: no database, no Django, no croniter.

An interval task fires at the instants ``epoch + k * every`` (``epoch`` the Unix epoch,
1970-01-01T00:00:00Z, ``k`` any integer): a fixed grid in real time, counted from a point
every process agrees on. Anchoring it there, and not at the task's last run, is what keeps
cron's guarantees for intervals (docs/scheduling.md, "Intervals"):

* any leader, the first or the one elected after a failover, computes the same occurrences
  from nothing but the task's ``every``, so the watermark and the idempotency keys
  (``cron:<task>:<occurrence>``) name the same instants whoever fires them; a schedule counted
  from its last run would move with every late round and every handover;
* the misfire policies and the overlap policies apply unchanged: :func:`cron.due` walks the
  occurrences in ``(watermark, now]`` through :meth:`IntervalSchedule.between`, as it walks a
  cron expression's.

What it means for a task: ``every=1h`` fires on the hour (UTC), ``every=15m`` at :00, :15, :30
and :45, ``every=1d`` at midnight UTC, ``every=7d`` on Thursdays at midnight UTC (the epoch
was a Thursday). A task declared at 10:07 with ``every=1h`` fires first at 11:00, not at
11:07. A time of day, or a day of the week, is what a cron expression is for.

No timezone: an interval counts real seconds, which no daylight-saving change adds or removes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from ..exceptions import ConfigurationError
from ..values import parse_duration
from .cron import occurrences_between

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# The shortest interval: a second, the finest a cron expression (6 fields) fires at. A round
# wakes at each occurrence (runner.py), so a shorter one would be a round, and a commit, for
# every few milliseconds of the leader's time.
MIN_EVERY = timedelta(seconds=1)
# The longest: a year. Longer ones are a date, which a cron expression says better.
MAX_EVERY = timedelta(days=366)
_MICROSECOND = timedelta(microseconds=1)
_UNITS = ((timedelta(days=1), "d"), (timedelta(hours=1), "h"), (timedelta(minutes=1), "m"),
          (timedelta(seconds=1), "s"), (timedelta(milliseconds=1), "ms"))


@dataclass(frozen=True, slots=True)
class IntervalSchedule:
    """Every ``every``, on the grid anchored at the Unix epoch. Build with :func:`parse`."""

    every: timedelta

    @property
    def text(self) -> str:
        """``every 45s``, ``every 90m``, ``every 1d``: as an operator reads it (the CLI, the
        console), in the units ``XJOBS["SCHEDULE"]`` takes."""
        return f"every {format_every(self.every)}"

    def next_after(self, start: datetime) -> datetime:
        """The first occurrence strictly after ``start`` (an aware datetime), in UTC."""
        # Whole microseconds: integer arithmetic, so no two processes round differently.
        step = self.every // _MICROSECOND
        elapsed = (start - EPOCH) // _MICROSECOND
        return EPOCH + (elapsed // step + 1) * step * _MICROSECOND

    def after(self, start: datetime) -> Iterator[datetime]:
        """The occurrences strictly after ``start``, ascending, as UTC datetimes (endless)."""
        occurrence = self.next_after(start)
        while True:
            yield occurrence
            occurrence += self.every

    def between(self, start: datetime, end: datetime, *, limit: int | None = None
                ) -> list[datetime]:
        """Occurrences in ``(start, end]``, ascending; at most ``limit`` (the earliest)."""
        return occurrences_between(self.after(start), start, end, limit)


def parse(value: object, *, what: str = "every") -> IntervalSchedule:
    """An interval from a ``timedelta``, seconds, or a string such as ``"45s"``; a
    :class:`ConfigurationError` saying why not, naming ``what``."""
    seconds = parse_duration(value, what=what)
    every = timedelta(seconds=seconds)
    if every < MIN_EVERY:
        raise ConfigurationError(
            f"{what}: {format_every(every)} is shorter than the shortest interval, "
            f"{format_every(MIN_EVERY)} "
            "(a cron expression with seconds, such as '* * * * * *', fires at most as often)"
        )
    if every > MAX_EVERY:
        raise ConfigurationError(
            f"{what}: {format_every(every)} is longer than the longest interval, "
            f"{format_every(MAX_EVERY)}; "
            "use a cron expression, such as '@yearly' or '0 3 1 1 *'"
        )
    return IntervalSchedule(every)


def format_every(every: timedelta) -> str:
    """The largest unit that says ``every`` exactly: ``45s``, ``90s`` -> ``90s``, ``3600s`` ->
    ``1h``, ``1.5s`` -> ``1500ms``; what ``parse`` reads back to the same interval."""
    for unit, name in _UNITS:
        count, rest = divmod(every, unit)
        if not rest and count:
            return f"{count}{name}"
    return f"{every.total_seconds():g}s"
