"""Host facts: parse a folder of probe outputs (see `probes.py`) into plain data.

A missing or failed probe leaves its fact `None` and records the reason in `unknown`; parsing
never raises on odd output. The folder may come from `gather` (with `probes.json`) or be captured
by hand (files only): both are read the same way.

The folder is input like any other: a file may be huge, a FIFO, a symlink to a device, or a
`probes.json` of the wrong shape. Only regular files are read, at most `MAX_PROBE_BYTES` of each;
every pattern is bounded, and numbers are read only up to a sane number of digits. What was wrong
with a file is recorded in `probe_problems`, naming the file, and the facts it held stay unknown.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import itertools
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fleetbench.files import NotRegularFile, open_regular
from fleetbench.hosts import gpu_health
from fleetbench.hosts.probes import (
    DCGM_FILE,
    GPU_LIST_FILE,
    GPU_SMOKE_FILE,
    PROBES,
    PROBES_FILE,
    SMI_TEXT_FILE,
    SMI_XML_FILE,
    TOPO_FILE,
    XID_FILE,
)

#: A probe output is read up to this size; real ones are a few KB.
MAX_PROBE_BYTES = 4 * 1024 * 1024
#: A version or other text fact longer than this is not one (rules turn versions into ints).
MAX_FACT_CHARS = 200

# What nvidia-smi's failure says about the driver: (pattern, driver_state, meaning for people).
NOT_INSTALLED, NOT_LOADED, MISMATCH, NO_DEVICES, NVML_ERROR, GPU_LOST = (
    "not_installed", "not_loaded", "mismatch", "no_devices", "nvml_error", "gpu_lost")
_DRIVER_ERRORS: tuple[tuple[re.Pattern, str, str], ...] = (
    (re.compile(r"Driver/library version mismatch", re.I), MISMATCH,
     "driver/library version mismatch: the NVIDIA driver was upgraded but the old kernel module is still loaded "
     "(reboot the host)"),
    (re.compile(r"couldn.t communicate with the NVIDIA driver", re.I), NOT_LOADED,
     "NVIDIA driver not loaded: nvidia-smi couldn't communicate with the NVIDIA driver"),
    (re.compile(r"No devices were found", re.I), NO_DEVICES, "the NVIDIA driver found no GPU"),
    (re.compile(r"GPU is lost|fallen off the bus", re.I), GPU_LOST,
     "a GPU fell off the bus (GPU is lost): the host needs a reset"),
    (re.compile(r"nvidia-smi: (command )?not found|No such file or directory.{0,200}nvidia-smi"
                r"|nvidia-smi.{0,200}No such file", re.I),
     NOT_INSTALLED, "no NVIDIA driver: nvidia-smi not found"),
    (re.compile(r"Failed to initialize NVML: (.{1,300})", re.I), NVML_ERROR,
     "nvidia-smi failed: Failed to initialize NVML"),
)
# Smoke container failures: (pattern, status, meaning). The first match wins.
_SMOKE_FAILURES: tuple[tuple[re.Pattern, str, str], ...] = (
    (re.compile(r"could not select device driver \"[^\"]{0,200}\" with capabilities: \[\[gpu\]\]"), "fail",
     "Docker has no GPU device driver (NVIDIA Container Toolkit missing or not configured)"),
    (re.compile(r"nvidia-container-cli: initialization error: ([^\\\n\"]{1,300})"), "fail",
     "nvidia-container-cli: initialization error"),
    (re.compile(r"unknown flag: --gpus"), "fail", "this docker CLI has no --gpus (needs Docker >= 19.03)"),
    (re.compile(r"unknown or invalid runtime name: nvidia|Unknown runtime specified nvidia", re.I), "fail",
     "the nvidia runtime is not registered"),
    (re.compile(r"nvidia-container-cli: requirement error: ([^\\\n\"]{1,300})"), "fail",
     "nvidia-container-cli refused the smoke image, whose NVIDIA_REQUIRE_* condition the host does not meet "
     "(for cuda>=X.Y: update the driver, or "
     "set the host's gpu_smoke_image to an image of an older CUDA)"),
    (re.compile(r"Unable to find image|pull access denied|manifest unknown|No such image|not found: manifest", re.I),
     "unknown", "the smoke image could not be pulled, so the GPU container was not tried"),
    (re.compile(r"timed out", re.I), "unknown", "the GPU smoke container did not finish in time"),
    (re.compile(r"Cannot connect to the Docker daemon|error during connect", re.I), "unknown",
     "no Docker engine to run it"),
)
# Versions: bounded digit runs, so that a garbage line can neither take long to scan nor give a huge number.
_VERSION = r"[0-9]{1,6}(?:\.[0-9]{1,6}){0,3}(?![0-9])"
# R610 and later name them "KMD Version" and "CUDA UMD Version" in the table's banner.
_DRIVER_LINE = re.compile(rf"(?:Driver|KMD) Version:[ \t]{{0,32}}({_VERSION})")
_CUDA_LINE = re.compile(r"CUDA (?:UMD )?Version:[ \t]{0,32}([0-9]{1,4}\.[0-9]{1,4}|N/A)")
_NVRM = re.compile(rf"NVRM version:[^\n]{{0,120}}?Kernel Module(?: for \S{{1,40}})?[ \t]{{1,32}}({_VERSION})")
_NVML_LIBRARY = re.compile(rf"NVML library version:[ \t]{{0,32}}({_VERSION})")
_SERVER_VERSION_LINE = re.compile(r"\s{0,32}Version:\s{0,32}(\S{1,200})(?!\S)")
# One GPU row of the plain table, for the 79-column (<= R525), 89-column (R530-R545) and 91-column (>= R550)
# layouts alike:  "|   0  Tesla P4                        Off| 00000000:61:00.0 Off |"
_TABLE_GPU = re.compile(r"^\|\s{0,16}(\d{1,4})\s{1,16}(\S.{0,80}?)\s{1,64}(?:On|Off|N/A|WDDM|TCC)\s{0,16}\|\s{0,16}"
                        r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d")
_TABLE_MEMORY = re.compile(r"(?<!\d)(\d{1,9})MiB\s{0,16}/\s{0,16}(\d{1,9})MiB")
# `docker run` pulls a missing image first ("Unable to find image '<ref>' locally" ... this line); what follows
# is the container's start.
_PULLED = re.compile(r"^Status: (?:Downloaded newer image|Image is up to date) for [^\n]{1,300}$", re.M)
_SMOKE_GPU = re.compile(r"^GPU (\d{1,4}): ([^\n]{1,200}?) \(UUID: (GPU-[0-9a-fA-F-]{1,64})\)", re.M)
_INT = re.compile(r"(?<!\d)-?\d{1,12}(?!\d)")
_SMALL_INT = re.compile(r"\d{1,9}")
_DF_KIB = re.compile(r"\d{1,18}")
HEALTH_FILES = (SMI_XML_FILE, SMI_TEXT_FILE, TOPO_FILE, GPU_LIST_FILE, XID_FILE, DCGM_FILE)
_KNOWN_FILES = {p.filename for p in PROBES} | {GPU_SMOKE_FILE, "docker-info.txt", PROBES_FILE, *HEALTH_FILES}
_PERMISSION = re.compile(r"Operation not permitted|Permission denied|insufficient permissions|not seeing messages",
                         re.I)


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
    # The CDI devices Docker (28+) discovered, e.g. "nvidia.com/gpu=0": unlike the spec folders, which Docker 28 lists
    # on every engine, an nvidia.com/gpu device says the NVIDIA Container Toolkit wrote a spec.
    cdi_devices: list[str] | None = None
    docker_root_free_bytes: int | None = None
    driver_error: str | None = None  # what nvidia-smi said instead of a GPU list, for people
    # None when nvidia-smi worked or was not captured; else NOT_INSTALLED, MISMATCH, ...
    driver_state: str | None = None
    kernel_module_version: str | None = None  # /proc/driver/nvidia/version: the driver actually loaded
    nvml_library_version: str | None = None  # what a mismatching nvidia-smi says its library is
    gpu_smoke: str | None = None  # pass | fail | unknown; None: not run
    gpu_smoke_detail: str | None = None
    docker_unreachable: bool = False  # the docker probes ran and failed (as opposed to: not captured)
    docker_engine_id: str | None = None  # `docker info`'s ID: the engine the probes saw on the host
    # The ID of the engine at the host's docker_url, which runs its cases, when that is asked separately (an SSH
    # host: fleetbench.hosts.check.case_engine_id); the `engine` check compares the two.
    case_engine_id: str | None = None
    runner: str | None = None  # "local" or "ssh:<conn_id>", from probes.json
    unreachable: str | None = None  # why the host could not be reached at all
    # GPU health (see gpu_health.py); None: not captured, or unknown (then `unknown` says why).
    gpu_health: list[dict] | None = None  # one dict per GPU: ECC, retired pages, remapped rows, clocks, PCIe, ...
    gpu_health_source: str | None = None  # the file it was read from: the XML, else the `-q` text
    cuda_not_found: bool = False  # nvidia-smi -q says "CUDA Version: Not Found" (no libcuda for the driver)
    topology: dict | None = None
    # nvidia-smi -L: [{"index", "name", "uuid", "mig": [{"profile", "device", "uuid"}]}] (fleetbench.hosts.devices)
    gpu_list: list[dict] | None = None
    xid: dict | None = None  # {"source", "window_s", "events"}
    dcgm_diag: dict | None = None  # {"dcgm_version", "layout", "tests"}
    probe_unreadable: dict[str, str] = field(default_factory=dict)  # file -> why its output could not be read
    unknown: dict[str, str] = field(default_factory=dict)  # fact -> why it is unknown
    probe_problems: dict[str, str] = field(default_factory=dict)  # file -> why it was not (wholly) read

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

    def health(self) -> dict:
        """The GPU health facts, for the host-check JSON (`gpu_health`) and the warehouse."""
        return {"gpus": self.gpu_health, "source": self.gpu_health_source, "cuda_not_found": self.cuda_not_found,
                "topology": self.topology, "gpu_list": self.gpu_list, "xid": self.xid, "dcgm_diag": self.dcgm_diag,
                "probe_unreadable": self.probe_unreadable,
                "unknown": {k: v for k, v in self.unknown.items() if k in HEALTH_FACTS}}

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
    rows = _csv_rows(text)
    if not rows or "index" not in _header(rows[0]) and "name" not in _header(rows[0]):
        return []
    header = _header(rows[0])
    gpus = []
    for row in rows[1:]:
        rec = {h: _value(row[i]) if i < len(row) else None for i, h in enumerate(header)}
        index = len(gpus) if rec.get("index") is None else _small_int(rec["index"])
        if index is None:
            continue
        mem = _INT.search(rec.get("memory.total") or "")
        gpus.append(Gpu(index=index, name=_short(rec.get("name")) or "unknown", uuid=_short(rec.get("uuid")),
                        memory_total_mib=int(mem.group()) if mem else None))
    return gpus


def query_driver_version(text: str) -> str | None:
    """The `driver_version` column of a query CSV (same for every GPU of a host)."""
    rows = _csv_rows(text)
    if len(rows) < 2 or "driver_version" not in _header(rows[0]):
        return None
    i = _header(rows[0]).index("driver_version")
    value = _short(_value(rows[1][i])) if i < len(rows[1]) else None
    return m.group() if value and (m := re.match(_VERSION, value)) else None


def _csv_rows(text: str) -> list[list[str]]:
    """Non-empty CSV rows; none when the text is not CSV the csv module can read (e.g. a field over its size limit)."""
    try:
        return [r for r in csv.reader(io.StringIO(text.strip()), skipinitialspace=True) if r]
    except csv.Error:
        return []


def _small_int(text: str) -> int | None:
    """An index or count: digits only, at most nine of them."""
    return int(text) if _SMALL_INT.fullmatch(text) else None


def _short(text: str | None) -> str | None:
    """A text fact, or None when it is too long to be one (rules read versions as numbers)."""
    return text if text is not None and len(text) <= MAX_FACT_CHARS else None


def _header(row: list[str]) -> list[str]:
    return [h.strip().split(" ")[0].lower() for h in row]


def _value(cell: str) -> str | None:
    cell = cell.strip()
    return None if cell in ("", "[N/A]", "N/A", "[Not Supported]") else cell


def parse_smi_table(text: str) -> tuple[str | None, str | None, list[Gpu]]:
    """Plain `nvidia-smi`: (driver version, CUDA version, GPUs) from the banner and the GPU rows.

    Handles the 79-, 89- and 91-column layouts, pre-R410 banners without "CUDA Version", R610's
    "KMD Version: ... CUDA UMD Version: ..." banner, and "CUDA Version: N/A" (returned as None). Names
    longer than the column end in "..." (e.g. "NVIDIA GeForce ..."); the table has no UUIDs.
    """
    driver = m.group(1) if (m := _DRIVER_LINE.search(text)) else None
    cuda = m.group(1) if (m := _CUDA_LINE.search(text)) and m.group(1) != "N/A" else None
    gpus: list[Gpu] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("|") or not (m := _TABLE_GPU.match(line)):
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
    """`/proc/driver/nvidia/version`: "NVRM version: NVIDIA UNIX x86_64 Kernel Module  520.56.06 ..."
    (also "Open Kernel Module for x86_64")."""
    return m.group(1) if (m := _NVRM.search(text)) else None


def parse_docker_version_text(text: str) -> str | None:
    """`docker version`: the first `Version:` line after the `Server:` line."""
    server = False
    for line in text.splitlines():
        if line.startswith("Server:"):
            server = True
        elif server and (m := _SERVER_VERSION_LINE.match(line)):
            return _short(m.group(1))
    return None


def parse_docker_info_json(text: str) -> dict | None:
    """`docker info --format '{{json .}}'` -> the fields rules need, or None if it is not that JSON.

    A field of the wrong type counts as absent: the rules compare texts and lists of texts.
    """
    try:
        info = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nested too deep to be docker's
        return None
    if not isinstance(info, dict) or not _text(info.get("ServerVersion")):
        return None
    return {"docker_version": _text(info.get("ServerVersion")), "runtimes": _names(info.get("Runtimes")),
            "default_runtime": _text(info.get("DefaultRuntime")), "cdi_spec_dirs": _names(info.get("CDISpecDirs")),
            "cdi_devices": _cdi_devices(info.get("DiscoveredDevices")),
            "root_dir": _text(info.get("DockerRootDir")), "engine_id": _text(info.get("ID")) or None}


def _cdi_devices(value: object) -> list[str]:
    """`DiscoveredDevices` ([{"Source": "cdi", "ID": "nvidia.com/gpu=0"}, ...]): the IDs of the CDI ones, at most 64."""
    if not isinstance(value, list):
        return []
    return [d["ID"] for d in value[:64] if isinstance(d, dict) and d.get("Source") == "cdi"
            and isinstance(d.get("ID"), str) and len(d["ID"]) <= MAX_FACT_CHARS]


def _text(value: object) -> str | None:
    return _short(value) if isinstance(value, str) else None


def _names(value: object) -> list[str]:
    """Runtimes (a dict keyed by name) or CDI folders (a list): the names that are texts, sorted."""
    if not isinstance(value, (dict, list)):
        return []
    return sorted(name for name in value if isinstance(name, str) and len(name) <= MAX_FACT_CHARS)


def parse_docker_info_text(text: str) -> dict | None:
    """Plain `docker info`: old (<= 18.09, flat) and new (>= 19.03, Client:/Server: sections) layouts."""
    fields: dict[str, str] = {}
    cdi: list[str] = []
    devices: list[str] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        key, sep, value = line.strip().partition(":")
        if sep and key in ("Server Version", "Runtimes", "Default Runtime", "Docker Root Dir", "ID"):
            fields[key] = value.strip()
        elif sep and key == "CDI spec directories" and not cdi:
            cdi = list(itertools.islice(_cdi_dirs(lines[i + 1:]), 8))
        elif sep and key == "Discovered Devices" and not devices:  # "  cdi: nvidia.com/gpu=0", one a line
            block = itertools.takewhile(lambda ln: ln.startswith("  ") and not ln.startswith("   "), lines[i + 1:])
            devices = [ln.strip()[5:] for ln in itertools.islice(block, 64)
                       if ln.strip().startswith("cdi: ") and len(ln.strip()) <= MAX_FACT_CHARS]
    if not _short(fields.get("Server Version")):
        return None
    return {"docker_version": fields["Server Version"], "runtimes": fields.get("Runtimes", "").split(),
            "default_runtime": fields.get("Default Runtime"), "cdi_spec_dirs": cdi, "cdi_devices": devices,
            "root_dir": fields.get("Docker Root Dir"), "engine_id": _short(fields.get("ID")) or None}


def _cdi_dirs(lines: list[str]):
    return (ln.strip() for ln in lines if ln.startswith("  ") and ln.strip().startswith("/"))


def parse_df(text: str) -> int | None:
    """`df -Pk DIR`: available bytes on the file system of DIR (at most 18 digits of KiB: no file system is larger)."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    if len(lines) < 2:
        return None
    cols = lines[-1].split()
    if len(cols) < 4 or not _DF_KIB.fullmatch(cols[3]):
        return None
    return int(cols[3]) * 1024


