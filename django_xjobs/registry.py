"""The registry of jobs: the only map from a stored job name to code.

A worker runs a job by looking its stored name up here. Nothing is ever imported by name from a
row: a row whose name is not registered is retried as unknown and ends ``dead``
(tests/acceptance/test_worker_faults.py::test_a_row_naming_os_system_is_never_imported).

Definitions are validated when decorated, so a bad queue name or retry policy fails at import
time, in the module that declared it, not at 3 a.m. in a worker. So is the function's signature:
each job reads it once (:class:`InputShape`), and every enqueue binds its input to it, so an
input the function cannot take is refused at enqueue instead of failing every attempt with a
``TypeError`` (tests/unit/test_validation.py).

The ``@job`` decorator and the enqueue side of a job live in :mod:`django_xjobs.decorator`; this
module depends on nothing above the settings, so every layer may look a job up. Options that
other parts add to ``@job`` (``concurrency=``, ``cron=``) are registered with
:func:`register_option`.

Typing: :class:`JobDefinition` is generic in the function's parameters after ``ctx`` (a
``ParamSpec``) and its return type, so a type checker checks ``send.enqueue(...)`` against
``send``'s own parameters (tests/typecheck/enqueue_calls.py, run by tests/unit/test_typing.py).
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from django.apps import apps

from . import conf
from .exceptions import ConfigurationError, DuplicateJobName, InvalidJobInput, UnknownJob
from .values import INT32, check_name, parse_duration

if TYPE_CHECKING:
    from typing import Concatenate, Self

    from .context import JobContext

P = ParamSpec("P")
R = TypeVar("R")
D = TypeVar("D", bound="JobDefinition[Any, Any]")

_lock = threading.Lock()
_jobs: dict[str, JobDefinition[..., Any]] = {}


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """Exponential backoff with full jitter: ``uniform(0, min(cap, base * 2**(attempt-1)))``;
    without jitter the whole window, ``min(cap, base * 2**(attempt-1))`` (``base == cap``: a
    fixed delay). ``on``: the exceptions that retry; any other ends the job ``dead`` at once
    (None: every exception retries)."""

    base: float | None = None  # seconds; None = XJOBS["RETRY_BASE"]
    cap: float | None = None  # seconds; None = XJOBS["RETRY_CAP"]
    jitter: bool = True
    on: tuple[type[BaseException], ...] | None = None


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


@dataclass(frozen=True, slots=True)
class InputShape:
    """The input a job function takes: its parameters after ``ctx``, called by keyword.

    Read from the signature once, when the job is decorated. Enqueue checks an input with two
    set comparisons (:meth:`check`; a single enqueue is benchmarked, bench/) and builds a
    message only for an input that does not fit. ``accepted`` is None for a function that
    takes ``**kwargs``: any name is accepted, the required ones must still be there.
    """

    call: str  # "add(ctx, a, b=...)", for messages
    required: frozenset[str] = frozenset()
    accepted: frozenset[str] | None = None
    # The parameters that positional enqueue arguments fill, in order: the type of
    # ``Job.enqueue`` is the function's own (ParamSpec), so ``add.enqueue(1, 2)`` type-checks
    # and is stored as ``{"a": 1, "b": 2}``.
    positional: tuple[str, ...] = ()
    # Why no worker could ever call the function, or None (``@job`` refuses such a function).
    unusable: str | None = None

    @classmethod
    def of(cls, func: Callable[..., Any]) -> InputShape:
        name = getattr(func, "__name__", None) or type(func).__name__
        try:
            parameters = list(inspect.signature(func).parameters.values())
        except (TypeError, ValueError):  # no signature to read (some builtins): no check
            return cls(call=f"{name}(...)")
        call = f"{name}({_describe(parameters)})"
        if not parameters or parameters[0].kind not in (*_POSITIONAL,
                                                        inspect.Parameter.VAR_POSITIONAL):
            return cls(call=call, unusable=(
                f"{call} does not take the job context: a worker calls it as "
                "func(ctx, **input), so its first parameter must be positional (ctx)"
            ))
        if parameters[0].kind is not inspect.Parameter.VAR_POSITIONAL:
            parameters = parameters[1:]  # ctx
        stuck = [p.name for p in parameters
                 if p.kind is inspect.Parameter.POSITIONAL_ONLY and p.default is p.empty]
        if stuck:
            return cls(call=call, unusable=(
                f"{call}: {_names(stuck)} {'is' if len(stuck) == 1 else 'are'} positional-only, "
                "but a job's input is passed by keyword (func(ctx, **input)), so no enqueue "
                "could ever give it a value"
            ))
        by_keyword = [p for p in parameters if p.kind in (
            inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
        takes_positional = all(p.kind is not inspect.Parameter.POSITIONAL_ONLY
                               for p in parameters)
        return cls(
            call=call,
            required=frozenset(p.name for p in by_keyword if p.default is p.empty),
            accepted=None if takes_any else frozenset(p.name for p in by_keyword),
            positional=tuple(p.name for p in parameters
                             if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD)
            if takes_positional else (),
        )

    def check(self, job: str, input: Mapping[Any, Any]) -> None:
        """Raise :class:`InvalidJobInput` naming the missing or unexpected arguments unless
        ``func(ctx, **input)`` binds."""
        keys = input.keys()
        if keys >= self.required and (self.accepted is None or keys <= self.accepted):
            return
        raise InvalidJobInput(f"input of {job} does not fit {self.call}: {self.mismatch(keys)}")

    def mismatch(self, keys: Any) -> str:
        """What is wrong with an input of these keys, for a message ("" if nothing)."""
        given = set(keys)
        problems = []
        missing = self.required - given
        if missing:
            problems.append(f"missing required argument(s) {_names(missing)}")
        unexpected = set() if self.accepted is None else given - self.accepted
        if unexpected:
            takes = _names(self.accepted) if self.accepted else "nothing"
            problems.append(f"unexpected argument(s) {_names(unexpected)} (it takes {takes})")
        return "; ".join(problems)

    def merge(self, job: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The input of ``enqueue(*args, **kwargs)``: positional arguments stored under the
        names of the parameters they fill."""
        if len(args) > len(self.positional):
            raise InvalidJobInput(
                f"input of {job}: {self.call} takes {len(self.positional)} argument(s) by "
                f"position after ctx, got {len(args)} (a job's input is stored by parameter "
                "name; pass the others by keyword)"
            )
        input = dict(zip(self.positional, args, strict=False))
        twice = input.keys() & kwargs.keys()
        if twice:
            raise InvalidJobInput(
                f"input of {job}: got multiple values for argument(s) {_names(twice)}"
            )
        input.update(kwargs)
        return input


