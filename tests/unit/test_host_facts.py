"""Parsing host probe outputs into facts, against outputs captured on real machines.

The folders under tests/fixtures/hosts/ come from this project's dev VM and from public issues and
repositories (see SOURCES.md there). The few inline strings below are marked where they are hand-written.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetbench.hosts import facts as F
from fleetbench.hosts import gpu_health as G
from fleetbench.hosts.facts import HostFacts, facts_from_dir, has_probe_outputs

HOSTS = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"


def facts_of(name: str) -> HostFacts:
    return facts_from_dir(HOSTS / name)


def gpu_summary(facts: HostFacts) -> list[tuple]:
    return [(g.index, g.name, g.uuid, g.memory_total_mib) for g in facts.gpus]


# -- the plain nvidia-smi table in its three layouts -------------------------------------------
@pytest.mark.parametrize("folder, width, driver, cuda, gpus", [
    ("geforce-525-79col", 79, "525.125.06", "12.0", [(0, "NVIDIA GeForce ...", None, 23028)]),
    ("gt705-375-no-cuda-line", 79, "375.66", None, [(0, "GeForce GT 705", None, 964)]),
    ("titanxp-410-cuda-na", 79, "410.72", None, [(0, "TITAN Xp", None, 12187)]),
    ("tesla-p4-530-no-toolkit", 89, "530.30.02", "12.1", [(0, "Tesla P4", None, 7680)]),
    ("a10-550-cuda12.4", 91, "550.127.05", "12.4", [(0, "NVIDIA A10", None, 23028)]),
    ("h100-590-cuda13.1", 91, "590.48.01", "13.1", [(0, "NVIDIA H100 80GB HBM3", None, 81559)]),
    ("rtx2080s-610-cuda13.3", 91, "610.57.04", "13.3", [(0, "NVIDIA GeForce RTX 2080 ...", None, 8192)]),
])
def test_plain_table_layouts(folder, width, driver, cuda, gpus):
    text = (HOSTS / folder / "nvidia-smi.txt").read_text()
    assert max(len(line.rstrip()) for line in text.splitlines() if line.startswith("+")) == width
    assert F.parse_smi_table(text) == (driver, cuda, [F.Gpu(*g) for g in gpus])


def test_r610_versions_are_the_kmd_and_cuda_umd_versions_without_the_deprecation_note():
    """R610 names them "KMD Version"/"CUDA UMD Version" in the banner, and `-q` tags its old "Driver Version" and
    "CUDA Version" lines "[Deprecated; ...]". The folder has no query CSV, so `-q` is read too."""
    q = (HOSTS / "rtx2080s-610-cuda13.3" / "nvidia-smi-q.txt").read_text()
    assert "610.57.04 [Deprecated;" in q and "13.3 [Deprecated;" in q
    facts = facts_of("rtx2080s-610-cuda13.3")
    assert (facts.driver_version, facts.cuda_driver_version) == ("610.57.04", "13.3")
    parsed = G.parse_smi_text(q)
    assert (parsed["driver_version"], parsed["cuda_version"], parsed["cuda_not_found"]) == ("610.57.04", "13.3", False)
    old = q.replace("KMD Version", "KMD").replace("CUDA UMD Version", "CUDA UMD")  # only the deprecated lines left
    assert G.parse_smi_text(old)["driver_version"] == "610.57.04" and G.parse_smi_text(old)["cuda_version"] == "13.3"


def test_table_rows_of_the_processes_block_are_not_gpus():
    text = (HOSTS / "h100-590-cuda13.1" / "nvidia-smi.txt").read_text()
    assert "No running processes found" in text
    assert len(F.parse_smi_table(text)[2]) == 1


# -- the query CSV ------------------------------------------------------------------------------
def test_query_csv_columns_are_found_by_name_with_units():
    """A 212-field CSV with units: driver_version is column 2 and index column 29, not where our probe puts them."""
    text = (HOSTS / "h100-590-cuda13.1" / "nvidia-smi-query.csv").read_text()
    assert F.parse_gpu_query(text) == [F.Gpu(0, "NVIDIA H100 80GB HBM3", "GPU-00000000-0000-0000-0000-000000000000",
                                             81559)]
    assert F.query_driver_version(text) == "590.48.01"


def test_query_csv_without_units_and_with_na_cells():
    # Hand-written in the shape of `--format=csv,nounits` (values from the gpud A10 capture); the second row is made up.
    text = ("index, name, uuid, driver_version, memory.total [MiB]\n"
            "0, NVIDIA A10, GPU-51ae0086-e1ac-4a20-f062-9caa44e4df6d, 550.127.05, 23028\n"
            "1, NVIDIA A10, [N/A], 550.127.05, [N/A]\n")
    assert F.parse_gpu_query(text) == [F.Gpu(0, "NVIDIA A10", "GPU-51ae0086-e1ac-4a20-f062-9caa44e4df6d", 23028),
                                       F.Gpu(1, "NVIDIA A10", None, None)]
    assert F.query_driver_version(text) == "550.127.05"


def test_query_csv_error_text_is_no_gpu_list():
    assert F.parse_gpu_query("Failed to initialize NVML: Driver/library version mismatch\n") == []
    assert F.query_driver_version("nvidia-smi: command not found") is None


def test_h100_folder_prefers_the_query_csv_over_the_table():
    facts = facts_of("h100-590-cuda13.1")
    assert ((facts.kernel, facts.driver_version, facts.cuda_driver_version)
            == ("5.15.0-185-generic", "590.48.01", "13.1"))
    assert gpu_summary(facts) == [(0, "NVIDIA H100 80GB HBM3", "GPU-00000000-0000-0000-0000-000000000000", 81559)]
    assert facts.gpu_model == "NVIDIA H100 80GB HBM3"


# -- driver states --------------------------------------------------------------------------------
def test_driver_library_mismatch_with_loaded_module_version():
    facts = facts_of("mismatch-520-debian")
    assert facts.driver_state == F.MISMATCH
    assert facts.kernel_module_version == "520.56.06"
    assert facts.driver_version == "520.56.06"  # the loaded module: what a container would get
    assert facts.gpus is None and "mismatch" in facts.unknown["gpus"]


def test_driver_library_mismatch_names_the_nvml_library():
    facts = facts_of("mismatch-570-nvml-library")
    assert ((facts.driver_state, facts.nvml_library_version, facts.kernel)
            == (F.MISMATCH, "570.124", "5.15.0-157-generic"))
    assert facts.driver_version is None


def test_driver_not_loaded_after_a_kernel_upgrade():
    facts = facts_of("driver-not-loaded-kernel-3.13")
    assert facts.driver_state == F.NOT_LOADED
    assert "couldn't communicate with the NVIDIA driver" in facts.driver_error
    assert facts.gpus == [] and facts.kernel == "3.13.0-116-generic"


@pytest.mark.parametrize("folder, said", [
    ("local-vm-nogpu", "nvidia-smi: command not found"),  # LocalRunner: no such binary
    ("ssh-vm-nogpu", "bash: line 1: nvidia-smi: command not found"),  # the remote shell, exit 127
])
def test_no_driver_installed(folder, said):
    assert (HOSTS / folder / "nvidia-smi.txt").read_text().strip() == said
    facts = facts_of(folder)
    assert (facts.driver_state, facts.driver_error) == (F.NOT_INSTALLED, "no NVIDIA driver: nvidia-smi not found")
    assert facts.gpus == [] and facts.driver_version is None and facts.kernel_module_version is None


@pytest.mark.parametrize("text, state", [
    # nvidia-smi's own messages, typed by hand from their well-known wording:
    ("No devices were found\n", F.NO_DEVICES),
    ("Unable to determine the device handle for GPU 0000:3B:00.0: GPU is lost.  "
     "Reboot the system to recover this GPU\n", F.GPU_LOST),
    ("Failed to initialize NVML: Unknown Error\n", F.NVML_ERROR),
    # curly quote, as pasted in qixuema/envs#4
    ("NVIDIA-SMI has failed because it couldn‘t communicate with the NVIDIA driver.", F.NOT_LOADED),
])
def test_other_driver_problems(text, state):
    assert F.driver_problem(text)[0] == state


def test_kernel_module_version_variants():
    proprietary = (HOSTS / "mismatch-520-debian" / "proc-driver-nvidia-version.txt").read_text()
    assert F.parse_kernel_module_version(proprietary) == "520.56.06"
    # Hand-written in the open-kernel-module wording of R515 and newer:
    open_module = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  535.104.05  Release Build  "
                   "(dvs-builder@U16)\n")
    assert F.parse_kernel_module_version(open_module) == "535.104.05"
    assert F.parse_kernel_module_version("cat: /proc/driver/nvidia/version: No such file or directory") is None


# -- docker ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("folder, version, nvidia, default", [
    ("vm-docker-info-plain", "20.10.24+dfsg1", False, "runc"),   # Client:/Server: layout, docker CLI 28
    ("docker-19.03-fedora", "19.03.11", False, "runc"),
    ("docker-18.06-kata", "18.06.1-ce", False, "runc"),          # flat layout, other runtime registered
    ("local-vm-nogpu", "20.10.24+dfsg1", False, "runc"),          # docker info --format '{{json .}}'
])
def test_docker_info_layouts(folder, version, nvidia, default):
    facts = facts_of(folder)
    assert (facts.docker_version, facts.nvidia_runtime, facts.default_runtime) == (version, nvidia, default)
    assert "docker" not in facts.unknown


def test_docker_info_text_fields():
    text = (HOSTS / "docker-18.06-kata" / "docker-info.txt").read_text()
    assert F.parse_docker_info_text(text)["runtimes"] == ["kata-runtime", "runc"]
    assert (F.parse_docker_info_text((HOSTS / "docker-19.03-fedora" / "docker-info.txt").read_text())["root_dir"]
            == "/var/lib/docker")
    assert F.parse_docker_info_text("Cannot connect to the Docker daemon at unix:///var/run/docker.sock.") is None


def test_docker_info_json_with_nvidia_runtime_and_cdi():
    # Hand-written: the fields of `docker info --format '{{json .}}'` on a host with the NVIDIA Container Toolkit.
    text = json.dumps({"ServerVersion": "26.1.3", "DefaultRuntime": "runc", "CDISpecDirs": ["/etc/cdi", "/var/run/cdi"],
                       "Runtimes": {"io.containerd.runc.v2": {"path": "runc"},
                                    "nvidia": {"path": "nvidia-container-runtime"}}})
    info = F.parse_docker_info_json(text)
    assert (info["runtimes"] == ["io.containerd.runc.v2", "nvidia"]
            and info["cdi_spec_dirs"] == ["/etc/cdi", "/var/run/cdi"])


def test_docker_version_text():
    assert F.parse_docker_version_text((HOSTS / "docker-18.06-kata" / "docker-version.txt").read_text()) == "18.06.1-ce"
    assert (F.parse_docker_version_text((HOSTS / "local-vm-nogpu" / "docker-version.txt").read_text())
            == "20.10.24+dfsg1")


def test_df_of_docker_root():
    free = F.parse_df((HOSTS / "local-vm-nogpu" / "df-docker-root.txt").read_text())
    assert free and free > 1024**3
    assert F.parse_df("df: /nonexistent: No such file or directory") is None


# -- GPU smoke container -----------------------------------------------------------------------------
@pytest.mark.parametrize("folder, status, needle", [
    ("local-vm-nogpu", "fail", 'could not select device driver "" with capabilities: [[gpu]]'),
    ("smoke-could-not-select-device-driver", "fail", 'could not select device driver "" with capabilities: [[gpu]]'),
    ("tesla-p4-530-no-toolkit", "fail", 'could not select device driver "nvidia" with capabilities: [[gpu]]'),
    ("smoke-libnvidia-ml-missing", "fail", "load library failed: libnvidia-ml.so.1"),
    ("smoke-nvml-driver-not-loaded", "fail", "nvml error: driver not loaded"),
    ("smoke-cuda-requirement-after-pull", "fail", "unsatisfied condition: cuda>=12.8"),
])
def test_gpu_smoke_failures(folder, status, needle):
    facts = facts_of(folder)
    assert facts.gpu_smoke == status
    assert needle in facts.gpu_smoke_detail and "\n" not in facts.gpu_smoke_detail


def test_gpu_smoke_failure_after_a_successful_pull_is_a_failure_not_a_pull_problem():
    """docker prints "Unable to find image '<ref>' locally" and "<tag>: Pulling from <repo>" before every pull, also one
    that works; the issue quoted only what came after them. Those two lines are hand-written in docker's format."""
    said = (HOSTS / "smoke-cuda-requirement-after-pull" / "gpu-smoke.txt").read_text()
    pulled = "Unable to find image 'ghcr.io/synerbi/sirf:petric2' locally\npetric2: Pulling from synerbi/sirf\n" + said
    status, detail = F.parse_gpu_smoke(pulled, failed=True)
    assert (status, detail) == F.parse_gpu_smoke(said, failed=True)
    assert status == "fail" and detail.startswith(
        "nvidia-container-cli refused the smoke image, whose NVIDIA_REQUIRE_* condition the host does not meet")
    assert "update the driver" in detail and detail.endswith(
        "unsatisfied condition: cuda>=12.8, please update your driver to a newer version, or use an earlier cuda "
        "container")
    # a pull that failed is still no GPU failure (output as in jackyjsy/CVPR21Chal-SLR#19)
    denied = ("Unable to find image 'cvpr2021cha_code:latest' locally\ndocker: Error response from daemon: pull access "
              "denied for cvpr2021cha_code, repository does not exist or may require 'docker login': denied: requested "
              "access to the resource is denied.\nSee 'docker run --help'.\n")
    assert F.parse_gpu_smoke(denied, failed=True)[0] == "unknown"


