"""Rules over host facts: named checks (pass | warn | fail | unknown) and a verdict (ready | degraded | unfit).

Pure functions: the same facts and needs always give the same checks and verdict. Each check's
detail is one line a person can act on. GPU checks run only when the host's cases need GPUs, so a
CPU-only host without a driver is ready.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from fleetbench.hosts import facts as F
from fleetbench.hosts.facts import HostFacts

# Minimum Linux x86_64 driver of each CUDA toolkit's GA release (NVIDIA CUDA Toolkit Release Notes, Table 3 "CUDA
# Toolkit and Corresponding Driver Versions"): the driver that runs every feature of that CUDA release.
CUDA_MIN_DRIVER: dict[str, str] = {
    "11.0": "450.51.05", "11.1": "455.23", "11.2": "460.27.03", "11.3": "465.19.01", "11.4": "470.42.01",
    "11.5": "495.29.05", "11.6": "510.39.01", "11.7": "515.43.04", "11.8": "520.61.05",
    "12.0": "525.60.13", "12.1": "530.30.02", "12.2": "535.54.03", "12.3": "545.23.06", "12.4": "550.54.14",
    "12.5": "555.42.02", "12.6": "560.28.03", "12.8": "570.26", "12.9": "575.51.03",
    "13.0": "580.65.06", "13.1": "590.44.01",
}
# Minor-version compatibility (CUDA 11 and later): any X.y runs, with a limited feature set (no JIT of PTX newer than
# the driver), on a driver >= this one of the same major family (NVIDIA CUDA Compatibility guide; CUDA 11.x from
# 450.80.02, as its note says).
MINOR_COMPAT: dict[int, str] = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
# Data-center forward-compatibility branches: an older branch runs a newer CUDA major only with the cuda-compat package
# in the image (R535 and R550 as the NGC release notes of CUDA 12.8 and 13.x images list them; R570 and R580, the
# data-center production and long-term branches of NVIDIA's driver support matrix, from their first data-center
# releases): a warning. R570 was missing: a CUDA 13 image was refused on it and ran, with a warning, on R535.
FORWARD_COMPAT_BRANCHES = {"450": "450.51", "470": "470.57", "510": "510.47", "515": "515.65", "525": "525.85",
                           "535": "535.86", "550": "550.54", "570": "570.86", "580": "580.65"}
# Forward compatibility is for data-center GPUs only; these names are consumer boards.
CONSUMER_GPU_MARKERS = ("GeForce", "TITAN")
MIN_KERNEL = (3, 10)
MIN_DOCKER = (19, 3)
GB = 10**9  # disk sizes in messages and needs: gigabytes, the unit of min_free_gb


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # pass | warn | fail | unknown
    detail: str
    # GPU health checks: [{"gpu", "bus_id", "value", "threshold"}, ...]; left out of to_dict when empty.
    evidence: tuple[dict, ...] = ()

    def to_dict(self) -> dict:
        data = asdict(self)
        if not self.evidence:
            del data["evidence"]
        else:
            data["evidence"] = list(self.evidence)
        return data


@dataclass(frozen=True)
class HostNeeds:
    gpus: int = 0  # the most devices a case asks for: whole GPUs or MIG instances (0: CPU cases only)
    image_cuda: str | None = None  # the oldest CUDA of the GPU cases' images (fleetbench.hosts.devices: each case's)
    min_free_bytes: int = 2 * GB
    health: Any = None  # fleetbench.hosts.health.HealthThresholds; None: the defaults
    whole_gpus: int | None = None  # the most whole GPUs a case asks for; None: `gpus` (no MIG case)
    # the fewest whole GPUs a GPU case asks for; None: as many as `whole` (a host with fewer runs none of them)
    fewest_whole_gpus: int | None = None
    mig: dict = field(default_factory=dict)  # MIG profile -> the most instances of it a case asks for

    @property
    def whole(self) -> int:
        return self.gpus if self.whole_gpus is None else self.whole_gpus


def version_tuple(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    parts = []
    for piece in text.replace("-", ".").replace("+", ".").split("."):
        digits = "".join(ch for ch in piece if ch.isdigit()) if piece[:1].isdigit() else ""
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts) or None


def min_driver_for_cuda(cuda: str) -> str | None:
    """The minimum driver of CUDA X.Y's GA release (Table 3); None for a version the table does not have (older than
    11.0, or newer than its last row: no lower row stands in for it, that row's driver may be too old)."""
    want = version_tuple(cuda)
    return CUDA_MIN_DRIVER.get(f"{want[0]}.{want[1]}") if want and len(want) >= 2 else None


