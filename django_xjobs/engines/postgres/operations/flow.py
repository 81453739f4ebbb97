"""Flow control (docs/flow-control.md): concurrency slots (the protocol is in
django_xjobs/slots.py), rate budgets, and the pauses of queues and keys."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from ....records import (
    ClaimFlow,
    HandOver,
    PauseRecord,
    RateRequest,
    Renewal,
    SlotHold,
    SlotRecord,
    SlotRelease,
    SlotRequest,
    SlotUsage,
)
from ..core import PostgresCore
from ..params import holds_params, in_slot_order, release_params
from ..rows import pause_record, slot_release
from ..statements.flow import JOBS_UNBLOCK, RATE_TAKE
from ..statements.pauses import PAUSE_RESUME_KEY, PAUSE_RESUME_QUEUE, PAUSE_UPSERT, PAUSES_LIST
from ..statements.slots import (
    SLOTS_ACQUIRE,
    SLOTS_LIST,
    SLOTS_RELEASE_IF_HELD,
    SLOTS_RENEW_IF_HELD,
    SLOTS_USAGE,
)


class FlowControl(PostgresCore):
    """The seam's concurrency-slot, rate-limit and pause operations."""

    def slots_acquire(self, requests: Sequence[SlotRequest], ttl_ms: int) -> list[SlotHold]:
        if not requests:
            return []
        rows = self._run(SLOTS_ACQUIRE, {
            "keys": [r.slot_key for r in requests], "limits": [r.limit for r in requests],
            "holders": [r.holder for r in requests], "ttl_ms": ttl_ms,
        })
        limits = {r.holder: r.limit for r in requests}
        return [SlotHold(slot_key=r[0], slot=r[1], holder=r[2], limit=limits[r[2]])
                for r in rows]

    def slots_renew_if_held(self, holds: Sequence[SlotHold], ttl_ms: int) -> Renewal:
        if not holds:
            return Renewal()
        rows = self._run(SLOTS_RENEW_IF_HELD, {**holds_params(in_slot_order(holds)),
                                               "ttl_ms": ttl_ms})
        return Renewal(renewed=frozenset(holder for holder, landed in rows if landed),
                       kept=frozenset(holder for holder, landed in rows if not landed))

    def slots_release_if_held(self, holds: Sequence[SlotHold]) -> tuple[int, list[SlotHold]]:
        release = self.slots_release_hand_over(holds)
        return release.released, release.busy

    def slots_release_hand_over(self, holds: Sequence[SlotHold],
                                offer: HandOver | None = None) -> SlotRelease:
        if not holds:
            return SlotRelease(released=0)
        ordered = in_slot_order(holds)
        return slot_release(ordered, self._run(SLOTS_RELEASE_IF_HELD,
                                               release_params(ordered, offer, self.notify)))

    def slots_list(self, *, slot_key: str | None = None, limit: int = 1000) -> list[SlotRecord]:
        return [
            SlotRecord(slot_key=r[0], slot=r[1], holder=r[2], expires_at=r[3],
                       expires_in=r[4] / 1000)
            for r in self._run(SLOTS_LIST, {"key": slot_key, "limit": limit})
        ]

    def slots_usage(self, limit: int = 1000) -> list[SlotUsage]:
        return [
            SlotUsage(slot_key=r[0], held=r[1], next_expiry=r[2])
            for r in self._run(SLOTS_USAGE, {"limit": limit})
        ]

    def rate_take(self, requests: Sequence[RateRequest]) -> list[datetime | None]:
        if not requests:
            return []
        rows = self._run(RATE_TAKE, {
            "keys": [r.key for r in requests], "limits": [r.limit for r in requests],
            "periods": [r.period_ms for r in requests], "costs": [r.cost for r in requests],
        })
        found = {int(n): next_at for n, next_at in rows}
        return [found.get(i + 1) for i in range(len(requests))]

    def jobs_unblock(self, flow: ClaimFlow, batch: int = 1000) -> int:
        woken, _notified = self._run(JOBS_UNBLOCK, {
            "prefixes": list(flow.prefixes), "prefix_limits": list(flow.prefix_limits),
            "limit_names": list(flow.limit_names), "limit_values": list(flow.limit_values),
            "batch": batch, "park": flow.park, "notify": self.notify,
        }, fetch="one")
        return int(woken)

    def pause_upsert(self, kind: str, key: str, *, until: datetime | None, for_ms: int | None,
                     reason: str | None) -> PauseRecord | None:
        row = self._run(PAUSE_UPSERT, {
            "kind": kind, "key": key, "until": until, "for_ms": for_ms, "reason": reason,
        }, fetch="one")
        return None if row is None else pause_record(row)

    def pause_resume_queue(self, queue: str) -> bool:
        in_force, _notified = self._run(PAUSE_RESUME_QUEUE, {
            "queue": queue, "notify": self.notify,
        }, fetch="one")
        return bool(in_force)

    def pause_resume_key(self, key: str) -> tuple[bool, int]:
        in_force, unblocked, _notified = self._run(PAUSE_RESUME_KEY, {
            "key": key, "notify": self.notify,
        }, fetch="one")
        return bool(in_force), int(unblocked)

    def pauses_list(self, *, kind: str | None = None, limit: int = 1000) -> list[PauseRecord]:
        return [pause_record(r) for r in self._run(PAUSES_LIST, {"kind": kind,
                                                                     "limit": limit})]
