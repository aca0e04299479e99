"""The report keeps MIG instances and multi-node cases apart from whole GPUs of the same count: scaling rows and
throughput charts of their own (fleet mode reads run_case_rollup's mig_profile and nodes, revision 0021)."""

from __future__ import annotations

import pytest

from fleetbench.report import build_report
from fleetbench.report.plots import scaling_chart, throughput_charts
from fleetbench.report.queries import Filters
from fleetbench.warehouse import get_engine, store_run, upgrade
from warehouse_rows import result_row, run_row


@pytest.fixture()
def engine(tmp_path):
    engine = get_engine(f"sqlite:///{tmp_path}/w.db")
    upgrade(engine)
    store_run(engine, run_row("r1"), [], [
        result_row("tf.resnet50.g1", ips=100.0),
        result_row("tf.resnet50.g2", num_gpus=2, ips=190.0, speedup_efficiency=0.95),
        result_row("tf.resnet50.g1.mig1g.10gb", mig_profile="1g.10gb", ips=20.0),
        result_row("tf.resnet50.g2.mig1g.10gb", num_gpus=2, mig_profile="1g.10gb", ips=20.0, speedup_efficiency=0.5),
        result_row("tf.resnet50.g2.n2.h1+h2", num_gpus=2, nodes=2, host_set="h1+h2", ips=360.0)])
    yield engine
    engine.dispose()


@pytest.mark.parametrize("host", [None, "h1"])  # the fleet's (rollups) and one host's (results)
def test_mig_and_multinode_cases_are_not_whole_gpus_of_their_count(engine, host):
    report = build_report(engine, Filters(host=host))
    got = {(r["model"], r["num_gpus"], r["mig_profile"]): (r["mean"], r["n"], r["hosts"]) for r in report["scaling"]}
    assert got == {("resnet50", 2, None): (0.95, 1, 1), ("resnet50", 2, "1g.10gb"): (0.5, 1, 1)}
    bars = scaling_chart(report)
    assert {s.label: s.values for s in bars.series} == {"resnet50": [0.95], "resnet50 · MIG 1g.10gb": [0.5]}
    charts = {c.id: (c.title, sorted(s.label.split(" · ")[-1] if host else s.label for s in c.series))
              for c in throughput_charts(report)}
    assert {i: t for i, (t, _) in charts.items()} == {
        "throughput-resnet50_g1": "Throughput: resnet50, 1 GPU",
        "throughput-resnet50_g2": "Throughput: resnet50, 2 GPUs",
        "throughput-resnet50_g1_mig_1g.10gb": "Throughput: resnet50, 1 × 1g.10gb",
        "throughput-resnet50_g2_mig_1g.10gb": "Throughput: resnet50, 2 × 1g.10gb",
        "throughput-resnet50_g2_n2": "Throughput: resnet50, 2 GPUs × 2 nodes"}
    assert all(len(series) == 1 for _, series in charts.values())


def test_the_fleets_series_carry_their_mig_profile_and_nodes(engine):
    """At fleet scale the charts are drawn from run_case_rollup: its rows say the profile and nodes."""
    from fleetbench.report.queries import fleet_throughput

    with engine.connect() as conn:
        series = fleet_throughput(conn, Filters())
    assert {s["case_key"]: (s["num_gpus"], s["mig_profile"], s["nodes"]) for s in series} == {
        "tf.resnet50.g1": (1, None, 1), "tf.resnet50.g2": (2, None, 1), "tf.resnet50.g1.mig1g.10gb": (1, "1g.10gb", 1),
        "tf.resnet50.g2.mig1g.10gb": (2, "1g.10gb", 1), "tf.resnet50.g2.n2.h1+h2": (2, None, 2)}
    assert len(throughput_charts({"throughput": series, "throughput_mode": "fleet", "driver_changes": []})) == 5


@pytest.mark.parametrize("window", [{}, {"since": "2026-12-01", "until": "2027-01-01"}, {"since": "2026-11-30"}])
def test_a_host_that_scaled_only_on_mig_instances_is_not_a_whole_gpu_host(tmp_path, window):
    """The fleet's whole-GPU scaling row counts its hosts from the rollups' GPU-count masks (per night, and per
    month for whole months): a host whose only N-instance efficiency is on MIG instances is not one of them."""
    from fleetbench.report.queries import parse_filters

    engine = get_engine(f"sqlite:///{tmp_path}/w.db")
    upgrade(engine)
    store_run(engine, run_row("r1"), [], [
        result_row("tf.resnet50.g1", ips=100.0),
        result_row("tf.resnet50.g2", num_gpus=2, ips=190.0, speedup_efficiency=0.95),
        result_row("tf.resnet50.g1.mig1g.10gb", host="h2", mig_profile="1g.10gb", ips=20.0),
        result_row("tf.resnet50.g2.mig1g.10gb", host="h2", num_gpus=2, mig_profile="1g.10gb", ips=38.0,
                   speedup_efficiency=0.95)])
    report = build_report(engine, parse_filters(**window))
    got = {(r["num_gpus"], r["mig_profile"]): (r["n"], r["hosts"]) for r in report["scaling"]}
    assert got == {(2, None): (1, 1), (2, "1g.10gb"): (1, 1)}
    engine.dispose()
