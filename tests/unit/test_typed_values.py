"""Typed values in stored JSON (docs/guide.md, "Values: a job's input and result"), without
a database: ``values.encode_json`` / ``values.decode_json``, the stored form, the reserved key,
what is still refused, key templates, the ``django.tasks`` normalisation, ``make_context``.

The same values through PostgreSQL and every enqueue path: tests/integration/test_typed_values.py.
"""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, time, timedelta, timezone, tzinfo
from decimal import Decimal
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from django_xjobs import Concurrency, RateLimit, values
from django_xjobs.exceptions import InvalidConcurrencyKey, InvalidJobInput, InvalidRateKey
from django_xjobs.management.cli import jsonable
from django_xjobs.records import decode_stored_json
from django_xjobs.testing import make_context

PARIS = ZoneInfo("Europe/Paris")
ID = UUID("0b6c6e62-3f0e-4bb3-9c2a-5d1f6c0e7a11")


def encode(value: Any) -> str:
    return values.encode_json(value, what="input", limit=None)


def round_trip(value: Any) -> Any:
    return values.decode_json(encode(value))


def zone_of(tz: tzinfo | None) -> Any:
    if tz is None:
        return None
    if isinstance(tz, ZoneInfo):
        return ("zone", tz.key)
    return ("offset", tz.utcoffset(None))