def parse_gpu_smoke(text: str, failed: bool | None) -> tuple[str, str]:
    """(status, detail) of `docker run --gpus all IMAGE nvidia-smi -L`; `failed` from probes.json (None: unknown).

    Real failures: `could not select device driver "" with capabilities: [[gpu]]` (no NVIDIA
    Container Toolkit), `nvidia-container-cli: initialization error: ...` (driver not loaded,
    libnvidia-ml.so.1 missing), `unknown flag: --gpus` (docker CLI < 19.03), `nvidia-container-cli: requirement
    error: unsatisfied condition: cuda>=12.8` (driver too old for the image). Such a failure may follow a
    successful pull of the image, whose first line ("Unable to find image ... locally") is no pull failure.
    """
    listed = _SMOKE_GPU.findall(text)
    if listed and not failed:
        return "pass", (f"a GPU container started and saw {len(listed)} GPU(s): "
                        f"{', '.join(sorted({n for _, n, _ in listed}))}")
    if pulled := _PULLED.search(text):  # the pull worked: its "Unable to find image" line is no pull failure
        text = text[pulled.end():]
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
    lines = [ln.strip() for ln in text.strip().splitlines()
             if ln.strip() and not ln.startswith("Run 'docker run --help'")]
    return lines[-1][-300:] if lines else ""


