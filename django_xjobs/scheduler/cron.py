"""Cron occurrences, misfire policies and daylight-saving time. Pure: no database, no Django.

Expressions have 5 fields (``minute hour day-of-month month day-of-week``) or 6 with SECONDS
FIRST (``second minute hour day-of-month month day-of-week``, as in Quartz, Spring and most
JavaScript schedulers), or are one of croniter's aliases (``@hourly``, ``@daily``, ...).
croniter computes the occurrences, in the task's own timezone (``zoneinfo``), so ``0 3 * * *``
in ``Europe/Paris`` is 03:00 Paris time all year round.

Daylight-saving time is croniter's behaviour, pinned by tests/unit/test_cron.py:

* spring forward (a local hour that does not exist): an occurrence that falls in the gap fires
  ONCE, at the first instant after it (``30 2 * * *`` fires at 03:00 on that day); a schedule
  that runs every few minutes simply has no occurrences in the missing hour;
* fall back (a local hour that happens twice): each pass through the repeated hour is its own
  instant, so ``*/20 * * * *`` keeps firing every 20 real minutes, and ``30 2 * * *`` fires at
  02:30 of BOTH passes (two instants, two keys). Put a once-a-day job that must not run twice
  outside 01:00-03:00 local, or give it ``timezone="UTC"``.

Every occurrence is returned as an aware UTC datetime: that is what is stored (the watermark)
and what names the occurrence in its idempotency key, so one instant has one name whatever the
task's timezone.

Misfire (:func:`due`): the occurrences in ``(watermark, now]`` are split by ``grace``. Those
at most ``grace`` before now are ON TIME and always fire: a round that runs a little late (a busy
machine, a leader handover shorter than the grace) loses nothing. Older ones were MISSED (the
scheduler was down) and the task's policy decides:

* ``latest`` (the default): the most recent missed occurrence fires, unless an on-time one
  fires anyway; a downtime costs one catch-up run, not one per missed occurrence;
* ``all``: every missed occurrence fires, at most ``max_catchup`` of them (the most recent);
* ``skip``: none of them fires.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ..exceptions import ConfigurationError

if TYPE_CHECKING:
    from croniter import croniter

MISFIRE_POLICIES = ("latest", "all", "skip")
_FAR_PAST = datetime(2000, 1, 1, tzinfo=UTC)
_INSTANT = timedelta(microseconds=1)
_FIRST_WINDOW = timedelta(seconds=1)


@dataclass(frozen=True, slots=True)
class CronSchedule:
    """A parsed cron expression in a timezone. Build with :func:`parse`."""

    expression: str
    timezone: str
    seconds: bool  # 6 fields, the first one seconds
    # Parsed once: croniter's constructor re-expands the expression, most of a scheduler round's
    # time (docs/performance.md, "What the simpler forms cost"). Each walk starts from a shallow
    # copy of this one.
    _template: croniter | None = field(default=None, compare=False, repr=False)

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def _iter(self, start: datetime) -> croniter:
        begin = start.astimezone(self.zone)
        if self._template is None:
            from croniter import croniter  # parse() imported it already: a dictionary lookup
            return croniter(self.expression, begin, second_at_beginning=self.seconds)
        it = copy.copy(self._template)
        it.set_current(begin, force=True)
        return it

    def after(self, start: datetime) -> Iterator[datetime]:
        """The occurrences strictly after ``start``, ascending, as UTC datetimes (endless)."""
        it = self._iter(start)
        while True:
            yield _utc(it.get_next(datetime))

    def next_after(self, start: datetime) -> datetime:
        return next(self.after(start))

    @property
    def text(self) -> str:
        """The expression, as ``manage.py xjobs schedule`` and the console show it."""
        return self.expression

    def between(self, start: datetime, end: datetime, *, limit: int | None = None
                ) -> list[datetime]:
        """Occurrences in ``(start, end]``, ascending; at most ``limit`` (the earliest)."""
        return occurrences_between(self.after(start), start, end, limit)


def _utc(value: datetime) -> datetime:
    # croniter marks some results fold=1; an aware UTC instant has no fold to speak of.
    return value.astimezone(UTC).replace(fold=0)


def parse(expression: object, timezone: object = "UTC", *, what: str = "cron") -> CronSchedule:
    """Validate ``expression`` in ``timezone``; raise :class:`ConfigurationError` saying why."""
    if not isinstance(expression, str) or not expression.strip():
        raise ConfigurationError(f"{what}: expected a cron expression string, got {expression!r}")
    text = " ".join(expression.split())
    zone = parse_timezone(timezone, what=what)
    fields = text.split(" ")
    if text.startswith("@"):
        seconds = False
    elif len(fields) in (5, 6):
        seconds = len(fields) == 6
    else:
        raise ConfigurationError(
            f"{what}: {expression!r} has {len(fields)} fields; a cron expression has 5 "
            "(minute hour day-of-month month day-of-week) or 6 with seconds first "
            "(second minute hour day-of-month month day-of-week)"
        )
    # Imported by the first parse, not with the package: a worker without cron tasks never
    # needs it, and its start-up is shorter for it (docs/performance.md, "Worker start-up").
    from croniter import CroniterError, croniter  # the first parse pays, not every start-up

    if not croniter.is_valid(text, second_at_beginning=seconds):
        raise ConfigurationError(f"{what}: {expression!r} is not a valid cron expression")
    schedule = CronSchedule(expression=text, timezone=zone, seconds=seconds,
                            _template=croniter(text, _FAR_PAST.astimezone(ZoneInfo(zone)),
                                               second_at_beginning=seconds))
    try:
        schedule.next_after(_FAR_PAST)
    except (CroniterError, ValueError) as exc:
        raise ConfigurationError(
            f"{what}: {expression!r} never fires ({exc})"
        ) from None
    return schedule


def parse_timezone(value: object, *, what: str = "cron") -> str:
    """The IANA name of a timezone ``zoneinfo`` knows; a clear error otherwise."""
    if not isinstance(value, str) or not value:
        raise ConfigurationError(f"{what}: timezone must be an IANA name such as "
                                 f"'Europe/Paris', got {value!r}")
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigurationError(
            f"{what}: unknown timezone {value!r} (use an IANA name such as 'Europe/Paris' or "
            "'UTC'; on systems without tz data, install the tzdata package)"
        ) from None
    return value


def occurrences_between(after: Iterator[datetime], start: datetime, end: datetime,
                        limit: int | None) -> list[datetime]:
    """The occurrences of ``after`` (ascending, strictly after ``start``) up to ``end``, at
    most ``limit`` (the earliest): what a schedule's ``between`` returns, cron or interval."""
    found: list[datetime] = []
    if end <= start:
        return found
    for occurrence in after:
        if occurrence > end or (limit is not None and len(found) >= limit):
            break
        found.append(occurrence)
    return found


