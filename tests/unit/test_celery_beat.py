"""A Celery beat schedule read without Celery (scheduler/celery_beat.py): ``crontab`` and
``from_celery_beat``. No database, and no Celery: Celery's objects are stood in for by classes
that carry what Celery's carry (``_orig_*``, ``nowfun``, ``run_every``, ...).

The conversion is checked twice: each field's values against the examples of Celery's own
documentation (``crontab_parser``, ``crontab``), and the cron expression it writes against
those values, by comparing the occurrences croniter yields with the instants Celery's crontab
means (a day is in day_of_month, month_of_year and day_of_week at once; Sunday is 0)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from django_xjobs import conf
from django_xjobs.exceptions import ConfigurationError
from django_xjobs.scheduler import cron, crontab, from_celery_beat


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


class CeleryCrontab:
    """What a ``celery.schedules.crontab`` carries that the import reads. Its ``tz`` asks the
    Celery app, which in a settings module may not exist yet: reading it fails the test."""

    def __init__(self, minute="*", hour="*", day_of_week="*", day_of_month="*",
                 month_of_year="*", nowfun=None):
        self._orig_minute, self._orig_hour = minute, hour
        self._orig_day_of_week, self._orig_day_of_month = day_of_week, day_of_month
        self._orig_month_of_year = month_of_year
        self._orig_kwargs = {"nowfun": nowfun} if nowfun else {}
        self.nowfun, self._app = nowfun, None

    @property
    def tz(self):
        raise AssertionError("the import must not ask the Celery app for its timezone")


class TzAwareCrontab(CeleryCrontab):
    """django-celery-beat's ``TzAwareCrontab``: a zone of its own, and a clock that follows it."""

    def __init__(self, *args, tz, **kwargs):
        super().__init__(*args, nowfun=lambda: datetime.now(tz), **kwargs)
        self.__dict__["tz"] = tz


class CelerySchedule:
    """``celery.schedules.schedule``."""

    relative = False

    def __init__(self, run_every, relative=False):
        self.run_every, self.relative, self.nowfun = run_every, relative, None


class CelerySolar:
    """``celery.schedules.solar``."""

    def __init__(self, event, lat, lon):
        self.event, self.lat, self.lon = event, lat, lon


def entry(schedule, **more):
    return {"job": {"task": "shop.tasks.report", "schedule": schedule, **more}}


def converted(schedule, **more):
    return from_celery_beat(entry(schedule, **more))["job"]


# ------------------------------------------------------------------ Celery's field values --

# (field, given, values): the examples of Celery's crontab_parser and crontab docstrings, and
# the forms a crontab takes (an int, a set, a list, a range, None).
CELERY_EXAMPLES = [
    ("minute", "*/15", {0, 15, 30, 45}),
    ("hour", "*/4", {0, 4, 8, 12, 16, 20}),
    ("day_of_week", "*", set(range(7))),
    ("day_of_month", "*/3", {1, 4, 7, 10, 13, 16, 19, 22, 25, 28, 31}),
    ("month_of_year", "*/2", {1, 3, 5, 7, 9, 11}),
    ("month_of_year", "2-12/2", {2, 4, 6, 8, 10, 12}),
    ("minute", "1,13,30-45,50-59/2", {1, 13, *range(30, 46), 50, 52, 54, 56, 58}),
    ("hour", "0,8-17/2", {0, 8, 10, 12, 14, 16}),
    ("day_of_week", "mon-fri", {1, 2, 3, 4, 5}),
    ("day_of_month", "2-30/2", set(range(2, 31, 2))),
    ("day_of_month", "1-7,15-21", {*range(1, 8), *range(15, 22)}),
    ("month_of_year", "*/3", {1, 4, 7, 10}),
    # Ranges wrap past the highest value, as Celery's _expand_range does.
    ("day_of_week", "fri-mon", {5, 6, 0, 1}),
    ("minute", "50-10", {*range(50, 60), *range(0, 11)}),
    ("month_of_year", "11-2", {11, 12, 1, 2}),
    # Day names: Sunday is 0; the first three letters count, in any case.
    ("day_of_week", "sun", {0}),
    ("day_of_week", "sunday", {0}),
    ("day_of_week", "SAT,Sun", {6, 0}),
    ("day_of_week", "Monday-Wednesday", {1, 2, 3}),
    ("day_of_week", "0,6", {0, 6}),
    ("day_of_week", "*/2", {0, 2, 4, 6}),
    ("minute", 5, {5}),
    ("minute", "05", {5}),
    ("hour", {9, 17}, {9, 17}),
    ("hour", [9, 17], {9, 17}),
    ("minute", range(0, 60, 20), {0, 20, 40}),
    ("hour", None, set(range(24))),
    ("minute", " 1, 2", {1, 2}),
]


