"""The console's charts: the counters of a window drawn as SVG on the server (docs/console.md,
"Charts").

Pure Python from numbers to markup: no JavaScript, no build step, nothing to load. Every text
and attribute that comes from data (queue names, labels) is escaped here, so a page can embed
the result as it is. A chart is accessible on its own: ``role="img"`` with a ``<title>`` and a
``<desc>`` that says what the numbers are, axis labels, a legend, and a ``<title>`` on each point
(the browser shows it on hover). The axes and texts are drawn in ``currentColor``, so they follow
the admin's light and dark themes; the series colours are mid tones readable on both.

:func:`line_chart` draws any series; :func:`window_charts` draws the three charts of a window
of counters (:func:`django_xjobs.counters.chart`): throughput (done per bucket), failures
(failed runs per bucket: each run that raised or timed out, whether the job was retried or
died of it) and the mean wait from due to start.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from html import escape

from ..counters import Chart

# Mid tones (a colour-blind-safe order first): each keeps a contrast of about 3:1 or more on
# the admin's white and on its dark theme's near-black background.
COLOURS = ("#3a87c8", "#e08a00", "#1a9e77", "#c55a9e", "#d55e00", "#7a7ad0", "#8f8f2f",
           "#888888")

WIDTH, PLOT_HEIGHT = 640, 150
LEFT, RIGHT, TOP = 56, 16, 30  # room for the y labels, the last x label, the title
LEGEND_ROW, LEGEND_COLUMNS = 18, 4
X_TICKS = 6  # at most this many time labels under the x axis

# What a bucket of each window is called in the charts' words.
BUCKET_WORDS = {"hour": "minute", "day": "hour", "week": "6 hours"}
WINDOW_WORDS = {"hour": "the last hour", "day": "the last 24 hours", "week": "the last 7 days"}


@dataclass(frozen=True, slots=True)
class Series:
    """One line: its name (in the legend and each point's title) and one value per bucket,
    None where there is nothing to draw (a bucket without a start has no mean wait)."""

    name: str
    values: Sequence[float | None]


def nice_ceiling(value: float) -> float:
    """The top of an axis: ``value`` rounded up to 1, 2, 2.5 or 5 times a power of ten (1 for
    nothing to show), so the grid lines fall on round numbers."""
    if not value > 0 or math.isinf(value):
        return 1.0
    step = 10 ** math.floor(math.log10(value))
    for factor in (1, 2, 2.5, 5, 10):
        if value <= factor * step * (1 + 1e-9):
            return factor * step
    return 10 * step  # pragma: no cover - the loop's last factor always holds


def number_text(value: float) -> str:
    """A tick or a point's value, short: ``0``, ``2.5``, ``120``, ``1.5k``, ``2M``."""
    for limit, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.3g}{suffix}"
    if value == int(value):
        return str(int(value))
    return f"{value:.3g}"