def parse_misfire(value: object, *, what: str = "cron") -> str:
    if value not in MISFIRE_POLICIES:
        raise ConfigurationError(
            f"{what}: misfire must be one of {', '.join(MISFIRE_POLICIES)}, got {value!r}"
        )
    return str(value)


class Occurrences(Protocol):
    """What :func:`due` walks: a :class:`CronSchedule`, or an interval's
    (``interval.IntervalSchedule``): the same misfire rules for both."""

    def between(self, start: datetime, end: datetime, *, limit: int | None = None
                ) -> list[datetime]: ...

    def next_after(self, start: datetime) -> datetime: ...


@dataclass(frozen=True, slots=True)
class Due:
    """What a round fires for one task: ``fire`` ascending; how many of them were missed
    (late beyond the grace), and whether missed occurrences were left unfired by the policy."""

    fire: tuple[datetime, ...]
    late: int = 0
    dropped: bool = False


def due(
    schedule: Occurrences,
    *,
    watermark: datetime,
    now: datetime,
    misfire: str,
    grace: timedelta,
    max_catchup: int,
) -> Due:
    """The occurrences to fire in ``(watermark, now]`` under ``misfire`` (module docstring).

    Only ever walks FORWARD, from inside the stretch: croniter's forward and backward walks
    disagree around some DST transitions (Lord Howe's half-hour shift), and anything found
    walking forward from a point in ``(watermark, now]`` up to ``now`` lies in it.
    """
    if now <= watermark:
        return Due(())
    cutoff = now - grace  # occurrences before this are missed, from it on on time
    # between() is open at its start: one microsecond before the cutoff takes the cutoff in.
    start = max(watermark, cutoff - _INSTANT)
    on_time = tuple(schedule.between(start, now))
    if start == watermark:
        return Due(on_time)
    end = cutoff - _INSTANT  # missed: (watermark, end]
    if misfire == "skip" or (misfire == "latest" and on_time):
        return Due(on_time, dropped=bool(_latest(schedule, watermark, end, 1)))
    want = 1 if misfire == "latest" else max_catchup
    late = _latest(schedule, watermark, end, want + 1)
    dropped = len(late) > want
    late = late[-want:]
    return Due(tuple(late) + on_time, late=len(late), dropped=dropped)


def _latest(schedule: Occurrences, watermark: datetime, end: datetime, n: int
            ) -> list[datetime]:
    """The ``n`` latest occurrences in ``(watermark, end]``, ascending, found walking forward
    through a window that widens back from ``end``: a year of downtime on a seconds schedule
    costs a few windows of about ``n`` occurrences, not a walk over every second of the year."""
    span = _FIRST_WINDOW
    while True:
        lower = max(watermark, end - span)
        found = schedule.between(lower, end)
        if len(found) >= n or lower == watermark:
            return found[-n:]
        # Widen to about what the density seen so far needs (a third more), at least 8-fold.
        span *= max(8.0, 1.34 * n / len(found)) if found else 8


def occurrence_key(task: str, occurrence: datetime) -> str:
    """The idempotency key of one occurrence: ``cron:<task>:<occurrence as UTC ISO 8601>``."""
    return f"cron:{task}:{_utc(occurrence).isoformat()}"
