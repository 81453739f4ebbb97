"""Concurrency slots without a database: ``Concurrency`` and its key templates, ``@job(
concurrency=...)``, the enqueue-side keys, the settings and which limit applies (slots.py)."""

from __future__ import annotations

import pytest
from django.test import override_settings

from django_xjobs import Concurrency, api, conf, job, registry, slots
from django_xjobs.exceptions import (
    SLOT_LOST,
    ConfigurationError,
    InvalidConcurrencyKey,
    InvalidJobInput,
    JobCancelled,
    SlotLost,
)
from tests.testapp import jobs as testapp_jobs


@pytest.fixture(autouse=True)
def isolated_registry():
    before = registry.all_jobs()
    yield
    for name in set(registry.all_jobs()) - set(before):
        registry.unregister(name)


def settings_with(**xjobs):
    return conf.build({"LEASE": "30s", "HEARTBEAT": "5s", **xjobs})


# ------------------------------------------------------------------------------ templates --


def test_a_template_is_formatted_from_the_input_and_the_tenant():
    c = Concurrency(key="tenant:{tenant_id}:export:{account_id}", limit=2)

    assert c.fields == ("tenant_id", "account_id")
    assert c.prefix == "tenant:"
    assert c.format({"account_id": 7}, tenant_id="acme") == "tenant:acme:export:7"


def test_the_jobs_tenant_wins_over_an_input_field_of_that_name():
    c = Concurrency(key="t:{tenant_id}", limit=1)

    assert c.format({"tenant_id": "from-input"}, tenant_id="acme") == "t:acme"
    assert c.format({"tenant_id": "from-input"}) == "t:from-input"


def test_a_constant_key_is_one_key_for_every_input():
    c = Concurrency(key="smtp", limit=3)

    assert c.fields == ()
    assert c.prefix == "smtp"
    assert c.format({"anything": 1}) == "smtp"


def test_doubled_braces_are_literal_braces():
    assert Concurrency(key="{{x}}:{n}", limit=1).format({"n": 1}) == "{x}:1"


@pytest.mark.parametrize("key", ["", None, 42, "a\x00b"])
def test_a_key_template_that_is_not_a_non_empty_string_is_refused(key):
    with pytest.raises(ConfigurationError, match="key"):
        Concurrency(key=key, limit=1)


@pytest.mark.parametrize("key", ["{}", "{0}", "{a.b}", "{a[0]}", "{a!r}", "{a:>5}", "{a",
                                 "a}", "{1x}"])
def test_a_template_field_that_is_not_a_plain_name_is_refused(key):
    with pytest.raises(ConfigurationError, match="template"):
        Concurrency(key=key, limit=1)


@pytest.mark.parametrize("limit", [0, -1, True, 1.5, "2", 2**31])
def test_a_bad_limit_is_refused(limit):
    with pytest.raises(ConfigurationError, match="limit"):
        Concurrency(key="k", limit=limit)


def test_a_limit_may_be_left_to_the_settings():
    assert Concurrency(key="k").limit is None


@pytest.mark.parametrize(
    ("values", "tenant", "fragment"),
    [
        ({}, None, "needs {group}"),
        ({"group": None}, None, "needs {group}"),
        ({"group": ""}, None, "empty"),
        ({"group": True}, None, "to be a string, an integer, a datetime"),
        ({"group": 1.5}, None, "to be a string, an integer, a datetime"),
        ({"group": ["a"]}, None, "to be a string, an integer, a datetime"),
        ({"group": {"a": 1}}, None, "to be a string, an integer, a datetime"),
        ({"group": "x" * 600}, None, "at most 500"),
        ({"group": "\ud800"}, None, "surrogate"),
    ],
)
def test_a_key_that_cannot_be_built_is_refused_naming_the_field(values, tenant, fragment):
    c = Concurrency(key="g:{group}", limit=1)

    with pytest.raises(InvalidConcurrencyKey, match=fragment):
        c.format(values, tenant_id=tenant, job="t.job")


