"""Enqueue and the operator actions: validate, build params, call the engine.

Everything here runs on the caller's connection for ``XJOBS["DATABASE"]`` and therefore inside
the caller's transaction when there is one: a job enqueued in an ``atomic()`` block that rolls
back never existed (tests/integration/test_enqueue_transactions.py).

Bad input raises :class:`~django_xjobs.exceptions.InvalidJobInput` (or a subclass) *before* any
statement is sent, so it writes nothing and leaves the caller's transaction usable. That
includes an input the job's function cannot take: every enqueue binds it to the function's
signature (``registry.InputShape``), whichever way it comes (``enqueue``, ``using().enqueue``,
``enqueue(name, ...)``, ``enqueue_many``, ``enqueue_on_commit``).

Async callers use the ``aenqueue`` variants: the same enqueue, run by asgiref's
``sync_to_async(thread_sensitive=True)`` as Django's own async ORM methods are, so it uses the
connection, and the transaction, that ``await Model.objects.acreate(...)`` would
(tests/integration/test_aenqueue.py).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypedDict
from uuid import UUID

from asgiref.sync import sync_to_async

from . import conf, outbox, registry, shards, signals, slots, tracing
from .engines import get_engine
from .exceptions import (
    ConfigurationError,
    InvalidJobInput,
    JobNotFound,
)
from .outbox import StagedJob
from .ratelimits import RateLimit, rate_limit_of
from .records import (
    TERMINAL_STATES,
    UNIQUE_FOREVER,
    ChangeResult,
    EnqueueParams,
    EnqueueResult,
    JobRecord,
    ResumeResult,
    new_ids,
)
from .values import (
    INT32,
    check_name,
    check_text,
    encode_json,
    keyword_input,
    parse_duration,
    seconds_of,
)

if TYPE_CHECKING:
    from typing import Unpack

_enqueued_by: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "xjobs_enqueued_by", default=None
)
_process_identity = f"{socket.gethostname()}:{os.getpid()}"


class EnqueueOptions(TypedDict, total=False):
    """The options of one enqueue (``.using(...)``, ``enqueue(name, input, ...)``): their
    types for a type checker; their values are checked by ``_template()`` at every call."""

    idempotency_key: str | None
    delay: timedelta | float | None  # seconds, or a timedelta; not with run_at
    run_at: datetime | None  # aware
    tenant_id: str | None
    priority: int
    queue: str
    max_attempts: int
    enqueued_by: str | None
    traceparent: str | None  # W3C; default: the current OpenTelemetry span
    concurrency_key: str | None  # an explicit key (slots.py), over the job's own template
    # with idempotency_key only: collapse a burst of enqueues of the key into one run
    # (docs/flow-control.md, "Debounce"); seconds, a timedelta or a string such as "5s"
    debounce: timedelta | float | str | None
    debounce_max_wait: timedelta | float | str | None  # >= debounce; from the first enqueue
    # with idempotency_key only: a job of the key that finished less than this ago also
    # dedupes (docs/durable.md, "Idempotency windows"); seconds, a timedelta, "24h", "forever"
    unique_for: timedelta | float | str | None


ENQUEUE_OPTIONS = frozenset(EnqueueOptions.__optional_keys__)
MAX_KEY_LENGTH = 1000
_NO_OPTIONS: Mapping[str, Any] = {}
MAX_DELAY_SECONDS = 100 * 366 * 86400.0


@contextlib.contextmanager
def acting_as(who: str) -> Iterator[None]:
    """Attribute the jobs enqueued inside this block to ``who`` (``enqueued_by``).

    The console uses ``admin:<username>``, the scheduler ``cron:<task>``; the middleware
    :class:`~django_xjobs.middleware.EnqueuedByMiddleware` sets the request's user.
    """
    token = _enqueued_by.set(who)
    try:
        yield
    finally:
        _enqueued_by.reset(token)


def default_enqueued_by() -> str:
    return _enqueued_by.get() or _process_identity


# ------------------------------------------------------------------------------ validation --


def _delay_seconds(value: Any) -> float:
    seconds = seconds_of(value, "delay")
    if seconds > MAX_DELAY_SECONDS:
        raise InvalidJobInput(
            f"delay {value!r} is more than 100 years; pass run_at for a far-future date"
        )
    return seconds


@dataclass(frozen=True, slots=True)
class _Debounce:
    """The debounce of one enqueue (docs/flow-control.md, "Debounce"): the run is due
    ``debounce_ms`` after the last enqueue of its key, and never later than ``max_wait_ms``
    after the first (None: no cap)."""

    debounce_ms: int
    max_wait_ms: int | None
    concurrency_key: str


def _debounce_ms(value: Any, what: str) -> int:
    """A debounce duration (or a window) in milliseconds: a timedelta, seconds, or a string
    such as "5s" (values.parse_duration); more than zero and at most 100 years."""
    try:
        seconds = parse_duration(value, what=what)
    except ConfigurationError as exc:  # an enqueue's bad input, not a bad declaration
        raise InvalidJobInput(str(exc)) from None
    if seconds > MAX_DELAY_SECONDS:
        raise InvalidJobInput(f"{what} {value!r} is more than 100 years")
    ms = round(seconds * 1000)
    if ms <= 0:
        raise InvalidJobInput(f"{what} must be more than zero (at least 1ms), got {value!r}")
    return ms


def _debounce(definition: registry.JobDefinition[..., Any], options: Mapping[str, Any],
              key: str | None, tenant_id: str | None) -> _Debounce | None:
    """Validate ``debounce=`` / ``debounce_max_wait=``; None when the enqueue has neither."""
    value, max_wait = options.get("debounce"), options.get("debounce_max_wait")
    if value is None:
        if max_wait is not None:
            raise InvalidJobInput("debounce_max_wait needs debounce (e.g. debounce=5)")
        return None
    if key is None:
        raise InvalidJobInput(
            "debounce needs idempotency_key: the enqueues that collapse into one run are those "
            "of one key (.using(idempotency_key=..., debounce=...))"
        )
    for other in ("delay", "run_at"):
        if options.get(other) is not None:
            raise InvalidJobInput(
                f"give debounce or {other}, not both: a debounced job is due debounce after "
                "its last enqueue"
            )
    if options.get("concurrency_key") is not None or slots.concurrency_of(definition):
        raise InvalidJobInput(
            f"{definition.name}: debounce cannot be combined with concurrency (the job's "
            "@job(concurrency=...) or .using(concurrency_key=...)): a debounced job's "
            "concurrency key is its debounce key, which runs one at a time"
        )
    debounce_ms = _debounce_ms(value, "debounce")
    max_wait_ms = None
    if max_wait is not None:
        max_wait_ms = _debounce_ms(max_wait, "debounce_max_wait")
        if max_wait_ms < debounce_ms:
            raise InvalidJobInput(
                f"debounce_max_wait ({max_wait!r}) must be at least debounce ({value!r})"
            )
    return _Debounce(debounce_ms=debounce_ms, max_wait_ms=max_wait_ms,
                     concurrency_key=slots.debounce_key(definition.name, tenant_id, key))


# -- idempotency windows (docs/durable.md, "Idempotency windows") --


def _unique_for_ms(options: Mapping[str, Any], key: str | None) -> int | None:
    """Validate ``unique_for=``: None without it, else its window in milliseconds
    (UNIQUE_FOREVER for "forever")."""
    value = options.get("unique_for")
    if value is None:
        return None
    if key is None:
        raise InvalidJobInput(
            "unique_for needs idempotency_key: the window holds one key "
            "(.using(idempotency_key=..., unique_for=...))"
        )
    if options.get("debounce") is not None:
        raise InvalidJobInput(
            "give debounce or unique_for, not both: a debounced key's run changes while it "
            "waits, a windowed key's job is fixed when it is enqueued"
        )
    return window_ms(value)


def window_ms(value: Any) -> int:
    """A ``unique_for`` value in milliseconds (UNIQUE_FOREVER for "forever"); InvalidJobInput
    for anything else (the django.tasks backend checks a task's with it too)."""
    if value == "forever":
        return UNIQUE_FOREVER
    try:
        return _debounce_ms(value, "unique_for")
    except InvalidJobInput as exc:  # the same rules as debounce's, and "forever" besides
        hint = "; use \"forever\"" if "100 years" in str(exc) else ' (or "forever")'
        raise InvalidJobInput(f"{exc}{hint}") from None


# -- end idempotency windows --


@dataclass(frozen=True, slots=True)
class _Template:
    """Everything about an enqueue but its input and ids: validated once per call (per batch,
    for enqueue_many), applied to each input."""

    definition: registry.JobDefinition[..., Any]
    queue: str
    key: str | None
    max_attempts: int
    priority: int
    run_at: datetime | None
    delay_ms: int
    tenant_id: str | None
    traceparent: str | None
    enqueued_by: str
    payload_limit: int
    slot_keys: slots.EnqueueKeys | None = None  # None: the job is not slot-limited
    rate_limit: RateLimit | None = None  # None: the job is not rate-limited
    debounce: _Debounce | None = None  # None: a plain enqueue
    unique_for_ms: int | None = None  # None: no idempotency window

    def params(self, input: Any, job_id: UUID, run_id: UUID) -> EnqueueParams:
        input = keyword_input(input, f"input of {self.definition.name}")
        self.definition.shape.check(self.definition.name, input)
        concurrency_key = (
            self.debounce.concurrency_key if self.debounce is not None
            else None if self.slot_keys is None else self.slot_keys.key(input)
        )
        rate_key = None if self.rate_limit is None else self.rate_limit.format(
            input, tenant_id=self.tenant_id, job=self.definition.name)
        input_json = encode_json(input if type(input) is dict else dict(input),
                                 what=f"input of {self.definition.name}",
                                 limit=self.payload_limit)
        return EnqueueParams(
            id=job_id, run_id=run_id, name=self.definition.name, queue=self.queue,
            input_json=input_json, idempotency_key=self.key, max_attempts=self.max_attempts,
            priority=self.priority, run_at=self.run_at, delay_ms=self.delay_ms,
            tenant_id=self.tenant_id, traceparent=self.traceparent,
            enqueued_by=self.enqueued_by, concurrency_key=concurrency_key, rate_key=rate_key,
            unique_for_ms=self.unique_for_ms,
        )


def _template(definition: registry.JobDefinition[..., Any],
              options: Mapping[str, Any]) -> _Template:
    """Validate the enqueue options for ``definition``. Raises before anything is written."""
    settings = conf.get()
    if options:
        unknown = set(options) - ENQUEUE_OPTIONS
        if unknown:
            raise InvalidJobInput(
                f"unknown enqueue option(s) {sorted(unknown)}; known: {sorted(ENQUEUE_OPTIONS)}"
            )
    # definition.queue reads XJOBS["ROUTES"]: only when the enqueue names no queue (get()
    # would read it on every enqueue).
    named = options["queue"] if "queue" in options else definition.queue  # noqa: SIM401
    queue = check_name("queue", named)

    run_at = options.get("run_at")
    delay_ms = 0
    if run_at is not None:
        if "delay" in options and options["delay"] is not None:
            raise InvalidJobInput("give delay or run_at, not both")
        if not isinstance(run_at, datetime):
            raise InvalidJobInput(f"run_at must be a datetime, got {run_at!r}")
        if run_at.tzinfo is None or run_at.utcoffset() is None:
            raise InvalidJobInput(
                f"run_at {run_at!r} is naive; pass an aware datetime (django.utils.timezone.now())"
            )
    elif options.get("delay") is not None:
        delay_ms = round(_delay_seconds(options["delay"]) * 1000)

    key = options.get("idempotency_key")
    if key is not None:
        key = check_text("idempotency_key", key, max_length=MAX_KEY_LENGTH)
    tenant_id = options.get("tenant_id")
    if tenant_id is not None:
        tenant_id = check_text("tenant_id", tenant_id)

    priority = options.get("priority", definition.priority)
    if isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) > INT32:
        raise InvalidJobInput(f"priority must be an integer, got {priority!r}")
    max_attempts = options.get("max_attempts", definition.max_attempts or settings.max_attempts)
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or not (
        1 <= max_attempts <= INT32
    ):
        raise InvalidJobInput(f"max_attempts must be an integer >= 1, got {max_attempts!r}")

    enqueued_by = options.get("enqueued_by")
    enqueued_by = (
        check_text("enqueued_by", enqueued_by) if enqueued_by is not None
        else default_enqueued_by()
    )
    traceparent = options.get("traceparent")
    if traceparent is not None:
        if not tracing.valid_traceparent(traceparent):
            raise InvalidJobInput(
                f"traceparent {traceparent!r} is not a W3C traceparent"
                " (00-<32 hex>-<16 hex>-<2 hex>)"
            )
    else:
        traceparent = tracing.current_traceparent()
    debounce = None
    if "debounce" in options or "debounce_max_wait" in options:
        debounce = _debounce(definition, options, key, tenant_id)
    if debounce is not None:
        delay_ms = debounce.debounce_ms  # a new job is due debounce after its enqueue
    unique_for_ms = _unique_for_ms(options, key) if "unique_for" in options else None
    return _Template(
        definition=definition, queue=queue, key=key, max_attempts=max_attempts,
        priority=priority, run_at=run_at, delay_ms=delay_ms, tenant_id=tenant_id,
        traceparent=traceparent, enqueued_by=enqueued_by,
        payload_limit=settings.max_payload_bytes,
        slot_keys=None if debounce is not None else slots.enqueue_keys(
            definition, options.get("concurrency_key"), tenant_id, settings),
        rate_limit=rate_limit_of(definition),
        debounce=debounce,
        unique_for_ms=unique_for_ms,
    )