# -- a whole folder -----------------------------------------------------------------------------
def probe_record(text: str) -> tuple[dict, list[str]]:
    """`probes.json` -> ({"runner", "unreachable", "probes": [{"filename", "exit_code", "error", ...}]}, problems).

    Anything of the wrong type is left out and named in the problems, so that a hand-edited or
    damaged record reads like a folder captured by hand instead of failing the host check.
    """
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep to be a record
        return {}, [f"not JSON ({str(exc)[:100] or type(exc).__name__})"]
    if not isinstance(data, dict):
        return {}, [f"{_json_kind(data)} where an object was expected"]
    record, problems = {}, []
    for key in ("runner", "unreachable"):
        value = data.get(key)
        if value is None or isinstance(value, str):
            record[key] = value
        else:
            problems.append(f"{key!r} is {_json_kind(value)} where text was expected")
    probes = data.get("probes", [])
    if not isinstance(probes, list):
        problems.append(f"'probes' is {_json_kind(probes)} where a list was expected")
        probes = []
    record["probes"] = [p for p in probes if _probe_entry_ok(p)]
    if len(record["probes"]) < len(probes):
        problems.append(f"{len(probes) - len(record['probes'])} of its probes are not objects with a text "
                        "filename, an integer or null exit_code and a text or null error")
    return record, problems


