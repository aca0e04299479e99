"""CPU cases' energy and cost: RAPL counters (a fake powercap tree), the wrapper's CPU time, the TDP estimate."""

from __future__ import annotations

import json
import os
import statistics
import sys

import pytest

from fleetbench import measure
from fleetbench.metrics import DEFAULT_CPU_W_PER_THREAD, MetricSettings, cpu_tdp_w, derive, estimated_cpu_power_w
from fleetbench.telemetry import rapl
from fleetbench.telemetry import wrapper as tw
from fleetbench.telemetry.report import clean_report

MAX_RANGE = 262143328850  # max_energy_range_uj of a real Xeon package zone


def zone(root, name: str, label: str, energy_uj, max_range=MAX_RANGE):
    d = root / name
    d.mkdir(parents=True)
    (d / "name").write_text(label + "\n")
    (d / "energy_uj").write_text(f"{energy_uj}\n")
    (d / "max_energy_range_uj").write_text(f"{max_range}\n")
    return d


def set_uj(d, value: int) -> None:
    (d / "energy_uj").write_text(f"{value}\n")


@pytest.fixture
def powercap(tmp_path):
    """Two packages, a core sub-zone, a dram sub-zone and psys, laid out as Linux's powercap class has them."""
    root = tmp_path / "powercap"
    zones = {"pkg0": zone(root, "intel-rapl:0", "package-0", 1_000_000),
             "pkg1": zone(root, "intel-rapl:1", "package-1", MAX_RANGE - 2_000_000),
             "core": zone(root, "intel-rapl:0:0", "core", 500),
             "dram": zone(root, "intel-rapl:0:1", "dram", 700),
             "psys": zone(root, "intel-rapl:2", "psys", 900)}
    (root / "intel-rapl").mkdir()  # the control type's own folder: no counter
    return root, zones


def test_rapl_sums_the_packages_and_corrects_a_wrap(powercap):
    root, zones = powercap
    meter = rapl.RaplMeter.start(root, background=False)
    assert [z.name for z in meter.zones] == ["package-0", "package-1"]
    set_uj(zones["pkg0"], 31_000_000)  # +30 J
    set_uj(zones["pkg1"], 3_000_000)  # wrapped: 2 J to the top of the range, then 3 J
    for other in ("core", "dram", "psys"):
        set_uj(zones[other], 10**12 % MAX_RANGE)  # sub-zones and the platform are not counted
    out = meter.stop()
    assert out == {"energy_j": pytest.approx(35.0), "zones": ["package-0", "package-1"], "wraps": 1}
    assert meter.stop()["energy_j"] == pytest.approx(35.0)  # a second stop reads nothing new


def test_rapl_sampling_counts_one_wrap_per_interval(powercap):
    root, zones = powercap
    meter = rapl.RaplMeter.start(root, background=False)
    total = 0
    for step in range(1, 4):  # three intervals of 0.7 x the range each: two wraps on package-0
        value = (1_000_000 + step * int(MAX_RANGE * 0.7)) % MAX_RANGE
        set_uj(zones["pkg0"], value)
        meter.sample()
        total += int(MAX_RANGE * 0.7)
    out = meter.stop()
    assert out["wraps"] == 2 and out["energy_j"] == pytest.approx(total / 1e6)


def test_counter_delta():
    assert rapl.counter_delta(10, 25, 100) == (15, False)
    assert rapl.counter_delta(90, 5, 100) == (15, True)


def test_rapl_unavailable_says_why(tmp_path, powercap):
    with pytest.raises(rapl.RaplUnavailable, match="does not exist"):
        rapl.package_zones(tmp_path / "nowhere")
    root, zones = powercap
    for d in (zones["pkg0"], zones["pkg1"]):  # energy_uj that cannot be read (as for non-root since Linux 5.10)
        (d / "energy_uj").unlink()
        (d / "energy_uj").mkdir()
    with pytest.raises(rapl.RaplUnavailable, match=r"no readable RAPL package counter.*energy_uj: Is a directory"):
        rapl.package_zones(root)
    empty = tmp_path / "empty"
    zone(empty, "intel-rapl:0", "psys", 1)
    with pytest.raises(rapl.RaplUnavailable, match="no intel-rapl package zone"):
        rapl.RaplMeter.start(empty)


def test_rapl_background_thread_samples_until_stopped(powercap):
    root, zones = powercap
    meter = rapl.RaplMeter.start(root, period_s=0.01)
    set_uj(zones["pkg0"], 2_000_000)
    out = meter.stop()
    assert out["energy_j"] == pytest.approx(1.0) and not meter._thread.is_alive()


