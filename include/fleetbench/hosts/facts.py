"""Host facts: parse a folder of probe outputs (see `probes.py`) into plain data.

A missing or failed probe leaves its fact `None` and records the reason in `unknown`; parsing
never raises on odd output. The folder may come from `gather` (with `probes.json`) or be captured
by hand (files only): both are read the same way.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fleetbench.hosts.probes import GPU_SMOKE_FILE, PROBES, PROBES_FILE

# What nvidia-smi's failure says about the driver: (pattern, driver_state, meaning for people).
NOT_INSTALLED, NOT_LOADED, MISMATCH, NO_DEVICES, NVML_ERROR, GPU_LOST = (
    "not_installed", "not_loaded", "mismatch", "no_devices", "nvml_error", "gpu_lost")
_DRIVER_ERRORS: tuple[tuple[re.Pattern, str, str], ...] = (
    (re.compile(r"Driver/library version mismatch", re.I), MISMATCH,
     "driver/library version mismatch: the NVIDIA driver was upgraded but the old kernel module is still loaded (reboot the host)"),
    (re.compile(r"couldn.t communicate with the NVIDIA driver", re.I), NOT_LOADED,
     "NVIDIA driver not loaded: nvidia-smi couldn't communicate with the NVIDIA driver"),
    (re.compile(r"No devices were found", re.I), NO_DEVICES, "the NVIDIA driver found no GPU"),
    (re.compile(r"GPU is lost|fallen off the bus", re.I), GPU_LOST, "a GPU fell off the bus (GPU is lost): the host needs a reset"),
    (re.compile(r"nvidia-smi: (command )?not found|No such file or directory.*nvidia-smi|nvidia-smi.*No such file", re.I),
     NOT_INSTALLED, "no NVIDIA driver: nvidia-smi not found"),
    (re.compile(r"Failed to initialize NVML: (.+)", re.I), NVML_ERROR, "nvidia-smi failed: Failed to initialize NVML"),
)
# Smoke container failures: (pattern, status, meaning). The first match wins.
_SMOKE_FAILURES: tuple[tuple[re.Pattern, str, str], ...] = (
    (re.compile(r"could not select device driver \"[^\"]*\" with capabilities: \[\[gpu\]\]"), "fail",
     "Docker has no GPU device driver (NVIDIA Container Toolkit missing or not configured)"),
    (re.compile(r"nvidia-container-cli: initialization error: ([^\\\n\"]+)"), "fail", "nvidia-container-cli: initialization error"),
    (re.compile(r"unknown flag: --gpus"), "fail", "this docker CLI has no --gpus (needs Docker >= 19.03)"),
    (re.compile(r"unknown or invalid runtime name: nvidia|Unknown runtime specified nvidia", re.I), "fail", "the nvidia runtime is not registered"),
    (re.compile(r"Unable to find image|pull access denied|manifest unknown|No such image|not found: manifest", re.I), "unknown",
     "the smoke image could not be pulled, so the GPU container was not tried"),
    (re.compile(r"timed out", re.I), "unknown", "the GPU smoke container did not finish in time"),
    (re.compile(r"Cannot connect to the Docker daemon|error during connect", re.I), "unknown", "no Docker engine to run it"),
)
_DRIVER_LINE = re.compile(r"Driver Version:\s*([0-9][0-9.]*)")
_CUDA_LINE = re.compile(r"CUDA Version:\s*([0-9]+\.[0-9]+|N/A)")
_NVRM = re.compile(r"NVRM version:.*?Kernel Module(?: for \S+)?\s+([0-9]+\.[0-9]+(?:\.[0-9]+)?)")
_NVML_LIBRARY = re.compile(r"NVML library version:\s*([0-9][0-9.]*)")
_SERVER_VERSION = re.compile(r"^Server:.*?^\s*Version:\s*(\S+)", re.S | re.M)
# One GPU row of the plain table, for the 79-column (<= R525), 89-column (R530-R545) and 91-column (>= R550)
# layouts alike:  "|   0  Tesla P4                        Off| 00000000:61:00.0 Off |"
_TABLE_GPU = re.compile(r"^\|\s*(\d+)\s+(\S.*?)\s+(?:On|Off|N/A|WDDM|TCC)\s*\|\s*[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d")
_TABLE_MEMORY = re.compile(r"(\d+)MiB\s*/\s*(\d+)MiB")
_SMOKE_GPU = re.compile(r"^GPU (\d+): (.+?) \(UUID: (GPU-[0-9a-fA-F-]+)\)", re.M)
_INT = re.compile(r"-?\d+")
_KNOWN_FILES = {p.filename for p in PROBES} | {GPU_SMOKE_FILE, "docker-info.txt", PROBES_FILE}


@dataclass
class Gpu:
    index: int
    name: str  # as the driver reports it; the plain table cuts long names with "..."
    uuid: str | None
    memory_total_mib: int | None


@dataclass
class HostFacts:
    kernel: str | None = None
    driver_version: str | None = None  # user-space driver (nvidia-smi), else the loaded kernel module
    cuda_driver_version: str | None = None  # the highest CUDA version the driver supports
    gpus: list[Gpu] | None = None  # None: unknown; []: no GPU
    docker_version: str | None = None
    nvidia_runtime: bool | None = None
    default_runtime: str | None = None
    cdi_spec_dirs: list[str] | None = None
    docker_root_free_bytes: int | None = None
    driver_error: str | None = None  # what nvidia-smi said instead of a GPU list, for people
    driver_state: str | None = None  # None when nvidia-smi worked or was not captured; else NOT_INSTALLED, MISMATCH, ...
    kernel_module_version: str | None = None  # /proc/driver/nvidia/version: the driver actually loaded
    nvml_library_version: str | None = None  # what a mismatching nvidia-smi says its library is
    gpu_smoke: str | None = None  # pass | fail | unknown; None: not run
    gpu_smoke_detail: str | None = None
    docker_unreachable: bool = False  # the docker probes ran and failed (as opposed to: not captured)
    runner: str | None = None  # "local" or "ssh:<conn_id>", from probes.json
    unreachable: str | None = None  # why the host could not be reached at all
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
        """Inverse of to_dict; keys it does not know (from older or newer versions) are ignored."""
        known = {f.name for f in dataclasses.fields(cls)}
        data = {k: v for k, v in data.items() if k in known}
        if data.get("gpus") is not None:
            data["gpus"] = [Gpu(**g) for g in data["gpus"]]
        return cls(**data)


# -- parsers of single outputs (pure, never raise) ---------------------------------------------
def parse_gpu_query(text: str) -> list[Gpu]:
    """`nvidia-smi --query-gpu=index,name,uuid,...,memory.total --format=csv[,nounits]`.

    Columns are found by header name, so any field list and order works; values may carry units
    ("81559 MiB") or not ("81559"), and "[N/A]" counts as missing.
    """
    rows = [r for r in csv.reader(io.StringIO(text.strip()), skipinitialspace=True) if r]
    if not rows or "index" not in _header(rows[0]) and "name" not in _header(rows[0]):
        return []
    header = _header(rows[0])
    gpus = []
    for row in rows[1:]:
        rec = {h: _value(row[i]) if i < len(row) else None for i, h in enumerate(header)}
        try:
            index = int(rec.get("index") if rec.get("index") is not None else len(gpus))
        except ValueError:
            continue
        mem = _INT.search(rec.get("memory.total") or "")
        gpus.append(Gpu(index=index, name=rec.get("name") or "unknown", uuid=rec.get("uuid"),
                        memory_total_mib=int(mem.group()) if mem else None))
    return gpus


def query_driver_version(text: str) -> str | None:
    """The `driver_version` column of a query CSV (same for every GPU of a host)."""
    rows = [r for r in csv.reader(io.StringIO(text.strip()), skipinitialspace=True) if r]
    if len(rows) < 2 or "driver_version" not in _header(rows[0]):
        return None
    i = _header(rows[0]).index("driver_version")
    value = _value(rows[1][i]) if i < len(rows[1]) else None
    return value if value and value[0].isdigit() else None


def _header(row: list[str]) -> list[str]:
    return [h.strip().split(" ")[0].lower() for h in row]


def _value(cell: str) -> str | None:
    cell = cell.strip()
    return None if cell in ("", "[N/A]", "N/A", "[Not Supported]") else cell


def parse_smi_table(text: str) -> tuple[str | None, str | None, list[Gpu]]:
    """Plain `nvidia-smi`: (driver version, CUDA version, GPUs) from the banner and the GPU rows.

    Handles the 79-, 89- and 91-column layouts, pre-R410 banners without "CUDA Version", and
    "CUDA Version: N/A" (returned as None). Names longer than the column end in "..." (e.g.
    "NVIDIA GeForce ..."); the table has no UUIDs.
    """
    driver = m.group(1) if (m := _DRIVER_LINE.search(text)) else None
    cuda = m.group(1) if (m := _CUDA_LINE.search(text)) and m.group(1) != "N/A" else None
    gpus: list[Gpu] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not (m := _TABLE_GPU.match(line)):
            continue
        mem = next((int(mm.group(2)) for nxt in lines[i + 1:i + 3] if (mm := _TABLE_MEMORY.search(nxt))), None)
        gpus.append(Gpu(index=int(m.group(1)), name=m.group(2).strip(), uuid=None, memory_total_mib=mem))
    return driver, cuda, gpus


def driver_problem(text: str) -> tuple[str, str] | None:
    """(driver_state, meaning) when nvidia-smi's output says the driver is not usable, else None."""
    for pattern, state, meaning in _DRIVER_ERRORS:
        if m := pattern.search(text):
            if state == NVML_ERROR:
                return state, f"nvidia-smi failed: Failed to initialize NVML: {m.group(1).strip()}"
            return state, meaning
    return None


