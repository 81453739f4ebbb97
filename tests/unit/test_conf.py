"""The XJOBS setting: durations, defaults and every refusal naming the key (conf.py)."""

from __future__ import annotations

import ast
import dataclasses
import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.test import override_settings

from django_xjobs import conf, values
from django_xjobs.exceptions import ConfigurationError
from django_xjobs.worker.options import WorkerOptions

# ------------------------------------------------------------------------- parse_duration --


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("250ms", 0.25),
        ("30s", 30.0),
        ("5m", 300.0),
        ("2h", 7200.0),
        ("7d", 604800.0),
        ("1w", 604800.0),
        ("1.5h", 5400.0),
        (" 30s ", 30.0),
        ("30", 30.0),
        ("0s", 0.0),
        (timedelta(minutes=2), 120.0),
        (timedelta(milliseconds=5), 0.005),
        (5, 5.0),
        (2.5, 2.5),
        (0, 0.0),
    ],
)
def test_parse_duration_accepts_the_documented_forms(value, seconds):
    assert values.parse_duration(value) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "value",
    [-1, -0.5, "-5s", timedelta(seconds=-1)],
)
def test_parse_duration_refuses_a_negative_duration(value):
    with pytest.raises(ConfigurationError, match="my_timeout"):
        values.parse_duration(value, what="my_timeout")


@pytest.mark.parametrize(
    "value",
    ["", "soon", "5x", "5 minutes", "s", "1e3s", "30S", "5m30s", None, [30], {"s": 1}, object()],
)
def test_parse_duration_refuses_garbage(value):
    with pytest.raises(ConfigurationError, match="my_lease"):
        values.parse_duration(value, what="my_lease")


@pytest.mark.parametrize("value", [True, False])
def test_parse_duration_refuses_a_bool_although_bool_is_an_int(value):
    with pytest.raises(ConfigurationError, match="expected a duration"):
        values.parse_duration(value)


def test_parse_duration_refuses_nan():
    # float("nan") passes "seconds < 0" (every comparison with NaN is false); as XJOBS["LEASE"]
    # it survives conf.build and the system check, then crashes the worker in round(nan*1000).
    with pytest.raises(ConfigurationError):
        values.parse_duration(float("nan"), what="x")


# ---------------------------------------------------------------------------------- build --


@pytest.mark.parametrize("raw", [None, {}])
def test_build_gives_the_documented_defaults(raw):
    s = conf.build(raw)
    assert s.database == "default"
    assert s.queues == ("default",)
    assert dict(s.queue_concurrency) == {}
    assert s.lease == 30.0
    assert s.heartbeat == 10.0
    assert s.poll_interval == 1.0
    assert s.notify is True
    assert s.max_payload_bytes == 1024 * 1024
    assert s.max_attempts == 3
    assert s.retry_base == 2.0
    assert s.retry_cap == 3600.0
    assert s.shutdown_grace == 30.0
    assert dict(s.retention) == {"done": 7 * 86400.0, "cancelled": 7 * 86400.0,
                                 "dead": 30 * 86400.0}


def test_build_parses_every_duration_key():
    s = conf.build({"LEASE": "1m", "HEARTBEAT": "15s", "POLL_INTERVAL": "250ms",
                    "RETRY_BASE": "1s", "RETRY_CAP": "1h", "SHUTDOWN_GRACE": 0})
    assert (s.lease, s.heartbeat, s.poll_interval) == (60.0, 15.0, 0.25)
    assert (s.retry_base, s.retry_cap, s.shutdown_grace) == (1.0, 3600.0, 0.0)


def test_the_default_heartbeat_follows_a_short_lease():
    s = conf.build({"LEASE": "6s"})
    assert s.heartbeat == pytest.approx(2.0)
    assert s.lease >= 3 * s.heartbeat


@pytest.mark.parametrize("raw", ["emails", 42])
def test_an_xjobs_that_is_not_a_dict_is_refused(raw):
    # Not a ValueError/TypeError out of dict(raw): the system check only turns
    # ConfigurationError into xjobs.E001 (tests/integration/test_checks.py).
    with pytest.raises(ConfigurationError, match="XJOBS"):
        conf.build(raw)


