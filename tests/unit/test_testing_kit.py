"""django_xjobs.testing without a database: the TEST_MODE setting and make_context()."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from django.core import checks
from django.test import override_settings

from django_xjobs import conf, job
from django_xjobs.exceptions import ConfigurationError, InvalidJobInput, UnknownJob
from django_xjobs.steps import StepNameReused, StepOutputError
from django_xjobs.testing import make_context
from django_xjobs.testing.context import MemorySteps

# ------------------------------------------------------------------------------ TEST_MODE --


def test_test_mode_is_off_unless_set_to_inline():
    assert conf.build({}).test_mode is None
    assert conf.build({"TEST_MODE": None}).test_mode is None
    assert conf.build({"TEST_MODE": "inline"}).test_mode == "inline"


@pytest.mark.parametrize("value", ["eager", "INLINE", "", True, 1, ["inline"]])
def test_any_other_test_mode_is_refused_naming_the_key_and_the_choices(value):
    with pytest.raises(ConfigurationError) as info:
        conf.build({"TEST_MODE": value})
    assert str(info.value) == (
        'XJOBS["TEST_MODE"] must be "inline" (run each job at enqueue, for tests) or None,'
        f" got {value!r}"
    )


def test_enqueue_hands_jobs_to_the_inline_runner_only_while_the_mode_is_on():
    from django_xjobs import api
    from django_xjobs.testing import inline

    assert api.inline_runner is None  # an enqueue pays nothing for the mode
    with override_settings(XJOBS={"TEST_MODE": "inline"}):
        assert api.inline_runner is inline.run_enqueued
        with override_settings(XJOBS={"TEST_MODE": "eager"}):  # the checks report it
            assert api.inline_runner is None
        assert api.inline_runner is inline.run_enqueued
    assert api.inline_runner is None


def test_a_bad_test_mode_stops_the_system_checks():
    with override_settings(XJOBS={"TEST_MODE": "eager"}):
        messages = [m for m in checks.run_checks(tags=["django_xjobs"])
                    if m.id.startswith("xjobs.")]
    assert [m.id for m in messages] == ["xjobs.E001"]
    assert 'XJOBS["TEST_MODE"]' in messages[0].msg


# --------------------------------------------------------------------------- make_context --


@job(name="testkit.fulfil", queue="other", max_attempts=4)
def fulfil(ctx, order_id, fail_shipping=False):
    charged = ctx.step.run("charge", lambda: {"order": order_id, "charged": (10, "EUR")})
    ctx.step.sleep("cool-off", timedelta(hours=1))
    paid = ctx.step.wait_for_event("paid", event="order.paid", correlation_key=str(order_id),
                                   timeout=timedelta(days=1))
    if paid is None:
        return {"charged": charged, "paid": None}

    def ship():
        if fail_shipping:
            raise RuntimeError("carrier down")
        return "shipped"

    return {"charged": charged, "paid": paid, "shipped": ctx.step.run("ship", ship),
            "attempt": ctx.attempt}


@job(name="testkit.race")
def race(ctx):
    ctx.step.sleep_until("until", datetime(2030, 1, 1, tzinfo=UTC))
    won = ctx.step.wait_for_any("first", events=["a", "b"], timeout=60)
    return None if won is None else [won.event, won.payload]


@job(name="testkit.async_fulfil")
async def async_fulfil(ctx, n):
    doubled = await ctx.step.run("double", lambda: n * 2)
    await ctx.step.sleep("pause", 5)
    got = await ctx.step.wait_for_event("go", event="go", timeout=10)
    return {"doubled": doubled, "got": got}


def test_make_context_runs_a_job_function_with_steps_in_memory():
    ctx = make_context(fulfil, events={"order.paid": {"amount": (10, "EUR")}})

    result = fulfil(ctx, order_id=7)

    # Outputs and payloads come back as JSON gives them back, as with a worker.
    assert result == {"charged": {"order": 7, "charged": [10, "EUR"]},
                      "paid": {"amount": [10, "EUR"]}, "shipped": "shipped", "attempt": 1}
    assert isinstance(ctx.step, MemorySteps)
    assert ctx.step.ran == ["charge", "ship"]
    assert ctx.step.sleeps == [("cool-off", timedelta(hours=1))]
    assert ctx.step.waits == [("paid", ("order.paid",), "7")]
    assert ctx.step.completed == {
        "charge": {"order": 7, "charged": [10, "EUR"]}, "cool-off": None,
        "paid": {"amount": [10, "EUR"]}, "ship": "shipped",
    }
    assert (ctx.name, ctx.queue, ctx.attempt, ctx.max_attempts) == (
        "testkit.fulfil", "other", 1, 4)
    assert ctx.job_id != ctx.run_id and ctx.tenant_id is None and ctx.lease_token is None


def test_an_event_not_given_is_a_timeout():
    ctx = make_context(fulfil)
    assert fulfil(ctx, order_id=1) == {"charged": {"order": 1, "charged": [10, "EUR"]},
                                       "paid": None}
    assert ctx.step.completed["paid"] is None


def test_a_previous_context_makes_the_next_run_replaying_its_completed_steps():
    first = make_context(fulfil, job_id="j-1", tenant_id="t", events={"order.paid": 1})
    with pytest.raises(RuntimeError, match="carrier down"):
        fulfil(first, order_id=3, fail_shipping=True)
    assert first.step.ran == ["charge", "ship"]
    assert "ship" not in first.step.completed

    retry = make_context(fulfil, previous=first, events={"order.paid": 2})
    assert fulfil(retry, order_id=3)["shipped"] == "shipped"
    assert retry.step.ran == ["ship"]  # charge replayed, not charged again
    assert retry.step.sleeps == []  # the sleep was over
    assert (retry.job_id, retry.run_id, retry.tenant_id, retry.attempt) == (
        "j-1", first.run_id, "t", 2)
    assert make_context(fulfil, previous=retry, attempt=2).attempt == 2


def test_the_step_rules_of_a_worker_hold():
    ctx = make_context()

    def twice(ctx):
        ctx.step.run("same", lambda: 1)
        ctx.step.run("same", lambda: 2)

    with pytest.raises(StepNameReused):
        twice(ctx)
    with pytest.raises(StepOutputError):
        make_context().step.run("bad", lambda: object())
    with pytest.raises(InvalidJobInput, match="step name"):
        make_context().step.run("a#b", lambda: 1)
    with pytest.raises(InvalidJobInput, match="sleep duration"):
        make_context().step.sleep("nap", -1)
    assert (ctx.name, ctx.queue, ctx.attempt) == ("unit.test", "default", 1)


def test_wait_for_any_takes_the_first_given_event_and_sleep_until_is_recorded():
    assert race(make_context(race, events={"b": "B", "a": "A"})) == ["a", "A"]
    ctx = make_context(race, events={"b": {"x": 1}})
    assert race(ctx) == ["b", {"x": 1}]
    assert ctx.step.waits == [("first", ("a", "b"), None)]
    assert ctx.step.sleeps == [("until", datetime(2030, 1, 1, tzinfo=UTC))]
    assert race(make_context(race)) is None


def test_each_event_is_delivered_once_per_run():
    def two_waits(ctx):
        return [ctx.step.wait_for_event(n, event="e", timeout=1) for n in ("one", "two")]

    assert two_waits(make_context(events={"e": "payload"})) == ["payload", None]


def test_an_async_job_gets_awaitable_steps():
    ctx = make_context(async_fulfil, events={"go": True})
    assert asyncio.run(async_fulfil(ctx, n=21)) == {"doubled": 42, "got": True}
    assert ctx.step.ran == ["double"]
    assert ctx.step.sleeps == [("pause", timedelta(seconds=5))]
    assert make_context(asynchronous=True).step.__class__.__name__ == "AsyncMemorySteps"


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [
        ({"attempt": 0}, InvalidJobInput, "attempt must be an integer >= 1"),
        ({"attempt": True}, InvalidJobInput, "attempt must be"),
        ({"max_attempts": "3"}, InvalidJobInput, "max_attempts must be"),
        ({"job_id": ""}, InvalidJobInput, "job_id"),
        ({"tenant_id": 5}, InvalidJobInput, "tenant_id"),
        ({"events": {"bad name": 1}}, InvalidJobInput, "event name"),
        ({"events": {"e": object()}}, InvalidJobInput, "payload of event 'e'"),
        ({"previous": object()}, InvalidJobInput, "previous must be a context"),
        ({"job": "testkit.nope"}, UnknownJob, r"testkit\.nope"),
        ({"job": 42}, InvalidJobInput, "registered job"),
    ],
)
def test_make_context_refuses_bad_arguments_clearly(kwargs, error, fragment):
    with pytest.raises(error, match=fragment):
        make_context(**kwargs)
