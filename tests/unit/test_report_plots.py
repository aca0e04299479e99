"""The per-host throughput charts: one chart per model and device count, on an axis that fits the values, so a
drop on one host shows. Read back from the SVG the report embeds and from the figure its PNG is drawn from.

Two hosts run resnet50 on 1 GPU (~400 images/sec) and on 8 GPUs (~3,000), and a CPU case, for five nights;
on the last night h2's 1-GPU case loses 10 %.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import datetime, timedelta, timezone

import pytest

from warehouse_rows import result_row, run_row

NIGHT0 = datetime(2026, 11, 1, 2, 0, tzinfo=timezone.utc)
WOBBLE = [0.0, 0.5, -0.5, 0.3, -0.2]
SVG = "{http://www.w3.org/2000/svg}"


def ips(host: str, gpus: int, night: int) -> float:
    base = {0: 50.0, 1: 400.0, 8: 3000.0}[gpus] * (1 + WOBBLE[night] / 100) + (5.0 if host == "h2" else 0.0)
    return base * 0.9 if (host, gpus, night) == ("h2", 1, 4) else base


@pytest.fixture()
def report(data_dir):
    from fleetbench.report import build_report, parse_filters
    from fleetbench.warehouse import get_engine, store_run, upgrade

    engine = get_engine()
    upgrade(engine)
    for night in range(5):
        when = (NIGHT0 + timedelta(days=night)).isoformat()
        run_id = f"scheduled__{when}"
        rows = [result_row(f"tf.resnet50.bs64.g{g}.replicated", run_id=run_id, host=host, ips=ips(host, g, night),
                           logical_date=when, num_gpus=g, batch_size_global=64 * g)
                for host in ("h1", "h2") for g in (1, 8)]
        rows.append(result_row("cpu.trivial.bs8", run_id=run_id, host="h1", ips=ips("h1", 0, night),
                               logical_date=when, model="trivial", num_gpus=0, device="cpu"))
        store_run(engine, {**run_row(run_id), "logical_date": when}, [], rows)
    yield build_report(engine, parse_filters())
    engine.dispose()


def svg_points(svg: str) -> tuple[dict[str, list[tuple[float, float]]], list[float], tuple[float, float]]:
    """(series label -> [(value, cy)], the y tick values, (y of the axis' bottom, y of its top))."""
    root = ET.fromstring(svg)
    series = {g.get("data-label"): [(float(c.get("data-value")), float(c.get("cy"))) for c in g.iter(f"{SVG}circle")]
              for g in root.iter(f"{SVG}g") if g.get("class") == "series"}
    ticks = [float(t.text.replace(",", "")) for t in root.iter(f"{SVG}text") if t.get("text-anchor") == "end"
             and t.text and t.text.replace(",", "").replace(".", "").isdigit()]
    grid = sorted(float(line.get("y1")) for line in root.iter(f"{SVG}line") if line.get("stroke") == "#e5e5e5")
    return series, ticks, (grid[-1], grid[0])


def test_each_device_count_has_its_own_chart(report):
    from fleetbench.report.plots import charts

    lines = {c.id: c for c in charts(report) if c.kind == "line"}
    assert set(lines) == {"throughput-resnet50_g1", "throughput-resnet50_g8", "throughput-trivial"}
    assert lines["throughput-resnet50_g1"].title == "Throughput: resnet50, 1 GPU"
    assert lines["throughput-resnet50_g8"].title == "Throughput: resnet50, 8 GPUs"
    assert lines["throughput-trivial"].title == "Throughput: trivial, CPU"
    assert {s.label for s in lines["throughput-resnet50_g1"].series} == {
        "h1 · tf.resnet50.bs64.g1.replicated", "h2 · tf.resnet50.bs64.g1.replicated"}
    assert {s.label for s in lines["throughput-resnet50_g8"].series} == {
        "h1 · tf.resnet50.bs64.g8.replicated", "h2 · tf.resnet50.bs64.g8.replicated"}


def test_the_svg_axis_fits_the_values_and_a_drop_spans_the_plot(report):
    from fleetbench.report.plots import charts, to_svg

    by_id = {c.id: c for c in charts(report)}
    series, ticks, (bottom, top) = svg_points(to_svg(by_id["throughput-resnet50_g1"]))
    values = [v for pts in series.values() for v, _ in pts]
    assert all(350 < v < 420 for v in values)  # no 8-GPU value on the 1-GPU chart
    assert 0 < ticks[0] <= min(values) and max(values) <= ticks[-1] < 500  # not 0-based: it fits the values
    h2 = series["h2 · tf.resnet50.bs64.g1.replicated"]
    drop_px = h2[-1][1] - h2[-2][1]  # y grows downwards
    assert drop_px > 0.3 * (bottom - top)  # -10 % is a third of the plot or more (0-based: a tenth)
    # each point sits where its value is on the axis
    for v, cy in (p for pts in series.values() for p in pts):
        assert cy == pytest.approx(bottom - (v - ticks[0]) / (ticks[-1] - ticks[0]) * (bottom - top), abs=0.1)
    series8, ticks8, _ = svg_points(to_svg(by_id["throughput-resnet50_g8"]))
    assert all(2900 < v < 3100 for pts in series8.values() for v, _ in pts) and 0 < ticks8[0] < 3000


def test_the_png_figure_has_the_same_axis(report):
    from fleetbench.report.plots import charts, figure, y_range

    chart = next(c for c in charts(report) if c.id == "throughput-resnet50_g1")
    ax = figure(chart).axes[0]
    values = [v for s in chart.series for _, v in s.points]
    assert ax.get_ylim() == pytest.approx(y_range(chart, values))
    assert 0 < ax.get_ylim()[0] < min(values) and max(values) < ax.get_ylim()[1] < 500
    assert {line.get_label() for line in ax.get_lines()} == {s.label for s in chart.series}


def test_bars_and_values_near_zero_keep_a_zero_based_axis():
    from fleetbench.report.plots import BarChart, LineChart, Series, y_range

    bar = BarChart(id="b", title="b", y_label="x", categories=["a"], series=[Series("s", values=[5.0])])
    assert y_range(bar, [5.0, 6.0]) == (0.0, 6.0)
    line = LineChart(id="l", title="l", y_label="x", series=[])
    assert y_range(line, [0.5, 100.0]) == (0.0, pytest.approx(109.95))  # padding never goes below 0
    assert y_range(line, [400.0]) == (360.0, 440.0)  # one value: +-10 %
    assert y_range(line, [-5.0, 5.0]) == (-6.0, 6.0)
