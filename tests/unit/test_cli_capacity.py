"""`fleetbench capacity`: the largest batch predicted to fit, with the evidence; clear errors for bad input."""

from __future__ import annotations

import json

import pytest

from fleetbench.cli import main
from fleetbench.warehouse import get_engine, store_run, upgrade
from warehouse_rows import result_row, run_row


def gpu_row(key: str, batch: int, mem: float | None, status: str = "ok", **extra) -> dict:
    return result_row(key, batch_size_per_device=batch, batch_size_global=batch, peak_gpu_mem_mib=mem, status=status,
                      ips=100.0 if status == "ok" else None, failure_class=None if status == "ok" else "gpu_oom",
                      **extra)


@pytest.fixture()
def warehouse(tmp_path, monkeypatch) -> str:
    url = f"sqlite:///{tmp_path}/w.db"
    engine = get_engine(url)
    upgrade(engine)
    # resnet50 on GPUs: 1000 MiB + 60 MiB per sample; batch 512 died with 40 GiB (predicted to fit: a miss).
    rows = [gpu_row(f"cnn.resnet50.bs{b}.g1.replicated", b, 1000.0 + 60 * b) for b in (32, 64, 128, 256)]
    rows.append(gpu_row("cnn.resnet50.bs512.g1.replicated", 512, None, status="failed", capacity_mib=40960.0,
                        predicted_mem_mib=31720.0, capacity_note="fits: 31720 +- 50 MiB of 36864 MiB [run]"))
    rows.append(gpu_row("cnn.vgg16.bs64.g1.replicated", 64, 5000.0, model="vgg16"))  # one point
    store_run(engine, run_row("r1"), [], rows, [])
    engine.dispose()
    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", url)
    return url


def test_suggests_the_largest_batch_for_a_catalog_gpu_with_the_evidence(warehouse, capsys):
    assert main(["capacity", "--gpu-model", "A100 SXM4 40GB"]) == 0
    out = capsys.readouterr().out
    assert ("tf_cnn_benchmarks/resnet50/fp32/gpu/cnn: peak MiB = 1000.0 + 60.0000 x batch per device, +- "
            in out)
    assert "from 4 point(s) at batch(es) [32, 64, 128, 256]" in out
    assert "OOM on record: batch 512 with 40960 MiB" in out
    assert "miss: h1 cnn.resnet50.bs512.g1.replicated (run r1) was predicted to fit" in out
    # 40 GiB less 10 % = 36864 MiB; (36864 - spread - 1000) / 60 -> 596, but 512 died with 40 GiB: 511.
    assert "40960 MiB (less 10 %): largest batch per device predicted to fit: 511" in out
    assert "vgg16/fp32/gpu/cnn: no prediction: 1 usable point(s)" in out


