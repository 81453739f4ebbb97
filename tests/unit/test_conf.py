"""The XJOBS setting: durations, defaults and every refusal naming the key (conf.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings

from django_xjobs import conf
from django_xjobs.exceptions import ConfigurationError
from django_xjobs.worker.loop import WorkerOptions

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
    assert conf.parse_duration(value) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "value",
    [-1, -0.5, "-5s", timedelta(seconds=-1)],
)
def test_parse_duration_refuses_a_negative_duration(value):
    with pytest.raises(ConfigurationError, match="my_timeout"):
        conf.parse_duration(value, what="my_timeout")


@pytest.mark.parametrize(
    "value",
    ["", "soon", "5x", "5 minutes", "s", "1e3s", "30S", "5m30s", None, [30], {"s": 1}, object()],
)
def test_parse_duration_refuses_garbage(value):
    with pytest.raises(ConfigurationError, match="my_lease"):
        conf.parse_duration(value, what="my_lease")


@pytest.mark.parametrize("value", [True, False])
def test_parse_duration_refuses_a_bool_although_bool_is_an_int(value):
    with pytest.raises(ConfigurationError, match="expected a duration"):
        conf.parse_duration(value)


def test_parse_duration_refuses_nan():
    # float("nan") passes "seconds < 0" (every comparison with NaN is false); as XJOBS["LEASE"]
    # it survives conf.build and the system check, then crashes the worker in round(nan*1000).
    with pytest.raises(ConfigurationError):
        conf.parse_duration(float("nan"), what="x")


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
    ],
)
def test_other_bad_values_are_refused_by_key(raw, key):
    with pytest.raises(ConfigurationError, match=key):
        conf.build(raw)


def test_get_follows_override_settings():
    before = conf.get()
    with override_settings(XJOBS={"QUEUES": ["a", "b"], "MAX_ATTEMPTS": 9}):
        inside = conf.get()
        assert inside.queues == ("a", "b")
        assert inside.max_attempts == 9
        assert WorkerOptions.from_settings().queues == ("a", "b")
    assert conf.get() == before
    assert conf.get().queues != ("a", "b")