def parse_kernel_module_version(text: str) -> str | None:
    """`/proc/driver/nvidia/version`: "NVRM version: NVIDIA UNIX x86_64 Kernel Module  520.56.06 ..." (also "Open Kernel Module for x86_64")."""
    return m.group(1) if (m := _NVRM.search(text)) else None


def parse_docker_version_text(text: str) -> str | None:
    m = _SERVER_VERSION.search(text)
    return m.group(1) if m else None


def parse_docker_info_json(text: str) -> dict | None:
    """`docker info --format '{{json .}}'` -> the fields rules need, or None if it is not that JSON."""
    try:
        info = json.loads(text)
    except ValueError:
        return None
    if not isinstance(info, dict) or not info.get("ServerVersion"):
        return None
    return {"docker_version": info.get("ServerVersion"), "runtimes": sorted(info.get("Runtimes") or {}),
            "default_runtime": info.get("DefaultRuntime"), "cdi_spec_dirs": info.get("CDISpecDirs") or [],
            "root_dir": info.get("DockerRootDir")}


def parse_docker_info_text(text: str) -> dict | None:
    """Plain `docker info`: old (<= 18.09, flat) and new (>= 19.03, Client:/Server: sections) layouts."""
    fields: dict[str, str] = {}
    cdi: list[str] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        key, sep, value = line.strip().partition(":")
        if sep and key in ("Server Version", "Runtimes", "Default Runtime", "Docker Root Dir"):
            fields[key] = value.strip()
        elif sep and key == "CDI spec directories":
            cdi = [ln.strip() for ln in lines[i + 1:] if ln.startswith("  ") and ln.strip().startswith("/")][:8]
    if not fields.get("Server Version"):
        return None
    return {"docker_version": fields["Server Version"], "runtimes": fields.get("Runtimes", "").split(),
            "default_runtime": fields.get("Default Runtime"), "cdi_spec_dirs": cdi, "root_dir": fields.get("Docker Root Dir")}