def test_memory_size_and_json(warehouse, capsys):
    assert main(["capacity", "--model", "resnet50", "--memory-gib", "16", "--format", "json"]) == 0
    (item,) = json.loads(capsys.readouterr().out)
    assert (item["model"], item["n"], item["slope_mib_per_sample"], item["intercept_mib"]) == ("resnet50", 4, 60.0,
                                                                                              1000.0)
    (fit,) = item["fits"]
    assert fit["capacity_mib"] == 16384.0
    assert fit["largest_batch"] == int((16384 * 0.9 - item["spread_mib"] - 1000) // 60)


def test_without_a_size_uses_the_sizes_results_ran_with(warehouse, capsys):
    assert main(["capacity", "--model", "resnet50"]) == 0
    assert "40960 MiB (less 10 %): largest batch per device predicted to fit: 511" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--gpu-model", "Voodoo 5"], "--gpu-model 'Voodoo 5' is not in the GPU catalog"),
    (["--memory-gib", "-1"], "--memory-gib must be a positive number of GiB"),
    (["--margin-pct", "100"], "--margin-pct must be in [0, 100)"),
])
def test_bad_input_is_one_line_and_exit_2(warehouse, capsys, argv, message):
    assert main(["capacity", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fleetbench capacity: ") and message in err and "Traceback" not in err


def test_empty_warehouse_says_so(tmp_path, monkeypatch, capsys):
    url = f"sqlite:///{tmp_path}/new.db"
    upgrade(get_engine(url))
    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", url)
    assert main(["capacity"]) == 0
    assert capsys.readouterr().out.strip() == "no memory readings in the warehouse yet"


def fleet_config_with(tmp_path, capacity: str) -> str:
    """The embedded default fleet config with its own `fleet.capacity` block."""
    from fleetbench.paths import PROJECT_ROOT

    text = (PROJECT_ROOT / "include" / "config" / "fleet.yaml").read_text()
    text = text.replace("fleet:\n", f"fleet:\n  capacity: {capacity}\n", 1)
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return str(path)


def test_uses_the_fleets_own_capacity_settings_as_the_plan_does(warehouse, tmp_path, monkeypatch, capsys):
    """The plan fits with `fleet.capacity`; `fleetbench capacity` suggests with the same settings (the margin it
    keeps free, the points a profile needs), and `--margin-pct` overrides the margin alone."""
    monkeypatch.setenv("FLEETBENCH_CONFIG", fleet_config_with(tmp_path, "{margin_pct: 30}"))
    assert main(["capacity", "--model", "resnet50", "--memory-gib", "16", "--format", "json"]) == 0
    (item,) = json.loads(capsys.readouterr().out)
    assert item["margin_pct"] == 30.0
    assert item["fits"][0]["largest_batch"] == int((16384 * 0.7 - item["spread_mib"] - 1000) // 60)
    assert main(["capacity", "--model", "resnet50", "--memory-gib", "16", "--margin-pct", "10"]) == 0
    assert "16384 MiB (less 10 %)" in capsys.readouterr().out
    monkeypatch.setenv("FLEETBENCH_CONFIG", fleet_config_with(tmp_path, "{min_points: 5}"))
    assert main(["capacity", "--model", "resnet50"]) == 0
    assert "no prediction: 4 usable point(s), fewer than min_points 5" in capsys.readouterr().out


def test_a_config_that_cannot_be_read_gives_the_defaults_and_says_so(warehouse, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FLEETBENCH_CONFIG", fleet_config_with(tmp_path, "{margin_pct: lots}"))
    assert main(["capacity", "--model", "resnet50", "--memory-gib", "16"]) == 0
    captured = capsys.readouterr()
    assert "16384 MiB (less 10 %)" in captured.out
    assert "note: capacity with the default settings: the fleet config" in captured.err
    assert "margin_pct" in captured.err and "Traceback" not in captured.err


def test_a_fleetbench_config_that_names_no_file_is_said(warehouse, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FLEETBENCH_CONFIG", str(tmp_path / "fleet5O.yaml"))  # a typo
    assert main(["capacity", "--model", "resnet50", "--memory-gib", "16"]) == 0
    captured = capsys.readouterr()
    assert "16384 MiB (less 10 %)" in captured.out
    assert "note: capacity with the default settings" in captured.err and "fleet5O.yaml" in captured.err


def test_gpu_model_over_cpu_profiles_only_says_so(tmp_path, monkeypatch, capsys):
    url = f"sqlite:///{tmp_path}/cpu.db"
    engine = get_engine(url)
    upgrade(engine)
    store_run(engine, run_row("r1"), [], [
        result_row(f"smoke.trivial.bs{b}.g0.parameter_server", model="trivial", device="cpu", num_gpus=0,
                   batch_size_per_device=b, batch_size_global=b, peak_mem_mib=18.0 + 0.035 * b, capacity_mib=256.0)
        for b in (2048, 3072, 4096)], [])
    engine.dispose()
    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", url)
    assert main(["capacity", "--gpu-model", "A100 SXM4 40GB"]) == 0
    assert capsys.readouterr().out.startswith("no GPU profile in the warehouse (--gpu-model applies to GPU profiles")
    assert main(["capacity"]) == 0
    assert "trivial/fp32/cpu" in capsys.readouterr().out


def test_a_catalog_gpu_is_sized_with_the_memory_the_fleets_gpus_of_that_model_report(tmp_path, monkeypatch, capsys):
    """The plan sizes a T4's cases with the 15360 MiB nvidia-smi reports, not the catalog's nominal 16 GiB: so does
    `--gpu-model T4` once the warehouse has results on T4s (the nominal size suggested batches the plan then
    skipped). A MIG instance's size and a mix of models are not a GPU's memory."""
    url = f"sqlite:///{tmp_path}/t4.db"
    engine = get_engine(url)
    upgrade(engine)
    t4 = {"gpu_model": "Tesla T4", "capacity_mib": 15360.0}
    rows = [gpu_row(f"cnn.resnet50.bs{b}.g1.replicated", b, 1000.0 + 60 * b, **t4) for b in (32, 64, 128)]
    rows.append(gpu_row("cnn.resnet50.bs16.g1.replicated", 16, 1960.0, host="h2", gpu_model="Tesla T4",
                        capacity_mib=4864.0, mig_profile="1g.5gb"))
    rows.append(gpu_row("cnn.resnet50.bs8.g1.replicated", 8, 1480.0, host="h3", gpu_model="Tesla T4+Tesla T4",
                        capacity_mib=16000.0))
    store_run(engine, run_row("r1"), [], rows, [])
    engine.dispose()
    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", url)
    assert main(["capacity", "--gpu-model", "T4", "--format", "json"]) == 0
    captured = capsys.readouterr()
    [fit] = json.loads(captured.out)[0]["fits"]
    assert fit["capacity_mib"] == 15360.0
    assert "sized with the 15360 MiB that this fleet's T4 GPUs report" in captured.err
    # a model without results on record: the catalog's nominal memory
    assert main(["capacity", "--gpu-model", "A100 SXM4 40GB", "--format", "json"]) == 0
    [fit] = json.loads(capsys.readouterr().out)[0]["fits"]
    assert fit["capacity_mib"] == 40960.0
