"""Resumable data backfills: ``@backfill`` and :class:`Batch`, and the pass protocol.

A backfill walks a table in batches with a cursor of its own choosing (a keyset: the last id it
touched)::

    @backfill("accounts.normalize_emails", batch_size=1000)
    def normalize_emails(ctx, cursor):
        ids = list(User.objects.filter(pk__gt=cursor or 0).order_by("pk")
                   .values_list("pk", flat=True)[:ctx.batch_size])
        User.objects.filter(pk__in=ids).update(email=Lower("email"))
        return Batch(ids[-1] if len(ids) == ctx.batch_size else None, len(ids))

A **pass** is one walk from the start (cursor None) to a batch whose ``next_cursor`` is None. It
runs as a job (job name ``backfill:<name>``, idempotency key ``backfill:<name>``: one live pass
per backfill), and its progress lives in one ``x_backfills`` row keyed by the job's ``run_id``,
which the job keeps across every retry. The database is authoritative for ownership (the job's
lease token) and for progress (the row); the worker holds nothing that a crash could lose.

States of a pass (``x_backfills.status``) and what moves it::

    start ─▶ pending ─(a worker claims the job; backfill_start_if_owned)─▶ running
    running ─(the final batch's transaction)──────────────────────────────▶ completed
    running ─(a batch raised; its transaction rolled back)────────────────▶ failed
    pending/running/failed ─(xjobs_backfill cancel)────────────────────────▶ cancelled
    failed/cancelled ─(the job is retried, and claimed; start adopts it)───▶ running
    running ─(worker killed: the lease lapses, another worker re-claims)───▶ running

What commits with what (each line is one transaction):

1. ``start``: the pass's job is enqueued and its row recorded ``pending``.
2. The worker opens the row (``backfill_start_if_owned``): a retried or re-claimed pass ADOPTS
   its row, keeping started_at, checksum, app_version and its progress, and clearing
   completed_at. A completed row is left completed and the job simply ends (its ack was lost).
3. Every batch: the backfill function's writes AND the progress update (rows_processed + n,
   last_cursor = next_cursor), or for the final batch the completion (cursor cleared). The
   progress statement locks the job's row and requires (id, running, lease_token): a run that
   lost its job matches nothing, and the batch is rolled back. So a crash at any moment
   resumes exactly after the last committed batch, and no batch commits twice.
4. A batch that raised: after its rollback, ``failed`` with the error; the cursor stays at the
   last committed batch. The job then fails by its own policy (retries with backoff, or dead).
5. ``cancel``: the job is cancelled and the row marked ``cancelled``.

Timeouts: the lease (``XJOBS["LEASE"]``) bounds how long a killed worker's pass waits before
another worker resumes it. The worker's heartbeat thread renews the lease every
``XJOBS["HEARTBEAT"]`` whatever a batch does, so a batch may run longer than a lease; a worker
that cannot renew for a whole lease stops the run itself, and the batch in flight then fails
its fence and rolls back. A cancel reaches the pass at the next heartbeat (the run is told to
stop) or at its next batch's fence, whichever comes first; between batches the pass checks
``ctx.cancelled`` and waits out its throttle on it, so neither a cancel nor a shutdown waits
for a throttle to end.

Fault points (``django_xjobs.faults``, for crash tests): ``backfill:before-progress`` (the
batch's writes done, its progress not yet written), ``backfill:after-commit`` and
``backfill:completed`` (after the final batch's commit, before the job's ack).

One transaction needs one database: the user's writes and ``x_backfills`` must share an alias.
A backfill declares the alias it writes to (``using=``, default ``"default"``), and a backfill
whose alias is not ``XJOBS["DATABASE"]`` is refused when it is declared, started or run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, overload
from uuid import UUID

from django.conf import settings

from . import api, conf, faults, registry, values
from .api import acting_as
from .context import JobContext, StopSignal, until_free
from .engines import Engine, get_engine
from .exceptions import (
    BackfillNotFound,
    BadBatch,
    ConfigurationError,
    DryRunFailed,
    InvalidJobInput,
    InvalidTransition,
    JobCancelled,
    LiveJobExists,
    PermanentError,
    Snooze,
    UnknownBackfill,
)
from .records import BACKFILL_STATUSES, LIVE_STATES, BackfillRecord, Claim, RunOwner
from .values import encode_json, format_error

log = logging.getLogger("django_xjobs.backfill")

JOB_PREFIX = "backfill:"
MAX_NAME = 200 - len(JOB_PREFIX)  # the job name must stay a valid job name
MAX_BATCH_SIZE = 1_000_000
MAX_THROTTLE = 3600.0
MAX_CURSOR_BYTES = 64 * 1024  # a cursor is a position, not a payload: it is rewritten per batch
DEFAULT_QUEUE = "backfills"

_lock = threading.Lock()
_backfills: dict[str, BackfillDefinition] = {}


@dataclass(frozen=True, slots=True)
class Batch:
    """What one call of a backfill function returns.

    ``next_cursor``: the JSON value the next call receives (e.g. the last id this batch
    touched), or None when this batch was the last. ``processed``: how many rows this batch
    processed (added to the pass's ``rows_processed``).
    """

    next_cursor: Any
    processed: int


@dataclass(eq=False, kw_only=True, slots=True)
class BackfillContext:
    """What a backfill function receives as ``ctx``.

    ``batch_size`` is the size this pass asked for (the decorator's, or ``start --batch-size``).
    ``dry_run`` is True under ``start --dry-run``: the batch's database writes are rolled back,
    but nothing else is, so skip side effects outside the database. ``cancelled`` is set when
    the run must stop; a long batch may poll it (or call :meth:`check_cancelled`).
    """

    name: str
    run_id: str | None
    job_id: str | None
    attempt: int
    batch_size: int
    dry_run: bool = False
    cancelled: StopSignal = field(default_factory=StopSignal)
    _logger: logging.LoggerAdapter[Any] | None = None

    @property
    def logger(self) -> logging.LoggerAdapter[Any]:
        if self._logger is None:
            self._logger = logging.LoggerAdapter(
                log, {"backfill": self.name, "run_id": self.run_id, "job_id": self.job_id}
            )
        return self._logger

    def check_cancelled(self) -> None:
        if self.cancelled.is_set():
            raise JobCancelled("backfill pass asked to stop")


@dataclass(frozen=True, slots=True, kw_only=True)
class PassHandle:
    """A pass that was started or resumed: its run id (the row), its job, and whether this call
    created it (False: a live pass of this backfill already existed, and this is it)."""

    name: str
    run_id: UUID
    job_id: UUID
    created: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class PassChange:
    """An operator action on a pass: the row after it, and whether this call changed it."""

    record: BackfillRecord
    changed: bool
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Progress:
    """How far a pass is: rates are the average since the pass began (pauses included)."""

    rows_processed: int
    total: int | None = None
    total_error: str | None = None
    fraction: float | None = None
    elapsed: float | None = None  # seconds from started_at to the last progress (or the end)
    rate: float | None = None  # rows per second
    eta: float | None = None  # seconds left at that rate, for a running pass with a total
    eta_at: datetime | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class DryRunBatch:
    cursor: Any
    next_cursor: Any
    processed: int
    seconds: float


@dataclass(frozen=True, slots=True, kw_only=True)
class DryRunReport:
    name: str
    batch_size: int
    batches: list[DryRunBatch]
    finished: bool  # the last batch returned next_cursor None
    stalled: bool  # a batch returned the cursor it was given (see dry_run)

    @property
    def rows(self) -> int:
        return sum(b.processed for b in self.batches)


# ---------------------------------------------------------------------------- definitions --


@dataclass(eq=False, kw_only=True)
class BackfillDefinition:
    """A registered backfill. ``definition(ctx, cursor)`` calls the function directly (tests);
    ``definition.start()`` starts a pass; ``@definition.total`` registers the total hook."""

    func: Callable[[BackfillContext, Any], Batch]
    name: str
    batch_size: int = 1000
    queue: str = DEFAULT_QUEUE
    throttle: float | None = None  # seconds; None = XJOBS["BACKFILL_THROTTLE"]
    max_attempts: int | None = None  # None = XJOBS["MAX_ATTEMPTS"]
    using: str = "default"
    total_hook: Callable[[], int] | None = None
    checksum: str = ""

    def __call__(self, ctx: BackfillContext, cursor: Any) -> Batch:
        return self.func(ctx, cursor)

    def __repr__(self) -> str:
        return f"<Backfill {self.name} batch_size={self.batch_size} queue={self.queue}>"

    @property
    def job_name(self) -> str:
        return JOB_PREFIX + self.name

    def total(self, func: Callable[[], int]) -> Callable[[], int]:
        """Decorator: ``@my_backfill.total`` names a function returning how many rows the
        whole pass processes (an estimate is fine); ``show`` then gives a percentage and an
        ETA. It runs in the operator's process, at each ``show``."""
        if not callable(func):
            raise ConfigurationError(f"{self.name}: total must be a function, got {func!r}")
        self.total_hook = func
        return func

    def start(self, *, batch_size: int | None = None,
              throttle: timedelta | float | str | None = None) -> PassHandle:
        return start(self.name, batch_size=batch_size, throttle=throttle)


def checksum_of(func: Callable[..., Any]) -> str:
    """sha256 of the function's source: what "the same code" means for a resumed pass.

    Without source (a function built at run time), the code object's bytecode and constants
    stand in: they change when the code does, though also across Python versions.
    """
    try:
        text = inspect.getsource(func).encode("utf-8")
    except (OSError, TypeError):
        code = getattr(func, "__code__", None)
        text = repr((code.co_code, code.co_consts) if code is not None else func).encode()
    return hashlib.sha256(text).hexdigest()


def _positive_int(what: str, value: Any, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise ConfigurationError(f"{what} must be an integer from 1 to {maximum}, got {value!r}")
    return value


def parse_throttle(what: str, value: Any) -> float:
    seconds = values.parse_duration(value, what=what)
    if seconds > MAX_THROTTLE:
        raise ConfigurationError(f"{what} must be at most {MAX_THROTTLE:g}s, got {value!r}")
    return seconds


def count_total(definition: BackfillDefinition) -> tuple[int | None, str | None]:
    """(total, None) from the backfill's ``total`` hook, (None, why) when it failed, or
    (None, None) without a hook: a listing must not fail because an estimate did."""
    if definition.total_hook is None:
        return None, None
    try:
        value = definition.total_hook()
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None, f"total() returned {value!r}, not an integer >= 0"
    return value, None


def check_alias(definition: BackfillDefinition) -> None:
    """Refuse a backfill whose writes cannot share a transaction with its progress row."""
    jobs_alias = conf.get().database
    if definition.using != jobs_alias:
        raise ConfigurationError(
            f"backfill {definition.name!r} writes to database alias {definition.using!r}, but "
            f"the job tables live on XJOBS['DATABASE'] = {jobs_alias!r}: a batch and its "
            "progress can only commit in one transaction on one database, which is what makes "
            "a resumed pass process no row twice. Keep the x_ tables on the alias the backfill "
            f"writes to (see {conf.DOCS_URL}backfills.md)."
        )


def build(
    func: Callable[..., Any],
    *,
    name: str | None = None,
    batch_size: int = 1000,
    queue: str = DEFAULT_QUEUE,
    throttle: timedelta | float | str | None = None,
    max_attempts: int | None = None,
    using: str = "default",
    total: Callable[[], int] | None = None,
) -> BackfillDefinition:
    """Validate a backfill declaration (everything the decorator checks, nothing registered)."""
    if not callable(func):
        raise ConfigurationError(f"@backfill must decorate a function, got {func!r}")
    if inspect.iscoroutinefunction(func):
        raise ConfigurationError(
            f"@backfill {getattr(func, '__qualname__', func)}: a backfill must be a plain "
            "function (each batch runs inside a database transaction), not async def"
        )
    backfill_name = name if name is not None else registry.default_name(func)
    if not isinstance(backfill_name, str) or not values.NAME_RE.match(backfill_name) or (
        len(backfill_name) > MAX_NAME
    ):
        raise ConfigurationError(
            f"Backfill name {backfill_name!r} is not valid: use 1-{MAX_NAME} characters from "
            "[A-Za-z0-9_.:-]"
        )
    values.check_name("Queue name", queue, error=ConfigurationError)
    if not isinstance(using, str) or not using:
        raise ConfigurationError(f"{backfill_name}: using must be a database alias")
    definition = BackfillDefinition(
        func=func,
        name=backfill_name,
        batch_size=_positive_int(f"{backfill_name}: batch_size", batch_size, MAX_BATCH_SIZE),
        queue=queue,
        throttle=(None if throttle is None
                  else parse_throttle(f"{backfill_name}: throttle", throttle)),
        max_attempts=(None if max_attempts is None
                      else _positive_int(f"{backfill_name}: max_attempts", max_attempts,
                                         registry.INT32)),
        using=using,
        checksum=checksum_of(func),
    )
    if total is not None:
        definition.total(total)
    return definition


def register(definition: BackfillDefinition) -> BackfillDefinition:
    """Register the backfill and the job that runs its passes.

    A backfill on another alias than the job tables is not refused here, where settings may not
    be configured yet and an exception would break the import of a whole module: the system
    check ``xjobs.E050`` reports it at startup, and start and run refuse it (check_alias)."""
    with _lock:
        existing = _backfills.get(definition.name)
        if existing is not None and (
            registry.qualname(existing.func) != registry.qualname(definition.func)
        ):
            raise ConfigurationError(
                f"Backfill name {definition.name!r} is already registered by "
                f"{registry.qualname(existing.func)}; pass @backfill(name) to tell them apart"
            )
        job: registry.JobDefinition[..., Any] = registry.JobDefinition.build(
            _pass_function(definition.name), name=definition.job_name, queue=definition.queue,
            max_attempts=definition.max_attempts,
        )
        registry.register(job)
        _backfills[definition.name] = definition
    return definition


@overload
def backfill(func: Callable[..., Any], /) -> BackfillDefinition: ...
@overload
def backfill(
    name: str | None = ..., /, *,
    batch_size: int = ...,
    queue: str = ...,
    throttle: timedelta | float | str | None = ...,
    max_attempts: int | None = ...,
    using: str = ...,
    total: Callable[[], int] | None = ...,
) -> Callable[[Callable[..., Any]], BackfillDefinition]: ...
def backfill(name_or_func: Any = None, /, **options: Any) -> Any:
    """Register a backfill: ``@backfill("app.name", batch_size=1000, queue="backfills")``.

    The function is called as ``func(ctx, cursor)`` (cursor None for the first batch) and
    returns ``Batch(next_cursor, processed)``. Options: ``batch_size`` (``ctx.batch_size``,
    default 1000), ``queue`` (default ``"backfills"``: run a worker on it), ``throttle`` (pause
    between batches), ``max_attempts`` (of the pass's job), ``using`` (the database alias the
    backfill writes to; it must be ``XJOBS["DATABASE"]``), ``total`` (see
    :meth:`BackfillDefinition.total`). Bare ``@backfill`` names it like a job.
    """
    known = {"batch_size", "queue", "throttle", "max_attempts", "using", "total"}
    unknown = set(options) - known
    if unknown:
        raise ConfigurationError(f"@backfill got unknown option(s) {sorted(unknown)}")
    if callable(name_or_func):
        return register(build(name_or_func, **options))
    if name_or_func is not None and not isinstance(name_or_func, str):
        raise ConfigurationError(f"@backfill takes a name, got {name_or_func!r}")

    def decorate(func: Callable[..., Any]) -> BackfillDefinition:
        return register(build(func, name=name_or_func, **options))

    return decorate


def get(name: str) -> BackfillDefinition:
    try:
        return _backfills[name]
    except (KeyError, TypeError):
        known = ", ".join(sorted(_backfills)) or "none"
        raise UnknownBackfill(
            f"No backfill named {name!r} is registered in this process (known: {known}); is "
            "its app in INSTALLED_APPS and the module that declares it imported by its jobs.py?"
        ) from None


def lookup(name: str) -> BackfillDefinition | None:
    return _backfills.get(name)


def all_backfills() -> dict[str, BackfillDefinition]:
    return dict(_backfills)


def unregister(name: str) -> None:
    """Forget a backfill and its job (tests)."""
    with _lock:
        definition = _backfills.pop(name, None)
    if definition is not None:
        registry.unregister(definition.job_name)


# ------------------------------------------------------------------------------ app version --

_versions: dict[tuple[str, ...], str] = {}


def project_version(modules: tuple[str, ...]) -> str:
    """The version of the first installed distribution that provides one of ``modules``' top
    packages, else "". Looked up once per set of modules."""
    cached = _versions.get(modules)
    if cached is not None:
        return cached
    # Imported here: about 50 ms of start-up that only a backfill pass needs.
    from importlib import metadata

    found = ""
    provided = metadata.packages_distributions()
    for module in modules:
        for dist in provided.get(module.split(".")[0], ()):
            try:
                found = metadata.version(dist)
            except metadata.PackageNotFoundError:
                continue
            break
        if found:
            break
    _versions[modules] = found
    return found


def app_version(definition: BackfillDefinition) -> str:
    """``XJOBS["APP_VERSION"]``; by default the version of the project's installed package: the
    distribution providing the settings module's top package, else the one providing the
    backfill's own module; else "" (a project that is not pip-installed has no version)."""
    configured = conf.get().app_version
    if configured is not None:
        return configured
    modules = tuple(m for m in (getattr(settings, "SETTINGS_MODULE", None),
                                definition.func.__module__) if m)
    return project_version(modules)


# ------------------------------------------------------------------------------- the pass --


class _NotOwned(Exception):
    """The batch's fenced progress write matched nothing: roll the batch back."""


class _RollBack(Exception):
    """Undo a dry run's batch, or an operator action that lost a race."""


def _pass_function(name: str) -> Callable[..., Any]:
    """The job function of ``name``'s passes (looked up by name when it runs, so a deploy that
    changes the backfill's code is what the next attempt runs)."""

    def run_pass(ctx: JobContext, batch_size: int | None = None,
                 throttle: float | None = None, **unknown: Any) -> dict[str, Any]:
        if unknown:  # enqueued by hand with input `start` never writes: retrying cannot help
            raise PermanentError(
                f"backfill {name}: unknown pass option(s) {sorted(unknown)}; start passes with "
                "manage.py xjobs_backfill start"
            )
        return _Pass(get(name), ctx, batch_size=batch_size, throttle=throttle).run()

    run_pass.__qualname__ = f"run_pass[{name}]"
    return run_pass


def _validated(definition: BackfillDefinition, result: Any) -> tuple[Any, int, str | None]:
    """(next_cursor, processed, cursor JSON) of a batch, or BadBatch."""
    if not isinstance(result, Batch):
        raise BadBatch(
            f"backfill {definition.name} returned {type(result).__name__} "
            f"({result!r:.80}), not Batch(next_cursor, processed)"
        )
    processed = result.processed
    if isinstance(processed, bool) or not isinstance(processed, int) or processed < 0:
        raise BadBatch(
            f"backfill {definition.name}: Batch.processed must be an integer >= 0, got "
            f"{processed!r}"
        )
    if result.next_cursor is None:
        return None, processed, None
    what = f"cursor of backfill {definition.name}"
    try:
        cursor_json = encode_json(result.next_cursor, what=what, limit=None)
    except InvalidJobInput as exc:
        raise BadBatch(str(exc)) from None
    size = len(cursor_json.encode("utf-8"))
    if size > MAX_CURSOR_BYTES:
        raise BadBatch(
            f"{what} is {size} bytes as JSON, over the {MAX_CURSOR_BYTES} a cursor may take: a "
            "cursor is a position (the last key of the batch), not data"
        )
    return result.next_cursor, processed, cursor_json


class _Pass:
    """One attempt of a pass, inside its job (see the module docstring)."""

    def __init__(self, definition: BackfillDefinition, ctx: JobContext, *,
                 batch_size: int | None, throttle: float | None) -> None:
        self.definition = definition
        self.ctx = ctx
        self.batch_size = definition.batch_size if batch_size is None else batch_size
        if throttle is None:
            throttle = definition.throttle
        self.throttle = conf.get().backfill_throttle if throttle is None else throttle

    def run(self) -> dict[str, Any]:
        definition, ctx = self.definition, self.ctx
        try:
            check_alias(definition)
            _positive_int("batch_size", self.batch_size, MAX_BATCH_SIZE)
            parse_throttle("throttle", self.throttle)
        except ConfigurationError as exc:
            raise PermanentError(str(exc)) from None
        if ctx.lease_token is None:
            raise PermanentError(f"backfill {definition.name}: a pass runs only in a worker")
        engine = get_engine()
        owner = RunOwner(claim=Claim(job_id=ctx.job_id, lease_token=ctx.lease_token),
                         run_id=ctx.run_id)
        version = app_version(definition)
        record = until_free(lambda: engine.backfill_start_if_owned(
            owner, name=definition.name, checksum=definition.checksum, app_version=version,
        ), ctx.cancelled, ctx.check_cancelled)
        if record is None:
            raise JobCancelled("backfill pass not opened: this run no longer owns its job")
        if record.status == "completed":
            log.info("backfill %s run %s: already completed (%d rows); nothing to do",
                     definition.name, ctx.run_id, record.rows_processed)
            return self._result("completed", record.rows_processed, 0)
        if record.checksum != definition.checksum:
            log.warning(
                "backfill %s run %s resumed under different code: checksum %s when the pass "
                "began (app version %r), %s now (%r), at %d rows; recorded in code_changes",
                definition.name, ctx.run_id, (record.checksum or "?")[:12], record.app_version,
                definition.checksum[:12], version, record.rows_processed,
            )
        log.info("backfill %s run %s attempt %d: %s at %d rows (cursor %r), batch size %d, "
                 "throttle %gs", definition.name, ctx.run_id, ctx.attempt,
                 "resuming" if record.last_cursor is not None else "starting",
                 record.rows_processed, record.last_cursor, self.batch_size, self.throttle)
        bctx = BackfillContext(
            name=definition.name, run_id=ctx.run_id, job_id=ctx.job_id, attempt=ctx.attempt,
            batch_size=self.batch_size, cancelled=ctx.cancelled,
        )
        cursor = record.last_cursor
        rows = record.rows_processed
        batches = 0
        # The job's progress (docs/observability.md, "Progress"): rows since the pass began, of
        # the total hook's count, read once per attempt (a hook that fails, or counts nothing,
        # leaves the progress without a total and so without an ETA).
        total, _ = count_total(definition)
        while True:
            # Between batches: a lost lease, a cancel seen by the heartbeat, a shutdown past
            # its grace period. The next batch's fence would refuse it anyway; this saves the
            # batch's work.
            ctx.check_cancelled()
            next_cursor, rows = self._batch(engine, owner, bctx, cursor)
            batches += 1
            ctx.progress(rows, total or None, f"{rows:,} rows, {batches} batches this attempt")
            if next_cursor is None:
                log.info("backfill %s run %s completed: %d rows (%d batches in this attempt)",
                         definition.name, ctx.run_id, rows, batches)
                return self._result("completed", rows, batches)
            cursor = next_cursor
            if self.throttle > 0:
                ctx.cancelled.wait(self.throttle)

    @staticmethod
    def _result(status: str, rows: int, batches: int) -> dict[str, Any]:
        return {"status": status, "rows_processed": rows, "batches": batches}

    def _batch(self, engine: Engine, owner: RunOwner, bctx: BackfillContext,
               cursor: Any) -> tuple[Any, int]:
        """One batch and its progress in ONE transaction; (next_cursor, rows_processed)."""
        definition = self.definition
        try:
            with engine.atomic():
                # Jobs the batch enqueues join its transaction and name the backfill.
                with acting_as(f"backfill:{definition.name}"):
                    result = definition.func(bctx, cursor)
                next_cursor, processed, cursor_json = _validated(definition, result)
                if faults.armed:
                    faults.hit("backfill:before-progress")
                # A job row another transaction holds is waited for here, polling inside the
                # batch's transaction (its writes stay uncommitted meanwhile), never in the
                # lock queue (docs/design.md, "Lock order").
                if cursor_json is None:
                    rows = until_free(
                        lambda: engine.backfill_complete_if_owned(owner, processed=processed),
                        self.ctx.cancelled, self.ctx.check_cancelled)
                else:
                    rows = until_free(
                        lambda: engine.backfill_progress_if_owned(
                            owner, processed=processed, cursor_json=cursor_json),
                        self.ctx.cancelled, self.ctx.check_cancelled)
                if rows is None:
                    raise _NotOwned
        except _NotOwned:
            raise JobCancelled(self._lost_reason(engine)) from None
        except (JobCancelled, Snooze):
            raise  # a stop or a pause, not a failure: the batch rolled back, the pass stays
        except Exception as exc:
            if not self.ctx.cancelled.is_set():
                self._record_failure(engine, owner, exc)
            raise
        if faults.armed:
            faults.hit("backfill:after-commit")
            if next_cursor is None:
                faults.hit("backfill:completed")
        return next_cursor, rows

    def _lost_reason(self, engine: Engine) -> str:
        record = engine.backfill_get(self.ctx.run_id)
        if record is not None and record.status != "running":
            return (f"backfill pass {record.status}: the batch in flight was rolled back and "
                    "the pass stops")
        return ("this run no longer owns its job (cancelled, or re-claimed after its lease "
                "lapsed): the batch in flight was rolled back")

    def _record_failure(self, engine: Engine, owner: RunOwner, exc: BaseException) -> None:
        try:
            recorded = engine.backfill_fail_if_owned(owner, error=format_error(exc))
        except Exception as write_exc:
            # The batch's error is what the job reports; the pass's row then stays `running`
            # and the job's retry adopts it from the last committed batch all the same.
            if engine.is_connection_error(write_exc):
                engine.reset_connection()
            log.warning("backfill %s run %s: the failure could not be recorded (%s)",
                        self.definition.name, self.ctx.run_id, write_exc)
            return
        if not recorded:
            raise JobCancelled(
                "backfill failure not recorded: this run no longer owns its job"
            ) from exc


# ------------------------------------------------------------------------------- operators --


def _run_id(value: Any) -> str:
    try:
        return str(value if isinstance(value, UUID) else UUID(str(value)))
    except ValueError:
        raise InvalidJobInput(f"run id {value!r} is not a UUID") from None


def start(name: str, *, batch_size: int | None = None,
          throttle: timedelta | float | str | None = None) -> PassHandle:
    """Start a pass of ``name``: its job is enqueued and its row recorded ``pending``, in one
    transaction. One live pass per backfill: while one is live, this returns it
    (``created=False``) and changes nothing. Bad options raise before anything is written."""
    definition = get(name)
    check_alias(definition)
    input: dict[str, Any] = {}
    if batch_size is not None:
        input["batch_size"] = _positive_int("batch size", batch_size, MAX_BATCH_SIZE)
    if throttle is not None:
        input["throttle"] = parse_throttle("throttle", throttle)
    job = registry.get(definition.job_name)
    engine = get_engine()
    with engine.atomic():
        handle = api.enqueue_job(job, input, {"idempotency_key": definition.job_name})
        if handle.created:
            engine.backfill_create(
                run_id=str(handle.run_id), name=definition.name, job_id=str(handle.id),
                checksum=definition.checksum, app_version=app_version(definition),
            )
    return PassHandle(name=definition.name, run_id=handle.run_id, job_id=handle.id,
                      created=handle.created)


def list_passes(*, name: str | None = None, status: str | None = None,
                run_id: Any = None, limit: int = 50) -> list[BackfillRecord]:
    if status is not None and status not in BACKFILL_STATUSES:
        raise InvalidJobInput(
            f"status {status!r} is not a pass status ({', '.join(BACKFILL_STATUSES)})"
        )
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidJobInput(f"limit must be a positive integer, got {limit!r}")
    return get_engine().backfills_list(
        name=name, status=status, run_id=None if run_id is None else _run_id(run_id),
        limit=limit,
    )


def get_pass(run_id: Any) -> BackfillRecord:
    record = get_engine().backfill_get(_run_id(run_id))
    if record is None:
        raise BackfillNotFound(f"no backfill pass with run id {run_id}")
    return record


def cancel(run_id: Any) -> PassChange:
    """Stop a pass: its job is cancelled (a running pass stops at its next batch boundary; the
    batch in flight, if any, rolls back) and its row marked ``cancelled``, in one transaction.
    Its cursor is kept: :func:`retry` resumes it."""
    record = get_pass(run_id)
    if record.status in ("completed", "cancelled"):
        return PassChange(record=record, changed=False, reason=f"already {record.status}")
    engine = get_engine()
    try:
        with engine.atomic():
            # The job first: the same lock order as every batch (x_jobs, then x_backfills).
            if record.job_id is not None:
                engine.job_cancel(str(record.job_id), reason="cancelled: backfill pass cancelled")
            cancelled = engine.backfill_cancel(str(record.run_id))
            if cancelled is None:
                raise _RollBack  # it completed meanwhile: leave its job alone too
    except _RollBack:
        current = get_pass(run_id)
        return PassChange(record=current, changed=False, reason=f"already {current.status}")
    return PassChange(record=get_pass(run_id), changed=True)


def retry(run_id: Any) -> PassHandle:
    """Resume a pass from its cursor: its job is retried (same run id, a fresh set of
    attempts), or, if retention purged the job, enqueued again under the same run id.

    For a ``failed`` or ``cancelled`` pass, and for a ``running`` or ``pending`` one whose job
    is no longer live (cancelled with ``xjobs cancel``, or dead after too many lost leases: the
    pass had no chance to record it). Raises :class:`InvalidTransition` for a completed pass, or
    one whose job is still live (it goes on by itself)."""
    record = get_pass(run_id)
    if record.status == "completed":
        raise InvalidTransition(
            f"pass {record.run_id} of {record.name} is completed: there is nothing to resume"
        )
    if record.job_state in LIVE_STATES:
        raise InvalidTransition(
            f"pass {record.run_id} of {record.name} is {record.status} and its job "
            f"{record.job_id} is {record.job_state}: it goes on by itself (manage.py xjobs "
            f"run-now {record.job_id} brings a delayed retry forward)"
        )
    if record.job_state == "done":
        raise InvalidTransition(
            f"pass {record.run_id} of {record.name} is {record.status} but its job "
            f"{record.job_id} is done; start a new pass"
        )
    definition = get(record.name)
    check_alias(definition)
    if record.job_state in ("dead", "cancelled"):
        result = api.retry(str(record.job_id))
        job = result.job
        assert job is not None  # api.retry raises JobNotFound rather than return no job
        return PassHandle(name=record.name, run_id=record.run_id, job_id=job.id,
                          created=bool(result.changed))
    # The job is gone (purged by retention): a new job under the same run id adopts the row.
    job_definition = registry.get(definition.job_name)
    params = api.build_params(job_definition, {}, {"idempotency_key": definition.job_name})
    params = dataclasses.replace(params, run_id=record.run_id)
    enqueued = get_engine().job_enqueue(params)
    if not enqueued.created:
        raise LiveJobExists(
            f"pass {record.run_id} was not resumed: another pass of {record.name} is live "
            f"(job {enqueued.id})", live_job_id=str(enqueued.id),
        )
    return PassHandle(name=record.name, run_id=record.run_id, job_id=enqueued.id, created=True)


def progress(record: BackfillRecord, *, now: datetime | None = None) -> Progress:
    """Rate since the pass began; with the backfill's ``total`` hook, a fraction and an ETA."""
    definition = lookup(record.name)
    total, total_error = count_total(definition) if definition is not None else (None, None)
    fraction = None
    if total is not None:
        fraction = 1.0 if total == 0 else min(record.rows_processed / total, 1.0)
    if record.status == "pending":
        return Progress(rows_processed=record.rows_processed, total=total,
                        total_error=total_error, fraction=fraction)
    now = now or get_engine().db_now()
    until = record.completed_at or record.updated_at or now
    elapsed = max((until - record.started_at).total_seconds(), 0.0)
    rate = record.rows_processed / elapsed if elapsed > 0 and record.rows_processed else None
    eta = eta_at = None
    if record.status == "running" and total is not None and rate:
        eta = max(total - record.rows_processed, 0) / rate
        if math.isfinite(eta):
            eta_at = now + timedelta(seconds=eta)
    return Progress(rows_processed=record.rows_processed, total=total, total_error=total_error,
                    fraction=fraction, elapsed=elapsed, rate=rate, eta=eta, eta_at=eta_at)


def dry_run(name: str, *, batch_size: int | None = None, batches: int = 1) -> DryRunReport:
    """Run up to ``batches`` batches of ``name`` here, each in a transaction that is rolled
    back: nothing is written (no job, no pass, none of the batches' writes).

    Stops early at the last batch, or when a batch returns the cursor it was given: its
    writes were undone, so a backfill that finds its rows by what it already changed (rather
    than by a keyset cursor) would see the same rows again.
    """
    definition = get(name)
    check_alias(definition)
    size = definition.batch_size if batch_size is None else _positive_int(
        "batch size", batch_size, MAX_BATCH_SIZE)
    count = _positive_int("batches", batches, MAX_BATCH_SIZE)
    engine = get_engine()
    ctx = BackfillContext(name=definition.name, run_id=None, job_id=None, attempt=0,
                          batch_size=size, dry_run=True)
    done: list[DryRunBatch] = []
    cursor: Any = None
    finished = stalled = False
    for n in range(1, count + 1):
        started = time.perf_counter()
        outcome: tuple[Any, int, str | None] | None = None
        try:
            with engine.atomic(), acting_as(f"backfill:{definition.name}"):
                outcome = _validated(definition, definition.func(ctx, cursor))
                raise _RollBack
        except _RollBack:
            pass
        except Exception as exc:
            raise DryRunFailed(
                f"dry run of {definition.name}: batch {n} (cursor {cursor!r}) raised "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        assert outcome is not None
        next_cursor, processed, _ = outcome
        done.append(DryRunBatch(cursor=cursor, next_cursor=next_cursor, processed=processed,
                                seconds=time.perf_counter() - started))
        if next_cursor is None:
            finished = True
            break
        if next_cursor == cursor:
            stalled = True
            break
        cursor = next_cursor
    return DryRunReport(name=definition.name, batch_size=size, batches=done, finished=finished,
                        stalled=stalled)
