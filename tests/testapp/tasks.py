"""``django.tasks`` tasks the suite runs through django_xjobs.tasks.XJobsBackend (Django 6+ only:
imported by startup autodiscovery when TASKS uses that backend, never on Django 5.2).

Tasks and the signal receivers below record what happened in ``Effect`` rows, written in
autocommit, so a test in this process can read what a worker subprocess did.
"""

import asyncio
import os
import time
from pathlib import Path

from django.tasks import task
from django.tasks.signals import task_enqueued, task_finished, task_started

from .models import Effect


class TaskBoom(ValueError):
    """What ``boom`` raises: a module-level class, so its path is importable."""


def _effect(kind, tag="", job_id="", attempt=0, name=""):
    Effect.objects.create(job_id=job_id, name=name, attempt=attempt, pid=os.getpid(), kind=kind,
                          tag=str(tag))


@task
def add(a, b):
    return a + b


@task
def noop(*args, **kwargs):
    return None


@task
def record(label):
    _effect("task-call", label)
    return label


@task(max_attempts=1)
def boom(message):
    raise TaskBoom(message)


@task(max_attempts=2, retry_base="30s", retry_cap="60s")
def fails_then_waits(message):
    """Fails; its retry is 15-30 s away, so a test sees the retry pending."""
    raise RuntimeError(message)


@task
def fails(message):
    """Fails with no attempt budget of its own: the backend's or XJOBS' default applies."""
    raise RuntimeError(message)


@task(takes_context=True, max_attempts=3, retry_base="0.01s", retry_cap="0.02s")
def flaky(context, fail_times=1):
    if context.attempt <= fail_times:
        raise RuntimeError(f"flaky failure on attempt {context.attempt}")
    return {"succeeded_on": context.attempt}


@task(takes_context=True)
def with_context(context, x):
    result = context.task_result
    return {"id": result.id, "attempt": context.attempt, "worker_ids": result.worker_ids,
            "status": result.status, "x": x, "args": result.args}


@task
async def async_add(a, b):
    await asyncio.sleep(0)
    return a + b


@task(takes_context=True, max_attempts=1)
async def async_boom(context, message):
    await asyncio.sleep(0)
    raise TaskBoom(f"{message} on attempt {context.attempt}")


@task(max_attempts=1)
def exits(message):
    raise SystemExit(message)


@task(max_attempts=1)
def interrupted(message):
    raise KeyboardInterrupt(message)


@task(max_attempts=1)
async def async_exits(message):
    await asyncio.sleep(0)
    raise SystemExit(message)


@task(max_attempts=1)
def raises_group(message):
    raise ExceptionGroup(message, [TaskBoom("inside the group"), KeyError("another")])


@task(max_attempts=1)
def raises_traceback_text(message):
    """Its message holds another exception's traceback text, naming another class."""
    raise TaskBoom(f"{message}\nTraceback (most recent call last):\n  File \"x.py\", line 1\n"
                   "KeyError: not the class raised")


@task(max_attempts=1)
def raises_nested(message):
    raise ValueError(ValueError(message))


@task(queue_name="other")
def on_other_queue():
    return "other"


@task(idempotency_key=lambda order_id: f"order:{order_id}")
def charge(order_id):
    return {"charged": order_id}


@task
def bad_return():
    return object()


@task(takes_context=True, max_attempts=3)
def slow_first_attempt(context, seconds=60.0):
    """Records each start; the first attempt sleeps (a test kills its worker there)."""
    result = context.task_result
    _effect("start", job_id=result.id, attempt=context.attempt, name="slow_first_attempt")
    if context.attempt == 1:
        time.sleep(seconds)  # the first attempt's work: its worker is killed here
    return {"attempt": context.attempt, "worker_ids": result.worker_ids}


def undeclared(x):
    """A plain function tests declare as a task on the spot (and forget again)."""
    return x


def plain_helper(marker):
    """Not a task: a row naming it must never call it."""
    Path(marker).touch()


@task(backend="immediate")
def immediate_touch(marker):
    """A task of another backend: a row naming it must never run in an xjobs worker."""
    Path(marker).touch()


@task
def echo_call(*args, **kwargs):
    """Returns its call as it received it: typed arguments come back as the return value
    (tests/integration/test_typed_values.py)."""
    return {"args": list(args), "kwargs": kwargs}


@task
def echo_value(value):
    """Returns its one argument (a Decimal, a datetime, ...) as the whole return value."""
    return value


# ------------------------------------------------------------------------------- signals --


def _recorder(signal_name):
    """A receiver writing (status|error classes, attempts, sender) of each signal about a task
    of this module; ``name`` holds the sender's dotted path (Django sends the backend class)."""

    def receive(sender, task_result, **kwargs):
        if task_result.task.func.__module__ != __name__:
            return
        errors = ",".join(e.exception_class_path for e in task_result.errors)
        _effect(f"signal:{signal_name}", f"{task_result.status}|{errors}", job_id=task_result.id,
                attempt=task_result.attempts, name=f"{sender.__module__}.{sender.__qualname__}")

    return receive


_receivers = {name: _recorder(name) for name in ("enqueued", "started", "finished")}
task_enqueued.connect(_receivers["enqueued"], dispatch_uid="testapp.tasks.enqueued")
task_started.connect(_receivers["started"], dispatch_uid="testapp.tasks.started")
task_finished.connect(_receivers["finished"], dispatch_uid="testapp.tasks.finished")
