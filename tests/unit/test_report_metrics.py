"""The report's trend charts per primary metric: a warehouse with tf_cnn_benchmarks (images/sec), nccl_tests (bus
bandwidth, GB/s) and command rows (a p99 latency in ms, lower is better; a token rate) over five nights. Each metric
and unit gets charts of its own, with its unit on the axis and its direction said; the scaling and energy sections
(defined on images/sec) name the metrics they leave out. Read back from the chart specs, the SVG the page embeds,
the PNG's figure, the file report, the UI view and its CSV.
"""

from __future__ import annotations

import csv
import io
import re
import xml.etree.ElementTree as ET

import pytest

from browser.metric_history import (
    BUSBW,
    IMAGES_G1,
    IMAGES_G2,
    LATENCY,
    NIGHTS,
    TOKENS,
    busbw,
    latency,
    store_metric_history,
)

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture()
def engine(data_dir):
    from fleetbench.warehouse import get_engine, upgrade

    eng = get_engine()
    upgrade(eng)
    store_metric_history(eng)
    yield eng
    eng.dispose()


@pytest.fixture()
def report(engine):
    from fleetbench.report import build_report, parse_filters

    return build_report(engine, parse_filters())


def svg_of(svg: str) -> dict:
    """The y-axis label, the title, and series label -> point values of one chart's SVG."""
    root = ET.fromstring(svg)
    texts = list(root.iter(f"{SVG}text"))
    return {"y_label": next(t.text for t in texts if "rotate(-90)" in (t.get("transform") or "")),
            "title": root.get("aria-label"),
            "series": {g.get("data-label"): [float(c.get("data-value")) for c in g.iter(f"{SVG}circle")]
                       for g in root.iter(f"{SVG}g") if g.get("class") == "series"},
            "tooltips": [c.find(f"{SVG}title").text for c in root.iter(f"{SVG}circle")]}


def test_each_metric_and_unit_has_its_own_charts(report):
    from fleetbench.report.plots import charts

    lines = {c.id: c for c in charts(report) if c.kind == "line"}
    assert set(lines) == {IMAGES_G1, IMAGES_G2, BUSBW, LATENCY, TOKENS}
    # the images/sec charts keep their ids, titles and axis
    assert (lines[IMAGES_G1].title, lines[IMAGES_G1].y_label, lines[IMAGES_G1].unit) == (
        "Throughput: resnet50, 1 GPU", "images/sec", "images/s")
    assert {s.label for s in lines[IMAGES_G1].series} == {"h1 · tf.resnet50.bs64.g1.replicated",
                                                          "h2 · tf.resnet50.bs64.g1.replicated"}
    bw = lines[BUSBW]
    assert (bw.metric, bw.unit, bw.better, bw.y_label) == ("avg_busbw", "GB/s", "higher", "GB/s")
    assert bw.title == "avg_busbw: all_reduce, 8 GPUs" and "lower is better" not in bw.title
    assert {s.label: [v for _, v in s.points] for s in bw.series} == {
        f"{h} · nccl.all_reduce.g8": [busbw(h, n) for n in range(NIGHTS)] for h in ("h1", "h2")}
    lat = lines[LATENCY]  # a command case without a model: charted under its benchmark's name
    assert (lat.metric, lat.unit, lat.better) == ("p99_latency", "ms", "lower")
    assert lat.title == "p99_latency: svc, CPU — lower is better" and lat.y_label == "ms (lower is better)"
    assert {s.label: [v for _, v in s.points] for s in lat.series} == {
        "h1 · svc.latency": [latency(n) for n in range(NIGHTS)]}
    assert lines[TOKENS].y_label == "tok/s" and [len(s.points) for s in lines[TOKENS].series] == [NIGHTS]
    # never two units on one axis
    for chart in lines.values():
        units = {s["unit"] for s in report["throughput"]
                 if {f"{s['host']} · {s['case_key']}"} & {x.label for x in chart.series}}
        assert units == {chart.unit}


def test_the_svg_and_png_carry_the_unit_and_the_values(report):
    from fleetbench.report.plots import charts, figure, to_svg

    by_id = {c.id: c for c in charts(report)}
    lat = svg_of(to_svg(by_id[LATENCY]))
    assert lat["y_label"] == "ms (lower is better)" and lat["title"].endswith("lower is better")
    assert lat["series"] == {"h1 · svc.latency": [latency(n) for n in range(NIGHTS)]}
    assert all(t.endswith(" ms") for t in lat["tooltips"])
    bw = svg_of(to_svg(by_id[BUSBW]))
    assert bw["y_label"] == "GB/s" and all(t.endswith(" GB/s") for t in bw["tooltips"])
    assert all(180 <= v <= 190 for values in bw["series"].values() for v in values)  # no images/sec on this axis
    ax = figure(by_id[LATENCY]).axes[0]
    assert ax.get_ylabel() == "ms (lower is better)"
    assert [list(line.get_ydata()) for line in ax.get_lines()] == [[latency(n) for n in range(NIGHTS)]]


