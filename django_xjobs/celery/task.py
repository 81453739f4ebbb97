"""``shared_task`` and the task object: Celery's declaration and calls, onto ``@job``.

A Celery task is registered as a job whose function is a wrapper of the task's: it takes the
task's own parameters (``self`` left out for ``bind=True``), so ``add.delay(2, 3)`` is stored as
the input ``{"x": 2, "y": 3}`` and checked against the signature at enqueue, as every job's is.
Positional arguments past the named ones (``*args``) and the call's ``expires=`` travel in the
input under one reserved key, :data:`META_KEY`. The job's name is Celery's
(``module.function``, or ``name=``), so routes, beat schedules and logs that name a task keep
working.

The options map onto ``@job`` (docs/from-celery.md has the table): ``max_retries=3`` is
``max_attempts=4``; ``autoretry_for`` is ``retry_on`` (no ``autoretry_for``: no exception
retries, as in Celery; ``self.retry()`` always may); ``retry_backoff`` / ``retry_backoff_max``
/ ``retry_jitter`` are the retry policy's base, cap and jitter; without ``retry_backoff`` a
retry waits ``default_retry_delay``; ``rate_limit="10/m"`` is a :class:`RateLimit` shared by the
whole fleet (Celery's is per worker); ``time_limit`` is ``timeout``. Options that say what this
package always does (``acks_late=True``, ``track_started``) are taken silently; those that
mean something else or nothing here are taken with one logged warning each; those with no
equivalent raise :class:`NotSupported` naming the alternative.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from .. import api, registry
from ..decorator import Job, job
from ..exceptions import (
    ConfigurationError,
    InvalidJobInput,
    PauseKey,
    Retry,
    Snooze,
    fail_for_good,
)
from ..ratelimits import RateLimit
from ..values import INT32
from .base import (
    META_KEY,
    Request,
    _request,
    enqueue_options,
    register,
    seconds,
    warn_once,
)
from .canvas import Signature
from .errors import NotSupported, TaskExpired
from .result import AsyncResult

if TYPE_CHECKING:
    from ..context import JobContext

# --------------------------------------------------------------------------- the options --

# Taken: they say what this package always does (or, for typing, what it does by default).
_SILENT = {"acks_late": True, "track_started": True, "typing": True,
           "reject_on_worker_lost": True, "ignore_result": False,
           "store_errors_even_if_ignored": True}
# Taken with one warning: what they ask for is a broker's or result backend's concern, or
# means something else here.
_WARNED = {
    "acks_late": "a job is always acknowledged after it ran (acks_late=True)",
    "track_started": "a running job is always visible as STARTED",
    "typing": "arguments are always checked against the function's signature at enqueue",
    "reject_on_worker_lost": "a run whose worker was lost is always run again",
    "ignore_result": "results are kept with the job until retention removes them",
    "store_errors_even_if_ignored": "errors are always kept with the job",
    "serializer": "arguments and results are stored as JSON (docs/guide.md, \"Values\")",
    "compression": "arguments are stored uncompressed in PostgreSQL (jsonb)",
    "send_events": "the console and the metrics read the jobs' rows; there are no events",
    "throws": "errors are logged by the worker as they happen",
    "trail": "child jobs are found from their parent's steps",
    "acks_on_failure_or_timeout": "a failed run is recorded, then retried or dead",
    "resultrepr_maxsize": "results are stored whole, up to XJOBS['MAX_PAYLOAD_BYTES']",
    "lazy": "a task is registered when its module is imported",
    "routing_key": "queues are chosen by queue= or XJOBS['ROUTES']",
    "exchange": "queues are chosen by queue= or XJOBS['ROUTES']",
    "retry_policy": "the enqueue is one INSERT in the caller's transaction; it is not retried",
}
_REFUSED = {
    "base": "a custom Task class: use django_xjobs.signals (job_started, job_finished) or wrap "
            "the function",
    "pydantic": "pass JSON values (datetime, date, time, UUID and Decimal are kept exactly)",
    "shared": "every task is shared: it is registered in the process that imports it",
    "on_failure": "use the job_finished signal (docs/observability.md, \"Signals\")",
    "on_success": "use the job_finished signal (docs/observability.md, \"Signals\")",
    "on_retry": "use the job_finished signal (docs/observability.md, \"Signals\")",
    "after_return": "use the job_finished signal (docs/observability.md, \"Signals\")",
}
_MAPPED = {"bind", "name", "queue", "max_retries", "default_retry_delay", "autoretry_for",
           "dont_autoretry_for", "retry_kwargs", "retry_backoff", "retry_backoff_max",
           "retry_jitter", "rate_limit", "time_limit", "soft_time_limit", "priority", "expires"}
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:/\s*([smh]))?\s*$")
_PERIODS = {"s": timedelta(seconds=1), "m": timedelta(minutes=1), "h": timedelta(hours=1),
            None: timedelta(seconds=1)}


def rate_limit(task: str, value: Any) -> RateLimit | None:
    """Celery's ``"10/m"`` (``/s``, ``/h``; a bare number is per second) as a fleet-wide
    :class:`RateLimit` on a key of the task's own."""
    if value is None:
        return None
    m = _RATE.match(str(value)) if isinstance(value, str | int | float) else None
    if m is None or isinstance(value, bool):
        raise ConfigurationError(
            f"{task}: rate_limit={value!r} is not a Celery rate (use e.g. '10/s', '100/m', "
            "'1000/h')")
    amount = float(m.group(1))
    period = _PERIODS[m.group(2)]
    if amount <= 0:
        raise ConfigurationError(f"{task}: rate_limit={value!r} must be more than zero")
    # RateLimit counts whole units: 0.5/s is 1 per 2 s.
    if amount < 1 or amount != int(amount):
        period = period * (math.ceil(amount) / amount)
        amount = math.ceil(amount)
    return RateLimit(key=f"celery-task:{task}", limit=int(amount), period=period)


