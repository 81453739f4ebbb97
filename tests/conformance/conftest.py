"""Helpers shared by the conformance suite.

Everything here goes through the engine seam (``engines/base.py``) and the public records, or
through the Django ORM models to put rows into arbitrary states: both are engine-neutral, so a
second engine runs these tests unchanged. No SQL here.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connections

from django_xjobs import faults
from django_xjobs.records import ClaimedJob, EnqueueParams, EnqueueResult, new_id
from tests.conftest import wait_until

JOB = "testapp.noop"
LONG_LEASE_MS = 60_000


def params(
    *,
    name: str = JOB,
    queue: str = "default",
    key: str | None = None,
    tenant: str | None = None,
    run_at: datetime | None = None,
    delay_ms: int = 0,
    priority: int = 0,
    max_attempts: int = 3,
    input: Any = None,
) -> EnqueueParams:
    """Engine params for one job, as the API layer would build them."""
    return EnqueueParams(
        id=new_id(),
        run_id=new_id(),
        name=name,
        queue=queue,
        input_json=json.dumps(input if input is not None else {}),
        idempotency_key=key,
        max_attempts=max_attempts,
        priority=priority,
        run_at=run_at,
        delay_ms=delay_ms,
        tenant_id=tenant,
        enqueued_by="conformance",
    )


def enqueue(engine, **kwargs: Any) -> EnqueueResult:
    return engine.job_enqueue(params(**kwargs))


def make_row(engine, *, state: str = "ready", run_at: datetime | None = None,
             **fields: Any):
    """Insert one ``x_jobs`` row in any state through the ORM (engine-neutral set-up).

    ``run_at`` defaults to one minute before the database clock (due). Terminal rows get a
    ``finished_at``; running rows get a live lease token unless told otherwise.
    """
    from django_xjobs.models import Job

    now = engine.db_now()
    values: dict[str, Any] = {
        "name": JOB,
        "queue": "default",
        "idempotency_key": f"row-{uuid.uuid4()}",
        "state": state,
        "run_at": run_at if run_at is not None else now - timedelta(minutes=1),
        "attempt": 0,
        "max_attempts": 3,
    }
    if state == "running":
        values.update(
            attempt=1, lease_token=uuid.uuid4(), claimed_by="ghost-worker",
            visible_at=now + timedelta(minutes=5),
        )
    if state in ("done", "dead", "cancelled"):
        values.update(finished_at=now - timedelta(minutes=1))
    values.update(fields)
    return Job.objects.create(**values)


def claim(engine, queue: str = "default", n: int = 10, *, worker: str = "worker-1",
          lease_ms: int = LONG_LEASE_MS) -> list[ClaimedJob]:
    return engine.jobs_claim(wants={queue: n}, worker_id=worker, lease_ms=lease_ms)


def claim_one(engine, queue: str = "default", *, worker: str = "worker-1",
              lease_ms: int = LONG_LEASE_MS) -> ClaimedJob:
    claimed = claim(engine, queue, 1, worker=worker, lease_ms=lease_ms)
    assert len(claimed) == 1, f"expected one claimed job in {queue!r}, got {claimed}"
    return claimed[0]


def wait_lapsed(engine, job_id: str | uuid.UUID) -> None:
    """Wait until the lease of ``job_id`` has lapsed on the database clock."""

    def lapsed() -> bool:
        record = engine.job_get(str(job_id))
        assert record is not None and record.visible_at is not None
        return engine.db_now() > record.visible_at

    wait_until(lapsed, timeout=15, interval=0.005, message=f"the lease of {job_id} to lapse")


def closing_connections(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a thread's work so its Django connections are closed when it ends."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        finally:
            connections.close_all()

    return wrapper


@pytest.fixture
def clean_faults():
    """Faults armed by a test never leak into the next one."""
    faults.clear()
    yield faults
    faults.clear()