def _refuse_debounce(template: _Template, what: str) -> None:
    if template.debounce is not None:
        raise InvalidJobInput(
            f"{what} does not take debounce: debounce one key at a time with "
            f".using(idempotency_key=..., debounce=...).enqueue(...) (docs/flow-control.md, "
            f'"Debounce")'
        )


def build_params(definition: registry.JobDefinition[..., Any], input: Any,
                 options: Mapping[str, Any], *, what: str = "this enqueue") -> EnqueueParams:
    """Validate one enqueue and turn it into engine params. Raises before anything is written.
    A debounced enqueue is no single insert, so its options are refused here (enqueue_job
    takes them)."""
    template = _template(definition, options)
    _refuse_debounce(template, what)
    job_id, run_id = new_ids(2)
    return template.params(input, job_id, run_id)


# A child job is made once per parent step, by the step: these options would deduplicate or
# delay it by other means (docs/durable.md, "Child jobs").
CHILD_REFUSED_OPTIONS = frozenset({"idempotency_key", "debounce", "debounce_max_wait",
                                   "unique_for"})


def child_params(definition: registry.JobDefinition[..., Any], input: Any,
                 options: Mapping[str, Any], *, parent_id: UUID | str,
                 tenant_id: str | None, traceparent: str | None,
                 what: str) -> EnqueueParams:
    """One child of a parent's ``ctx.step.invoke`` / ``gather``, validated like any enqueue:
    the parent's tenant and trace unless the options say otherwise, ``enqueued_by`` naming the
    parent. Raises before anything is written."""
    refused = CHILD_REFUSED_OPTIONS & set(options)
    if refused:
        raise InvalidJobInput(
            f"{what}: a child job takes no {', '.join(sorted(refused))}: the parent's step "
            "enqueues it once, and its replays return the same child"
        )
    defaults = {"tenant_id": tenant_id, "enqueued_by": f"job:{parent_id}",
                "traceparent": tracing.current_traceparent() or traceparent}
    return build_params(definition, input, {**defaults, **options}, what=what)