def _describe(parameters: list[inspect.Parameter]) -> str:
    """``ctx, a, /, b=..., *, c``: a signature without its annotations and default values."""
    parts: list[str] = []
    star = False
    for n, p in enumerate(parameters):
        if p.kind is inspect.Parameter.KEYWORD_ONLY and not star:
            parts.append("*")
        star = star or p.kind in (inspect.Parameter.KEYWORD_ONLY,
                                  inspect.Parameter.VAR_POSITIONAL)
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            parts.append(f"*{p.name}")
        elif p.kind is inspect.Parameter.VAR_KEYWORD:
            parts.append(f"**{p.name}")
        else:
            parts.append(p.name if p.default is p.empty else f"{p.name}=...")
        if p.kind is inspect.Parameter.POSITIONAL_ONLY and (
            n + 1 == len(parameters)
            or parameters[n + 1].kind is not inspect.Parameter.POSITIONAL_ONLY
        ):
            parts.append("/")
    return ", ".join(parts)


def _names(names: Any) -> str:
    return ", ".join(sorted(f"{name!r:.60}" for name in names))


@dataclass(eq=False, kw_only=True)
class JobDefinition(Generic[P, R]):
    """What the registry knows of a job: its function, its name and its options, validated.

    ``@job`` returns a :class:`django_xjobs.decorator.Job`, this plus the enqueue methods; a worker
    needs only this. ``definition(ctx, **input)`` calls the function directly (tests).
    """

    func: Callable[Concatenate[JobContext, P], R]
    name: str
    # The queue @job(queue=...) named; None: XJOBS["ROUTES"] chooses (``queue``).
    declared_queue: str | None = None
    max_attempts: int | None = None  # None = XJOBS["MAX_ATTEMPTS"]
    timeout: float | None = None  # seconds; None = no timeout
    priority: int = 0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    is_async: bool = False
    options: dict[str, Any] = field(default_factory=dict)
    shape: InputShape = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.shape = InputShape.of(self.func)

    def __call__(self, ctx: JobContext, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.func(ctx, *args, **kwargs)

    def __repr__(self) -> str:
        return f"<Job {self.name} queue={self.queue}>"

    @property
    def queue(self) -> str:
        """The queue a job of this definition goes to unless its enqueue names one: the one
        ``@job(queue=...)`` named, else the first pattern of ``XJOBS["ROUTES"]`` that matches
        the job's name, else ``"default"`` (docs/guide.md, "Routing by name")."""
        if self.declared_queue is not None:
            return self.declared_queue
        return conf.get().route(self.name)

    @classmethod
    def build(
        cls,
        func: Callable[..., Any],
        *,
        name: str | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        timeout: timedelta | float | str | None = None,
        priority: int = 0,
        retry_base: timedelta | float | str | None = None,
        retry_cap: timedelta | float | str | None = None,
        retry_jitter: bool = True,
        retry_on: type[BaseException] | tuple[type[BaseException], ...] | None = None,
        **options: Any,
    ) -> Self:
        """A definition of ``func`` with its core options checked (:data:`CORE_OPTIONS`);
        the others are kept in ``options`` for their checks (:func:`register_option`)."""
        if not callable(func):
            raise ConfigurationError(f"@job must decorate a function, got {func!r}")
        job_name = check_name("Job name", name if name is not None else default_name(func),
                              error=ConfigurationError)
        if queue is not None:
            check_name("Queue name", queue, error=ConfigurationError)
        if max_attempts is not None and (
            isinstance(max_attempts, bool) or not isinstance(max_attempts, int)
            or not 1 <= max_attempts <= INT32
        ):
            raise ConfigurationError(
                f"{job_name}: max_attempts must be an integer from 1 to {INT32}")
        if isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) > INT32:
            raise ConfigurationError(f"{job_name}: priority must be a 32-bit integer")
        timeout_s = None
        if timeout is not None:
            timeout_s = parse_duration(timeout, what=f"{job_name}: timeout")
            if timeout_s <= 0:
                raise ConfigurationError(f"{job_name}: timeout must be greater than zero")
        base = (parse_duration(retry_base, what=f"{job_name}: retry_base")
                if retry_base is not None else None)  # 0 is a retry at once
        cap = parse_duration(retry_cap, what=f"{job_name}: retry_cap") if retry_cap is not None \
            else None
        if base is not None and cap is not None and cap < base:
            raise ConfigurationError(f"{job_name}: retry_cap must not be smaller than retry_base")
        if not isinstance(retry_jitter, bool):
            raise ConfigurationError(f"{job_name}: retry_jitter must be True or False")
        return cls(
            func=func,
            name=job_name,
            declared_queue=queue,
            max_attempts=max_attempts,
            timeout=timeout_s,
            priority=priority,
            retry=RetryPolicy(base=base, cap=cap, jitter=retry_jitter,
                              on=exception_classes(job_name, retry_on)),
            is_async=inspect.iscoroutinefunction(func),
            options=options,
        )