def exactly(a: Any, b: Any) -> bool:
    """Same type and same value, down to what ``==`` ignores: a Decimal's digits and exponent
    (and NaN), a datetime's or a time's fold and zone."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(exactly(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(exactly(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Decimal):
        return a.as_tuple() == b.as_tuple()
    if isinstance(a, datetime | time):
        return (a.replace(tzinfo=None), a.fold, a.utcoffset(), zone_of(a.tzinfo)) == (
            b.replace(tzinfo=None), b.fold, b.utcoffset(), zone_of(b.tzinfo))
    return a == b


# ------------------------------------------------------------------------- the round trip --

offsets = st.builds(
    lambda minutes, seconds: timezone(timedelta(minutes=minutes, seconds=seconds)),
    st.integers(-1439, 1439), st.sampled_from([0, 0, 0, 15]))
zones = st.none() | st.just(UTC) | offsets | st.timezones()
folds = st.sampled_from([0, 1])
datetimes = st.builds(lambda d, fold: d.replace(fold=fold), st.datetimes(timezones=zones), folds)
times = st.builds(lambda t, fold: t.replace(fold=fold), st.times(timezones=zones), folds)
typed = (datetimes | st.dates() | times | st.uuids()
         | st.decimals(allow_nan=True, allow_infinity=True) | st.decimals(places=2))
text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=8)
plain = (st.none() | st.booleans() | st.integers()
         | st.floats(allow_nan=False, allow_infinity=False) | text)
keys = text.filter(lambda k: k != values.TYPED_KEY)
nested = st.recursive(typed | plain, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(keys, inner, max_size=4), max_leaves=12)


@hsettings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nested)
def test_typed_values_nested_anywhere_come_back_exactly(value):
    text = encode(value)
    assert exactly(values.decode_json(text), value)
    # As jsonb gives it back: spaces after ':' and ',', keys in its own order.
    assert exactly(values.decode_json(json.dumps(json.loads(text), sort_keys=True)), value)


@hsettings(max_examples=200, deadline=None)
@given(st.dictionaries(keys, plain | st.lists(plain, max_size=3), max_size=6))
def test_a_plain_value_is_stored_as_before_and_decoded_without_the_hook(value):
    text = encode(value)
    assert text == json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    # No mark in the text: decode_json is plain json.loads, no object hook on its dicts.
    assert '"$xjobs"' not in text
    assert values.decode_json(text) == value


# ---------------------------------------------------------------------- the stored form --


@pytest.mark.parametrize(("value", "stored"), [
    (datetime(2024, 5, 1, 12, 0, 0, 250000),
     {"$xjobs": "datetime", "value": "2024-05-01T12:00:00.250000"}),
    (datetime(2024, 5, 1, 12, tzinfo=timezone(timedelta(hours=-5))),
     {"$xjobs": "datetime", "value": "2024-05-01T12:00:00-05:00"}),
    (datetime(2024, 5, 1, 12, tzinfo=PARIS),
     {"$xjobs": "datetime", "value": "2024-05-01T12:00:00+02:00", "zone": "Europe/Paris"}),
    (datetime(2024, 10, 27, 2, 30, fold=1, tzinfo=PARIS),
     {"$xjobs": "datetime", "value": "2024-10-27T02:30:00+01:00", "zone": "Europe/Paris",
      "fold": 1}),
    (date(2024, 5, 1), {"$xjobs": "date", "value": "2024-05-01"}),
    (time(9, 30), {"$xjobs": "time", "value": "09:30:00"}),
    (time(9, 30, tzinfo=UTC), {"$xjobs": "time", "value": "09:30:00+00:00"}),
    (time(9, 30, tzinfo=PARIS), {"$xjobs": "time", "value": "09:30:00", "zone": "Europe/Paris"}),
    (ID, {"$xjobs": "uuid", "value": "0b6c6e62-3f0e-4bb3-9c2a-5d1f6c0e7a11"}),
    (Decimal("1.10"), {"$xjobs": "decimal", "value": "1.10"}),
    (Decimal("-0"), {"$xjobs": "decimal", "value": "-0"}),
    (Decimal("1E+2"), {"$xjobs": "decimal", "value": "1E+2"}),
    (Decimal("NaN"), {"$xjobs": "decimal", "value": "NaN"}),
])
def test_the_stored_form_is_a_tagged_object_sql_can_read(value, stored):
    assert json.loads(encode({"v": value})) == {"v": stored}
    assert exactly(round_trip({"v": value}), {"v": value})


def test_a_typed_value_may_be_the_whole_value_a_result_for_instance():
    assert encode(Decimal("2.50")) == '{"$xjobs":"decimal","value":"2.50"}'
    assert exactly(round_trip(Decimal("2.50")), Decimal("2.50"))
    assert exactly(round_trip([date(2024, 1, 1), None]), [date(2024, 1, 1), None])


def test_decimal_keeps_its_digits_and_exponent():
    for text in ["1.10", "1.1", "0.000", "1E+2", "-0.0", "123456789012345678901234567890.123456789",
                 "Infinity", "-Infinity", "sNaN"]:
        back = round_trip(Decimal(text))
        assert str(back) == text and back.as_tuple() == Decimal(text).as_tuple()


# ------------------------------------------------------------ what "exact" means for a zone --


def test_a_fixed_offset_comes_back_as_that_offset_and_utc_as_utc():
    for tz in (timezone(timedelta(hours=5, minutes=45)), timezone(timedelta(hours=-3, seconds=7))):
        back = round_trip(datetime(2024, 5, 1, 12, tzinfo=tz))
        assert back.tzinfo == tz and back.utcoffset() == tz.utcoffset(None)
        assert back.replace(tzinfo=None) == datetime(2024, 5, 1, 12)
    assert round_trip(datetime(2024, 5, 1, tzinfo=UTC)).tzinfo is UTC


def test_a_zoneinfo_zone_comes_back_as_the_same_zone_with_its_wall_time_and_fold():
    for fold in (0, 1):  # 02:30 happens twice in Paris that night
        value = datetime(2024, 10, 27, 2, 30, fold=fold, tzinfo=PARIS)
        back = round_trip(value)
        assert back.tzinfo is PARIS and back.fold == fold
        assert back.utcoffset() == value.utcoffset() == timedelta(hours=2 - fold)
    # A wall time that does not exist (the clocks jump from 02:00 to 03:00) stays as written.
    gap = datetime(2024, 3, 31, 2, 30, tzinfo=PARIS)
    assert exactly(round_trip(gap), gap)


def test_a_time_in_a_zone_keeps_the_zone():
    back = round_trip(time(9, 30, tzinfo=PARIS))
    assert back.tzinfo is PARIS and back == time(9, 30, tzinfo=PARIS)


def test_another_tzinfo_comes_back_as_a_fixed_offset_at_the_same_instant():
    class Plus3(tzinfo):
        def utcoffset(self, dt):
            return timedelta(hours=3)

        def dst(self, dt):
            return timedelta(0)

    value = datetime(2024, 5, 1, 12, tzinfo=Plus3())
    back = round_trip(value)
    assert back == value and back.tzinfo == timezone(timedelta(hours=3))


def test_a_subclass_comes_back_as_its_base_class():
    class MyDate(date):
        pass

    class MyDecimal(Decimal):
        def __str__(self):
            return "not the digits"

    assert exactly(round_trip(MyDate(2024, 1, 2)), date(2024, 1, 2))
    assert exactly(round_trip(MyDecimal("3.30")), Decimal("3.30"))


# ------------------------------------------------------------------- the reserved key --


@pytest.mark.parametrize(("value", "path"), [
    ({"$xjobs": "mine"}, "input"),
    ({"meta": {"$xjobs": 1, "other": 2}}, "input['meta']"),
    ({"rows": [{"ok": 1}, {"$xjobs": "decimal", "value": "1"}]}, "input['rows'][1]"),
])
def test_a_dict_with_the_reserved_key_is_refused_naming_where(value, path):
    with pytest.raises(InvalidJobInput) as info:
        encode(value)
    message = str(info.value)
    assert f"{path} has the key '$xjobs'" in message and "reserves" in message


def test_the_reserved_word_elsewhere_is_ordinary_data():
    value = {"note": "$xjobs", "$xjobs_id": 1, "quoted": '"$xjobs"', "list": ["$xjobs"]}
    text = encode(value)
    assert values.decode_json(text) == value


@pytest.mark.parametrize("text", [
    '{"$xjobs": "timedelta", "value": "P1D"}',  # a type this release does not know
    '{"$xjobs": "date", "value": "yesterday"}',
    '{"$xjobs": "decimal", "value": "one"}',
    '{"$xjobs": "uuid", "value": "not-a-uuid"}',
    '{"$xjobs": "date", "value": "2024-01-01", "zone": "UTC"}',  # a zone on a date
    '{"$xjobs": "datetime", "value": "2024-01-01T00:00:00", "zone": "Nowhere/Atlantis"}',
    '{"$xjobs": "datetime", "value": "2024-01-01T00:00:00", "fold": 2}',
    '{"$xjobs": "decimal", "value": 1.5}',
    '{"$xjobs": "decimal", "value": "1.5", "extra": true}',
])
def test_a_marked_object_that_is_not_a_typed_value_cannot_be_decoded(text):
    with pytest.raises(ValueError, match="typed value"):
        values.decode_json(text)
    # As the engine reads a row: the job is reported undecodable, never handed a dict.
    value, problem = decode_stored_json(text, values.decode_json)
    assert value is None and "typed value" in problem


def test_the_console_reads_the_stored_form():
    text = encode({"at": date(2024, 1, 2)})
    assert decode_stored_json(text) == ({"at": {"$xjobs": "date", "value": "2024-01-02"}}, None)


# ------------------------------------------------------------------ still refused, clearly --


@pytest.mark.parametrize(("value", "type_name"), [
    ({1, 2}, "set"), (b"x", "bytes"), (object(), "object"), (timedelta(1), "timedelta"),
    (3j, "complex"), (frozenset(), "frozenset"), (PARIS, "ZoneInfo"),
])
def test_what_is_refused_is_named_with_what_is_accepted(value, type_name):
    with pytest.raises(InvalidJobInput) as info:
        encode({"x": [value]})
    message = str(info.value)
    assert f"input['x'][0] is a {type_name}" in message
    assert ("a value may be a dict (string keys), list, tuple, str, int, float, bool, None, "
            "datetime, date, time, uuid.UUID or decimal.Decimal") in message


# -------------------------------------------------------------------------- key templates --


@pytest.mark.parametrize(("value", "key"), [
    (ID, "acct:0b6c6e62-3f0e-4bb3-9c2a-5d1f6c0e7a11"),
    (Decimal("1.10"), "acct:1.10"),
    (date(2024, 5, 1), "acct:2024-05-01"),
    (datetime(2024, 5, 1, 12, tzinfo=UTC), "acct:2024-05-01 12:00:00+00:00"),
    (time(9, 30), "acct:09:30:00"),
])
def test_key_templates_format_typed_values_with_str(value, key):
    assert Concurrency(key="acct:{account}", limit=1).format({"account": value}) == key
    limit = RateLimit(key="acct:{account}", limit=5, period=timedelta(seconds=1))
    assert limit.format({"account": value}) == key


def test_key_templates_still_refuse_what_they_cannot_write():
    with pytest.raises(InvalidConcurrencyKey, match="UUID or Decimal, got set"):
        Concurrency(key="acct:{account}", limit=1).format({"account": {1}})
    limit = RateLimit(key="acct:{account}", limit=5, period=timedelta(seconds=1))
    with pytest.raises(InvalidRateKey, match="UUID or Decimal, got list"):
        limit.format({"account": [ID]})


# --------------------------------------------------------- steps and events in memory --


def test_a_step_output_and_an_event_payload_come_back_typed_in_make_context():
    payload = {"paid_at": datetime(2024, 5, 1, 12, tzinfo=PARIS), "amount": Decimal("9.90")}
    ctx = make_context(events={"order.paid": payload})
    first = ctx.step.run("total", lambda: {"total": Decimal("19.90"), "id": ID})
    assert exactly(first, {"total": Decimal("19.90"), "id": ID})
    got = ctx.step.wait_for_event("paid", event="order.paid", timeout=60)
    assert exactly(got, payload)
    # The next run replays the stored output.
    again = make_context(previous=ctx)
    assert exactly(again.step.run("total", lambda: None), {"total": Decimal("19.90"), "id": ID})


def test_the_command_line_json_writes_typed_values_as_text():
    assert jsonable(Decimal("1.10")) == "1.10"
    assert jsonable(date(2024, 1, 2)) == "2024-01-02"
    assert jsonable(time(9, 30)) == "09:30:00"
    assert jsonable(ID) == str(ID)


# ------------------------------------------------------------- the django.tasks backend --


def test_the_task_normalisation_keeps_typed_values_and_is_django_s_otherwise():
    pytest.importorskip("django.tasks", reason="django.tasks needs Django 6.0+")
    from django.utils.json import normalize_json

    from django_xjobs.tasks.mapping import normalize

    plain = {"t": (1, [2, (3,)]), "b": b"text", "n": None, "f": 1.5, "ok": True}
    assert normalize(plain) == normalize_json(plain)
    value = [(Decimal("1.10"), ID), {"at": date(2024, 1, 2)}]
    assert exactly(normalize(value), [[Decimal("1.10"), ID], {"at": date(2024, 1, 2)}])
    with pytest.raises(TypeError, match=r"Unsupported type.*datetime, date, time, uuid\.UUID"):
        normalize([{1, 2}])


def test_a_task_result_holds_typed_arguments_which_django_s_own_would_refuse():
    pytest.importorskip("django.tasks", reason="django.tasks needs Django 6.0+")
    from django.tasks import TaskResultStatus

    from django_xjobs.tasks.mapping import replace_result, task_result
    from tests.testapp import tasks as t

    result = task_result(
        task=t.add, id="r", status=TaskResultStatus.READY, enqueued_at=None, started_at=None,
        last_attempted_at=None, finished_at=None, args=[Decimal("1.10")],
        kwargs={"at": date(2024, 1, 2)}, backend="default", errors=[], worker_ids=[])
    assert exactly(result.args, [Decimal("1.10")])
    done = replace_result(result, status=TaskResultStatus.SUCCESSFUL)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert exactly(done.kwargs, {"at": date(2024, 1, 2)}) and exactly(done.args, result.args)