def test_operator_falls_back_with_a_reason(tmp_path, monkeypatch, powercap):
    """BenchmarkCaseOperator reads RAPL only for a CPU case on this machine's engine, and says why not otherwise."""
    from fleetbench.airflow.operators import BenchmarkCaseOperator

    def op(**kw):
        return BenchmarkCaseOperator(task_id="t", image="x", case={"host": "h", "case_key": "k"}, **kw)

    outcome = {}
    monkeypatch.setattr(rapl, "POWERCAP", tmp_path / "no-powercap")
    assert op(docker_url="unix:///var/run/docker.sock")._rapl_start(outcome) is None
    assert "does not exist" in outcome["rapl"]["reason"]
    outcome = {}
    assert op(docker_url="tcp://gpu-01:2376")._rapl_start(outcome) is None
    assert "on another machine" in outcome["rapl"]["reason"]
    outcome = {}
    assert op(docker_url="unix:///var/run/docker.sock", num_gpus=1)._rapl_start(outcome) is None and outcome == {}
    root, zones = powercap
    monkeypatch.setattr(rapl, "POWERCAP", root)
    meter = op(docker_url="unix:///var/run/docker.sock")._rapl_start(outcome)
    set_uj(zones["pkg0"], 5_000_000)
    assert meter.stop()["energy_j"] == pytest.approx(4.0)


# -- the wrapper's CPU time -------------------------------------------------------------------------
def test_cpu_meter_reads_the_cgroup(tmp_path):
    v2 = tmp_path / "cpu.stat"
    v2.write_text("usage_usec 1000000\nuser_usec 800000\nsystem_usec 200000\n")
    v1 = tmp_path / "cpuacct.usage"
    v1.write_text("5000000000\n")
    ticks = iter([10.0, 14.0])
    meter = tw.CpuMeter(clock=lambda: next(ticks), files=((str(v2), "usage_usec", 1e-6), (str(v1), None, 1e-9)))
    v2.write_text("usage_usec 7000000\nuser_usec 6000000\nsystem_usec 1000000\n")
    out = meter.stop()
    assert (out["usage_s"], out["wall_s"], out["source"], out["path"]) == (6.0, 4.0, "cgroup", str(v2))
    assert out["count"] == os.cpu_count()
    v2.unlink()  # cgroup v1 only
    meter = tw.CpuMeter(files=((str(v2), "usage_usec", 1e-6), (str(v1), None, 1e-9)))
    v1.write_text("7500000000\n")
    assert meter.stop()["usage_s"] == pytest.approx(2.5)


def test_cpu_meter_without_a_cgroup_counts_the_children(tmp_path, capfd):
    code = tw.run([sys.executable, "-c", "sum(i * i for i in range(3_000_000))"], 0.5, gpu=False)
    assert code == 0
    # the real cgroup here is the whole machine's: the test only asks what a missing one gives
    meter = tw.CpuMeter(files=((str(tmp_path / "none"), "usage_usec", 1e-6),))
    out = meter.stop()
    assert out["source"] == "rusage" and out["usage_s"] > 0.05  # the child above ran a while
    report = tw.parse_report(capfd.readouterr().out)
    assert report["nvml"] is False and report["reason"] == "a CPU case: GPUs not sampled"
    assert report["cpu"]["usage_s"] > 0


