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
within ``grace`` of now are ON TIME and always fire: a round that runs a little late (a busy
machine, a leader handover shorter than the grace) loses nothing. Older ones were MISSED (the
scheduler was down) and the task's policy decides:

* ``latest`` (the default): the most recent missed occurrence fires, unless an on-time one
  fires anyway; a downtime costs one catch-up run, not one per missed occurrence;
* ``all``: every missed occurrence fires, at most ``max_catchup`` of them (the most recent);
* ``skip``: none of them fires.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter

from ..exceptions import ConfigurationError

MISFIRE_POLICIES = ("latest", "all", "skip")
_FAR_PAST = datetime(2000, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class CronSchedule:
    """A parsed cron expression in a timezone. Build with :func:`parse`."""

    expression: str
    timezone: str
    seconds: bool  # 6 fields, the first one seconds

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def _iter(self, start: datetime) -> croniter:
        return croniter(self.expression, start.astimezone(self.zone),
                        second_at_beginning=self.seconds)

    def after(self, start: datetime) -> Iterator[datetime]:
        """The occurrences strictly after ``start``, ascending, as UTC datetimes (endless)."""
        it = self._iter(start)
        while True:
            yield _utc(it.get_next(datetime))

    def before(self, start: datetime) -> Iterator[datetime]:
        """The occurrences strictly before ``start``, descending, as UTC datetimes (endless)."""
        it = self._iter(start)
        while True:
            yield _utc(it.get_prev(datetime))

    def next_after(self, start: datetime) -> datetime:
        return next(self.after(start))

    def between(self, start: datetime, end: datetime, *, limit: int | None = None
                ) -> list[datetime]:
        """Occurrences in ``(start, end]``, ascending; at most ``limit`` (the earliest)."""
        found: list[datetime] = []
        if end <= start:
            return found
        for occurrence in self.after(start):
            if occurrence > end or (limit is not None and len(found) >= limit):
                break
            found.append(occurrence)
        return found


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
    if not croniter.is_valid(text, second_at_beginning=seconds):
        raise ConfigurationError(f"{what}: {expression!r} is not a valid cron expression")
    schedule = CronSchedule(expression=text, timezone=zone, seconds=seconds)
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


def parse_misfire(value: object, *, what: str = "cron") -> str:
    if value not in MISFIRE_POLICIES:
        raise ConfigurationError(
            f"{what}: misfire must be one of {', '.join(MISFIRE_POLICIES)}, got {value!r}"
        )
    return str(value)


@dataclass(frozen=True, slots=True)
class Due:
    """What a round fires for one task: ``fire`` ascending; how many of them were missed
    (late beyond the grace), and whether missed occurrences were left unfired by the policy."""

    fire: tuple[datetime, ...]
    late: int = 0
    dropped: bool = False


def due(
    schedule: CronSchedule,
    *,
    watermark: datetime,
    now: datetime,
    misfire: str,
    grace: timedelta,
    max_catchup: int,
) -> Due:
    """The occurrences to fire in ``(watermark, now]`` under ``misfire`` (module docstring)."""
    if now <= watermark:
        return Due(())
    cutoff = now - grace  # occurrences at or before this are missed, after it on time
    on_time = schedule.between(max(watermark, cutoff), now)
    if cutoff <= watermark:
        return Due(tuple(on_time))
    # The latest missed occurrence is the one just before the first occurrence after cutoff:
    # walking back from there needs no inclusive bound at cutoff itself.
    first_after_cutoff = on_time[0] if on_time else schedule.next_after(cutoff)
    missed = schedule.before(first_after_cutoff)
    latest_missed = next(missed)
    if latest_missed <= watermark:
        return Due(tuple(on_time))
    if misfire == "skip" or (misfire == "latest" and on_time):
        return Due(tuple(on_time), dropped=True)
    if misfire == "latest":
        return Due((latest_missed,), late=1, dropped=_exists_before(schedule, latest_missed,
                                                                      watermark))
    late = [latest_missed]
    for occurrence in missed:
        if occurrence <= watermark or len(late) >= max_catchup:
            break
        late.append(occurrence)
    dropped = _exists_before(schedule, late[-1], watermark)
    return Due(tuple(reversed(late)) + tuple(on_time), late=len(late), dropped=dropped)


def _exists_before(schedule: CronSchedule, occurrence: datetime, watermark: datetime) -> bool:
    """Whether another occurrence lies in ``(watermark, occurrence)``."""
    return next(schedule.before(occurrence)) > watermark


def occurrence_key(task: str, occurrence: datetime) -> str:
    """The idempotency key of one occurrence: ``cron:<task>:<occurrence as UTC ISO 8601>``."""
    return f"cron:{task}:{_utc(occurrence).isoformat()}"
