"""The telemetry report as read back from a case's log: checked before anything uses it.

The report line is printed inside the benchmark container, and anything running there can print a
line that looks like one. So its shape is checked here, once: an object; numbers that are real,
finite and within range; `gpus` a list of objects. What does not fit is dropped and named in the
report's `invalid` list (stored with it in `telemetry_json`), so one bad value never fails the case
task or the night's store; energy without a valid total is not "measured".
"""

from __future__ import annotations

import math

# Numbers a report may carry (top level and per GPU), with their largest plausible value.
NUMBERS = {
    "energy_j": 1e12, "mean_power_w": 1e6, "peak_power_w": 1e6, "peak_mem_used_mib": 1e9, "mean_util_pct": 100.0,
    "mean_sm_clock_mhz": 1e5, "max_temp_c": 1e3, "duration_s": 1e9, "period_s": 3600.0, "sampler_cpu_s": 1e9,
    "samples": 1e12, "index": 1e4, "memory_total_mib": 1e9,
}
TEXTS = {"energy_source", "energy_method", "reason", "name", "uuid", "sampling_error"}  # why sampling stopped early
# The container's CPU time (`cpu`): seconds used and of wall time, the host's logical CPUs, their model.
CPU_NUMBERS = {"usage_s": 1e9, "wall_s": 1e9, "count": 1e5, "sockets": 1e3}
CPU_TEXTS = {"model", "source", "path"}
ENERGY_SOURCES = {"measured", "none"}
MAX_GPUS = 1024
MAX_TEXT = 500


def clean_report(raw) -> dict | None:
    """The report with only well-formed values (None when it is not an object); `invalid` lists what was dropped."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        return {"nvml": False, "energy_source": "none", "gpus": [],
                "invalid": [f"the report is a {type(raw).__name__}, not an object"]}
    invalid: list[str] = []
    report = _clean_fields(raw, "", invalid)
    report["nvml"] = raw.get("nvml") is True
    gpus = raw.get("gpus", [])
    if not isinstance(gpus, list):
        invalid.append(f"gpus: a {type(gpus).__name__}, not a list")
        gpus = []
    report["gpus"] = []
    for i, gpu in enumerate(gpus[:MAX_GPUS]):
        if isinstance(gpu, dict):
            report["gpus"].append(_clean_fields(gpu, f"gpus[{i}].", invalid))
        else:
            invalid.append(f"gpus[{i}]: a {type(gpu).__name__}, not an object")
    if len(gpus) > MAX_GPUS:
        invalid.append(f"gpus: {len(gpus)} entries, only the first {MAX_GPUS} kept")
    cpu = raw.get("cpu")
    if isinstance(cpu, dict):
        report["cpu"] = _clean_fields(cpu, "cpu.", invalid, CPU_NUMBERS, CPU_TEXTS)
    elif cpu is not None:
        invalid.append(f"cpu: a {type(cpu).__name__}, not an object")
    if report.get("energy_source") not in ENERGY_SOURCES or report.get("energy_j") is None:
        report["energy_source"] = "none"
    if invalid:
        report["invalid"] = invalid[:20] + ([f"... and {len(invalid) - 20} more"] if len(invalid) > 20 else [])
    return report


def _clean_fields(raw: dict, where: str, invalid: list[str], numbers: dict = NUMBERS, texts: set = TEXTS) -> dict:
    out = {}
    for key, value in raw.items():
        if key in numbers:
            number = _number(value, numbers[key])
            if number is None and value is not None:
                invalid.append(f"{where}{key}: {_show(value)} is not a number in [0, {numbers[key]:g}]")
            out[key] = number
        elif key in texts:
            if value is None or isinstance(value, str):
                out[key] = value if value is None else value.replace("\x00", "")[:MAX_TEXT]
            else:
                invalid.append(f"{where}{key}: {_show(value)} is not text")
    return out


def _number(value, limit: float) -> float | int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value if 0 <= value <= limit else None


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