# --------------------------------------------------------------------------------- handles --


@dataclass(frozen=True, slots=True)
class JobHandle:
    """What enqueue returns: the live job for the key, and whether this call created it."""

    id: UUID
    run_id: UUID
    created: bool
    # The shard it was written to, when the jobs are sharded (docs/scaling.md).
    shard: str | None = None

    def get(self) -> JobRecord:
        """The job's row now."""
        with conf.using_database(self.shard):
            return get_job(self.id)

    @property
    def state(self) -> str:
        """The job's state now (one read of its row)."""
        return self.get().state

    def wait(self, timeout: float = 30.0, poll: float = 0.05) -> JobRecord:
        """Block until the job is finished (done, dead or cancelled); return its row."""
        deadline = time.monotonic() + timeout
        while True:
            record = self.get()
            if record.is_finished:
                return record
            if time.monotonic() >= deadline:
                raise TimeoutError(f"job {self.id} is still {record.state} after {timeout}s")
            time.sleep(poll)

    def cancel(self, reason: str | None = None) -> bool:
        """:func:`~django_xjobs.cancel` this job; whether it changed anything."""
        return cancel(self.id, reason=reason).changed


# XJOBS["TEST_MODE"] = "inline" (docs/testing.md): django_xjobs.testing sets this while the mode
# is on (None otherwise: no cost to an enqueue); it runs each new job once the enqueuing
# transaction commits. Called with the job's id, and for a staging with the outbox's alias.
inline_runner: Callable[[UUID, str | None], None] | None = None


