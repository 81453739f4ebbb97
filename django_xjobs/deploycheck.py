"""The deploy check: would the code now installed take the path each waiting durable run
recorded? (``manage.py xjobs check-deploy``; docs/durable.md, "The deploy check".)

A durable run is a replay: when it wakes up, its code runs again from the top and every step
it completed hands back its recorded outcome. New code that reaches a different step first
(a renamed, moved, added or removed step, a ``run`` turned into a ``sleep``) would, on the
next wake-up, re-run or skip work the run already did. The check finds those runs before the
deploy, without waking them:

1. Read the runs that wait: jobs ``suspended``, and ``blocked`` ones whose resume flow control
   holds back (``blocked_resume``), that recorded at least one step; and each run's steps in
   the order it recorded them (wait_for_any's per-event rows left out).
2. Call the job's function as the worker would (same input, a ``JobContext`` of the run),
   with a ``ctx.step`` that replays the record instead of touching it
   (:class:`ReplaySteps`). The i-th step the code reaches is compared with the i-th recorded
   step, by name and kind (run, sleep, event, event_any, invoke):

   * same, and the record completed: its outcome is handed back (``run`` never calls ``fn``;
     a sleep returns; a wait returns its payload or ``None``; ``invoke`` / ``gather`` their
     children's results, or raise ``ChildFailed`` again) and the code goes on;
   * same, and the record did not complete (sleeping, waiting, invoking: where the run waits
     now, or a step that failed and runs again): the path matches up to where the run is;
     the replay ends there;
   * a step beyond the record: nothing left to compare; the replay ends, the path matches;
   * different name or kind: the run diverges at that step.

   The code returning before it reached every recorded step diverges ("returned before
   reaching it"), and so does an exception escaping the code (its own, or a step API's, e.g.
   ``StepNameReused``), except ``ChildFailed`` replayed from the record: the run fails that
   way with any code.
3. Nothing of the replay persists: the code between steps runs for real (that is what is
   checked), inside a transaction on the jobs' database (and on ``default``) that is rolled
   back, so its database writes and enqueues vanish; no step is written and no job changes.

The replay ends by raising :class:`_ReplayOver`, a BaseException, so ``except Exception`` in
job code does not swallow it; code that swallows even that cannot change the verdict, which
the first stop recorded.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from asgiref.sync import async_to_sync
from django.db import DEFAULT_DB_ALIAS, transaction

from . import registry
from .context import JobContext
from .engines import get_engine
from .exceptions import ChildFailed, InvalidJobInput
from .records import JobRecord, StepRecord
from .steps import EventWon, _aware, _children_outcome, _event_name, use_step_name
from .values import check_text, milliseconds_of

KINDS = ("run", "sleep", "event", "event_any", "invoke")
# Runs read per statement while paging through them.
PAGE = 500


# ------------------------------------------------------------------------------ verdicts --


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """What the replay of one run found. ``diverges`` False: the code reaches the recorded
    steps in order, with their kinds. Otherwise ``reason`` says where and how, and, when a
    recorded step is to blame, ``position`` (1-based, in recorded order), ``expected`` /
    ``expected_kind`` (the record's) and ``reached`` / ``reached_kind`` (the code's step,
    None when it returned or raised instead)."""

    job_id: str
    name: str
    run_id: str
    state: str
    recorded: int  # steps the run recorded (what the code was compared with)
    diverges: bool
    reason: str | None = None
    position: int | None = None
    expected: str | None = None
    expected_kind: str | None = None
    reached: str | None = None
    reached_kind: str | None = None


@dataclass(frozen=True, slots=True)
class Recorded:
    """A recorded step as the replay compares it: ``kinds`` is the row's kind, or the kinds a
    row written before kinds were recorded may be (:func:`recorded_kinds`)."""

    record: StepRecord
    kinds: tuple[str, ...]

    @property
    def kind_text(self) -> str:
        return " or ".join(self.kinds)


def recorded_kinds(record: StepRecord) -> tuple[str, ...]:
    """The kind of a step row; for a row without one (written before kinds were recorded),
    the kinds its other columns allow: an event names an event wait (wait_for_any's main row
    also records the event that won); a sleeping row is a sleep and a waiting row without an
    event is wait_for_any's; a completed row with a wake-up time and no event is a sleep or
    a wait that timed out; anything else ran a function."""
    if record.kind is not None:
        return (record.kind,)
    if record.status == "invoking":
        return ("invoke",)
    if record.event is not None:
        return ("event", "event_any")
    if record.status == "sleeping":
        return ("sleep",)
    if record.status == "waiting":
        return ("event_any",)
    if record.wake_at is not None:
        return ("sleep", "event", "event_any")
    return ("run",)


# -------------------------------------------------------------------------------- replay --


class _ReplayOver(BaseException):
    """Ends a replay from inside the job's code (a BaseException: ``except Exception`` in the
    code must not swallow it)."""


class ReplaySteps:
    """``ctx.step`` of a replayed run: the step API of :class:`~django_xjobs.steps.Steps`
    (same names, same name rules), answered from the run's record; it writes nothing."""

    def __init__(self, recorded: Sequence[Recorded]) -> None:
        self._recorded = list(recorded)
        self._position = 0  # recorded steps reached so far
        self._used: set[str] = set()
        # Set by the first stop: the verdict's fields, or {} when the path matched.
        self.stopped: dict[str, Any] | None = None
        self.replayed_failure: ChildFailed | None = None

    @property
    def position(self) -> int:
        return self._position

    # ---- plumbing ----
    def _stop(self, **verdict: Any) -> _ReplayOver:
        if self.stopped is None:
            self.stopped = verdict
        return _ReplayOver()

    def _reach(self, name: Any, kind: str) -> StepRecord:
        """The code reached step ``name`` of ``kind``: its completed record to replay, or the
        end of the replay (matched, or diverged)."""
        if self.stopped is not None:  # the code swallowed the end and went on
            raise _ReplayOver()
        # The rules of a worker's steps: new code breaking them fails as it would there.
        use_step_name(name, self._used)
        if self._position >= len(self._recorded):
            raise self._stop()  # beyond the record: nothing more to compare
        expected = self._recorded[self._position]
        if expected.record.name != name or kind not in expected.kinds:
            raise self._stop(
                position=self._position + 1, expected=expected.record.name,
                expected_kind=expected.kind_text, reached=name, reached_kind=kind,
                reason=(f"step {self._position + 1}: recorded {expected.record.name!r} "
                        f"({expected.kind_text}), the code reached {name!r} ({kind})"),
            )
        self._position += 1
        if expected.record.status != "completed":
            raise self._stop()  # where the run waits now: the path matches up to here
        return expected.record

    # ---- the step API ----
    def run(self, name: str, fn: Callable[[], Any]) -> Any:
        return self._reach(name, "run").output

    def sleep(self, name: str, duration: timedelta | float | int) -> None:
        milliseconds_of(duration, "sleep duration")
        self._reach(name, "sleep")

    def sleep_until(self, name: str, when: datetime) -> None:
        _aware(when, "sleep_until")
        self._reach(name, "sleep")

    def wait_for_event(self, name: str, *, event: str, correlation_key: str | None = None,
                       timeout: timedelta | float | int) -> Any:
        self._check_wait([event], correlation_key, timeout)
        record = self._reach(name, "event")
        return None if record.event_id is None else record.output

    def wait_for_any(self, name: str, *, events: Sequence[str],
                     correlation_key: str | None = None,
                     timeout: timedelta | float | int) -> EventWon | None:
        if isinstance(events, str) or not events:
            raise InvalidJobInput("wait_for_any needs a non-empty list of event names")
        self._check_wait(list(events), correlation_key, timeout)
        record = self._reach(name, "event_any")
        if record.event_id is None:  # the wait timed out
            return None
        output = record.output
        if isinstance(output, dict) and set(output) == {"event", "payload"}:
            return EventWon(event=output["event"], payload=output["payload"])
        return EventWon(event=record.event or "", payload=output)

    def invoke(self, name: str, job: Any, input: Any = None, *, timeout: Any = None,
               **options: Any) -> Any:
        results = self._children(self._reach(name, "invoke"))
        if not results:
            raise InvalidJobInput(f"invoke {name!r}: its record holds no child's result")
        return results[0]

    def gather(self, name: str, calls: Any, *, timeout: Any = None) -> list[Any]:
        if isinstance(calls, str | bytes | Mapping) or not isinstance(calls, Iterable):
            raise InvalidJobInput(f"ctx.step.gather({name!r}): expected a list of (job, input) "
                                  "pairs")
        return self._children(self._reach(name, "invoke"))

    @staticmethod
    def _check_wait(events: list[str], correlation_key: str | None,
                    timeout: timedelta | float | int) -> None:
        for event in events:
            _event_name(event)
        if correlation_key is not None:
            check_text("correlation_key", correlation_key)
        milliseconds_of(timeout, "timeout")

    def _children(self, record: StepRecord) -> list[Any]:
        """The results a completed invoke step recorded, or its ChildFailed raised again, as
        a worker's replay does (``steps._children_outcome``)."""
        output = record.output if isinstance(record.output, dict) else {}
        if not (isinstance(output.get("failed"), dict) or isinstance(output.get("results"), list)):
            raise InvalidJobInput(f"step {record.name!r}: its record holds no children's "
                                  "outcome")
        try:
            return _children_outcome(record.name, record.output)
        except ChildFailed as exc:
            self.replayed_failure = exc
            raise


