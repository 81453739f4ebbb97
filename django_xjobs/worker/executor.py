"""Run one claimed job and map what happened to an :data:`Outcome`. No database writes here
but the job's own: its code's, and its last ``ctx.progress`` held back by the rate limit, written
when the code ends (``JobContext.flush_progress``), before the outcome goes to be settled, so
while the run still holds its lease.

The job's code is found by its stored name in the registry, never imported
(``registry.lookup``). What the function does maps to:

=====================================  ==============================================
returns a JSON-serialisable value      ``Done`` (the value is stored as the result)
a step suspended the job               ``Suspended`` (already written by the step)
returns something JSON cannot encode,  ``Retry(permanent=True)``: re-running cannot fix it
or more than ``MAX_PAYLOAD_BYTES``
raises ``PermanentError``              ``Retry(permanent=True)``: straight to ``dead`` (also an
                                       exception marked by ``exceptions.fail_for_good``)
raises ``Snooze(delay)``               ``GiveBack``: later, without spending an attempt
raises ``Retry(delay)``                ``Retry`` after ``delay``, spending an attempt (dead
                                       when they are spent, or past its ``max_attempts``)
raises ``PauseKey(key, for_=...)``     ``KeyPaused``: due now without spending an attempt,
                                       and the key paused (docs/flow-control.md)
raises anything else                   ``Retry`` with the job's backoff delay; ``dead`` at
                                       once when the job's ``retry_on=`` does not list it
its name is not registered here        ``UnknownName``: given back without spending an
                                       attempt until a worker that knows it claims it
                                       (docs/deployment.md)
its stored input cannot be decoded     ``Retry(permanent=True)``: the code never runs
=====================================  ==============================================

The error recorded for an exception the code raised is :func:`values.record_error`: a first line
naming its class (``exceptions.error_class_line``), then its traceback as ``traceback`` formats it.

The body starts only once the run proved its lease (``JobContext.prove_lease``, which the
worker backs with the age of its last renewal; docs/guarantees.md): a run that cannot is stopped
and its job handed back by the worker, and the code is not called.

Whether a ``Retry`` becomes a retry or ``dead`` is decided by the fenced statement from the
row's attempt counter, so a run that lost the job can neither retry nor bury it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import close_old_connections

from .. import signals, tracing, values
from ..conf import XJobsSettings
from ..context import JobContext, enter_run, leave_run, log_extra, log_prefix
from ..exceptions import (
    InvalidJobInput,
    JobCancelled,
    PauseKey,
    PermanentError,
    Snooze,
    is_permanent,
)
from ..exceptions import Retry as RetryRequested
from ..records import ClaimedJob
from ..registry import JobDefinition, expected_home
from ..steps import StepSuspended
from ..values import format_error, record_error
from .backoff import retry_delay

log = logging.getLogger("django_xjobs.worker")


@dataclass(frozen=True, slots=True)
class Done:
    result_json: str | None


@dataclass(frozen=True, slots=True)
class Retry:
    error: str
    delay: float
    permanent: bool = False
    # The run's entry in the attempt history: `failed`, or `timeout` (docs/observability.md).
    outcome: str = "failed"
    # What the job's code raised, for job_finished's receivers (docs/observability.md).
    exception: BaseException | None = field(default=None, compare=False, repr=False)
    # Retry(max_attempts=n): the bound this retry is judged by (records.Failure).
    max_attempts: int | None = None


@dataclass(frozen=True, slots=True)
class GiveBack:
    delay: float
    note: str | None = None
    # The run's entry in the attempt history: `handed_back`, `snoozed` or `slot_lost`.
    outcome: str = "handed_back"
    exception: BaseException | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class KeyPaused:
    """The job raised ``PauseKey``: give it back due now without spending an attempt and pause
    ``key`` for ``seconds``, in one fenced write (worker/settle.py). The claim then holds the
    job back (``blocked``) until the pause ends."""

    key: str
    seconds: float
    reason: str | None
    exception: BaseException | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Suspended:
    """A step parked the job (a sleep, an event wait): the database already says so, in the
    step's own fenced transaction; nothing is left to write."""

    wake_at: datetime


@dataclass(frozen=True, slots=True)
class Discard:
    reason: str


@dataclass(frozen=True, slots=True)
class UnknownName:
    """No job of the claimed name is registered in this worker: give the job back without
    spending an attempt, due again after the time it has waited (at least a second, at most
    ``max_delay`` seconds), for a worker that knows the name (job_give_back_unknown_if_owned).
    ``note`` is the row's last error."""

    note: str
    max_delay: float


Outcome = Done | Retry | GiveBack | KeyPaused | Suspended | Discard | UnknownName


def backoff_for(definition: JobDefinition | None, attempt: int, settings: XJobsSettings) -> float:
    policy = definition.retry if definition is not None else None
    base = policy.base if policy and policy.base is not None else settings.retry_base
    cap = policy.cap if policy and policy.cap is not None else settings.retry_cap
    if policy is not None and not policy.jitter:
        return retry_delay(attempt, base=base, cap=cap, rand=_whole)
    return retry_delay(attempt, base=base, cap=cap)


