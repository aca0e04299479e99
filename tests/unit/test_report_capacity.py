"""The report's capacity section: per profile a memory-vs-batch plot (points, fitted line, OOMs, misses) and
a table; only the DAGs the reader may see."""

from __future__ import annotations

import re

from fleetbench.report import Filters, build_report, write_report
from fleetbench.report.plots import capacity_charts, to_svg
from fleetbench.warehouse import get_engine, store_run, upgrade
from warehouse_rows import result_row, run_row


def cpu_row(batch: int, mem: float | None, status: str = "ok", **extra) -> dict:
    return result_row(f"smoke.trivial.bs{batch}.g0.parameter_server", model="trivial", device="cpu", num_gpus=0,
                      batch_size_per_device=batch, batch_size_global=batch, peak_mem_mib=mem, status=status,
                      ips=100.0 if status == "ok" else None, capacity_mib=256.0,
                      failure_class=None if status == "ok" else "oom_killed", **extra)


def warehouse(tmp_path):
    engine = get_engine(f"sqlite:///{tmp_path}/w.db")
    upgrade(engine)
    rows = [cpu_row(b, 18.0 + 0.035 * b) for b in (2048, 3072, 4096, 5120)]
    rows.append(cpu_row(8192, None, status="failed", predicted_mem_mib=200.0, capacity_note="fits: 200 +- 4 MiB"))
    store_run(engine, run_row("r1"), [], rows, [])
    other = {**run_row("r2"), "dag_id": "secret_dag"}
    store_run(engine, other, [], [dict(result_row("x", run_id="r2", model="vgg16", peak_gpu_mem_mib=9000.0),
                                       dag_id="secret_dag")], [])
    return engine


def test_capacity_section_plots_points_fit_ooms_and_misses(tmp_path):
    engine = warehouse(tmp_path)
    written = write_report(tmp_path / "out", engine=engine)
    html = (tmp_path / "out" / "report.html").read_text()
    assert "<h2>Capacity: peak memory per batch</h2>" in html and 'id="capacity-table"' in html
    svg = re.search(r'<svg[^>]*id="plot-capacity-trivial[^"]*".*?</svg>', html, re.S).group(0)
    oks = re.findall(r'data-label="ok: peak memory">(.*?)</g>', svg, re.S)[0]
    assert sorted(float(v) for v in re.findall(r'data-value="([^"]+)"', oks)) == [
        18.0 + 0.035 * b for b in (2048, 3072, 4096, 5120)]
    assert 'data-label="OOM (at the memory it had)"' in svg and 'data-x="8192.0"' in svg
    assert 'data-label="miss: predicted to fit, died of OOM"' in svg and 'class="fit"' in svg
    assert "batch 8192 with 256 MiB" in html
    assert any(p.endswith(".png") and "capacity-trivial" in p for p in written["plots"])


def test_capacity_section_reads_only_the_dags_the_reader_may_see(tmp_path):
    engine = warehouse(tmp_path)
    everything = build_report(engine)
    assert {p["model"] for p in everything["capacity"]} == {"trivial", "vgg16"}
    mine = build_report(engine, Filters(dag_ids=frozenset({"fleet_benchmark"})))
    assert [p["model"] for p in mine["capacity"]] == ["trivial"]
    (chart,) = capacity_charts(mine)
    assert chart.lines[0].label.startswith("fit: 18.0 + 0.035 × batch")
    assert to_svg(chart).count('class="point"') == 6  # 4 ok points, 1 OOM, 1 miss


def test_capacity_of_a_warehouse_before_the_capacity_revision_is_empty(tmp_path):
    from fleetbench.report.queries import capacity

    engine = get_engine(f"sqlite:///{tmp_path}/w.db")
    upgrade(engine, "0004")  # capacity_features has no capacity columns yet
    with engine.connect() as conn:
        assert capacity(conn, Filters()) == []
        assert conn.exec_driver_sql("SELECT COUNT(*) FROM benchmark_results").scalar() == 0  # still usable


def test_capacity_section_fits_with_the_fleets_capacity_settings(tmp_path):
    """The report's profiles use the run's `fleet.capacity` (as the plan does), not the defaults: a fleet that
    needs 5 points gets no line from 4, and its margin sets the largest batch that fits."""
    from fleetbench.capacity import Settings

    engine = warehouse(tmp_path)
    default = next(p for p in build_report(engine)["capacity"] if p["model"] == "trivial")
    assert default["slope_mib_per_sample"] == 0.035 and default["margin_pct"] == 10.0
    strict = next(p for p in build_report(engine, capacity_settings=Settings(min_points=5))["capacity"]
                  if p["model"] == "trivial")
    assert strict["slope_mib_per_sample"] is None and strict["reason"] == "4 usable point(s), fewer than min_points 5"
    wide = next(p for p in build_report(engine, capacity_settings=Settings(margin_pct=30.0))["capacity"]
                if p["model"] == "trivial")
    assert wide["margin_pct"] == 30.0 and wide["fits"][0]["largest_batch"] < default["fits"][0]["largest_batch"]


