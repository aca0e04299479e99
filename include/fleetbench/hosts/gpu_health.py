"""Parsers of the GPU health tools' outputs: `nvidia-smi -q -x` (and `-q` text), `nvidia-smi -L` (the GPUs and
their MIG devices), `nvidia-smi topo -m`, the kernel log's XID lines and `dcgmi diag`.

Pure functions. A parser either returns plain data (dicts and lists, ready for JSON) or raises
`Unreadable` with one line saying what is wrong with the output (truncated XML, an unknown layout,
binary garbage); the folder reader turns that into a `probe_unreadable` fact. Inputs arrive already
bounded (`facts.MAX_PROBE_BYTES`), every pattern is bounded, and numbers are read only up to a sane
number of digits, so no input can take long or raise anything else.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from fleetbench.config import MIG_PROFILE_PATTERN

#: Clock event (throttle) reasons, by the XML name without its `clocks_throttle_reason_` / `clocks_event_reason_`
#: prefix; the `-q` text names map onto these.
CLOCK_REASONS = ("gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "hw_thermal_slowdown",
                 "hw_power_brake_slowdown", "sync_boost", "sw_thermal_slowdown", "display_clocks_setting")
_TEXT_REASONS = {"idle": "gpu_idle", "display_clock_setting": "display_clocks_setting"}
_NUMBER = re.compile(r"-?\d{1,12}(?:\.\d{1,6})?")
_VERSION = re.compile(r"[0-9]{1,6}(?:\.[0-9]{1,6}){0,3}(?![0-9])")
_GPU_HEADER = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")
_KEY_VALUE = re.compile(r"^( {0,40})([^:\n]{1,80}?)\s{0,80}: ?(.{0,300})$")
_SECTION = re.compile(r"^( {0,40})(\S[^:\n]{0,80}?)\s{0,80}$")
# On a MIG GPU the driver names the instance too: `Xid (PCI:0000:01:00 GPU-I:05): 94, ...`, or with the compute
# instance `(PCI:0000:01:00 GPU-I:01 GPU-CI:00)` (open-gpu-kernel-modules kernel_rc.c; NVIDIA's A100 memory error
# management guide): the event is the GPU's, by its bus id.
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-9A-Fa-f])?)"
                  r"(?: GPU-I:\d{1,4}(?: GPU-CI:\d{1,4})?)?\): (\d{1,5})(?:, ?(.{0,200}))?")
_DMESG_TIME = re.compile(r"^\[\s{0,12}(\d{1,10}(?:\.\d{1,9})?)\]")
_XID_SOURCE = re.compile(r"^# kernel log: ([a-z]{1,20})([^\n]{0,200})$", re.M)
_XID_WINDOW = re.compile(r"window (\d{1,9}) s")
_UPTIME = re.compile(r"uptime (\d{1,10}(?:\.\d{1,9})?)")
_TOPO_LINK = re.compile(r"^(X|NV\d{1,3}|PIX|PXB|PHB|NODE|SYS|SOC)$")
_ANSI_SGR = re.compile(r"\x1b\[[0-9;]{0,16}m")
_DCGM_VERSION = re.compile(r"^(\d{1,3})\.")
_DCGM_SECTION = re.compile(r"^[|+]-{2,}\s{1,4}(\w[\w ]{0,40}?)\s{1,4}-")
DCGM_RESULTS = ("Pass", "Fail", "Skip", "Warn")
#: A message row's label: DCGM 3.x's `Error`, `Warning`, `Info`; DCGM 4.x's per GPU `Warning: GPU1`.
_DCGM_MESSAGE = re.compile(r"^(Error|Warning|Info)(?:: GPU(\d{1,4}))?$")
#: DCGM 3.x's result of a level 2+ test, scoped to GPUs: `Pass - All`, `Pass - GPUs: 0, 2, 3`, `Fail - GPU: 1`.
_DCGM_SCOPED = re.compile(r"^(Pass|Fail|Skip|Warn) - (?:All|GPUs?: ?(\d{1,4}(?:, ?\d{1,4}){0,255}))$")
_DCGM_WORST = {"Skip": 0, "Pass": 1, "Warn": 2, "Fail": 3}
#: A MIG profile as nvidia-smi names it: `1g.10gb`, `3g.40gb`, `1g.10gb+me`, a compute-instance profile
#: `1c.3g.20gb` (R470 and later); fleetbench.config checks benchmarks' `mig_profiles` against it.
MIG_PROFILE = re.compile(MIG_PROFILE_PATTERN)
_LIST_GPU = re.compile(r"^\s{0,8}GPU (\d{1,4}): ([^\n]{1,200}?) \(UUID: (GPU-[0-9A-Za-z-]{1,80})\)\s*$")
# `  MIG 1g.10gb     Device  0: (UUID: MIG-<uuid>)` (R470 and later); R450/R460 named a MIG device
# `MIG-GPU-<gpu uuid>/<gpu instance>/<compute instance>`.
_LIST_MIG = re.compile(r"^\s{1,16}MIG (\S{1,40})\s{1,16}Device\s{1,8}(\d{1,3}): "
                       r"\(UUID: (MIG-[0-9A-Za-z/-]{1,100})\)\s*$")


class Unreadable(ValueError):
    """The output is not what the tool prints: truncated, garbage, or a layout this parser does not know."""


# -- shared helpers ----------------------------------------------------------------------------
def _number(text: str | None) -> float | None:
    """'250.00 W' -> 250.0, '16x' -> 16.0, '38 C' -> 38.0; None for N/A, [Not Supported] and anything else."""
    if text is None:
        return None
    m = _NUMBER.match(text.strip())
    return float(m.group()) if m else None


def _int(text: str | None) -> int | None:
    value = _number(text)
    return int(value) if value is not None and value == int(value) else None


def _yes(text: str | None) -> bool | None:
    """Enabled/Yes/Active -> True, Disabled/No/Not Active -> False, N/A -> None."""
    if text is None:
        return None
    value = text.strip().lower()
    if value in ("enabled", "yes", "active", "on"):
        return True
    if value in ("disabled", "no", "not active", "off"):
        return False
    return None


def _mode(text: str | None) -> str | None:
    """ECC or MIG mode: 'Enabled' | 'Disabled'; None when the GPU does not have it (N/A)."""
    flag = _yes(text)
    return None if flag is None else ("Enabled" if flag else "Disabled")


def _sum(*values: int | None) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _versions(driver: str | None, cuda: str | None) -> dict:
    """The driver and CUDA versions of the log's head: the leading version only. R610 and later tag the old fields
    "610.57.04 [Deprecated; will be removed in CUDA 14.0. Use KMD Version instead]" (callers give the new
    KMD/CUDA UMD fields first); "CUDA Version: Not Found" means the driver has no libcuda."""
    driver, cuda = (driver or "").strip(), (cuda or "").strip()
    return {"driver_version": m.group() if (m := _VERSION.match(driver)) else None,
            "cuda_version": m.group() if (m := _VERSION.match(cuda)) else None,
            "cuda_not_found": cuda.lower().startswith("not found")}


def _check_text(text: str, what: str) -> None:
    if not text.strip():
        raise Unreadable(f"{what}: empty output")
    if "\ufffd" in text[:4096] or "\x00" in text[:4096]:
        raise Unreadable(f"{what}: binary data, not text (undecodable bytes near the start)")


# -- nvidia-smi -q -x --------------------------------------------------------------------------
def parse_smi_xml(text: str) -> dict:
    """`nvidia-smi -q -x` -> {"driver_version", "cuda_version", "gpus": [per-GPU health]}.

    Both the pre-R535 (`clocks_throttle_reasons`, `power_readings`, `single_bit`/`double_bit` ECC)
    and the later (`clocks_event_reasons`, `gpu_power_readings`, `sram_`/`dram_` ECC) element names.
    """
    _check_text(text, "nvidia-smi -q -x")
    if "<!ENTITY" in text:
        raise Unreadable("nvidia-smi -q -x: declares XML entities, which nvidia-smi never does; not parsed")
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise Unreadable(f"nvidia-smi -q -x: not complete XML ({exc}); the output may be truncated") from None
    if root.tag != "nvidia_smi_log":
        raise Unreadable(f"nvidia-smi -q -x: root element <{root.tag[:40]}>, expected <nvidia_smi_log>")
    gpus = root.findall("gpu")
    if not gpus:
        raise Unreadable("nvidia-smi -q -x: no <gpu> element in <nvidia_smi_log>")
    return {**_versions(root.findtext("kmd_version") or root.findtext("driver_version"),
                        root.findtext("cuda_umd_version") or root.findtext("cuda_version")),
            "gpus": [_xml_gpu(i, gpu) for i, gpu in enumerate(gpus)]}


def _xml_gpu(index: int, gpu: ET.Element) -> dict:
    def text(path: str) -> str | None:
        value = gpu.findtext(path)
        return value.strip()[:200] if value is not None else None

    def first(*paths: str) -> str | None:
        return next((v for p in paths if (v := text(p)) is not None), None)

    reasons_el = gpu.find("clocks_event_reasons")
    if reasons_el is None:
        reasons_el = gpu.find("clocks_throttle_reasons")
    reasons = {}
    for child in reasons_el if reasons_el is not None else ():
        key = re.sub(r"^clocks_(?:throttle|event)_reason_", "", child.tag)
        if (active := _yes(child.text)) is not None:
            reasons[key] = active
    ecc = {}
    for scope in ("volatile", "aggregate"):
        base = f"ecc_errors/{scope}"
        if gpu.find(f"{base}/single_bit") is not None:
            ecc[f"{scope}_correctable"] = _int(text(f"{base}/single_bit/total"))
            ecc[f"{scope}_uncorrectable"] = _int(text(f"{base}/double_bit/total"))
        else:
            ecc[f"{scope}_correctable"] = _sum(_int(text(f"{base}/sram_correctable")),
                                               _int(text(f"{base}/dram_correctable")))
            ecc[f"{scope}_uncorrectable"] = _sum(_int(text(f"{base}/sram_uncorrectable")),
                                                 _int(text(f"{base}/sram_uncorrectable_parity")),
                                                 _int(text(f"{base}/sram_uncorrectable_secded")),
                                                 _int(text(f"{base}/dram_uncorrectable")))
    mig_devices = gpu.find("mig_devices")
    power = "gpu_power_readings" if gpu.find("gpu_power_readings") is not None else "power_readings"
    return {
        "index": index,
        "bus_id": gpu.get("id") or text("pci/pci_bus_id"),
        "name": text("product_name"),
        "brand": text("product_brand"),
        "uuid": text("uuid"),
        "memory_total_mib": _int(text("fb_memory_usage/total")),
        "persistence": _yes(text("persistence_mode")),
        "mig_mode": _mode(text("mig_mode/current_mig")),
        "mig_devices": len(mig_devices.findall("mig_device")) if mig_devices is not None else 0,
        "ecc_mode": _mode(text("ecc_mode/current_ecc")),
        **ecc,
        "retired_sbe": _int(text("retired_pages/multiple_single_bit_retirement/retired_count")),
        "retired_dbe": _int(text("retired_pages/double_bit_retirement/retired_count")),
        "retired_pending": _yes(first("retired_pages/pending_retirement", "retired_pages/pending_blacklist")),
        "remap_correctable": _int(text("remapped_rows/remapped_row_corr")),
        "remap_uncorrectable": _int(text("remapped_rows/remapped_row_unc")),
        "remap_pending": _yes(text("remapped_rows/remapped_row_pending")),
        "remap_failure": _yes(text("remapped_rows/remapped_row_failure")),
        "clock_reasons": reasons,
        "performance_state": text("performance_state"),
        "pcie_gen_current": _int(text("pci/pci_gpu_link_info/pcie_gen/current_link_gen")),
        "pcie_gen_max": _int(text("pci/pci_gpu_link_info/pcie_gen/max_link_gen")),
        "pcie_width_current": _int(text("pci/pci_gpu_link_info/link_widths/current_link_width")),
        "pcie_width_max": _int(text("pci/pci_gpu_link_info/link_widths/max_link_width")),
        # R610 and later nest the board's limits under gpu_ceiling_power_limit
        "power_limit_w": _number(first(f"{power}/current_power_limit", f"{power}/gpu_ceiling_power_limit/"
                                       "current_power_limit", f"{power}/power_limit")),
        "default_power_limit_w": _number(first(f"{power}/default_power_limit",
                                               f"{power}/gpu_ceiling_power_limit/default_power_limit")),
        "temperature_c": _number(text("temperature/gpu_temp")),
    }


# -- nvidia-smi -q (text) ----------------------------------------------------------------------
def parse_smi_text(text: str) -> dict:
    """`nvidia-smi -q` text -> the same shape as parse_smi_xml.

    Sections nest by indentation; both "Clocks Throttle Reasons" (before R535) and "Clocks Event
    Reasons" (after), "Power Readings" and "GPU Power Readings", old and new ECC counters. MIG devices
    are "MIG Device" sections, under "MIG devices" or (R590) right in the GPU's block; a GPU's fields
    keep one value per path, so these sections are counted as they come.
    """
    _check_text(text, "nvidia-smi -q")
    head: dict[tuple[str, ...], str] = {}
    blocks: list[tuple[str, dict[tuple[str, ...], str]]] = []
    mig_devices: list[int] = []
    current = head
    stack: list[tuple[int, str]] = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("=="):
            continue
        if m := _GPU_HEADER.match(line):
            current = {}
            blocks.append((m.group(1), current))
            mig_devices.append(0)
            stack = []
            continue
        m = _KEY_VALUE.match(line) or _SECTION.match(line)
        if not m:
            continue
        indent, key = len(m.group(1)), m.group(2).strip().lower()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = tuple(k for _, k in stack) + (key,)
        if m.re is _KEY_VALUE:
            current[path] = m.group(3).strip()
        elif path in (("mig device",), ("mig devices", "mig device")) and blocks:
            mig_devices[-1] += 1
        stack.append((indent, key))
    if not blocks:
        raise Unreadable("nvidia-smi -q: no GPU section ('GPU 00000000:..') in the output: not a layout this "
                         "parser knows")
    return {**_versions(head.get(("kmd version",)) or head.get(("driver version",)),
                        head.get(("cuda umd version",)) or head.get(("cuda version",))),
            "gpus": [_text_gpu(i, bus, fields, mig_devices[i]) for i, (bus, fields) in enumerate(blocks)]}


def _text_gpu(index: int, bus_id: str, f: dict[tuple[str, ...], str], mig_devices: int) -> dict:
    def get(*path: str) -> str | None:
        return f.get(path)

    def first(*paths: tuple[str, ...]) -> str | None:
        return next((f[p] for p in paths if p in f), None)

    section = "clocks event reasons" if any(p[0] == "clocks event reasons" for p in f) else "clocks throttle reasons"
    reasons = {}
    for path, value in f.items():
        if path[0] == section and len(path) >= 2 and (active := _yes(value)) is not None:
            key = path[-1].replace(" ", "_")
            reasons[_TEXT_REASONS.get(key, key)] = active
    ecc = {}
    for scope in ("volatile", "aggregate"):
        if ("ecc errors", scope, "single bit", "total") in f:
            ecc[f"{scope}_correctable"] = _int(get("ecc errors", scope, "single bit", "total"))
            ecc[f"{scope}_uncorrectable"] = _int(get("ecc errors", scope, "double bit", "total"))
        else:
            ecc[f"{scope}_correctable"] = _sum(_int(get("ecc errors", scope, "sram correctable")),
                                               _int(get("ecc errors", scope, "dram correctable")))
            ecc[f"{scope}_uncorrectable"] = _sum(_int(get("ecc errors", scope, "sram uncorrectable")),
                                                 _int(get("ecc errors", scope, "sram uncorrectable parity")),
                                                 _int(get("ecc errors", scope, "sram uncorrectable sec-ded")),
                                                 _int(get("ecc errors", scope, "dram uncorrectable")))
    power = "gpu power readings" if any(p[0] == "gpu power readings" for p in f) else "power readings"
    link = ("pci", "gpu link info")
    return {
        "index": index,
        "bus_id": bus_id,
        "name": get("product name"),
        "brand": get("product brand"),
        "uuid": get("gpu uuid"),
        "memory_total_mib": _int(get("fb memory usage", "total")),
        "persistence": _yes(get("persistence mode")),
        "mig_mode": _mode(get("mig mode", "current")),
        "mig_devices": mig_devices,
        "ecc_mode": _mode(first(("ecc mode", "current"))),
        **ecc,
        "retired_sbe": _int(first(("retired pages", "single bit ecc"),
                                  ("retired pages", "single bit ecc", "retired count"))),
        "retired_dbe": _int(first(("retired pages", "double bit ecc"),
                                  ("retired pages", "double bit ecc", "retired count"))),
        "retired_pending": _yes(first(("retired pages", "pending page retirement"),
                                      ("retired pages", "pending page blacklist"))),
        "remap_correctable": _int(get("remapped rows", "correctable error")),
        "remap_uncorrectable": _int(get("remapped rows", "uncorrectable error")),
        "remap_pending": _yes(get("remapped rows", "pending")),
        "remap_failure": _yes(get("remapped rows", "remapping failure occurred")),
        "clock_reasons": reasons,
        "performance_state": get("performance state"),
        "pcie_gen_current": _int(get(*link, "pcie generation", "current")),
        "pcie_gen_max": _int(get(*link, "pcie generation", "max")),
        "pcie_width_current": _int(get(*link, "link width", "current")),
        "pcie_width_max": _int(get(*link, "link width", "max")),
        # R610 and later nest the board's limits under "GPU Ceiling Power Limit"
        "power_limit_w": _number(first((power, "current power limit"), (power, "gpu ceiling power limit",
                                       "current power limit"), (power, "power limit"))),
        "default_power_limit_w": _number(first((power, "default power limit"),
                                               (power, "gpu ceiling power limit", "default power limit"))),
        "temperature_c": _number(get("temperature", "gpu current temp")),
    }


# -- nvidia-smi -L -------------------------------------------------------------------------------
def parse_gpu_list(text: str) -> list[dict]:
    """`nvidia-smi -L` -> [{"index", "name", "uuid", "mig": [{"profile", "device", "uuid"}]}], one per GPU line.

    A GPU in MIG mode lists its MIG devices (GPU instance + compute instance) below it, each with its
    profile and `MIG-` UUID: the names a container's device request takes. The `-q -x` output carries no
    profile name and, on many drivers, no MIG UUID, so this listing is where both come from.
    """
    _check_text(text, "nvidia-smi -L")
    gpus: list[dict] = []
    for line in text.splitlines()[:10000]:
        if m := _LIST_GPU.match(line):
            gpus.append({"index": int(m.group(1)), "name": m.group(2).strip(), "uuid": m.group(3), "mig": []})
        elif (m := _LIST_MIG.match(line)) and gpus:
            profile = m.group(1)
            if not MIG_PROFILE.match(profile):  # no case can ask for it (config checks profiles the same way)
                continue
            gpus[-1]["mig"].append({"profile": profile, "device": int(m.group(2)), "uuid": m.group(3)})
    if not gpus:
        raise Unreadable("nvidia-smi -L: no 'GPU N: NAME (UUID: GPU-...)' line: not a layout this parser knows")
    return gpus


# -- nvidia-smi topo -m ------------------------------------------------------------------------
def parse_topology(text: str) -> dict:
    """`nvidia-smi topo -m` -> {"gpus", "links": {"GPU0-GPU1": "NV18"}, "nics": {"NIC0": "mlx5_0"},
    "gpu_nic": {"GPU0-NIC0": "PHB"}, "affinity": {"GPU0": {"cpu": "0-79", "numa": "0"}}, "summary": [...]}.

    nvidia-smi underlines the header row with ANSI codes (`ESC[4m` ... `ESC[0m`) even when its output goes to a
    file (R590 and later at least), so they are removed first."""
    _check_text(text, "nvidia-smi topo -m")
    lines = [_ANSI_SGR.sub("", ln).rstrip() for ln in text.splitlines()]
    header_at = next((i for i, ln in enumerate(lines) if ln.split()[:1] == ["GPU0"]), None)
    if header_at is None:
        raise Unreadable("nvidia-smi topo -m: no matrix header starting with GPU0: not a layout this parser knows")
    columns = re.split(r"\s{2,}|\t", lines[header_at].strip())
    devices = [c for c in columns if " " not in c and not c.startswith(("CPU", "NUMA"))]
    links: dict[str, str] = {}
    gpu_nic: dict[str, str] = {}
    affinity: dict[str, dict[str, str]] = {}
    nics: dict[str, str] = {}
    gpus: list[str] = []
    for line in lines[header_at + 1:]:
        cells = line.split()
        if not cells:
            continue
        if cells[0].startswith("Legend"):
            break
        name, values = cells[0], cells[1:]
        if name not in devices or len(values) < len(devices):
            continue
        if not all(_TOPO_LINK.match(v) for v in values[:len(devices)]):
            raise Unreadable(f"nvidia-smi topo -m: row {name[:20]} has a link type this parser does not know "
                             f"({' '.join(values[:len(devices)])[:80]})")
        if name.startswith("GPU"):
            gpus.append(name)
            for other, link in zip(devices, values):
                if other == name:
                    continue
                if other.startswith("GPU"):
                    if other not in gpus:
                        links[f"{name}-{other}"] = link
                else:
                    gpu_nic[f"{name}-{other}"] = link
            rest = values[len(devices):]
            affinity[name] = {k: v for k, v in zip(("cpu", "numa", "gpu_numa"), rest) if v != "N/A"}
    if not gpus:
        raise Unreadable("nvidia-smi topo -m: no GPU row under the header")
    legend = False
    for line in lines:
        if line.strip().startswith("NIC Legend"):
            legend = True
        elif legend and (m := re.match(r"^\s{0,8}(NIC\d{1,3}):\s{0,8}(\S{1,60})$", line)):
            nics[m.group(1)] = m.group(2)
    for dev in devices:
        if not dev.startswith("GPU") and not dev.startswith("NIC"):
            nics.setdefault(dev, dev)
    return {"gpus": gpus, "links": links, "gpu_nic": gpu_nic, "nics": nics, "affinity": affinity,
            "summary": topology_summary(gpus, links, affinity)}


def topology_summary(gpus: list[str], links: dict[str, str], affinity: dict[str, dict[str, str]]) -> list[str]:
    """Facts a person reads: 'all 28 GPU pairs NVLink (NV18)', or the count of pairs per link type and the
    pairs that cross NUMA nodes (SYS)."""
    out = []
    kinds = sorted(set(links.values()))
    if links and all(k.startswith("NV") for k in kinds):
        out.append(f"all {len(links)} GPU pairs NVLink ({', '.join(kinds)})")
    elif links:
        counts = {k: sum(1 for v in links.values() if v == k) for k in kinds}
        out.append("GPU pairs: " + ", ".join(f"{n} {k}" for k, n in counts.items()))
        out += [f"{pair} SYS" for pair, k in links.items() if k == "SYS"][:16]
    numa = sorted({a["numa"] for a in affinity.values() if "numa" in a})
    if numa:
        out.append(f"{len(gpus)} GPU(s) on NUMA node(s) {', '.join(numa)}")
    return out


# -- kernel log: XID events --------------------------------------------------------------------
def parse_xid_log(text: str, window_s: float = 86400.0) -> dict:
    """The kernel-log probe's output -> {"source", "window_s", "events": [{"bus_id", "xid", "detail", "line"}]}.

    The probe writes a first line `# kernel log: journalctl ...` (already limited to the window)
    or `# kernel log: dmesg ... uptime S` (dmesg lines carry seconds since boot: events older
    than the window are dropped here). The window is the header's (`window N s`), else `window_s`.
    Without that line the output is not the probe's.
    """
    _check_text(text, "kernel log")
    m = _XID_SOURCE.search(text[:4096])
    if not m:
        raise Unreadable("kernel log: no '# kernel log:' first line: not the output of fleetbench's XID probe")
    source, rest = m.group(1), m.group(2)
    uptime = u.group(1) if (u := _UPTIME.search(rest)) else None
    if w := _XID_WINDOW.search(rest):
        window_s = float(w.group(1))
    if source == "none":
        raise Unreadable("kernel log: neither journalctl -k nor dmesg could be read")
    events = []
    for line in text.splitlines():
        x = _XID.search(line)
        if not x:
            continue
        since_boot = None
        if t := _DMESG_TIME.match(line):
            since_boot = float(t.group(1))
        elif t := re.search(r"kernel: \[\s{0,12}(\d{1,10}(?:\.\d{1,9})?)\]", line):
            since_boot = float(t.group(1))
        if source == "dmesg" and uptime is not None and since_boot is not None \
                and since_boot < float(uptime) - window_s:
            continue
        events.append({"bus_id": x.group(1).upper(), "xid": int(x.group(2)), "detail": (x.group(3) or "").strip(),
                       "line": line.strip()[:300]})
        if len(events) >= 1000:
            break
    return {"source": source, "window_s": window_s, "events": events}


# -- dcgmi diag --------------------------------------------------------------------------------
def _scope(test: dict, scoped: re.Match[str]) -> None:
    """One `Result - GPUs: ...` of a DCGM 3.x test: its GPUs' result, and the test's if it is worse."""
    result = scoped.group(1)
    for gpu in (scoped.group(2) or "").replace(" ", "").split(","):
        if gpu:
            test["gpus"][gpu] = result
    if _DCGM_WORST[result] > _DCGM_WORST[test["result"]]:
        test["result"] = result


def parse_dcgm_diag(text: str) -> dict:
    """`dcgmi diag -r N` -> {"dcgm_version", "tests": [{"name", "section", "result", "gpus", "error"}]}.

    DCGM 3.x prints one result per test and its error text in `Error` rows below it (wrapped at the
    column width, mid-word); its level 2+ tests (Integration, Hardware, Stress) a result per set of GPUs, the
    first on the test's row and the others below it (`Pass - GPUs: 0, 2, 3`, then `Fail - GPU: 1`): the test's
    result is the worst of them, each GPU's in `gpus`. DCGM 4.x prints the test's overall result and one
    `GPUn: Result` row per GPU, then each GPU's message under `Warning: GPUn` (an error when that GPU failed).
    """
    _check_text(text, "dcgmi diag")
    rows: list[tuple[str, str]] = []
    section = ""
    tests: list[dict] = []
    meta: dict[str, str] = {}
    seen_header = False
    for line in text.splitlines():
        if sec := _DCGM_SECTION.match(line):
            section = sec.group(1)
            continue
        if not line.startswith("|") or line.startswith("|="):
            continue
        parts = line.split("|")
        if len(parts) < 4:
            continue
        # The cell is " " + text + "  ": long text wraps at the column width, mid-word, spaces kept.
        name, cell = parts[1].strip(), parts[2][1:-2] if len(parts[2]) > 3 else parts[2].strip()
        if name == "Diagnostic" and cell.strip() == "Result":  # the header; DCGM 3.x's Hardware section has a
            seen_header = True  # test of that name too (the level 3 and 4 stress test), with its own result
            continue
        rows.append((name, cell))
        if section == "Metadata":
            if name:
                meta[name] = cell.strip()
            continue
        if tests and (message := _DCGM_MESSAGE.match(name)):
            kind, gpu = message.groups()
            # DCGM 4.x labels each GPU's message `Warning: GPUn` (its Diag.cpp), also that of a GPU that failed
            key = "error" if kind == "Error" or (gpu and tests[-1]["gpus"].get(gpu) == "Fail") else kind.lower()
            tests[-1][key] = tests[-1].get(key, "").rstrip() + ("; " if tests[-1].get(key) else "") + cell
            tests[-1]["_last"] = key
        elif name and cell.strip() in DCGM_RESULTS:
            tests.append({"name": name, "section": section, "result": cell.strip(), "gpus": {}})
        elif name and (scoped := _DCGM_SCOPED.match(cell.strip())):
            tests.append({"name": name, "section": section, "result": scoped.group(1), "gpus": {}})
            _scope(tests[-1], scoped)
        elif not name and tests:
            value = cell.strip()
            if (scoped := _DCGM_SCOPED.match(value)) and tests[-1]["section"] == section:
                _scope(tests[-1], scoped)
                tests[-1].pop("_last", None)
            elif g := re.match(r"^GPU(\d{1,4}): (Pass|Fail|Skip|Warn)$", value):
                tests[-1]["gpus"][g.group(1)] = g.group(2)
                tests[-1].pop("_last", None)
            elif last := tests[-1].get("_last"):
                tests[-1][last] += cell
            elif value:
                tests[-1]["error"] = (tests[-1].get("error", "") + " " + value).strip()
                tests[-1]["_last"] = "error"
    if not seen_header or not tests:
        raise Unreadable("dcgmi diag: no results table ('| Diagnostic | Result |' and test rows): not a layout "
                         "this parser knows")
    for t in tests:
        t.pop("_last", None)
        for key in ("error", "warning", "info"):
            if key in t:
                t[key] = t[key].strip()[:2000]
    version = meta.get("DCGM Version")
    return {"dcgm_version": version[:20] if version else None,
            "layout": (f"{m.group(1)}.x" if version and (m := _DCGM_VERSION.match(version)) else None),
            "tests": tests}