def timeout_is_final(definition: JobDefinition | None) -> bool:
    """Whether a run stopped at its timeout ends the job ``dead``: its ``retry_on=`` does not
    list ``TimeoutError`` (a job without ``retry_on`` retries a timeout like any failure)."""
    on = definition.retry.on if definition is not None else None
    return on is not None and not issubclass(TimeoutError, on)


def _whole() -> float:
    """The backoff of a job declared ``retry_jitter=False``: the whole window, every time."""
    return 1.0


def unknown_job(claimed: ClaimedJob, settings: XJobsSettings) -> UnknownName:
    """The outcome of a claimed job whose name this worker does not know: its code may reach
    the workers after the web processes that enqueue it (docs/deployment.md, "New job types
    before their workers"), so the wait spends no attempt and buries nothing."""
    return UnknownName(
        note=(f"UnknownJob: no job named {claimed.name!r} is registered in this worker; given "
              "back without spending an attempt, to wait for a worker that knows it (deployed "
              f"to web before the workers?). It is {expected_home(claimed.name)}."),
        max_delay=settings.unknown_job_retry_max,
    )


def undecodable_input(claimed: ClaimedJob) -> Retry | None:
    """The outcome of a job whose stored input Python's json module cannot decode (valid jsonb
    it refuses, ``ClaimedJob.input_error``): ``dead`` at once, since no attempt could read it,
    and the function is not called. None for any other job."""
    if claimed.input_error is None:
        return None
    return Retry(error=f"input cannot be decoded: {claimed.input_error} (PostgreSQL accepts it "
                       "as JSON, Python's json module does not; the job was not run)",
                 delay=0, permanent=True)


def _outcome_of_result(definition: JobDefinition, value: Any, settings: XJobsSettings) -> Outcome:
    if value is None:
        return Done(None)
    try:
        return Done(values.encode_json(value, what=f"result of {definition.name}",
                                    limit=settings.max_payload_bytes))
    except InvalidJobInput as exc:
        return Retry(error=f"{exc} (the job ran; re-running it cannot fix this)", delay=0,
                     permanent=True)
    except Exception as exc:  # the value's own code raised while being encoded
        return Retry(error=f"result of {definition.name} could not be encoded as JSON (the job "
                           f"ran; re-running it cannot fix this)\n{format_error(exc)}",
                     delay=0, permanent=True)


def internal_error(exc: BaseException, definition: JobDefinition | None, claimed: ClaimedJob,
                   settings: XJobsSettings) -> Retry:
    """The outcome of a run whose outcome could not be worked out (a bug of the worker's, met
    while mapping what the job did): retried with backoff, never left running under a lease
    that the heartbeat keeps renewing."""
    return Retry(error=f"django-xjobs could not record the outcome of this run\n"
                       f"{format_error(exc)}",
                 delay=backoff_for(definition, claimed.attempt, settings))


def _outcome_of_exception(
    exc: BaseException, definition: JobDefinition, claimed: ClaimedJob, ctx: JobContext,
    settings: XJobsSettings,
) -> Outcome:
    if isinstance(exc, JobCancelled) or ctx.cancelled.is_set():
        # The worker stopped this run (cancel, timeout, lost lease, shutdown) and has already
        # decided its outcome; whatever the code raised while stopping is noise.
        return Discard(ctx.stop_reason or str(exc))
    if is_permanent(exc):
        return Retry(error=record_error(exc), delay=0, permanent=True, exception=exc)
    if isinstance(exc, Snooze):
        return GiveBack(delay=exc.seconds, note=None, outcome="snoozed", exception=exc)
    if isinstance(exc, PauseKey):
        return KeyPaused(key=exc.key, seconds=exc.seconds, reason=exc.reason, exception=exc)
    if isinstance(exc, RetryRequested):
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        return Retry(error=record_error(cause), delay=exc.seconds, exception=cause,
                     max_attempts=exc.max_attempts)
    retry_on = definition.retry.on
    if retry_on is not None and not isinstance(exc, retry_on):
        return Retry(error=record_error(exc), delay=0, permanent=True, exception=exc)
    return Retry(error=record_error(exc), delay=backoff_for(definition, claimed.attempt, settings),
                 exception=exc)


def _input(claimed: ClaimedJob) -> dict[str, Any]:
    value = claimed.input
    if not isinstance(value, dict):
        raise PermanentError(
            f"stored input of job {claimed.id} is a {type(value).__name__}, not a JSON object"
        )
    return value


