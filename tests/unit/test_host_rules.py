"""Rules and verdicts over host facts: NVIDIA's driver/CUDA table edge cases, and verdicts of real captures."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetbench.hosts import HostFacts, HostNeeds, evaluate, facts_from_dir, host_check, reasons, verdict
from fleetbench.hosts import facts as F
from fleetbench.hosts.rules import Check, check_driver_for_cuda, min_driver_for_cuda, version_tuple

HOSTS = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
CONTRACT_FACTS = {"kernel", "driver_version", "cuda_driver_version", "gpus", "docker_version", "nvidia_runtime",
                  "default_runtime"}


def checks_of(folder: str, **needs) -> dict[str, Check]:
    return {c.name: c for c in evaluate(facts_from_dir(HOSTS / folder), HostNeeds(**needs))}


# -- NVIDIA's minimum driver per CUDA toolkit ----------------------------------------------------------
# CUDA Toolkit Release Notes (13.1), Table 3 "CUDA Toolkit and Corresponding Driver Versions", Linux x86_64, GA rows.
@pytest.mark.parametrize("cuda, driver", [
    ("11.0", "450.51.05"), ("11.1", "455.23"), ("11.4", "470.42.01"), ("11.8", "520.61.05"),
    ("12.0", "525.60.13"), ("12.1", "530.30.02"), ("12.2", "535.54.03"), ("12.3", "545.23.06"),
    ("12.4", "550.54.14"), ("12.5", "555.42.02"), ("12.6", "560.28.03"), ("12.8", "570.26"), ("12.9", "575.51.03"),
    ("13.0", "580.65.06"), ("13.1", "590.44.01"),
    ("12.7", None), ("13.2", None), ("10.2", None), ("x.y", None),  # no row: no lower row stands in for it
])
def test_min_driver_for_cuda(cuda, driver):
    assert min_driver_for_cuda(cuda) == driver


@pytest.mark.parametrize("driver, cuda, status", [
    ("530.30.02", "12.1", "pass"),   # exactly the minimum
    ("530.30.01", "12.1", "warn"),   # one patch level short: CUDA 12.x minor-version compatibility (>= 525.60.13)
    ("525.60.13", "12.0", "pass"),
    ("525.60.12", "12.0", "fail"),   # below 12.x minor-version compatibility, R525 below the branch's 525.85
    ("535.54.03", "12.3", "warn"),   # 12.3 needs 545.23.06: R535 runs it only through minor-version compatibility
    ("560.28.03", "12.6", "pass"),
    ("550.54.15", "12.6", "warn"),
    ("575.51.03", "12.9", "pass"),
    ("520.61.05", "11.8", "pass"),
    ("450.80.02", "11.8", "warn"),   # 11.x minor-version compatibility (>= 450.80.02)
    ("450.51.06", "11.8", "warn"),   # below minor-version compatibility, but R450 >= 450.51: forward compatibility
    ("440.33.01", "11.0", "fail"),   # R440 is no forward-compatibility branch
    ("418.87.01", "11.0", "fail"),
    ("580.65.06", "13.0", "pass"),
    ("580.65.06", "13.1", "warn"),   # 13.1 needs 590.44.01; 13.x minor-version compatibility from 580.65.06
    ("590.44.01", "13.1", "pass"),
    ("560.35.03", "13.0", "fail"),   # R560 is below 13.x and no forward-compatibility branch
])
def test_driver_for_cuda_table(driver, cuda, status):
    check = check_driver_for_cuda(driver, cuda)
    assert check.status == status, check.detail


def test_minor_version_compatibility_says_what_is_limited_and_what_to_do():
    """The shipped GPU example's 12.8 image on an A100 with the R535 LTSB driver, which NVIDIA supports for CUDA 12.x
    through minor-version compatibility: runs, with a warning, not unfit."""
    check = check_driver_for_cuda("535.183.01", "12.8", ["NVIDIA A100-SXM4-80GB"], "12.2")
    assert check == Check("driver_cuda", "warn",
                          "driver 535.183.01 runs CUDA 12.8 only through minor-version compatibility (CUDA 12.x on >= "
                          "525.60.13): PTX newer than the driver cannot be JIT-compiled, so kernels shipped only as "
                          "PTX fail; update the driver to >= 570.26 for the full feature set")
    # the same driver family on a GeForce board: minor-version compatibility is not limited to data-center GPUs
    assert check_driver_for_cuda("550.54.15", "12.8", ["NVIDIA GeForce RTX 4090"]).status == \
        check_driver_for_cuda("550.54.15", "12.6", ["NVIDIA GeForce RTX 4090"]).status == "warn"


@pytest.mark.parametrize("driver, cuda, gpus, status", [
    ("470.57.02", "12.1", ["Tesla V100-SXM2-32GB"], "warn"),       # R470 >= 470.57: below 12.x, forward compatibility
    ("510.47.03", "12.1", [], "warn"),                             # GPU unknown: forward compatibility may apply
    ("470.57.02", "12.1", ["NVIDIA GeForce RTX 3090"], "fail"),    # forward compatibility is not for consumer boards
    ("470.57.02", "12.1", ["NVIDIA TITAN RTX"], "fail"),
    ("470.42.01", "12.1", ["Tesla V100-SXM2-32GB"], "fail"),       # R470 but below the branch's 470.57
    ("520.61.05", "12.1", ["NVIDIA A100-SXM4-40GB"], "fail"),      # R520 is no forward-compatibility branch
    ("535.183.01", "13.0", ["NVIDIA A100-SXM4-80GB"], "warn"),     # R535 >= 535.86 (NGC: CUDA 13 images)
    ("550.54.15", "13.0", ["NVIDIA H100 80GB HBM3"], "warn"),      # R550 >= 550.54
    ("535.54.03", "13.0", ["NVIDIA A100-SXM4-80GB"], "fail"),      # R535 but below 535.86
    ("550.54.15", "13.0", ["NVIDIA GeForce RTX 4090"], "fail"),
    ("570.195.03", "13.0", ["NVIDIA A10G"], "warn"),               # R570, the production branch: as R535 (it failed)
    ("570.26", "13.0", ["NVIDIA A10G"], "fail"),                   # R570 but below its first data-center release
])
def test_forward_compatibility_branches(driver, cuda, gpus, status):
    check = check_driver_for_cuda(driver, cuda, gpus)
    assert check.status == status, check.detail


def test_driver_cuda_falls_back_to_the_reported_cuda_version():
    assert check_driver_for_cuda(None, "12.1", cuda_driver_version="12.2").status == "pass"
    assert check_driver_for_cuda(None, "12.1", cuda_driver_version="12.0").status == "warn"  # minor-version compat.
    assert check_driver_for_cuda(None, "12.1", cuda_driver_version="11.8").status == "fail"
    assert check_driver_for_cuda(None, "12.1").status == "unknown"


def test_a_cuda_version_newer_than_the_table_is_not_judged_by_an_older_row():
    """13.2 has no row here: 590.48.01 (which reports 13.1) runs it only through minor-version compatibility, 595.71.05
    (reports 13.2, as in the RTX 2080 SUPER capture) fully; a CUDA major the table does not know is judged by the CUDA
    version the driver reports, and not judged without one."""
    assert check_driver_for_cuda("590.48.01", "13.2", cuda_driver_version="13.1").status == "warn"
    assert check_driver_for_cuda("595.71.05", "13.2", cuda_driver_version="13.2").status == "pass"
    assert check_driver_for_cuda("560.35.03", "13.2").status == "fail"
    assert check_driver_for_cuda("610.57.04", "14.0", cuda_driver_version="13.3").status == "fail"
    unknown = check_driver_for_cuda("610.57.04", "14.0")
    assert unknown.status == "unknown" and "check the image's CUDA against the driver by hand" in unknown.detail


def test_version_tuple():
    assert version_tuple("20.10.24+dfsg1") == (20, 10, 24)
    assert version_tuple("18.06.1-ce") == (18, 6, 1)
    assert version_tuple("6.18.44-fc-v1045") == (6, 18, 44)
    assert version_tuple("") is None and version_tuple("N/A") is None


# -- verdicts of real captures --------------------------------------------------------------------------
def test_this_vm_is_ready_for_cpu_cases():
    checks = checks_of("local-vm-nogpu", gpus=0)
    assert {n: c.status for n, c in checks.items()} == {"reachable": "pass", "kernel": "pass", "docker": "pass",
                                                        "disk": "pass"}
    assert verdict(list(checks.values())) == "ready" and reasons(list(checks.values())) == ""


@pytest.mark.parametrize("folder", ["local-vm-nogpu", "ssh-vm-nogpu"])
def test_this_vm_is_unfit_for_gpu_cases_no_nvidia_driver(folder):
    checks = checks_of(folder, gpus=1, image_cuda="12.1")
    assert checks["nvidia_driver"] == Check("nvidia_driver", "fail", "no NVIDIA driver: nvidia-smi not found")
    assert checks["nvidia_runtime"].status == "fail"
    assert checks["gpu_smoke"].status == "fail" and "[[gpu]]" in checks["gpu_smoke"].detail
    assert checks["gpu_count"].detail == "0 GPU(s), cases need 1"
    line = reasons(list(checks.values()))
    assert verdict(list(checks.values())) == "unfit" and line.startswith("nvidia_driver: no NVIDIA driver")


def test_h100_runs_cuda_13_but_not_two_gpu_cases():
    one = checks_of("h100-590-cuda13.1", gpus=1, image_cuda="13.0")
    assert one["driver_cuda"].status == "pass" and one["gpu_count"].status == "pass"
    assert one["driver_library"].status == "pass"
    # docker, disk, runtime and smoke were not captured: runs, but not "ready"
    assert verdict(list(one.values())) == "degraded"
    assert {n for n, c in one.items() if c.status == "unknown"} == {"docker", "disk", "nvidia_runtime", "gpu_smoke"}
    two = checks_of("h100-590-cuda13.1", gpus=2, image_cuda="13.0")
    assert two["gpu_count"] == Check("gpu_count", "fail", "1 GPU(s), cases need 2")


def test_geforce_on_r525_cannot_use_forward_compatibility():
    checks = checks_of("geforce-525-79col", gpus=1, image_cuda="13.0")
    assert checks["driver_cuda"].status == "fail" and "data-center" in checks["driver_cuda"].detail
    assert "update the driver" in checks["driver_cuda"].detail
    assert checks_of("geforce-525-79col", gpus=1, image_cuda="12.0")["driver_cuda"].status == "pass"
    assert checks_of("geforce-525-79col", gpus=1, image_cuda="12.1")["driver_cuda"].status == "warn"


def test_a10_on_r550_runs_cuda_12_8_through_minor_version_compatibility():
    assert checks_of("a10-550-cuda12.4", gpus=1, image_cuda="12.4")["driver_cuda"].status == "pass"
    assert checks_of("a10-550-cuda12.4", gpus=1, image_cuda="12.8")["driver_cuda"].status == "warn"
    assert checks_of("a10-550-cuda12.4", gpus=1, image_cuda="13.0")["driver_cuda"].detail == (
        "driver 550.127.05 is older than CUDA 13.0 needs (>= 580.65.06); runs only through data-center forward "
        "compatibility (R550 >= 550.54) with the cuda-compat package in the image: update the driver, or make sure "
        "the image has cuda-compat")


def test_driver_library_mismatch_is_its_own_failure():
    checks = checks_of("mismatch-520-debian", gpus=1)
    assert checks["nvidia_driver"] == Check("nvidia_driver", "pass", "NVIDIA kernel module 520.56.06 loaded")
    assert checks["driver_library"].status == "fail"
    assert "reboot" in checks["driver_library"].detail and "kernel module 520.56.06" in checks["driver_library"].detail
    assert "NVML library 570.124" in checks_of("mismatch-570-nvml-library", gpus=1)["driver_library"].detail


def test_driver_not_loaded():
    checks = checks_of("driver-not-loaded-kernel-3.13", gpus=1)
    assert checks["kernel"].status == "pass"  # 3.13 >= 3.10
    assert checks["nvidia_driver"].status == "fail" and "couldn't communicate" in checks["nvidia_driver"].detail


def test_smoke_failure_makes_a_driver_ready_host_unfit():
    checks = checks_of("tesla-p4-530-no-toolkit", gpus=1, image_cuda="12.1")
    assert checks["nvidia_driver"].status == "pass" and checks["driver_cuda"].status == "pass"
    assert checks["gpu_smoke"].status == "fail"
    assert verdict(list(checks.values())) == "unfit"


def test_old_docker_fails_gpu_cases_and_warns_cpu_cases():
    assert checks_of("docker-18.06-kata", gpus=1)["docker"].status == "fail"
    assert checks_of("docker-18.06-kata", gpus=0)["docker"] == \
        Check("docker", "warn", "Docker 18.06.1-ce is older than 19.03 (no GPU device requests)")
    assert checks_of("docker-19.03-fedora", gpus=0)["docker"].status == "pass"


def test_kernel_older_than_3_10_fails():
    checks = evaluate(HostFacts(kernel="2.6.32-754.el6.x86_64", docker_version="19.03.15",
                                docker_root_free_bytes=10**11),
                      HostNeeds())
    assert [c.status for c in checks] == ["fail", "pass", "pass"]


def test_disk_needs():
    facts = HostFacts(kernel="5.15.0", docker_version="24.0.7", docker_root_free_bytes=5 * 10**9)
    assert verdict(evaluate(facts, HostNeeds(min_free_bytes=4 * 10**9))) == "ready"
    failed = {c.name: c for c in evaluate(facts, HostNeeds(min_free_bytes=20 * 10**9))}["disk"]
    assert failed.detail == "only 5.0 GB free on Docker's data root, need 20.0 GB"


def test_gpu_containers_that_start_through_the_toolkit_hook_pass_without_a_registered_runtime(tmp_path):
    """The standard NVIDIA Container Toolkit setup serves `--gpus` through its hook: `docker info` lists runc only
    (the dev VM's real one), and the GPU smoke container starts. The smoke output is the H100 capture's
    `nvidia-smi -L` line (the command the smoke container runs), next to that capture's driver outputs."""
    for name in ("docker-info.json", "docker-version.txt", "df-docker-root.txt", "uname-r.txt"):
        (tmp_path / name).write_text((HOSTS / "local-vm-nogpu" / name).read_text())
    for name in ("nvidia-smi.txt", "nvidia-smi-query.csv"):
        (tmp_path / name).write_text((HOSTS / "h100-590-cuda13.1" / name).read_text())
    (tmp_path / "gpu-smoke.txt").write_text(
        "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-0000-0000-0000-000000000000)\n")
    facts = facts_from_dir(tmp_path)
    assert facts.nvidia_runtime is False and facts.default_runtime == "runc" and facts.gpu_smoke == "pass"
    checks = evaluate(facts, HostNeeds(gpus=1, image_cuda="12.1"))
    assert {c.name: c for c in checks}["nvidia_runtime"] == Check(
        "nvidia_runtime", "pass", "a --gpus container started: the NVIDIA Container Toolkit works")
    assert verdict(checks) == "ready"


def test_cdi_spec_folders_alone_are_no_nvidia_runtime():
    """Docker 28 lists its default CDI spec folders on every engine (a real Docker 28.2.0 VM without NVIDIA
    software); only a discovered nvidia.com/gpu device (docker/cli's own sample output) says the toolkit wrote a
    spec."""
    facts = facts_from_dir(HOSTS / "docker-28.2-cdi-dirs-no-toolkit")
    assert facts.cdi_spec_dirs == ["/etc/cdi", "/var/run/cdi"] and facts.cdi_devices == [] and facts.gpu_smoke is None
    runtime = {c.name: c for c in evaluate(facts, HostNeeds(gpus=1))}["nvidia_runtime"]
    assert runtime.status == "unknown"
    assert runtime.detail.startswith("no nvidia runtime registered in Docker and no NVIDIA CDI device (Docker lists "
                                     "the CDI spec folders /etc/cdi, /var/run/cdi, but no nvidia.com/gpu device")
    assert "give the host a gpu_smoke_image, or install the NVIDIA Container Toolkit" in runtime.detail
    facts.gpu_smoke, facts.gpu_smoke_detail = F.parse_gpu_smoke(
        (HOSTS / "smoke-could-not-select-device-driver" / "gpu-smoke.txt").read_text(), True)
    runtime = {c.name: c for c in evaluate(facts, HostNeeds(gpus=1))}["nvidia_runtime"]
    assert runtime.status == "fail" and "nvidia-ctk runtime configure --runtime=docker" in runtime.detail
    # the toolkit's hook ran and refused the image: the toolkit is there, the smoke check says what failed
    facts.gpu_smoke, facts.gpu_smoke_detail = F.parse_gpu_smoke(
        (HOSTS / "smoke-cuda-requirement-after-pull" / "gpu-smoke.txt").read_text(), True)
    assert {c.name: c for c in evaluate(facts, HostNeeds(gpus=1))}["nvidia_runtime"].status == "pass"

    golden = HOSTS / "docker-cli-golden-cdi-nvidia-device"
    for info in (F.parse_docker_info_json((golden / "docker-info.json").read_text()),
                 F.parse_docker_info_text((golden / "docker-info.txt").read_text())):
        assert info["runtimes"] == ["runc"] and info["cdi_devices"] == ["com.example.device1", "nvidia.com/gpu=gpu0"]
    assert checks_of("docker-cli-golden-cdi-nvidia-device", gpus=1)["nvidia_runtime"] == Check(
        "nvidia_runtime", "pass", "Docker discovered NVIDIA CDI devices (nvidia.com/gpu=gpu0)")


def test_unreachable_host_is_unfit_with_only_that_reason():
    facts = HostFacts(unreachable="unreachable: 127.0.0.1:40123: connection refused", runner="ssh:x")
    result = host_check(facts, HostNeeds(gpus=1))
    assert result["verdict"] == "unfit"
    assert result["checks"] == [{"name": "reachable", "status": "fail",
                                 "detail": "unreachable: 127.0.0.1:40123: connection refused"}]


def test_verdict_order_and_reasons():
    ok, warn, unknown, fail = (Check("a", "pass", "ok"), Check("b", "warn", "w"), Check("c", "unknown", "u"),
                               Check("d", "fail", "f"))
    assert verdict([ok]) == "ready"
    assert verdict([ok, warn]) == verdict([ok, unknown]) == "degraded"
    assert verdict([ok, warn, fail]) == "unfit"
    assert reasons([ok, warn, fail]) == "d: f"
    assert reasons([ok, warn, unknown]) == "b: w; c: u"


@pytest.mark.parametrize("folder", sorted(p.name for p in HOSTS.iterdir() if p.is_dir()))
def test_every_capture_gives_the_contract_and_one_line_details(folder):
    result = host_check(facts_from_dir(HOSTS / folder), HostNeeds(gpus=1, image_cuda="12.1"))
    assert result["verdict"] in ("ready", "degraded", "unfit")
    assert set(result["facts"]) == CONTRACT_FACTS
    for check in result["checks"]:
        assert {"name", "status", "detail"} <= set(check) <= {"name", "status", "detail", "evidence"}
        assert check["status"] in ("pass", "warn", "fail", "unknown")
        assert check["detail"] and "\n" not in check["detail"], check


def test_the_engine_check_compares_the_hosts_engine_with_the_one_its_cases_use():
    facts = facts_from_dir(HOSTS / "ssh-vm-nogpu")
    own = "O27T:2KJ5:YZKF:EKIN:24NY:LAHI:ZP55:SN3X:QAXA:T6LC:V5MO:A4A6"  # `docker info` over SSH (its ID)
    assert facts.docker_engine_id == own and facts.case_engine_id is None
    assert "engine" not in {c.name for c in evaluate(facts, HostNeeds())}  # not asked (a local host, the CLI)
    facts.case_engine_id = own
    assert [c for c in evaluate(facts, HostNeeds()) if c.name == "engine"] == [
        Check("engine", "pass", "docker_url is the host's own Docker engine")]
    facts.case_engine_id = "another-engine"
    checks = evaluate(facts, HostNeeds())
    assert verdict(checks) == "unfit"
    assert reasons(checks).startswith(f"engine: docker_url reaches Docker engine another-engine, not the host's own "
                                      f"({own}, from `docker info` on the host)")


@pytest.mark.parametrize("driver, gpus, reported, status", [
    ("615.10.01", ["NVIDIA H100 80GB HBM3"], "14.1", "pass"),
    ("575.51.03", ["NVIDIA H100 80GB HBM3"], "12.9", "fail"),
    (None, None, "12.9", "fail"),
    ("575.51.03", ["NVIDIA H100 80GB HBM3"], None, "unknown"),
])
def test_a_cuda_major_newer_than_the_table_is_judged_by_the_cuda_the_driver_reports(driver, gpus, reported, status):
    """README: a CUDA version newer than the table is judged by the CUDA version the driver reports (a fail skips
    the image's cases as driver_too_old instead of failing them at container start)."""
    check = check_driver_for_cuda(driver, "14.0", gpus, reported)
    assert check.status == status, check.detail


def test_a_host_with_fewer_gpus_than_the_largest_case_runs_the_cases_that_fit():
    """A fleet-wide `num_gpus: [1, 2, 4, 8]` on a 1-GPU host: the host is not unfit (its 1-GPU cases run, the larger
    ones are skipped one by one as too_few_gpus); unfit only when not even the smallest GPU case fits."""
    mixed = checks_of("h100-590-cuda13.1", gpus=8, whole_gpus=8, fewest_whole_gpus=1, image_cuda="13.0")
    assert mixed["gpu_count"] == Check("gpu_count", "pass", "1 GPU(s): NVIDIA H100 80GB HBM3; cases need 1 to 8: "
                                       "those that need more than 1 are skipped (too_few_gpus)")
    assert verdict(list(mixed.values())) != "unfit"
    none_fit = checks_of("h100-590-cuda13.1", gpus=8, whole_gpus=8, fewest_whole_gpus=2, image_cuda="13.0")
    assert none_fit["gpu_count"] == Check("gpu_count", "fail", "1 GPU(s), cases need 2")


def test_the_plan_and_the_devices_skip_each_case_larger_than_its_host():
    from fleetbench.config import load_config
    from fleetbench.hosts.devices import assign
    from fleetbench.plan import build_plan

    plan = build_plan(load_config(Path(__file__).resolve().parents[2] / "include/config/fleet.gpu-example.yaml"),
                      {"dag_id": "d", "run_id": "r"})
    host = next(h for h in plan.hosts if h.name == "gpu-rtx3070-01")
    assert (host.needs.whole_gpus, host.needs.fewest_whole_gpus) == (8, 1)
    facts = facts_from_dir(HOSTS / "h100-590-cuda13.1")  # one GPU
    cases = [c for c in plan.cases if c.host == host.name and c.nodes == 1 and c.num_gpus]
    skipped = {c.num_gpus: assign(c, facts) for c in cases}
    assert not skipped[1].skipped
    assert (skipped[2].skip_class, skipped[2].skip_detail) == (
        "too_few_gpus", "the case needs 2 GPU(s); the host has 1 (NVIDIA H100 80GB HBM3)")
