"""``make_context()``: a :class:`~django_xjobs.context.JobContext` for calling a job function in
a plain unit test, without a worker or a database::

    def test_fulfil_charges_once():
        ctx = make_context(fulfil, events={"order.paid": {"amount": 10}})
        assert fulfil(ctx, order_id=7) == "shipped"
        assert ctx.step.ran == ["charge", "ship"]

``ctx.step`` is the real :class:`~django_xjobs.steps.Steps` (the same name rules, JSON round
trip of outputs and replay of completed steps) over a step store kept in memory
(:class:`MemoryStepStore`) instead of ``x_job_steps``:

* ``run(name, fn)`` calls ``fn`` once per context and returns its output as JSON gives it back
  (a tuple becomes a list); a step a ``previous`` context completed is replayed, not called;
* ``sleep`` / ``sleep_until`` return at once, recorded in ``ctx.step.sleeps``;
* ``wait_for_event`` / ``wait_for_any`` return the payload given in ``events`` for that event
  name (whatever the correlation key), or ``None``, a timeout, when ``events`` has none; each
  event is published once, so a second wait for it in one run times out. Recorded in
  ``ctx.step.waits``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

from .. import conf, registry, values
from ..context import JobContext
from ..exceptions import InvalidJobInput
from ..records import Claim, EventRecord, ParkedStep, RunOwner, StepRecord
from ..steps import AsyncSteps, Steps, _event_name
from .rows import job_name

DEFAULT_NAME = "unit.test"


class MemoryStepStore:
    """The step operations of the engine seam (``steps_of_run``, ``step_complete_if_owned``,
    ``step_park_if_owned``, ``event_next``, ...) on a dict, for one job run: what
    :class:`~django_xjobs.steps.Steps` needs, and nothing else. Every wait it opens is due at
    once, so a sleep never suspends and an event wait without its event ends as a timeout."""

    def __init__(self, *, events: Mapping[str, Any],
                 records: Mapping[str, StepRecord] | None = None) -> None:
        self.records: dict[str, StepRecord] = dict(records or {})
        self.ran: list[str] = []
        self.sleeps: list[tuple[str, timedelta | datetime]] = []
        self.waits: list[tuple[str, tuple[str, ...], str | None]] = []
        self._parked: set[str] = set()
        self._published = datetime.now(UTC)
        # Event ids in the order the test gave them: the cursor of a run moves past an event it
        # consumed, so each is delivered once.
        self._events = {name: (n, payload) for n, (name, payload)
                        in enumerate(events.items(), start=1)}

    # ---- the engine methods Steps calls ----
    def steps_of_run(self, run_id: str) -> list[StepRecord]:
        return list(self.records.values())

    def atomic(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def in_transaction(self) -> bool:
        return False

    def step_complete_if_owned(self, owner: RunOwner, name: str, output_json: str | None, *,
                               event: str | None = None, correlation_key: str | None = None,
                               event_id: int | None = None,
                               event_published_at: datetime | None = None,
                               kind: str = "run") -> bool:
        if name not in self._parked:
            self.ran.append(name)
        self.records[name] = StepRecord(
            name=name, status="completed",
            output=values.decode_json(output_json) if output_json is not None else None,
            attempts=1, error=None, started_at=self._published, completed_at=self._published,
            wake_at=None, event=event, correlation_key=correlation_key, event_id=event_id,
            event_published_at=event_published_at, kind=kind,
        )
        return True

    def step_fail_if_owned(self, owner: RunOwner, name: str, error: str) -> int:
        self.ran.append(name)
        previous = self.records.get(name)
        attempts = (previous.attempts if previous is not None else 0) + 1
        self.records[name] = StepRecord(
            name=name, status="failed", output=None, attempts=attempts, error=error,
            started_at=self._published, completed_at=None, wake_at=None, event=None,
            correlation_key=None, event_id=None, event_published_at=None, kind="run",
        )
        return attempts

    def step_park_if_owned(self, owner: RunOwner, name: str, *, status: str,
                           wake_at: datetime | None = None, duration_ms: int = 0,
                           event: str | None = None,
                           correlation_key: str | None = None,
                           kind: str | None = None) -> ParkedStep:
        self._parked.add(name)
        if status == "sleeping":
            self.sleeps.append((name, wake_at if wake_at is not None
                                else timedelta(milliseconds=duration_ms)))
        elif "#" in name:  # one of wait_for_any's per-event rows
            main, events, key = self.waits[-1]
            self.waits[-1] = (main, (*events, name.split("#", 1)[1]), key)
        else:
            self.waits.append((name, (event,) if event is not None else (), correlation_key))
        now = datetime.now(UTC)
        return ParkedStep(started_at=now, wake_at=wake_at or now, due=True)

    def step_cancel_siblings(self, owner: RunOwner, prefix: str) -> None:
        return None

    def event_lock(self, names: Sequence[str]) -> None:
        return None

    def event_next(self, names: Sequence[str], correlation_key: str | None, after_at: datetime,
                   after_id: int) -> EventRecord | None:
        for name in names:
            found = self._events.get(name)
            if found is not None and found[0] > after_id:
                return EventRecord(id=found[0], name=name, payload=found[1],
                                   correlation_key=correlation_key,
                                   published_at=self._published)
        return None


class MemorySteps(Steps):
    """``ctx.step`` of :func:`make_context` (sync jobs): the real steps over a
    ``MemoryStepStore``, with what they did to read back."""

    def __init__(self, ctx: JobContext, store: MemoryStepStore) -> None:
        super().__init__(store, RunOwner(claim=Claim(job_id=ctx.job_id, lease_token=""),
                                         run_id=ctx.run_id),
                         ctx)
        self.store = store

    @property
    def completed(self) -> dict[str, Any]:
        """Step name -> output of every completed step (a wait's is its payload, or None)."""
        return {name: r.output for name, r in self.store.records.items()
                if r.status == "completed"}

    @property
    def ran(self) -> list[str]:
        """The ``run`` steps whose function this context called, in order (replays excluded)."""
        return list(self.store.ran)

    @property
    def sleeps(self) -> list[tuple[str, timedelta | datetime]]:
        """(name, duration) of each ``sleep``, (name, moment) of each ``sleep_until``."""
        return list(self.store.sleeps)

    @property
    def waits(self) -> list[tuple[str, tuple[str, ...], str | None]]:
        """(name, event names, correlation key) of each event wait."""
        return list(self.store.waits)


class AsyncMemorySteps(AsyncSteps):
    """``ctx.step`` of :func:`make_context` for an ``async def`` job: awaitable steps, the same
    read-back as :class:`MemorySteps`."""

    def __init__(self, steps: MemorySteps) -> None:
        super().__init__(steps)
        self.store = steps.store
        self.memory = steps

    completed = property(lambda self: self.memory.completed)
    ran = property(lambda self: self.memory.ran)
    sleeps = property(lambda self: self.memory.sleeps)
    waits = property(lambda self: self.memory.waits)


def make_context(job: Any = None, *, job_id: str | None = None, run_id: str | None = None,
                 attempt: int | None = None, max_attempts: int | None = None,
                 tenant_id: str | None = None, events: Mapping[str, Any] | None = None,
                 previous: JobContext | None = None,
                 asynchronous: bool | None = None) -> JobContext:
    """A context to call a job function with directly: ``my_job(make_context(my_job), **input)``.

    ``job`` (a registered job or its name; optional) gives the name, queue, ``max_attempts``
    and whether the steps are awaitable. ``events`` maps event names to the payloads that
    event waits receive. ``previous``, a context made here, makes this one the next run of
    the same job: same ids, its completed steps replayed, ``attempt`` one more (pass
    ``attempt`` for a resume after a sleep, which does not count one).
    """
    definition = registry.get(job_name(job)) if job is not None else None
    earlier = _memory_of(previous) if previous is not None else None
    attempt = attempt if attempt is not None else (
        previous.attempt + 1 if previous is not None else 1)
    if max_attempts is None:
        max_attempts = (previous.max_attempts if previous is not None else None) or (
            definition.max_attempts if definition is not None else None) or (
            conf.get().max_attempts)
    for what, value in (("attempt", attempt), ("max_attempts", max_attempts)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidJobInput(f"{what} must be an integer >= 1, got {value!r}")
    for what, text in (("job_id", job_id), ("run_id", run_id), ("tenant_id", tenant_id)):
        if text is not None:
            values.check_text(what, text)
    payloads: dict[str, Any] = {}
    for name, payload in (events or {}).items():
        _event_name(name)
        # What a real wait returns: the payload as stored (JSON), so tuples become lists.
        payloads[name] = values.decode_json(values.encode_json(
            payload, what=f"payload of event {name!r}", limit=None))
    if asynchronous is None:
        asynchronous = definition.is_async if definition is not None else False
    ctx = JobContext(
        job_id=job_id or (previous.job_id if previous is not None else str(uuid4())),
        run_id=run_id or (previous.run_id if previous is not None else str(uuid4())),
        name=previous.name if previous is not None else (
            definition.name if definition is not None else DEFAULT_NAME),
        queue=previous.queue if previous is not None else (
            definition.queue if definition is not None else "default"),
        attempt=attempt, max_attempts=max_attempts,
        tenant_id=tenant_id if tenant_id is not None else (
            previous.tenant_id if previous is not None else None),
        traceparent=None,
    )
    kept = {} if earlier is None else {
        name: r for name, r in earlier.store.records.items() if r.status == "completed"}
    store = MemoryStepStore(events=payloads, records=kept)
    steps = MemorySteps(ctx, store)
    ctx.step_factory = (lambda c: AsyncMemorySteps(steps)) if asynchronous else (
        lambda c: steps)
    return ctx


def _memory_of(ctx: JobContext) -> MemorySteps:
    step = ctx.step if isinstance(ctx, JobContext) and ctx.step_factory is not None else None
    memory = step.memory if isinstance(step, AsyncMemorySteps) else step
    if not isinstance(memory, MemorySteps):
        raise InvalidJobInput(
            f"previous must be a context made by make_context(), got {values.safe_repr(ctx)}"
        )
    return memory