def check_driver_for_cuda(driver: str | None, cuda: str, gpu_names: list[str] | None = None,
                          cuda_driver_version: str | None = None) -> Check:
    """Is the driver new enough for the image's CUDA version?

    At or above the version's minimum driver (Table 3): pass. Below it but at or above its major family's
    minor-version-compatibility driver: a warning, since the image runs with a limited feature set (PTX newer than
    the driver cannot be JIT-compiled). An older driver on a data-center forward-compatibility branch (R470, R525,
    R535, R550, ...) runs the image only with the cuda-compat package: a warning; forward compatibility does not
    exist on GeForce/TITAN boards, so there it is a failure. A version newer than the table is judged by the CUDA
    version the driver reports, else by minor-version compatibility. Without a driver version, the reported CUDA
    version is compared instead.
    """
    want = version_tuple(cuda)
    if want is None or len(want) < 2:
        return Check("driver_cuda", "unknown", f"no minimum driver known for CUDA {cuda}")
    need = min_driver_for_cuda(cuda)
    minor = MINOR_COMPAT.get(want[0])
    have = version_tuple(driver)
    reported = version_tuple(cuda_driver_version)
    if need is None and minor is None and reported is None:  # a major the table does not know: the driver's word
        return Check("driver_cuda", "unknown", f"no minimum driver known for CUDA {cuda} (NVIDIA's table here covers "
                                               "11.0 to 13.1) and the driver reports no CUDA version: check the "
                                               "image's CUDA against the driver by hand")
    if have is None:
        if reported is not None and reported[:2] >= want[:2]:
            return Check("driver_cuda", "pass",
                         f"the driver supports CUDA up to {cuda_driver_version}; the image needs CUDA {cuda}")
        if reported is not None and reported[0] == want[0] and minor:
            return Check("driver_cuda", "warn", f"the driver supports CUDA up to {cuda_driver_version}, the image "
                                                f"needs CUDA {cuda}: it runs through minor-version compatibility "
                                                f"(limited features) if the driver is >= {minor}; update the driver")
        if reported is not None:
            return Check("driver_cuda", "fail", f"the driver supports CUDA up to {cuda_driver_version}; the image "
                                                f"needs CUDA {cuda}: update the driver")
        return Check("driver_cuda", "unknown", f"driver version unknown; CUDA {cuda} needs >= {need}" if need else
                     f"driver version unknown; CUDA {cuda} needs at least >= {minor} (minor-version compatibility)")
    if need and have >= version_tuple(need):
        return Check("driver_cuda", "pass", f"driver {driver} runs CUDA {cuda} (needs >= {need})")
    if need is None and reported is not None and reported[:2] >= want[:2]:
        return Check("driver_cuda", "pass", f"driver {driver} supports CUDA up to {cuda_driver_version}; the image "
                                            f"needs CUDA {cuda}")
    wanted = f">= {need}" if need else f"the driver of CUDA {cuda} (newer than the table here)"
    if minor and have >= version_tuple(minor):
        return Check("driver_cuda", "warn",
                     f"driver {driver} runs CUDA {cuda} only through minor-version compatibility (CUDA {want[0]}.x on "
                     f">= {minor}): PTX newer than the driver cannot be JIT-compiled, so kernels shipped only as PTX "
                     f"fail; update the driver to {wanted} for the full feature set")
    branch = str(have[0])
    floor = FORWARD_COMPAT_BRANCHES.get(branch)
    if floor and have >= version_tuple(floor):
        consumer = sorted({n for n in gpu_names or [] if any(m.lower() in n.lower() for m in CONSUMER_GPU_MARKERS)})
        if consumer:
            return Check("driver_cuda", "fail",
                         f"driver {driver} is too old for CUDA {cuda} (needs {wanted}); forward "
                         f"compatibility is for data-center GPUs, not {', '.join(consumer)}: update the driver")
        return Check("driver_cuda", "warn",
                     f"driver {driver} is older than CUDA {cuda} needs ({wanted}); runs only through "
                     f"data-center forward compatibility (R{branch} >= {floor}) with the cuda-compat package in the "
                     "image: update the driver, or make sure the image has cuda-compat")
    return Check("driver_cuda", "fail", f"driver {driver} is too old for CUDA {cuda}: needs {wanted}; update the "
                                        "driver or use an image of an older CUDA")


