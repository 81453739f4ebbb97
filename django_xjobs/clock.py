"""The injectable clocks.

Two clocks, never mixed:

* wall time (:func:`now`) for values that are stored or compared with stored values: run_at of a
  delayed job, cron occurrences. Lease arithmetic does NOT use it: every lease expiry is computed
  by the database (``now()`` in the statement), so a worker whose clock is wrong cannot make a
  lease last longer or shorter than configured.
* a monotonic clock (:func:`monotonic`) for the worker's own intervals: heartbeat cadence, the
  self-fence ("no renewal for a whole lease period"), job timeouts, shutdown grace.

Tests replace either with :func:`override` instead of sleeping.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

_now: Callable[[], datetime] = lambda: datetime.now(UTC)  # noqa: E731
_monotonic: Callable[[], float] = time.monotonic


def now() -> datetime:
    """Aware current wall time (UTC)."""
    return _now()


def monotonic() -> float:
    """Seconds on a clock that never goes backwards; only differences mean anything."""
    return _monotonic()


@contextlib.contextmanager
def override(
    *, now: Callable[[], datetime] | None = None, monotonic: Callable[[], float] | None = None
) -> Iterator[None]:
    """Replace the clocks for the duration of a ``with`` block (tests)."""
    global _now, _monotonic
    saved = _now, _monotonic
    if now is not None:
        _now = now
    if monotonic is not None:
        _monotonic = monotonic
    try:
        yield
    finally:
        _now, _monotonic = saved
