"""Records as statement parameters: the ``%(name)s`` values the families of operations
(operations/) share, for the fence of a run, a batch of jobs, a tenant scope."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any
from uuid import UUID

from ...records import Claim, ClaimFlow, EnqueueParams, HandOver, RunOwner, SlotHold


def fence_params(claim: Claim) -> dict[str, str]:
    """The parameters a fenced single-job statement matches on: ``%(id)s`` and ``%(token)s``."""
    return {"id": claim.job_id, "token": claim.lease_token}


def claims_params(claims: Iterable[Claim]) -> dict[str, str]:
    """The parameters a fenced batch statement matches on: ``%(ids)s`` and ``%(tokens)s``, the
    job ids and lease tokens of the claims, pair n at position n."""
    pairs = list(claims)
    return {"ids": uuid_array(c.job_id for c in pairs),
            "tokens": uuid_array(c.lease_token for c in pairs)}


def in_lock_order(batch: Sequence[Any]) -> list[Any]:
    """A batch of fenced writes (each with a ``claim``) in the order its statement locks the
    rows: by job id (docs/design.md, "Lock order")."""
    return sorted(batch, key=lambda item: item.claim.job_id)


def uuid_array(values: Iterable[Any]) -> str:
    """A uuid[] literal. Built with one join instead of psycopg's per-element list dumper
    (docs/performance.md, "What the simpler forms cost"); uuids need no quoting."""
    return "{" + ",".join(map(str, values)) + "}"


def as_uuid(value: Any) -> UUID | None:
    """``value`` as a uuid, or None when it is not one (an operator's typo matches no row)."""
    if isinstance(value, UUID):
        return value
    try:
        return UUID(str(value))
    except ValueError:
        return None


def tenants(tenant_ids: Iterable[str] | None) -> list[str] | None:
    """A tenant scope as the statements take it: a list, or None for every tenant."""
    return None if tenant_ids is None else list(tenant_ids)


def owner_params(owner: RunOwner) -> dict[str, Any]:
    """The parameters a step or backfill write is fenced on: the run's job, its lease token
    and its run id."""
    return {"job_id": owner.claim.job_id, "token": owner.claim.lease_token,
            "run_id": owner.run_id}


def enqueue_args(params: EnqueueParams, *, notify: bool) -> dict[str, Any]:
    """The parameters of job_enqueue / job_enqueue_unkeyed for one job."""
    return {
        "id": params.id, "name": params.name, "queue": params.queue,
        "input": params.input_json, "key": params.idempotency_key, "run_id": params.run_id,
        "max_attempts": params.max_attempts, "priority": params.priority,
        "run_at": params.run_at, "delay_ms": params.delay_ms, "tenant_id": params.tenant_id,
        "traceparent": params.traceparent, "enqueued_by": params.enqueued_by,
        "concurrency_key": params.concurrency_key, "rate_key": params.rate_key,
        "notify": notify,
    }


def batch_args(batch: Sequence[EnqueueParams], *, notify: bool) -> dict[str, Any]:
    """jobs_enqueue's parameters: the rows' columns as one JSON array (one C-level dumps
    call), their inputs (already JSON text) as another, joined as strings."""
    meta = json.dumps([
        [str(p.id), p.name, p.queue, p.idempotency_key, str(p.run_id), p.max_attempts,
         p.priority, p.run_at.isoformat() if p.run_at is not None else None, p.delay_ms,
         p.tenant_id, p.traceparent, p.enqueued_by, p.concurrency_key, p.rate_key]
        for p in batch
    ])
    inputs = "[" + ",".join(p.input_json for p in batch) + "]"
    return {"meta": meta, "inputs": inputs, "notify": notify}


def in_slot_order(holds: Sequence[SlotHold]) -> list[SlotHold]:
    """Slot holds in the order the slot statements lock their rows: by (key, slot)
    (docs/design.md, "Lock order"; they lock SKIP LOCKED, so this is for the reader of a
    log)."""
    return sorted(holds, key=lambda h: (h.slot_key, h.slot))


def holds_params(holds: Sequence[SlotHold]) -> dict[str, list[Any]]:
    """The parameters that name slot holds: ``%(keys)s``, ``%(slots)s``, ``%(holders)s``."""
    return {"keys": [h.slot_key for h in holds], "slots": [h.slot for h in holds],
            "holders": [h.holder for h in holds]}


def release_params(holds: Sequence[SlotHold], offer: HandOver | None,
                   notify: bool) -> dict[str, Any]:
    """The parameters of a slot release and its hand-over (slots_release_if_held,
    jobs_complete_release_if_owned): the holds (in_slot_order), each with the limit its run
    held it under, and what ``offer`` lets the release start (None: nothing)."""
    flow = offer.flow if offer is not None else ClaimFlow(slot_ttl_ms=0)
    return {
        **holds_params(holds), "limits": [h.limit for h in holds],
        "notify": notify,
        "take": offer.take if offer is not None else 0,
        "queues": list(offer.queues) if offer is not None else [],
        "worker_id": offer.worker_id if offer is not None else "",
        "lease_ms": offer.lease_ms if offer is not None else 0,
        "slot_ttl_ms": flow.slot_ttl_ms,
        "limit_names": list(flow.limit_names), "limit_values": list(flow.limit_values),
        "prefixes": list(flow.prefixes), "prefix_limits": list(flow.prefix_limits),
    }