# -- one function per check ---------------------------------------------------------------------
def check_reachable(facts: HostFacts) -> Check | None:
    if facts.unreachable:
        return Check("reachable", "fail", facts.unreachable)
    if facts.runner:
        return Check("reachable", "pass", f"probes ran ({facts.runner})")
    return None  # a folder captured by hand: nothing known about how


def check_kernel(facts: HostFacts) -> Check:
    kernel = version_tuple(facts.kernel)
    if kernel is None:
        return Check("kernel", "unknown", facts.unknown.get("kernel", "kernel version unknown"))
    if kernel[:2] >= MIN_KERNEL:
        return Check("kernel", "pass", f"kernel {facts.kernel}")
    return Check("kernel", "fail", f"kernel {facts.kernel} is older than 3.10")


def check_docker(facts: HostFacts, needs: HostNeeds) -> Check:
    docker = version_tuple(facts.docker_version)
    if docker is None:
        reason = facts.unknown.get("docker") or facts.unknown.get("docker_version") or "no answer"
        if facts.docker_unreachable:
            return Check("docker", "fail", f"Docker engine not reachable: {reason}")
        return Check("docker", "unknown", f"Docker version unknown: {reason}")
    if docker[:2] >= MIN_DOCKER:
        return Check("docker", "pass", f"Docker {facts.docker_version}")
    status = "fail" if needs.gpus else "warn"
    return Check("docker", status, f"Docker {facts.docker_version} is older than 19.03 (no GPU device requests)")


def check_engine(facts: HostFacts) -> Check | None:
    """The probes ran on the host (over SSH) and saw its Docker engine; the cases run on the engine at its
    docker_url. Are they one engine? Asked only where both IDs are known (an SSH host whose docker_url answered)."""
    here, there = facts.docker_engine_id, facts.case_engine_id
    if here is None or there is None:
        return None
    if here == there:
        return Check("engine", "pass", "docker_url is the host's own Docker engine")
    return Check("engine", "fail", f"docker_url reaches Docker engine {there[:80]}, not the host's own ({here[:80]}, "
                                   "from `docker info` on the host): its images and cases would be on another "
                                   "machine (a unix:// docker_url is the Airflow worker's engine); give the host's "
                                   "engine (tcp:// with docker_tls_conn_id) or a queue whose worker runs on the host")


def check_disk(facts: HostFacts, needs: HostNeeds) -> Check:
    free = facts.docker_root_free_bytes
    if free is None:
        return Check("disk", "unknown", facts.unknown.get("disk", "free space on Docker's data root unknown"))
    if free >= needs.min_free_bytes:
        return Check("disk", "pass", f"{free / GB:.1f} GB free on Docker's data root")
    return Check("disk", "fail",
                 f"only {free / GB:.1f} GB free on Docker's data root, need {needs.min_free_bytes / GB:.1f} GB")


