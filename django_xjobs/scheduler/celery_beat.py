"""A Celery beat schedule as ``XJOBS["SCHEDULE"]`` entries, without Celery.

``from_celery_beat(CELERY_BEAT_SCHEDULE)`` is called in a settings module, so it needs nothing
Django has not loaded yet: Celery's schedule objects are read by what they carry (duck typing,
Celery is not a dependency), the job registry is not consulted (it is empty while settings are
read), and croniter is not imported. What only the registry can judge (the job's name, the
positional ``args`` mapped onto its parameters) is judged by the system checks, naming the
entry (scheduler/schedule.py). What cannot be converted faithfully is refused here with a
:class:`ConfigurationError` naming the entry; options that only a message broker reads are
dropped with a logged warning. docs/scheduling.md, "Importing a Celery beat schedule", has the
table.

:class:`crontab` is Celery's literal for a project that drops Celery and keeps its schedule:
the same constructor arguments and ``_orig_*`` attributes, read by :func:`from_celery_beat`
like Celery's own.

Celery's crontab reads its fields its own way, and the conversion follows it, not cron:

* ``day_of_week`` counts Sunday as 0 (as cron does) up to Saturday 6, and takes day names
  (``"mon-fri"``, ``"sunday"``: the first three letters count); 7 is refused, as Celery does
  (names in the other fields, which Celery reads as day numbers too, are refused);
* a range may wrap (``"fri-mon"`` is Friday to Monday), a step applies to a range or ``*``;
* a field may be an int, a string, or any iterable of ints (a set, a list, a ``range``);
* a day must be in ``day_of_month`` AND in ``day_of_week``, where cron (and croniter) fire on a
  day in EITHER when both are restricted: such a crontab is refused rather than converted to
  something that fires on other days.

Each field is expanded to its set of values, as Celery does, and written back as a cron field
(``*``, ``*/15``, ``1-5``, ``0,30``), so croniter and Celery agree on every value
(tests/unit/test_celery_beat.py compares their occurrences).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, timedelta
from typing import Any

from ..exceptions import ConfigurationError
from ..values import NAME_RE
from . import cron, interval

log = logging.getLogger("django_xjobs.scheduler")

# Celery's day names: the first three letters of a name, Sunday first (Sunday is 0).
WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")

# Celery's crontab fields in the order of a cron expression, with their lowest and highest
# values.
FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day_of_month", 1, 31),
          ("month_of_year", 1, 12), ("day_of_week", 0, 6))

ENTRY_KEYS = frozenset({"task", "schedule", "args", "kwargs", "options", "relative"})
# Options a broker reads and a job in a table has no use for: dropped with a warning.
BROKER_OPTIONS = frozenset({"exchange", "exchange_type", "routing_key", "serializer",
                            "compression", "delivery_mode", "mandatory", "immediate", "retry",
                            "retry_policy", "ignore_result"})
# What to do instead of the options that would change what runs or when.
_INSTEAD = {
    "expires": 'a job here runs however late it starts; to keep runs from piling up behind a '
               'stopped worker, give the task "overlap": "skip"',
    "countdown": "each occurrence is due when it fires",
    "eta": "each occurrence is due when it fires",
    "time_limit": "a job's time limit is @job(timeout=...)",
    "soft_time_limit": "a job's time limit is @job(timeout=...)",
    "max_retries": "a job's attempts are @job(max_attempts=...)",
}

_RANGE_STEP = re.compile(r"(\w+?)-(\w+)/(\w*)")
_RANGE = re.compile(r"(\w+?)-(\w+)")
_STAR_STEP = re.compile(r"\*/(\w*)")


class crontab:  # Celery's name, lower case, so that a schedule literal keeps working
    """Celery's ``crontab(minute, hour, day_of_week, day_of_month, month_of_year)``: each field
    an int, a string (``"*/15"``, ``"mon-fri"``, ``"1,15"``) or an iterable of ints; ``"*"`` by
    default. Checked when built (a ``ConfigurationError``), read by ``from_celery_beat``;
    ``expression`` is the cron expression it converts to."""

    def __init__(self, minute: Any = "*", hour: Any = "*", day_of_week: Any = "*",
                 day_of_month: Any = "*", month_of_year: Any = "*") -> None:
        self._orig_minute = _given(minute)
        self._orig_hour = _given(hour)
        self._orig_day_of_week = _given(day_of_week)
        self._orig_day_of_month = _given(day_of_month)
        self._orig_month_of_year = _given(month_of_year)
        expanded = _expand_all(self, what="crontab")
        # Celery's attributes: each field's values, expanded.
        self.minute, self.hour = set(expanded["minute"]), set(expanded["hour"])
        self.day_of_month = set(expanded["day_of_month"])
        self.month_of_year = set(expanded["month_of_year"])
        self.day_of_week = set(expanded["day_of_week"])
        self.expression = _expression(expanded, what="crontab")

    def __repr__(self) -> str:  # Celery's
        return (f"<crontab: {self._orig_minute} {self._orig_hour} {self._orig_day_of_month} "
                f"{self._orig_month_of_year} {self._orig_day_of_week} (m/h/dM/MY/d)>")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, crontab):
            return NotImplemented
        return self.expression == other.expression


def from_celery_beat(beat_schedule: Mapping[str, Mapping[str, Any]], *, timezone: str = "UTC",
                     job_names: Mapping[str, str] | None = None,
                     ignore_options: Iterable[str] = ()) -> dict[str, dict[str, Any]]:
    """``XJOBS["SCHEDULE"]`` entries from a Celery ``beat_schedule`` dict::

        XJOBS = {"SCHEDULE": from_celery_beat(CELERY_BEAT_SCHEDULE, timezone=CELERY_TIMEZONE)}

    ``timezone``: the zone Celery's crontabs run in (Celery's ``timezone`` setting, UTC by
    default). ``job_names``: a Celery task name -> the job to run, for tasks that are ``@job``
    functions now (``"billing.tasks.invoice"`` -> ``"billing.invoice"``); other names are kept.
    ``ignore_options``: Celery ``options`` to drop rather than refuse (``{"expires"}``).

    Raises ``ConfigurationError`` naming the entry for what has no faithful equivalent
    (docs/scheduling.md, "Importing a Celery beat schedule", lists them).
    """
    zone = cron.parse_timezone(timezone, what="from_celery_beat(timezone=...)")
    renamed = dict(job_names or {})
    ignored = frozenset(ignore_options)
    if not isinstance(beat_schedule, Mapping):
        raise ConfigurationError(
            f"from_celery_beat: expected Celery's beat_schedule, a dict of entry name -> entry, "
            f"got {type(beat_schedule).__name__}"
        )
    entries: dict[str, dict[str, Any]] = {}
    for name, entry in beat_schedule.items():
        where = f"beat schedule entry {name!r}"
        task = _task_name(name, where)
        if task in entries:
            raise ConfigurationError(
                f"{where}: its task name {task!r} (the entry's name, with the characters a "
                "task name cannot have replaced) is taken by another entry; rename one"
            )
        entries[task] = _entry(entry, where, zone=zone, renamed=renamed, ignored=ignored)
    return entries


# ------------------------------------------------------------------------------- entries --


def _task_name(name: object, where: str) -> str:
    """The entry's name as a task name: Celery's are free text (``"send digest"``), ours are
    names (docs/scheduling.md): each run of other characters becomes one ``-``."""
    if not isinstance(name, str):
        raise ConfigurationError(f"{where}: an entry's name must be a string")
    task = re.sub(r"[^A-Za-z0-9_.:-]+", "-", name).strip("-")
    if not NAME_RE.match(task):
        raise ConfigurationError(
            f"{where}: cannot be a task name (1-200 characters from [A-Za-z0-9_.:-])"
        )
    return task


def _entry(entry: object, where: str, *, zone: str, renamed: Mapping[str, str],
           ignored: frozenset[str]) -> dict[str, Any]:
    if not isinstance(entry, Mapping):
        raise ConfigurationError(f'{where}: expected a dict with "task" and "schedule"')
    unknown = sorted(set(entry) - ENTRY_KEYS, key=str)
    if unknown:
        raise ConfigurationError(
            f"{where}: unknown key(s) {unknown}; a beat entry has {sorted(ENTRY_KEYS)}"
        )
    for required in ("task", "schedule"):
        if required not in entry:
            raise ConfigurationError(f'{where}: needs a "{required}"')
    task = entry["task"]
    if not isinstance(task, str):
        raise ConfigurationError(f'{where}: "task" must be a task name, got {task!r}')
    converted: dict[str, Any] = {"job": renamed.get(task, task)}
    converted.update(_when(entry["schedule"], where, zone=zone,
                           relative=bool(entry.get("relative", False))))
    args = entry.get("args")
    if args:
        if isinstance(args, str | bytes | Mapping) or not isinstance(args, Iterable):
            raise ConfigurationError(f'{where}: "args" must be a tuple or list, got {args!r:.80}')
        # Mapped onto the job's parameters when the registry knows the job (schedule.py).
        converted["args"] = list(args)
    kwargs = entry.get("kwargs")
    if kwargs:
        if not isinstance(kwargs, Mapping):
            raise ConfigurationError(f'{where}: "kwargs" must be a dict, got {kwargs!r:.80}')
        converted["input"] = dict(kwargs)
    converted.update(_options(entry.get("options") or {}, where, ignored))
    return converted


def _options(options: object, where: str, ignored: frozenset[str]) -> dict[str, Any]:
    """Celery's ``apply_async`` options: ``queue`` and ``priority`` carry over (both are
    enqueue options here; priority: higher runs first, as on RabbitMQ); a broker's are dropped
    with a warning; the others would change what runs or when, and are refused."""
    if not isinstance(options, Mapping):
        raise ConfigurationError(f'{where}: "options" must be a dict, got {options!r:.80}')
    kept: dict[str, Any] = {}
    dropped = sorted(k for k in options if k in BROKER_OPTIONS and k not in ignored)
    for key, value in options.items():
        if key in ("queue", "priority"):
            kept[key] = value  # judged with the rest of the entry (conf.py)
        elif key in ignored or key in BROKER_OPTIONS:
            continue
        else:
            instead = _INSTEAD.get(key, "")
            raise ConfigurationError(
                f"{where}: options[{key!r}] has no equivalent here"
                + (f" ({instead})" if instead else "")
                + f"; remove it, or pass ignore_options={{{key!r}}} to from_celery_beat"
            )
    if dropped:
        log.warning("%s: dropped options %s: a message broker reads them, and jobs in the "
                    "database have no broker", where, ", ".join(dropped))
    return kept


def _when(schedule: Any, where: str, *, zone: str, relative: bool) -> dict[str, Any]:
    """The entry's ``schedule``: a crontab becomes ``cron`` (and ``timezone``), an interval
    ``every``. Celery's ``relative`` applies to intervals only, as in Celery."""
    if all(hasattr(schedule, f"_orig_{name}") for name, _, _ in FIELDS):
        expanded = _expand_all(schedule, what=where)
        return {"cron": _expression(expanded, what=where),
                "timezone": _crontab_zone(schedule, where, zone)}
    if hasattr(schedule, "event") and hasattr(schedule, "lat"):
        raise ConfigurationError(
            f"{where}: a solar schedule ({schedule.event}) has no equivalent here; give a cron "
            "expression at the times it should run"
        )
    if hasattr(schedule, "run_every"):  # celery.schedules.schedule
        relative = relative or bool(getattr(schedule, "relative", False))
        schedule = schedule.run_every
    if isinstance(schedule, timedelta) or (
            isinstance(schedule, int | float) and not isinstance(schedule, bool)):
        if relative:
            raise ConfigurationError(
                f"{where}: relative=True (Celery rounds each run to the interval's unit) has "
                "no equivalent; intervals here fire on a grid anchored at the Unix epoch "
                '(docs/scheduling.md, "Intervals"): drop relative=True, or give a cron '
                "expression"
            )
        return {"every": interval.parse(schedule, what=f"{where}: schedule").every}
    raise ConfigurationError(
        f"{where}: cannot read schedule {schedule!r:.80}: expected a crontab, a timedelta, "
        "seconds, or Celery's schedule(run_every=...)"
    )


