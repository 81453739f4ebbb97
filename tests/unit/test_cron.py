"""Cron occurrences, misfire policies and DST (scheduler/cron.py). No database."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from django_xjobs.exceptions import ConfigurationError
from django_xjobs.scheduler import cron

PARIS = ZoneInfo("Europe/Paris")
NEW_YORK = ZoneInfo("America/New_York")
NO_GRACE = timedelta(0)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def paris(*args: int, fold: int = 0) -> datetime:
    return datetime(*args, tzinfo=PARIS, fold=fold)


def due(expression: str, *, watermark: datetime, now: datetime, misfire: str = "latest",
        grace: timedelta = NO_GRACE, max_catchup: int = 100, timezone: str = "UTC"):
    return cron.due(cron.parse(expression, timezone), watermark=watermark, now=now,
                    misfire=misfire, grace=grace, max_catchup=max_catchup)


# ---------------------------------------------------------------------------------- parsing --


def test_five_fields_are_minutes_and_six_fields_put_seconds_first():
    minutes = cron.parse("*/15 * * * *")
    seconds = cron.parse("*/15 * * * * *")

    assert not minutes.seconds and seconds.seconds
    assert minutes.between(utc(2026, 1, 1), utc(2026, 1, 1, 0, 45)) == [
        utc(2026, 1, 1, 0, 15), utc(2026, 1, 1, 0, 30), utc(2026, 1, 1, 0, 45)]
    assert seconds.between(utc(2026, 1, 1), utc(2026, 1, 1, 0, 0, 45)) == [
        utc(2026, 1, 1, 0, 0, 15), utc(2026, 1, 1, 0, 0, 30), utc(2026, 1, 1, 0, 0, 45)]


def test_a_six_field_expression_reads_its_first_field_as_seconds_not_its_last():
    # "30 0 12 * * *": second 30 of 00:12? No: second 30, minute 0, hour 12.
    schedule = cron.parse("30 0 12 * * *")
    assert schedule.next_after(utc(2026, 1, 1)) == utc(2026, 1, 1, 12, 0, 30)


def test_aliases_and_extra_whitespace_are_accepted():
    assert cron.parse("@hourly").next_after(utc(2026, 1, 1, 0, 10)) == utc(2026, 1, 1, 1)
    assert cron.parse("  0   3 * *  * ").expression == "0 3 * * *"


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        ("", "expected a cron expression"),
        ("   ", "expected a cron expression"),
        (None, "expected a cron expression"),
        (15, "expected a cron expression"),
        ("* * * *", "has 4 fields"),
        ("* * * * * * *", "has 7 fields"),
        ("61 * * * *", "not a valid cron expression"),
        ("* * * * * 8", "not a valid cron expression"),
        ("every day", "has 2 fields"),
        ("0 0 30 2 *", "never fires"),
    ],
)
def test_a_bad_expression_is_a_clear_configuration_error(expression, fragment):
    with pytest.raises(ConfigurationError, match=fragment):
        cron.parse(expression)


@pytest.mark.parametrize("zone", ["Mars/Olympus", "", "../etc/passwd", None, 3])
def test_an_unknown_timezone_is_a_clear_configuration_error(zone):
    with pytest.raises(ConfigurationError, match="timezone"):
        cron.parse("0 3 * * *", zone)


def test_a_misfire_policy_must_be_one_of_the_three():
    assert [cron.parse_misfire(p) for p in ("latest", "all", "skip")] == ["latest", "all", "skip"]
    with pytest.raises(ConfigurationError, match="latest, all, skip"):
        cron.parse_misfire("some")


def test_occurrences_are_in_the_tasks_timezone_and_returned_in_utc():
    schedule = cron.parse("0 3 * * *", "Europe/Paris")
    winter = schedule.next_after(utc(2026, 1, 10))
    summer = schedule.next_after(utc(2026, 7, 10))

    assert winter == utc(2026, 1, 10, 2) and winter.tzinfo is UTC  # 03:00 CET
    assert summer == utc(2026, 7, 10, 1)  # 03:00 CEST


def test_between_is_open_at_the_start_and_closed_at_the_end():
    schedule = cron.parse("* * * * *")
    start, end = utc(2026, 1, 1, 12), utc(2026, 1, 1, 12, 3)

    assert schedule.between(start, end) == [utc(2026, 1, 1, 12, 1), utc(2026, 1, 1, 12, 2), end]
    assert schedule.between(end, start) == []
    assert schedule.between(start, end, limit=2) == [utc(2026, 1, 1, 12, 1),
                                                     utc(2026, 1, 1, 12, 2)]


def test_the_occurrence_key_names_the_instant_in_utc_whatever_the_timezone():
    instant = paris(2026, 3, 29, 3, 0)
    assert cron.occurrence_key("nightly", instant) == "cron:nightly:2026-03-29T01:00:00+00:00"
    assert cron.occurrence_key("nightly", instant) == cron.occurrence_key(
        "nightly", instant.astimezone(NEW_YORK))


# ---------------------------------------------------------------------------------- misfire --

# A per-minute task down for three minutes: the watermark is 12:00:40, the round runs at
# 12:03:40, and 12:01, 12:02, 12:03 were missed (40 s ago at least, more than the grace).
WATERMARK, NOW = utc(2026, 1, 1, 12, 0, 40), utc(2026, 1, 1, 12, 3, 40)
MISSED = [utc(2026, 1, 1, 12, 1), utc(2026, 1, 1, 12, 2), utc(2026, 1, 1, 12, 3)]


def test_after_a_downtime_latest_fires_the_most_recent_missed_occurrence_only():
    result = due("* * * * *", watermark=WATERMARK, now=NOW, misfire="latest",
                 grace=timedelta(seconds=10))
    assert result.fire == (MISSED[-1],)
    assert result.late == 1 and result.dropped


def test_after_a_downtime_all_fires_every_missed_occurrence_in_order():
    result = due("* * * * *", watermark=WATERMARK, now=NOW, misfire="all",
                 grace=timedelta(seconds=10))
    assert list(result.fire) == MISSED
    assert result.late == 3 and not result.dropped


def test_after_a_downtime_skip_fires_none_of_the_missed_occurrences():
    result = due("* * * * *", watermark=WATERMARK, now=NOW, misfire="skip",
                 grace=timedelta(seconds=10))
    assert result.fire == ()
    assert result.dropped


@pytest.mark.parametrize("misfire", ["latest", "all", "skip"])
def test_occurrences_within_the_grace_are_on_time_and_fire_under_every_policy(misfire):
    # A round 50 s late (a leader handover) with a 60 s grace: nothing was missed.
    result = due("*/10 * * * * *", watermark=utc(2026, 1, 1, 12), misfire=misfire,
                 now=utc(2026, 1, 1, 12, 0, 50), grace=timedelta(seconds=60))
    assert len(result.fire) == 5
    assert result.late == 0 and not result.dropped


def test_latest_adds_no_catch_up_run_when_an_on_time_occurrence_fires_anyway():
    result = due("* * * * * *", watermark=utc(2026, 1, 1, 12), misfire="latest",
                 now=utc(2026, 1, 1, 12, 0, 30), grace=timedelta(seconds=3))
    # The grace is inclusive: 12:00:27 is exactly 3 s before now, and on time.
    assert list(result.fire) == [utc(2026, 1, 1, 12, 0, s) for s in (27, 28, 29, 30)]
    assert result.dropped


def test_all_with_on_time_occurrences_fires_the_missed_ones_first():
    result = due("* * * * * *", watermark=utc(2026, 1, 1, 12), misfire="all",
                 now=utc(2026, 1, 1, 12, 0, 6), grace=timedelta(seconds=2))
    assert list(result.fire) == [utc(2026, 1, 1, 12, 0, s) for s in range(1, 7)]
    assert result.late == 3  # 12:00:01-03; 04-06 are within the 2 s grace


def test_all_is_bounded_by_max_catchup_keeping_the_most_recent():
    result = due("* * * * *", watermark=utc(2026, 1, 1), now=utc(2026, 1, 2), misfire="all",
                 max_catchup=5)
    # 00:00 itself is on time (no grace, and it is now); the five before it are the catch-up.
    assert list(result.fire) == [utc(2026, 1, 1, 23, m) for m in range(55, 60)] + [
        utc(2026, 1, 2)]
    assert result.late == 5 and result.dropped


def test_a_year_of_downtime_on_a_seconds_schedule_is_computed_without_walking_it():
    # Only the occurrences that fire are visited: a walk over 31 million seconds would not
    # finish inside this test's lifetime.
    result = due("* * * * * *", watermark=utc(2025, 1, 1), now=utc(2026, 1, 1, 0, 0, 0, 500000),
                 misfire="latest", grace=NO_GRACE)
    assert result.fire == (utc(2026, 1, 1),)


def test_nothing_is_due_when_the_watermark_is_at_or_after_now():
    assert due("* * * * * *", watermark=NOW, now=NOW).fire == ()
    assert due("* * * * * *", watermark=NOW + timedelta(hours=1), now=NOW).fire == ()


def test_an_occurrence_exactly_at_the_watermark_was_handled_and_one_at_now_is_due():
    result = due("* * * * *", watermark=utc(2026, 1, 1, 12, 1), now=utc(2026, 1, 1, 12, 2),
                 grace=timedelta(seconds=30))
    assert result.fire == (utc(2026, 1, 1, 12, 2),)


def test_an_occurrence_exactly_the_grace_before_now_is_on_time_and_one_before_it_late():
    # cutoff = now - grace = 12:01:00 exactly: 12:01 and 12:02 are on time, 12:00 is late.
    result = due("* * * * *", watermark=utc(2026, 1, 1, 11, 59, 30), now=utc(2026, 1, 1, 12, 2),
                 misfire="all", grace=timedelta(minutes=1))
    assert list(result.fire) == [utc(2026, 1, 1, 12, m) for m in (0, 1, 2)]
    assert result.late == 1
    skipped = due("* * * * *", watermark=utc(2026, 1, 1, 11, 59, 30),
                  now=utc(2026, 1, 1, 12, 2), misfire="skip", grace=timedelta(minutes=1))
    assert list(skipped.fire) == [utc(2026, 1, 1, 12, 1), utc(2026, 1, 1, 12, 2)]


def test_with_no_grace_an_occurrence_at_now_is_on_time():
    result = due("* * * * *", watermark=utc(2026, 1, 1, 12, 1), now=utc(2026, 1, 1, 12, 2),
                 misfire="skip", grace=NO_GRACE)
    assert result.fire == (utc(2026, 1, 1, 12, 2),) and not result.dropped


# -------------------------------------------------------------------------------------- DST --


def test_spring_forward_an_occurrence_in_the_missing_hour_fires_once_after_the_gap():
    # Europe/Paris, 2026-03-29: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist that day.
    schedule = cron.parse("30 2 * * *", "Europe/Paris")
    fired = schedule.between(paris(2026, 3, 28, 12), paris(2026, 3, 30, 12))

    assert fired == [paris(2026, 3, 29, 3, 0), paris(2026, 3, 30, 2, 30)]


def test_spring_forward_a_frequent_schedule_keeps_real_time_spacing_across_the_gap():
    schedule = cron.parse("*/20 * * * *", "Europe/Paris")
    fired = schedule.between(paris(2026, 3, 29, 1, 30), paris(2026, 3, 29, 3, 30))

    assert fired == [paris(2026, 3, 29, 1, 40), paris(2026, 3, 29, 3, 0),
                     paris(2026, 3, 29, 3, 20)]
    assert fired[1] - fired[0] == timedelta(minutes=20)


def test_fall_back_a_frequent_schedule_fires_through_both_passes_of_the_repeated_hour():
    # 2026-10-25: 03:00 CEST falls back to 02:00 CET; 02:00-03:00 happens twice.
    schedule = cron.parse("*/20 * * * *", "Europe/Paris")
    fired = schedule.between(paris(2026, 10, 25, 1, 50), paris(2026, 10, 25, 3, 10))

    assert [f.astimezone(PARIS).strftime("%H:%M%z") for f in fired] == [
        "02:00+0200", "02:20+0200", "02:40+0200",
        "02:00+0100", "02:20+0100", "02:40+0100", "03:00+0100",
    ]
    assert all(b - a == timedelta(minutes=20) for a, b in itertools.pairwise(fired))


def test_fall_back_a_fixed_time_in_the_repeated_hour_fires_on_both_passes():
    # Documented (docs/scheduling.md): two instants, two keys. Pin croniter's behaviour.
    schedule = cron.parse("30 2 * * *", "Europe/Paris")
    fired = schedule.between(paris(2026, 10, 24, 12), paris(2026, 10, 26, 12))

    # In UTC: an ambiguous local time never compares equal across zones (PEP 495).
    assert fired == [utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 1, 30),
                     utc(2026, 10, 26, 1, 30)]
    assert fired[1] == paris(2026, 10, 25, 2, 30, fold=1).astimezone(UTC)
    assert len({cron.occurrence_key("t", f) for f in fired}) == 3


def test_a_downtime_across_spring_forward_fires_the_latest_local_occurrence_once():
    # Down from Saturday noon to Monday 04:00 Paris time; daily 02:30, misfire latest.
    result = due("30 2 * * *", timezone="Europe/Paris", misfire="latest",
                 watermark=paris(2026, 3, 28, 12), now=paris(2026, 3, 30, 4))
    assert result.fire == (paris(2026, 3, 30, 2, 30),)
    result = due("30 2 * * *", timezone="Europe/Paris", misfire="all",
                 watermark=paris(2026, 3, 28, 12), now=paris(2026, 3, 30, 4))
    assert result.fire == (paris(2026, 3, 29, 3, 0), paris(2026, 3, 30, 2, 30))


def test_new_york_spring_forward_and_fall_back_follow_the_same_rules():
    # 2026-03-08 02:00 EST jumps to 03:00 EDT; 2026-11-01 02:00 EDT falls back to 01:00 EST.
    spring = cron.parse("30 2 * * *", "America/New_York").between(
        datetime(2026, 3, 7, 12, tzinfo=NEW_YORK), datetime(2026, 3, 9, 12, tzinfo=NEW_YORK))
    fall = cron.parse("30 1 * * *", "America/New_York").between(
        datetime(2026, 10, 31, 12, tzinfo=NEW_YORK), datetime(2026, 11, 2, 12, tzinfo=NEW_YORK))

    assert [s.astimezone(NEW_YORK).strftime("%d %H:%M%z") for s in spring] == [
        "08 03:00-0400", "09 02:30-0400"]
    assert [f.astimezone(NEW_YORK).strftime("%d %H:%M%z") for f in fall] == [
        "01 01:30-0400", "01 01:30-0500", "02 01:30-0500"]


# ------------------------------------------------------------------------------- properties --

EXPRESSIONS = ["* * * * *", "*/7 * * * *", "0 * * * *", "30 2 * * *", "15 1-3 * * *",
               "*/13 * * * * *", "0 0 * * 1", "0 30 2 * * *", "@hourly", "5,35 */2 * * *"]
ZONES = ["UTC", "Europe/Paris", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"]
# Around the 2026 transitions of those zones, where bugs live.
STARTS = st.sampled_from([utc(2026, 3, 8, 5), utc(2026, 3, 28, 22), utc(2026, 4, 4, 13),
                          utc(2026, 10, 3, 14), utc(2026, 10, 24, 22), utc(2026, 10, 31, 4),
                          utc(2026, 6, 1)])


@settings(max_examples=150, deadline=None)
@given(expression=st.sampled_from(EXPRESSIONS), zone=st.sampled_from(ZONES), start=STARTS,
       offset=st.integers(0, 6 * 3600), span=st.integers(1, 8 * 3600))
def test_occurrences_are_strictly_increasing_instants(expression, zone, start, offset, span):
    schedule = cron.parse(expression, zone)
    begin = start + timedelta(seconds=offset)
    fired = schedule.between(begin, begin + timedelta(seconds=span), limit=2000)

    assert all(f.tzinfo is UTC for f in fired)
    assert all(b > a for a, b in itertools.pairwise(fired))
    assert all(begin < f <= begin + timedelta(seconds=span) for f in fired)


@settings(max_examples=200, deadline=None)
@given(expression=st.sampled_from(EXPRESSIONS), zone=st.sampled_from(ZONES), start=STARTS,
       offset=st.integers(0, 6 * 3600), span=st.integers(1, 6 * 3600),
       grace=st.integers(0, 3600), split=st.integers(1, 5),
       misfire=st.sampled_from(cron.MISFIRE_POLICIES))
def test_rounds_at_any_moments_fire_each_occurrence_at_most_once_and_never_outside(
        expression, zone, start, offset, span, grace, split, misfire):
    # Cutting (watermark, end] into rounds: whatever each round fires lies in its own stretch,
    # so nothing ever fires twice, nor before the watermark, nor in the future.
    schedule = cron.parse(expression, zone)
    begin = start + timedelta(seconds=offset)
    end = begin + timedelta(seconds=span)
    watermark, fired = begin, []
    for i in range(1, split + 1):
        now = begin + (end - begin) * i / split
        result = cron.due(schedule, watermark=watermark, now=now, misfire=misfire,
                          grace=timedelta(seconds=grace), max_catchup=10_000)
        assert all(watermark < f <= now for f in result.fire)
        fired += result.fire
        watermark = now

    assert all(b > a for a, b in itertools.pairwise(fired))
    if misfire == "all" and zone != "Australia/Lord_Howe":
        # With every missed occurrence fired, rounds fire exactly what one walk over the whole
        # stretch finds. (Not at Lord Howe's half-hour shift: there croniter's walk depends on
        # where it starts, so rounds may find occurrences of the repeated half hour a single
        # walk steps over. They still fire once each, inside their stretch, as checked above.)
        assert fired == schedule.between(begin, end, limit=10_000)


def test_at_lord_howes_half_hour_fall_back_nothing_fires_after_now():
    # The case that pinned due() to forward walks: croniter's backward walk from after the
    # transition returns occurrences of the repeated half hour later than `now`.
    schedule = cron.parse("*/7 * * * *", "Australia/Lord_Howe")
    now = utc(2026, 4, 4, 14, 56, 1)
    result = cron.due(schedule, watermark=utc(2026, 4, 4, 13), now=now, misfire="all",
                      grace=NO_GRACE, max_catchup=10_000)

    assert result.fire[-1] == utc(2026, 4, 4, 14, 56) and len(result.fire) == 17
