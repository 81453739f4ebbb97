"""The injectable clocks.

Two clocks, never mixed:

* wall time (:func:`now`) for values that are stored or compared with stored values: run_at of a
  delayed job passed as a datetime. Lease arithmetic does NOT use it: every lease expiry is
  computed by the database (``now()`` in the statement), so a worker whose clock is wrong cannot
  make a lease last longer or shorter than configured. The leading scheduler does not use it
  either: it fires cron occurrences on a :class:`DatabaseClock`, so a leader whose wall clock is
  an hour off neither fires an hour early nor stalls an hour.
* a monotonic clock (:func:`monotonic`) for the worker's own intervals: heartbeat cadence, the
  self-fence ("no renewal for a whole lease period"), job timeouts, shutdown grace.

Tests replace either with :func:`override` instead of sleeping.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

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


class DatabaseClock:
    """The database's wall clock, read now and then and carried forward on the monotonic clock.

    :meth:`sync` reads it (``read``, e.g. ``engine.db_now``) when the last reading is older
    than ``every`` seconds; :meth:`now` never touches the database: the last reading plus the
    monotonic time since the reading came back, so a step of this machine's wall clock after
    the reading changes nothing. Counting from the end of the round trip makes it lag the
    database by up to one round trip and never run ahead of it: a cron occurrence is fired a
    few milliseconds late, never early. Before the first reading it is :func:`now`.
    """

    def __init__(self, read: Callable[[], datetime], *, every: float = 60.0) -> None:
        self._read = read
        self._every = every
        self._anchor: datetime | None = None
        self._at = 0.0  # monotonic time of the reading

    def sync(self) -> None:
        if self._anchor is not None and monotonic() - self._at < self._every:
            return
        anchor = self._read()
        self._anchor, self._at = anchor, monotonic()

    def now(self) -> datetime:
        if self._anchor is None:
            return now()
        return self._anchor + timedelta(seconds=monotonic() - self._at)