@pytest.mark.parametrize(("field", "given", "values"), CELERY_EXAMPLES)
def test_each_field_expands_to_the_values_celery_reads_in_it(field, given, values):
    assert getattr(crontab(**{field: given}), field) == values


def test_crontab_keeps_what_was_given_as_celery_does():
    c = crontab(minute=0, hour="*/3", day_of_week="mon-fri", month_of_year=None)

    assert (c._orig_minute, c._orig_hour, c._orig_day_of_week, c._orig_day_of_month,
            c._orig_month_of_year) == (0, "*/3", "mon-fri", "*", "*")
    assert repr(c) == "<crontab: 0 */3 * * mon-fri (m/h/dM/MY/d)>"
    assert c == crontab(minute="0", hour="0-23/3", day_of_week="1-5")
    assert c != crontab(minute=1, hour="*/3", day_of_week="mon-fri")


# ------------------------------------------------------------------- the cron expression --

@pytest.mark.parametrize(("given", "expression"), [
    ({}, "* * * * *"),
    ({"minute": 0, "hour": 3}, "0 3 * * *"),
    ({"minute": "*/15"}, "*/15 * * * *"),
    ({"minute": 30, "hour": 7, "day_of_week": "mon-fri"}, "30 7 * * 1-5"),
    ({"minute": 0, "hour": 0, "day_of_week": "sunday"}, "0 0 * * 0"),
    ({"minute": 0, "hour": 0, "day_of_week": "fri-mon"}, "0 0 * * 0,1,5,6"),
    ({"minute": 0, "hour": 0, "day_of_week": "*/2"}, "0 0 * * 0,2,4,6"),
    ({"minute": 0, "hour": "0,8-17/2"}, "0 0,8,10,12,14,16 * * *"),
    ({"minute": "1,13,30-45,50-59/2"}, "1,13,30-45,50,52,54,56,58 * * * *"),
    ({"minute": 0, "hour": 0, "day_of_month": "1-7,15-21"}, "0 0 1-7,15-21 * *"),
    ({"minute": 0, "hour": 0, "day_of_month": 1, "month_of_year": "*/3"}, "0 0 1 */3 *"),
    ({"minute": 0, "hour": 0, "day_of_month": "*/3"}, "0 0 */3 * *"),
    ({"minute": 0, "hour": 0, "day_of_month": 11, "month_of_year": 5}, "0 0 11 5 *"),
    ({"minute": range(0, 60, 10)}, "*/10 * * * *"),
    ({"minute": 0, "hour": "0-23", "day_of_week": "0-6"}, "0 * * * *"),
    ({"minute": 0, "hour": 0, "day_of_month": "1-31", "day_of_week": "mon"}, "0 0 * * 1"),
])
def test_a_crontab_becomes_the_cron_expression_of_its_values(given, expression):
    assert crontab(**given).expression == expression
    assert converted(CeleryCrontab(**given))["cron"] == expression


def test_sunday_is_day_zero_and_a_named_day_fires_on_that_day():
    # 2026-05-03 is a Sunday, 2026-05-04 a Monday.
    sunday = cron.parse(crontab(minute=0, hour=9, day_of_week=0).expression)
    monday = cron.parse(crontab(minute=0, hour=9, day_of_week="monday").expression)

    assert sunday.next_after(utc(2026, 5, 1)) == utc(2026, 5, 3, 9)
    assert monday.next_after(utc(2026, 5, 1)) == utc(2026, 5, 4, 9)