def test_cpu_info(tmp_path):
    info = tmp_path / "cpuinfo"
    cpu = "processor\t: {n}\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz\n" \
          "physical id\t: {s}\n\n"
    info.write_text("".join(cpu.format(n=n, s=n // 2) for n in range(4)))  # 2 sockets, 2 threads each
    assert tw.cpu_info(str(info)) == ("Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz", 2)
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC\n")  # a VM that hides the model and the sockets
    assert tw.cpu_info(str(info)) == ("AMD EPYC", None)
    assert tw.cpu_info(str(tmp_path / "none")) == (None, None)


def test_clean_report_checks_the_cpu_part():
    report = clean_report({"nvml": False, "energy_source": "none", "gpus": [],
                           "cpu": {"usage_s": 3.5, "wall_s": -1, "count": "many", "model": "EPYC", "x": 1}})
    assert report["cpu"] == {"usage_s": 3.5, "wall_s": None, "count": None, "model": "EPYC"}
    assert report["invalid"] == ["cpu.wall_s: -1 is not a number in [0, 1e+09]",
                                 "cpu.count: 'many' is not a number in [0, 100000]"]
    assert clean_report({"cpu": [1]})["invalid"] == ["cpu: a list, not an object"]


# -- measure and derive -----------------------------------------------------------------------------
CPU_REPORT = {"nvml": False, "energy_source": "none", "gpus": [],
              "cpu": {"usage_s": 3.0, "wall_s": 2.0, "count": 4, "model": "AMD EPYC", "source": "cgroup"}}


def test_measure_takes_rapl_as_measured_and_keeps_the_cpu_use():
    fields = measure.telemetry_fields(CPU_REPORT, {"energy_j": 50.0, "zones": ["package-0"], "wraps": 0}, 2.5)
    assert (fields["energy_source"], fields["energy_j"], fields["mean_power_w"]) == ("measured", 50.0, 20.0)
    assert fields["mean_cpu_util_pct"] == 37.5  # 3 CPU-s over 2 s on 4 CPUs
    assert json.loads(fields["telemetry_json"])["rapl"]["zones"] == ["package-0"]
    fields = measure.telemetry_fields(CPU_REPORT, {"reason": "no powercap"}, 2.5)
    assert (fields["energy_source"], fields["energy_j"], fields["cpu_threads"]) == ("none", None, 4)
    assert json.loads(fields["telemetry_json"])["rapl"] == {"reason": "no powercap"}
    assert measure.telemetry_fields(None)["mean_cpu_util_pct"] is None


def cpu_row(**extra) -> dict:
    return {"host": "cpu-01", "case_key": "smoke.trivial.bs16.g0.parameter_server", "status": "ok", "num_gpus": 0,
            "images_per_sec": 400.0, "duration_s": 36.0, "energy_source": "none", "energy_j": None,
            "mean_power_w": None, "mean_cpu_util_pct": 37.5, "cpu_threads": 4, **extra}


def test_derive_estimates_a_cpu_case_from_tdp_and_utilisation_and_prices_it_by_the_hour():
    settings = MetricSettings(host_hour_prices={"cpu-01": 0.40}, carbon_g_per_kwh=400.0)
    (out,) = derive([cpu_row()], [], None, settings)
    # CodeCarbon's default TDP: 4 W x 4 threads = 16 W; x 37.5 % = 6 W; x 36 s = 216 J
    assert (out["cpu_tdp_w"], out["mean_power_w"], out["energy_j"]) == (16.0, 6.0, 216.0)
    assert out["energy_source"] == "estimated" and out["energy_kwh"] == pytest.approx(216 / 3.6e6)
    assert out["images_per_joule"] == pytest.approx(400 / 6)
    assert out["carbon_g"] == pytest.approx(216 / 3.6e6 * 400)
    # 0.40 USD/h x 36 s = 0.004 USD; a million images at 400/s: 0.40 / (3600 x 400) x 1e6
    assert (out["price_per_hour"], out["price_source"], out["price_per_gpu_hour"]) == (0.40, "host_hour", None)
    assert out["cost_usd"] == pytest.approx(0.004)
    assert out["cost_per_million_images_usd"] == pytest.approx(0.40 / (3600 * 400) * 1e6)


def test_derive_uses_the_hosts_cpu_tdp_and_keeps_rapl_measurements():
    settings = MetricSettings(host_cpu_tdp_w={"cpu-01": 280.0})
    (est, rapl_row, none) = derive([cpu_row(), cpu_row(case_key="b", energy_source="measured", energy_j=900.0,
                                                        mean_power_w=25.0),
                                    cpu_row(case_key="c", mean_cpu_util_pct=None)], [], None, settings)
    assert (est["cpu_tdp_w"], est["energy_j"]) == (280.0, pytest.approx(280 * 0.375 * 36))
    assert (rapl_row["energy_source"], rapl_row["energy_j"], rapl_row["cpu_tdp_w"]) == ("measured", 900.0, None)
    assert (none["energy_source"], none["energy_j"], none["cost_usd"]) == ("none", None, None)  # no telemetry, price


def test_a_gpu_host_priced_by_the_hour_only():
    (out,) = derive([cpu_row(num_gpus=2, gpu_model="Mystery GPU", mean_cpu_util_pct=None)], [], None,
                    MetricSettings(host_hour_prices={"cpu-01": 12.0}))
    assert (out["price_per_gpu_hour"], out["price_per_hour"], out["price_source"]) == (None, 12.0, "host_hour")
    assert out["cost_usd"] == pytest.approx(12.0 * 36 / 3600)


def test_cpu_tdp_from_codecarbons_table():
    """CodeCarbon's TDPs per socket, found by the exact normalised name, times the sockets; never a near match."""
    assert cpu_tdp_w(None, 128, "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz", 2) == (600.0, "table")
    assert cpu_tdp_w(None, 256, "AMD EPYC 7763 64-Core Processor", 2) == (560.0, "table")
    assert cpu_tdp_w(None, 16, "Intel(R) Xeon(R) CPU E5-2686 v4 @ 2.30GHz", None) == (145.0, "table")
    assert cpu_tdp_w(None, 2, "AMD EPYC", None) == (8.0, "default_per_thread")  # a VM's model name: no model
    assert cpu_tdp_w(None, 2, "Intel Xeon Platinum 83", None) == (8.0, "default_per_thread")
    assert cpu_tdp_w(150.0, 256, "AMD EPYC 7763 64-Core Processor", 2) == (150.0, "host")
    (out,) = derive([cpu_row(cpu_model="AMD EPYC 7763 64-Core Processor", cpu_sockets=1, cpu_threads=128)], [], None,
                    MetricSettings())
    assert (out["cpu_tdp_w"], out["mean_power_w"]) == (280.0, 280.0 * 0.375)


@pytest.mark.parametrize("name, normalised", [
    ("Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz", "intel xeon platinum 8375c"),
    ("Intel(R) Core(TM) i7-8700 CPU @ 3.20GHz", "intel core i7-8700"),
    ("AMD EPYC 7763 64-Core Processor", "amd epyc 7763"),
    ("AMD Ryzen 9 5950X 16-Core Processor", "amd ryzen 9 5950x"),
    ("ARMv8 Processor rev 1 (v8l)", "armv8 rev 1 (v8l)"),
    ("PROCESSOR 12-core processor", ""),
    ("Intel Xeon Platinum 8375C", "intel xeon platinum 8375c"),  # the table's own spelling is left as it is
    ("cpu(tm)  x", "x"),
    ("", ""),
])
def test_cpu_names_normalise_as_the_table_writes_them(name, normalised):
    """Each pattern runs only where it can match (the table is normalised once a process); the result is the
    same as running all four on every name."""
    from fleetbench.metrics import normalise_cpu_name

    assert normalise_cpu_name(name) == normalised


def test_cpu_tdp_and_power_model():
    assert cpu_tdp_w(None, 8) == (8 * DEFAULT_CPU_W_PER_THREAD, "default_per_thread")
    assert cpu_tdp_w(205.0, 8) == (205.0, "host")
    assert cpu_tdp_w(None, None) == (None, None)
    assert estimated_cpu_power_w(100.0, 150.0) == 100.0  # clamped to the TDP
    assert estimated_cpu_power_w(100.0, None) is None and estimated_cpu_power_w(None, 50.0) is None


def test_the_report_shows_cpu_cases_energy_and_cost(tmp_path):
    from fleetbench.report.queries import CPU_LABEL, build_report
    from fleetbench.report.render import render_html
    from fleetbench.warehouse import get_engine, store_run, upgrade
    from warehouse_rows import result_row, run_row

    settings = MetricSettings(host_hour_prices={"cpu-01": 0.40})
    derived = derive([cpu_row(), cpu_row(case_key="b", mean_cpu_util_pct=50.0)], [], None, settings)
    rows = [{**result_row(r["case_key"], host="cpu-01", device="cpu", gpu_model=None), **r} for r in derived]
    engine = get_engine(f"sqlite:///{tmp_path}/w.db")
    upgrade(engine)
    store_run(engine, run_row("r1"), [], rows)
    report = build_report(engine)
    (eff,) = report["efficiency"]
    assert (eff["gpu"], eff["n"], eff["estimated"]) == (CPU_LABEL, 2, 2)
    assert eff["images_per_joule"] == pytest.approx(statistics.fmean(r["images_per_joule"] for r in derived))
    assert eff["cost_per_million_images_usd"] == pytest.approx(0.40 / (3600 * 400) * 1e6)
    assert "No energy or cost figures" not in render_html(report, [])


def test_cpu_cases_on_a_gpu_host_are_not_counted_under_its_gpu(tmp_path):
    """A CPU case's row records the host's GPU (provenance); the efficiency and unit-cost tables put it under
    `none (CPU)`, not beside the GPU cases (where the GPU is not in the catalog it was averaged with them)."""
    from fleetbench.report.queries import CPU_LABEL, build_report
    from fleetbench.warehouse import get_engine, store_run, upgrade
    from warehouse_rows import result_row, run_row

    settings = MetricSettings(host_hour_prices={"gpu-01": 2.0})
    gpu = "Some GPU Not In The Catalog"
    cpu = cpu_row(host="gpu-01", gpu_model=gpu)
    gpu_case = {**cpu_row(host="gpu-01", case_key="g1", gpu_model=gpu), "num_gpus": 1, "device": "gpu",
                "mean_gpu_util_pct": None}
    derived = derive([cpu, gpu_case], [], None, settings)
    rows = [{**result_row(r["case_key"], host="gpu-01", value=r["images_per_sec"], metric="images_per_sec",
                          unit="images/s", better="higher"), **r} for r in derived]
    engine = get_engine(f"sqlite:///{tmp_path}/w.db")
    upgrade(engine)
    store_run(engine, run_row("r1"), [], rows)
    report = build_report(engine)
    assert {e["gpu"]: e["n"] for e in report["efficiency"]} == {CPU_LABEL: 1, gpu: 1}
    assert {u["gpu"] for u in report["unit_costs"]} == {CPU_LABEL, gpu}