def line_chart(*, title: str, desc: str, labels: Sequence[str], series: Sequence[Series],
               y_label: str, chart_id: str, unit: str = "") -> str:
    """An SVG line chart: one line per series over the buckets named by ``labels`` (one label
    per bucket, oldest first), a point per value with its own ``<title>``, a y axis from 0 to a
    round number, a legend. ``chart_id`` makes the ids of the title and description unique on
    the page. Series shorter or longer than ``labels`` are refused: a chart that silently
    shifts its points would lie."""
    n = len(labels)
    for s in series:
        if len(s.values) != n:
            raise ValueError(f"series {s.name!r} has {len(s.values)} values for {n} buckets")
    legend_rows = max(1, math.ceil(len(series) / LEGEND_COLUMNS))
    plot_top = TOP + legend_rows * LEGEND_ROW + 6
    plot_bottom = plot_top + PLOT_HEIGHT
    height = plot_bottom + 40
    plot_w = WIDTH - LEFT - RIGHT
    values = [v for s in series for v in s.values if v is not None]
    top = nice_ceiling(max(values, default=0.0))
    sid = escape(chart_id, quote=True)

    def x(i: int) -> float:
        return LEFT + (i + 0.5) * plot_w / max(n, 1)

    def y(v: float) -> float:
        return plot_bottom - PLOT_HEIGHT * min(max(v / top, 0.0), 1.0)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="xjobs-chart" id="{sid}" role="img" '
        f'viewBox="0 0 {WIDTH} {height}" width="100%" preserveAspectRatio="xMinYMin meet" '
        f'aria-labelledby="{sid}-title {sid}-desc" data-buckets="{n}">',
        f'<title id="{sid}-title">{escape(title)}</title>',
        f'<desc id="{sid}-desc">{escape(desc)}</desc>',
        f'<text x="{LEFT}" y="16" class="xjobs-chart-title" fill="currentColor" '
        f'font-size="13" font-weight="600">{escape(title)}</text>',
    ]
    # The legend: a swatch and the name of each series, LEGEND_COLUMNS to a row.
    parts.append('<g class="xjobs-legend" font-size="11" fill="currentColor">')
    column_w = plot_w / LEGEND_COLUMNS
    for k, s in enumerate(series):
        lx = LEFT + (k % LEGEND_COLUMNS) * column_w
        ly = TOP + (k // LEGEND_COLUMNS) * LEGEND_ROW
        parts.append(
            f'<rect x="{lx:.1f}" y="{ly}" width="12" height="4" '
            f'fill="{COLOURS[k % len(COLOURS)]}"/>'
            f'<text x="{lx + 16:.1f}" y="{ly + 5}">{escape(_clip(s.name, 28))}</text>')
    parts.append("</g>")
    # The grid and the y axis: round steps from 0 to the top (quarters of a 2, else fifths).
    parts.append('<g class="xjobs-axis" font-size="10" fill="currentColor" stroke="none">')
    divisions = 4 if round(top / 10 ** math.floor(math.log10(top)), 6) == 2 else 5
    for q in range(divisions + 1):
        tick = top * q / divisions
        gy = y(tick)
        parts.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{gy:.1f}" y2="{gy:.1f}" '
            f'stroke="currentColor" stroke-opacity="{0.5 if q == 0 else 0.15}"/>'
            f'<text x="{LEFT - 6}" y="{gy + 3:.1f}" text-anchor="end">'
            f"{escape(number_text(tick))}</text>")
    # The x axis: the first bucket's label, then evenly spaced ones up to the last bucket.
    every = max(1, math.ceil(n / X_TICKS))
    ticks = sorted({*range(0, n, every), n - 1} - {-1})
    for i in ticks:
        if i != n - 1 and n - 1 - i < every / 2:
            continue  # too close to the last label: they would overlap
        parts.append(
            f'<line x1="{x(i):.1f}" x2="{x(i):.1f}" y1="{plot_bottom}" y2="{plot_bottom + 4}" '
            f'stroke="currentColor" stroke-opacity="0.5"/>'
            f'<text x="{x(i):.1f}" y="{plot_bottom + 16}" text-anchor="middle">'
            f"{escape(labels[i])}</text>")
    parts.append(
        f'<text x="{LEFT - 44}" y="{(plot_top + plot_bottom) / 2:.1f}" text-anchor="middle" '
        f'transform="rotate(-90 {LEFT - 44} {(plot_top + plot_bottom) / 2:.1f})">'
        f"{escape(y_label)}</text>"
        f'<text x="{LEFT + plot_w / 2:.1f}" y="{plot_bottom + 34}" text-anchor="middle">'
        f"time (bucket start)</text>")
    parts.append("</g>")
    # The series: a polyline per run of values (a None breaks the line), a point per value.
    for k, s in enumerate(series):
        colour = COLOURS[k % len(COLOURS)]
        drawn = sum(v is not None for v in s.values)
        parts.append(f'<g class="xjobs-series" data-series="{escape(s.name, quote=True)}" '
                     f'data-points="{drawn}" stroke="{colour}" fill="{colour}">')
        run: list[str] = []
        for i, value in enumerate([*s.values, None]):
            if value is not None:
                run.append(f"{x(i):.1f},{y(value):.1f}")
            elif run:
                parts.append(f'<polyline points="{" ".join(run)}" fill="none" '
                             f'stroke-width="2" stroke-linejoin="round"/>')
                run = []
        for i, value in enumerate(s.values):
            if value is None:
                continue
            point = f"{s.name}, {labels[i]}: {number_text(value)}{unit}"
            parts.append(f'<circle cx="{x(i):.1f}" cy="{y(value):.1f}" r="2.5" stroke="none">'
                         f"<title>{escape(point)}</title></circle>")
        parts.append("</g>")
    parts.append("</svg>")
    return "".join(parts)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def window_charts(chart: Chart, *, label: Callable[[datetime], str],
                  queues: Sequence[str] | None = None, id_prefix: str = "xjobs-chart",
                  ) -> list[str]:
    """The three charts of a window of counters, one series per queue (``queues``, or every
    queue with counts in the window): throughput, failures, wait time. ``label`` turns a
    bucket's start into its axis text (the page's time zone)."""
    names = list(queues) if queues is not None else sorted(chart.series)
    window = chart.window.name
    per = BUCKET_WORDS[window]
    span = WINDOW_WORDS[window]
    labels = [label(t) for t in chart.starts]
    rows = {q: chart.series.get(q, ()) for q in names}
    n = len(chart.starts)

    def values(q: str, pick: Callable[..., float | None]) -> list[float | None]:
        got = rows[q]
        return [pick(c) for c in got] if got else [0.0] * n

    def totals(get: Callable[[str], str]) -> str:
        if not names:
            return "No queue has counts in this window."
        return "; ".join(f"{q}: {get(q)}" for q in names) + "."

    when = f"{labels[0]} to {labels[-1]}" if labels else ""
    done = [Series(q, values(q, lambda c: float(c.done))) for q in names]
    # Not failed + dead: the run a job dies of is a failed run already (the counters' dead also
    # counts jobs buried by a claim after a lost lease, which ran no failed run).
    failed = [Series(q, values(q, lambda c: float(c.failed))) for q in names]
    wait = [Series(q, [c.mean_wait for c in rows[q]] if rows[q] else [None] * n)
            for q in names]
    return [
        line_chart(
            title=f"Throughput: jobs done per {per}",
            desc=f"Jobs finished successfully per {per} on each queue over {span} ({when}). "
                 + totals(lambda q: f"{chart.total(q).done:,} done"),
            labels=labels, series=done, y_label=f"done / {per}", unit=" done",
            chart_id=f"{id_prefix}-throughput"),
        line_chart(
            title=f"Failures: failed runs per {per}",
            desc=f"Runs that failed (retried later, or the job died of it), per {per} on each "
                 f"queue over {span} ({when}). "
                 + totals(lambda q: f"{chart.total(q).failed:,} failed, "
                                              f"{chart.total(q).dead:,} dead"),
            labels=labels, series=failed, y_label=f"failed / {per}", unit=" failed",
            chart_id=f"{id_prefix}-failures"),
        line_chart(
            title=f"Wait time: mean seconds from due to start, per {per}",
            desc=f"The mean wait of the jobs started in each {per} on each queue over {span} "
                 f"({when}); no point where none started. "
                 + totals(lambda q: _mean_text(chart.total(q).mean_wait)),
            labels=labels, series=wait, y_label="seconds", unit=" s",
            chart_id=f"{id_prefix}-wait"),
    ]


def _mean_text(seconds: float | None) -> str:
    return "no starts" if seconds is None else f"{number_text(seconds)} s on average"
