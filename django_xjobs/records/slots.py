"""Concurrency slots (``x_job_leases``; the protocol is in django_xjobs/slots.py)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


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