def _probe_entry_ok(entry: object) -> bool:
    return (isinstance(entry, dict) and isinstance(entry.get("filename"), str)
            and (entry.get("exit_code") is None or type(entry.get("exit_code")) is int)
            and (entry.get("error") is None or isinstance(entry.get("error"), str)))


def _json_kind(value: object) -> str:
    kinds = {bool: "true/false", int: "a number", float: "a number", str: "text", list: "a list", dict: "an object"}
    return kinds.get(type(value), type(value).__name__)


def has_probe_outputs(folder: Path) -> bool:
    """Whether the folder holds anything named like a probe output (readable or not: reading says why not)."""
    return any((Path(folder) / name).exists() for name in _KNOWN_FILES)


class _Folder:
    """Reads probe outputs and remembers why a fact is unknown, and what was wrong with a file."""

    def __init__(self, folder: Path, facts: HostFacts):
        self.folder = folder
        self.facts = facts
        self.record: dict = {}
        text = self.read(PROBES_FILE)
        if text is not None:
            self.record, problems = probe_record(text)
            if problems:
                self.facts.probe_problems[PROBES_FILE] = "; ".join(problems)
        self.errors = {p["filename"]: p["error"] for p in self.record.get("probes", []) if p.get("error")}

    def read(self, name: str) -> str | None:
        """The file's text, at most MAX_PROBE_BYTES of it; None when it is absent or no regular file."""
        try:
            with open_regular(self.folder / name) as handle:
                data = handle.read(MAX_PROBE_BYTES + 1)
        except FileNotFoundError:
            return None
        except NotRegularFile as exc:
            self.facts.probe_problems[name] = f"not read: {exc.reason}"
            return None
        except OSError as exc:
            self.facts.probe_problems[name] = f"not read: {exc.strerror or exc}"
            return None
        if len(data) > MAX_PROBE_BYTES:
            self.facts.probe_problems[name] = f"truncated: only its first {MAX_PROBE_BYTES // 2**20} MiB were read"
            data = data[:MAX_PROBE_BYTES]
        return data.decode("utf-8", errors="replace")

    def missing(self, name: str) -> str:
        """Why a probe's output is not there: what was wrong with its file, or that it was not captured."""
        return self.facts.probe_problems.get(name) or "not captured"

    def output(self, name: str, fact: str) -> str | None:
        """The file's text if the probe succeeded; else None, and `fact` becomes unknown with the reason."""
        if name in self.errors:
            self.facts.unknown.setdefault(fact, f"{name}: {self.errors[name]}")
            return None
        text = self.read(name)
        if text is None:
            self.facts.unknown.setdefault(fact, f"{name}: {self.missing(name)}")
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
        facts.kernel = _short(uname.strip().splitlines()[0].strip())
        if facts.kernel is None:
            facts.unknown["kernel"] = f"uname-r.txt: not a kernel release (over {MAX_FACT_CHARS} characters)"
    _nvidia_facts(src, facts)
    _docker_facts(src, facts)
    _smoke_facts(src, facts)
    _health_facts(src, facts)
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
    table_driver, table_cuda, table_gpus = (parse_smi_table(table) if "nvidia-smi.txt" not in src.errors
                                            else (None, None, []))
    facts.cuda_driver_version = table_cuda
    facts.driver_version = ((query_driver_version(query) if gpus else None) or table_driver
                            or facts.kernel_module_version)
    if gpus or table_gpus:
        facts.gpus = gpus or table_gpus
    elif facts.driver_state in (NOT_INSTALLED, NO_DEVICES, NOT_LOADED):
        facts.gpus = []
    elif facts.driver_state:
        facts.unknown["gpus"] = facts.driver_error
    elif not query and not table:
        problems = [f"{n}: {facts.probe_problems[n]}" for n in ("nvidia-smi-query.csv", "nvidia-smi.txt")
                    if n in facts.probe_problems]
        facts.unknown["gpus"] = "; ".join(problems) or "nvidia-smi-query.csv, nvidia-smi.txt: not captured"
    else:
        facts.unknown["gpus"] = f"nvidia-smi: no GPU list in its output ({errors.strip() or 'unrecognised output'})"


