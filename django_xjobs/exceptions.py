"""The one exception hierarchy of django-xjobs.

Two families live here:

* errors raised *to* callers (bad input, unknown job, configuration), all subclasses of
  :class:`XJobsError`;
* control signals raised *by* job code to tell the worker what to do next
  (:class:`PermanentError`, :class:`Snooze`). They are exceptions because that is the only way
  to leave a function from any depth, not because anything went wrong with the queue.

Database errors are translated at the engine boundary; a driver exception never reaches a caller
of the public API for a condition this module names (a duplicate live key returns the existing
job instead of raising at all).
"""

from __future__ import annotations

from datetime import datetime, timedelta


class XJobsError(Exception):
    """Root of every error django-xjobs raises on purpose."""


class ConfigurationError(XJobsError):
    """The ``XJOBS`` settings, a decorator argument or a command option is invalid."""


class InvalidJobInput(XJobsError, ValueError):
    """Input, name, queue, key, delay or date given to enqueue is not acceptable.

    Raised before anything is written: a call that raises this leaves no row behind and does not
    disturb the caller's transaction.
    """


class PayloadTooLarge(InvalidJobInput):
    """The JSON encoding of an input is larger than ``XJOBS["MAX_PAYLOAD_BYTES"]``."""


class UndecodableValue(XJobsError, ValueError):
    """A stored JSON value that a run needs (a step's output, an event's payload) is valid
    ``jsonb`` that Python's ``json`` module cannot decode: an integer of more digits than
    ``sys.get_int_max_str_digits()``, nesting deeper than its recursion limit. Raised inside the
    job, marked to fail it for good (``fail_for_good()``): no attempt can read the value."""


class UnknownJob(XJobsError, LookupError):
    """No job with this name is registered in this process."""


class DuplicateJobName(ConfigurationError):
    """Two different functions were registered under one job name."""


class JobNotFound(XJobsError, LookupError):
    """No job row with this id (visible to this tenant scope) exists."""


class LiveJobExists(XJobsError):
    """Retrying a finished job would create a second live job for its idempotency key.

    Carries the id of the live job that holds the key, so the operator can look at it instead.
    """

    def __init__(self, message: str, *, live_job_id: str | None = None) -> None:
        super().__init__(message)
        self.live_job_id = live_job_id


class RowBusy(XJobsError):
    """A run's write found its job's row held by another transaction (a request, an operator's
    action not committed yet): nothing was written and nothing waited. The run writes again
    once the row is free (docs/design.md, "Lock order"); it never reaches a job's code."""


class IsolationLevelRefused(XJobsError):
    """A call that is exact only under READ COMMITTED (a rate limit's budget, an event's
    wake-ups) was made inside a transaction of a stricter level: refused, nothing written
    (docs/guarantees.md, "Isolation levels")."""


class InvalidTransition(XJobsError):
    """An operator action does not apply to the job's current state (e.g. retrying a done job)."""


class EngineUnavailable(XJobsError):
    """The configured database alias cannot run django-xjobs (wrong vendor, missing feature)."""


class SchemaMissing(EngineUnavailable):
    """The job tables do not exist in the configured database: ``manage.py migrate`` first."""


class JobCancelled(XJobsError):
    """Raised inside a job at a step boundary once the run was cancelled, timed out or lost.

    Job code does not need to catch it: the worker already knows why the run stopped and
    discards its result.
    """


# ------------------------------------------------------------------------------- backfills --


class UnknownBackfill(XJobsError, LookupError):
    """No backfill with this name is registered in this process."""


class BackfillNotFound(XJobsError, LookupError):
    """No backfill pass with this run id exists."""


# --------------------------------------------------------------------------------- scheduler --


class UnknownTask(XJobsError, LookupError):
    """No cron task of this name is configured (``@job(cron=...)`` or ``XJOBS["SCHEDULE"]``)."""


# --------------------------------------------------------------------------- control signals --


class PermanentError(Exception):
    """Raise from a job to fail it for good: the job goes straight to ``dead``, no more retries.

    Use it for errors a retry cannot fix (invalid input, a record that no longer exists).
    """


