"""``@job`` and what it returns: a :class:`Job` to enqueue, a :class:`BoundJob` with options.

Where ``django.tasks`` keeps ``task`` and ``Task``. A :class:`Job` is the registry's
:class:`~django_xjobs.registry.JobDefinition` (what a worker needs to run it) plus the enqueue
methods, which call :mod:`django_xjobs.api`: ``send_welcome.enqueue(user_id=42)``,
``send_welcome.using(delay=60).enqueue(user_id=42)``, ``await send_welcome.aenqueue(...)``,
``send_welcome.enqueue_on_commit(...)``, ``send_welcome.bulk_enqueue([...])``.

The options ``@job`` takes are its core options (``registry.CORE_OPTIONS``) and those other parts
register (``registry.register_option``): ``concurrency=`` and ``cron=`` / ``every=`` /
``timezone=`` / ``misfire=`` (the package's ``__init__`` registers them, so they are known
wherever ``@job`` is importable, before Django's app registry is ready too).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, overload

from asgiref.sync import sync_to_async

from . import api, registry
from .api import ENQUEUE_OPTIONS, EnqueueOptions, JobHandle
from .exceptions import ConfigurationError, InvalidJobInput
from .registry import JobDefinition, P, R

if TYPE_CHECKING:
    from typing import Concatenate, Unpack

    from .context import JobContext
    from .outbox import StagedJob
    from .ratelimits import RateLimit
    from .records import EnqueueParams
    from .slots import Concurrency

_NO_OPTIONS: Mapping[str, Any] = {}


class Job(JobDefinition[P, R]):
    """A registered job. Call ``.enqueue(**input)`` to run it in a worker; ``job(ctx, **input)``
    calls the function directly (tests)."""

    def using(self, **options: Unpack[EnqueueOptions]) -> BoundJob[P, R]:
        """This job with enqueue options (:class:`~django_xjobs.api.EnqueueOptions`):
        ``send_welcome.using(delay=60, idempotency_key="welcome:42").enqueue(user_id=42)``."""
        return BoundJob(self, options)

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> JobHandle:
        """Enqueue one run of this job with this input, in the caller's transaction; the input
        is checked against the function's parameters first."""
        return BoundJob(self, _NO_OPTIONS).enqueue(*args, **kwargs)

    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> JobHandle:
        """:meth:`enqueue` for async code: runs on the thread Django's async ORM uses, so in
        the same connection and transaction as ``await Model.objects.acreate(...)``."""
        return await BoundJob(self, _NO_OPTIONS).aenqueue(*args, **kwargs)

    def bulk_enqueue(self, inputs: Iterable[Mapping[str, Any]],
                     **options: Unpack[EnqueueOptions]) -> list[JobHandle]:
        """Enqueue many inputs of this job, with the same options, in one statement per 1,000;
        see :func:`~django_xjobs.enqueue_many`."""
        return BoundJob(self, options).bulk_enqueue(inputs)

    def enqueue_on_commit(self, *args: P.args, **kwargs: P.kwargs) -> StagedJob:
        """Stage this job in the current transaction (docs/transactional-enqueue.md)."""
        return BoundJob(self, _NO_OPTIONS).enqueue_on_commit(*args, **kwargs)