def _docker_facts(src: _Folder, facts: HostFacts) -> None:
    """Engine version and runtimes from `docker info` (JSON, else plain text), else the version from
    `docker version`."""
    info, reasons = None, []
    for name, parse in (("docker-info.json", parse_docker_info_json), ("docker-info.txt", parse_docker_info_text)):
        text = src.read(name)
        if name in src.errors:  # the probe ran and docker said no
            facts.docker_unreachable = True
            reasons.append(f"{name}: {src.errors[name]}")
        elif text is None:
            if name in facts.probe_problems:
                reasons.append(f"{name}: {facts.probe_problems[name]}")
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
        facts.cdi_devices = info["cdi_devices"]
        facts.docker_engine_id = info["engine_id"]
    else:
        facts.unknown["docker"] = reasons[0] if reasons else "docker-info.json: not captured"
        if text := src.output("docker-version.txt", "docker_version"):
            facts.docker_version = parse_docker_version_text(text)
    if df := src.output("df-docker-root.txt", "disk"):
        facts.docker_root_free_bytes = parse_df(df)


def _smoke_facts(src: _Folder, facts: HostFacts) -> None:
    text = src.read(GPU_SMOKE_FILE)
    if text is None:
        if problem := facts.probe_problems.get(GPU_SMOKE_FILE):
            facts.gpu_smoke, facts.gpu_smoke_detail = "unknown", f"{GPU_SMOKE_FILE}: {problem}"
        return
    ran = {p["filename"]: p for p in src.record.get("probes", [])}.get(GPU_SMOKE_FILE)
    failed = None if ran is None else ran.get("exit_code") != 0
    facts.gpu_smoke, facts.gpu_smoke_detail = parse_gpu_smoke(text, failed)


