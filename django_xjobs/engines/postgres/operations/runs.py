"""A worker's runs: the claim, and every write a run makes about its job, fenced on the pair
(job id, lease token) of its claim (docs/design.md, "Fencing"). Each answers per lease token
(a FenceReport): written, already written by an earlier try, lost, or busy (another
transaction holds the row; nothing was written or waited for)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from .... import slots
from ....records import (
    Claim,
    ClaimBatch,
    ClaimFloors,
    ClaimFlow,
    Completion,
    Failure,
    FenceReport,
    HandOver,
    KeyPauseRequeue,
    Renewal,
    Requeue,
    SlotHold,
    SlotRelease,
    Suspension,
    UnknownGiveBack,
    UnknownWait,
)
from ....values import decode_json
from ..core import PostgresCore
from ..params import (
    claims_params,
    fence_params,
    in_lock_order,
    in_slot_order,
    release_params,
    tenants,
    uuid_array,
)
from ..rows import claim_scans, claimed_job, slot_release
from ..statements.claim import JOBS_CLAIM
from ..statements.jobs import (
    JOB_FAIL_IF_OWNED,
    JOB_GIVE_BACK_UNKNOWN_IF_OWNED,
    JOB_PROGRESS_IF_OWNED,
    JOB_REQUEUE_IF_OWNED,
    JOB_SUSPEND_IF_OWNED,
    JOBS_COMPLETE_IF_OWNED,
    JOBS_COMPLETE_RELEASE_IF_OWNED,
    JOBS_FENCE_CHECK,
    JOBS_RENEW_IF_OWNED,
    JOBS_REQUEUE_IF_OWNED,
    JOBS_UNKNOWN_WAITING,
    JOBS_WAKE_REFUSED,
)
from ..statements.pauses import JOB_PAUSE_KEY_IF_OWNED

# Which states a fenced write leaves behind, to recognise its own earlier commit.
_APPLIED_STATES = {
    "complete": frozenset({"done"}),
    "fail": frozenset({"ready", "delayed", "dead"}),
    "requeue": frozenset({"ready", "delayed", "suspended"}),
    "suspend": frozenset({"suspended"}),
}


class Runs(PostgresCore):
    """The seam's worker-side operations, with the fenced hand-backs of flow control."""

    def jobs_claim(
        self, *, wants: Mapping[str, int], worker_id: str, lease_ms: int,
        flow: ClaimFlow | None = None, cursors: Mapping[str, str] | None = None,
        floors: ClaimFloors | None = None,
    ) -> ClaimBatch:
        queues = [q for q, n in wants.items() if n > 0]
        batch = ClaimBatch()
        if not queues:
            return batch
        flow = flow or ClaimFlow(slot_ttl_ms=lease_ms)
        cursors = cursors or {}
        rows = self._run(JOBS_CLAIM, {
            "queues": queues,
            "limits": [wants[q] for q in queues],
            "fair": [q in flow.fair_queues for q in queues],
            "cursors": [cursors.get(q, "") for q in queues],
            "floored": [floors is not None and q in floors.queues for q in queues],
            "lapsed_from": [floors.lapsed.get(q) if floors else None for q in queues],
            "floor_queues": list(floors.floor_queues) if floors else [],
            "floor_priorities": list(floors.floor_priorities) if floors else [],
            "floor_values": list(floors.floor_values) if floors else [],
            "scans": floors is not None,
            "worker_id": worker_id,
            "lease_ms": lease_ms,
            "slot_ttl_ms": flow.slot_ttl_ms,
            "limit_names": list(flow.limit_names), "limit_values": list(flow.limit_values),
            "prefixes": list(flow.prefixes), "prefix_limits": list(flow.prefix_limits),
            "rate_names": list(flow.rate_names), "rate_limits": list(flow.rate_limits),
            "rate_periods": list(flow.rate_periods_ms), "rate_costs": list(flow.rate_costs),
            "weight_queues": list(flow.weight_queues),
            "weight_tenants": list(flow.weight_tenants),
            "weight_values": list(flow.weight_values),
            "park": flow.park, "hold_ms": flow.hold_ms,
        })
        # The inputs of the batch decoded in one call (a thousand small calls cost twice as
        # much; the object hook of typed values runs only when one of them holds one); any
        # surprise (a value the batch cannot decode, an input decoding to a str, which
        # claimed_job would decode again) and each row is decoded on its own.
        inputs = [r[4] for r in rows if r[0] is not None]
        decoded: Any = None
        if len(inputs) > 1 and all(type(v) is str for v in inputs):
            try:
                decoded = decode_json("[" + ",".join(inputs) + "]")
            except (ValueError, RecursionError):
                decoded = None
            if decoded is not None and any(type(v) is str for v in decoded):
                decoded = None
        k = 0
        for r in rows:
            if r[0] is None:
                batch.retry_at, batch.held, batch.now = r[14], int(r[15]), r[16]
                if floors is not None:
                    batch.scans = claim_scans(r[18])
                continue
            if decoded is not None:
                batch.append(claimed_job((*r[:4], decoded[k], *r[5:])))
                k += 1
            else:
                batch.append(claimed_job(r))
        return batch

    def _fence_check(self, kind: str, claims: Sequence[Claim]) -> FenceReport:
        rows = self._run(JOBS_FENCE_CHECK, {
            "ids": [c.job_id for c in claims], "tokens": [c.lease_token for c in claims],
        })
        applied_states = _APPLIED_STATES[kind]
        states = {
            token: state for token, state, same_token in rows
            if same_token and state in applied_states
        }
        already = frozenset(states)
        lost = frozenset(c.lease_token for c in claims) - already
        return FenceReport(already_applied=already, lost=lost, states=states)

    def _batch_report(self, kind: str, claims: Sequence[Claim],
                      rows: Sequence[Sequence[Any]]) -> FenceReport:
        """The report of a fenced batch write whose answer is ``rows`` of (lease token,
        landed): landed, or busy (another transaction holds its row); the other claims are
        told apart by jobs_fence_check (already applied, or lost)."""
        owned = frozenset(token for token, landed in rows if landed)
        busy = frozenset(token for token, landed in rows if not landed)
        if len(owned) + len(busy) == len(claims):
            return FenceReport(owned=owned, busy=busy)
        rest = self._fence_check(kind, [c for c in claims
                                        if c.lease_token not in owned | busy])
        return FenceReport(owned=owned, busy=busy, already_applied=rest.already_applied,
                           lost=rest.lost, states=rest.states)

    def _one_report(self, kind: str, claim: Claim, row: Sequence[Any] | None) -> FenceReport:
        """The report of a fenced write of one run whose answer is ``row`` (its first column
        `busy` when another transaction holds the job's row)."""
        if row is not None and row[0] == "busy":
            return FenceReport(busy=frozenset({claim.lease_token}))
        if row is not None:
            return FenceReport(owned=frozenset({claim.lease_token}))
        return self._fence_check(kind, [claim])

    def jobs_complete_if_owned(self, batch: Sequence[Completion]) -> FenceReport:
        if not batch:
            return FenceReport()
        batch = in_lock_order(batch)
        rows = self._run(JOBS_COMPLETE_IF_OWNED, {
            **claims_params(c.claim for c in batch),
            "results": "[" + ",".join(c.result_json or "null" for c in batch) + "]",
        })
        return self._batch_report("complete", [c.claim for c in batch], rows)

    def jobs_complete_release_if_owned(
        self, batch: Sequence[Completion], holds: Sequence[SlotHold],
        offer: HandOver | None = None,
    ) -> tuple[FenceReport, SlotRelease]:
        if not holds:
            return self.jobs_complete_if_owned(batch), SlotRelease(released=0)
        batch = in_lock_order(batch)
        ordered = in_slot_order(holds)
        rows = self._run(JOBS_COMPLETE_RELEASE_IF_OWNED, {
            **claims_params(c.claim for c in batch),
            "results": "[" + ",".join(c.result_json or "null" for c in batch) + "]",
            **release_params(ordered, offer, self.notify),
            "hold_tokens": uuid_array(slots.parse_holder(h.holder)[1] for h in ordered),
        })
        report = self._batch_report("complete", [c.claim for c in batch],
                                    [(r[1], r[0] == "landed") for r in rows
                                     if r[0] in ("landed", "busy")])
        return report, slot_release(ordered, [r[1:] for r in rows
                                              if r[0] in ("release", "job")])

    def job_fail_if_owned(self, failure: Failure) -> tuple[FenceReport, str | None]:
        row = self._run(JOB_FAIL_IF_OWNED, {
            **fence_params(failure.claim), "error": failure.error,
            "delay_ms": failure.retry_delay_ms, "permanent": failure.permanent,
            "outcome": failure.outcome, "max_attempts": failure.max_attempts,
        }, fetch="one")
        report = self._one_report("fail", failure.claim, row)
        if report.owned:
            return replace(report, run_at={failure.claim.lease_token: row[1]}), row[0]
        return report, report.states.get(failure.claim.lease_token)

    def job_requeue_if_owned(self, requeue: Requeue) -> FenceReport:
        row = self._run(JOB_REQUEUE_IF_OWNED, {
            **fence_params(requeue.claim), "delay_ms": requeue.delay_ms,
            "spent": requeue.spent_attempt, "resumed": requeue.resumed, "note": requeue.note,
            "outcome": requeue.outcome,
        }, fetch="one")
        return self._one_report("requeue", requeue.claim, row)

    def jobs_requeue_if_owned(self, batch: Sequence[Requeue]) -> FenceReport:
        if not batch:
            return FenceReport()
        batch = in_lock_order(batch)
        rows = self._run(JOBS_REQUEUE_IF_OWNED, {
            **claims_params(r.claim for r in batch),
            "delays_ms": [r.delay_ms for r in batch],
            "spent": [r.spent_attempt for r in batch],
            "resumed": [r.resumed for r in batch],
            "notes": [r.note for r in batch],
            "outcomes": [r.outcome for r in batch],
        })
        return self._batch_report("requeue", [r.claim for r in batch], rows)

    def job_give_back_unknown_if_owned(self, give_back: UnknownGiveBack) -> FenceReport:
        row = self._run(JOB_GIVE_BACK_UNKNOWN_IF_OWNED, {
            **fence_params(give_back.claim), "spent": give_back.spent_attempt,
            "resumed": give_back.resumed, "note": give_back.note,
            "max_ms": give_back.max_delay_ms,
        }, fetch="one")
        return self._one_report("requeue", give_back.claim, row)

    def job_suspend_if_owned(self, suspension: Suspension) -> FenceReport:
        row = self._run(JOB_SUSPEND_IF_OWNED, {
            **fence_params(suspension.claim), "wake_at": suspension.wake_at,
        }, fetch="one")
        return self._one_report("suspend", suspension.claim, row)

    def job_pause_key_if_owned(self, requeue: KeyPauseRequeue) -> tuple[FenceReport,
                                                                         datetime | None]:
        row = self._run(JOB_PAUSE_KEY_IF_OWNED, {
            **fence_params(requeue.claim), "key": requeue.key, "for_ms": requeue.for_ms,
            "reason": requeue.reason, "delay_ms": 0, "spent": requeue.spent_attempt,
            "resumed": requeue.resumed, "note": requeue.note, "outcome": "handed_back",
        }, fetch="one")
        report = self._one_report("requeue", requeue.claim, row)
        return report, row[1] if report.owned else None

    def jobs_renew_if_owned(self, claims: Sequence[Claim], lease_ms: int) -> Renewal:
        if not claims:
            return Renewal()
        rows = self._run(JOBS_RENEW_IF_OWNED, {
            **claims_params(sorted(claims, key=lambda c: c.job_id)),
            "lease_ms": lease_ms,
        })
        return Renewal(renewed=frozenset(token for token, on_row in rows if on_row),
                       kept=frozenset(token for token, on_row in rows if not on_row))

    def job_progress_if_owned(self, claim: Claim, *, done: float, total: float | None,
                              message: str | None) -> bool:
        row = self._run(JOB_PROGRESS_IF_OWNED, {
            **fence_params(claim), "done": done, "total": total, "message": message,
        }, fetch="one")
        return row is not None

    def jobs_wake_refused(self, refused: Sequence[Claim]) -> int:
        if not refused:
            return 0
        woken, _notified = self._run(JOBS_WAKE_REFUSED, {
            **claims_params(refused), "notify": self.notify,
        }, fetch="one")
        return int(woken)

    def jobs_unknown_waiting(self, *, names: Iterable[str] | None = None,
                             tenant_ids: Iterable[str] | None = None) -> list[UnknownWait]:
        rows = self._run(JOBS_UNKNOWN_WAITING, {
            "names": list(names) if names is not None else None,
            "tenant_ids": tenants(tenant_ids),
        })
        return [UnknownWait(queue=r[0], name=r[1], count=r[2], since=r[3], waited=r[4],
                            cron_tasks=tuple(sorted(r[5]))) for r in rows]