def test_listen_database_is_an_alias_or_none():
    assert conf.build({}).listen_database is None
    assert conf.build({"LISTEN_DATABASE": None}).listen_database is None
    assert conf.build({"LISTEN_DATABASE": "direct"}).listen_database == "direct"
    for bad in ("", 5, ["direct"]):
        with pytest.raises(ConfigurationError, match=r'XJOBS\["LISTEN_DATABASE"\] must be a '
                                                     "database alias"):
            conf.build({"LISTEN_DATABASE": bad})


def test_an_unknown_key_is_refused_by_name():
    with pytest.raises(ConfigurationError, match="LEASES"):
        conf.build({"LEASES": "30s"})


@pytest.mark.parametrize(
    ("queues", "fragment"),
    [
        ("emails", "QUEUES"),
        (42, "QUEUES"),
        ([], "at least one queue"),
        ((), "at least one queue"),
        ({}, "at least one queue"),
        (["ok", "bad queue"], "'bad queue'"),
        (["ok", ""], "''"),
        (["x" * 201], "not a valid queue name"),
        ([1], "1 is not a valid queue name"),
        ({"bad/queue": {}}, "'bad/queue'"),
    ],
)
def test_bad_queues_are_refused(queues, fragment):
    with pytest.raises(ConfigurationError, match="QUEUES") as info:
        conf.build({"QUEUES": queues})
    assert fragment in str(info.value)


def test_a_queue_name_with_a_trailing_newline_is_refused():
    # Python's "$" also matches before a final newline: "default\n" would pass ^...$.
    with pytest.raises(ConfigurationError, match="QUEUES"):
        conf.build({"QUEUES": ["default\n"]})


def test_queues_as_a_list():
    s = conf.build({"QUEUES": ["default", "emails"]})
    assert s.queues == ("default", "emails")
    assert dict(s.queue_concurrency) == {}


def test_queues_as_a_dict_with_per_queue_concurrency():
    s = conf.build({"QUEUES": {"emails": {"concurrency": 4}, "default": None, "reports": {}}})
    assert s.queues == ("emails", "default", "reports")
    assert dict(s.queue_concurrency) == {"emails": 4}


@pytest.mark.parametrize(
    "options", [{"conc": 4}, {"concurrency": 2, "priority": 1}, 4, ["concurrency"]]
)
def test_a_per_queue_option_of_the_wrong_shape_is_refused(options):
    with pytest.raises(ConfigurationError, match=r'QUEUES"\]\["emails"\]'):
        conf.build({"QUEUES": {"emails": options}})


@pytest.mark.parametrize("concurrency", [0, -2, True, "4", 1.5])
def test_a_bad_per_queue_concurrency_is_refused(concurrency):
    with pytest.raises(ConfigurationError, match="concurrency"):
        conf.build({"QUEUES": {"emails": {"concurrency": concurrency}}})


@pytest.mark.parametrize("concurrency", [0, "4"])
def test_a_bad_per_queue_concurrency_is_refused_naming_the_queue(concurrency):
    # The message must lead the operator to XJOBS["QUEUES"]["emails"]["concurrency"]; a key
    # that does not exist in XJOBS (XJOBS["concurrency"]) sends them looking in the wrong place.
    with pytest.raises(ConfigurationError) as info:
        conf.build({"QUEUES": {"emails": {"concurrency": concurrency}}})
    assert "QUEUES" in str(info.value)
    assert "emails" in str(info.value)


@pytest.mark.parametrize(
    ("lease", "heartbeat"), [("10s", "5s"), ("29s", "10s"), (2, 1), ("1s", "1s")]
)
def test_a_lease_shorter_than_three_heartbeats_is_refused_with_the_reason(lease, heartbeat):
    with pytest.raises(ConfigurationError) as info:
        conf.build({"LEASE": lease, "HEARTBEAT": heartbeat})
    message = str(info.value)
    assert 'XJOBS["LEASE"]' in message
    assert 'XJOBS["HEARTBEAT"]' in message
    assert "3 x" in message
    assert "lapse" in message  # says why, not only what


def test_a_lease_of_exactly_three_heartbeats_is_accepted():
    s = conf.build({"LEASE": "15s", "HEARTBEAT": "5s"})
    assert (s.lease, s.heartbeat) == (15.0, 5.0)


@pytest.mark.parametrize("key", ["LEASE", "HEARTBEAT", "POLL_INTERVAL", "RETRY_BASE"])
def test_a_zero_interval_is_refused(key):
    with pytest.raises(ConfigurationError, match=key):
        conf.build({key: 0})