HEALTH_FACTS = ("gpu_health", "topology", "gpu_list", "xid", "dcgm_diag")


def _health_output(src: _Folder, name: str, fact: str, parse) -> dict | None:
    """A health probe's parsed output; None when it was not captured (nothing recorded), failed (`unknown`)
    or could not be read (`probe_unreadable`, and `unknown` too)."""
    if name in src.errors:
        said = src.read(name) or ""
        if name == DCGM_FILE:  # dcgmi diag exits non-zero when a test fails; its table still says which
            try:
                return parse(said)
            except gpu_health.Unreadable:
                pass
        reason = src.errors[name]
        if name == XID_FILE and (_PERMISSION.search(said) or _PERMISSION.search(reason)):
            reason = "permission denied reading the kernel log: " + " | ".join(
                ln.strip() for ln in said.splitlines()[1:] if ln.strip())[:400]
        src.facts.unknown.setdefault(fact, f"{name}: {reason}")
        return None
    text = src.read(name)
    if text is None:
        if problem := src.facts.probe_problems.get(name):
            src.facts.probe_unreadable[name] = problem
            src.facts.unknown.setdefault(fact, f"{name}: {problem}")
        return None
    if name in src.facts.probe_problems:  # over MAX_PROBE_BYTES: no real output is that long, and it is cut
        detail = f"{src.facts.probe_problems[name]}; a real output is a few hundred KB at most, so it was not parsed"
    else:
        try:
            return parse(text)
        except gpu_health.Unreadable as exc:
            detail = str(exc)
    src.facts.probe_unreadable[name] = detail
    src.facts.unknown.setdefault(fact, f"{name}: {detail}")
    return None