def check_nvidia_driver(facts: HostFacts) -> Check:
    """Is an NVIDIA kernel driver loaded? (A version mismatch is a separate check.)"""
    if facts.driver_state == F.MISMATCH:
        loaded = facts.kernel_module_version or "unknown version"
        return Check("nvidia_driver", "pass", f"NVIDIA kernel module {loaded} loaded")
    if facts.driver_state:
        return Check("nvidia_driver", "fail", facts.driver_error or facts.driver_state)
    if facts.driver_version:
        return Check("nvidia_driver", "pass", f"NVIDIA driver {facts.driver_version}")
    if "gpus" in facts.unknown:
        return Check("nvidia_driver", "unknown", f"NVIDIA driver unknown ({facts.unknown['gpus']})")
    return Check("nvidia_driver", "fail", "no NVIDIA driver")


def check_driver_library(facts: HostFacts) -> Check:
    """Driver upgraded without a reboot: nvidia-smi says
    "Failed to initialize NVML: Driver/library version mismatch"."""
    if facts.driver_state == F.MISMATCH:
        parts = [f"kernel module {facts.kernel_module_version}" if facts.kernel_module_version else None,
                 f"NVML library {facts.nvml_library_version}" if facts.nvml_library_version else None]
        versions = ", ".join(p for p in parts if p)
        return Check("driver_library", "fail", f"{facts.driver_error}{f' ({versions})' if versions else ''}")
    if facts.driver_version and not facts.driver_state:
        return Check("driver_library", "pass", "NVML library and kernel module agree")
    return Check("driver_library", "unknown", "not known (nvidia-smi did not run)")


def check_nvidia_runtime(facts: HostFacts) -> Check:
    """Can Docker give a container NVIDIA GPUs? Cases ask with a device request (`--gpus`), which the NVIDIA Container
    Toolkit serves through its runtime hook with no runtime registered in Docker: `docker info` cannot show that
    setup, so the GPU smoke container decides. Without it, a registered `nvidia` runtime or an `nvidia.com/gpu` CDI
    device (Docker 28+) says the toolkit is set up; CDI spec folders alone do not (Docker 28 lists its default ones
    on every engine)."""
    if facts.gpu_smoke == "pass":
        return Check("nvidia_runtime", "pass", "a --gpus container started: the NVIDIA Container Toolkit works")
    if facts.nvidia_runtime:
        return Check("nvidia_runtime", "pass", "nvidia runtime registered in Docker")
    if nvidia := [d for d in facts.cdi_devices or [] if d.startswith("nvidia.com/gpu=")]:
        return Check("nvidia_runtime", "pass", f"Docker discovered NVIDIA CDI devices ({', '.join(nvidia[:4])})")
    if facts.nvidia_runtime is None:
        return Check("nvidia_runtime", "unknown", "Docker runtimes unknown")
    if facts.gpu_smoke == "fail" and "nvidia-container-cli" in (facts.gpu_smoke_detail or ""):
        return Check("nvidia_runtime", "pass", "the NVIDIA Container Toolkit's hook ran in the GPU smoke container "
                                               "(which failed for another reason: see gpu_smoke)")
    missing = "no nvidia runtime registered in Docker and no NVIDIA CDI device" + (
        f" (Docker lists the CDI spec folders {', '.join(facts.cdi_spec_dirs)}, but no nvidia.com/gpu device in them)"
        if facts.cdi_spec_dirs else "")
    if facts.gpu_smoke == "fail":
        return Check("nvidia_runtime", "fail", f"{missing}, and the GPU smoke container failed: install the NVIDIA "
                                               "Container Toolkit, run `nvidia-ctk runtime configure --runtime=docker` "
                                               "and restart Docker")
    why = "not run" if facts.gpu_smoke is None else "its result is unknown: see gpu_smoke"
    return Check("nvidia_runtime", "unknown",
                 f"{missing}; the toolkit's --gpus hook needs neither, but the GPU smoke container ({why}) is what "
                 "shows it works: give the host a gpu_smoke_image, or install the NVIDIA Container Toolkit")