def test_a_missing_tenant_says_how_to_give_one():
    with pytest.raises(InvalidConcurrencyKey, match=r"using\(tenant_id=\.\.\.\)"):
        Concurrency(key="t:{tenant_id}", limit=1).format({})


def test_an_invalid_concurrency_key_is_an_invalid_job_input():
    assert issubclass(InvalidConcurrencyKey, InvalidJobInput)


# ---------------------------------------------------------------------- @job(concurrency=) --


def test_the_option_is_recorded_on_the_definition():
    c = Concurrency(key="g:{group}", limit=2)

    @job(name="t.slotted", concurrency=c)
    def f(ctx, group):
        return group

    assert slots.concurrency_of(f) is c


def test_a_template_field_that_is_no_parameter_of_the_function_is_refused():
    with pytest.raises(ConfigurationError, match=r"\{grup\}.*not a parameter"):
        @job(name="t.typo", concurrency=Concurrency(key="g:{grup}", limit=1))
        def f(ctx, group):
            return group
    assert registry.lookup("t.typo") is None


def test_tenant_id_and_functions_taking_any_keyword_are_accepted():
    @job(name="t.tenant", concurrency=Concurrency(key="{tenant_id}", limit=1))
    def f(ctx):
        return None

    @job(name="t.kwargs", concurrency=Concurrency(key="{whatever}", limit=1))
    def g(ctx, **kwargs):
        return None

    assert slots.concurrency_of(f) is not None and slots.concurrency_of(g) is not None


@pytest.mark.parametrize("value", ["tenant:{tenant_id}", 2, {"key": "k", "limit": 1}])
def test_something_other_than_a_concurrency_is_refused(value):
    with pytest.raises(ConfigurationError, match="Concurrency"):
        @job(name="t.bad_option", concurrency=value)
        def f(ctx):
            return None
    assert registry.lookup("t.bad_option") is None


def test_a_job_without_the_option_is_not_slot_limited():
    assert slots.concurrency_of(testapp_jobs.record) is None
    assert api.build_params(testapp_jobs.record, {"tag": "x"}, {}).concurrency_key is None


# ----------------------------------------------------------------------------- enqueue side --


def test_enqueue_params_carry_the_formatted_key():
    params = api.build_params(testapp_jobs.slotted, {"group": "a"}, {})
    assert params.concurrency_key == "slot:a"

    tenant = api.build_params(testapp_jobs.per_tenant, {}, {"tenant_id": "acme"})
    assert tenant.concurrency_key == "tenant:acme"


def test_an_explicit_key_overrides_the_template():
    params = api.build_params(testapp_jobs.slotted, {"group": "a"},
                              {"concurrency_key": "slot:other"})
    assert params.concurrency_key == "slot:other"


def test_a_missing_field_fails_the_enqueue_before_anything_is_built():
    with pytest.raises(InvalidConcurrencyKey, match=r"testapp\.per_tenant.*\{tenant_id\}"):
        api.build_params(testapp_jobs.per_tenant, {"n": 1}, {})


@pytest.mark.parametrize("key", ["", 7, "x" * 501, "a\x00"])
def test_a_bad_explicit_key_is_refused(key):
    with pytest.raises(InvalidConcurrencyKey, match="concurrency key"):
        api.build_params(testapp_jobs.slotted, {"group": "a"}, {"concurrency_key": key})


def test_an_explicit_key_on_an_unlimited_job_needs_a_settings_limit():
    with pytest.raises(InvalidConcurrencyKey, match="no concurrency limit applies"):
        api.build_params(testapp_jobs.record, {}, {"concurrency_key": "free:1"})

    with override_settings(XJOBS={"CONCURRENCY_LIMITS": {"free:": 4}}):
        params = api.build_params(testapp_jobs.record, {}, {"concurrency_key": "free:1"})
    assert params.concurrency_key == "free:1"


