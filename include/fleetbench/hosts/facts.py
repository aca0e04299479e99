"""Host facts: parse a folder of probe outputs (see `probes.py`) into plain data.

A missing or failed probe leaves its fact `None` and records the reason in `unknown`; parsing
never raises on odd output.
"""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class Gpu:
    index: int
    name: str
    uuid: str | None
    memory_total_mib: int | None


@dataclass
class HostFacts:
    kernel: str | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    gpus: list[Gpu] | None = None  # None: unknown; []: no GPU
    docker_version: str | None = None
    nvidia_runtime: bool | None = None
    default_runtime: str | None = None
    cdi_spec_dirs: list[str] | None = None
    docker_root_free_bytes: int | None = None
    driver_error: str | None = None  # what nvidia-smi said instead of a GPU list
    unknown: dict[str, str] = field(default_factory=dict)  # fact -> why it is unknown

    @property
    def gpu_model(self) -> str | None:
        names = sorted({g.name for g in self.gpus or []})
        return ", ".join(names) or None

    def public(self) -> dict:
        """The fact set of the host-check JSON contract."""
        return {
            "kernel": self.kernel,
            "driver_version": self.driver_version,
            "cuda_driver_version": self.cuda_driver_version,
            "gpus": [asdict(g) for g in self.gpus] if self.gpus is not None else None,
            "docker_version": self.docker_version,
            "nvidia_runtime": self.nvidia_runtime,
            "default_runtime": self.default_runtime,
        }

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "HostFacts":
        data = dict(data)
        if data.get("gpus") is not None:
            data["gpus"] = [Gpu(**g) for g in data["gpus"]]
        return cls(**data)


_DRIVER_ERRORS = (
    ("Driver/library version mismatch", "driver/library version mismatch (driver upgraded, host not rebooted?)"),
    ("couldn't communicate with the NVIDIA driver", "NVIDIA driver not loaded: nvidia-smi couldn't communicate with the NVIDIA driver"),
    ("No devices were found", "no NVIDIA GPU found by the driver"),
    ("command not found", "no NVIDIA driver: nvidia-smi not found"),
)
_DRIVER_LINE = re.compile(r"Driver Version:\s*([0-9][0-9.]*)")
_CUDA_LINE = re.compile(r"CUDA Version:\s*([0-9]+\.[0-9]+)")
_NVRM = re.compile(r"Kernel Module(?: for [^\s]+)?\s+([0-9]+\.[0-9]+(?:\.[0-9]+)?)")
_SERVER_VERSION = re.compile(r"^Server:.*?^\s*Version:\s*(\S+)", re.S | re.M)
_INT = re.compile(r"-?\d+")


def _read(folder: Path, name: str) -> str | None:
    try:
        return (folder / name).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _probe_errors(folder: Path) -> dict[str, str]:
    """filename -> error text, from probes.json (absent when the folder was captured by hand)."""
    try:
        data = json.loads((folder / "probes.json").read_text())
        return {p["filename"]: p["error"] for p in data.get("probes", []) if p.get("error")}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return {}


def parse_gpu_query(text: str) -> list[Gpu]:
    """`nvidia-smi --query-gpu=index,name,uuid,...,memory.total --format=csv[,nounits]`."""
    rows = [r for r in csv.reader(io.StringIO(text.strip())) if r]
    if not rows:
        return []
    header = [h.strip().split(" ")[0].lower() for h in rows[0]]
    gpus = []
    for row in rows[1:]:
        rec = {h: (row[i].strip() if i < len(row) else "") for i, h in enumerate(header)}
        try:
            index = int(rec.get("index", len(gpus)))
        except ValueError:
            continue
        mem = _INT.search(rec.get("memory.total", "") or "")
        gpus.append(Gpu(index=index, name=rec.get("name") or "unknown", uuid=rec.get("uuid") or None,
                        memory_total_mib=int(mem.group()) if mem else None))
    return gpus


def parse_docker_version_text(text: str) -> str | None:
    m = _SERVER_VERSION.search(text)
    return m.group(1) if m else None


def parse_df(text: str) -> int | None:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    if len(lines) < 2:
        return None
    cols = lines[-1].split()
    try:
        return int(cols[3]) * 1024
    except (IndexError, ValueError):
        return None


def facts_from_dir(folder: Path) -> HostFacts:
    folder = Path(folder)
    errors = _probe_errors(folder)
    facts = HostFacts()

    def content(name: str, fact: str) -> str | None:
        if name in errors:
            facts.unknown.setdefault(fact, f"{name}: {errors[name]}")
            return None
        text = _read(folder, name)
        if text is None:
            facts.unknown.setdefault(fact, f"{name}: not captured")
        return text

    uname = content("uname-r.txt", "kernel")
    if uname and uname.strip():
        facts.kernel = uname.strip().splitlines()[0]

    # NVIDIA driver and GPUs: the query CSV is authoritative; the plain table gives the CUDA version.
    smi_err = errors.get("nvidia-smi-query.csv") or errors.get("nvidia-smi.txt")
    smi_text = (_read(folder, "nvidia-smi.txt") or "") + "\n" + (_read(folder, "nvidia-smi-query.csv") or "")
    for needle, meaning in _DRIVER_ERRORS:
        if needle in smi_text or (smi_err and needle in smi_err):
            facts.driver_error = meaning
            break
    query = None if "nvidia-smi-query.csv" in errors else _read(folder, "nvidia-smi-query.csv")
    if query and "index" in query.lower():
        facts.gpus = parse_gpu_query(query)
        dv = next((ln.split(",")[3].strip() for ln in query.strip().splitlines()[1:2] if ln.count(",") >= 3), None)
        facts.driver_version = dv if dv and dv[0].isdigit() else None
    elif facts.driver_error:
        facts.gpus = []
    else:
        facts.unknown["gpus"] = f"nvidia-smi-query.csv: {smi_err or 'not captured'}"
    plain = None if "nvidia-smi.txt" in errors else _read(folder, "nvidia-smi.txt")
    if plain:
        if m := _CUDA_LINE.search(plain):
            facts.cuda_driver_version = m.group(1)
        if not facts.driver_version and (m := _DRIVER_LINE.search(plain)):
            facts.driver_version = m.group(1)
    if not facts.driver_version:
        proc = None if "proc-driver-nvidia-version.txt" in errors else _read(folder, "proc-driver-nvidia-version.txt")
        if proc and (m := _NVRM.search(proc)):
            facts.driver_version = m.group(1)

    info_text = content("docker-info.json", "docker")
    info: dict = {}
    if info_text:
        try:
            info = json.loads(info_text)
        except ValueError:
            facts.unknown["docker"] = "docker-info.json: not JSON"
    if isinstance(info, dict) and info:
        facts.docker_version = info.get("ServerVersion") or None
        runtimes = info.get("Runtimes") or {}
        facts.nvidia_runtime = any("nvidia" in name for name in runtimes)
        facts.default_runtime = info.get("DefaultRuntime")
        facts.cdi_spec_dirs = info.get("CDISpecDirs") or []
    if not facts.docker_version:
        text = content("docker-version.txt", "docker_version")
        if text:
            facts.docker_version = parse_docker_version_text(text)
    df = content("df-docker-root.txt", "disk")
    if df:
        facts.docker_root_free_bytes = parse_df(df)
    return facts
