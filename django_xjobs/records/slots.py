"""Concurrency slots (``x_job_leases``; the protocol is in django_xjobs/slots.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from .claims import ClaimedJob, ClaimFlow


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotRequest:
    """One run asking for a slot of ``slot_key`` below ``limit`` (django_xjobs/slots.py).

    ``holder`` names the run and nothing else: it contains the claim's lease token, which no
    other run ever carries, so renewals and releases fenced on it touch this run's slot only.
    """

    slot_key: str
    limit: int
    holder: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotHold:
    """A slot a run was granted: what its renewals and its release are fenced on, and the
    limit it was granted under (its release wakes that many blocked jobs at most)."""

    slot_key: str
    slot: int
    holder: str
    limit: int = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class HandOver:
    """What a worker that releases slots offers to start itself: up to ``take`` jobs blocked on
    the released keys, of its ``queues`` (served, not fair), each leased for ``lease_ms`` to
    ``worker_id``; ``flow`` gives their limits and the slots' TTL (slots_release_if_held)."""

    worker_id: str
    lease_ms: int
    take: int
    queues: tuple[str, ...]
    flow: ClaimFlow


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotRelease:
    """What a release did: how many slot rows it deleted, the holds whose row another
    transaction held this moment (``busy``: release them again later), the jobs it handed the
    other slots to (``started``: leased to the releasing worker, as a claim leases them), and
    how many blocked jobs it woke for any worker to claim (``woken``)."""

    released: int
    woken: int = 0
    busy: list[SlotHold] = field(default_factory=list)
    started: list[ClaimedJob] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotRecord:
    """A live ``x_job_leases`` row, for operators (``manage.py xjobs slots``)."""

    slot_key: str
    slot: int
    holder: str
    expires_at: datetime
    expires_in: float  # seconds, on the database clock


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotUsage:
    """How many slots of one key are held now (live rows only), for the stats."""

    slot_key: str
    held: int
    next_expiry: datetime