def _handle(result: EnqueueResult, definition: registry.JobDefinition[..., Any]) -> JobHandle:
    settings = conf.get()
    handle = JobHandle(id=result.id, run_id=result.run_id, created=result.created,
                       shard=settings.database if settings.shards else None)
    if result.created:
        # Right after the insert, so inside the caller's transaction like the row, and before
        # an inline run (docs/observability.md, "Signals"); a live job found sends nothing.
        if signals.job_enqueued.receivers:
            signals.send(signals.job_enqueued, definition, handle=handle)
        if inline_runner is not None:
            inline_runner(result.id, None)
    return handle


def enqueue_job(definition: registry.JobDefinition[..., Any], input: Mapping[str, Any] | None,
                options: Mapping[str, Any]) -> JobHandle:
    """Enqueue one input of ``definition`` with ``options``: what every single enqueue runs
    (``my_job.enqueue``, ``.using(...).enqueue``, :func:`enqueue` by name)."""
    template = _template(definition, options)
    job_id, run_id = new_ids(2)
    params = template.params(input, job_id, run_id)
    debounce = template.debounce
    with shards.for_tenant(params.tenant_id):  # its tenant's shard (docs/scaling.md)
        if debounce is None:
            return _handle(get_engine().job_enqueue(params), definition)
        return _handle(get_engine().job_enqueue_debounced(
            params, debounce_ms=debounce.debounce_ms, max_wait_ms=debounce.max_wait_ms),
            definition)


