"""Signatures, ``chain``, ``group`` and ``chord``, built on child jobs.

A canvas is enqueued as one job of its own, an orchestrator (``django_xjobs.celery.chain``,
``.group``, ``.chord``), whose input is the canvas as data. It runs its tasks as child jobs
through durable steps (docs/durable.md, "Child jobs"): a chain invokes each task in turn, the
previous result put first in the next task's arguments (unless the signature is immutable,
``.si()``); a group gathers all of its tasks at once and returns their results in order; a
chord gathers its header, then invokes its body with the list of results. While children run
the orchestrator is suspended, holding no worker thread; a crash or a deploy in between
resumes it where it was, each child started once. A child that fails (``dead``, ``cancelled``)
fails the orchestrator (``ChildFailed``), so a chain stops at the failed task as Celery's does.

The ``AsyncResult`` of ``chain(...).apply_async()`` is the orchestrator's: ``.get()`` returns
the last task's result (a group's: the list), ``.status`` is the canvas' as a whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .. import api, registry
from ..context import JobContext
from ..decorator import job
from ..exceptions import InvalidJobInput, UnknownJob, fail_for_good
from .base import enqueue_options, lookup
from .errors import NotSupported
from .result import AsyncResult

CHAIN, GROUP, CHORD = ("django_xjobs.celery.chain", "django_xjobs.celery.group",
                       "django_xjobs.celery.chord")
# The enqueue options a signature may carry (.set(...), .apply_async(...)) onto its child job:
# Celery's, and the native ones a child job takes.
_CHILD_OPTIONS = (frozenset({"countdown", "eta", "expires", "queue", "priority"})
                  | api.ENQUEUE_OPTIONS) - api.CHILD_REFUSED_OPTIONS


class Signature:
    """A task with arguments and options, to call later or to put in a canvas:
    ``add.s(2, 3)``, ``add.si(2, 3)`` (immutable: a chain does not pass it the previous
    result), ``add.s(2).set(queue="math")``."""

    def __init__(self, task: Any, args: Iterable[Any] = (),
                 kwargs: Mapping[str, Any] | None = None, *,
                 options: Mapping[str, Any] | None = None, immutable: bool = False) -> None:
        self.task: str = task if isinstance(task, str) else task.name
        self.args = tuple(args)
        self.kwargs = dict(kwargs or {})
        self.options = dict(options or {})
        self.immutable = immutable
        unknown = set(self.options) - _CHILD_OPTIONS
        if unknown:
            raise InvalidJobInput(f"signature of {self.task}: unknown option(s) "
                                  f"{sorted(unknown)}; known: {sorted(_CHILD_OPTIONS)}")

    def __repr__(self) -> str:
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"{self.task}({', '.join(parts)}){'!' if self.immutable else ''}"

    def __or__(self, other: Any) -> chain:
        return chain(self, other)

    def set(self, immutable: bool | None = None, **options: Any) -> Signature:
        if immutable is not None:
            self.immutable = immutable
        merged = Signature(self.task, self.args, self.kwargs, options={**self.options, **options},
                           immutable=self.immutable)
        self.options = merged.options
        return self

    def clone(self, args: Iterable[Any] = (), kwargs: Mapping[str, Any] | None = None,
              **options: Any) -> Signature:
        """A copy with ``args`` put first (unless immutable), ``kwargs`` and ``options``
        merged in."""
        if self.immutable:
            args, kwargs = (), None
        return Signature(self.task, (*args, *self.args), {**self.kwargs, **(kwargs or {})},
                         options={**self.options, **options}, immutable=self.immutable)

    def delay(self, *args: Any, **kwargs: Any) -> AsyncResult:
        return self.apply_async(args, kwargs)

    def apply_async(self, args: Iterable[Any] = (), kwargs: Mapping[str, Any] | None = None,
                    **options: Any) -> AsyncResult:
        call = self.clone(args, kwargs, **options)
        task = _task(call.task)
        expires = call.options.pop("expires", task.expires)
        handle = api.enqueue_job(task.job, task.input(call.args, call.kwargs, expires=expires),
                                 enqueue_options(task.name, call.options))
        return AsyncResult(handle.id, task_name=task.name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the task in this process, now."""
        call = self.clone(args, kwargs)
        return _task(call.task)(*call.args, **call.kwargs)

    def data(self) -> dict[str, Any]:
        """The signature as the orchestrator's input stores it."""
        return {"kind": "task", "task": self.task, "args": list(self.args),
                "kwargs": self.kwargs, "options": self.options, "immutable": self.immutable}


