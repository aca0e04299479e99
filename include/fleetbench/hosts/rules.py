"""Rules over host facts: named checks (pass | warn | fail | unknown) and a verdict (ready | degraded | unfit).

Pure functions: the same facts and needs always give the same verdict.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

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
MIN_KERNEL = (3, 10)
MIN_DOCKER = (19, 3)


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # pass | warn | fail | unknown
    detail: str

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class HostNeeds:
    gpus: int = 0
    image_cuda: str | None = None
    min_free_bytes: int = 2 * 1024**3


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


def check_driver_for_cuda(driver: str | None, cuda: str) -> Check:
    need = min_driver_for_cuda(cuda)
    have = version_tuple(driver)
    if need is None:
        return Check("driver_cuda", "unknown", f"no minimum driver known for CUDA {cuda}")
    if have is None:
        return Check("driver_cuda", "unknown", f"driver version unknown; CUDA {cuda} needs >= {need}")
    if have >= version_tuple(need):
        return Check("driver_cuda", "pass", f"driver {driver} runs CUDA {cuda} (needs >= {need})")
    branch = str(have[0])
    floor = FORWARD_COMPAT_BRANCHES.get(branch)
    if floor and have >= version_tuple(floor):
        return Check("driver_cuda", "warn", f"driver {driver} is older than {need} (CUDA {cuda}); runs only through data-center forward compatibility (R{branch} >= {floor}) with cuda-compat")
    return Check("driver_cuda", "fail", f"driver {driver} is too old for CUDA {cuda}: needs >= {need}")


def evaluate(facts: HostFacts, needs: HostNeeds) -> list[Check]:
    checks: list[Check] = []
    kernel = version_tuple(facts.kernel)
    if kernel is None:
        checks.append(Check("kernel", "unknown", facts.unknown.get("kernel", "kernel version unknown")))
    elif kernel[:2] >= MIN_KERNEL:
        checks.append(Check("kernel", "pass", f"kernel {facts.kernel}"))
    else:
        checks.append(Check("kernel", "fail", f"kernel {facts.kernel} is older than 3.10"))

    docker = version_tuple(facts.docker_version)
    if docker is None:
        reason = facts.unknown.get("docker") or facts.unknown.get("docker_version") or "no answer"
        checks.append(Check("docker", "fail", f"Docker engine not reachable: {reason}"))
    elif docker[:2] >= MIN_DOCKER:
        checks.append(Check("docker", "pass", f"Docker {facts.docker_version}"))
    else:
        status = "fail" if needs.gpus else "warn"
        checks.append(Check("docker", status, f"Docker {facts.docker_version} is older than 19.03 (no GPU device requests)"))

    if facts.docker_root_free_bytes is None:
        checks.append(Check("disk", "unknown", facts.unknown.get("disk", "free space on Docker's data root unknown")))
    elif facts.docker_root_free_bytes >= needs.min_free_bytes:
        checks.append(Check("disk", "pass", f"{facts.docker_root_free_bytes / 1024**3:.1f} GiB free on Docker's data root"))
    else:
        checks.append(Check("disk", "fail", f"only {facts.docker_root_free_bytes / 1024**3:.1f} GiB free on Docker's data root, need {needs.min_free_bytes / 1024**3:.1f} GiB"))

    if needs.gpus == 0:
        return checks

    if facts.driver_error:
        checks.append(Check("nvidia_driver", "fail", facts.driver_error))
    elif facts.driver_version:
        checks.append(Check("nvidia_driver", "pass", f"NVIDIA driver {facts.driver_version}"))
    elif "gpus" in facts.unknown:
        checks.append(Check("nvidia_driver", "fail", f"no NVIDIA driver ({facts.unknown['gpus']})"))
    else:
        checks.append(Check("nvidia_driver", "fail", "no NVIDIA driver"))

    if needs.image_cuda:
        checks.append(check_driver_for_cuda(facts.driver_version, needs.image_cuda))

    if facts.nvidia_runtime:
        checks.append(Check("nvidia_runtime", "pass", "nvidia runtime registered in Docker"))
    elif facts.cdi_spec_dirs:
        checks.append(Check("nvidia_runtime", "pass", f"CDI available ({', '.join(facts.cdi_spec_dirs)})"))
    elif facts.nvidia_runtime is None:
        checks.append(Check("nvidia_runtime", "unknown", "Docker runtimes unknown"))
    else:
        checks.append(Check("nvidia_runtime", "fail", "no NVIDIA runtime registered in Docker and no CDI: install the NVIDIA Container Toolkit"))

    have = len(facts.gpus or [])
    if facts.gpus is None:
        checks.append(Check("gpu_count", "unknown", f"GPU list unknown; cases need {needs.gpus}"))
    elif have >= needs.gpus:
        checks.append(Check("gpu_count", "pass", f"{have} GPU(s): {facts.gpu_model}; cases need {needs.gpus}"))
    else:
        checks.append(Check("gpu_count", "fail", f"{have} GPU(s), cases need {needs.gpus}"))
    return checks


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
    return {"verdict": verdict(checks), "facts": facts.public(), "checks": [c.to_dict() for c in checks]}
