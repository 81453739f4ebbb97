"""Retry delays: exponential backoff with full jitter. Pure functions, standard library only.

Full jitter (``uniform(0, min(cap, base * 2**(attempt - 1)))``) rather than "exponential plus a
little noise": after an outage every failed job retries at once, and only a delay drawn from
the whole window spreads that herd out (AWS Architecture Blog, "Exponential Backoff And Jitter").
"""

from __future__ import annotations

import random
from collections.abc import Callable


def retry_delay(
    attempt: int, *, base: float, cap: float, rand: Callable[[], float] = random.random
) -> float:
    """Seconds to wait before the retry that follows failed attempt number ``attempt`` (1-based)."""
    exponent = min(max(attempt - 1, 0), 62)  # 2**62 * base is past any cap; avoid float overflow
    window = min(cap, base * (2.0**exponent))
    return window * rand()