def _health_facts(src: _Folder, facts: HostFacts) -> None:
    """nvidia-smi -q (XML, else text), topo -m, the kernel log's XIDs and dcgmi diag, when captured."""
    for name, parse in ((SMI_XML_FILE, gpu_health.parse_smi_xml), (SMI_TEXT_FILE, gpu_health.parse_smi_text)):
        if (parsed := _health_output(src, name, "gpu_health", parse)) is not None:
            facts.gpu_health, facts.gpu_health_source = parsed["gpus"], name
            facts.cuda_not_found = parsed["cuda_not_found"]
            if facts.gpus is None and not facts.driver_state:  # neither the query CSV nor the table listed GPUs
                facts.gpus = [Gpu(g["index"], g["name"] or "unknown", g["uuid"], g["memory_total_mib"])
                              for g in parsed["gpus"]]
                facts.unknown.pop("gpus", None)
            facts.driver_version = facts.driver_version or parsed["driver_version"]
            facts.cuda_driver_version = facts.cuda_driver_version or parsed["cuda_version"]
            facts.unknown.pop("gpu_health", None)
            if name == SMI_TEXT_FILE and SMI_XML_FILE in facts.probe_unreadable:  # the fallback did its job
                why = facts.probe_unreadable.pop(SMI_XML_FILE)
                facts.gpu_health_source = f"{SMI_TEXT_FILE} ({SMI_XML_FILE}: {why})"
            break
    facts.topology = _health_output(src, TOPO_FILE, "topology", gpu_health.parse_topology)
    facts.gpu_list = _health_output(src, GPU_LIST_FILE, "gpu_list", gpu_health.parse_gpu_list)
    if facts.gpu_list and facts.gpus is None and not facts.driver_state:  # no other probe listed the GPUs
        facts.gpus = [Gpu(g["index"], g["name"], g["uuid"], None) for g in facts.gpu_list]
        facts.unknown.pop("gpus", None)
    facts.xid = _health_output(src, XID_FILE, "xid", gpu_health.parse_xid_log)
    facts.dcgm_diag = _health_output(src, DCGM_FILE, "dcgm_diag", gpu_health.parse_dcgm_diag)