def test_retention_overrides_one_state_and_keeps_the_other_defaults():
    s = conf.build({"RETENTION": {"done": "1d", "dead": timedelta(days=90)}})
    assert dict(s.retention) == {"done": 86400.0, "cancelled": 7 * 86400.0,
                                 "dead": 90 * 86400.0}


@pytest.mark.parametrize(
    ("retention", "fragment"),
    [
        ({"running": "1d"}, "'running'"),
        ({"ready": "1d"}, "'ready'"),
        ("7d", "must be a dict"),
        (["done"], "must be a dict"),
        ({"done": "forever"}, '"done"'),
        ({"dead": -1}, '"dead"'),
    ],
)
def test_bad_retention_is_refused(retention, fragment):
    with pytest.raises(ConfigurationError, match="RETENTION") as info:
        conf.build({"RETENTION": retention})
    assert fragment in str(info.value)


@pytest.mark.parametrize("notify", [True, False])
def test_notify_takes_a_bool(notify):
    assert conf.build({"NOTIFY": notify}).notify is notify


@pytest.mark.parametrize("notify", ["false", "no", 0, 1, None])
def test_notify_refuses_anything_but_a_bool(notify):
    with pytest.raises(ConfigurationError, match="NOTIFY"):
        conf.build({"NOTIFY": notify})


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"DATABASE": ""}, "DATABASE"),
        ({"DATABASE": None}, "DATABASE"),
        ({"CONCURRENCY": 0}, "CONCURRENCY"),
        ({"MAX_ATTEMPTS": 0}, "MAX_ATTEMPTS"),
        ({"MAX_ATTEMPTS": True}, "MAX_ATTEMPTS"),
        ({"MAX_PAYLOAD_BYTES": 0}, "MAX_PAYLOAD_BYTES"),
        ({"MAX_PAYLOAD_BYTES": "1MB"}, "MAX_PAYLOAD_BYTES"),
        ({"PREFETCH": -1}, "PREFETCH"),
        ({"RETRY_BASE": "10s", "RETRY_CAP": "1s"}, "RETRY_CAP"),
        ({"SCHEDULE": []}, "SCHEDULE"),
        ({"APP_VERSION": 3}, "APP_VERSION"),
        ({"ADMIN_TENANT_SCOPE": 3}, "ADMIN_TENANT_SCOPE"),
        ({"MAX_JOBS_PER_PROCESS": 0}, "MAX_JOBS_PER_PROCESS"),
        ({"MAX_JOBS_PER_PROCESS": "100"}, "MAX_JOBS_PER_PROCESS"),
        ({"MAX_MEMORY": 0}, "MAX_MEMORY"),
        ({"MAX_MEMORY": "512MB"}, "MAX_MEMORY"),
    ],
)
def test_other_bad_values_are_refused_by_key(raw, key):
    with pytest.raises(ConfigurationError, match=key):
        conf.build(raw)


@pytest.mark.parametrize(("value", "seconds"), [("5s", 5.0), (30, 30.0), ("1h", 3600.0),
                                               (None, None)])
def test_console_refresh_is_a_duration_from_a_second_to_an_hour_or_none(value, seconds):
    assert conf.build({"CONSOLE_REFRESH": value}).console_refresh == seconds


@pytest.mark.parametrize(("value", "out_of_range"), [
    (0, True), ("500ms", True), ("2h", True), ("soon", False), (False, False)])
def test_a_bad_console_refresh_is_refused_by_key(value, out_of_range):
    with pytest.raises(ConfigurationError, match=r'XJOBS\["CONSOLE_REFRESH"\]') as info:
        conf.build({"CONSOLE_REFRESH": value})
    said = "from 1s to 1h (None turns the console's live updates off)" in str(info.value)
    assert said is out_of_range


def test_get_follows_override_settings():
    before = conf.get()
    with override_settings(XJOBS={"QUEUES": ["a", "b"], "MAX_ATTEMPTS": 9}):
        inside = conf.get()
        assert inside.queues == ("a", "b")
        assert inside.max_attempts == 9
        assert WorkerOptions.from_settings().queues == ("a", "b")
    assert conf.get() == before
    assert conf.get().queues != ("a", "b")


# ------------------------------------------------------------------ every problem at once --
# The system check turns each problem into its own xjobs.E001, so one `manage.py check` shows
# every mistake of the XJOBS dict instead of one per edit-and-rerun
# (tests/integration/test_checks.py::test_manage_py_check_lists_every_bad_xjobs_key).