def test_a_template_without_a_limit_needs_a_settings_prefix_for_each_key():
    @job(name="t.settings_only", concurrency=Concurrency(key="acct:{n}"))
    def f(ctx, n):
        return n

    with pytest.raises(InvalidConcurrencyKey, match="'acct:1'"):
        api.build_params(f, {"n": 1}, {})
    with override_settings(XJOBS={"CONCURRENCY_LIMITS": {"acct:": 2}}):
        assert api.build_params(f, {"n": 1}, {}).concurrency_key == "acct:1"


# --------------------------------------------------------------------- settings and limits --


def test_the_settings_default_to_no_prefix_limits_and_a_slot_ttl_of_one_lease():
    s = settings_with()
    assert s.concurrency_limits == ()
    assert s.slot_ttl == 30.0


def test_prefix_limits_are_kept_longest_prefix_first():
    s = settings_with(CONCURRENCY_LIMITS={"t:": 5, "t:big:": 20, "": 1})
    assert s.concurrency_limits == (("t:big:", 20), ("t:", 5), ("", 1))


@pytest.mark.parametrize(
    ("key", "limit"),
    [("t:big:acme", 20), ("t:acme", 5), ("other", 1)],
)
def test_the_longest_matching_prefix_gives_the_limit(key, limit):
    s = settings_with(CONCURRENCY_LIMITS={"t:": 5, "t:big:": 20, "": 1})
    assert slots.settings_limit(key, s) == limit


def test_a_settings_limit_wins_over_the_jobs_own():
    s = settings_with(CONCURRENCY_LIMITS={"slot:": 7})
    assert slots.limit_for("slot:a", testapp_jobs.slotted, s) == 7
    assert slots.limit_for("slot:a", testapp_jobs.slotted, settings_with()) == 2
    assert slots.limit_for("free", testapp_jobs.record, settings_with()) is None
    assert slots.limit_for("free", None, settings_with()) is None


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (["t:"], "must be a dict"),
        ({"t:": 0}, r"CONCURRENCY_LIMITS\"\]\['t:'\]"),
        ({"t:": "5"}, "positive integer"),
        ({"t:": True}, "positive integer"),
        ({1: 5}, "prefix 1"),
        ({"x" * 501: 1}, "at most 500"),
        ({"a\x00": 1}, "NUL"),
    ],
)
def test_bad_concurrency_limits_are_refused_naming_the_key(value, fragment):
    with pytest.raises(ConfigurationError, match=fragment):
        settings_with(CONCURRENCY_LIMITS=value)


def test_a_slot_ttl_shorter_than_three_heartbeats_is_refused():
    with pytest.raises(ConfigurationError, match=r'SLOT_TTL.*3 x XJOBS\["HEARTBEAT"\]'):
        settings_with(SLOT_TTL="10s")
    assert settings_with(SLOT_TTL="15s").slot_ttl == 15.0


@pytest.mark.parametrize("value", ["soon", -1, 0])
def test_a_bad_slot_ttl_is_refused(value):
    with pytest.raises(ConfigurationError, match="SLOT_TTL"):
        settings_with(SLOT_TTL=value)


# ------------------------------------------------------------------------------ holders --


def test_a_holder_names_the_job_the_claim_and_the_worker():
    from django_xjobs.records import ClaimedJob

    claimed = ClaimedJob(id="j1", lease_token="tok", name="n", queue="q", input={}, run_id="r",
                         attempt=1, max_attempts=3, tenant_id=None, traceparent=None,
                         concurrency_key="k", resumed=False)

    value = slots.holder(claimed, "host:1:ab/cd")

    assert value == "j1/tok/host:1:ab/cd"
    assert slots.parse_holder(value) == ("j1", "tok", "host:1:ab/cd")


def test_slot_lost_is_a_job_cancelled_with_its_code():
    assert issubclass(SlotLost, JobCancelled)
    assert SlotLost.code == SLOT_LOST == "X_JOB_SLOT_LOST"