def test_scaling_and_energy_stay_on_images_and_name_what_they_leave_out(report):
    assert {(r["model"], r["num_gpus"]) for r in report["scaling"]} == {("resnet50", 2)}
    left = {r["metric"]: r for r in report["left_out"]}
    assert set(left) == {"avg_busbw", "p99_latency", "tokens_per_sec"}
    assert (left["avg_busbw"]["unit"], left["avg_busbw"]["cases"]) == ("GB/s", 2)  # two hosts' case
    assert "bus bandwidth is already normalised" in left["avg_busbw"]["why_scaling"]
    assert "cost and energy per GB are in the latest run's table" in left["avg_busbw"]["why_energy"]
    assert left["p99_latency"]["better"] == "lower"
    assert "does not add up across GPUs" in left["p99_latency"]["why_scaling"]
    assert "does no work" in left["p99_latency"]["why_energy"]
    assert "a team's own rate" in left["tokens_per_sec"]["why_scaling"]
    assert "per 10^6 tok are" in left["tokens_per_sec"]["why_energy"]


def test_the_file_report_and_the_view_show_the_new_charts(engine, report, tmp_path):
    from fastapi.testclient import TestClient

    from fleetbench.report import parse_filters, write_report
    from fleetbench.report.web import create_app

    written = write_report(tmp_path / "out", parse_filters(), engine=engine)
    page = open(written["html"]).read()
    with TestClient(create_app(engine_factory=lambda: engine, readable_dags=lambda: None)) as c:
        view = c.get("/")
        download = c.get("/throughput.csv")
    assert view.status_code == 200 and download.status_code == 200
    for html in (page, view.text):
        svgs = {m.group(1): m.group(0) for m in re.finditer(r'<svg [^>]*id="plot-([^"]+)".*?</svg>', html, re.S)}
        assert {IMAGES_G1, IMAGES_G2, BUSBW, LATENCY, TOKENS} <= set(svgs)
        assert svg_of(svgs[BUSBW])["series"]["h2 · nccl.all_reduce.g8"] == [busbw("h2", n) for n in range(NIGHTS)]
        assert svg_of(svgs[LATENCY])["y_label"] == "ms (lower is better)"
        # the table names each series' metric and direction
        for text in ("avg_busbw [GB/s] ↑", "p99_latency [ms] ↓", "images_per_sec [images/s] ↑"):
            assert f'data-col="metric_text">{text}<' in html
        for section in ("scaling-left-out", "efficiency-left-out"):
            block = re.search(rf'<div class="meta" id="{section}">(.*?)</div>', html, re.S).group(1)
            assert re.findall(r'data-metric="([^"]+)"', block) == ["avg_busbw", "p99_latency", "tokens_per_sec"]
            assert ("already normalised" in block) == (section == "scaling-left-out")
            assert ("does no work" in block) == (section == "efficiency-left-out")
    rows = list(csv.DictReader(io.StringIO(download.text, newline="")))
    bw = [r for r in rows if r["case_key"] == "nccl.all_reduce.g8" and r["host"] == "h1"]
    assert [(r["metric"], r["unit"], r["better"], float(r["value"]), r["images_per_sec"]) for r in bw] == [
        ("avg_busbw", "GB/s", "higher", busbw("h1", n), "") for n in range(NIGHTS)]
    images = [r for r in rows if r["metric"] == "images_per_sec"]
    assert len(images) == 4 * NIGHTS and all(r["value"] == r["images_per_sec"] for r in images)


def test_the_fleet_trend_says_which_results_it_leaves_out(engine):
    """Past the per-host limit the trend is the rollup's fleet median images/sec: the other metrics' results are
    counted in a note, and a host filter shows them again."""
    from fleetbench.report import build_report, parse_filters
    from fleetbench.report.plots import charts

    fleet = build_report(engine, parse_filters(), max_series=2)
    assert fleet["throughput_mode"] == "fleet"
    assert {c.id for c in charts(fleet) if c.kind == "line"} == {IMAGES_G1, IMAGES_G2}
    assert fleet["fleet_other_results"] == 4 * NIGHTS  # two NCCL cases, a latency and a token rate a night
    assert any(n.startswith(f"Throughput across the fleet is images/sec only: {4 * NIGHTS} ok results")
               for n in fleet["notes"])
    one = build_report(engine, parse_filters(host="h2"), max_series=2)
    assert one["throughput_mode"] == "hosts"
    assert {c.id for c in charts(one) if c.kind == "line"} == {IMAGES_G1, IMAGES_G2, BUSBW}


def test_every_metric_counts_towards_the_per_host_limit(engine):
    """The per-host series stay bounded by all ok results, not only the images/sec ones the rollup counts: an NCCL
    fleet past the limit is not read result by result, and its report says where its figures are."""
    from fleetbench.report import build_report, parse_filters

    images = 4 * NIGHTS  # 20 images/sec points, 40 ok results in all
    assert build_report(engine, parse_filters(), max_points=2 * images)["throughput_mode"] == "hosts"
    assert build_report(engine, parse_filters(), max_points=images + 5)["throughput_mode"] == "fleet"
    nccl = build_report(engine, parse_filters(model="all_reduce"), max_points=5)
    assert (nccl["throughput_mode"], nccl["throughput"], nccl["fleet_other_results"]) == ("fleet", [], 2 * NIGHTS)
    assert [n for n in nccl["notes"] if "throughput" in n.lower()] == [
        f"Throughput across the fleet is images/sec only: {2 * NIGHTS} ok results with another primary metric (a "
        "bandwidth, a latency, a command's own metric) are not in these charts. Filter by host to see them, one chart "
        "per metric and unit."]