THREE_BAD = {"LEASE": "soon", "NOTIFY": "yes", "QUEUES": []}


def test_validate_lists_every_bad_key_not_only_the_first():
    problems = conf.validate(THREE_BAD)
    assert len(problems) == 3
    for key in ('XJOBS["LEASE"]', 'XJOBS["NOTIFY"]', 'XJOBS["QUEUES"]'):
        assert len([p for p in problems if key in p]) == 1, (key, problems)


def test_each_problem_reads_as_the_key_alone_would_be_refused():
    problems = conf.validate(THREE_BAD)
    for key, value in THREE_BAD.items():
        with pytest.raises(ConfigurationError) as info:
            conf.build({key: value})
        assert str(info.value) in problems


def test_build_still_raises_and_its_message_names_every_bad_key():
    with pytest.raises(ConfigurationError) as info:
        conf.build(THREE_BAD)
    for problem in conf.validate(THREE_BAD):
        assert problem in str(info.value)


@pytest.mark.parametrize("raw", [None, {}, {"LEASE": "1m", "HEARTBEAT": "15s"}])
def test_validate_of_good_settings_finds_nothing(raw):
    assert conf.validate(raw) == []


def test_validate_of_an_xjobs_that_is_not_a_dict_is_one_problem():
    assert len(conf.validate(["QUEUES"])) == 1
    assert "XJOBS must be a dict" in conf.validate(["QUEUES"])[0]


def test_an_unknown_key_and_a_bad_value_are_reported_together():
    problems = conf.validate({"LEASES": "30s", "MAX_ATTEMPTS": 0})
    assert len(problems) == 2
    assert "LEASES" in problems[0] and "MAX_ATTEMPTS" in problems[1]


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        # The relation between two keys is judged only when both were read: a rule checked
        # against the default of an unreadable key would report a mistake nobody made.
        ({"LEASE": "soon", "HEARTBEAT": "15s"}, "LEASE"),
        ({"HEARTBEAT": "soon", "LEASE": "6s"}, "HEARTBEAT"),
        ({"RETRY_BASE": "soon", "RETRY_CAP": "1s"}, "RETRY_BASE"),
        ({"LEADER_LEASE": "soon", "LEADER_RENEW": "6s"}, "LEADER_LEASE"),
        ({"LEASE": "soon", "HEARTBEAT": "15s", "SLOT_TTL": "45s"}, "LEASE"),
        ({"POLL_INTERVAL": "soon", "OUTBOX": {"BATCH_SIZE": 10}}, "POLL_INTERVAL"),
    ],
)
def test_an_unreadable_key_is_not_also_blamed_on_the_keys_it_relates_to(raw, key):
    problems = conf.validate(raw)
    assert len(problems) == 1, problems
    assert f'XJOBS["{key}"]' in problems[0]


def test_every_bad_schedule_entry_is_its_own_problem():
    problems = conf.validate({"SCHEDULE": {
        "nightly": {"job": "app.fn", "cron": "0 3 * * *"},
        "no-cron": {"job": "app.fn"},
        "not-a-dict": ["app.fn"],
    }})
    assert len(problems) == 2, problems
    assert "'no-cron'" in problems[0] and "'not-a-dict'" in problems[1]


# -------------------------------------------------------------------- the documented defaults --

ROOT = Path(__file__).resolve().parents[2]


def documented_defaults(page: str) -> dict:
    """The ``XJOBS = {...}`` of the page's "## Settings" section, as Python reads it."""
    text = (ROOT / "docs" / page).read_text()
    section = text.split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```python\n(XJOBS = \{.*?\n\})\n```", section, re.S)
    assert block, f"no XJOBS block in the Settings section of docs/{page}"
    return ast.literal_eval(block.group(1).split("=", 1)[1])


def test_the_documented_defaults_are_the_defaults():
    # docs/guide.md once said "PREFETCH": 10 where the default is "auto". Each documented value,
    # given alone, must make the very settings no value makes (QUEUES given only records that it
    # was given: queues_given).
    documented = {**documented_defaults("scheduling.md"), **documented_defaults("guide.md")}
    assert set(documented) == conf._KNOWN_KEYS
    default = dataclasses.replace(conf.build({}), raw={}, queues_given=False)
    for key, value in documented.items():
        built = dataclasses.replace(conf.build({key: value}), raw={}, queues_given=False)
        assert built == default, f"docs say XJOBS[{key!r}] defaults to {value!r}"