def job_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """``@job`` options for a ``shared_task``'s Celery options (consumed from ``options``)."""
    for option in list(options):
        if option in _REFUSED:
            raise NotSupported(f"{name}: Celery's {option}= is not supported here: "
                               f"{_REFUSED[option]}")
        if option in _SILENT and options[option] is _SILENT[option]:
            del options[option]
        elif option in _WARNED:
            warn_once(name, option, _WARNED[option])
            del options[option]
    ours = registry.option_names() - {"name", "queue", "priority", "max_attempts", "timeout"}
    unknown = set(options) - _MAPPED - ours
    if unknown:
        raise ConfigurationError(
            f"{name}: unknown shared_task option(s) {sorted(unknown)}; Celery's options are "
            f"taken as docs/from-celery.md lists, and @job's own: {sorted(ours)}")
    max_retries = options.pop("max_retries", 3)
    retry_kwargs = dict(options.pop("retry_kwargs", None) or {})
    if set(retry_kwargs) - {"max_retries", "countdown"}:
        raise NotSupported(f"{name}: retry_kwargs takes max_retries and countdown here, got "
                           f"{sorted(retry_kwargs)}")
    max_retries = retry_kwargs.get("max_retries", max_retries)
    if max_retries is not None and (isinstance(max_retries, bool)
                                    or not isinstance(max_retries, int) or max_retries < 0):
        raise ConfigurationError(f"{name}: max_retries must be None or an integer >= 0")
    delay = seconds(name, "default_retry_delay", options.pop("default_retry_delay", 180))
    delay = seconds(name, "retry_kwargs['countdown']", retry_kwargs.get("countdown", delay))
    backoff = options.pop("retry_backoff", False)
    backoff_max = seconds(name, "retry_backoff_max", options.pop("retry_backoff_max", 600))
    jitter = options.pop("retry_jitter", True)
    if not isinstance(jitter, bool):
        raise ConfigurationError(f"{name}: retry_jitter must be True or False")
    autoretry = options.pop("autoretry_for", ())
    result: dict[str, Any] = {
        "name": name,
        "max_attempts": INT32 if max_retries is None else min(max_retries + 1, INT32),
        "retry_on": tuple(autoretry),
    }
    if backoff:
        factor = 1.0 if backoff is True else seconds(name, "retry_backoff", backoff)
        # Celery caps each countdown at retry_backoff_max, the first one too.
        result.update(retry_base=min(factor, backoff_max), retry_cap=backoff_max,
                      retry_jitter=jitter)
    else:
        # Celery waits default_retry_delay before every automatic retry: a fixed delay (0: at
        # once).
        result.update(retry_base=delay, retry_cap=delay, retry_jitter=False)
    if "queue" in options:
        result["queue"] = options.pop("queue")
    if "priority" in options:
        result["priority"] = options.pop("priority")
    hard, soft = options.pop("time_limit", None), options.pop("soft_time_limit", None)
    if soft is not None:
        warn_once(name, "soft_time_limit", "no SoftTimeLimitExceeded is raised in the task; "
                  + ("time_limit stops the run" if hard is not None
                     else "the run is stopped at this limit, as with time_limit"))
    if hard is not None or soft is not None:
        result["timeout"] = seconds(name, "time_limit", hard if hard is not None else soft)
    limit = rate_limit(name, options.pop("rate_limit", None))
    if limit is not None:
        result["rate_limit"] = limit
    return result


