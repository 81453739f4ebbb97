"""The spending of a rate-limit budget (django_xjobs/ratelimits.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RateRequest:
    """One spending of a budget: ``cost`` units of ``key`` under ``limit`` per ``period_ms``."""

    key: str
    limit: int
    period_ms: int
    cost: int