# Field forms for the comparison below: what a crontab may be given, per field.
def _forms(low: int, high: int, names: bool = False):
    number = st.integers(low, high)
    forms = [
        st.just("*"),
        number,
        number.map(str),
        st.integers(2, max(2, (high - low) // 2)).map(lambda n: f"*/{n}"),
        st.tuples(number, number).map(lambda r: f"{r[0]}-{r[1]}"),
        st.tuples(number, number, st.integers(1, 5)).map(lambda r: f"{r[0]}-{r[1]}/{r[2]}"),
        st.sets(number, min_size=1, max_size=5),
        st.lists(number, min_size=1, max_size=4).map(lambda v: ",".join(map(str, v))),
    ]
    if names:
        day = st.sampled_from(["sun", "mon", "tue", "wed", "thu", "fri", "sat", "Sunday",
                               "MONDAY", "friday"])
        forms += [day, st.tuples(day, day).map(lambda r: f"{r[0]}-{r[1]}"),
                  st.lists(day, min_size=1, max_size=3).map(",".join)]
    return st.one_of(*forms)


FIELDS = {"minute": _forms(0, 59), "hour": _forms(0, 23), "day_of_month": _forms(1, 31),
          "month_of_year": _forms(1, 12), "day_of_week": _forms(0, 6, names=True)}


def celery_occurrences(c: crontab, start: datetime, zone: ZoneInfo, count: int
                       ) -> list[datetime]:
    """The first ``count`` instants after ``start`` at which Celery runs ``c`` in ``zone``:
    each local day in day_of_month, month_of_year AND day_of_week (Sunday 0), at each of its
    hours and minutes. Written from Celery's documentation, not from cron."""
    found: list[datetime] = []
    day = start.astimezone(zone).date()
    while len(found) < count and day < date(2040, 1, 1):
        if (day.day in c.day_of_month and day.month in c.month_of_year
                and day.isoweekday() % 7 in c.day_of_week):
            for hour in sorted(c.hour):
                for minute in sorted(c.minute):
                    at = datetime.combine(day, time(hour, minute), tzinfo=zone).astimezone(UTC)
                    if at > start and len(found) < count:
                        found.append(at)
        day += timedelta(days=1)
    return found


@settings(max_examples=300, deadline=None)
@given(fields=st.fixed_dictionaries({}, optional=FIELDS),
       start=st.integers(0, 3 * 365 * 86400).map(lambda s: utc(2026, 1, 1) + timedelta(seconds=s)))
def test_croniter_fires_a_converted_crontab_when_celery_would(fields, start):
    try:
        c = crontab(**fields)
    except ConfigurationError as exc:
        # The one refusal a well-formed crontab meets: both day fields restricted.
        assert "day_of_month AND in day_of_week" in str(exc)
        return
    try:
        schedule = cron.parse(c.expression)
    except ConfigurationError as exc:  # a day that does not exist: 31 in a 30-day month only
        assert "never fires" in str(exc)
        assert celery_occurrences(c, start, ZoneInfo("UTC"), 1) == []
        return

    expected = celery_occurrences(c, start, ZoneInfo("UTC"), 12)
    assert schedule.between(start, expected[-1]) == expected


def test_a_converted_crontab_runs_in_the_given_zone_like_celerys_timezone_setting():
    c = crontab(minute=30, hour=8, day_of_week="mon-fri")
    paris = ZoneInfo("Europe/Paris")
    start = utc(2026, 3, 26)  # across the spring-forward of 2026-03-29

    schedule = cron.parse(c.expression, "Europe/Paris")

    expected = celery_occurrences(c, start, paris, 8)
    assert schedule.between(start, expected[-1]) == expected


@pytest.mark.parametrize(("given", "fragment"), [
    ({"day_of_week": 7}, "day_of_week=7: 7 is not from 0 to 6 (Sunday is 0)"),
    ({"day_of_week": "7"}, "7 is not from 0 to 6 (Sunday is 0)"),
    ({"minute": 60}, "60 is not from 0 to 59"),
    ({"hour": "25"}, "25 is not from 0 to 23"),
    ({"day_of_month": 0}, "0 is not from 1 to 31"),
    ({"month_of_year": "13"}, "13 is not from 1 to 12"),
    ({"month_of_year": "jan"}, "'jan' is not a number"),
    ({"hour": "mon"}, "'mon' is not a number"),
    ({"day_of_week": "funday"}, "'funday' is neither a number nor a day's name"),
    ({"minute": "*/0"}, "a step must be a positive number, got '0'"),
    ({"minute": "*/"}, "a step must be a positive number, got ''"),
    ({"minute": "1-5/"}, "a step must be a positive number"),
    ({"minute": "1,,2"}, "an empty part"),
    ({"minute": ""}, "an empty part"),
    ({"minute": "-5"}, "'-5' is not a number"),
    ({"minute": "1-5-7"}, "'1-5-7' is not a number"),
    ({"minute": set()}, "no value: it would never fire"),
    ({"minute": True}, "expected an int, a string or a set of ints"),
    ({"minute": 1.5}, "expected an int, a string or a set of ints"),
    ({"minute": ["1", "2"]}, "a collection of values must hold ints"),
    ({"day_of_month": 1, "day_of_week": "mon"},
     "Celery runs a crontab on the days in day_of_month AND in day_of_week"),
])
def test_a_crontab_celery_would_refuse_or_cron_would_misread_is_refused(given, fragment):
    with pytest.raises(ConfigurationError) as info:
        crontab(**given)
    assert fragment in str(info.value)

    with pytest.raises(ConfigurationError) as info:
        from_celery_beat(entry(CeleryCrontab(**given)))
    assert "beat schedule entry 'job'" in str(info.value) and fragment in str(info.value)


# ----------------------------------------------------------------------- the whole entry --

CELERY_BEAT_SCHEDULE = {
    "nightly-report": {"task": "shop.tasks.report", "schedule": CeleryCrontab(minute=0, hour=3),
                       "kwargs": {"region": "eu"}},
    "poll every 30 seconds": {"task": "shop.tasks.poll", "schedule": 30.0, "args": (1, "x")},
    "sync": {"task": "shop.tasks.sync", "schedule": timedelta(minutes=5),
             "options": {"queue": "sync", "priority": 7}},
    "weekly": {"task": "shop.tasks.weekly",
               "schedule": CeleryCrontab(minute=0, hour=7, day_of_week="mon")},
    "legacy": {"task": "shop.tasks.legacy", "schedule": CelerySchedule(timedelta(hours=1))},
}


def test_a_beat_schedule_becomes_schedule_entries():
    schedule = from_celery_beat(CELERY_BEAT_SCHEDULE, timezone="Europe/Paris")

    assert schedule == {
        "nightly-report": {"job": "shop.tasks.report", "cron": "0 3 * * *",
                           "timezone": "Europe/Paris", "input": {"region": "eu"}},
        "poll-every-30-seconds": {"job": "shop.tasks.poll", "every": timedelta(seconds=30),
                                  "args": [1, "x"]},
        "sync": {"job": "shop.tasks.sync", "every": timedelta(minutes=5), "queue": "sync",
                 "priority": 7},
        "weekly": {"job": "shop.tasks.weekly", "cron": "0 7 * * 1", "timezone": "Europe/Paris"},
        "legacy": {"job": "shop.tasks.legacy", "every": timedelta(hours=1)},
    }
    # What the settings then read, every entry well formed.
    parsed = conf.build({"SCHEDULE": schedule}).schedule
    assert parsed["poll-every-30-seconds"]["every"] == 30.0
    assert parsed["poll-every-30-seconds"]["args"] == [1, "x"]
    assert parsed["sync"]["queue"] == "sync" and parsed["weekly"]["timezone"] == "Europe/Paris"


def test_our_crontab_reads_like_celerys_and_the_zone_defaults_to_utc():
    assert from_celery_beat({"n": {"task": "a.b", "schedule": crontab(minute=0, hour=3)}}) == {
        "n": {"job": "a.b", "cron": "0 3 * * *", "timezone": "UTC"}}


def test_tasks_named_in_job_names_run_the_job_given_there():
    schedule = from_celery_beat(CELERY_BEAT_SCHEDULE,
                                job_names={"shop.tasks.report": "shop.nightly_report"})

    assert schedule["nightly-report"]["job"] == "shop.nightly_report"
    assert schedule["sync"]["job"] == "shop.tasks.sync"


def test_a_crontab_with_a_zone_of_its_own_runs_in_it():
    own = TzAwareCrontab(minute=0, hour=3, tz=ZoneInfo("America/New_York"))
    utc_own = TzAwareCrontab(minute=0, hour=3, tz=UTC)

    assert converted(own)["timezone"] == "America/New_York"
    assert converted(utc_own)["timezone"] == "UTC"


def test_broker_options_are_dropped_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="django_xjobs.scheduler"):
        found = converted(30, options={"routing_key": "r", "exchange": "e", "queue": "q"})

    assert found == {"job": "shop.tasks.report", "every": timedelta(seconds=30), "queue": "q"}
    assert ("beat schedule entry 'job': dropped options exchange, routing_key: a message "
            "broker reads them") in caplog.text


def test_an_option_listed_in_ignore_options_is_dropped_quietly(caplog):
    with caplog.at_level(logging.WARNING, logger="django_xjobs.scheduler"):
        found = from_celery_beat(entry(30, options={"expires": 25, "routing_key": "r"}),
                                 ignore_options={"expires", "routing_key"})

    assert found["job"] == {"job": "shop.tasks.report", "every": timedelta(seconds=30)}
    assert caplog.text == ""


def test_a_relative_flag_on_a_crontab_entry_is_ignored_as_celery_ignores_it():
    assert converted(CeleryCrontab(minute=0), relative=True)["cron"] == "0 * * * *"


@pytest.mark.parametrize(("beat", "fragment"), [
    (entry(CelerySolar("sunrise", 48.85, 2.35)),
     "entry 'job': a solar schedule (sunrise) has no equivalent here"),
    (entry(CelerySchedule(timedelta(hours=1), relative=True)), "relative=True"),
    (entry(timedelta(hours=1), relative=True), "relative=True (Celery rounds each run"),
    (entry(0.5), "entry 'job': schedule: 500ms is shorter than the shortest interval, 1s"),
    (entry(timedelta(days=400)), "longer than the longest interval"),
    (entry("0 3 * * *"), "cannot read schedule '0 3 * * *': expected a crontab, a timedelta"),
    (entry(True), "cannot read schedule True"),
    (entry(CeleryCrontab(minute=0, nowfun=lambda: datetime.now(UTC))),
     "its crontab has a clock of its own (nowfun=...)"),
    (entry(30, options={"expires": 25}),
     "options['expires'] has no equivalent here (a job here runs however late it starts; to "
     'keep runs from piling up behind a stopped worker, give the task "overlap": "skip"); '
     "remove it, or pass ignore_options={'expires'} to from_celery_beat"),
    (entry(30, options={"countdown": 5}), "options['countdown'] has no equivalent here"),
    (entry(30, options={"time_limit": 5}), "@job(timeout=...)"),
    (entry(30, options={"link": "x"}), "options['link'] has no equivalent here; remove it"),
    (entry(30, options=["queue"]), '"options" must be a dict'),
    (entry(30, args="abc"), '"args" must be a tuple or list'),
    (entry(30, kwargs=[("a", 1)]), '"kwargs" must be a dict'),
    (entry(30, name="x"), "unknown key(s) ['name']"),
    ({"job": {"schedule": 30}}, 'needs a "task"'),
    ({"job": {"task": "a.b"}}, 'needs a "schedule"'),
    ({"job": {"task": None, "schedule": 30}}, '"task" must be a task name'),
    ({"job": ("a.b", 30)}, 'expected a dict with "task" and "schedule"'),
    ({"!!!": {"task": "a.b", "schedule": 30}}, "cannot be a task name"),
    ({"a b": {"task": "a.b", "schedule": 30}, "a-b": {"task": "a.c", "schedule": 30}},
     "entry 'a-b': its task name 'a-b' (the entry's name, with the characters a task name "
     "cannot have replaced) is taken by another entry"),
])
def test_what_has_no_faithful_equivalent_is_refused_naming_the_entry(beat, fragment):
    with pytest.raises(ConfigurationError) as info:
        from_celery_beat(beat)
    assert fragment in str(info.value)


def test_the_zone_given_must_be_one_zoneinfo_knows():
    with pytest.raises(ConfigurationError, match=r"from_celery_beat\(timezone=...\): unknown "
                                                 "timezone 'Mars/Olympus'"):
        from_celery_beat({}, timezone="Mars/Olympus")
    with pytest.raises(ConfigurationError, match="expected Celery's beat_schedule"):
        from_celery_beat([("a", {})])


IN_A_SETTINGS_MODULE = """
import sys
from datetime import timedelta

from django_xjobs.scheduler import crontab, from_celery_beat

SCHEDULE = from_celery_beat({
    "nightly": {"task": "shop.tasks.report", "schedule": crontab(minute=0, hour=3)},
    "poll": {"task": "shop.tasks.poll", "schedule": timedelta(seconds=45), "args": (1,)},
})
assert SCHEDULE["nightly"]["cron"] == "0 3 * * *" and SCHEDULE["poll"]["args"] == [1]
assert "croniter" not in sys.modules, "the import parses no cron expression"
from django.apps import apps
assert not apps.ready
print("imported")
"""


def test_the_import_runs_where_a_settings_module_runs_before_django_is_set_up():
    # No settings module, no app registry: what a settings.py calling it has.
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run([sys.executable, "-c", IN_A_SETTINGS_MODULE], cwd=root,
                          env={**env, "PYTHONPATH": str(root)}, capture_output=True, text=True,
                          timeout=120)

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "imported"
