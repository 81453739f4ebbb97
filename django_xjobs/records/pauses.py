"""Pauses of queues and keys (``x_flow_pauses``; docs/flow-control.md, "Pause and circuit
breakers")."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from .claims import Claim


@dataclass(frozen=True, slots=True, kw_only=True)
class PauseRecord:
    """A pause in force (``x_flow_pauses``): of a queue (``kind="queue"``) or of a key
    (``kind="key"``), until ``until`` (None: until resumed). ``blocked``: how many jobs are
    blocked on the key now (0 for a queue). The reads of ``xjobs why`` leave ``paused_at`` and
    ``blocked`` out (None, 0)."""

    kind: str  # "queue" | "key"
    key: str
    until: datetime | None
    reason: str | None
    paused_at: datetime | None = None
    blocked: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyPauseRequeue:
    """A run that raised ``PauseKey``: give the job back due now without spending an attempt
    (as :class:`Requeue`) and pause ``key`` for ``for_ms``, in one fenced write."""

    claim: Claim
    key: str
    for_ms: int
    reason: str | None
    spent_attempt: bool
    resumed: bool
    note: str | None = None
