"""Durable steps and events: ``ctx.step.run / sleep / sleep_until / wait_for_event /
wait_for_any`` and :func:`publish_event`.

A job's code is re-run from the top after every retry, crash or wake-up; its steps make that
cheap and correct. The rows of ``x_job_steps`` are keyed by the job's ``run_id``, which a job
keeps across retries, so:

* ``run(name, fn)``: a step that completed returns its stored output and ``fn`` is not called
  again. A step that raises is recorded ``failed`` and the job fails (and retries by its
  policy); the step runs again on the next attempt. So does a step whose output is larger than
  ``XJOBS["MAX_PAYLOAD_BYTES"]`` (:class:`StepOutputTooLarge`).
* ``sleep(name, d)``: the first time, the step records its ``wake_at`` and the job is suspended
  (``state = suspended``, ``run_at = wake_at``) in one transaction; the worker's thread is free
  at once. When due, the job is claimed again (a resume spends no attempt), the step completes
  and the code continues past it.
* ``wait_for_event(name, event=..., correlation_key=..., timeout=...)``: the payload of the
  earliest matching event published at or after the step started, or after the event this run
  consumed last from the same names; ``None`` after the timeout.

The event protocol (why no event is ever missed). A waiter and a publisher of one event name
meet under a transaction-scoped advisory lock on that name (``event_lock``):

=====================================  ===============================================
waiter, one transaction                publisher, one transaction (the caller's)
=====================================  ===============================================
lock(name)                             lock(name)
register the wait (started_at =        insert the event (published_at =
  clock time under the lock)             clock time under the lock)
look for an event after the cursor     make suspended jobs waiting for it due now,
found: complete the step; else           NOTIFY their queues
  suspend the job until the timeout
commit (releases the lock)             commit (releases the lock)
=====================================  ===============================================

Whichever takes the lock second sees what the first committed: a publisher that comes second
finds the waiter suspended and wakes it; a waiter that comes second finds the event. Both
timestamps are taken under the lock, so publication order and lock order agree. The pinning
test injects a publish between a waiter's check and its suspension
(tests/integration/test_steps.py::test_an_event_published_between_the_check_and_the_suspend_is_not_missed).
Publishers should run under READ COMMITTED (Django's default): under REPEATABLE READ the wake-up
statement would not see a suspension committed after the publisher's snapshot, and the waiter
would only find the event at its timeout.

Before ``fn`` is called the run proves it still holds its lease (``JobContext.prove_lease``:
its last renewal is younger than the lease minus a margin, on the worker's monotonic clock;
docs/guarantees.md). A worker paused past its lease, whose job another worker took over and
carried further, does not start the next step's body when it resumes: the proof fails, the run
stops and the job is handed back.

Every step write is fenced on the job's ownership (id, running, lease token): a run that lost
its lease records nothing, and learns it as :class:`~django_xjobs.exceptions.JobCancelled`.
A run that holds a concurrency slot (``slots.py``) also passes its worker's ``guard``, called
before each step write: a run that can no longer prove it holds its slot records nothing either
(:class:`~django_xjobs.exceptions.SlotLost`), since a stored output is replayed by later runs.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar
from uuid import UUID

from . import conf, faults
from .context import busy_pause, in_thread, until_free
from .engines import get_engine
from .exceptions import (
    ChildFailed,
    InvalidJobInput,
    JobCancelled,
    PayloadTooLarge,
    RowBusy,
    StepNameReused,
    StepOutputError,
    StepOutputTooLarge,
    StepSuspended,
    SuspendInTransaction,
)
from .records import (
    LIVE_STATES,
    ChildState,
    EnqueueParams,
    EventRecord,
    RunOwner,
    StepRecord,
    Suspension,
)
from .values import (
    check_name,
    check_text,
    decode_json,
    encode_json,
    error_line,
    format_error,
    milliseconds_of,
)

DEFAULT_EVENT_TTL = timedelta(days=7)

T = TypeVar("T")
MAX_STEP_NAME = 200


@dataclass(frozen=True, slots=True)
class EventWon:
    """What ``wait_for_any`` returns: which event arrived first, and its payload."""

    event: str
    payload: Any


def use_step_name(name: Any, used: set[str]) -> None:
    """A step name's rules (the replay of the deploy check follows them too): a non-empty
    string without '#', not used before in the run (``used``, which it joins)."""
    if not isinstance(name, str) or not name or len(name) > MAX_STEP_NAME or "#" in name:
        raise InvalidJobInput(
            f"step name must be a non-empty string of at most {MAX_STEP_NAME} characters "
            f"without '#', got {name!r}"
        )
    if name in used:
        raise StepNameReused(
            f"step name {name!r} is used twice in one run; give every step its own name"
        )
    used.add(name)


def _aware(value: Any, what: str) -> datetime:
    if not isinstance(value, datetime) or value.tzinfo is None or value.utcoffset() is None:
        raise InvalidJobInput(f"{what} must be an aware datetime, got {value!r}")
    return value


class Steps:
    """``ctx.step`` of a sync job (see the module docstring)."""

    def __init__(self, engine: Any, owner: RunOwner, ctx: Any,
                 on_park: Callable[[], None] | None = None,
                 guard: Callable[[], None] | None = None,
                 child_params: Callable[..., EnqueueParams] | None = None) -> None:
        self._engine = engine
        self._owner = owner
        self._ctx = ctx
        self._on_park = on_park
        # Validates a child of invoke / gather into what to insert (base.child_params; it sits
        # above this module, which cannot import the enqueue API).
        self._child_params = child_params
        # Raises before a step write the run may no longer make (a lapsed concurrency slot).
        self._guard = guard
        self._records: dict[str, StepRecord] | None = None
        self._used: set[str] = set()
        # Inside one of this class's own transactions (a sleep's, an invoke's, a wait's): a
        # write that finds the job's row held (RowBusy) rolls the whole block back and the
        # block is tried again; outside one, the write alone is (docs/design.md, "Lock order").
        self._in_block = False

    # --------------------------------------------------------------------- plumbing --
    def _begin(self, name: Any) -> StepRecord | None:
        """Every step boundary: stop if asked to, refuse a reused name, return its record."""
        self._ctx.check_cancelled()
        use_step_name(name, self._used)
        if self._records is None:
            self._records = {r.name: r for r in self._engine.steps_of_run(self._owner.run_id)}
        return self._records.get(name)

    def _lost(self, what: str) -> JobCancelled:
        return JobCancelled(f"{what}: this run no longer owns the job (lease lost or cancelled)")

    def _until_free(self, write: Callable[[], T]) -> T:
        """``write`` (a step write, or a whole block of this class's) again while the job's row
        is held by another transaction: the run polls for its own row, never in PostgreSQL's
        lock queue, and only this run waits. Inside a block, RowBusy goes up to the block."""
        if self._in_block:
            return write()
        return until_free(write, self._ctx.cancelled, self._ctx.check_cancelled)

    def _block(self, body: Callable[[], T]) -> T:
        """``body`` in one transaction of this class's own, tried again as a whole while a
        write in it finds the job's row held by another transaction."""
        def attempt() -> T:
            self._in_block = True
            try:
                with self._engine.atomic():
                    return body()
            finally:
                self._in_block = False
        return until_free(attempt, self._ctx.cancelled, self._ctx.check_cancelled)

    def _complete(self, name: str, output_json: str | None, **event: Any) -> None:
        # ``event`` also carries the step's ``kind`` when it is not a run
        if self._guard is not None:
            self._guard()
        if not self._until_free(lambda: self._engine.step_complete_if_owned(
                self._owner, name, output_json, **event)):
            raise self._lost(f"step {name!r} not recorded")

    def _refuse_in_transaction(self, what: str) -> None:
        if self._engine.in_transaction():
            raise SuspendInTransaction(
                f"{what} was called inside transaction.atomic(): suspending the job unwinds "
                "that block, which would roll the suspension back. Commit first: call it "
                "outside the atomic block (steps before it keep their recorded outputs)."
            )

    def _park(self, wake_at: datetime) -> StepSuspended:
        """Suspend the job (inside the caller's transaction); the signal that unwinds it."""
        if self._on_park is not None:
            self._on_park()
        report = self._engine.job_suspend_if_owned(
            Suspension(claim=self._owner.claim, wake_at=wake_at))
        if self._owner.claim.lease_token in report.busy:
            raise RowBusy("job not suspended: its row is held by another transaction")
        if self._owner.claim.lease_token not in report.owned:
            raise self._lost("job not suspended")
        return StepSuspended(wake_at)

    # ------------------------------------------------------------------------- run --
    def run(self, name: str, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` once per job run and return its (JSON) output; later runs replay it."""
        record = self._lookup(name)
        if record is not None:
            return record.output
        self._ctx.prove_lease()
        try:
            value = fn()
        except (JobCancelled, StepSuspended):
            raise
        except Exception as exc:
            self._record_failure(name, exc)
            raise
        return self._record_output(name, value)

    def _lookup(self, name: str) -> StepRecord | None:
        """The completed record of ``name``, or None when the step must run."""
        record = self._begin(name)
        return record if record is not None and record.status == "completed" else None

    def _record_failure(self, name: str, exc: BaseException) -> None:
        if self._guard is not None:
            self._guard()
        error = format_error(exc)
        if self._until_free(lambda: self._engine.step_fail_if_owned(
                self._owner, name, error)) is None:
            raise self._lost(f"step {name!r} failure not recorded") from exc

    def _record_output(self, name: str, value: Any) -> Any:
        try:
            text = encode_json(value, what=f"output of step {name!r}",
                               limit=conf.get().max_payload_bytes)
        except PayloadTooLarge as exc:
            error = StepOutputTooLarge(
                f"{exc}: the output is not stored; store large data elsewhere and return a "
                "reference to it")
            self._record_failure(name, error)
            raise error from None
        except InvalidJobInput as exc:
            raise StepOutputError(str(exc)) from None
        self._complete(name, text)
        # Return what a replay returns (tuples become lists, typed values their base class,
        # ...): the same code sees the same value on every run.
        return decode_json(text)

    # ----------------------------------------------------------------------- sleep --
    def sleep(self, name: str, duration: timedelta | float | int) -> None:
        """Suspend the job for ``duration`` (once per run; later runs pass straight on)."""
        self._sleep(name, duration_ms=milliseconds_of(duration, "sleep duration"), wake_at=None)

    def sleep_until(self, name: str, when: datetime) -> None:
        """Suspend the job until ``when`` (an aware datetime)."""
        self._sleep(name, duration_ms=0, wake_at=_aware(when, "sleep_until"))

    def _sleep(self, name: str, *, duration_ms: int, wake_at: datetime | None) -> None:
        record = self._begin(name)
        if record is not None and record.status == "completed":
            return
        self._refuse_in_transaction(f"ctx.step.sleep({name!r})")
        if self._guard is not None:
            self._guard()

        def block() -> StepSuspended | None:
            parked = self._engine.step_park_if_owned(
                self._owner, name, status="sleeping", wake_at=wake_at, duration_ms=duration_ms,
                kind="sleep",
            )
            if parked is None:
                raise self._lost(f"sleep {name!r} not recorded")
            if parked.due:
                self._complete(name, None)
                return None
            return self._park(parked.wake_at)

        signal = self._block(block)
        if signal is not None:
            raise signal

    # -------------------------------------------------------------------- children --
    def invoke(self, name: str, job: Any, input: Mapping[str, Any] | None = None, *,
               timeout: timedelta | float | int | None = None, **options: Any) -> Any:
        """Enqueue ``job`` as a child of this run (once: the step is memoised), suspend until
        it finishes, and return its result; :class:`~django_xjobs.exceptions.ChildFailed` when it
        ended dead or cancelled, or ``timeout`` passed first. ``options`` are enqueue options
        (``queue``, ``tenant_id``, ``priority``, ...); tenant and trace default to this job's."""
        return self._children(name, [(job, input, options)], timeout,
                              what=f"ctx.step.invoke({name!r})")[0]

    def gather(self, name: str, calls: Iterable[Sequence[Any]], *,
               timeout: timedelta | float | int | None = None) -> list[Any]:
        """Fan out: enqueue every ``(job, input)`` or ``(job, input, options)`` of ``calls`` as
        children, suspend until all finished, return their results in the order of ``calls``
        (fan-in). :class:`~django_xjobs.exceptions.ChildFailed` names the first child, in that
        order, that failed."""
        return self._children(name, calls, timeout, what=f"ctx.step.gather({name!r})")

    def _children(self, name: str, calls: Iterable[Sequence[Any]],
                  timeout: timedelta | float | int | None, *, what: str) -> list[Any]:
        record = self._begin(name)
        if record is not None and record.status == "completed":
            return _children_outcome(name, record.output)
        self._refuse_in_transaction(what)
        timeout_ms = None
        params = None
        if record is None:  # a new step: its timeout and children are validated, then written
            timeout_ms = None if timeout is None else milliseconds_of(timeout, "timeout")
            if timeout_ms is not None and timeout_ms <= 0:
                raise InvalidJobInput(f"{what}: timeout must be greater than zero")
            params = self._child_batch(calls, what)
        timed_out: set[Any] = set()
        pause = 0.0
        while True:
            outcome = self._check_children(name, params, timeout_ms, timed_out)
            if not isinstance(outcome, list):
                break
            # Timed out with children live: cancel them outside the step row's lock, skipping a
            # child another transaction holds (tried again after a pause), then check again
            # and record.
            cancelled = self._engine.jobs_cancel_tree(
                ids=[str(c.id) for c in outcome],
                reason=f"cancelled: the parent's step {name!r} timed out", wait=False)
            timed_out.update(c.id for c in outcome)
            params = None
            if cancelled < len(outcome):
                pause = busy_pause(pause)
                if self._ctx.cancelled.wait(pause):
                    self._ctx.check_cancelled()
        if isinstance(outcome, StepSuspended):
            raise outcome
        # After the commit: a ChildFailed raised inside the block would roll the record back.
        return _children_outcome(name, outcome)

    def _check_children(self, name: str, params: list[EnqueueParams] | None,
                        timeout_ms: int | None,
                        timed_out: set[Any]) -> StepSuspended | dict[str, Any] | list[ChildState]:
        """One transaction under the step row's lock: open the step and enqueue the children
        (``params``), or read them. Returns the suspension to raise, the outcome recorded, or
        the children still live when the step's timeout has passed (to cancel, then check
        again). The timeout is the one recorded when the step opened."""
        if self._guard is not None:
            self._guard()
        return self._block(lambda: self._check_children_in(name, params, timeout_ms, timed_out))

    def _check_children_in(self, name: str, params: list[EnqueueParams] | None,
                           timeout_ms: int | None, timed_out: set[Any]
                           ) -> StepSuspended | dict[str, Any] | list[ChildState]:
        """_check_children's transaction."""
        engine, owner = self._engine, self._owner
        step = engine.step_invoke_open_if_owned(
            owner, name, children=[str(p.id) for p in params or ()], timeout_ms=timeout_ms)
        if step is None:
            raise self._lost(f"step {name!r} not recorded")
        if step.opened:
            if params is None:  # a row this run's first read did not see: not ours
                raise self._lost(f"step {name!r} opened by another run")
            engine.jobs_enqueue_children(params, parent_id=UUID(str(owner.claim.job_id)),
                                         parent_step=name)
            signal = self._park(step.park_at)
            if faults.armed:  # the children and the suspension written, not committed
                faults.hit("step:children-enqueued")
            return signal
        children = engine.jobs_children(step.children)
        if faults.armed:
            faults.hit("step:children-read")
        live = [c for c in children if c.state in LIVE_STATES]
        if live and step.due:
            return live
        if live:
            if not engine.step_invoke_pending_if_owned(owner, name, len(live)):
                raise self._lost(f"step {name!r} not recorded")
            return self._park(step.park_at)
        output = _children_output(children, timed_out=timed_out)
        self._complete(name, encode_json(output, what=f"outcome of step {name!r}",
                                         limit=None), kind="invoke")
        return output

    def _child_batch(self, calls: Iterable[Sequence[Any]], what: str) -> list[EnqueueParams]:
        """Every child validated into its insert before anything is written."""
        if self._child_params is None:
            raise InvalidJobInput(
                f"{what}: child jobs need a worker's run (or the inline test mode); this "
                "context cannot enqueue them")
        if isinstance(calls, str | bytes | Mapping):
            raise InvalidJobInput(f"{what}: expected a list of (job, input) pairs")
        batch = []
        for n, call in enumerate(calls):
            if isinstance(call, str | bytes) or not isinstance(call, Sequence) or not (
                    2 <= len(call) <= 3):
                raise InvalidJobInput(
                    f"{what}: item {n} must be (job, input) or (job, input, options), "
                    f"got {call!r}")
            job, input, *rest = call
            options = rest[0] if rest else {}
            if not isinstance(options, Mapping):
                raise InvalidJobInput(f"{what}: the options of item {n} must be a dict")
            batch.append(self._child_params(job, input, options, self._ctx,
                                            what=f"{what} item {n}"))
        if not batch:
            raise InvalidJobInput(f"{what}: no children given")
        return batch

    # ---------------------------------------------------------------------- events --
    def wait_for_event(self, name: str, *, event: str, correlation_key: str | None = None,
                       timeout: timedelta | float | int) -> Any:
        """The payload of the next matching event, or None once ``timeout`` has passed."""
        won = self._wait(name, [event], correlation_key, timeout, wait_any=False)
        return won.payload if won is not None else None

    def wait_for_any(self, name: str, *, events: Sequence[str],
                     correlation_key: str | None = None,
                     timeout: timedelta | float | int) -> EventWon | None:
        """The first of several events to arrive (``EventWon(event, payload)``), or None after
        ``timeout``. The waits on the others are closed in the same transaction."""
        if isinstance(events, str) or not events:
            raise InvalidJobInput("wait_for_any needs a non-empty list of event names")
        return self._wait(name, list(events), correlation_key, timeout, wait_any=True)

    def _wait(self, name: str, events: list[str], correlation_key: str | None,
              timeout: timedelta | float | int, *, wait_any: bool) -> EventWon | None:
        for event in events:
            _event_name(event)
        if correlation_key is not None:
            _text(correlation_key, "correlation_key")
        timeout_ms = milliseconds_of(timeout, "timeout")
        record = self._begin(name)
        if record is not None and record.status == "completed":
            return self._won(record, wait_any)
        self._refuse_in_transaction(
            f"ctx.step.{'wait_for_any' if wait_any else 'wait_for_event'}({name!r})")
        engine, owner = self._engine, self._owner
        if self._guard is not None:
            self._guard()

        def block() -> EventWon | StepSuspended | None:
            engine.event_lock(events)
            parked = engine.step_park_if_owned(
                owner, name, status="waiting", duration_ms=timeout_ms,
                event=None if wait_any else events[0], correlation_key=correlation_key,
                kind="event_any" if wait_any else "event",
            )
            if parked is None:
                raise self._lost(f"wait {name!r} not recorded")
            if wait_any:  # one waiting row per event, so each event's publisher finds it
                for event in events:
                    if engine.step_park_if_owned(
                        owner, f"{name}#{event}", status="waiting", duration_ms=timeout_ms,
                        event=event, correlation_key=correlation_key, kind="event",
                    ) is None:
                        raise self._lost(f"wait {name!r} not recorded")
            after_at, after_id = self._cursor(events, parked.started_at)
            found = engine.event_next(events, correlation_key, after_at, after_id)
            if faults.armed:
                faults.hit("step:after-event-check")
            if found is not None:
                return self._consume(name, found, correlation_key, wait_any)
            if parked.due:  # timed out: the wait ends with nothing
                self._complete(name, None, event=None, correlation_key=correlation_key)
                if wait_any:
                    engine.step_cancel_siblings(owner, f"{name}#")
                return None
            return self._park(parked.wake_at)

        outcome = self._block(block)
        if isinstance(outcome, StepSuspended):
            raise outcome
        return outcome

    def _cursor(self, events: list[str], started_at: datetime) -> tuple[datetime, int]:
        """Events after the last one this run consumed from these names, else after the start."""
        consumed = [
            (r.event_published_at, r.event_id) for r in (self._records or {}).values()
            if r.status == "completed" and r.event_id is not None and r.event in events
            and r.event_published_at is not None
        ]
        return max(consumed) if consumed else (started_at, 0)

    def _consume(self, name: str, found: EventRecord, correlation_key: str | None,
                 wait_any: bool) -> EventWon:

        won = EventWon(event=found.name, payload=found.payload)
        output = {"event": found.name, "payload": found.payload} if wait_any else found.payload
        self._complete(
            name, encode_json(output, what="event payload", limit=None), event=found.name,
            correlation_key=correlation_key, event_id=found.id,
            event_published_at=found.published_at,
        )
        if wait_any:
            self._engine.step_cancel_siblings(self._owner, f"{name}#")
        assert self._records is not None
        self._records[name] = StepRecord(
            name=name, status="completed", output=output, attempts=1, error=None,
            started_at=None, completed_at=None, wake_at=None, event=found.name,
            correlation_key=correlation_key, event_id=found.id,
            event_published_at=found.published_at,
        )
        return won

    @staticmethod
    def _won(record: StepRecord, wait_any: bool) -> EventWon | None:
        if record.event_id is None:  # the wait timed out
            return None
        if wait_any:
            return EventWon(event=record.output["event"], payload=record.output["payload"])
        return EventWon(event=record.event or "", payload=record.output)


def _children_output(children: Sequence[ChildState], *, timed_out: set[Any]) -> dict[str, Any]:
    """What an invoke or gather step records once its children are settled: their ids and
    results in order, and the first that failed (dead, cancelled, gone, or still live at the
    timeout)."""
    output: dict[str, Any] = {"children": [str(c.id) for c in children],
                              "results": [c.result if c.state == "done" else None
                                          for c in children]}
    for n, child in enumerate(children):
        if child.state != "done":
            output["failed"] = {
                "index": n, "id": str(child.id), "job": child.name,
                "state": "timeout" if child.id in timed_out else child.state or "gone",
                "error": child.error,
            }
            break
    return output


def _children_outcome(name: str, output: Any) -> list[Any]:
    """The results an invoke or gather step returns, or the ChildFailed it raises, from its
    record: the same on the first run and on every replay."""
    if not isinstance(output, dict) or not (
            output.get("failed") or isinstance(output.get("results"), list)):
        raise StepNameReused(
            f"step {name!r} of this run was recorded as another kind of step (a deploy "
            "renamed it?); give the invoke or gather a name of its own")
    failed = output.get("failed")
    if failed:
        reason = {"timeout": "was still running when the step's timeout passed",
                  "gone": "no longer exists"}.get(failed["state"], f"ended {failed['state']}")
        # The child's error in one line, its last: the whole of it (the child's traceback)
        # would end the parent's own, and the line read first of the parent's error would be
        # the child's rather than this ChildFailed (exc.error keeps the whole).
        line = error_line(failed.get("error"))
        error = f": {line}" if line else ""
        raise ChildFailed(
            f"child {failed['index']} of step {name!r} ({failed.get('job')} {failed['id']}) "
            f"{reason}{error}",
            child_id=failed["id"], state=failed["state"], error=failed.get("error"),
            index=failed["index"])
    return list(output["results"])


class AsyncSteps:
    """``ctx.step`` of an ``async def`` job: the same steps, awaitable.

    Database work runs in a worker thread (``in_thread``); a step's ``fn`` may be a
    plain function or a coroutine function.
    """

    def __init__(self, steps: Steps) -> None:
        self._steps = steps

    async def run(self, name: str, fn: Callable[[], Any]) -> Any:
        steps = self._steps
        record = await in_thread(steps._lookup, name)
        if record is not None:
            return record.output
        steps._ctx.prove_lease()
        try:
            value = fn()
            if inspect.isawaitable(value):
                value = await value
        except (JobCancelled, StepSuspended):
            raise
        except Exception as exc:
            await in_thread(steps._record_failure, name, exc)
            raise
        return await in_thread(steps._record_output, name, value)

    async def sleep(self, name: str, duration: timedelta | float | int) -> None:
        await in_thread(self._steps.sleep, name, duration)

    async def sleep_until(self, name: str, when: datetime) -> None:
        await in_thread(self._steps.sleep_until, name, when)

    async def invoke(self, name: str, job: Any, input: Mapping[str, Any] | None = None, *,
                     timeout: timedelta | float | int | None = None, **options: Any) -> Any:
        return await in_thread(
            lambda: self._steps.invoke(name, job, input, timeout=timeout, **options))

    async def gather(self, name: str, calls: Iterable[Sequence[Any]], *,
                     timeout: timedelta | float | int | None = None) -> list[Any]:
        calls = list(calls)  # read here, not in the thread
        return await in_thread(lambda: self._steps.gather(name, calls, timeout=timeout))

    async def wait_for_event(self, name: str, *, event: str, correlation_key: str | None = None,
                             timeout: timedelta | float | int) -> Any:
        return await in_thread(
            lambda: self._steps.wait_for_event(name, event=event,
                                               correlation_key=correlation_key, timeout=timeout)
        )

    async def wait_for_any(self, name: str, *, events: Sequence[str],
                           correlation_key: str | None = None,
                           timeout: timedelta | float | int) -> EventWon | None:
        return await in_thread(
            lambda: self._steps.wait_for_any(name, events=events,
                                             correlation_key=correlation_key, timeout=timeout)
        )


# ----------------------------------------------------------------------------- publishing --


def _event_name(value: Any) -> str:
    return check_name("event name", value)


def _text(value: Any, what: str) -> str:
    return check_text(what, value)


def publish_event(name: str, payload: Any = None, *, correlation_key: str | None = None,
                  ttl: timedelta | float | int = DEFAULT_EVENT_TTL,
                  tenant_id: str | None = None) -> EventRecord:
    """Publish an event: every job waiting for it (and for its correlation key) resumes now.

    Runs in the caller's transaction on ``XJOBS["DATABASE"]``: a rolled-back publish never
    happened and woke nobody. The event stays for ``ttl`` (default 7 days) for waits that start
    later; maintenance deletes it after that.

    With the jobs sharded by tenant (docs/scaling.md) an event lives on one shard and wakes
    the jobs waiting there: ``tenant_id`` names the tenant whose shard it goes to (in the
    caller's transaction on that shard's alias); without one it is published on every shard,
    each in a transaction of its own, and the home shard's record is returned. Should a shard
    fail partway, the shards before it have the event: publishing it again gives them a second
    one, which a wait that began since could consume.
    """
    _event_name(name)
    if correlation_key is not None:
        _text(correlation_key, "correlation_key")
    ttl_ms = milliseconds_of(ttl, "ttl")
    if ttl_ms <= 0:
        raise InvalidJobInput("ttl must be greater than zero")
    payload_json = encode_json(payload, what=f"payload of event {name!r}",
                               limit=conf.get().max_payload_bytes)
    if tenant_id is not None:
        _text(tenant_id, "tenant_id")
    settings = conf.get()
    if not settings.shards:
        return _publish(name, payload_json, correlation_key, ttl_ms)
    aliases = [conf.shard_for_tenant(tenant_id)] if tenant_id is not None else settings.shards
    events = []
    for alias in aliases:
        with conf.using_database(alias):
            events.append(_publish(name, payload_json, correlation_key, ttl_ms))
    return events[0]


def _publish(name: str, payload_json: str, correlation_key: str | None,
             ttl_ms: int) -> EventRecord:
    engine = get_engine()
    with engine.atomic():
        engine.event_lock([name])
        event = engine.event_publish(name, payload_json, correlation_key, ttl_ms)
        engine.event_wake_waiters(name, correlation_key)
    return event


def purge_expired_events(batch_size: int = 1000) -> int:
    """Delete events past their ttl, in bounded batches; how many (maintenance)."""
    return get_engine().events_purge(batch_size)
