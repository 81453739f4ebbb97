"""Interval occurrences (scheduler/interval.py) and their misfire policies (cron.due). No
database."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from django_xjobs.exceptions import ConfigurationError
from django_xjobs.scheduler import cron, interval

NO_GRACE = timedelta(0)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def every(value: object) -> interval.IntervalSchedule:
    return interval.parse(value)


# ---------------------------------------------------------------------------------- parsing --


@pytest.mark.parametrize(("value", "seconds"), [
    (timedelta(seconds=45), 45), ("45s", 45), (45, 45), (45.0, 45), ("1.5s", 1.5),
    ("1500ms", 1.5), ("5m", 300), ("2h", 7200), ("1d", 86400), (timedelta(days=366), 366 * 86400),
    (1, 1),
])
def test_an_interval_is_a_timedelta_seconds_or_a_duration_string(value, seconds):
    assert every(value).every == timedelta(seconds=seconds)


@pytest.mark.parametrize(("value", "fragment"), [
    (0, "shorter than the shortest interval, 1s"),
    ("999ms", "shorter than the shortest interval, 1s"),
    (timedelta(days=366, seconds=1), "longer than the longest interval, 366d"),
    (-1, "must not be negative"),
    ("soon", "'soon' is not a duration"),
    (None, "expected a duration"),
    (True, "expected a duration"),
    (float("inf"), "must be a finite duration"),
])
def test_an_interval_out_of_range_or_not_a_duration_is_a_clear_configuration_error(
        value, fragment):
    with pytest.raises(ConfigurationError, match="poll") as info:
        interval.parse(value, what="poll")
    assert fragment in str(info.value)


@pytest.mark.parametrize(("value", "text"), [
    ("45s", "every 45s"), (90, "every 90s"), (3600, "every 1h"), ("90m", "every 90m"),
    ("1d", "every 1d"), ("7d", "every 7d"), ("1.5s", "every 1500ms"), (36 * 3600, "every 36h"),
])
def test_an_interval_reads_in_the_largest_unit_that_says_it_exactly(value, text):
    assert every(value).text == text


@settings(max_examples=200, deadline=None)
@given(milliseconds=st.integers(1000, 366 * 86400 * 1000))
def test_the_text_of_an_interval_parses_back_to_the_same_interval(milliseconds):
    schedule = every(timedelta(milliseconds=milliseconds))
    assert every(schedule.text.removeprefix("every ")) == schedule


# ------------------------------------------------------------------------------ anchoring --


def test_occurrences_are_multiples_of_the_interval_since_the_unix_epoch():
    # 2026-01-01T00:00:00Z is 1,767,225,600 s after the epoch, a multiple of 45 s and of 7 s;
    # 7 s does not divide a minute, and its occurrences still come from the epoch.
    assert every("45s").between(utc(2026, 1, 1), utc(2026, 1, 1, 0, 2)) == [
        utc(2026, 1, 1, 0, 0, 45), utc(2026, 1, 1, 0, 1, 30)]
    assert every("7s").between(utc(2026, 1, 1), utc(2026, 1, 1, 0, 0, 20)) == [
        utc(2026, 1, 1, 0, 0, 7), utc(2026, 1, 1, 0, 0, 14)]


def test_an_hour_fires_on_the_hour_a_day_at_midnight_utc_and_a_week_on_thursdays():
    start = utc(2026, 5, 4, 10, 7, 30)  # a Monday
    assert every("1h").next_after(start) == utc(2026, 5, 4, 11)
    assert every("15m").next_after(start) == utc(2026, 5, 4, 10, 15)
    assert every("1d").next_after(start) == utc(2026, 5, 5)
    weekly = every("7d").next_after(start)
    assert weekly == utc(2026, 5, 7) and weekly.strftime("%A") == "Thursday"


def test_the_first_occurrence_of_a_new_task_is_the_next_point_of_the_grid_not_one_interval_on():
    # Celery's beat would fire an hour after it first saw the task (10:07:30 -> 11:07:30).
    assert every("1h").next_after(utc(2026, 5, 4, 10, 59, 59)) == utc(2026, 5, 4, 11)


def test_between_is_open_at_the_start_and_closed_at_the_end():
    schedule = every("10s")
    assert schedule.between(utc(2026, 1, 1, 12), utc(2026, 1, 1, 12, 0, 30)) == [
        utc(2026, 1, 1, 12, 0, 10), utc(2026, 1, 1, 12, 0, 20), utc(2026, 1, 1, 12, 0, 30)]
    assert schedule.between(utc(2026, 1, 1, 12, 0, 30), utc(2026, 1, 1, 12, 0, 30)) == []
    assert schedule.between(utc(2026, 1, 1, 12), utc(2026, 1, 2), limit=2) == [
        utc(2026, 1, 1, 12, 0, 10), utc(2026, 1, 1, 12, 0, 20)]


def test_a_start_in_any_timezone_names_the_same_instants_and_occurrences_are_utc():
    paris = datetime(2026, 3, 29, 3, 0, 5, tzinfo=ZoneInfo("Europe/Paris"))  # just after DST

    found = every("10s").between(paris, paris + timedelta(seconds=20))

    assert found == every("10s").between(paris.astimezone(UTC),
                                         paris.astimezone(UTC) + timedelta(seconds=20))
    assert all(f.tzinfo is UTC for f in found)


def test_a_fractional_interval_is_exact_to_the_microsecond():
    found = every("1.5s").between(utc(2026, 1, 1), utc(2026, 1, 1, 0, 0, 4))
    assert found == [datetime(2026, 1, 1, 0, 0, 1, 500000, tzinfo=UTC), utc(2026, 1, 1, 0, 0, 3)]


# -------------------------------------------------------------------------------- misfire --

WATERMARK, NOW = utc(2026, 1, 1, 12, 0, 40), utc(2026, 1, 1, 12, 3, 40)
MISSED = [utc(2026, 1, 1, 12, 1), utc(2026, 1, 1, 12, 2), utc(2026, 1, 1, 12, 3)]


@pytest.mark.parametrize(("misfire", "fired", "late"), [
    ("latest", MISSED[-1:], 1), ("all", MISSED, 3), ("skip", [], 0)])
def test_after_a_downtime_the_misfire_policy_decides_as_for_cron(misfire, fired, late):
    result = cron.due(every("1m"), watermark=WATERMARK, now=NOW, misfire=misfire,
                      grace=timedelta(seconds=10), max_catchup=100)

    assert list(result.fire) == fired and result.late == late
    assert result.dropped == (misfire != "all")
    # The same as the cron expression that names the same instants.
    assert result == cron.due(cron.parse("* * * * *"), watermark=WATERMARK, now=NOW,
                              misfire=misfire, grace=timedelta(seconds=10), max_catchup=100)


def test_a_year_of_downtime_on_a_one_second_interval_is_computed_without_walking_it():
    result = cron.due(every(1), watermark=utc(2025, 1, 1), now=utc(2026, 1, 1, 0, 0, 0, 500000),
                      misfire="latest", grace=NO_GRACE, max_catchup=100)
    assert result.fire == (utc(2026, 1, 1),)


def test_all_is_bounded_by_max_catchup_keeping_the_most_recent():
    result = cron.due(every("1m"), watermark=utc(2026, 1, 1), now=utc(2026, 1, 2), misfire="all",
                      grace=NO_GRACE, max_catchup=5)
    assert list(result.fire) == [utc(2026, 1, 1, 23, m) for m in range(55, 60)] + [
        utc(2026, 1, 2)]
    assert result.late == 5 and result.dropped


# ----------------------------------------------------------------------------- properties --

INTERVALS = st.integers(1000, 3 * 86400 * 1000).map(lambda ms: timedelta(milliseconds=ms))
MOMENTS = st.integers(0, 400 * 86400 * 10**6).map(
    lambda us: utc(2025, 6, 1) + timedelta(microseconds=us))
# A stretch of at most a few hundred occurrences of the interval, and a part of one more: the
# walks stay short whatever the interval.
SPANS = st.tuples(st.integers(0, 300), st.floats(0, 1, exclude_max=True))


def stretch(step: timedelta, span: tuple[int, float]) -> timedelta:
    count, part = span
    return step * count + step * part + timedelta(microseconds=1)


@settings(max_examples=300, deadline=None)
@given(step=INTERVALS, start=MOMENTS, span=SPANS)
def test_occurrences_are_strictly_increasing_evenly_spaced_and_on_the_epochs_grid(
        step, start, span):
    schedule = every(step)
    end = start + stretch(step, span)
    fired = schedule.between(start, end)

    assert all(start < f <= end for f in fired)
    assert all(b - a == step for a, b in itertools.pairwise(fired))
    assert all((f - interval.EPOCH) % step == timedelta(0) for f in fired)
    assert all(f.tzinfo is UTC for f in fired)
    # Nothing on the grid is stepped over at either end.
    if not fired:
        assert schedule.next_after(start) > end
    else:
        assert fired[0] == schedule.next_after(start) and fired[0] - step <= start
        assert fired[-1] + step > end


@settings(max_examples=300, deadline=None)
@given(step=INTERVALS, first=MOMENTS, apart=SPANS, span=SPANS)
def test_two_leaders_starting_anywhere_compute_the_same_occurrences(step, first, apart, span):
    # What makes a failover safe: the occurrences depend on the interval alone, never on where
    # a process started counting, so the stretch both see holds the same instants (and keys).
    schedule = every(step)
    second = first + stretch(step, apart)
    end = second + stretch(step, span)

    a = [o for o in schedule.between(first, end) if o > second]
    b = schedule.between(second, end)

    assert a == b
    assert [cron.occurrence_key("t", o) for o in a] == [cron.occurrence_key("t", o) for o in b]


@settings(max_examples=200, deadline=None)
@given(step=INTERVALS, start=MOMENTS, span=SPANS, grace=st.integers(0, 3600),
       split=st.integers(1, 6), misfire=st.sampled_from(cron.MISFIRE_POLICIES))
def test_rounds_at_any_moments_fire_each_occurrence_at_most_once_and_never_outside(
        step, start, span, grace, split, misfire):
    schedule = every(step)
    end = start + stretch(step, span)
    watermark, fired = start, []
    for i in range(1, split + 1):
        now = start + (end - start) * i / split
        result = cron.due(schedule, watermark=watermark, now=now, misfire=misfire,
                          grace=timedelta(seconds=grace), max_catchup=1000)
        assert all(watermark < f <= now for f in result.fire)
        fired += result.fire
        watermark = now

    assert all(b > a for a, b in itertools.pairwise(fired))
    if misfire == "all":
        assert fired == schedule.between(start, end)