def exception_classes(job: str, value: Any, *, what: str = "retry_on"
                      ) -> tuple[type[BaseException], ...] | None:
    """``retry_on=`` (and the like): None, an exception class or a tuple (a list) of them."""
    if value is None:
        return None
    classes = tuple(value) if isinstance(value, tuple | list) else (value,)
    for kind in classes:
        if not (isinstance(kind, type) and issubclass(kind, BaseException)):
            raise ConfigurationError(
                f"{job}: {what} must be an exception class or a tuple of them, got {kind!r}")
    return classes


def default_name(func: Callable[..., Any]) -> str:
    """``"<app label>.<function name>"`` in an installed app, else ``"<module>.<function>"``."""
    module = func.__module__
    label: str | None = None
    try:
        config = apps.get_containing_app_config(module)
        label = config.label if config is not None else None
    except Exception:  # AppRegistryNotReady: declared before setup(); fall back to the module
        label = None
    return f"{label or module}.{func.__name__}"


def register(definition: D) -> D:
    with _lock:
        existing = _jobs.get(definition.name)
        if existing is not None and qualname(existing.func) != qualname(definition.func):
            raise DuplicateJobName(
                f"Job name {definition.name!r} is already registered by "
                f"{qualname(existing.func)}; pass @job(name=...) to tell them apart"
            )
        _jobs[definition.name] = definition
    return definition