def enqueue(name: str, input: Mapping[str, Any] | None = None,
            **options: Unpack[EnqueueOptions]) -> JobHandle:
    """Enqueue a registered job by name: ``enqueue("emails.send_welcome", {"user_id": 42})``."""
    definition = registry.get(check_name("job name", name)) if isinstance(name, str) else None
    if definition is None:
        raise InvalidJobInput(f"job name must be a string, got {name!r}")
    return enqueue_job(definition, input, options)


async def aenqueue(name: str, input: Mapping[str, Any] | None = None,
                   **options: Unpack[EnqueueOptions]) -> JobHandle:
    """:func:`enqueue` from async code, on Django's thread for the async ORM (the module
    docstring says why)."""
    return await sync_to_async(enqueue, thread_sensitive=True)(name, input, **options)


def enqueue_many(
    items: Iterable[tuple[str, Mapping[str, Any] | None, Mapping[str, Any]]
                   | tuple[str, Mapping[str, Any] | None]],
    *,
    batch_size: int = 1000,
) -> list[JobHandle]:
    """Enqueue many jobs with one statement per ``batch_size``; handles in input order.

    Each item is ``(name, input)`` or ``(name, input, options)``. Idempotency keys hold inside a
    batch as well as against existing jobs. Every item is validated before the first statement,
    so one bad item writes nothing.
    """
    items = list(items)
    ids = new_ids(2 * len(items))  # one read of the system's randomness for the whole call
    templates: dict[tuple[str, int], _Template] = {}
    params: list[EnqueueParams] = []
    definitions: list[registry.JobDefinition[..., Any]] = []
    for n, item in enumerate(items):
        name, input, *rest = item
        options = rest[0] if rest else _NO_OPTIONS
        template = templates.get((name, id(options)))
        if template is None:
            template = _template(registry.get(check_name("job name", name)), options)
            _refuse_debounce(template, "enqueue_many (and bulk_enqueue)")
            templates[(name, id(options))] = template
        params.append(template.params(input, ids[2 * n], ids[2 * n + 1]))
        definitions.append(template.definition)
    handles: list[JobHandle | None] = [None] * len(params)
    # One group per tenant shard (the one database unsharded), each in its input order.
    for alias, positions in shards.group_by_shard(params, lambda p: p.tenant_id).items():
        with conf.using_database(alias):
            engine = get_engine()
            for start in range(0, len(positions), batch_size):
                batch = positions[start:start + batch_size]
                results = engine.jobs_enqueue([params[n] for n in batch])
                for n, result in zip(batch, results, strict=True):
                    handles[n] = _handle(result, definitions[n])
    return [handle for handle in handles if handle is not None]


