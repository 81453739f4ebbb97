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

from datetime import timedelta


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


class Snooze(Exception):
    """Raise from a job to run it again later without spending an attempt.

    ``raise Snooze(timedelta(minutes=5))`` or ``raise Snooze(300)`` (seconds).
    """

    def __init__(self, delay: timedelta | float | int = 0) -> None:
        if isinstance(delay, timedelta):
            seconds = delay.total_seconds()
        elif isinstance(delay, int | float) and not isinstance(delay, bool):
            seconds = float(delay)
        else:
            raise TypeError(f"Snooze delay must be a timedelta or seconds, got {delay!r}")
        if seconds < 0:
            raise ValueError(f"Snooze delay must not be negative, got {seconds}s")
        super().__init__(f"snoozed for {seconds:g}s")
        self.seconds = seconds


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
    missing from the input, a value is not a string or an integer, the key is empty or too long,
    or no limit applies to it (neither ``Concurrency(limit=...)`` nor
    ``XJOBS["CONCURRENCY_LIMITS"]``). Raised at enqueue, before anything is written."""


class SlotLost(JobCancelled):
    """Raised inside a job at a step boundary once its run lost its concurrency slot
    (``X_JOB_SLOT_LOST``): the slot lapsed before the worker renewed it (a frozen or hung
    worker), so another run may hold it now. The worker stops the run, discards its result and
    re-queues the job; job code does not need to catch it."""

    code = SLOT_LOST
