"""``JobContext``: what a job function receives as its first argument."""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from collections.abc import Callable, MutableMapping
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.db import connections

from . import clock, values
from .exceptions import InvalidJobInput, JobCancelled, RowBusy

_logger = logging.getLogger("django_xjobs.job")
log = logging.getLogger("django_xjobs.worker")

# The job whose code runs in this thread (a sync job) or task (an async job): (id, name,
# attempt), for JobLogFilter. Set by the executor around the job's code (worker/executor.py).
_running: ContextVar[tuple[str, str, int] | None] = ContextVar("xjobs_running_job",
                                                               default=None)


def log_extra(job_id: str, name: str, attempt: int) -> dict[str, Any]:
    """The attributes every log line about a job carries (docs/observability.md, "Logs"):
    ``job_id``, ``job_name``, ``attempt``; pass as ``extra=``."""
    return {"job_id": job_id, "job_name": name, "attempt": attempt}


def log_prefix(job_id: str, name: str, attempt: int) -> str:
    """How a line about a job starts, whoever logs it: ``job <id> (<name>) attempt <n>``."""
    return f"job {job_id} ({name}) attempt {attempt}"


class JobLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """``ctx.logger``: the ``django_xjobs.job`` logger, each line starting with the job's id,
    name and attempt (``job <id> (<name>) attempt <n>: ``), which its record also carries as
    attributes (``job_id``, ``job_name``, ``attempt``), beside any ``extra=`` of the call."""

    def __init__(self, logger: logging.Logger, job_id: str, name: str, attempt: int) -> None:
        self.fields = log_extra(job_id, name, attempt)
        super().__init__(logger, self.fields)
        self.prefix = log_prefix(job_id, name, attempt) + ": "

    def process(self, msg: Any,
                kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        extra = kwargs.get("extra")
        kwargs["extra"] = {**extra, **self.fields} if extra else self.fields
        return f"{self.prefix}{msg}", kwargs


class JobLogFilter(logging.Filter):
    """A filter for the project's own handlers (``LOGGING``): a record logged while a job's code
    runs, by any logger (the job's module's ``logging.getLogger(__name__)`` included), gets the
    job's ``job_id``, ``job_name`` and ``attempt`` as attributes, unless it has them already;
    other records pass unchanged. It never drops a record (docs/observability.md, "Logs")."""

    def filter(self, record: logging.LogRecord) -> bool:
        job = _running.get()
        if job is not None and not hasattr(record, "job_id"):
            record.job_id, record.job_name, record.attempt = job
        return True


def enter_run(ctx: JobContext) -> Token[tuple[str, str, int] | None]:
    """Mark this thread (or task) as running ``ctx``'s job for :class:`JobLogFilter`, until
    :func:`leave_run` with the token returned."""
    return _running.set((ctx.job_id, ctx.name, ctx.attempt))


def leave_run(token: Token[tuple[str, str, int] | None]) -> None:
    _running.reset(token)

# ctx.progress(): at most one write per this many seconds per run reaches the database, plus the
# run's last values when it ends (docs/observability.md, "Progress").
PROGRESS_INTERVAL = 1.0
# A progress message longer than this is cut (ending in "...").
MAX_PROGRESS_MESSAGE = 200

# A run's write that found its job's row held by another transaction (RowBusy: a request's
# lock, an operator's change not committed yet) is written again after BUSY_RETRY_FIRST seconds,
# then at doubling intervals up to BUSY_RETRY_MAX: the run never waits in PostgreSQL's lock
# queue, and is settled within BUSY_RETRY_MAX of the row's release (docs/design.md, "Lock
# order"). The worker's acknowledgements follow the same schedule (worker/settle.py). The first
# pause is short because the usual holder is a sibling worker's claim, which can lock a row it
# then passes over until its own statement commits, a millisecond or two.
BUSY_RETRY_FIRST = 0.005
BUSY_RETRY_MAX = 1.0
# A settle whose row is still held at a retry this long after its first try is logged at INFO
# (before that, at DEBUG): a moment's hold is routine, a request's or an operator's is worth a
# line.
BUSY_NOTICE = 0.1

T = TypeVar("T")


def busy_pause(previous: float) -> float:
    """The pause before writing a busy row again, after ``previous`` (0.0: the first try
    found it busy): BUSY_RETRY_FIRST, then doubling up to BUSY_RETRY_MAX."""
    return min(BUSY_RETRY_MAX, 2 * previous) if previous else BUSY_RETRY_FIRST

# What a run's progress writer receives: done, total (or None), message (or None).
ProgressValues = tuple[float, float | None, str | None]


class StopSignal:
    """A one-way flag with ``threading.Event``'s interface (``is_set``, ``set``, ``wait``).

    A worker makes one per job; a real Event costs a Condition and two locks at creation, so
    the Event behind :meth:`wait` is only built when some code actually waits.
    """

    __slots__ = ("_event", "_flag")
    _guard = threading.Lock()

    def __init__(self) -> None:
        self._flag = False
        self._event: threading.Event | None = None

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        with self._guard:
            self._flag = True
            if self._event is not None:
                self._event.set()

    def wait(self, timeout: float | None = None) -> bool:
        if self._flag:
            return True
        with self._guard:
            if self._event is None:
                self._event = threading.Event()
                if self._flag:
                    self._event.set()
        return self._event.wait(timeout)


@dataclass(eq=False, kw_only=True, slots=True, weakref_slot=True)
class JobContext:
    """The running job as its code sees it.

    ``cancelled`` is set when the run must stop: the job was cancelled from outside, its
    timeout passed, the worker lost its lease or is shutting down. Long-running code may poll
    it (``if ctx.cancelled.is_set(): return``) or call :meth:`check_cancelled`; step boundaries
    check it for you. Whatever a stopped run returns afterwards is discarded.
    """

    job_id: str
    run_id: str
    name: str
    queue: str
    attempt: int
    max_attempts: int
    tenant_id: str | None
    traceparent: str | None
    # The claim's fence token: services that write about the run inside the job's own code
    # (backfills, whose batches commit with their progress) fence those writes on it.
    lease_token: str | None = None
    cancelled: StopSignal = field(default_factory=StopSignal)
    stop_reason: str | None = None
    # What check_cancelled raises: a JobCancelled, or a subclass naming why (SlotLost).
    stop_error: type[JobCancelled] = JobCancelled
    # Builds ``step`` on first use (the worker supplies it: it knows the engine and the lease).
    step_factory: Callable[[JobContext], Any] | None = None
    # Raises unless the run can still prove it holds its lease (the worker supplies it: it knows
    # when the lease was last renewed). Called before the job's body and before every step's
    # body (docs/guarantees.md).
    lease_proof: Callable[[], None] | None = None
    # Writes the run's progress, fenced, and says whether the run still owns its job (the worker
    # and the inline test mode supply it: engine.job_progress_if_owned). Without one (a context
    # of testing.make_context) ctx.progress only validates and keeps the values.
    progress_writer: Callable[[float, float | None, str | None], bool] | None = None
    _logger: JobLogger | None = None
    _step: Any = None
    _progress: _Progress | None = None

    @property
    def step(self) -> Any:
        """The durable steps of this run: ``run``, ``sleep``, ``sleep_until``,
        ``wait_for_event``, ``wait_for_any``, ``invoke``, ``gather`` (awaitable in an
        ``async def`` job)."""
        if self._step is None:
            if self.step_factory is None:
                raise RuntimeError("steps are only available to a job run by a worker")
            self._step = self.step_factory(self)
        return self._step

    @property
    def logger(self) -> JobLogger:
        """The ``django_xjobs.job`` logger for this run: every line starts with
        ``job <id> (<name>) attempt <n>:``, and its record carries ``job_id``, ``job_name`` and
        ``attempt`` as attributes, for a formatter's ``%(job_id)s`` or a JSON formatter
        (``extra=`` of a call is kept beside them).

        Built on first use: most jobs never log, and a worker builds one context per job."""
        if self._logger is None:
            self._logger = JobLogger(_logger, self.job_id, self.name, self.attempt)
        return self._logger

    @property
    def is_last_attempt(self) -> bool:
        """Whether a failure of this attempt ends the job ``dead`` (no attempt left)."""
        return self.attempt >= self.max_attempts

    def stop(self, reason: str, error: type[JobCancelled] = JobCancelled) -> None:
        """Ask the run to stop (the worker calls this); the first reason wins."""
        if not self.cancelled.is_set():
            self.stop_reason = reason
            self.stop_error = error
            self.cancelled.set()

    def check_cancelled(self) -> None:
        """Raise :class:`~django_xjobs.exceptions.JobCancelled` (or the subclass the worker
        named, e.g. ``SlotLost``) if the run was asked to stop."""
        if self.cancelled.is_set():
            raise self.stop_error(self.stop_reason or "cancelled")

    def progress(self, done: float, total: float | None = None,
                 message: str | None = None) -> None:
        """Report how far the run has got: ``done`` of ``total`` (units of your choosing),
        ``message`` a short line (cut at ``MAX_PROGRESS_MESSAGE`` characters). Cheap enough
        for every item of a loop: at most one write per ``PROGRESS_INTERVAL`` (1 s) reaches the
        database (the first call writes at once, later calls within the interval only keep the
        newest values, which the next call after it writes), and the newest values are written
        when the job's code returns or raises, before the run's outcome. The write is fenced
        like the run's others: once it finds that the run no longer owns its job, progress stops
        being written (the run itself is stopped by its worker). In an ``async def`` job the
        write runs in a thread (``in_thread``) and is not waited for; the event loop never
        blocks on it. Raises :class:`~django_xjobs.exceptions.InvalidJobInput` for values it
        cannot record."""
        reported = progress_values(done, total, message)
        state = self._progress
        if state is None:
            state = self._progress = _Progress()
        due = state.report(reported, clock.monotonic())
        if due is None or self.progress_writer is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a sync job: its own thread, its own connection
            self._write_progress(state, due)
            return
        state.writing = loop.create_task(self._write_progress_in_thread(state, due))

    @property
    def last_progress(self) -> ProgressValues | None:
        """The newest ``(done, total, message)`` the run reported, written yet or not (None
        before the first ``ctx.progress``)."""
        return self._progress.last if self._progress is not None else None

    def flush_progress(self) -> None:
        """Write the progress still held back by the interval (the executor calls this when the
        job's code ends, before its outcome is settled, so the last values are never lost). A
        stopped run writes nothing: its outcome is already decided, its lease maybe lost. A
        database error here is logged, never raised: it must not change the run's outcome."""
        state = self._progress
        if state is None or self.progress_writer is None or self.cancelled.is_set():
            return
        due = state.pending_values()
        if due is None:
            return
        try:
            self._write_progress(state, due)
        except Exception as exc:
            log.warning("%s: its last progress could not be written (%s)", self._prefix(), exc,
                        extra=self._extra())

    async def aflush_progress(self) -> None:
        """:meth:`flush_progress` of an ``async def`` job: after the write in flight, off the
        event loop."""
        state = self._progress
        if state is None or self.progress_writer is None or self.cancelled.is_set():
            return
        if state.writing is not None:
            await asyncio.gather(state.writing, return_exceptions=True)
        due = state.pending_values()
        if due is not None and not self.cancelled.is_set():
            await self._write_progress_in_thread(state, due)

    def _write_progress(self, state: _Progress, due: ProgressValues) -> None:
        assert self.progress_writer is not None
        if not self.progress_writer(*due):
            # The run lost its job (cancelled, or re-claimed after its lease lapsed): the
            # heartbeat stops the run; its progress is no longer this run's to write.
            state.lost = True
            log.debug("%s: progress not recorded, this run no longer owns the job",
                      self._prefix(), extra=self._extra())

    async def _write_progress_in_thread(self, state: _Progress, due: ProgressValues) -> None:
        try:
            await in_thread(self._write_progress, state, due)
        except Exception as exc:  # nobody awaits this write: the job goes on without it
            log.warning("%s: progress could not be written (%s)", self._prefix(), exc,
                        extra=self._extra())

    def _prefix(self) -> str:
        return log_prefix(self.job_id, self.name, self.attempt)

    def _extra(self) -> dict[str, Any]:
        return log_extra(self.job_id, self.name, self.attempt)

    def prove_lease(self) -> None:
        """Before a body starts (the job's, a step's): raise ``JobCancelled`` if the run was
        asked to stop or can no longer prove that its lease is still valid; in the latter case
        the worker hands the job back."""
        if self.lease_proof is not None:
            self.lease_proof()
        self.check_cancelled()


class _Progress:
    """The rate limit and the held-back values of one run's ``ctx.progress``."""

    __slots__ = ("last", "lock", "lost", "pending", "writing", "written_at")

    def __init__(self) -> None:
        self.lock = threading.Lock()  # a job may report from threads of its own
        self.last: ProgressValues | None = None
        self.pending: ProgressValues | None = None  # held back by the interval
        self.written_at: float | None = None  # monotonic, when the last write began
        self.lost = False  # a write found the run no longer owns its job
        self.writing: asyncio.Task[None] | None = None  # an async job's write in flight

    def report(self, reported: ProgressValues, now: float) -> ProgressValues | None:
        """Keep ``reported``; the values to write now, or None (held back, or no more
        writes)."""
        with self.lock:
            self.last = reported
            if self.lost:
                return None
            if ((self.written_at is not None and now - self.written_at < PROGRESS_INTERVAL)
                    or (self.writing is not None and not self.writing.done())):
                self.pending = reported
                return None
            self.written_at = now
            self.pending = None
            return reported

    def pending_values(self) -> ProgressValues | None:
        """The held-back values, taken (None when there are none or the run lost its job)."""
        with self.lock:
            due, self.pending = self.pending, None
            return None if self.lost else due


def progress_values(done: Any, total: Any = None, message: Any = None) -> ProgressValues:
    """``ctx.progress``'s arguments as stored, or :class:`InvalidJobInput` saying what is
    wrong: numbers (not bools) that are finite and >= 0, a total > 0 (done may exceed it: the
    work grew), a message of text, cut at :data:`MAX_PROGRESS_MESSAGE` characters."""
    done_f = _progress_number("done", done)
    total_f = _progress_number("total", total) if total is not None else None
    if total_f is not None and total_f <= 0:
        raise InvalidJobInput(f"progress total must be > 0 (or None when unknown), got {total!r}")
    if message is not None:
        if not isinstance(message, str):
            raise InvalidJobInput(
                f"progress message must be a string or None, got {type(message).__name__}")
        if "\x00" in message or not values.is_utf8(message):
            raise InvalidJobInput("progress message contains NUL or a lone surrogate, which "
                                  "stored text cannot hold")
        if len(message) > MAX_PROGRESS_MESSAGE:
            message = message[:MAX_PROGRESS_MESSAGE - 3] + "..."
    return done_f, total_f, message or None


def _progress_number(what: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidJobInput(f"progress {what} must be a number, got {values.safe_repr(value)}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number) or number < 0:
        raise InvalidJobInput(
            f"progress {what} must be a finite number >= 0, got {values.safe_repr(value):.40}")
    return number


async def in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """Database work of an async job, off the event loop, in a thread that looks after its Django
    connections: a connection that failed (the server dropped it, the network broke) is closed
    after the call that met it, so the next call reconnects, and one whose health check fails
    (CONN_HEALTH_CHECKS) is replaced before. The event loop's pool threads live as long as the
    worker, so without this one dropped connection would fail every later call on its thread.
    Healthy connections stay open across calls (closing them per call would open a connection
    for every step with CONN_MAX_AGE = 0)."""

    def call() -> Any:
        for conn in connections.all(initialized_only=True):
            conn.close_if_health_check_failed()
        try:
            return fn(*args)
        finally:
            for conn in connections.all(initialized_only=True):
                if conn.errors_occurred:
                    conn.close_if_unusable_or_obsolete()

    return await asyncio.to_thread(call)


def until_free(write: Callable[[], T], stop: StopSignal | threading.Event,
               check: Callable[[], None]) -> T:
    """``write()`` again while it raises RowBusy, on BUSY_RETRY_FIRST..BUSY_RETRY_MAX: a step's
    or a batch's fenced write whose job row another transaction holds. Between tries the run
    may be stopped (``stop`` set: its lease lost, the job cancelled): ``check()`` then raises."""
    pause = 0.0
    while True:
        try:
            return write()
        except RowBusy:
            pause = busy_pause(pause)
            if stop.wait(pause):
                check()