def test_gpu_smoke_success_and_unknowns():
    # `nvidia-smi -L` line as in the H100 capture (run on the host there, not in a container).
    listed = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-0000-0000-0000-000000000000)\n"
    assert (F.parse_gpu_smoke(listed, failed=False)
            == ("pass", "a GPU container started and saw 1 GPU(s): NVIDIA H100 80GB HBM3"))
    pull = ("Unable to find image 'nvidia/cuda:12.1.0-base-ubuntu22.04' locally\n"
            "docker: Error response from daemon: pull access denied")
    assert F.parse_gpu_smoke(pull, failed=True)[0] == "unknown"
    assert F.parse_gpu_smoke("timed out after 120 s", failed=True)[0] == "unknown"
    assert F.parse_gpu_smoke("", failed=False)[0] == "fail"


# -- missing and failed probes never crash -------------------------------------------------------------
def test_missing_probes_are_unknown_with_a_reason():
    facts = facts_of("tesla-p4-530-no-toolkit")
    assert facts.kernel is None and facts.unknown["kernel"] == "uname-r.txt: not captured"
    assert facts.unknown["docker"] == "docker-info.json: not captured"
    assert facts.docker_unreachable is False


def test_failed_probes_are_unknown_with_their_error(tmp_path):
    (tmp_path / "uname-r.txt").write_text("timed out after 15 s")
    (tmp_path / "docker-info.json").write_text("{}\nCannot connect to the Docker daemon at unix:///x.sock.")
    (tmp_path / "nvidia-smi-query.csv").write_bytes(b"\x00\xff garbage \xfe")
    (tmp_path / "probes.json").write_text(json.dumps({"runner": "local", "unreachable": None, "probes": [
        {"filename": "uname-r.txt", "command": ["uname", "-r"], "exit_code": None, "duration_s": 15.0,
         "error": "timed out after 15 s"},
        {"filename": "docker-info.json", "command": ["docker", "info"], "exit_code": 1, "duration_s": 0.1,
         "error": "Cannot connect to the Docker daemon at unix:///x.sock."}]}))
    facts = facts_from_dir(tmp_path)
    assert facts.unknown["kernel"] == "uname-r.txt: timed out after 15 s"
    assert facts.docker_unreachable and "Cannot connect" in facts.unknown["docker"]
    assert facts.gpus is None and "gpus" in facts.unknown
    assert facts.runner == "local"


def test_unreachable_host_folder(tmp_path):
    (tmp_path / "probes.json").write_text(json.dumps({"runner": "ssh:x",
                                                      "unreachable": "unreachable: 10.0.0.9:22: connection refused",
                                                      "probes": []}))
    facts = facts_from_dir(tmp_path)
    assert facts.unreachable == "unreachable: 10.0.0.9:22: connection refused" and facts.kernel is None


def test_has_probe_outputs(tmp_path):
    assert not has_probe_outputs(tmp_path)
    assert has_probe_outputs(HOSTS / "mismatch-520-debian")


def test_facts_round_trip_through_json():
    facts = facts_of("h100-590-cuda13.1")
    again = HostFacts.from_dict(json.loads(json.dumps(facts.to_dict())))
    assert again == facts
    assert HostFacts.from_dict({**facts.to_dict(), "field_of_a_newer_version": 1}) == facts
    assert set(facts.public()) == {"kernel", "driver_version", "cuda_driver_version", "gpus", "docker_version",
                                   "nvidia_runtime", "default_runtime"}