# ------------------------------------------------------------------------------ the task --


class Task:
    """A registered Celery-style task: ``.delay()``, ``.apply_async()``, ``.s()``, ``.si()``,
    ``self.retry()`` and ``self.request`` in a bound task; ``task(...)`` calls the function
    here and now, as Celery's does. ``job`` is the :class:`~django_xjobs.decorator.Job` it is
    registered as (``task.job.using(tenant_id=...)`` and the rest of the native API)."""

    def __init__(self, func: Callable[..., Any], *, name: str, bind: bool,
                 default_retry_delay: float, max_retries: int | None,
                 dont_autoretry_for: tuple[type[BaseException], ...],
                 expires: Any, job: Job[..., Any] | None = None) -> None:
        self.run = func
        self.name = name
        self.bind = bind
        self.default_retry_delay = default_retry_delay
        self.max_retries = max_retries
        self.dont_autoretry_for = dont_autoretry_for
        self.expires = expires
        self.job: Job[..., Any] = job  # type: ignore[assignment]  # set by shared_task
        parameters = list(inspect.signature(func).parameters.values())
        if bind:
            parameters = parameters[1:]
        self.parameters = parameters
        # What a call is checked against, in the task's own terms (not the job's: its ctx and
        # the meta key are ours).
        self.call_signature = inspect.Signature(parameters)
        self.positional = tuple(p.name for p in parameters if p.kind in (
            inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD))
        self.varargs = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters)
        self.__doc__ = func.__doc__
        self.__name__ = getattr(func, "__name__", name)
        self.__module__ = func.__module__
        self.__qualname__ = getattr(func, "__qualname__", self.__name__)

    def __repr__(self) -> str:
        return f"<@task: {self.name}>"

    @property
    def request(self) -> Request:
        request = _request.get()
        if request is None or request.task != self.name:
            return Request(task=self.name)
        return request

    @property
    def queue(self) -> str:
        return self.job.queue

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the function in this process, now (Celery's ``task(...)``)."""
        token = _request.set(Request(task=self.name, args=args, kwargs=kwargs))
        try:
            return self.run(self, *args, **kwargs) if self.bind else self.run(*args, **kwargs)
        finally:
            _request.reset(token)

    # ---- calling -------------------------------------------------------------------------

    def delay(self, *args: Any, **kwargs: Any) -> AsyncResult:
        """Enqueue with these arguments; inside ``transaction.atomic()`` the job is written in
        that transaction: it exists once the transaction commits, and never if it rolls back
        (docs/from-celery.md, "Construct by construct")."""
        return self.apply_async(args, kwargs)

    def apply_async(self, args: Iterable[Any] | None = None,
                    kwargs: Mapping[str, Any] | None = None, **options: Any) -> AsyncResult:
        """Enqueue: ``countdown=`` (seconds), ``eta=`` (an aware datetime), ``expires=``
        (seconds or a datetime), ``queue=``, ``priority=`` (higher runs first), and the native
        enqueue options (``idempotency_key=``, ``tenant_id=``, ...)."""
        expires = options.pop("expires", self.expires)
        input = self.input(args, kwargs, expires=expires)
        handle = api.enqueue_job(self.job, input, enqueue_options(self.name, options))
        return AsyncResult(handle.id, task_name=self.name)

    def delay_on_commit(self, *args: Any, **kwargs: Any) -> None:
        """Celery 5.4's ``delay_on_commit``: staged in the transaction's outbox, enqueued once
        it commits (docs/transactional-enqueue.md)."""
        self.apply_async_on_commit(args, kwargs)

    def apply_async_on_commit(self, args: Iterable[Any] | None = None,
                              kwargs: Mapping[str, Any] | None = None,
                              **options: Any) -> None:
        expires = options.pop("expires", self.expires)
        using = options.pop("using", "default")
        input = self.input(args, kwargs, expires=expires)
        api.stage_job(self.job, input, enqueue_options(self.name, options), using=using)

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        return Signature(self, args, kwargs)

    def si(self, *args: Any, **kwargs: Any) -> Signature:
        return Signature(self, args, kwargs, immutable=True)

    def signature(self, args: Iterable[Any] | None = None,
                  kwargs: Mapping[str, Any] | None = None, **options: Any) -> Signature:
        immutable = bool(options.pop("immutable", False))
        return Signature(self, tuple(args or ()), dict(kwargs or {}), options=options,
                         immutable=immutable)

    subtask = signature

    def AsyncResult(self, task_id: Any) -> AsyncResult:  # Celery's name
        return AsyncResult(task_id, task_name=self.name)

    def apply(self, *args: Any, **kwargs: Any) -> Any:
        raise NotSupported(
            f"{self.name}.apply(): run the task here with {self.name.rpartition('.')[2]}(...), "
            "or, in tests, enqueue it and run it with django_xjobs.testing.drain() "
            "(docs/testing.md)")

    def update_state(self, *args: Any, **kwargs: Any) -> None:
        raise NotSupported(
            f"{self.name}.update_state(): report progress with self.request.ctx.progress("
            "done, total, message) (docs/observability.md, \"Progress\")")

    # ---- inside a run --------------------------------------------------------------------

    def retry(self, args: Any = None, kwargs: Any = None, exc: BaseException | None = None,
              throw: bool = True, eta: datetime | None = None, countdown: float | None = None,
              max_retries: int | None = None, **options: Any) -> Retry:
        """Raise :class:`~django_xjobs.exceptions.Retry`: the job runs again after
        ``countdown`` seconds (or at ``eta``, else ``default_retry_delay``), spending an
        attempt; past ``max_retries`` (this call's, else the task's) it ends ``dead`` with
        ``exc``'s error (``FAILURE``). Written ``raise self.retry(exc=exc)`` as in Celery."""
        if args is not None or kwargs is not None:
            raise NotSupported(f"{self.name}: self.retry(args=, kwargs=): a retry runs with the "
                               "same arguments; enqueue a new task for other ones")
        if not throw:
            raise NotSupported(f"{self.name}: self.retry(throw=False): raise the retry")
        if options:
            raise NotSupported(f"{self.name}: self.retry() does not take {sorted(options)} "
                               "here")
        if _request.get() is None or self.request.ctx is None:
            raise NotSupported(f"{self.name}: self.retry() outside a worker's run")
        if eta is not None:
            if eta.tzinfo is None:
                raise InvalidJobInput(f"{self.name}: self.retry(eta=...) must be an aware "
                                      "datetime")
            delay = max((eta - datetime.now(UTC)).total_seconds(), 0.0)
        elif countdown is not None:
            delay = seconds(self.name, "countdown", countdown)
        else:
            delay = self.default_retry_delay
        bound = max_retries if max_retries is not None else self.max_retries
        retry = Retry(delay, max_attempts=None if bound is None else bound + 1)
        if exc is not None:
            raise retry from exc
        raise retry

    # ---- storage -------------------------------------------------------------------------

    def input(self, args: Iterable[Any] | None, kwargs: Mapping[str, Any] | None, *,
              expires: Any = None) -> dict[str, Any]:
        """The job input of a call: positional arguments under the names they fill, those
        past them (``*args``) and ``expires`` under :data:`META_KEY`."""
        if isinstance(args, str | bytes | Mapping) or (args is not None
                                                       and not isinstance(args, Iterable)):
            raise InvalidJobInput(f"{self.name}: args must be a list or tuple, got "
                                  f"{type(args).__name__}")
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise InvalidJobInput(f"{self.name}: kwargs must be a dict, got "
                                  f"{type(kwargs).__name__}")
        given = list(args or ())
        named = dict(zip(self.positional, given, strict=False))
        extra = given[len(self.positional):]
        if extra and not self.varargs:
            raise InvalidJobInput(
                f"{self.name}() takes {len(self.positional)} positional argument(s) but "
                f"{len(given)} were given")
        keywords = dict(kwargs or {})
        twice = named.keys() & keywords.keys()
        if twice:
            raise InvalidJobInput(f"{self.name}() got multiple values for argument(s) "
                                  f"{sorted(twice)}")
        if META_KEY in keywords:
            raise InvalidJobInput(f"{self.name}: {META_KEY!r} is reserved for the task's "
                                  "positional arguments and expiry")
        try:
            self.call_signature.bind(*given, **keywords)
        except TypeError as exc:
            raise InvalidJobInput(f"{self.name}(): {exc}") from None
        input = {**named, **keywords}
        meta: dict[str, Any] = {}
        if extra:
            meta["args"] = extra
        if expires is not None:
            meta["expires"] = _expiry(self.name, expires).isoformat()
        if meta:
            input[META_KEY] = meta
        return input


def _expiry(task: str, value: Any) -> datetime:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise InvalidJobInput(f"{task}: expires= must be an aware datetime or seconds")
        return value
    return datetime.now(UTC) + timedelta(seconds=seconds(task, "expires", value))


def _job_function(task: Task) -> Callable[..., Any]:
    """The function the job runs: ``run(ctx, **input)`` calls the task's function with the
    input's positional values in order, ``*args`` and the rest by keyword."""

    def run(ctx: JobContext, /, **input: Any) -> Any:
        meta = input.pop(META_KEY, None) or {}
        expires = meta.get("expires")
        if expires is not None and datetime.now(UTC) > datetime.fromisoformat(expires):
            raise TaskExpired(f"{task.name} expired at {expires}: not run")
        args: list[Any] = []
        for name in task.positional:
            if name not in input:
                break
            args.append(input.pop(name))
        args.extend(meta.get("args", ()))
        request = Request(id=ctx.job_id, retries=ctx.attempt - 1, args=tuple(args),
                          kwargs=dict(input), task=task.name, called_directly=False,
                          delivery_info={"routing_key": ctx.queue}, ctx=ctx)
        token = _request.set(request)
        try:
            if task.bind:
                return task.run(task, *args, **input)
            return task.run(*args, **input)
        except (Retry, Snooze, PauseKey):
            raise  # the task's own decision, which dont_autoretry_for does not judge
        except task.dont_autoretry_for as exc:
            fail_for_good(exc)
            raise
        finally:
            _request.reset(token)

    # What enqueue checks the input against: ctx, then the task's own parameters (self left
    # out), positional-only ones taken by name too, *args replaced by the meta key.
    # The context's own name must not be one of the task's (a task may take a "ctx").
    parameters = [inspect.Parameter("_xjobs_ctx", inspect.Parameter.POSITIONAL_ONLY)]
    keyword_only, var_keyword = [], []
    for p in task.parameters:
        if p.kind is inspect.Parameter.POSITIONAL_ONLY:
            parameters.append(p.replace(kind=inspect.Parameter.POSITIONAL_OR_KEYWORD))
        elif p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD:
            parameters.append(p)
        elif p.kind is inspect.Parameter.KEYWORD_ONLY:
            keyword_only.append(p)
        elif p.kind is inspect.Parameter.VAR_KEYWORD:
            var_keyword.append(p)
    meta = inspect.Parameter(META_KEY, inspect.Parameter.KEYWORD_ONLY, default=None)
    run.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [*parameters, *keyword_only, meta, *var_keyword])
    run.__name__ = task.__name__
    run.__qualname__ = task.__qualname__
    run.__module__ = task.__module__
    run.__doc__ = task.__doc__
    return run