def _crontab_zone(schedule: Any, where: str, zone: str) -> str:
    """The zone a crontab runs in: its own ``tz`` when it carries one (django-celery-beat's
    ``TzAwareCrontab``), else the zone given to :func:`from_celery_beat`. A crontab with a
    clock of its own (``nowfun``) and no zone cannot be converted."""
    own = getattr(schedule, "__dict__", {}).get("tz")
    if own is not None:
        name = getattr(own, "key", None) or getattr(own, "zone", None)
        if name is None and own == UTC:
            name = "UTC"
        if not isinstance(name, str):
            raise ConfigurationError(f"{where}: cannot tell which zone its tz {own!r} is")
        return cron.parse_timezone(name, what=where)
    if getattr(schedule, "nowfun", None) is not None:
        raise ConfigurationError(
            f"{where}: its crontab has a clock of its own (nowfun=...), which cannot be read "
            "without calling it; drop it and pass the zone it stands for to "
            "from_celery_beat(timezone=...)"
        )
    return zone


# -------------------------------------------------------------------------------- fields --


def _given(value: Any) -> Any:
    return "*" if value is None else value  # Celery's cronfield()


def _expand_all(schedule: Any, *, what: str) -> dict[str, frozenset[int]]:
    return {name: _expand(_given(getattr(schedule, f"_orig_{name}")), name, low, high,
                          what=what)
            for name, low, high in FIELDS}