def signature(task: Any, args: Iterable[Any] = (), kwargs: Mapping[str, Any] | None = None,
              **options: Any) -> Signature:
    immutable = bool(options.pop("immutable", False))
    return Signature(task, args, kwargs, options=options, immutable=immutable)


def _task(name: str) -> Any:
    task = lookup(name)
    if task is None:
        raise InvalidJobInput(
            f"no Celery-style task named {name!r} is registered in this process (a "
            "@shared_task in an installed app's tasks.py)")
    return task


class Canvas:
    """What ``chain``, ``group`` and ``chord`` share: enqueued as one orchestrator job."""

    kind: str
    orchestrator: str

    def __init__(self, *tasks: Any, **options: Any) -> None:
        if len(tasks) == 1 and not isinstance(tasks[0], Signature | Canvas):
            tasks = tuple(tasks[0])  # group(add.s(i, i) for i in range(10))
        for t in tasks:
            if not isinstance(t, Signature | Canvas):
                raise InvalidJobInput(
                    f"{self.kind}() takes signatures (task.s(...), task.si(...)) and canvases,"
                    f" got {t!r:.80}")
        self.tasks: tuple[Signature | Canvas, ...] = tasks
        self.options = options

    def __or__(self, other: Any) -> chain:
        return chain(self, other)

    def data(self) -> dict[str, Any]:
        return {"kind": self.kind, "tasks": [t.data() for t in self.tasks]}

    def delay(self, *args: Any, **kwargs: Any) -> AsyncResult:
        return self.apply_async(args, kwargs)

    def apply_async(self, args: Iterable[Any] = (), kwargs: Mapping[str, Any] | None = None,
                    **options: Any) -> AsyncResult:
        """Enqueue the orchestrator; ``args`` / ``kwargs`` go to the first task (a chain's) or
        to every task (a group's), as in Celery."""
        options = {**self.options, **options}
        if "expires" in options:
            raise NotSupported(f"{self.kind}(...).apply_async(expires=...): give each task's "
                               "signature its expires (task.s(...).set(expires=...))")
        data = self.data()
        check(data, list(args), dict(kwargs or {}))
        queue = options.pop("queue", None) or _data_queue(data)
        handle = api.enqueue(self.orchestrator, {"canvas": data, "args": list(args),
                                                 "kwargs": dict(kwargs or {})},
                             **enqueue_options(self.kind, {**options, "queue": queue}))
        return AsyncResult(handle.id, task_name=self.orchestrator)

    def __call__(self, *args: Any, **kwargs: Any) -> AsyncResult:
        return self.apply_async(args, kwargs)


class chain(Canvas):  # Celery's name
    """Run tasks one after the other, each given the previous one's result first."""

    kind, orchestrator = "chain", CHAIN

    def __init__(self, *tasks: Any, **options: Any) -> None:
        super().__init__(*tasks, **options)
        flat: list[Signature | Canvas] = []
        for t in self.tasks:  # chain(a, chain(b, c)) is chain(a, b, c)
            flat.extend(t.tasks if isinstance(t, chain) else (t,))
        self.tasks = tuple(flat)


class group(Canvas):  # Celery's name
    """Run tasks at once; the result is the list of their results, in order."""

    kind, orchestrator = "group", GROUP


class chord(Canvas):  # Celery's name
    """Run a group (the header), then the body with the list of its results first:
    ``chord([a.s(1), a.s(2)])(total.s())`` or ``chord(header, body)``."""

    kind, orchestrator = "chord", CHORD

    def __init__(self, header: Any, body: Signature | Canvas | None = None,
                 **options: Any) -> None:
        tasks = header.tasks if isinstance(header, group) else tuple(header)
        super().__init__(*tasks, **options)
        self.body = body

    def data(self) -> dict[str, Any]:
        if self.body is None:
            raise InvalidJobInput("a chord needs its body: chord(header)(body) or "
                                  "chord(header, body)")
        return {"kind": "chord", "tasks": [t.data() for t in self.tasks],
                "body": self.body.data()}

    def __call__(self, body: Signature | Canvas | None = None,  # type: ignore[override]
                 **options: Any) -> AsyncResult:
        """``chord(header)(body, **options)``: the options are ``apply_async``'s, as in
        Celery."""
        if body is not None:
            self.body = body
        return self.apply_async((), None, **options)


