"""A durable run (docs/durable.md): its steps, fenced on the run's claim; the deploy check's
reads of the runs that wait; the child jobs of its invoke and gather steps; the events it
publishes and waits for."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from uuid import UUID

from ....exceptions import StepNameReused
from ....records import (
    ChildState,
    EnqueueParams,
    EventRecord,
    InvokeStep,
    JobRecord,
    ParkedStep,
    RunOwner,
    StepRecord,
)
from ..core import PostgresCore
from ..errors import unless_busy
from ..params import batch_args, owner_params
from ..rows import decode_json, decode_json_for_run, job_record
from ..statements.deploy import RUNS_SUSPENDED_LIST, STEPS_OF_RUN_IN_ORDER
from ..statements.enqueue import JOBS_ENQUEUE_CHILDREN
from ..statements.jobs import JOBS_CANCEL_TREE, JOBS_CANCEL_TREE_FREE
from ..statements.steps import (
    EVENT_LOCK,
    EVENT_NEXT,
    EVENT_NEXT_KEYED,
    EVENT_PUBLISH,
    EVENT_WAKE_WAITERS,
    EVENTS_LIST,
    JOBS_CHILDREN,
    JOBS_CHILDREN_ARCHIVED,
    STEP_CANCEL_SIBLINGS,
    STEP_COMPLETE_IF_OWNED,
    STEP_FAIL_IF_OWNED,
    STEP_INVOKE_OPEN_IF_OWNED,
    STEP_INVOKE_PENDING_IF_OWNED,
    STEP_PARK_IF_OWNED,
    STEPS_OF_RUN,
)


def _like_prefix(prefix: str) -> str:
    """A LIKE pattern matching names that start with ``prefix`` literally."""
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


class Steps(PostgresCore):
    """The seam's operations on steps, the deploy check's reads, children and events."""

    def steps_of_run(self, run_id: str) -> list[StepRecord]:
        return [
            StepRecord(
                name=r[0], status=r[1],
                output=decode_json_for_run(r[2], f"output of step {r[0]!r}"),
                attempts=r[3], error=r[4],
                started_at=r[5], completed_at=r[6], wake_at=r[7], event=r[8],
                correlation_key=r[9], event_id=r[10], event_published_at=r[11], due=r[12],
                kind=r[13],
            )
            for r in self._run(STEPS_OF_RUN, {"run_id": run_id})
        ]

    def step_complete_if_owned(
        self, owner: RunOwner, name: str, output_json: str | None, *,
        event: str | None = None, correlation_key: str | None = None,
        event_id: int | None = None, event_published_at: datetime | None = None,
        kind: str = "run",
    ) -> bool:
        row = unless_busy(self._run(STEP_COMPLETE_IF_OWNED, {
            **owner_params(owner), "name": name, "output": output_json, "event": event,
            "kind": kind,
            "correlation_key": correlation_key, "event_id": event_id,
            "event_published_at": event_published_at,
        }, fetch="one"), f"step {name!r}")
        return row[0] is not None

    def step_fail_if_owned(self, owner: RunOwner, name: str, error: str) -> int | None:
        row = unless_busy(self._run(STEP_FAIL_IF_OWNED, {
            **owner_params(owner), "name": name, "error": error}, fetch="one"), f"step {name!r}")
        return row[0]

    def step_park_if_owned(
        self, owner: RunOwner, name: str, *, status: str, wake_at: datetime | None = None,
        duration_ms: int = 0, event: str | None = None, correlation_key: str | None = None,
        kind: str | None = None,
    ) -> ParkedStep | None:
        row = unless_busy(self._run(STEP_PARK_IF_OWNED, {
            **owner_params(owner), "name": name, "status": status, "wake_at": wake_at,
            "kind": kind or ("sleep" if status == "sleeping" else "event"),
            "duration_ms": duration_ms, "event": event, "correlation_key": correlation_key,
        }, fetch="one"), f"step {name!r}")
        if row[0] is None:
            return None
        return ParkedStep(started_at=row[0], wake_at=row[1], due=row[2])

    def step_cancel_siblings(self, owner: RunOwner, prefix: str) -> None:
        unless_busy(self._run(STEP_CANCEL_SIBLINGS, {
            **owner_params(owner), "prefix": _like_prefix(prefix)}, fetch="one"),
            f"the waits of {prefix!r}")

    # The deploy check's reads (docs/durable.md, "The deploy check").
    def runs_suspended_list(self, *, name: str | None = None, after_id: str | None = None,
                            limit: int = 500) -> list[JobRecord]:
        return [job_record(r) for r in self._run(
            RUNS_SUSPENDED_LIST, {"name": name, "after_job_id": after_id, "limit": limit})]

    def steps_of_run_in_order(self, run_id: str) -> list[StepRecord]:
        return [
            StepRecord(
                name=r[0], status=r[1],
                output=decode_json_for_run(r[2], f"output of step {r[0]!r}"),
                attempts=r[3], error=r[4], started_at=r[5], completed_at=r[6], wake_at=r[7],
                event=r[8], correlation_key=r[9], event_id=r[10], event_published_at=r[11],
                kind=r[12],
            )
            for r in self._run(STEPS_OF_RUN_IN_ORDER, {"run_id": run_id})
        ]

    def step_invoke_open_if_owned(self, owner: RunOwner, name: str, *, children: Sequence[str],
                                  timeout_ms: int | None) -> InvokeStep | None:
        row = unless_busy(self._run(STEP_INVOKE_OPEN_IF_OWNED, {
            **owner_params(owner), "name": name, "children": json.dumps(list(children)),
            "pending": len(children), "timeout_ms": timeout_ms,
        }, fetch="one"), f"step {name!r}")
        output, opened, due, park_at, _busy = row
        if opened is None:
            return None
        recorded = decode_json_for_run(output, f"output of step {name!r}")
        if not isinstance(recorded, dict) or not isinstance(recorded.get("children"), list):
            raise StepNameReused(
                f"step {name!r} of this run was recorded as another kind of step (a deploy "
                "renamed it?); give the invoke or gather a name of its own")
        return InvokeStep(children=list(recorded["children"]), opened=opened, due=due,
                          park_at=park_at)

    def step_invoke_pending_if_owned(self, owner: RunOwner, name: str, pending: int) -> bool:
        row = unless_busy(self._run(STEP_INVOKE_PENDING_IF_OWNED, {
            **owner_params(owner), "name": name, "pending": pending}, fetch="one"),
            f"step {name!r}")
        return row[0] is not None

    def jobs_enqueue_children(self, batch: Sequence[EnqueueParams], *, parent_id: UUID,
                              parent_step: str) -> None:
        self._run(JOBS_ENQUEUE_CHILDREN, {
            **batch_args(batch, notify=self.notify), "parent_id": parent_id,
            "parent_step": parent_step,
        }, fetch="count")

    def jobs_children(self, ids: Sequence[str]) -> list[ChildState]:
        rows = self._run(JOBS_CHILDREN, {"ids": list(ids)})
        if any(r[2] is None for r in rows):  # one was archived (or purged): look further
            rows = self._run(JOBS_CHILDREN_ARCHIVED, {"ids": list(ids)})
        return [ChildState(id=r[0], name=r[1], state=r[2],
                           result=decode_json_for_run(r[3], f"result of child job {r[0]}"),
                           error=r[4]) for r in rows]

    def jobs_cancel_tree(self, *, ids: Sequence[str] = (), parents: Sequence[str] = (),
                         reason: str | None, wait: bool = True) -> int:
        stmt = JOBS_CANCEL_TREE if wait else JOBS_CANCEL_TREE_FREE
        cancelled, _left = self._run(stmt, {
            "ids": list(ids), "parents": list(parents), "reason": reason}, fetch="one")
        return int(cancelled)

    def event_lock(self, names: Sequence[str]) -> None:
        self._run(EVENT_LOCK, {"names": list(names)}, fetch="one")

    def event_publish(
        self, name: str, payload_json: str, correlation_key: str | None, ttl_ms: int
    ) -> EventRecord:
        id_, published_at, expires_at = self._run(EVENT_PUBLISH, {
            "name": name, "payload": payload_json, "correlation_key": correlation_key,
            "ttl_ms": ttl_ms,
        }, fetch="one")
        return EventRecord(id=id_, name=name, payload=decode_json(payload_json),
                           correlation_key=correlation_key, published_at=published_at,
                           expires_at=expires_at)

    def event_wake_waiters(self, name: str, correlation_key: str | None) -> int:
        woken, _queues = self._run(EVENT_WAKE_WAITERS, {
            "name": name, "correlation_key": correlation_key,
        }, fetch="one")
        return int(woken)

    def event_next(
        self, names: Sequence[str], correlation_key: str | None, after_at: datetime,
        after_id: int,
    ) -> EventRecord | None:
        stmt = EVENT_NEXT if correlation_key is None else EVENT_NEXT_KEYED
        row = self._run(stmt, {
            "names": list(names), "correlation_key": correlation_key, "after_at": after_at,
            "after_id": after_id,
        }, fetch="one")
        if row is None:
            return None
        payload = decode_json_for_run(row[2], f"payload of event {row[1]!r} #{row[0]}")
        return EventRecord(id=row[0], name=row[1], payload=payload, published_at=row[3])

    def events_list(self, name: str | None = None, limit: int = 100) -> list[EventRecord]:
        return [
            EventRecord(id=r[0], name=r[1], payload=decode_json(r[2]), correlation_key=r[3],
                        published_at=r[4], expires_at=r[5])
            for r in self._run(EVENTS_LIST, {"name": name, "limit": limit})
        ]
