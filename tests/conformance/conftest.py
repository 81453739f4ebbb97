"""Helpers shared by the conformance suite.

Everything here goes through the engine seam (``engines/base.py``) and the public records, or
through the Django ORM models to put rows into arbitrary states: both are engine-neutral, so a
second engine runs these tests unchanged. No SQL here.

The claim, fencing, slot and scheduler tests run twice: on the engine, and through the models'
managers (``Job.objects.claim(...)``, django_xjobs/managers.py), which must answer as the engine
does (:class:`ThroughManagers`; docs/managers.md).
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import pytest
from django.db import connections

from django_xjobs import faults
from django_xjobs.engines import Engine, get_engine
from django_xjobs.records import (
    Claim,
    ClaimedJob,
    Completion,
    EnqueueParams,
    EnqueueResult,
    Failure,
    FenceReport,
    LeaderRecord,
    Renewal,
    Requeue,
    RunOwner,
    SlotHold,
    SlotRecord,
    SlotRequest,
    SlotUsage,
    Suspension,
    new_id,
)
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


def a_parent_waiting_on(engine, n: int, *,
                        max_attempts: int = 2) -> tuple[ClaimedJob, list[str]]:
    """A parent (queue ``parents``) suspended on an invoke step ``naps`` of ``n`` children
    (``testapp.nap``, queue ``kids``), as a run's ctx.step.gather leaves it: the step row, the
    children and the suspension in one transaction; the parent's claim and the children's ids."""
    enqueue(engine, name="testapp.nap_parent", queue="parents")
    parent = claim_one(engine, "parents")
    owner = RunOwner(claim=parent.claim, run_id=parent.run_id)
    kids = [params(name="testapp.nap", queue="kids", max_attempts=max_attempts)
            for _ in range(n)]
    with engine.atomic():
        step = engine.step_invoke_open_if_owned(owner, "naps", children=[str(k.id) for k in kids],
                                                timeout_ms=None)
        engine.jobs_enqueue_children(kids, parent_id=UUID(parent.id), parent_step="naps")
        assert engine.job_suspend_if_owned(
            Suspension(claim=parent.claim, wake_at=step.park_at)).owned
    return parent, [str(k.id) for k in kids]


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


# ---------------------------------------------------------------- through the managers --

# The modules whose tests also run through the managers: every operation the managers offer is
# pinned there (claim, fenced writes, renewals, slots, the leader lease).
THROUGH_MANAGERS = frozenset({"test_claim", "test_fencing", "test_slots", "test_scheduler"})


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    module = metafunc.module.__name__.rpartition(".")[2]
    if "engine" in metafunc.fixturenames and module in THROUGH_MANAGERS:
        metafunc.parametrize("engine", ["engine", "managers"], indirect=True)


@pytest.fixture
def engine(request: pytest.FixtureRequest) -> Any:
    """The engine under test; in the modules of ``THROUGH_MANAGERS``, also the same engine
    reached through the models' managers (``[managers]`` in the test id)."""
    engine = get_engine()
    if getattr(request, "param", "engine") == "managers":
        return ThroughManagers(engine)
    return engine


class ThroughManagers:
    """An engine whose claim, fenced writes, renewals, slot and leader operations are made by
    the models' managers on the engine's alias, durations given as timedeltas; every other
    operation (enqueue, reads, the clock) is the engine's own.

    A conformance test run on it pins each manager method to the engine method it stands for:
    same rows, same fence outcomes, same statements counted.
    """

    def __init__(self, engine: Engine) -> None:
        from django_xjobs.models import Job, JobLease, SchedulerLeader

        self._engine = engine
        self._jobs = Job.objects.db_manager(engine.alias)
        self._slots = JobLease.objects.db_manager(engine.alias)
        self._leader = SchedulerLeader.objects.db_manager(engine.alias)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def jobs_claim(self, *, wants: Mapping[str, int], worker_id: str,
                   lease_ms: int) -> list[ClaimedJob]:
        return self._jobs.claim(wants, worker_id=worker_id,
                                lease=timedelta(milliseconds=lease_ms))

    def jobs_complete_if_owned(self, batch: Sequence[Completion]) -> FenceReport:
        return self._jobs.complete(batch)

    def job_fail_if_owned(self, failure: Failure) -> tuple[FenceReport, str | None]:
        return self._jobs.fail(failure)

    def job_requeue_if_owned(self, requeue: Requeue) -> FenceReport:
        return self._jobs.requeue(requeue)

    def jobs_requeue_if_owned(self, batch: Sequence[Requeue]) -> FenceReport:
        return self._jobs.requeue(list(batch))

    def job_suspend_if_owned(self, suspension: Suspension) -> FenceReport:
        return self._jobs.suspend(suspension)

    # The managers answer a renewal with the tokens (or holders) whose lease holds, and a
    # release with how many rows went; no test through them holds a row elsewhere.
    def jobs_renew_if_owned(self, claims: Sequence[Claim], lease_ms: int) -> Renewal:
        return Renewal(renewed=self._jobs.renew(claims, lease=timedelta(milliseconds=lease_ms)))

    def jobs_wake_refused(self, refused: Sequence[Claim]) -> int:
        return self._jobs.wake_refused(refused)

    def slots_acquire(self, requests: Sequence[SlotRequest], ttl_ms: int) -> list[SlotHold]:
        return self._slots.acquire(requests, ttl=timedelta(milliseconds=ttl_ms))

    def slots_renew_if_held(self, holds: Sequence[SlotHold], ttl_ms: int) -> Renewal:
        return Renewal(renewed=self._slots.renew(holds, ttl=timedelta(milliseconds=ttl_ms)))

    def slots_release_if_held(self, holds: Sequence[SlotHold]) -> tuple[int, list[SlotHold]]:
        return self._slots.release(holds), []

    def slots_list(self, *, slot_key: str | None = None,
                   limit: int = 1000) -> list[SlotRecord]:
        return self._slots.live(slot_key=slot_key, limit=limit)

    def slots_usage(self, limit: int = 1000) -> list[SlotUsage]:
        return self._slots.usage(limit)

    def leader_attempt_elect(self, lock_key: str, holder: str,
                             lease_ms: int) -> datetime | None:
        return self._leader.elect(lock_key, holder, lease=timedelta(milliseconds=lease_ms))

    def leader_resign(self, lock_key: str, holder: str) -> bool:
        return self._leader.resign(lock_key, holder)

    def leader_get(self, lock_key: str) -> LeaderRecord | None:
        return self._leader.current(lock_key)