class AsyncReplaySteps:
    """``ctx.step`` of a replayed ``async def`` job: :class:`ReplaySteps`, awaitable. Nothing
    is read or written, so nothing runs in a thread."""

    def __init__(self, steps: ReplaySteps) -> None:
        self._steps = steps

    async def run(self, name: str, fn: Callable[[], Any]) -> Any:
        return self._steps.run(name, fn)

    async def sleep(self, name: str, duration: timedelta | float | int) -> None:
        self._steps.sleep(name, duration)

    async def sleep_until(self, name: str, when: datetime) -> None:
        self._steps.sleep_until(name, when)

    async def wait_for_event(self, name: str, *, event: str, correlation_key: str | None = None,
                             timeout: timedelta | float | int) -> Any:
        return self._steps.wait_for_event(name, event=event, correlation_key=correlation_key,
                                          timeout=timeout)

    async def wait_for_any(self, name: str, *, events: Sequence[str],
                           correlation_key: str | None = None,
                           timeout: timedelta | float | int) -> EventWon | None:
        return self._steps.wait_for_any(name, events=events, correlation_key=correlation_key,
                                        timeout=timeout)

    async def invoke(self, name: str, job: Any, input: Any = None, *, timeout: Any = None,
                     **options: Any) -> Any:
        return self._steps.invoke(name, job, input, timeout=timeout, **options)

    async def gather(self, name: str, calls: Any, *, timeout: Any = None) -> list[Any]:
        return self._steps.gather(name, calls, timeout=timeout)


