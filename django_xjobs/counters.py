"""The counters: what every job did, per queue and minute, at a cost that does not grow with
the jobs table (docs/observability.md, "Counters").

The statements that change a job's state insert their counts (``x_stat_deltas``) in the same
statement; :func:`rollup` folds them into minute, hour, day and all-time buckets (``x_stats``),
which every worker runs every few seconds (``worker/stats.py``) and the pruner keeps bounded
(:data:`RETENTION`). Reads add the deltas not folded yet, so they are exact at any moment.

:func:`chart` is what the console's charts and the dashboard read: a window (``hour``, ``day``
or ``week``) as evenly spaced buckets per queue, empty buckets included.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from . import clock
from .engines import Engine, get_engine
from .records import Counters

# How long each grain's buckets are kept, in seconds: minutes for two days (the hour chart),
# hours for 40 days (the day and week charts), days for two years. All-time rows stay.
RETENTION = {"minute": 2 * 86_400.0, "hour": 40 * 86_400.0, "day": 730 * 86_400.0}

# How often a worker folds the deltas (seconds), and the most it folds per statement.
ROLLUP_INTERVAL = 5.0
ROLLUP_BATCH = 10_000
# Seconds between a worker's rollups that start from the first delta rather than past the
# last one it folded (RollupFloor).
ROLLUP_FULL = 300.0


@dataclass(frozen=True, slots=True)
class Window:
    """A chart's span: ``buckets`` buckets of ``step`` each, read from ``grain`` rows."""

    name: str
    grain: str
    step: timedelta
    buckets: int


WINDOWS: dict[str, Window] = {
    "hour": Window("hour", "minute", timedelta(minutes=1), 60),
    "day": Window("day", "hour", timedelta(hours=1), 24),
    "week": Window("week", "hour", timedelta(hours=6), 28),
}


@dataclass(frozen=True, slots=True)
class Chart:
    """A window's counters: ``starts`` the bucket start times, oldest first, and per queue one
    :class:`Counters` per bucket (zeros where nothing happened); ``total`` per queue over the
    whole window."""

    window: Window
    starts: tuple[datetime, ...]
    series: dict[str, tuple[Counters, ...]]

    def total(self, queue: str) -> Counters:
        return sum_counters(queue, self.series.get(queue, ()))


class RollupFloor:
    """Where one worker's rollups start: past the last delta it folded.

    A folded delta is deleted, and while a long transaction holds the database's horizon its
    dead entry stays at the head of the primary key the rollup walks (a rollup five minutes
    into a held snapshot read every delta since, twice as slow as one minute in). The ids come
    from a sequence, so a delta whose transaction commits after a later one was folded lands
    behind the floor: it is folded by the next rollup from the first delta, every
    ``ROLLUP_FULL`` seconds, and until then every read still adds it (docs/observability.md,
    "Counters").
    """

    def __init__(self) -> None:
        self.after_id = 0
        self._full_at = 0.0  # monotonic; the first rollup starts from the first delta

    def start(self, now: float) -> int:
        """The id the rollup starting ``now`` (monotonic) folds past."""
        if now >= self._full_at:
            self._full_at = now + ROLLUP_FULL
            return 0
        return self.after_id

    def full_soon(self) -> None:
        """The next rollup starts from the first delta."""
        self._full_at = 0.0


def rollup(engine: Engine | None = None, *, batch_size: int = ROLLUP_BATCH,
           floor: RollupFloor | None = None) -> int:
    """Fold every pending delta (batch after batch), past ``floor`` when given; how many were
    folded."""
    engine = engine or get_engine()
    after = floor.start(clock.monotonic()) if floor is not None else 0
    folded = 0
    while True:
        n, last = engine.stats_rollup(batch_size, after_id=after)
        folded += n
        if last is not None:
            after = last
        if n < batch_size:
            break
    if floor is not None:
        floor.after_id = max(floor.after_id, after)
    return folded


def prune(engine: Engine, *, batch_size: int = 1000) -> int:
    """Delete the buckets past :data:`RETENTION`; how many."""
    return engine.stats_prune(minute_keep=RETENTION["minute"], hour_keep=RETENTION["hour"],
                              day_keep=RETENTION["day"], batch_size=batch_size)


def sum_counters(queue: str, rows: tuple[Counters, ...] | list[Counters]) -> Counters:
    """The sum of ``rows`` (histograms added bucket by bucket), named ``queue``."""
    total = Counters(queue=queue)
    for r in rows:
        total = replace(
            total,
            enqueued=total.enqueued + r.enqueued, started=total.started + r.started,
            done=total.done + r.done, failed=total.failed + r.failed, dead=total.dead + r.dead,
            cancelled=total.cancelled + r.cancelled,
            wait_ms_sum=total.wait_ms_sum + r.wait_ms_sum,
            run_ms_sum=total.run_ms_sum + r.run_ms_sum,
            wait_hist=_add(total.wait_hist, r.wait_hist),
            run_hist=_add(total.run_hist, r.run_hist),
        )
    return total


def _add(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    if not a:
        return b
    if not b:
        return a
    return tuple(x + y for x, y in zip(a, b, strict=True))


def chart(window: str, *, engine: Engine | None = None, queue: str | None = None,
          now: datetime | None = None) -> Chart:
    """The counters of the last ``window`` (``hour``, ``day``, ``week``), per queue."""
    try:
        w = WINDOWS[window]
    except KeyError:
        raise ValueError(f"window must be one of {', '.join(WINDOWS)}, not {window!r}") from None
    engine = engine or get_engine()
    now = now or engine.db_now()
    last = _floor(now, w.step)
    first = last - w.step * (w.buckets - 1)
    starts = tuple(first + w.step * i for i in range(w.buckets))
    grouped: dict[str, list[list[Counters]]] = {}
    for row in engine.stats_series(w.grain, first, queue=queue):
        assert row.at is not None
        i = int((row.at - first) / w.step)
        if 0 <= i < w.buckets:
            grouped.setdefault(row.queue, [[] for _ in starts])[i].append(row)
    series = {
        q: tuple(sum_counters(q, rows) for rows in buckets)
        for q, buckets in sorted(grouped.items())
    }
    return Chart(window=w, starts=starts, series=series)


def _floor(moment: datetime, step: timedelta) -> datetime:
    """``moment`` rounded down to a multiple of ``step`` since the epoch (UTC buckets)."""
    epoch = datetime(1970, 1, 1, tzinfo=moment.tzinfo)
    return epoch + ((moment - epoch) // step) * step