def _seconds(value: timedelta | float | int, what: str) -> float:
    """Seconds from the timedelta or the number a control signal was given."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise TypeError(f"{what} must be a timedelta or seconds, got {value!r}")


class Snooze(Exception):
    """Raise from a job to run it again later without spending an attempt.

    ``raise Snooze(timedelta(minutes=5))`` or ``raise Snooze(300)`` (seconds).
    """

    def __init__(self, delay: timedelta | float | int = 0) -> None:
        seconds = _seconds(delay, "Snooze delay")
        if seconds < 0:
            raise ValueError(f"Snooze delay must not be negative, got {seconds}s")
        super().__init__(f"snoozed for {seconds:g}s")
        self.seconds = seconds


class Retry(Exception):
    """Raise from a job to run it again after ``delay``, spending an attempt.

    ``raise Retry(timedelta(seconds=30))``, ``raise Retry(30) from exc``: unlike
    :class:`Snooze`, the attempt counts, so a partner that answers 429 forever ends the job
    ``dead`` once its attempts are spent instead of looping for ever. ``max_attempts`` is the
    bound this retry is judged by, lower or higher than the job's (the job is dead if this
    attempt is number ``max_attempts`` or later); a higher one stays the job's bound from then
    on. The error the attempt records is the cause's (``raise Retry(...) from exc``) when there
    is one. A job's ``retry_on=`` does
    not filter it: raising it is the decision to retry (docs/guide.md, "Retries").
    """

    def __init__(self, delay: timedelta | float | int = 0, *,
                 max_attempts: int | None = None) -> None:
        seconds = _seconds(delay, "Retry delay")
        if not 0 <= seconds < float("inf"):
            raise ValueError(f"Retry delay must be a finite duration, not negative, got {delay!r}")
        if max_attempts is not None and (isinstance(max_attempts, bool)
                                         or not isinstance(max_attempts, int)
                                         or max_attempts < 1):
            raise TypeError(f"Retry max_attempts must be a positive integer, got "
                            f"{max_attempts!r}")
        super().__init__(f"retry in {seconds:g}s")
        self.seconds = seconds
        self.max_attempts = max_attempts


class PauseKey(Exception):
    """Raise from a job to pause a key, a circuit breaker: ``raise PauseKey("partner:acme",
    for_=timedelta(minutes=10), reason="429 from partner")``.

    The worker gives the job back due now without spending an attempt, and pauses the key until
    now + ``for_``, in one fenced write (a run that lost its job pauses nothing). Until then the
    claim holds back every job whose concurrency or rate-limit key it is, this one included
    (docs/flow-control.md, "Pause and circuit breakers"). A key paused already stays paused at
    least as long.
    """

    def __init__(self, key: str, *, for_: timedelta | float | int,
                 reason: str | None = None) -> None:
        if not isinstance(key, str) or not key or len(key) > MAX_PAUSE_KEY or "\x00" in key:
            raise TypeError(f"PauseKey key must be a non-empty string of at most "
                            f"{MAX_PAUSE_KEY} characters without NUL, got {key!r:.100}")
        seconds = _seconds(for_, "PauseKey for_")
        if not seconds > 0 or seconds == float("inf"):
            raise ValueError(f"PauseKey for_ must be a positive, finite duration, got {for_!r}")
        if reason is not None and (not isinstance(reason, str) or "\x00" in reason):
            raise TypeError(f"PauseKey reason must be a string without NUL, got {reason!r:.100}")
        super().__init__(f"pause key {key!r} for {seconds:g}s"
                         + (f": {reason}" if reason else ""))
        self.key = key
        self.seconds = seconds
        self.reason = reason


# The longest key a pause names: the longest concurrency key (conf.MAX_SLOT_KEY, not imported:
# conf sits above this module).
MAX_PAUSE_KEY = 500


# The attribute fail_for_good sets on an exception (any exception has a __dict__).
_FOR_GOOD = "_xjobs_fail_for_good"


def fail_for_good(exc: BaseException) -> BaseException:
    """Mark ``exc`` so that the worker fails its job for good, as it does for a
    :class:`PermanentError`, while the error it records keeps ``exc``'s own class and traceback.

    The ``django.tasks`` backend marks the ``TypeError`` of a return value JSON cannot hold:
    Django's backends report that ``TypeError``, and running the task again cannot change what
    it returns (tests/integration/test_django_tasks_contract.py).
    """
    exc.__dict__[_FOR_GOOD] = True
    return exc


def is_permanent(exc: BaseException) -> bool:
    """Whether ``exc`` ends its job for good: a :class:`PermanentError`, or marked by
    :func:`fail_for_good`."""
    return isinstance(exc, PermanentError) or exc.__dict__.get(_FOR_GOOD) is True


# ------------------------------------------------------------------------- recorded errors --

# The first line of the error the worker records for an exception raised by a job's code. It
# names the exception's class as Django's TaskError does (module.qualname, taken from the
# exception object when it is raised), so nobody has to read it back from the traceback text: an
# ExceptionGroup's traceback has no unindented exception line, and a message may quote another
# traceback (tests/unit/test_django_tasks_mapping.py). No text of the traceback module starts
# so (its first line is "Traceback ...", an indented group header, or "<module>.<class>[:
# message]", and a class path has no "-"), nor does any message the worker writes itself.
ERROR_CLASS_PREFIX = "exception-class: "


def class_path(kind: type[BaseException]) -> str:
    """``module.qualname`` of an exception class (``builtins.ValueError``)."""
    return f"{kind.__module__}.{kind.__qualname__}"


def error_class_line(exc: BaseException) -> str:
    """The first line of the error recorded for ``exc`` (without its newline)."""
    return ERROR_CLASS_PREFIX + class_path(type(exc))


def split_recorded_error(text: str) -> tuple[str, str] | None:
    """``(class path, the rest)`` of an error recorded with :func:`error_class_line` first;
    None for any other text (a worker's own message, a row recorded before this line existed,
    an operator's cancel reason)."""
    if not text.startswith(ERROR_CLASS_PREFIX):
        return None
    first, _, rest = text.partition("\n")
    path = first[len(ERROR_CLASS_PREFIX):]
    return (path, rest) if path and not any(c.isspace() for c in path) else None


# ---------------------------------------------------------------------- django.tasks backend --


class JobFailed(XJobsError):
    """Never raised: the exception class a ``django.tasks`` ``TaskError`` names when the failure
    the worker recorded carries no exception class of its own (the worker buried a job whose
    lease was lost too many times, or the recorded text cannot be read back). See
    docs/django-tasks.md, "Errors".
    """


# ---------------------------------------------------------------------- concurrency slots --

SLOT_LOST = "X_JOB_SLOT_LOST"


class InvalidConcurrencyKey(InvalidJobInput):
    """A job's concurrency key cannot be built or has no limit: a field of the key template is
    missing from the input, a value is not a string, an integer or a typed value (a datetime,
    date, time, UUID or Decimal), the key is empty or too long,
    or no limit applies to it (neither ``Concurrency(limit=...)`` nor
    ``XJOBS["CONCURRENCY_LIMITS"]``). Raised at enqueue, before anything is written."""


class SlotLost(JobCancelled):
    """Raised inside a job at a step boundary once its run lost its concurrency slot
    (``X_JOB_SLOT_LOST``): the slot lapsed before the worker renewed it (a frozen or hung
    worker), so another run may hold it now. The worker stops the run, discards its result and
    re-queues the job; job code does not need to catch it."""

    code = SLOT_LOST


# ------------------------------------------------------------------ durable steps --


class StepSuspended(BaseException):
    """Raised by a step that parked its job (a sleep or an event wait) to unwind the job's code.

    A BaseException, so that ``except Exception`` in job code cannot swallow it. The job is
    already suspended in the database when this is raised; the worker only frees the thread.
    """

    def __init__(self, wake_at: datetime) -> None:
        super().__init__(f"suspended until {wake_at.isoformat()}")
        self.wake_at = wake_at


class StepNameReused(PermanentError):
    """Two steps of one run used the same name: their records would be confused."""


class StepOutputError(PermanentError):
    """A step returned something JSON cannot store; re-running the job cannot fix it."""


class StepOutputTooLarge(PayloadTooLarge):
    """A step's output is larger than ``XJOBS["MAX_PAYLOAD_BYTES"]`` as JSON: the step is
    recorded ``failed`` and the job fails this attempt (and retries by its policy). Store large
    data elsewhere and return a reference to it."""


class SuspendInTransaction(PermanentError):
    """A sleep or an event wait inside the job's own ``transaction.atomic()``: the suspension
    would be rolled back with the block that the suspension unwinds, and the job would sit in
    ``running`` until its lease lapsed, again on every attempt."""


class ChildFailed(PermanentError):
    """A child job of ``ctx.step.invoke`` / ``gather`` ended ``dead`` or ``cancelled`` (or the
    wait for it timed out: ``state`` is then ``"timeout"``). Raised in the parent, where the
    step was; a replay raises it again, the outcome is memoised like a step's output.

    Permanent: the child has used its own attempts, and a retry of the parent would replay the
    same outcome. Catch it to go on without the child's result.
    """

    def __init__(self, message: str, *, child_id: str, state: str, error: str | None,
                 index: int = 0) -> None:
        super().__init__(message)
        self.child_id = child_id  # the child job's id (str)
        self.state = state  # "dead", "cancelled" or "timeout"
        self.error = error  # the child's last error, as stored
        self.index = index  # its position in the gather's list (0 for an invoke)


# ---------------------------------------------------------------------- backfills --


class DryRunFailed(XJobsError):
    """A batch of a dry run raised (its writes were rolled back, like every dry-run batch)."""


class BadBatch(PermanentError):
    """A backfill function returned something other than ``Batch(next_cursor, processed)``
    with a JSON cursor and a count >= 0: a bug in the backfill, which a retry cannot fix."""


# ----------------------------------------------------- connections of the engine seam --


class ListenerLost(Exception):
    """The LISTEN connection dropped; notifications sent meanwhile are lost (poll covers them)."""


class SessionLost(Exception):
    """The advisory session's connection dropped; the server released its lock with it."""


class InvalidRateKey(InvalidJobInput):
    """A job's rate-limit key cannot be built: a field of the ``RateLimit`` key template is
    missing from the input or not a string, an integer or a typed value (a datetime, date,
    time, UUID or Decimal), or the key is empty or too long.
    Raised at enqueue, before anything is written."""
