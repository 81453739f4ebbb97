"""What the task, the canvas and the results share: a run's ``Request``, the map of the tasks
this process registered, and the translation of Celery's enqueue options."""

from __future__ import annotations

import contextvars
import logging
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import api
from ..exceptions import InvalidJobInput
from ..values import parse_duration
from .errors import NotSupported

if TYPE_CHECKING:
    from ..context import JobContext

logger = logging.getLogger("django_xjobs.celery")

# The input key that carries what is not a named argument: {"args": [...], "expires": iso}.
META_KEY = "_celery"

_request: contextvars.ContextVar[Request | None] = contextvars.ContextVar(
    "xjobs_celery_request", default=None)

# name -> the task registered under it, for the canvas' orchestrators (canvas.py).
_tasks: dict[str, Any] = {}  # Task (task.py, which imports this module)
_warned: set[tuple[str, str]] = set()


@dataclass
class Request:
    """``self.request`` of a bound task: Celery's fields that mean something here, plus
    ``ctx``, the job's context (``ctx.step``, ``ctx.progress``, ``ctx.logger``)."""

    id: str | None = None
    retries: int = 0
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    task: str | None = None
    hostname: str = field(default_factory=socket.gethostname)
    delivery_info: dict[str, Any] = field(default_factory=dict)
    is_eager: bool = False
    called_directly: bool = True
    ctx: JobContext | None = None


def current_request() -> Request | None:
    """The request of the task running in this thread or coroutine, or None."""
    return _request.get()


def warn_once(task: str, option: str, meaning: str) -> None:
    """One warning per task and option in a process."""
    if (task, option) in _warned:
        return
    _warned.add((task, option))
    logger.warning("%s: Celery's %s= is taken but changes nothing here: %s (docs/from-celery.md)",
                   task, option, meaning)


def seconds(task: str, option: str, value: Any) -> float:
    """A Celery option's seconds (a number or a timedelta), read as every duration of the
    package is (values.parse_duration)."""
    return parse_duration(value, what=f"{task}: {option}")


_ENQUEUE_REFUSED = {
    "task_id": "pass idempotency_key= to dedupe, or read the id from the AsyncResult",
    "link": "use chain(a.s(), b.s()) (docs/from-celery.md, \"Canvas\")",
    "link_error": "use the job_finished signal, or a try/except in a parent job",
    "shadow": "a job's name is its task's",
    "time_limit": "give the task its time_limit",
    "soft_time_limit": "give the task its time_limit",
    "chord": "use chord(header)(body)",
    "group_id": "use group(...)",
}
_ENQUEUE_WARNED = {
    "serializer": "arguments are stored as JSON",
    "compression": "arguments are stored uncompressed",
    "routing_key": "queues are chosen by queue= or XJOBS['ROUTES']",
    "exchange": "queues are chosen by queue= or XJOBS['ROUTES']",
    "exchange_type": "queues are chosen by queue= or XJOBS['ROUTES']",
    "retry": "the enqueue is one INSERT in the caller's transaction; it is not retried",
    "retry_policy": "the enqueue is one INSERT in the caller's transaction; it is not retried",
    "headers": "pass values as arguments",
    "ignore_result": "results are kept with the job",
    "add_to_parent": "child jobs are found from their parent's steps",
    "producer": "the enqueue uses the Django connection",
    "connection": "the enqueue uses the Django connection",
    "publisher": "the enqueue uses the Django connection",
    "reply_to": "results are read with AsyncResult",
}


def enqueue_options(task: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """Native enqueue options for ``apply_async``'s Celery options."""
    result: dict[str, Any] = {}
    for option, value in options.items():
        if option in _ENQUEUE_REFUSED:
            raise NotSupported(f"{task}.apply_async({option}=...) is not supported here: "
                               f"{_ENQUEUE_REFUSED[option]}")
        if option in _ENQUEUE_WARNED:
            warn_once(task, option, _ENQUEUE_WARNED[option])
        elif option == "countdown":
            if value is not None:
                if "eta" in options and options["eta"] is not None:
                    raise InvalidJobInput(f"{task}.apply_async(): give countdown= or eta=, "
                                          "not both")
                result["delay"] = value
        elif option == "eta":
            if value is not None:
                result["run_at"] = value
        elif option == "expires":
            raise NotSupported(f"{task}: expires= is taken by a Celery-style task's "
                               "apply_async and its signatures only")
        elif option in ("queue", "priority"):
            if value is not None:
                result[option] = value
        elif option in api.ENQUEUE_OPTIONS:
            result[option] = value
        else:
            raise InvalidJobInput(
                f"{task}.apply_async() got an unknown option {option!r}; it takes countdown, "
                f"eta, expires, queue, priority and {sorted(api.ENQUEUE_OPTIONS)}")
    return result


def lookup(name: str) -> Any:
    """The Celery-style task registered under ``name`` in this process, or None."""
    return _tasks.get(name)


def register(task: Any) -> None:
    _tasks[task.name] = task
