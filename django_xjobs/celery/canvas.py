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
from ..exceptions import InvalidJobInput
from .base import enqueue_options, lookup
from .result import AsyncResult

CHAIN, GROUP, CHORD = ("django_xjobs.celery.chain", "django_xjobs.celery.group",
                       "django_xjobs.celery.chord")
# The enqueue options a signature may carry (.set(...), .apply_async(...)) onto its child job.
_CHILD_OPTIONS = frozenset({"countdown", "eta", "queue", "priority"}) | api.ENQUEUE_OPTIONS


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
                "kwargs": self.kwargs, "options": _portable(self.options),
                "immutable": self.immutable}


def signature(task: Any, args: Iterable[Any] = (), kwargs: Mapping[str, Any] | None = None,
              **options: Any) -> Signature:
    immutable = bool(options.pop("immutable", False))
    return Signature(task, args, kwargs, options=options, immutable=immutable)


def _portable(options: Mapping[str, Any]) -> dict[str, Any]:
    """A signature's options as JSON: ``eta`` as text (the child's enqueue reads it back)."""
    return {k: (v.isoformat() if k == "eta" and v is not None else v)
            for k, v in options.items()}


def _task(name: str) -> Any:
    task = lookup(name)
    if task is None:
        raise InvalidJobInput(
            f"no Celery-style task named {name!r} is registered in this process (a "
            "@shared_task in an installed app's tasks.py)")
    return task


class _Canvas:
    kind: str
    orchestrator: str

    def __init__(self, *tasks: Any, **options: Any) -> None:
        if len(tasks) == 1 and not isinstance(tasks[0], Signature | _Canvas):
            tasks = tuple(tasks[0])  # group(add.s(i, i) for i in range(10))
        for t in tasks:
            if not isinstance(t, Signature | _Canvas):
                raise InvalidJobInput(
                    f"{self.kind}() takes signatures (task.s(...), task.si(...)) and canvases,"
                    f" got {t!r:.80}")
        self.tasks: tuple[Signature | _Canvas, ...] = tasks
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
        if not self.tasks:
            raise InvalidJobInput(f"an empty {self.kind}() has nothing to run")
        options = {**self.options, **options}
        queue = options.pop("queue", None) or _first_queue(self)
        handle = api.enqueue(self.orchestrator, {"canvas": self.data(), "args": list(args),
                                                 "kwargs": dict(kwargs or {})},
                             **enqueue_options(self.kind, {**options, "queue": queue}))
        return AsyncResult(handle.id, task_name=self.orchestrator)

    def __call__(self, *args: Any, **kwargs: Any) -> AsyncResult:
        return self.apply_async(args, kwargs)


class chain(_Canvas):  # Celery's name
    """Run tasks one after the other, each given the previous one's result first."""

    kind, orchestrator = "chain", CHAIN

    def __init__(self, *tasks: Any, **options: Any) -> None:
        super().__init__(*tasks, **options)
        flat: list[Signature | _Canvas] = []
        for t in self.tasks:  # chain(a, chain(b, c)) is chain(a, b, c)
            flat.extend(t.tasks if isinstance(t, chain) else (t,))
        self.tasks = tuple(flat)


class group(_Canvas):  # Celery's name
    """Run tasks at once; the result is the list of their results, in order."""

    kind, orchestrator = "group", GROUP


class chord(_Canvas):  # Celery's name
    """Run a group (the header), then the body with the list of its results first:
    ``chord([a.s(1), a.s(2)])(total.s())`` or ``chord(header, body)``."""

    kind, orchestrator = "chord", CHORD

    def __init__(self, header: Any, body: Signature | _Canvas | None = None,
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

    def __call__(self, body: Signature | _Canvas | None = None, *args: Any,
                 **kwargs: Any) -> AsyncResult:
        if body is not None:
            self.body = body
        return self.apply_async(args, kwargs)


def _first_queue(canvas: _Canvas) -> str:
    """The queue the orchestrator runs on: its first task's, so a worker that serves the
    tasks serves their orchestrator too."""
    first: Signature | _Canvas = canvas
    while isinstance(first, _Canvas):
        first = first.tasks[0]
    queue = first.options.get("queue")
    if queue:
        return str(queue)
    task = lookup(first.task)
    return task.queue if task is not None else "default"


# --------------------------------------------------------------------- the orchestrators --


def _child(data: Mapping[str, Any], args: list[Any], kwargs: Mapping[str, Any]
           ) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """``(job, input, options)`` for ``ctx.step.invoke`` of one element of a canvas, given
    ``args`` first (the previous result) and ``kwargs``."""
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
    """:func:`_first_queue` of a canvas stored as data."""
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
        result = ctx.step.invoke(f"{n}", child, input, **options)
    return result


@job(name=GROUP)
def run_group(ctx: JobContext, canvas: dict[str, Any], args: list[Any],
              kwargs: dict[str, Any]) -> list[Any]:
    return ctx.step.gather("tasks", [_child(data, list(args), kwargs)
                                     for data in canvas["tasks"]])


@job(name=CHORD)
def run_chord(ctx: JobContext, canvas: dict[str, Any], args: list[Any],
              kwargs: dict[str, Any]) -> Any:
    results = ctx.step.gather("header", [_child(data, list(args), kwargs)
                                         for data in canvas["tasks"]])
    child, input, options = _child(canvas["body"], [results], {})
    return ctx.step.invoke("body", child, input, **options)