def _error_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def replay(job: JobRecord, steps: Sequence[StepRecord]) -> Verdict:
    """Replay one run's code against its recorded ``steps`` (in recorded order). The caller
    provides the rolled-back transaction (:func:`_replay_rolled_back`)."""
    recorded = [Recorded(s, recorded_kinds(s)) for s in steps]
    matched = Verdict(job_id=str(job.id), name=job.name, run_id=str(job.run_id),
                      state=job.state, recorded=len(recorded), diverges=False)
    definition = registry.lookup(job.name)
    if definition is None:
        return replace(matched, diverges=True, reason=(
            f"job no longer exists: no job named {job.name!r} is registered"))
    if job.input_error is not None or not isinstance(job.input, dict):
        problem = job.input_error or f"it is a {type(job.input).__name__}, not a JSON object"
        return replace(matched, diverges=True,
                       reason=f"its stored input cannot be passed to the code: {problem}")
    ctx = JobContext(job_id=str(job.id), run_id=str(job.run_id), name=job.name,
                     queue=job.queue, attempt=max(job.attempt, 1),
                     max_attempts=job.max_attempts, tenant_id=job.tenant_id, traceparent=None)
    replayer = ReplaySteps(recorded)
    ctx.step_factory = ((lambda c: AsyncReplaySteps(replayer)) if definition.is_async
                        else (lambda c: replayer))
    raised: BaseException | None = None
    try:
        if definition.is_async:
            async_to_sync(_call_async)(definition.func, ctx, job.input)
        else:
            definition.func(ctx, **job.input)
    except _ReplayOver:
        pass
    except KeyboardInterrupt:  # the operator's, not the code's
        raise
    except BaseException as exc:  # the code's own, SystemExit included: reported
        raised = exc
    if replayer.stopped is not None:
        return replace(matched, diverges=bool(replayer.stopped), **replayer.stopped)
    position = replayer.position
    missing = recorded[position] if position < len(recorded) else None
    if raised is not None and raised is replayer.replayed_failure and missing is None:
        return matched
    if raised is None and missing is None:
        return matched
    if missing is None:
        assert raised is not None
        return replace(matched, diverges=True, reason=(
            f"after the last recorded step the code raised {_error_line(raised)}"))
    what = ("returned before reaching it" if raised is None
            else f"raised {_error_line(raised)} before reaching it")
    return replace(matched, diverges=True, position=position + 1,
                   expected=missing.record.name, expected_kind=missing.kind_text,
                   reason=(f"step {position + 1}: recorded {missing.record.name!r} "
                           f"({missing.kind_text}), the code {what}"))