def qualname(func: Callable[..., Any]) -> str:
    """``module.qualified.name`` of a function, to tell two registrations apart."""
    return f"{func.__module__}.{getattr(func, '__qualname__', repr(func))}"


# ------------------------------------------------------------------------- @job options --

# The options of @job beyond CORE_OPTIONS: name -> its check, run on each definition built with
# it (django_xjobs/__init__.py adds concurrency=, cron=, timezone= and misfire=).
OptionCheck = Callable[[JobDefinition[..., Any]], None]
CORE_OPTIONS = frozenset({"name", "queue", "max_attempts", "timeout", "priority", "retry_base",
                          "retry_cap", "retry_jitter", "retry_on"})
_options: dict[str, OptionCheck] = {}


def register_option(name: str, check: OptionCheck) -> None:
    """Make ``@job(name=...)`` known; ``check(definition)`` validates (and may normalise) the
    value in ``definition.options`` when a job is decorated, and runs for every job, given the
    option or not. Registering a name again replaces its check."""
    if name in CORE_OPTIONS:
        raise ConfigurationError(f"@job option {name!r} is a core option")
    with _lock:
        _options[name] = check


def option_names() -> frozenset[str]:
    """Every option ``@job`` takes: the core ones and the registered ones."""
    return CORE_OPTIONS | _options.keys()


def check_options(definition: JobDefinition[..., Any]) -> None:
    """Run every registered option's check on ``definition``."""
    for check in list(_options.values()):
        check(definition)


# ------------------------------------------------------------------------------- lookups --


def get(name: str) -> JobDefinition[..., Any]:
    try:
        return _jobs[name]
    except KeyError:
        raise UnknownJob(
            f"No job named {name!r} is registered in this process: {expected_home(name)}"
        ) from None


def expected_home(name: str, enqueued_by: str | None = None) -> str:
    """Where the code of job ``name`` was expected, for a message about a name no registry
    here knows: a django.tasks task is named by its module path (``app.tasks.func``), an
    ``@job`` by default ``<app label>.<function>``; a name that looks like neither lists every
    place, ``XJOBS["SCHEDULE"]`` included. ``enqueued_by`` ``cron:<task>`` names the schedule
    entry that enqueued it."""
    parts = name.split(".")
    if len(parts) >= 3 and parts[-2] == "tasks":
        where = (f"a django.tasks task: function {parts[-1]!r} in module "
                 f"{'.'.join(parts[:-1])!r} (an app's tasks.py)")
    elif len(parts) == 2 and all(parts):
        where = (f"an @job: function {parts[1]!r} in the jobs.py of app {parts[0]!r} (or an "
                 "@job(name=...) of that name)")
    else:
        where = ("an @job in an app's jobs.py, a django.tasks task in an app's tasks.py (named "
                 'by its module path), or the job of an XJOBS["SCHEDULE"] entry')
    text = f"expected as {where}, with its app in INSTALLED_APPS"
    if enqueued_by and enqueued_by.startswith("cron:"):
        text += f'; enqueued by XJOBS["SCHEDULE"][{enqueued_by[5:]!r}] (its "job")'
    return text


def lookup(name: str) -> JobDefinition[..., Any] | None:
    """The job registered under ``name``, or None. Never imports anything."""
    return _jobs.get(name)


def all_jobs() -> dict[str, JobDefinition[..., Any]]:
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