def _expand(value: Any, name: str, low: int, high: int, *, what: str) -> frozenset[int]:
    """A field's values, as Celery's ``crontab._expand_cronspec`` reads them."""
    where = f"{what}: {name}={value!r:.60}"
    if isinstance(value, bool):
        raise ConfigurationError(f"{where}: expected an int, a string or a set of ints")
    if isinstance(value, int):
        values = {value}
    elif isinstance(value, str):
        values = _parse(value, name, low, high, where)
    elif isinstance(value, Iterable):
        values = set(value)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise ConfigurationError(f"{where}: a collection of values must hold ints")
    else:
        raise ConfigurationError(f"{where}: expected an int, a string or a set of ints")
    wrong = sorted(v for v in values if not low <= v <= high)
    if wrong:
        raise ConfigurationError(f"{where}: {wrong[0]} is not from {low} to {high}"
                                 + (" (Sunday is 0)" if name == "day_of_week" else ""))
    if not values:
        raise ConfigurationError(f"{where}: no value: it would never fire")
    return frozenset(values)


def _parse(spec: str, name: str, low: int, high: int, where: str) -> set[int]:
    """Celery's ``crontab_parser``: comma-separated parts, each ``*``, ``*/step``, a number
    (a day name for day_of_week), ``a-b`` (wrapping past the highest value when ``b < a``) or
    ``a-b/step``."""
    values: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        if not part:
            raise ConfigurationError(f"{where}: an empty part")
        if m := _RANGE_STEP.fullmatch(part):
            found = _range(m[1], m[2], name, low, high, where)[::_step(m[3], where)]
        elif m := _RANGE.fullmatch(part):
            found = _range(m[1], m[2], name, low, high, where)
        elif m := _STAR_STEP.fullmatch(part):
            found = list(range(low, high + 1))[::_step(m[1], where)]
        elif part == "*":
            found = list(range(low, high + 1))
        else:
            found = [_number(part, name, low, high, where)]
        values.update(found)
    return values