def check_gpu_smoke(facts: HostFacts) -> Check:
    if facts.gpu_smoke is None:
        return Check("gpu_smoke", "unknown",
                     "GPU smoke container not run (gpu-smoke.txt not captured; give a smoke image)")
    return Check("gpu_smoke", facts.gpu_smoke, facts.gpu_smoke_detail or "")


def check_gpu_count(facts: HostFacts, needs: HostNeeds) -> Check:
    """Enough GPUs for the whole-GPU cases (MIG cases need one GPU at least; their instances are checked per case,
    fleetbench.hosts.devices). A host with fewer GPUs than the largest case asks for, but enough for the smallest,
    runs the cases it can: each larger one is skipped as `too_few_gpus` (fleetbench.hosts.devices), as a fleet-wide
    `num_gpus: [1, 2, 4, 8]` on a 1-GPU host asks. Unfit only when no GPU case fits."""
    want = max(needs.whole, 1 if needs.mig else 0)
    fewest = needs.whole if needs.fewest_whole_gpus is None else min(needs.fewest_whole_gpus, needs.whole)
    least = max(fewest, 1) if needs.whole or needs.mig else 0
    if facts.gpus is None:
        return Check("gpu_count", "unknown", f"GPU list unknown; cases need {want}")
    have = len(facts.gpus)
    if have >= want:
        return Check("gpu_count", "pass", f"{have} GPU(s): {facts.gpu_model}; cases need {want}")
    if have >= least:
        return Check("gpu_count", "pass", f"{have} GPU(s): {facts.gpu_model}; cases need {least} to {want}: those "
                                          f"that need more than {have} are skipped (too_few_gpus)")
    return Check("gpu_count", "fail", f"{have} GPU(s), cases need {least}")


def evaluate(facts: HostFacts, needs: HostNeeds) -> list[Check]:
    reachable = check_reachable(facts)
    if facts.unreachable:
        return [reachable]
    checks = [c for c in (reachable, check_kernel(facts), check_docker(facts, needs), check_engine(facts),
                          check_disk(facts, needs)) if c]
    if needs.gpus == 0:
        return checks
    checks += [check_nvidia_driver(facts), check_driver_library(facts)]
    if needs.image_cuda:
        names = [g.name for g in facts.gpus or []]
        checks.append(check_driver_for_cuda(facts.driver_version, needs.image_cuda, names, facts.cuda_driver_version))
    checks += [check_nvidia_runtime(facts), check_gpu_smoke(facts), check_gpu_count(facts, needs)]
    from fleetbench.hosts.health import evaluate_health  # health imports this module

    return checks + evaluate_health(facts, needs)


def verdict(checks: list[Check]) -> str:
    statuses = {c.status for c in checks}
    if "fail" in statuses:
        return "unfit"
    if statuses & {"warn", "unknown"}:
        return "degraded"
    return "ready"


def reasons(checks: list[Check]) -> str:
    """One line for people: what makes the host unfit (or degraded)."""
    bad = [c for c in checks if c.status == "fail"] or [c for c in checks if c.status in ("warn", "unknown")]
    return "; ".join(f"{c.name}: {c.detail}" for c in bad)


def host_check(facts: HostFacts, needs: HostNeeds) -> dict:
    """The host-check JSON contract."""
    checks = evaluate(facts, needs)
    result = {"verdict": verdict(checks), "facts": facts.public(), "checks": [c.to_dict() for c in checks]}
    if any(getattr(facts, name) is not None for name in ("gpu_health", "topology", "xid", "dcgm_diag")) \
            or facts.probe_unreadable:
        result["gpu_health"] = facts.health()
    return result
