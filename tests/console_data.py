"""Rows for the console's tests: jobs in every state, driven there through the engine's own
operations (never an ORM update of queue state), and rows of the tables whose writers are
other subsystems (outbox relay, slots, scheduler, backfills), created as those would leave them.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from django.utils import timezone

from django_xjobs import api
from django_xjobs.engines import get_engine
from django_xjobs.records import Completion, Failure, Suspension
from tests.testapp import jobs as testapp_jobs

STATES = ("ready", "delayed", "running", "suspended", "done", "dead", "cancelled")


def job_in_state(state: str, *, queue: str | None = None, tag: str = "",
                 error: str = "RuntimeError: card declined", **options: Any):
    """A ``testapp.record`` job in ``state`` (or ``lapsed``: running, lease expired)."""
    engine = get_engine()
    queue = queue or f"q-{uuid.uuid4().hex[:10]}"
    bound = testapp_jobs.record.using(queue=queue, **options)
    if state == "delayed":
        return bound.using(delay=timedelta(hours=1)).enqueue(tag=tag or state)
    handle = bound.enqueue(tag=tag or state)
    if state == "ready":
        return handle
    if state == "cancelled":
        api.cancel(handle.id, reason="tests")
        return handle
    # A lease of 0 ms is over as soon as the claim's transaction clock moves on.
    (claimed,) = engine.jobs_claim(wants={queue: 1}, worker_id="tests:console",
                                   lease_ms=0 if state == "lapsed" else 60_000)
    assert claimed.id == str(handle.id)
    if state == "done":
        engine.jobs_complete_if_owned([Completion(
            claim=claimed.claim, result_json='{"ok": true}')])
    elif state == "dead":
        engine.job_fail_if_owned(Failure(
            claim=claimed.claim, retry_delay_ms=0, permanent=True,
            error=f"Traceback (most recent call last):\n  File \"x.py\", line 1\n{error}"))
    elif state == "suspended":
        engine.job_suspend_if_owned(Suspension(
            claim=claimed.claim,
            wake_at=timezone.now() + timedelta(hours=1)))
    else:
        assert state in ("running", "lapsed"), state
    return handle


# The order in which jobs of one queue can be driven to their states: each claim must find its
# own job, so the due ones come after the claims, and the lapsed one (which the next claim would
# rescue) after every other claim.
CLAIM_ORDER = ("running", "suspended", "done", "dead", "lapsed", "ready", "delayed", "cancelled")


def jobs_in_every_state(queue: str, *, lapsed: bool = True, **options: Any) -> dict[str, Any]:
    """One job per state on ``queue`` (plus a running one whose lease expired)."""
    return {state: job_in_state(state, queue=queue, **options)
            for state in CLAIM_ORDER if lapsed or state != "lapsed"}


def steps_for(run_id: Any) -> None:
    """Three step records of a run, as a durable workflow leaves them: one completed, one that
    failed once, one waiting for an event."""
    from django_xjobs.models import JobStep

    now = timezone.now()
    JobStep.objects.bulk_create([
        JobStep(run_id=run_id, name="fetch-profile", status="completed",
                output={"email": "ada@example.com"}, completed_at=now, attempts=1),
        JobStep(run_id=run_id, name="charge", status="failed", attempts=2,
                error="Traceback...\nRuntimeError: gateway timeout"),
        JobStep(run_id=run_id, name="wait-verified", status="waiting", event="user.verified",
                correlation_key="42", wake_at=now + timedelta(days=3)),
    ])


def other_rows(*, tenant_id: str | None = None) -> dict[str, Any]:
    """One row in each of the tables the console shows besides x_jobs."""
    from django_xjobs.models import (
        Backfill,
        JobLease,
        OutboxEntry,
        SchedulerLeader,
        SchedulerState,
    )
    from django_xjobs.steps import publish_event

    now = timezone.now()
    event = publish_event("user.verified", {"by": "link"}, correlation_key="42")
    return {
        "event": event,
        "outbox": OutboxEntry.objects.create(job="testapp.record", queue="default",
                                             input={"tag": "staged"}, tenant_id=tenant_id),
        "lease": JobLease.objects.create(lease_key="tenant:acme", slot=0, holder="w1:1",
                                         expires_at=now + timedelta(seconds=30)),
        "leader": SchedulerLeader.objects.create(lock_key="xjobs-scheduler", holder="w1:1",
                                                 expires_at=now + timedelta(seconds=30)),
        "state": SchedulerState.objects.create(task_name="nightly-report",
                                               last_fired_at=now - timedelta(hours=3)),
        "backfill": Backfill.objects.create(
            run_id=uuid.uuid4(), name="accounts.normalize_emails", status="running",
            rows_processed=12_000, last_cursor={"pk": 12_000},
            started_at=now - timedelta(minutes=10)),
    }


# Valid jsonb that Python's json module refuses: an integer of more digits than int() converts
# by default (4,300), and arrays nested deeper than the decoder's recursion limit.
HUGE_INT_SQL = """('{"n": ' || repeat('9', 5000) || '}')::jsonb"""
DEEP_ARRAY_SQL = "(repeat('[', 5000) || repeat(']', 5000))::jsonb"


def undecodable(table: str, pk: Any, **columns: str) -> None:
    """Overwrite JSON ``columns`` of one row with SQL expressions (``HUGE_INT_SQL``, ...): raw
    SQL, since neither the ORM nor the API would write a value Python cannot read back."""
    from django.db import connection

    assignments = ", ".join(f"{name} = {sql}" for name, sql in columns.items())
    with connection.cursor() as cursor:
        cursor.execute(f"update {table} set {assignments} where "
                       f"{'id' if table != 'x_backfills' else 'run_id'} = %s", [pk])
        assert cursor.rowcount == 1, (table, pk)


def slot_held_by_a_run(group: str = "g", queue: str = "slot-limit-q") -> Any:
    """A slot of ``slot:<group>`` held as a worker holds it: taken by the claim of a run of
    ``testapp.slotted``, whose ``Concurrency(key="slot:{group}", limit=2)`` gives the limit."""
    from django_xjobs import conf, registry, slots
    from django_xjobs.records import SlotHold
    from django_xjobs.worker.flow import claim_flow

    handle = testapp_jobs.slotted.using(queue=queue).enqueue(group=group)
    engine = get_engine()
    flow = claim_flow(conf.get(), registry.all_jobs().values(), [queue])
    (claimed,) = engine.jobs_claim(wants={queue: 1}, worker_id="w-limit", lease_ms=60_000,
                                   flow=flow)
    assert claimed.id == str(handle.id) and claimed.slot is not None
    return SlotHold(slot_key=f"slot:{group}", slot=claimed.slot,
                    holder=slots.holder(claimed, "w-limit"), limit=claimed.slot_limit or 1)