async def _call_async(func: Callable[..., Any], ctx: JobContext, input: dict[str, Any]) -> Any:
    value = func(ctx, **input)
    return await value if inspect.isawaitable(value) else value


# --------------------------------------------------------------------------------- check --


class _RollBack(Exception):
    """Leaves the replay's transactions, rolling them back."""


def _replay_rolled_back(job: JobRecord, steps: Sequence[StepRecord]) -> Verdict:
    """:func:`replay` inside a transaction on the jobs' database and on ``default`` (where
    the code's own models most likely live), rolled back whatever the code did."""
    aliases = dict.fromkeys((get_engine().alias, DEFAULT_DB_ALIAS))
    verdict: Verdict | None = None
    try:
        with ExitStack() as stack:
            for alias in aliases:
                stack.enter_context(transaction.atomic(using=alias))
            verdict = replay(job, steps)
            raise _RollBack
    except _RollBack:
        pass
    assert verdict is not None
    return verdict


def suspended_runs(*, name: str | None = None, limit: int | None = None) -> Iterator[JobRecord]:
    """The runs the check replays (``name``'s only, at most ``limit``), in id order, read a
    page at a time."""
    engine = get_engine()
    after: str | None = None
    left = limit
    while left is None or left > 0:
        size = PAGE if left is None else min(PAGE, left)
        page = engine.runs_suspended_list(name=name, after_id=after, limit=size)
        yield from page
        if len(page) < size:
            return
        after = str(page[-1].id)
        if left is not None:
            left -= len(page)


def check(*, name: str | None = None, limit: int | None = None) -> list[Verdict]:
    """Replay every waiting durable run (``name``'s only, at most ``limit`` of them) against
    the code now installed; one verdict per run, in job id order. Writes nothing."""
    if name is not None:
        check_text("job name", name)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                              or limit < 1):
        raise InvalidJobInput(f"limit must be an integer >= 1, got {limit!r}")
    engine = get_engine()
    verdicts = []
    for job in suspended_runs(name=name, limit=limit):
        try:
            steps = engine.steps_of_run_in_order(str(job.run_id))
        except Exception as exc:  # an output Python cannot decode: that run alone
            verdicts.append(Verdict(job_id=str(job.id), name=job.name, run_id=str(job.run_id),
                                    state=job.state, recorded=0, diverges=True,
                                    reason=f"its steps cannot be read: {_error_line(exc)}"))
            continue
        verdicts.append(_replay_rolled_back(job, steps))
    return verdicts