def check(data: Mapping[str, Any], args: list[Any], kwargs: Mapping[str, Any]) -> None:
    """Refuse at enqueue a canvas that could not run: an empty one, a task no module of this
    process registered, arguments a task's signature does not take (a previous result counted
    as the first argument), an option its child job could not take. Raised in the caller, so
    no task of it has run."""
    if data["kind"] == "task":
        task = _task(data["task"])
        if not data["immutable"]:
            args, kwargs = [*args, *data["args"]], {**data["kwargs"], **kwargs}
        else:
            args, kwargs = list(data["args"]), dict(data["kwargs"])
        task.input(args, kwargs)  # binds them to the task's signature
        enqueue_options(task.name, {k: v for k, v in data["options"].items() if k != "expires"})
        return
    tasks = data["tasks"]
    if not tasks:
        raise InvalidJobInput(f"an empty {data['kind']}() has nothing to run")
    if data["kind"] == "chain":
        for n, element in enumerate(tasks):
            check(element, args if n == 0 else [_PREVIOUS], kwargs if n == 0 else {})
        return
    for element in tasks:
        check(element, args, kwargs)
    if data["kind"] == "chord":
        check(data["body"], [_PREVIOUS], {})


# What stands for a previous task's result while a canvas is checked at enqueue.
_PREVIOUS = object()


# --------------------------------------------------------------------- the orchestrators --


def _child(data: Mapping[str, Any], args: list[Any], kwargs: Mapping[str, Any]
           ) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """``(job, input, options)`` for ``ctx.step.invoke`` of one element of a canvas, given
    ``args`` first (the previous result) and ``kwargs``. What cannot be enqueued (a task this
    worker does not know, a result its signature cannot take) fails the canvas for good: a
    retry of the orchestrator could not change it."""
    try:
        return _child_call(data, args, kwargs)
    except (InvalidJobInput, UnknownJob) as exc:
        raise fail_for_good(exc) from None


def _for_good(step: Any, *args: Any, **kwargs: Any) -> Any:
    """``step(*args, **kwargs)``, a step that enqueues children: what it refuses fails the
    canvas for good."""
    try:
        return step(*args, **kwargs)
    except (InvalidJobInput, UnknownJob) as exc:
        raise fail_for_good(exc) from None


def _child_call(data: Mapping[str, Any], args: list[Any], kwargs: Mapping[str, Any]
                ) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    if data["kind"] == "task":
        task = _task(data["task"])
        if data["immutable"]:
            args, kwargs = [], {}
        options = dict(data["options"])
        expires = options.pop("expires", task.expires)
        input = task.input([*args, *data["args"]], {**data["kwargs"], **kwargs},
                           expires=expires)
        return task.job, input, enqueue_options(task.name, options)
    orchestrator = {"chain": CHAIN, "group": GROUP, "chord": CHORD}[data["kind"]]
    return registry.get(orchestrator), {"canvas": dict(data), "args": args,
                                        "kwargs": dict(kwargs)}, {"queue": _data_queue(data)}


def _data_queue(data: Mapping[str, Any]) -> str:
    """The queue an orchestrator runs on: its first task's, so a worker that serves the tasks
    serves their orchestrator too."""
    while data["kind"] != "task":
        data = data["tasks"][0]
    queue = data["options"].get("queue")
    if queue:
        return str(queue)
    task = lookup(data["task"])
    return task.queue if task is not None else "default"


@job(name=CHAIN)
def run_chain(ctx: JobContext, canvas: dict[str, Any], args: list[Any],
              kwargs: dict[str, Any]) -> Any:
    result: Any = None
    for n, data in enumerate(canvas["tasks"]):
        first = n == 0
        child, input, options = _child(data, list(args) if first else [result],
                                       kwargs if first else {})
        result = _for_good(ctx.step.invoke, f"{n}", child, input, **options)
    return result


@job(name=GROUP)
def run_group(ctx: JobContext, canvas: dict[str, Any], args: list[Any],
              kwargs: dict[str, Any]) -> list[Any]:
    calls = [_child(data, list(args), kwargs) for data in canvas["tasks"]]
    return _for_good(ctx.step.gather, "tasks", calls)


@job(name=CHORD)
def run_chord(ctx: JobContext, canvas: dict[str, Any], args: list[Any],
              kwargs: dict[str, Any]) -> Any:
    calls = [_child(data, list(args), kwargs) for data in canvas["tasks"]]
    results = _for_good(ctx.step.gather, "header", calls)
    child, input, options = _child(canvas["body"], [results], {})
    return _for_good(ctx.step.invoke, "body", child, input, **options)
