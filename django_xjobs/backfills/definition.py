"""What a backfill is: its declaration, validated, and what one call of it returns.

``@backfill`` (:mod:`.registry`) builds a :class:`BackfillDefinition` with :func:`build`, which
checks everything a declaration can get wrong before anything is registered. A backfill function
is called as ``func(ctx, cursor)`` with a :class:`BackfillContext` and returns a :class:`Batch`;
:func:`validate_batch` is what a pass and a dry run make of that return value.

The limits here are checked at every door: the decorator, ``start``'s options, the job's input
when a pass runs (it may have been enqueued by hand), a dry run's options.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from uuid import UUID

from .. import api, conf, registry, values
from ..context import JobLogger, StopSignal
from ..engines import get_engine
from ..exceptions import BadBatch, ConfigurationError, InvalidJobInput, JobCancelled
from ..values import encode_json
from .provenance import app_version, checksum_of

log = logging.getLogger("django_xjobs.backfill")

JOB_PREFIX = "backfill:"
MAX_NAME = 200 - len(JOB_PREFIX)  # the job name must stay a valid job name
MAX_BATCH_SIZE = 1_000_000
MAX_THROTTLE = 3600.0
MAX_CURSOR_BYTES = 64 * 1024  # a cursor is a position, not a payload: it is rewritten per batch
DEFAULT_QUEUE = "backfills"


@dataclass(frozen=True, slots=True, kw_only=True)
class PassHandle:
    """A pass that was started or resumed: its run id (the row), its job, and whether this call
    created it (False: a live pass of this backfill already existed, and this is it)."""

    name: str
    run_id: UUID
    job_id: UUID
    created: bool


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
    # The name of the job that runs the pass (None outside one: a dry run).
    job_name: str | None = None
    _logger: logging.LoggerAdapter[Any] | None = None

    @property
    def logger(self) -> logging.LoggerAdapter[Any]:
        """``django_xjobs.backfill`` with ``backfill`` and ``run_id`` in every record; in a pass
        run by a job, each line starts with the job, whose ``job_id``, ``job_name`` and
        ``attempt`` its record carries, as ``ctx.logger``'s of a job (docs/observability.md,
        "Logs")."""
        if self._logger is None:
            if self.job_id is not None and self.job_name is not None:
                adapter = JobLogger(log, self.job_id, self.job_name, self.attempt)
                adapter.fields.update(backfill=self.name, run_id=self.run_id)
                self._logger = adapter
            else:
                self._logger = logging.LoggerAdapter(
                    log, {"backfill": self.name, "run_id": self.run_id, "job_id": self.job_id}
                )
        return self._logger

    def check_cancelled(self) -> None:
        if self.cancelled.is_set():
            raise JobCancelled("backfill pass asked to stop")


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
        """Start a pass of this backfill (the checksum recorded is this definition's: the one
        registered under its name, unless it was declared again since): its job is enqueued
        and its row recorded ``pending``, in one transaction. One live pass per backfill:
        while one is live, this returns it (``created=False``) and changes nothing. Bad
        options raise before anything is written."""
        check_alias(self)
        input: dict[str, Any] = {}
        if batch_size is not None:
            input["batch_size"] = positive_int("batch size", batch_size, MAX_BATCH_SIZE)
        if throttle is not None:
            input["throttle"] = parse_throttle("throttle", throttle)
        job = registry.get(self.job_name)
        engine = get_engine()
        with engine.atomic():
            handle = api.enqueue_job(job, input, {"idempotency_key": self.job_name})
            if handle.created:
                engine.backfill_create(
                    run_id=str(handle.run_id), name=self.name, job_id=str(handle.id),
                    checksum=self.checksum, app_version=app_version(self.func),
                )
        return PassHandle(name=self.name, run_id=handle.run_id, job_id=handle.id,
                          created=handle.created)


def positive_int(what: str, value: Any, maximum: int) -> int:
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
        batch_size=positive_int(f"{backfill_name}: batch_size", batch_size, MAX_BATCH_SIZE),
        queue=queue,
        throttle=(None if throttle is None
                  else parse_throttle(f"{backfill_name}: throttle", throttle)),
        max_attempts=(None if max_attempts is None
                      else positive_int(f"{backfill_name}: max_attempts", max_attempts,
                                        registry.INT32)),
        using=using,
        checksum=checksum_of(func),
    )
    if total is not None:
        definition.total(total)
    return definition


def validate_batch(definition: BackfillDefinition, result: Any) -> tuple[Any, int, str | None]:
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
