"""The console's SVG charts (django_xjobs/console/charts.py): well-formed XML a browser can
draw, one point per bucket, readable without the picture, and no markup smuggled in through a
name."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta

import pytest

from django_xjobs.console import charts
from django_xjobs.counters import WINDOWS, Chart
from django_xjobs.records import Counters

SVG = "{http://www.w3.org/2000/svg}"


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    return root


def points(root: ET.Element, series: str | None = None) -> list[ET.Element]:
    groups = [g for g in root.iter(f"{SVG}g") if g.get("class") == "xjobs-series"
              and (series is None or g.get("data-series") == series)]
    return [c for g in groups for c in g.iter(f"{SVG}circle")]


def polyline_points(root: ET.Element) -> list[tuple[float, float]]:
    return [tuple(map(float, p.split(","))) for line in root.iter(f"{SVG}polyline")
            for p in line.get("points", "").split()]


def chart(values: list[float | None], *, name: str = "default", **kw) -> str:
    labels = [f"{i:02d}:00" for i in range(len(values))]
    return charts.line_chart(title="Throughput", desc="Jobs done per minute.", labels=labels,
                             series=[charts.Series(name, values)], y_label="done / minute",
                             chart_id="c", **kw)


def test_a_chart_is_xml_with_a_title_a_description_and_a_point_per_bucket():
    root = parse(chart([1, 4, 0, 9, 2]))
    assert root.get("role") == "img"
    assert root.get("aria-labelledby") == "c-title c-desc"
    assert root.find(f"{SVG}title").text == "Throughput"
    assert root.find(f"{SVG}desc").text == "Jobs done per minute."
    assert len(points(root)) == 5
    assert len(polyline_points(root)) == 5
    assert root.get("data-buckets") == "5"
    # Bigger values are drawn higher (SVG's y grows downwards); each point says its value.
    ys = [float(c.get("cy")) for c in points(root)]
    assert ys[3] < ys[1] < ys[4] < ys[0] < ys[2]
    assert [c.find(f"{SVG}title").text for c in points(root)][3] == "default, 03:00: 9"
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert "done / minute" in texts and "default" in texts  # the y axis label, the legend


def test_the_y_axis_ends_on_a_round_number_above_the_largest_value():
    texts = [t.text for t in parse(chart([3, 7, 9])).iter(f"{SVG}text")]
    assert {"0", "2", "4", "6", "8", "10"} <= set(texts)
    texts = [t.text for t in parse(chart([1, 4])).iter(f"{SVG}text")]
    assert {"0", "1", "2", "3", "4", "5"} <= set(texts) and "1.25" not in texts
    texts = [t.text for t in parse(chart([1, 2])).iter(f"{SVG}text")]
    assert {"0", "0.5", "1", "1.5", "2"} <= set(texts)
    assert charts.nice_ceiling(0.0) == 1.0
    assert charts.nice_ceiling(9) == 10 and charts.nice_ceiling(11) == 20
    assert charts.nice_ceiling(0.3) == pytest.approx(0.5)
    assert charts.number_text(1500) == "1.5k" and charts.number_text(2.5) == "2.5"


def test_all_zero_data_draws_a_flat_line_on_the_axis():
    root = parse(chart([0, 0, 0, 0]))
    ys = {float(c.get("cy")) for c in points(root)}
    assert len(points(root)) == 4 and len(ys) == 1
    bottom = max(float(line.get("y1")) for line in root.iter(f"{SVG}line"))
    assert ys == {bottom}


def test_a_single_bucket_is_one_point_inside_the_plot():
    root = parse(chart([5]))
    (point,) = points(root)
    x = float(point.get("cx"))
    assert charts.LEFT < x < charts.WIDTH - charts.RIGHT


def test_a_missing_value_breaks_the_line_and_draws_no_point():
    root = parse(chart([1, None, 3, 4]))
    assert len(points(root)) == 3
    lines = list(root.iter(f"{SVG}polyline"))
    assert [len(line.get("points").split()) for line in lines] == [1, 2]


def test_names_and_labels_are_escaped():
    name = '<script>alert("x")</script> & "q"'
    svg = chart([1, 2], name=name)
    assert "<script>" not in svg
    root = parse(svg)
    (group,) = [g for g in root.iter(f"{SVG}g") if g.get("class") == "xjobs-series"]
    assert group.get("data-series") == name  # the attribute round-trips through escaping
    assert points(root)[0].find(f"{SVG}title").text == f"{name}, 00:00: 1"
    assert '<script>alert("x")</script>…' in [t.text for t in root.iter(f"{SVG}text")]


def test_a_series_of_the_wrong_length_is_refused():
    with pytest.raises(ValueError, match="3 values for 2 buckets"):
        charts.line_chart(title="t", desc="d", labels=["a", "b"],
                          series=[charts.Series("q", [1, 2, 3])], y_label="y", chart_id="c")


def test_the_window_charts_show_throughput_failures_and_wait_per_queue():
    window = WINDOWS["hour"]
    start = datetime(2026, 12, 4, 15, 0, tzinfo=UTC)
    starts = tuple(start + window.step * i for i in range(window.buckets))
    zero = Counters(queue="mail")
    mail = [zero] * window.buckets
    mail[10] = Counters(queue="mail", done=7, failed=2, dead=1, started=4, wait_ms_sum=6_000)
    mail[20] = Counters(queue="mail", done=3)
    data = Chart(window=window, starts=starts, series={"mail": tuple(mail),
                                                       "empty-q": (zero,) * window.buckets})
    throughput, failures, wait = (
        parse(svg) for svg in charts.window_charts(data, label=lambda t: t.strftime("%H:%M")))
    assert [c.find(f"{SVG}title").text for c in points(throughput, "mail")][10] == (
        "mail, 15:10: 7 done")
    assert len(points(throughput, "mail")) == window.buckets
    assert [c.find(f"{SVG}title").text for c in points(failures, "mail")][10] == (
        "mail, 15:10: 2 failed")
    # The mean wait is drawn only where jobs started: 6 s over 4 starts.
    (waited,) = points(wait, "mail")
    assert waited.find(f"{SVG}title").text == "mail, 15:10: 1.5 s"
    assert "mail: 10 done" in throughput.find(f"{SVG}desc").text
    assert "15:00 to 15:59" in throughput.find(f"{SVG}desc").text


def test_the_window_charts_of_a_queue_without_counts_are_flat_not_missing():
    window = WINDOWS["day"]
    start = datetime(2026, 12, 4, tzinfo=UTC)
    data = Chart(window=window, starts=tuple(start + timedelta(hours=i) for i in range(24)),
                 series={})
    throughput, _failures, wait = (parse(svg) for svg in charts.window_charts(
        data, label=lambda t: t.strftime("%H:%M"), queues=["idle"]))
    assert len(points(throughput, "idle")) == 24
    assert points(wait, "idle") == []
