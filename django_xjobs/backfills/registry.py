"""The registry of backfills: ``@backfill``, and the map from a backfill's name to its
definition.

Registering a backfill registers two things, under this registry's lock: the backfill here,
and in the job registry (:mod:`django_xjobs.registry`) the job that runs its passes,
``backfill:<name>``. A worker reaches a backfill only through that job, whose function looks
the backfill up here by name when it runs: a stored row names a job, never a backfill.

Why a map of its own rather than entries in the job registry: the job registry stays the one
map from a stored name to code, and keeps its own refusals (``DuplicateJobName``, and an
``UnknownJob`` that says where the code was expected). This map answers operators
(``xjobs_backfill start NAME``) and refuses in its own terms: a second function under a taken
name is a ``ConfigurationError`` naming ``@backfill(name)``, an unknown name an
:class:`~django_xjobs.exceptions.UnknownBackfill` listing the known ones. What the two would
share is a dictionary and a lock; sharing them would mean telling backfills from jobs by a name
prefix inside the job registry and teaching it these messages.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any, overload

from .. import registry
from ..context import JobContext
from ..exceptions import ConfigurationError, PermanentError, UnknownBackfill
from .definition import BackfillDefinition, build
from .passes import Pass

_lock = threading.Lock()
_backfills: dict[str, BackfillDefinition] = {}


def register(definition: BackfillDefinition) -> BackfillDefinition:
    """Register the backfill and the job that runs its passes.

    A backfill on another alias than the job tables is not refused here, where settings may not
    be configured yet and an exception would break the import of a whole module: the system
    check ``xjobs.W050`` reports it at startup, and start and run refuse it (check_alias)."""
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
        return Pass(get(name), ctx, batch_size=batch_size, throttle=throttle).run()

    run_pass.__qualname__ = f"run_pass[{name}]"
    return run_pass


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
    :meth:`~django_xjobs.backfills.definition.BackfillDefinition.total`). Bare ``@backfill``
    names it like a job.
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
