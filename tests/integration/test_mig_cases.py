"""MIG instances as a case's devices, end to end: the host check over SSH reads the MIG devices, the plan's MIG
case gets a device request naming its MIG UUIDs, the whole-GPU case the GPUs without MIG, and the cases that
cannot run there are stored skipped with their class.

This machine has no GPU: `nvidia-smi` is a fake script on the remote PATH (the host's `probe_path`) that prints a
real published `nvidia-smi -L` listing (tests/fixtures/gpu-tools, SOURCES.md: four A100s, GPU 0 in MIG mode with
4x 1g.20gb) and has no recording of anything else. Everything else is real: the SSH connection, `validate_host`,
the plan, `case_kwargs`, BenchmarkCaseOperator against the local Docker engine (which has no NVIDIA runtime, so it
refuses the GPU request at start: `no_gpu_runtime`), `collect`, `store` and the warehouse (SQLite).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from fleetbench.airflow import pipeline
from fleetbench.airflow.operators import BenchmarkCaseOperator, case_kwargs
from fleetbench.config import parse_config
from fleetbench.hosts.gpu_health import parse_gpu_list
from fleetbench.plan import build_plan
from fleetbench.run_model import HostImages, HostVerdict, RunPlan
from fleetbench.runs import label
from fleetbench.warehouse import fetch_results, get_engine
from ssh_hosts import define_ssh_connection, sshd  # noqa: F401

pytestmark = pytest.mark.integration

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "gpu-tools"
LISTING = FIX / "nvidia-smi-L_4xa100-80gb_gpu0-mig-4x1g.20gb.txt"
BASE = "fleetbench/base:bookworm"


def fake_nvidia_smi(bin_dir: Path) -> Path:
    bin_dir.mkdir(parents=True)
    scripts = {"nvidia-smi": f'case "$*" in\n  "-L") cat {LISTING} ;;\n'
                             '  *) echo "fake nvidia-smi: no recording of: $*" >&2; exit 1 ;;\nesac',
               "journalctl": "exit 0"}  # a kernel log without XID lines
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return bin_dir


@pytest.fixture()
def mig_plan(sshd, monkeypatch, tmp_path):  # noqa: F811
    conn = define_ssh_connection(monkeypatch, "mig_ssh")
    monkeypatch.setenv("FLEETBENCH_ARTIFACTS_DIR", str(tmp_path / "artifacts"))
    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", f"sqlite:///{tmp_path}/w.db")
    bin_dir = fake_nvidia_smi(tmp_path / "bin")
    command = ["python3", "-c", "print(1)"]
    cfg = parse_config({
        "hosts": [{"name": "a100", "connection": conn, "probe_path": [str(bin_dir)], "gpu_smoke_image": BASE}],
        "images": [{"name": "base", "ref": BASE, "pull_policy": "never"}],
        "benchmarks": [
            {"name": "mig", "image": "base", "harness": "command", "command": command, "mig_profiles": ["1g.20gb",
                                                                                                     "3g.40gb"]},
            {"name": "whole", "image": "base", "harness": "command", "command": command, "num_gpus": [1, 4]}]})
    token = uuid.uuid4().hex[:8]
    return build_plan(cfg, {"dag_id": "fleet_benchmark", "run_id": f"mig-{token}"}).to_xcom(), token


def test_mig_case_runs_on_its_mig_uuids_and_the_rest_are_skipped_with_their_class(mig_plan, docker_api):
    plan, token = mig_plan
    listing = parse_gpu_list(LISTING.read_text())
    host = RunPlan.load(plan).host("a100")
    assert (host.needs.whole_gpus, host.needs.mig) == (4, {"1g.20gb": 1, "3g.40gb": 1})

    # The host check over SSH: the MIG devices come from the fake nvidia-smi -L on the remote PATH.
    checked = HostVerdict.load(pipeline.validate_host(plan["hosts"][0], plan["run"]))
    assert checked.host_facts.runner == "ssh:mig_ssh" and checked.host_facts.gpu_list == listing
    mig_check = next(c for c in checked.checks if c["name"] == "gpu_mig")
    assert mig_check["status"] == "pass" and mig_check["detail"].startswith(
        "GPU 0: MIG enabled (GPU 0: 4x 1g.20gb); whole-GPU cases that need more than 3 GPU(s) are skipped")
    # Without an NVIDIA runtime and a real nvidia-smi the driver and smoke checks fail here (on a GPU host they
    # pass); the device assignment below is what a host whose other checks pass gets.
    assert checked.unfit and "gpu_mig" not in checked.reasons and "gpu_smoke" in checked.reasons
    ready = HostVerdict(**{**checked.model_dump(), "verdict": "ready", "reasons": ""}).to_xcom()
    images = HostImages(host="a100", images={"base": {"name": "base", "ref": BASE, "pinned_ref": BASE,
                                                      "digest": None}}).to_xcom()

    runnable = {k["case"]["case_key"]: k for k in case_kwargs(plan, [ready], [images], host="a100")}
    assert sorted(runnable) == ["mig.g1.mig-1g.20gb", "whole.g1"]
    mig_uuid = listing[0]["mig"][0]["uuid"]
    assert runnable["mig.g1.mig-1g.20gb"]["gpu_device_ids"] == [mig_uuid]
    assert runnable["mig.g1.mig-1g.20gb"]["container"]["environment"]["NVIDIA_VISIBLE_DEVICES"] == mig_uuid
    assert runnable["whole.g1"]["gpu_device_ids"] == [listing[1]["uuid"]]  # GPU 1: the first without MIG
    assert "NVIDIA_VISIBLE_DEVICES" not in runnable["whole.g1"]["container"].get("environment", {})

    # The case's container on the real engine: the device request names the MIG UUID; this engine has no NVIDIA
    # runtime and refuses it at start, and the container is removed.
    outcomes = []
    for key, kwargs in runnable.items():
        op = BenchmarkCaseOperator(task_id=f"run_{token}_{len(outcomes)}", **kwargs)
        outcome = op.execute({})
        request = op.device_requests[0]
        assert (request["DeviceIDs"], request["Capabilities"]) == (kwargs["gpu_device_ids"], [["gpu"]])
        assert outcome["start_error_class"] == "no_gpu_runtime" and outcome["gpu_device_ids"] == \
            kwargs["gpu_device_ids"]
        if key.startswith("mig"):
            assert op.environment["NVIDIA_VISIBLE_DEVICES"] == mig_uuid
        outcomes.append(outcome)
    run_label = f"{label('run_id')}={plan['run']['run_id']}"
    assert docker_api.containers(all=True, filters={"label": run_label}) == []

    # Collect and store: one row per planned case, with its MIG profile or why it was skipped.
    collected = pipeline.collect(plan, [ready], [images], outcomes)
    pipeline.store(plan, collected)
    rows = {r["case_key"]: r for r in fetch_results(get_engine(), run_id=plan["run"]["run_id"])}
    assert {k: (r["status"], r["failure_class"], r["mig_profile"], r["mig_instances"]) for k, r in rows.items()} == {
        "mig.g1.mig-1g.20gb": ("failed", "no_gpu_runtime", "1g.20gb", 1),
        "mig.g1.mig-3g.40gb": ("skipped", "mig_unavailable", "3g.40gb", 1),
        "whole.g1": ("failed", "no_gpu_runtime", None, None),
        "whole.g4": ("skipped", "mig_enabled", None, None)}
    assert rows["mig.g1.mig-3g.40gb"]["failure_detail"] == (
        "the case asks for 1 MIG instance(s) of 3g.40gb; the host has 0 (GPU 0: 4x 1g.20gb)")
    assert rows["whole.g4"]["failure_detail"].startswith(
        "the case needs 4 whole GPU(s), and MIG is enabled on GPU 0 (GPU 0: 4x 1g.20gb): 3 GPU(s) without MIG")