def _range(first: str, last: str, name: str, low: int, high: int, where: str) -> list[int]:
    start, end = (_number(t, name, low, high, where) for t in (first, last))
    if end < start:  # wraps: "fri-mon", "50-10"
        return list(range(start, high + 1)) + list(range(low, end + 1))
    return list(range(start, end + 1))


def _step(text: str, where: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) == 0:
        raise ConfigurationError(f"{where}: a step must be a positive number, got {text!r}")
    return int(text)


def _number(token: str, name: str, low: int, high: int, where: str) -> int:
    if token.isascii() and token.isdigit():
        number = int(token)
    elif name == "day_of_week" and token[:3].lower() in WEEKDAYS:
        number = WEEKDAYS.index(token[:3].lower())
    elif name == "day_of_week":
        raise ConfigurationError(f"{where}: {token!r} is neither a number nor a day's name")
    else:
        raise ConfigurationError(f"{where}: {token!r} is not a number")
    if not low <= number <= high:
        raise ConfigurationError(f"{where}: {number} is not from {low} to {high}"
                                 + (" (Sunday is 0)" if name == "day_of_week" else ""))
    return number


def _expression(expanded: Mapping[str, frozenset[int]], *, what: str) -> str:
    """The five fields as a cron expression (``minute hour day-of-month month day-of-week``)."""
    full = {name: frozenset(range(low, high + 1)) for name, low, high in FIELDS}
    if (expanded["day_of_month"] != full["day_of_month"]
            and expanded["day_of_week"] != full["day_of_week"]):
        raise ConfigurationError(
            f"{what}: Celery runs a crontab on the days in day_of_month AND in day_of_week, a "
            "cron expression on the days in either; give only one of them, or write the cron "
            "expression (e.g. '0 9 * * 1#1' for the first Monday of each month)"
        )
    return " ".join(_field(expanded[name], low, high, steps=name != "day_of_week")
                    for name, low, high in FIELDS)


def _field(values: frozenset[int], low: int, high: int, *, steps: bool) -> str:
    """One field's values written back: ``*``, ``*/15``, ``1-5``, ``0,30``, ``1-5,10``."""
    ordered = sorted(values)
    if ordered == list(range(low, high + 1)):
        return "*"
    # "*/n" only where croniter counts from the field's lowest value as Celery does; day of
    # week is written out (croniter's week runs to 7).
    if steps and len(ordered) > 2 and ordered[0] == low:
        step = ordered[1] - ordered[0]
        if ordered == list(range(low, high + 1, step)):
            return f"*/{step}"
    parts: list[str] = []
    start = previous = ordered[0]
    for value in [*ordered[1:], None]:
        if value is not None and value == previous + 1:
            previous = value
            continue
        if previous - start >= 2:
            parts.append(f"{start}-{previous}")
        else:
            parts.extend(str(v) for v in range(start, previous + 1))
        if value is not None:
            start = previous = value
    return ",".join(parts)
