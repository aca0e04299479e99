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

# Minimum Linux driver per CUDA toolkit (NVIDIA CUDA Toolkit release notes, Table 3).
CUDA_MIN_DRIVER: dict[str, str] = {
    "11.0": "450.51.05",
    "11.8": "520.61.05",
    "12.0": "525.60.13",
    "12.1": "530.30.02",
    "12.2": "535.54.03",
    "12.4": "550.54.14",
    "12.8": "570.26",
    "13.0": "580.65.06",
}
# CUDA 11.x minor-version compatibility: any 11.x runs on >= 450.80.02.
CUDA11_MINOR_COMPAT = "450.80.02"
# Data-center forward-compatibility branches (with the cuda-compat package): runs, but is a warning.
FORWARD_COMPAT_BRANCHES = {"450": "450.51", "470": "470.57", "510": "510.47", "515": "515.65", "525": "525.85"}
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
    image_cuda: str | None = None
    min_free_bytes: int = 2 * GB
    health: Any = None  # fleetbench.hosts.health.HealthThresholds; None: the defaults
    whole_gpus: int | None = None  # the most whole GPUs a case asks for; None: `gpus` (no MIG case)
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
    """Minimum driver for a CUDA version; for versions between table rows the next lower row applies."""
    want = version_tuple(cuda)
    if want is None:
        return None
    if want[0] == 11 and want >= (11, 1):
        return CUDA11_MINOR_COMPAT
    best = None
    for known, driver in sorted(CUDA_MIN_DRIVER.items(), key=lambda kv: version_tuple(kv[0])):
        if version_tuple(known) <= want:
            best = driver
    return best


def check_driver_for_cuda(driver: str | None, cuda: str, gpu_names: list[str] | None = None,
                          cuda_driver_version: str | None = None) -> Check:
    """Is the driver new enough for the image's CUDA version (NVIDIA's minimum-driver table)?

    An older driver on a data-center forward-compatibility branch (R450, R470, R510, R515, R525)
    runs the image only with the cuda-compat package: a warning. Forward compatibility does not
    exist on GeForce/TITAN boards, so there it is a failure. Without a driver version, the
    "CUDA Version" the driver reports is compared instead.
    """
    need = min_driver_for_cuda(cuda)
    have = version_tuple(driver)
    if need is None:
        return Check("driver_cuda", "unknown", f"no minimum driver known for CUDA {cuda}")
    if have is None:
        reported = version_tuple(cuda_driver_version)
        if reported is not None:
            ok = reported[:2] >= version_tuple(cuda)[:2]
            return Check("driver_cuda", "pass" if ok else "fail",
                         f"the driver supports CUDA up to {cuda_driver_version}; the image needs CUDA {cuda}")
        return Check("driver_cuda", "unknown", f"driver version unknown; CUDA {cuda} needs >= {need}")
    if have >= version_tuple(need):
        return Check("driver_cuda", "pass", f"driver {driver} runs CUDA {cuda} (needs >= {need})")
    branch = str(have[0])
    floor = FORWARD_COMPAT_BRANCHES.get(branch)
    if floor and have >= version_tuple(floor):
        consumer = sorted({n for n in gpu_names or [] if any(m.lower() in n.lower() for m in CONSUMER_GPU_MARKERS)})
        if consumer:
            return Check("driver_cuda", "fail",
                         f"driver {driver} is too old for CUDA {cuda} (needs >= {need}); forward "
                         f"compatibility is for data-center GPUs, not {', '.join(consumer)}")
        return Check("driver_cuda", "warn",
                     f"driver {driver} is older than {need} (CUDA {cuda}); runs only through "
                     f"data-center forward compatibility (R{branch} >= {floor}) with cuda-compat")
    return Check("driver_cuda", "fail", f"driver {driver} is too old for CUDA {cuda}: needs >= {need}")


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
    fleetbench.hosts.devices)."""
    want = max(needs.whole, 1 if needs.mig else 0)
    if facts.gpus is None:
        return Check("gpu_count", "unknown", f"GPU list unknown; cases need {want}")
    have = len(facts.gpus)
    if have >= want:
        return Check("gpu_count", "pass", f"{have} GPU(s): {facts.gpu_model}; cases need {want}")
    return Check("gpu_count", "fail", f"{have} GPU(s), cases need {want}")


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