def parse_df(text: str) -> int | None:
    """`df -Pk DIR`: available bytes on the file system of DIR."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    if len(lines) < 2:
        return None
    cols = lines[-1].split()
    try:
        return int(cols[3]) * 1024
    except (IndexError, ValueError):
        return None


def parse_gpu_smoke(text: str, failed: bool | None) -> tuple[str, str]:
    """(status, detail) of `docker run --gpus all IMAGE nvidia-smi -L`; `failed` from probes.json (None: unknown).

    Real failures: `could not select device driver "" with capabilities: [[gpu]]` (no NVIDIA
    Container Toolkit), `nvidia-container-cli: initialization error: ...` (driver not loaded,
    libnvidia-ml.so.1 missing), `unknown flag: --gpus` (docker CLI < 19.03).
    """
    listed = _SMOKE_GPU.findall(text)
    if listed and not failed:
        return "pass", f"a GPU container started and saw {len(listed)} GPU(s): {', '.join(sorted({n for _, n, _ in listed}))}"
    for pattern, status, meaning in _SMOKE_FAILURES:
        if m := pattern.search(text):
            cause = m.group(1).strip() if m.groups() else _line_at(text, m.start())
            return status, f"{meaning}: {cause}"
    if failed is False:
        return "fail", f"the GPU container ran but listed no GPU: {_last_line(text) or 'no output'}"
    return "fail", f"the GPU container failed: {_last_line(text) or 'no output'}"


def _line_at(text: str, pos: int) -> str:
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    return text[start:end if end >= 0 else len(text)].strip()[-300:]


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip() and not ln.startswith("Run 'docker run --help'")]
    return lines[-1][-300:] if lines else ""


# -- a whole folder -----------------------------------------------------------------------------
def _probe_record(folder: Path) -> dict:
    try:
        data = json.loads((folder / PROBES_FILE).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _probe_errors(record: dict) -> dict[str, str]:
    """filename -> error text, from probes.json (absent when the folder was captured by hand)."""
    try:
        return {p["filename"]: p["error"] for p in record.get("probes", []) if p.get("error")}
    except (TypeError, KeyError, AttributeError):
        return {}


def has_probe_outputs(folder: Path) -> bool:
    """Whether the folder holds any file named like a probe output."""
    return any((Path(folder) / name).is_file() for name in _KNOWN_FILES)


class _Folder:
    """Reads probe outputs and remembers why a fact is unknown."""

    def __init__(self, folder: Path, facts: HostFacts):
        self.folder = folder
        self.facts = facts
        self.record = _probe_record(folder)
        self.errors = _probe_errors(self.record)

    def read(self, name: str) -> str | None:
        try:
            return (self.folder / name).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None

    def output(self, name: str, fact: str) -> str | None:
        """The file's text if the probe succeeded; else None, and `fact` becomes unknown with the reason."""
        if name in self.errors:
            self.facts.unknown.setdefault(fact, f"{name}: {self.errors[name]}")
            return None
        text = self.read(name)
        if text is None:
            self.facts.unknown.setdefault(fact, f"{name}: not captured")
        return text


