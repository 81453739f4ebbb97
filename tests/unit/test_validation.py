"""Enqueue validation without a database: ``api.build_params`` and ``api.encode_json``.

Bad input must raise :class:`InvalidJobInput` (naming what is wrong and where) before any
statement is built; these tests never touch the database, which proves that much.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from uuid import UUID

import pytest
from django.conf import settings
from django.test import override_settings
from hypothesis import HealthCheck, example, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from django_xjobs import api, registry, values
from django_xjobs.exceptions import InvalidJobInput, PayloadTooLarge
from django_xjobs.values import TYPED_KEY
from tests.testapp import jobs as testapp_jobs

RECORD = testapp_jobs.record
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def build(input, **options):
    return api.build_params(RECORD, input, options)


def limited(limit: int):
    return override_settings(XJOBS={**settings.XJOBS, "MAX_PAYLOAD_BYTES": limit})


# ---------------------------------------------------------------------------- happy path --


def test_a_valid_enqueue_becomes_params_with_the_definitions_defaults():
    p = build({"tag": "a", "n": [1, 2.5, None, True], "d": {"x": "é"}})
    assert json.loads(p.input_json) == {"tag": "a", "n": [1, 2.5, None, True], "d": {"x": "é"}}
    assert p.name == "testapp.record"
    assert p.queue == "default"
    assert p.max_attempts == 3  # XJOBS has no MAX_ATTEMPTS: the documented default
    assert p.priority == 0
    assert (p.run_at, p.delay_ms, p.idempotency_key, p.tenant_id) == (None, 0, None, None)
    assert isinstance(p.id, UUID) and isinstance(p.run_id, UUID) and p.id != p.run_id


def test_the_json_is_compact_and_keeps_non_ascii_text():
    p = build({"name": "Zoë", "list": [1, 2]})
    assert p.input_json == '{"name":"Zoë","list":[1,2]}'


def test_no_input_is_an_empty_object():
    assert build(None).input_json == "{}"
    assert build({}).input_json == "{}"


def test_options_are_carried_into_the_params():
    run_at = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    p = build({}, idempotency_key="k:1", tenant_id="acme", priority=-5, queue="emails",
              max_attempts=9, enqueued_by="me", traceparent=TRACEPARENT, run_at=run_at)
    assert (p.idempotency_key, p.tenant_id, p.priority, p.queue) == ("k:1", "acme", -5, "emails")
    assert (p.max_attempts, p.enqueued_by, p.traceparent) == (9, "me", TRACEPARENT)
    assert p.run_at == run_at


@pytest.mark.parametrize(
    ("delay", "ms"), [(timedelta(seconds=1.5), 1500), (2, 2000), (0.25, 250), (0, 0)]
)
def test_a_delay_becomes_milliseconds(delay, ms):
    assert build({}, delay=delay).delay_ms == ms


def test_an_aware_run_at_in_any_zone_is_accepted():
    run_at = datetime(2030, 1, 1, 12, tzinfo=timezone(timedelta(hours=5)))
    assert build({}, run_at=run_at).run_at == run_at


def test_ids_are_fresh_for_every_enqueue():
    ids = {build({}).id for _ in range(50)}
    assert len(ids) == 50


# ------------------------------------------------------------------------ non-JSON input --


@pytest.mark.parametrize(
    ("input", "path", "type_name"),
    [
        ({"every": timedelta(days=1)}, "['every']", "timedelta"),
        ({"tags": {"a", "b"}}, "['tags']", "set"),
        ({"blob": b"\x00\x01"}, "['blob']", "bytes"),
        ({"thing": object()}, "['thing']", "object"),
        ({"a": {"b": [1, 2, 3j]}}, "['a']['b'][2]", "complex"),
        ({"rows": [{"ok": 1}, {"id": frozenset()}]}, "['rows'][1]['id']", "frozenset"),
    ],
)
def test_non_json_input_is_refused_naming_the_field(input, path, type_name):
    with pytest.raises(InvalidJobInput) as info:
        build(input)
    message = str(info.value)
    assert "testapp.record" in message
    assert path in message
    assert type_name in message
    assert "not JSON-serialisable" in message
    assert "datetime, date, time, uuid.UUID or decimal.Decimal" in message  # what IS accepted


def test_typed_values_are_accepted_where_json_is():
    # The round trip itself: tests/unit/test_typed_values.py.
    p = build({"when": datetime(2024, 1, 1, tzinfo=UTC), "amount": Decimal("1.50"),
               "rows": [{"id": UUID(int=1)}]})
    assert values.decode_json(p.input_json)["amount"] == Decimal("1.50")


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_nan_and_infinity_are_refused(value):
    with pytest.raises(InvalidJobInput, match="NaN/Infinity") as info:
        build({"deep": [{"x": value}]})
    assert "['deep'][0]['x']" in str(info.value)


@pytest.mark.parametrize("input", [{"s": "a\x00b"}, {"a\x00": 1}, {"l": ["ok", "\x00"]}])
def test_a_nul_character_is_refused(input):
    with pytest.raises(InvalidJobInput, match="NUL"):
        build(input)


def test_a_literal_backslash_u0000_is_not_mistaken_for_nul():
    # Six ordinary characters (a backslash, then "u0000"), e.g. a Windows path or a regex. Their
    # JSON is "\\u0000", which PostgreSQL stores fine; only a real NUL (JSON \u0000) cannot be.
    text = "C:\\u0000\\file"
    assert "\x00" not in text
    p = build({"path": text})
    assert json.loads(p.input_json) == {"path": text}


@pytest.mark.parametrize("input", [{"s": "\ud800"}, {"s": ["x", "a\udfffb"]}, {"\udc00": 1}])
def test_a_lone_surrogate_is_refused(input):
    with pytest.raises(InvalidJobInput, match="surrogate"):
        build(input)


def test_a_circular_input_is_refused_clearly():
    loop: list = []
    loop.append(loop)
    with pytest.raises(InvalidJobInput):
        build({"loop": loop})


def test_a_non_string_key_is_refused_rather_than_silently_rewritten():
    # json.dumps turns the key 1 into "1": {1: "a", "1": "b"} would be stored as an object with
    # a duplicate key, and jsonb keeps only one of them: the job would receive different input
    # from what was enqueued, with no error anywhere.
    with pytest.raises(InvalidJobInput, match="key"):
        build({"m": {1: "a", "1": "b"}})


@pytest.mark.parametrize("input", [[1, 2], "x", 42, ("a", 1), {1, 2}])
def test_input_that_is_not_a_mapping_is_refused(input):
    with pytest.raises(InvalidJobInput, match="must be a dict") as info:
        build(input)
    assert type(input).__name__ in str(info.value)


# ---------------------------------------------------------------------------- payload size --


def test_a_payload_at_the_limit_is_accepted_and_one_byte_over_is_refused():
    with limited(100):
        # {"s":"..."} is 8 bytes of JSON around the value.
        assert len(build({"s": "x" * 92}).input_json.encode()) == 100
        with pytest.raises(PayloadTooLarge) as info:
            build({"s": "x" * 93})
    message = str(info.value)
    assert "101 bytes" in message
    assert "MAX_PAYLOAD_BYTES" in message
    assert "100" in message


def test_the_limit_counts_utf8_bytes_not_characters():
    with limited(100), pytest.raises(PayloadTooLarge):
        build({"s": "é" * 50})  # 58 characters, 108 bytes


def test_payload_too_large_is_a_kind_of_invalid_input():
    with limited(10), pytest.raises(InvalidJobInput):
        build({"s": "x" * 100})


def test_the_default_limit_is_one_mebibyte():
    build({"s": "x" * (1024 * 1024 - 8)})
    with pytest.raises(PayloadTooLarge):
        build({"s": "x" * (1024 * 1024 - 7)})


def test_encode_json_without_a_limit_takes_any_size():
    text = values.encode_json({"s": "x" * 2_000_000}, what="result", limit=None)
    assert len(text) > 2_000_000


def test_encode_json_names_what_it_encodes():
    with pytest.raises(InvalidJobInput, match=r"result of my\.job"):
        values.encode_json({"x": object()}, what="result of my.job", limit=None)


# ---------------------------------------------------------------------------- time options --


def test_a_naive_run_at_is_refused():
    with pytest.raises(InvalidJobInput, match="naive"):
        build({}, run_at=datetime(2030, 1, 1, 12, 0))


@pytest.mark.parametrize("run_at", ["2030-01-01T00:00:00Z", 1893456000, timedelta(days=1)])
def test_a_run_at_that_is_not_a_datetime_is_refused(run_at):
    with pytest.raises(InvalidJobInput, match="run_at"):
        build({}, run_at=run_at)


@pytest.mark.parametrize("delay", [-1, -0.001, timedelta(seconds=-1), math.nan, math.inf])
def test_a_negative_or_non_finite_delay_is_refused(delay):
    with pytest.raises(InvalidJobInput, match="delay"):
        build({}, delay=delay)


@pytest.mark.parametrize("delay", ["5s", True, object(), [1]])
def test_a_delay_of_the_wrong_type_is_refused(delay):
    with pytest.raises(InvalidJobInput, match="delay"):
        build({}, delay=delay)


@pytest.mark.parametrize("delay", [timedelta.max, 1e300])
def test_a_delay_past_any_representable_time_is_refused_before_reaching_the_database(delay):
    # now() + delay must be a PostgreSQL timestamp (and delay_ms a bigint); otherwise the
    # statement fails inside the caller's transaction and aborts it, the very thing
    # validation before sending exists to prevent.
    with pytest.raises(InvalidJobInput, match="delay"):
        build({}, delay=delay)


def test_delay_and_run_at_together_are_refused():
    with pytest.raises(InvalidJobInput, match="delay or run_at"):
        build({}, delay=5, run_at=datetime(2030, 1, 1, tzinfo=UTC))


# ---------------------------------------------------------------------------- other options --


@pytest.mark.parametrize("queue", ["bad queue", "", "q" * 201, "q/1", 5, None])
def test_a_bad_queue_name_is_refused(queue):
    with pytest.raises(InvalidJobInput, match="queue"):
        build({}, queue=queue)


@pytest.mark.parametrize(
    ("option", "value"),
    [("queue", "default\n"), ("traceparent", TRACEPARENT + "\n")],
)
def test_a_trailing_newline_does_not_slip_past_the_pattern(option, value):
    # Python's "$" also matches before a final newline, so ^...$ with re.match accepts
    # "default\n": the job is stored in a queue no worker of "default" ever claims.
    with pytest.raises(InvalidJobInput, match=option):
        build({}, **{option: value})


@pytest.mark.parametrize("key", [123, "", "k" * 1001, "a\x00b", b"bytes", ["k"]])
def test_a_bad_idempotency_key_is_refused(key):
    with pytest.raises(InvalidJobInput, match="idempotency_key"):
        build({}, idempotency_key=key)


def test_the_longest_idempotency_key_is_accepted():
    assert build({}, idempotency_key="k" * 1000).idempotency_key == "k" * 1000


@pytest.mark.parametrize("tenant", [5, "", "t" * 201, "a\x00", ["acme"]])
def test_a_bad_tenant_is_refused(tenant):
    with pytest.raises(InvalidJobInput, match="tenant_id"):
        build({}, tenant_id=tenant)


@pytest.mark.parametrize("option", ["idempotency_key", "tenant_id", "enqueued_by"])
def test_a_lone_surrogate_in_a_text_option_is_refused(option):
    # It cannot be encoded for the database: the driver would raise UnicodeEncodeError after
    # validation said yes, instead of a clear InvalidJobInput naming the option.
    with pytest.raises(InvalidJobInput, match=option):
        build({}, **{option: "k\ud800"})


@pytest.mark.parametrize(
    "options", [{"retries": 3}, {"idempotency": "k"}, {"tenant": "acme"}, {"countdown": 5}]
)
def test_an_unknown_enqueue_option_is_refused_by_name(options):
    (name,) = options
    with pytest.raises(InvalidJobInput, match=name):
        build({}, **options)
    with pytest.raises(InvalidJobInput, match=name):
        RECORD.using(**options)


@pytest.mark.parametrize("priority", ["high", True, 1.5, 2**31, -(2**31) - 1])
def test_a_bad_priority_is_refused(priority):
    with pytest.raises(InvalidJobInput, match="priority"):
        build({}, priority=priority)


@pytest.mark.parametrize("max_attempts", [0, -1, True, "3", 2**31])
def test_a_bad_max_attempts_is_refused(max_attempts):
    with pytest.raises(InvalidJobInput, match="max_attempts"):
        build({}, max_attempts=max_attempts)


@pytest.mark.parametrize("who", ["", 42, "x" * 201])
def test_a_bad_enqueued_by_is_refused(who):
    with pytest.raises(InvalidJobInput, match="enqueued_by"):
        build({}, enqueued_by=who)


@pytest.mark.parametrize(
    "traceparent",
    [
        "garbage",
        "",
        42,
        TRACEPARENT.upper(),
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",  # no flags
        "0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",  # 31 hex trace id
        " " + TRACEPARENT,
    ],
)
def test_a_malformed_traceparent_is_refused(traceparent):
    with pytest.raises(InvalidJobInput, match="traceparent"):
        build({}, traceparent=traceparent)


@pytest.mark.parametrize(
    "traceparent",
    [
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # all-zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # all-zero parent id
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version ff
    ],
)
def test_a_traceparent_the_w3c_spec_calls_invalid_is_refused(traceparent):
    # W3C Trace Context 3.2.2: these values are invalid; a worker would start an orphan root
    # span from them while the row claims to belong to a trace.
    with pytest.raises(InvalidJobInput, match="traceparent"):
        build({}, traceparent=traceparent)


def test_without_an_active_span_or_explicit_value_there_is_no_traceparent():
    assert build({}).traceparent is None


# ------------------------------------------------------------------ the function's signature --
# The worker calls func(ctx, **input): an input that does not bind would be accepted and then
# fail every attempt with a TypeError. Enqueue binds it first and refuses it, writing nothing.


def add(ctx, a, b):
    return a + b


ADD = registry.JobDefinition.build(add, name="tests.add")


def test_an_input_the_function_cannot_take_is_refused_naming_the_job_and_the_arguments():
    with pytest.raises(InvalidJobInput) as info:
        api.build_params(ADD, {"c": 1}, {})
    message = str(info.value)
    assert "tests.add" in message and "add(ctx, a, b)" in message
    assert "missing required argument(s) 'a', 'b'" in message
    assert "unexpected argument(s) 'c' (it takes 'a', 'b')" in message


@pytest.mark.parametrize(
    ("input", "fragment"),
    [
        ({"a": 1}, "missing required argument(s) 'b'"),
        (None, "missing required argument(s) 'a', 'b'"),
        ({}, "missing required argument(s) 'a', 'b'"),
        ({"a": 1, "b": 2, "c": 3}, "unexpected argument(s) 'c'"),
        ({"a": 1, "b": 2, "ctx": 3}, "unexpected argument(s) 'ctx'"),  # ctx is the worker's
    ],
)
def test_each_missing_or_unexpected_argument_is_named(input, fragment):
    with pytest.raises(InvalidJobInput, match=r"tests\.add") as info:
        api.build_params(ADD, input, {})
    assert fragment in str(info.value)


def test_an_input_that_binds_is_accepted():
    assert json.loads(api.build_params(ADD, {"b": 2, "a": 1}, {}).input_json) == {"b": 2, "a": 1}


def kinds(ctx, a, b=2, *, c, d=4):
    return None


def rest(ctx, a, **more):
    return None


async def coro(ctx, *, n):
    return n


@pytest.mark.parametrize(
    ("func", "input"),
    [
        (kinds, {"a": 1, "c": 3}),
        (kinds, {"a": 1, "b": 2, "c": 3, "d": 4}),
        (rest, {"a": 1}),
        (rest, {"a": 1, "anything": 2, "else": [3]}),  # **kwargs: any name
        (coro, {"n": 1}),
    ],
)
def test_defaults_keyword_only_and_kwargs_bind_as_python_binds_them(func, input):
    params = api.build_params(registry.JobDefinition.build(func), input, {})
    assert json.loads(params.input_json) == input


@pytest.mark.parametrize(
    ("func", "input", "fragment"),
    [
        (kinds, {"a": 1}, "missing required argument(s) 'c'"),
        (kinds, {"c": 3, "e": 5}, "missing required argument(s) 'a'; unexpected argument(s) 'e'"),
        (rest, {"anything": 2}, "missing required argument(s) 'a'"),  # **kwargs: still required
        (coro, {}, "missing required argument(s) 'n'"),
    ],
)
def test_defaults_keyword_only_and_kwargs_refuse_as_python_refuses(func, input, fragment):
    with pytest.raises(InvalidJobInput) as info:
        api.build_params(registry.JobDefinition.build(func), input, {})
    assert fragment in str(info.value)
    with pytest.raises(TypeError):  # what a worker would have met on every attempt
        func(None, **input)


def test_a_refused_input_is_refused_before_its_concurrency_key_or_json_are_looked_at():
    with pytest.raises(InvalidJobInput, match="missing required argument"):
        api.build_params(ADD, {"a": object()}, {})


def test_the_input_of_a_schedule_entry_is_bound_by_the_system_check():
    from django.core import checks

    schedule = {"nightly": {"job": "testapp.flaky", "cron": "0 3 * * *",
                            "input": {"fail_time": 2}}}
    with override_settings(XJOBS={**settings.XJOBS, "SCHEDULE": schedule}):
        found = [m for m in checks.run_checks(tags=["django_xjobs"]) if m.id.startswith("xjobs.")]
    assert [m.id for m in found] == ["xjobs.E013"]
    assert "'nightly'" in found[0].msg
    assert "unexpected argument(s) 'fail_time' (it takes 'fail_times')" in found[0].msg


# ------------------------------------------------------------------------------ fuzzing --

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=25,
)


def _has_nul(value) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    return False


def _has_key(value, key: str) -> bool:
    if isinstance(value, list):
        return any(_has_key(v, key) for v in value)
    if isinstance(value, dict):
        return key in value or any(_has_key(v, key) for v in value.values())
    return False


@hsettings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.text(max_size=10), json_values, max_size=6))
@example({"$xjobs": None})  # the reserved key, which Hypothesis found once by itself
def test_whatever_build_params_accepts_round_trips_through_json(input):
    if _has_nul(input):
        with pytest.raises(InvalidJobInput, match="NUL"):
            build(input)
        return
    if _has_key(input, TYPED_KEY):  # marks the typed values the package stores
        with pytest.raises(InvalidJobInput, match="reserves"):
            build(input)
        return
    p = build(input)  # anything JSON-like without a NUL must be accepted ...
    assert json.loads(p.input_json) == input  # ... and decode to exactly what was given
    assert len(p.input_json.encode("utf-8")) <= 1024 * 1024


@hsettings(max_examples=200, deadline=None)
@given(st.dictionaries(
    st.text(max_size=5),
    st.one_of(json_values, st.sets(st.integers(), min_size=1, max_size=3),
              st.decimals(allow_nan=False), st.binary(max_size=5), st.datetimes()),
    min_size=1, max_size=4,
))
def test_build_params_either_accepts_exactly_or_raises_invalid_job_input(input):
    try:
        p = build(input)
    except InvalidJobInput:
        return
    assert values.decode_json(p.input_json) == input
