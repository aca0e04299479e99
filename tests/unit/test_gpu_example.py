"""include/config/fleet.gpu-example.yaml works as written on NGC hosts: `config check` accepts it with no
warning (every tcp:// engine has TLS), the image is the runbook's bake, and its plan is the full matrix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from fleetbench.config import config_warnings, load_config
from fleetbench.plan import expand_cases

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "include" / "config" / "fleet.gpu-example.yaml"
FLEETBENCH = str(Path(sys.executable).parent / "fleetbench")


def test_config_check_accepts_it_without_warnings():
    proc = subprocess.run([FLEETBENCH, "config", "check", str(EXAMPLE)], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout.strip(), proc.stderr) == (0, "ok", "")
    cfg = load_config(EXAMPLE)
    assert config_warnings(cfg) == []
    for host in cfg.hosts:  # SSH for the probes, TLS for the engine: nothing reaches a host unauthenticated
        assert host.connection.startswith("ssh_") and host.docker_url.startswith("tcp://")
        assert host.docker_tls_conn_id


def test_the_image_is_the_runbooks_bake():
    image = next(i for i in load_config(EXAMPLE).images if i.name == "tf1-benchmarks")
    assert image.ref == "nvcr.io/nvidia/tensorflow:23.03-tf1-py3" and image.cuda == "12.1"
    git = image.bake.git
    assert (git.url, git.branch, git.dest) == ("https://github.com/tensorflow/benchmarks.git",
                                               "cnn_tf_v1.15_compatible", "/workspace/benchmarks")
    # the harness the cases run is the checked-out one
    assert image.command == ["python", f"{git.dest}/scripts/tf_cnn_benchmarks/tf_cnn_benchmarks.py"]


def test_its_plan_is_the_matrix_on_every_host():
    cfg = load_config(EXAMPLE)
    cases = [c for c in expand_cases(cfg) if c.benchmark == "cnn"]  # the runbook's benchmark (the others: Harnesses)
    expected = {(host, f"cnn.{model}.bs{bs}.g{gpus}.replicated") for host in ("gpu-a100-01", "gpu-rtx3070-01")
                for model in ("resnet50", "vgg16", "inception3") for bs in (32, 64, 128) for gpus in (1, 2, 4, 8)}
    assert {(c.host, c.case_key) for c in cases} == expected and len(cases) == 72
    case = next(c for c in cases if c.host == "gpu-a100-01" and c.case_key == "cnn.resnet50.bs64.g8.replicated")
    assert case.device == "gpu" and case.timeout_s == 1800 and case.command[2:] == [
        "--model=resnet50", "--batch_size=64", "--num_batches=100", "--num_warmup_batches=5",
        "--variable_update=replicated", "--device=gpu", "--num_gpus=8"]
    # NGC's recommended container settings
    assert case.container["ulimits"] == {"memlock": -1, "stack": 67108864} and case.container["shm_size"] == "1g"


def test_the_runbooks_distributed_layout_is_one_case_across_both_hosts():
    cfg = load_config(EXAMPLE)
    [case] = [c for c in expand_cases(cfg) if c.benchmark == "cnn-dist"]
    assert case.hosts == ["gpu-a100-01", "gpu-rtx3070-01"] and case.host == "gpu-a100-01"
    assert case.case_key == "cnn-dist.resnet50.bs64.g8.distributed_replicated.n2.gpu-a100-01+gpu-rtx3070-01"
    assert [(r["host"], r["job"], r["task_index"]) for r in case.roles] == [
        ("gpu-a100-01", "worker", 0), ("gpu-rtx3070-01", "worker", 1),
        ("gpu-a100-01", "ps", 0), ("gpu-rtx3070-01", "ps", 1)]
    assert "--variable_update=distributed_replicated" in case.command and case.container["network_mode"] == "host"
    assert [h.cluster_address() for h in cfg.hosts] == ["gpu-a100-01", "gpu-rtx3070-01"]


def test_a_driver_too_old_for_one_image_skips_only_that_images_cases():
    """The example's PyTorch image moved to a CUDA 13.0 release (NGC 25.08 and later), its RTX 3070 host on an R525
    GeForce driver (the real 525.125.06 table in tests/fixtures/hosts/geforce-525-79col): R525 runs the TF image's
    CUDA 12.1 (minor-version compatibility), not 13.0 (no forward compatibility on GeForce). Only the PyTorch image's
    GPU cases are skipped, as driver_too_old; the host is not unfit."""
    from fleetbench.config import parse_config, read_yaml
    from fleetbench.hosts import HostNeeds, evaluate, facts_from_dir, verdict
    from fleetbench.hosts.check import smoke_default
    from fleetbench.hosts.devices import assign
    from fleetbench.measure import SKIPPED, case_fields
    from fleetbench.plan import build_plan
    from fleetbench.run_model import HostVerdict

    data = read_yaml(EXAMPLE)
    next(i for i in data["images"] if i["name"] == "pytorch-nccl")["cuda"] = "13.0"
    plan = build_plan(parse_config(data), {"dag_id": "d", "run_id": "r", "logical_date": None, "run_type": "manual"})
    host = plan.host("gpu-rtx3070-01")
    assert host.needs.image_cuda == "12.1"  # the oldest CUDA of its GPU cases' images
    assert smoke_default(host.images) == "nvcr.io/nvidia/tensorflow:23.03-tf1-py3"
    facts = facts_from_dir(ROOT / "tests" / "fixtures" / "hosts" / "geforce-525-79col")
    assert facts.driver_version == "525.125.06" and facts.gpu_model == "NVIDIA GeForce ..."
    checks = {c.name: c for c in evaluate(facts, HostNeeds(gpus=1, image_cuda=host.needs.image_cuda))}
    assert checks["driver_cuda"].status == "warn"
    v = HostVerdict(host=host.name, verdict=verdict(list(checks.values())), facts=facts.to_dict())
    assert not v.unfit
    gpu_cases = [c for c in plan.cases if c.host == host.name and c.num_gpus and c.nodes == 1]
    by_image: dict[str, set] = {}
    for case in gpu_cases:
        fields, _ = case_fields(case, v, {"ref": "x"}, None)
        by_image.setdefault(case.image, set()).add(fields["failure_class"])
    # tf1: would run (task_failed: no task ran it here), but for its cases of more GPUs than the host's one
    assert by_image == {"pytorch-nccl": {"driver_too_old"}, "tf1-benchmarks": {"task_failed", "too_few_gpus"}}
    torch_case = next(c for c in gpu_cases if c.image == "pytorch-nccl")
    skipped = assign(torch_case, v.host_facts)
    assert skipped.skip_detail == (
        "the case's image pytorch-nccl needs CUDA 13.0: driver 525.125.06 is too old for CUDA 13.0 (needs >= "
        "580.65.06); forward compatibility is for data-center GPUs, not NVIDIA GeForce ...: update the driver")
    assert case_fields(torch_case, v, {"ref": "x"}, None)[0]["status"] == SKIPPED
