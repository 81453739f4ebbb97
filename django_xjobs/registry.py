"""``@job`` registration: the only map from a stored job name to code.

A worker runs a job by looking its stored name up here. Nothing is ever imported by name from a
row: a row whose name is not registered is retried as unknown and ends ``dead``
(tests/acceptance/test_worker_faults.py::test_a_row_naming_os_system_is_never_imported).

Definitions are validated when decorated, so a bad queue name or retry policy fails at import
time, in the module that declared it, not at 3 a.m. in a worker.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, overload

from . import conf
from .conf import NAME_RE, parse_duration
from .exceptions import ConfigurationError, DuplicateJobName, UnknownJob

if TYPE_CHECKING:
    from .api import BoundJob, JobHandle
    from .outbox import StagedJob

INT32 = 2**31 - 1  # the columns are PostgreSQL integers
_lock = threading.Lock()
_jobs: dict[str, Job] = {}


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """Exponential backoff with full jitter: ``uniform(0, min(cap, base * 2**(attempt-1)))``."""

    base: float | None = None  # seconds; None = XJOBS["RETRY_BASE"]
    cap: float | None = None  # seconds; None = XJOBS["RETRY_CAP"]


@dataclass(eq=False, kw_only=True)
class Job:
    """A registered job. Call ``.enqueue(**input)`` to run it in a worker; ``job(ctx, **input)``
    calls the function directly (tests)."""

    func: Callable[..., Any]
    name: str
    queue: str = "default"
    max_attempts: int | None = None  # None = XJOBS["MAX_ATTEMPTS"]
    timeout: float | None = None  # seconds; None = no timeout
    priority: int = 0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    is_async: bool = False
    options: dict[str, Any] = field(default_factory=dict)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Job {self.name} queue={self.queue}>"

    # The enqueue side lives in api.py; these delegate so that `my_job.enqueue(...)` reads well.
    def using(self, **options: Any) -> BoundJob:
        from .api import BoundJob

        return BoundJob(self, options)

    def enqueue(self, **input: Any) -> JobHandle:
        from .api import BoundJob

        return BoundJob(self, {}).enqueue(**input)

    def bulk_enqueue(self, inputs: Any, **options: Any) -> list[JobHandle]:
        from .api import BoundJob

        return BoundJob(self, options).bulk_enqueue(inputs)

    def enqueue_on_commit(self, **input: Any) -> StagedJob:
        """Stage this job in the current transaction (docs/transactional-enqueue.md)."""
        from .api import BoundJob

        return BoundJob(self, {}).enqueue_on_commit(**input)


def _default_name(func: Callable[..., Any]) -> str:
    """``"<app label>.<function name>"`` in an installed app, else ``"<module>.<function>"``."""
    module = func.__module__
    label: str | None = None
    try:
        from django.apps import apps

        config = apps.get_containing_app_config(module)
        label = config.label if config is not None else None
    except Exception:  # AppRegistryNotReady: declared before setup(); fall back to the module
        label = None
    return f"{label or module}.{func.__name__}"


def _validate_name(kind: str, value: Any) -> str:
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise ConfigurationError(
            f"{kind} {value!r} is not valid: use 1-200 characters from [A-Za-z0-9_.:-]"
        )
    return value


def build_job(
    func: Callable[..., Any],
    *,
    name: str | None = None,
    queue: str = "default",
    max_attempts: int | None = None,
    timeout: timedelta | float | str | None = None,
    priority: int = 0,
    retry_base: timedelta | float | str | None = None,
    retry_cap: timedelta | float | str | None = None,
    **options: Any,
) -> Job:
    if not callable(func):
        raise ConfigurationError(f"@job must decorate a function, got {func!r}")
    job_name = _validate_name("Job name", name if name is not None else _default_name(func))
    _validate_name("Queue name", queue)
    if max_attempts is not None and (
        isinstance(max_attempts, bool) or not isinstance(max_attempts, int)
        or not 1 <= max_attempts <= INT32
    ):
        raise ConfigurationError(f"{job_name}: max_attempts must be an integer from 1 to {INT32}")
    if isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) > INT32:
        raise ConfigurationError(f"{job_name}: priority must be a 32-bit integer")
    timeout_s = None
    if timeout is not None:
        timeout_s = parse_duration(timeout, what=f"{job_name}: timeout")
        if timeout_s <= 0:
            raise ConfigurationError(f"{job_name}: timeout must be greater than zero")
    base = parse_duration(retry_base, what=f"{job_name}: retry_base") if retry_base else None
    cap = parse_duration(retry_cap, what=f"{job_name}: retry_cap") if retry_cap else None
    if base is not None and cap is not None and cap < base:
        raise ConfigurationError(f"{job_name}: retry_cap must not be smaller than retry_base")
    is_async = inspect.iscoroutinefunction(func)
    return Job(
        func=func,
        name=job_name,
        queue=queue,
        max_attempts=max_attempts,
        timeout=timeout_s,
        priority=priority,
        retry=RetryPolicy(base=base, cap=cap),
        is_async=is_async,
        options=options,
    )


def register(definition: Job) -> Job:
    with _lock:
        existing = _jobs.get(definition.name)
        if existing is not None and _qualname(existing.func) != _qualname(definition.func):
            raise DuplicateJobName(
                f"Job name {definition.name!r} is already registered by "
                f"{_qualname(existing.func)}; pass @job(name=...) to tell them apart"
            )
        _jobs[definition.name] = definition
    return definition


def _qualname(func: Callable[..., Any]) -> str:
    return f"{func.__module__}.{getattr(func, '__qualname__', repr(func))}"


@overload
def job(func: Callable[..., Any], /) -> Job: ...
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
    concurrency: Any = ...,  # a slots.Concurrency (registered through _extension_options)
) -> Callable[[Callable[..., Any]], Job]: ...
def job(func: Callable[..., Any] | None = None, /, **kwargs: Any) -> Any:
    """Register a function as a job: ``@job`` or ``@job(queue="emails", max_attempts=5)``.

    The function is called as ``func(ctx, **input)``; it may be ``async def``.
    """
    _known = {"name", "queue", "max_attempts", "timeout", "priority", "retry_base", "retry_cap"}
    unknown = set(kwargs) - _known - set(_extension_options)
    if unknown:
        raise ConfigurationError(f"@job got unknown option(s) {sorted(unknown)}")

    def decorate(f: Callable[..., Any]) -> Job:
        definition = build_job(f, **kwargs)
        for hook in _extension_options.values():
            hook(definition)
        return register(definition)

    if func is not None:
        return decorate(func)
    return decorate


# Options that later subsystems add to @job (cron=..., concurrency=...): name -> validator hook
# run on the built definition. Kept as a registry so this module does not import them.
_extension_options: dict[str, Callable[[Job], None]] = {}


def get(name: str) -> Job:
    try:
        return _jobs[name]
    except KeyError:
        raise UnknownJob(
            f"No job named {name!r} is registered in this process (is its app in "
            "INSTALLED_APPS and its jobs.py importable?)"
        ) from None


def lookup(name: str) -> Job | None:
    """The job registered under ``name``, or None. Never imports anything."""
    return _jobs.get(name)


def all_jobs() -> dict[str, Job]:
    return dict(_jobs)


def worked_queues(settings: conf.XJobsSettings | None = None) -> tuple[str, ...]:
    """The queues a worker started without ``--queue`` works.

    ``XJOBS["QUEUES"]`` when the project gives it (operators then choose); otherwise
    ``"default"`` and every queue a registered job names (``jobs.py``, backfills, django.tasks
    tasks), so ``@job(queue="emails")`` runs on a plain ``manage.py xjobs_worker``.
    """
    settings = settings or conf.get()
    if settings.queues_given:
        return settings.queues
    named = sorted({job.queue for job in _jobs.values()} - set(settings.queues))
    return (*settings.queues, *named)


def unworked_jobs(settings: conf.XJobsSettings | None = None) -> dict[str, str]:
    """Registered jobs whose queue a worker started without ``--queue`` does not work:
    name -> queue (only possible when XJOBS["QUEUES"] is given)."""
    worked = set(worked_queues(settings))
    return {name: job.queue for name, job in sorted(_jobs.items()) if job.queue not in worked}


def unregister(name: str) -> None:
    """Forget a job (tests)."""
    with _lock:
        _jobs.pop(name, None)