# ---------------------------------------------------------------------------------- outbox --


def enqueue_on_commit(name: str, input: Mapping[str, Any] | None = None, *,
                      using: str = "default", **options: Unpack[EnqueueOptions]) -> StagedJob:
    """Stage a registered job in the current transaction of database alias ``using``; the job
    exists if and only if that transaction commits (docs/transactional-enqueue.md).

    Same options and validation as :func:`enqueue`, all checked before anything is written.
    Outside ``atomic()`` the staging commits at once and a relay publishes it right away.
    Returns a :class:`~django_xjobs.outbox.StagedJob` (its ``id`` is the job's id to be).
    """
    definition = registry.get(check_name("job name", name)) if isinstance(name, str) else None
    if definition is None:
        raise InvalidJobInput(f"job name must be a string, got {name!r}")
    return stage_job(definition, input, options, using=using)


def stage_job(definition: registry.JobDefinition[..., Any], input: Any,
              options: Mapping[str, Any], *, using: Any) -> StagedJob:
    """Stage one input of ``definition`` in the current transaction of ``using``: what every
    ``enqueue_on_commit`` runs."""
    params = build_params(definition, input, options, what="enqueue_on_commit")
    aliases = conf.get().outbox.databases
    if using not in aliases:
        raise InvalidJobInput(
            f"enqueue_on_commit(using={using!r}): the relays read the outbox of "
            f'XJOBS["OUTBOX"]["DATABASES"] = {list(aliases)} only; add the alias there'
        )
    # A stager that named nobody (no enqueued_by option, no acting_as/middleware)
    # leaves it to the relay, which records "outbox" rather than this process's host:pid.
    enqueued_by = params.enqueued_by if (
        options.get("enqueued_by") is not None or _enqueued_by.get() is not None
    ) else None
    staged = outbox.stage(params, using=using, enqueued_by=enqueued_by)
    if inline_runner is not None:
        inline_runner(staged.id, using)
    return staged


# ------------------------------------------------------------------------------- operators --


def get_job(job_id: UUID | str, *, tenant_ids: Iterable[str] | None = None) -> JobRecord:
    """The job's row now, wherever it is (``x_jobs`` or the history tables); raises
    :class:`~django_xjobs.exceptions.JobNotFound` for an id that is not there (or not in
    ``tenant_ids``, when given)."""
    def read() -> JobRecord | None:
        return get_engine().job_get(str(job_id), tenant_ids=tenant_ids)

    found = shards.first(read) if shards.sharded() else (None, read())
    record = found[1] if found else None
    if record is None:
        raise JobNotFound(f"no job with id {job_id}")
    return record


def cancel(job_id: UUID | str, *, reason: str | None = None,
           tenant_ids: Iterable[str] | None = None) -> ChangeResult:
    """Cancel a job in any state but done; a running one stops at its worker's next heartbeat."""
    if reason is not None:
        reason = check_text("reason", reason, max_length=2000)
    with conf.using_database(shards.locate(job_id)):
        result = get_engine().job_cancel(
            str(job_id), reason=f"cancelled: {reason}" if reason else "cancelled",
            tenant_ids=tenant_ids,
        )
    if result.job is None:
        raise JobNotFound(f"no job with id {job_id}")
    return result


def retry(job_id: UUID | str, *, tenant_ids: Iterable[str] | None = None) -> ChangeResult:
    """Give a dead or cancelled job a fresh set of attempts, due now (same run_id: completed
    steps are kept). Raises LiveJobExists when another live job holds its key. Inside
    :func:`~django_xjobs.api.acting_as` (the console) the job's ``enqueued_by`` becomes that
    identity."""
    with conf.using_database(shards.locate(job_id)):
        result = get_engine().job_retry(str(job_id), tenant_ids=tenant_ids,
                                        enqueued_by=_enqueued_by.get())
    if result.job is None:
        raise JobNotFound(f"no job with id {job_id}")
    return result