def test_torch_synthetic_eager_and_compiled_profiles_each_have_their_plot_and_row(tmp_path):
    engine = get_engine(f"sqlite:///{tmp_path}/w.db")
    upgrade(engine)
    store_run(engine, run_row("r1"), [], [
        result_row(f"pt.resnet50.bs{b}.g1.bf16.nchw.{mode}", batch_size_per_device=b, harness="torch_synthetic",
                   precision="bf16", peak_gpu_mem_mib=base + slope * b,
                   command=["python", "torch_synthetic.py", f"--compile={int(mode == 'compiled')}"])
        for mode, base, slope in (("eager", 1500.0, 160.0), ("compiled", 1000.0, 94.0)) for b in (64, 128, 256)], [])
    report = build_report(engine)
    assert {(p["variant"], p["slope_mib_per_sample"]) for p in report["capacity"]} == {
        ("channels_last=0,compile=0", 160.0), ("channels_last=0,compile=1", 94.0)}
    assert len({c.id for c in capacity_charts(report)}) == 2
    write_report(tmp_path / "out", engine=engine)
    html = (tmp_path / "out" / "report.html").read_text()
    assert "resnet50 · bf16 · gpu · torch_synthetic · channels_last=0,compile=1" in html


def test_two_benchmarks_of_one_model_each_have_their_plot_and_row(tmp_path):
    """Profiles are per benchmark: a training and an inference benchmark of resnet50 shared one chart id, so one plot
    file overwrote the other and both table rows read the same."""
    engine = get_engine(f"sqlite:///{tmp_path}/w.db")
    upgrade(engine)
    store_run(engine, run_row("r1"), [], [
        result_row(f"{bench}.resnet50.bs{b}.g1.replicated", benchmark=bench, batch_size_per_device=b,
                   peak_gpu_mem_mib=base + slope * b)
        for bench, base, slope in (("train", 1000.0, 60.0), ("infer", 500.0, 15.0)) for b in (64, 128, 256)], [])
    report = build_report(engine)
    assert {(p["benchmark"], p["slope_mib_per_sample"]) for p in report["capacity"]} == {("train", 60.0),
                                                                                         ("infer", 15.0)}
    assert len({c.id for c in capacity_charts(report)}) == 2
    written = write_report(tmp_path / "out", engine=engine, plot_format="svg")
    assert len([p for p in written["plots"] if "capacity-resnet50" in p]) == 2
    html = (tmp_path / "out" / "report.html").read_text()
    assert "resnet50 · fp32 · gpu · tf_cnn_benchmarks · train" in html and "· infer</td>" in html


def test_the_cli_report_and_the_view_show_the_capacity_the_dags_report_shows(tmp_path, monkeypatch, capsys):
    """`fleetbench report` and the UI view fit with the fleet config's `fleet.capacity`, as the DAG's report task
    does (`settings_of` of the run's fleet settings), and the table's header names the margin it kept free."""
    from fastapi.testclient import TestClient

    from fleetbench.capacity import Settings
    from fleetbench.cli import main
    from fleetbench.paths import PROJECT_ROOT
    from fleetbench.report.web import create_app

    engine = warehouse(tmp_path)
    config = tmp_path / "fleet.yaml"
    config.write_text((PROJECT_ROOT / "include" / "config" / "fleet.yaml").read_text().replace(
        "fleet:\n", "fleet:\n  capacity: {margin_pct: 30}\n", 1))
    monkeypatch.setenv("FLEETBENCH_CONFIG", str(config))
    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", str(engine.url))
    fits = re.compile(r"largest batch that fits \(memory less (\d+) %\).*?256 MiB: (\d+)", re.S)
    write_report(tmp_path / "dag", engine=engine, capacity_settings=Settings(margin_pct=30.0))
    dag = fits.search((tmp_path / "dag" / "report.html").read_text()).groups()
    assert dag[0] == "30"
    assert main(["report", "--out", str(tmp_path / "cli")]) == 0
    capsys.readouterr()
    assert fits.search((tmp_path / "cli" / "report.html").read_text()).groups() == dag
    page = TestClient(create_app(engine_factory=lambda: engine)).get("/")
    assert page.status_code == 200 and fits.search(page.text).groups() == dag
    default = build_report(engine)
    assert [f["largest_batch"] for p in default["capacity"] if p["model"] == "trivial"
            for f in p["fits"]] != [int(dag[1])]  # the defaults (10 %) would say otherwise
