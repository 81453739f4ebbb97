"""The soak's own jobs (docs/soak.md, "The workload").

Imported by ``manage.py xjobs_soak`` and by the worker processes it starts, never by
autodiscovery: a project that does not run the soak never registers them. Every body writes its
evidence with :func:`tables.effect` on its thread's connection in autocommit, so the evidence of a
run survives the run's lost acknowledgement: a ``start`` row when the body begins and an ``end``
row carrying the nonce the body returns, which the checks match against the settled result.
"""

from __future__ import annotations

import os
import time
import uuid
from datetime import timedelta
from typing import Any

from ..context import JobContext
from ..decorator import job
from ..ratelimits import RateLimit
from ..slots import Concurrency
from . import tables

PREFIX = "xjobs_soak."
# Attempts for jobs that must finish: more than the kills any one job can plausibly meet.
ATTEMPTS = 25
POISON_ATTEMPTS = 3
SLOT_LIMIT = 2
RATE_LIMIT = 5
RATE_PERIOD = timedelta(seconds=1)
NAP = timedelta(seconds=1)  # the durable sleep between the two steps of ``steps``


def _effect(ctx: JobContext, soak: str, kind: str, tag: str) -> None:
    tables.effect(soak, ctx.job_id, ctx.attempt, kind, tag, os.getpid())


def _run(ctx: JobContext, soak: str, kind: str, seconds: float) -> dict[str, Any]:
    """Write ``start``, sleep (returning early when the run is told to stop), write ``end`` with
    a nonce, return the nonce: the settled result then names the run whose acknowledgement won."""
    nonce = uuid.uuid4().hex
    _effect(ctx, soak, "start", kind)
    if seconds:
        ctx.cancelled.wait(seconds)
    if ctx.cancelled.is_set():
        return {"nonce": None}  # told to stop: this run's acknowledgement is fenced anyway
    _effect(ctx, soak, "end", nonce)
    return {"nonce": nonce}


@job(name=PREFIX + "plain", queue="xjobs_soak", max_attempts=ATTEMPTS)
def plain(ctx: JobContext, soak: str, seconds: float = 0.02) -> dict[str, Any]:
    return _run(ctx, soak, "plain", seconds)


@job(name=PREFIX + "slow", queue="xjobs_soak", max_attempts=ATTEMPTS)
def slow(ctx: JobContext, soak: str, seconds: float = 3.0) -> dict[str, Any]:
    """Longer than a lease: finishes only if its heartbeats keep the lease."""
    return _run(ctx, soak, "slow", seconds)


@job(name=PREFIX + "slot", queue="xjobs_soak", max_attempts=ATTEMPTS,
     concurrency=Concurrency(key="xjobs_soak:{soak}:slot:{slot}", limit=SLOT_LIMIT))
def slot(ctx: JobContext, soak: str, slot: int, seconds: float = 0.1) -> dict[str, Any]:
    return _run(ctx, soak, "slot", seconds)


@job(name=PREFIX + "rate", queue="xjobs_soak", max_attempts=ATTEMPTS,
     rate_limit=RateLimit(key="xjobs_soak:{soak}:rate", limit=RATE_LIMIT, period=RATE_PERIOD))
def rate(ctx: JobContext, soak: str, seconds: float = 0.01) -> dict[str, Any]:
    return _run(ctx, soak, "rate", seconds)


@job(name=PREFIX + "steps", queue="xjobs_soak", max_attempts=ATTEMPTS)
def steps(ctx: JobContext, soak: str, seconds: float = 0.05) -> dict[str, Any]:
    """Two steps around a durable sleep: each step's body writes ``step`` with the step's name
    before its work, so a body that runs again after its memo was committed shows."""

    def body(name: str) -> str:
        _effect(ctx, soak, "step", name)
        time.sleep(seconds)
        return name

    ctx.step.run("first", lambda: body("first"))
    ctx.step.sleep("nap", NAP)
    ctx.step.run("second", lambda: body("second"))
    return _run(ctx, soak, "steps", 0)


@job(name=PREFIX + "poison", queue="xjobs_soak", max_attempts=POISON_ATTEMPTS)
def poison(ctx: JobContext, soak: str) -> None:
    _effect(ctx, soak, "start", "poison")
    raise RuntimeError("poison: fails on every attempt")


KINDS = ("plain", "slow", "slot", "rate", "steps", "poison")