def resume(job_id: UUID | str, *, tenant_ids: Iterable[str] | None = None) -> ResumeResult:
    """Resume a dead workflow once the cause of its failure is fixed (docs/durable.md,
    "Repairing a dead workflow"): when it died of a failed child job (``ChildFailed``), that
    child gets a fresh set of attempts and the failed ``invoke`` / ``gather`` step is opened
    again, so that the workflow, due now with a fresh set of attempts, waits for the child and
    goes on past the step (a child that is a dead workflow itself is resumed likewise). When
    its failure was its own, it is retried: the failed step runs again, completed steps are
    kept. All in one transaction; ``result.reopened`` names the steps opened again.

    Unchanged (``result.changed`` False, ``result.reason`` says why) for a job that is not a
    dead workflow: not dead, or no step recorded. Raises
    :class:`~django_xjobs.exceptions.JobNotFound` for an unknown id and
    :class:`~django_xjobs.exceptions.LiveJobExists` when another live job holds its key. Inside
    :func:`~django_xjobs.api.acting_as` (the console) the ``enqueued_by`` of every job it puts
    back becomes that identity."""
    with conf.using_database(shards.locate(job_id)):
        result = get_engine().job_resume(str(job_id), tenant_ids=tenant_ids,
                                         enqueued_by=_enqueued_by.get())
    if result.job is None:
        raise JobNotFound(f"no job with id {job_id}")
    return result


def retry_many(job_ids: Iterable[UUID | str], *,
               tenant_ids: Iterable[str] | None = None) -> list[str]:
    """:func:`~django_xjobs.retry` for a batch of jobs in one set-based statement: the dead and
    cancelled ones get a fresh set of attempts, due now; returns the ids retried. A job whose
    key another live job holds, or that another transaction holds, is skipped rather than
    refused (docs/console.md, "Acting on thousands")."""
    ids = [str(i) for i in job_ids]
    if not ids:
        return []
    by_shard = shards.each_shard(lambda: get_engine().jobs_retry_many(
        ids, tenant_ids=tenant_ids, enqueued_by=_enqueued_by.get()))
    return [job_id for retried in by_shard.values() for job_id in retried]


def cancel_many(job_ids: Iterable[UUID | str], *, reason: str | None = None) -> int:
    """:func:`~django_xjobs.cancel` for a batch of live jobs, with their live descendants, in
    one statement that takes its locks in the documented order; returns how many were
    cancelled. Finished jobs are left alone (docs/design.md, "Lock order")."""
    if reason is not None:
        reason = check_text("reason", reason, max_length=2000)
    ids = [str(i) for i in job_ids]
    if not ids:
        return 0
    return sum(shards.each_shard(lambda: get_engine().jobs_cancel_tree(
        ids=ids, reason=f"cancelled: {reason}" if reason else "cancelled")).values())


def run_now(job_id: UUID | str, *, tenant_ids: Iterable[str] | None = None) -> ChangeResult:
    """Make a delayed or suspended job due now."""
    with conf.using_database(shards.locate(job_id)):
        result = get_engine().job_run_now(str(job_id), tenant_ids=tenant_ids)
    if result.job is None:
        raise JobNotFound(f"no job with id {job_id}")
    return result


def purge(*, older_than: timedelta, states: Iterable[str] = ("done", "dead", "cancelled"),
          batch_size: int = 1000) -> int:
    """Delete finished jobs that finished more than ``older_than`` ago (by the database's
    clock, as ``finished_at``: never this machine's wall clock); return the count."""
    states = tuple(states)
    bad = [s for s in states if s not in TERMINAL_STATES]
    if bad:
        raise InvalidJobInput(
            f"purge only deletes finished jobs (done, dead, cancelled), not {bad}"
        )
    return sum(shards.each_shard(lambda: get_engine().jobs_purge(
        states=states, finished_before=get_engine().db_now() - older_than,
        batch_size=batch_size, history=True,
    )).values())


# --------------------------------------------------------------------------------- console --


def delete_finished(job_ids: Iterable[UUID | str], *,
                    tenant_ids: Iterable[str] | None = None) -> int:
    """Delete the given jobs that are finished (done, dead, cancelled), with their steps; live
    jobs are left alone (cancel them first). Returns how many were deleted."""
    ids = [str(i) for i in job_ids]
    if not ids:
        return 0
    return sum(shards.each_shard(
        lambda: get_engine().jobs_delete_finished(ids, tenant_ids=tenant_ids)).values())