class BoundJob(Generic[P, R]):
    """A job with enqueue options applied: ``my_job.using(delay=..., tenant_id=...)``."""

    __slots__ = ("definition", "options")

    def __init__(self, definition: JobDefinition[P, R], options: Mapping[str, Any]) -> None:
        unknown = set(options) - ENQUEUE_OPTIONS
        if unknown:
            raise InvalidJobInput(
                f"unknown enqueue option(s) {sorted(unknown)}; known: {sorted(ENQUEUE_OPTIONS)}"
            )
        self.definition = definition
        self.options = dict(options)

    def using(self, **options: Unpack[EnqueueOptions]) -> BoundJob[P, R]:
        """These options with more (a later value of an option wins)."""
        return BoundJob(self.definition, {**self.options, **options})

    def _input(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        if args:
            return self.definition.shape.merge(self.definition.name, args, kwargs)
        return kwargs

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> JobHandle:
        """Enqueue one run of this job with these options and this input."""
        return api.enqueue_job(self.definition, self._input(args, kwargs), self.options)

    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> JobHandle:
        """:meth:`enqueue` from async code, on Django's thread for the async ORM
        (the docstring of ``django_xjobs.api`` says why)."""
        return await sync_to_async(self.enqueue, thread_sensitive=True)(*args, **kwargs)

    def bulk_enqueue(self, inputs: Iterable[Mapping[str, Any]]) -> list[JobHandle]:
        """Enqueue many inputs of this job in one statement per 1,000; see
        :func:`~django_xjobs.enqueue_many`."""
        return api.enqueue_many((self.definition.name, inp, self.options) for inp in inputs)

    def enqueue_on_commit(self, *args: P.args, **kwargs: P.kwargs) -> StagedJob:
        """Stage this job in the current transaction; see
        :func:`~django_xjobs.enqueue_on_commit`."""
        return api.stage_job(self.definition, self._input(args, kwargs), self.options,
                             using="default")


class JobDecorator(Protocol):
    """What ``@job(...)`` with options returns: a decorator keeping the function's types."""

    def __call__(self, func: Callable[Concatenate[JobContext, P], R], /) -> Job[P, R]: ...


@overload
def job(func: Callable[Concatenate[JobContext, P], R], /) -> Job[P, R]: ...
@overload
def job(
    *,
    name: str | None = ...,
    queue: str = ...,
    max_attempts: int | None = ...,
    timeout: timedelta | float | str | None = ...,
    priority: int = ...,
    retry_base: timedelta | float | str | None = ...,
    retry_cap: timedelta | float | str | None = ...,
    retry_jitter: bool = ...,
    retry_on: type[BaseException] | tuple[type[BaseException], ...] | None = ...,
    concurrency: Concurrency | None = ...,  # slots.py (docs/concurrency.md)
    rate_limit: RateLimit | None = ...,  # ratelimits.py (docs/flow-control.md)
    cron: str | None = ...,  # scheduler/options.py (docs/scheduling.md)
    # or an interval, not both (docs/scheduling.md, "Intervals")
    every: timedelta | float | str | None = ...,
    timezone: str = ...,
    misfire: Literal["latest", "all", "skip"] = ...,
    # scheduler/options.py (docs/scheduling.md, "Overlap")
    overlap: Literal["allow", "skip", "buffer_one", "cancel_previous"] = ...,
) -> JobDecorator: ...
def job(func: Callable[..., Any] | None = None, /, **kwargs: Any) -> Any:
    """Register a function as a job: ``@job`` or ``@job(queue="emails", max_attempts=5)``.

    The function is called as ``func(ctx, **input)``; it may be ``async def``. A function that
    no worker could call that way (no ``ctx``, or a required positional-only parameter after
    it) is refused here.
    """
    known = registry.option_names()
    unknown = set(kwargs) - known
    if unknown:
        raise ConfigurationError(
            f"@job got unknown option(s) {sorted(unknown)}; known: {sorted(known)}"
        )

    def decorate(f: Callable[..., Any]) -> Job[..., Any]:
        definition: Job[..., Any] = Job.build(f, **kwargs)
        if definition.shape.unusable is not None:
            raise ConfigurationError(f"{definition.name}: {definition.shape.unusable}")
        registry.check_options(definition)
        return registry.register(definition)

    if func is not None:
        return decorate(func)
    return decorate


def child_params(job: Any, input: Any, options: Mapping[str, Any], ctx: JobContext, *,
                 what: str) -> EnqueueParams:
    """What ``ctx.step.invoke`` / ``gather`` enqueue for ``(job, input, options)``: ``job`` is a
    ``@job`` function, ``my_job.using(...)`` (its options, under ``options``) or a registered
    name (docs/durable.md, "Child jobs")."""
    if isinstance(job, BoundJob):
        definition, options = job.definition, {**job.options, **options}
    elif isinstance(job, JobDefinition):
        definition = job
    elif isinstance(job, str):
        definition = registry.get(job)
    else:
        raise InvalidJobInput(
            f"{what}: expected a registered job (the @job function, my_job.using(...)) or its "
            f"name, got {job!r}"
        )
    return api.child_params(definition, input, options, parent_id=ctx.job_id,
                            tenant_id=ctx.tenant_id, traceparent=ctx.traceparent, what=what)