def execute(
    definition: JobDefinition, claimed: ClaimedJob, ctx: JobContext, settings: XJobsSettings,
    *, fresh_connections: bool = True, cleanup: bool = True,
) -> Outcome:
    """Run a sync job in the current (executor) thread.

    Django's connections are cleaned up around the job, as around a request: after it always,
    and before it when ``fresh_connections`` (the thread was idle long enough for a connection
    to age past CONN_MAX_AGE or be dropped by the server). Back-to-back jobs of a busy thread
    skip the "before": the "after" of the previous job ran microseconds earlier. Without
    ``cleanup`` neither: the caller's own thread runs the job (the inline test mode,
    django_xjobs/testing), and its connections may be inside the caller's transaction.
    """
    refused = undecodable_input(claimed)
    if refused is not None:
        return refused
    if fresh_connections and cleanup:
        close_old_connections()
    # While the code runs, JobLogFilter gives this thread's records the job (context.py).
    running = enter_run(ctx)
    try:
        ctx.prove_lease()
        _log_started(claimed)
        if signals.job_started.receivers:
            signals.send(signals.job_started, definition, job=claimed, attempt=claimed.attempt)
        if tracing.wants_span(claimed.traceparent):
            with tracing.job_span(definition.name, claimed.traceparent,
                                  _span_attributes(claimed)):
                value = definition.func(ctx, **_input(claimed))
        else:
            value = definition.func(ctx, **_input(claimed))
    except StepSuspended as parked:
        return Suspended(parked.wake_at)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            return _exited(exc, definition, claimed, settings)
        return _outcome_of_exception(exc, definition, claimed, ctx, settings)
    finally:
        leave_run(running)
        ctx.flush_progress()
        if cleanup:
            close_old_connections()
    if ctx.cancelled.is_set():
        return Discard(ctx.stop_reason or "stopped")
    return _outcome_of_result(definition, value, settings)


async def execute_async(
    definition: JobDefinition, claimed: ClaimedJob, ctx: JobContext, settings: XJobsSettings
) -> Outcome:
    """Run an ``async def`` job on the worker's event loop; its timeout cancels the task."""
    refused = undecodable_input(claimed)
    if refused is not None:
        return refused
    # The task's own context: each async job's records get its job (context.JobLogFilter).
    running = enter_run(ctx)
    try:
        return await _execute_async(definition, claimed, ctx, settings)
    finally:
        leave_run(running)
        await ctx.aflush_progress()


async def _execute_async(
    definition: JobDefinition, claimed: ClaimedJob, ctx: JobContext, settings: XJobsSettings
) -> Outcome:
    try:
        ctx.prove_lease()
        _log_started(claimed)
        if signals.job_started.receivers:
            await signals.asend(signals.job_started, definition, job=claimed,
                                attempt=claimed.attempt)
        with tracing.job_span(definition.name, claimed.traceparent, _span_attributes(claimed)):
            coro = definition.func(ctx, **_input(claimed))
            if definition.timeout is not None:
                value = await asyncio.wait_for(coro, timeout=definition.timeout)
            else:
                value = await coro
    except TimeoutError as exc:
        if ctx.cancelled.is_set():
            return Discard(ctx.stop_reason or "stopped")
        return Retry(
            error=f"TimeoutError: {definition.name} ran longer than its timeout "
                  f"({definition.timeout:g}s)\n{format_error(exc)}",
            delay=backoff_for(definition, claimed.attempt, settings), outcome="timeout",
            permanent=timeout_is_final(definition),
        )
    except asyncio.CancelledError:
        return Discard(ctx.stop_reason or "cancelled")
    except StepSuspended as parked:
        return Suspended(parked.wake_at)
    except (KeyboardInterrupt, SystemExit) as exc:
        return _exited(exc, definition, claimed, settings)
    except Exception as exc:
        return _outcome_of_exception(exc, definition, claimed, ctx, settings)
    if ctx.cancelled.is_set():
        return Discard(ctx.stop_reason or "stopped")
    return _outcome_of_result(definition, value, settings)


def _log_started(claimed: ClaimedJob) -> None:
    """The DEBUG line of a run whose code is about to be called (its lease proven)."""
    if log.isEnabledFor(logging.DEBUG):
        log.debug("%s/%d: started", log_prefix(claimed.id, claimed.name, claimed.attempt),
                  claimed.max_attempts, extra=log_extra(claimed.id, claimed.name, claimed.attempt))


def _exited(exc: BaseException, definition: JobDefinition, claimed: ClaimedJob,
            settings: XJobsSettings) -> Retry:
    """``SystemExit`` / ``KeyboardInterrupt`` raised by the job's code (``sys.exit()`` in a job)
    fails that attempt like any exception; it stops neither the worker nor its other runs."""
    return Retry(error=record_error(exc), delay=backoff_for(definition, claimed.attempt, settings),
                 exception=exc)


def _span_attributes(claimed: ClaimedJob) -> dict[str, Any]:
    return {
        "xjobs.job_id": claimed.id,
        "xjobs.job_name": claimed.name,
        "xjobs.queue": claimed.queue,
        "xjobs.attempt": claimed.attempt,
    }
