"""The deploy check's ``ctx.step`` (``deploycheck.ReplaySteps``): what each step hands back
from a record, and where a replay ends. No database: the records are written here."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from django_xjobs.deploycheck import (
    AsyncReplaySteps,
    Recorded,
    ReplaySteps,
    _ReplayOver,
    recorded_kinds,
)
from django_xjobs.exceptions import ChildFailed, InvalidJobInput, StepNameReused
from django_xjobs.records import StepRecord
from django_xjobs.steps import AsyncSteps, EventWon, Steps

NOW = datetime(2026, 12, 4, tzinfo=UTC)


def step(name: str, kind: str | None, output: Any = None, *, status: str = "completed",
         **columns: Any) -> StepRecord:
    row = {"name": name, "status": status, "output": output, "attempts": 1, "error": None,
           "started_at": NOW, "completed_at": NOW, "wake_at": None, "event": None,
           "correlation_key": None, "event_id": None, "event_published_at": None, "kind": kind,
           **columns}
    return StepRecord(**row)


def replaying(*records: StepRecord) -> ReplaySteps:
    return ReplaySteps([Recorded(r, recorded_kinds(r)) for r in records])


def test_each_completed_step_hands_back_what_it_recorded_and_calls_nothing():
    steps = replaying(
        step("fetch", "run", {"id": 7}),
        step("nap", "sleep", wake_at=NOW),
        step("until", "sleep", wake_at=NOW),
        step("paid", "event", {"amount": 10}, event="order.paid", event_id=3),
        step("late", "event", None, event="order.late", wake_at=NOW),  # timed out
        step("race", "event_any", {"event": "b", "payload": [1]}, event="b", event_id=4),
        step("race2", "event_any", None, wake_at=NOW),  # timed out
        step("child", "invoke", {"children": ["c1"], "results": [{"ok": True}]}),
        step("kids", "invoke", {"children": ["c2", "c3"], "results": [1, None]}),
        step("now", "sleep", status="sleeping", wake_at=NOW),
    )

    def never() -> None:
        raise AssertionError("a replay called a step's function")

    assert steps.run("fetch", never) == {"id": 7}
    assert steps.sleep("nap", timedelta(hours=1)) is None
    assert steps.sleep_until("until", NOW) is None
    assert steps.wait_for_event("paid", event="order.paid", timeout=60) == {"amount": 10}
    assert steps.wait_for_event("late", event="order.late", timeout=60) is None
    assert steps.wait_for_any("race", events=["a", "b"], timeout=60) == EventWon("b", [1])
    assert steps.wait_for_any("race2", events=["a", "b"], timeout=60) is None
    assert steps.invoke("child", "some.job", {"x": 1}) == {"ok": True}
    assert steps.gather("kids", [("some.job", {}), ("some.job", {})]) == [1, None]
    with pytest.raises(_ReplayOver):  # where the run waits: the replay ends, matched
        steps.sleep("now", 5)
    assert steps.stopped == {}
    assert steps.position == 10


def test_a_failed_child_is_raised_again_with_its_details():
    steps = replaying(step("kids", "invoke", {
        "children": ["c1", "c2"],
        "results": [5, None],
        "failed": {"index": 1, "id": "c2", "job": "j", "state": "cancelled", "error": "stop"}}))
    with pytest.raises(ChildFailed) as raised:
        steps.gather("kids", [("j", {}), ("j", {})])
    failure = raised.value
    assert (failure.child_id, failure.state, failure.error, failure.index) == \
        ("c2", "cancelled", "stop", 1)
    assert str(failure) == "child 1 of step 'kids' (j c2) ended cancelled: stop"
    assert steps.replayed_failure is failure


def test_a_different_name_or_kind_stops_the_replay_with_what_differs():
    steps = replaying(step("a", "run"), step("b", "run"))
    assert steps.run("a", lambda: None) is None
    with pytest.raises(_ReplayOver):
        steps.sleep("b", 1)
    assert steps.stopped == {
        "position": 2, "expected": "b", "expected_kind": "run", "reached": "b",
        "reached_kind": "sleep",
        "reason": "step 2: recorded 'b' (run), the code reached 'b' (sleep)"}
    with pytest.raises(_ReplayOver):  # code that swallowed the end: every later step ends it
        steps.run("c", lambda: None)
    assert steps.stopped["expected"] == "b"


def test_a_step_beyond_the_record_ends_the_replay_as_matched():
    steps = replaying(step("a", "run", 1))
    assert steps.run("a", lambda: None) == 1
    with pytest.raises(_ReplayOver):
        steps.run("new", lambda: None)
    assert steps.stopped == {}


def test_the_step_rules_of_a_worker_hold_in_a_replay():
    steps = replaying(step("a", "run"), step("b", "run"))
    steps.run("a", lambda: None)
    with pytest.raises(StepNameReused):
        steps.run("a", lambda: None)
    for bad in ("", "x#y", 7):
        with pytest.raises(InvalidJobInput):
            steps.run(bad, lambda: None)  # type: ignore[arg-type]
    with pytest.raises(InvalidJobInput, match="wait_for_any needs"):
        steps.wait_for_any("b", events="a", timeout=1)
    with pytest.raises(InvalidJobInput):
        steps.sleep_until("b", datetime(2026, 1, 1))  # naive
    with pytest.raises(InvalidJobInput, match="expected a list of"):
        steps.gather("b", "not a list")


def test_the_async_steps_await_the_same_replay():
    steps = replaying(step("a", "run", {"n": 1}), step("kids", "invoke", {"results": [3]}),
                      step("nap", "sleep", status="sleeping"))
    replay = AsyncReplaySteps(steps)

    async def code() -> list[Any]:
        got = [await replay.run("a", lambda: None), await replay.invoke("kids", "j")]
        await replay.sleep("nap", 1)
        return got

    with pytest.raises(_ReplayOver):
        asyncio.run(code())
    assert steps.stopped == {} and steps.position == 3


def test_the_replay_offers_every_step_of_a_worker():
    # A step method added to Steps must be replayed too, or the check would report every run
    # that uses it as raising AttributeError.
    def public(cls: type) -> set[str]:
        return {n for n in vars(cls) if not n.startswith("_") and callable(getattr(cls, n))}

    assert public(Steps) <= public(ReplaySteps)
    assert public(AsyncSteps) <= public(AsyncReplaySteps)
    assert {"invoke", "gather"} <= public(ReplaySteps) & public(AsyncReplaySteps)