def facts_from_dir(folder: Path) -> HostFacts:
    folder = Path(folder)
    facts = HostFacts()
    src = _Folder(folder, facts)
    facts.runner = src.record.get("runner")
    facts.unreachable = src.record.get("unreachable")
    if facts.unreachable:
        facts.unknown["host"] = facts.unreachable
        return facts
    uname = src.output("uname-r.txt", "kernel")
    if uname and uname.strip():
        facts.kernel = uname.strip().splitlines()[0]
    _nvidia_facts(src, facts)
    _docker_facts(src, facts)
    _smoke_facts(src, facts)
    return facts


def _nvidia_facts(src: _Folder, facts: HostFacts) -> None:
    """Driver, CUDA and GPUs: the query CSV is authoritative for GPUs; the plain table fills gaps."""
    query = src.read("nvidia-smi-query.csv") or ""
    table = src.read("nvidia-smi.txt") or ""
    errors = " ".join(src.errors.get(n, "") for n in ("nvidia-smi-query.csv", "nvidia-smi.txt"))
    if problem := driver_problem(f"{table}\n{query}\n{errors}"):
        facts.driver_state, facts.driver_error = problem
    if m := _NVML_LIBRARY.search(f"{table}\n{query}"):
        facts.nvml_library_version = m.group(1)
    proc = src.read("proc-driver-nvidia-version.txt")
    if proc and "proc-driver-nvidia-version.txt" not in src.errors:
        facts.kernel_module_version = parse_kernel_module_version(proc)

    gpus = parse_gpu_query(query) if "nvidia-smi-query.csv" not in src.errors else []
    table_driver, table_cuda, table_gpus = parse_smi_table(table) if "nvidia-smi.txt" not in src.errors else (None, None, [])
    facts.cuda_driver_version = table_cuda
    facts.driver_version = (query_driver_version(query) if gpus else None) or table_driver or facts.kernel_module_version
    if gpus or table_gpus:
        facts.gpus = gpus or table_gpus
    elif facts.driver_state in (NOT_INSTALLED, NO_DEVICES, NOT_LOADED):
        facts.gpus = []
    elif facts.driver_state:
        facts.unknown["gpus"] = facts.driver_error
    elif not query and not table:
        facts.unknown["gpus"] = "nvidia-smi-query.csv, nvidia-smi.txt: not captured"
    else:
        facts.unknown["gpus"] = f"nvidia-smi: no GPU list in its output ({errors.strip() or 'unrecognised output'})"


def _docker_facts(src: _Folder, facts: HostFacts) -> None:
    """Engine version and runtimes from `docker info` (JSON, else plain text), else the version from `docker version`."""
    info, reasons = None, []
    for name, parse in (("docker-info.json", parse_docker_info_json), ("docker-info.txt", parse_docker_info_text)):
        text = src.read(name)
        if name in src.errors:  # the probe ran and docker said no
            facts.docker_unreachable = True
            reasons.append(f"{name}: {src.errors[name]}")
        elif text is None:
            continue
        elif info := parse(text):
            break
        else:
            facts.docker_unreachable |= "Cannot connect to the Docker daemon" in text
            reasons.append(f"{name}: {_last_line(text) or 'empty'}")
    if info:
        facts.docker_unreachable = False
        facts.docker_version = info["docker_version"]
        facts.nvidia_runtime = any("nvidia" in r for r in info["runtimes"])
        facts.default_runtime = info["default_runtime"]
        facts.cdi_spec_dirs = info["cdi_spec_dirs"]
    else:
        facts.unknown["docker"] = reasons[0] if reasons else "docker-info.json: not captured"
        if text := src.output("docker-version.txt", "docker_version"):
            facts.docker_version = parse_docker_version_text(text)
    if df := src.output("df-docker-root.txt", "disk"):
        facts.docker_root_free_bytes = parse_df(df)


def _smoke_facts(src: _Folder, facts: HostFacts) -> None:
    text = src.read(GPU_SMOKE_FILE)
    if text is None:
        return
    ran = {p.get("filename"): p for p in src.record.get("probes", []) if isinstance(p, dict)}.get(GPU_SMOKE_FILE)
    failed = None if ran is None else ran.get("exit_code") != 0
    facts.gpu_smoke, facts.gpu_smoke_detail = parse_gpu_smoke(text, failed)