def shared_task(*args: Any, **options: Any) -> Any:
    """Celery's ``@shared_task`` / ``@shared_task(bind=True, ...)``: register the function as
    a job and return its :class:`Task`."""

    def decorate(func: Callable[..., Any]) -> Task:
        if not callable(func):
            raise ConfigurationError(f"@shared_task must decorate a function, got {func!r}")
        if inspect.iscoroutinefunction(func):
            raise NotSupported(f"{func.__qualname__}: an async task: declare it with "
                               "@django_xjobs.job, whose async def jobs run on the worker's "
                               "event loop")
        given = dict(options)
        name = given.pop("name", None) or f"{func.__module__}.{func.__name__}"
        bind = given.pop("bind", False)
        if not isinstance(bind, bool):
            raise ConfigurationError(f"{name}: bind must be True or False")
        dont = registry.exception_classes(name, given.pop("dont_autoretry_for", ()),
                                          what="dont_autoretry_for") or ()
        expires = given.pop("expires", None)
        # self.retry()'s wait when it names none (retry_kwargs' countdown is the automatic
        # retries' only, as in Celery).
        retry_delay = seconds(name, "default_retry_delay",
                               given.get("default_retry_delay", 180))
        mapped = job_options(name, given)
        max_attempts = mapped["max_attempts"]
        task = Task(func, name=name, bind=bind, default_retry_delay=retry_delay,
                    max_retries=None if max_attempts >= INT32 else max_attempts - 1,
                    dont_autoretry_for=tuple(dont), expires=expires)
        task.job = job(**{**mapped, **given})(_job_function(task))
        register(task)
        return task

    if len(args) == 1 and callable(args[0]) and not options:
        return decorate(args[0])
    if args:
        raise ConfigurationError("@shared_task takes its options by keyword")
    return decorate
