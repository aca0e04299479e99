"""GPU health rules: named checks over the health facts (`gpu_health.py`), each with its evidence.

unfit (fail): a row-remap failure or a pending remap, double-bit retired pages pending, an XID of the
fatal list in the window, a DCGM diagnostic Fail, MIG enabled while the host's cases need whole GPUs (and none
asks for MIG instances: then each case is given its devices or skipped, fleetbench.hosts.devices).
degraded (warn): a PCIe link below its max generation or width, a HW slowdown / thermal / power-brake
clock reason active at idle, a power limit below the default, persistence mode off, ECC disabled on a
data-center GPU, correctable remapped rows accumulating. Every threshold is a field of
`HealthThresholds` (the host's `gpu_health` config); README "GPU health" has the table.

Each check's evidence is a list of {"gpu", "bus_id", "value", "threshold"}: which GPU, what was read,
what it was held against.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fleetbench.hosts.facts import HostFacts
from fleetbench.hosts.rules import Check, HostNeeds

#: XIDs that mean the GPU must not be benchmarked (NVIDIA XID catalog): 48 double-bit ECC error, 62 internal
#: micro-controller halt, 63 ECC page retirement / row remap recorded, 64 page retirement or row remap failure,
#: 74 NVLink error, 79 fallen off the bus, 92 high single-bit ECC rate, 94 contained ECC error, 95 uncontained ECC
#: error, 119 GSP RPC timeout, 120 GSP error, 154 the driver's recovery action changed (GPU reset or node reboot
#: required; judged by each GPU's newest, not when it changed back to None). 62, 119, 120 and 154 all ask for a GPU
#: reset or a reboot.
UNFIT_XIDS = (48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 154)
#: XID 154's text when the recovery action went back to none: nothing to do.
_RECOVERED = re.compile(r"changed from .{0,40} to 0x0 \(None\)", re.IGNORECASE)
IDLE_CLOCK_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown")
#: Product brands that are not data-center boards: ECC off there is how they ship.
NON_DATACENTER_BRANDS = ("GeForce", "TITAN", "Quadro", "NVIDIA RTX", "Titan")


@dataclass(frozen=True)
class HealthThresholds:
    """The GPU health thresholds; the defaults are the README's."""

    xid_window_hours: int = 24
    unfit_xids: tuple[int, ...] = UNFIT_XIDS
    max_correctable_remapped_rows: int = 0  # warn above this many correctable remapped rows on a GPU
    min_power_limit_ratio: float = 1.0  # warn when the power limit is below this share of the default
    idle_clock_reasons: tuple[str, ...] = IDLE_CLOCK_REASONS
    require_persistence: bool = True
    # MIG instances are devices only for cases that ask for them (benchmarks' mig_profiles); MIG on means that GPU is
    # no whole GPU. allow_mig: a host whose whole-GPU cases find too few GPUs without MIG is not unfit; those
    # cases are skipped one by one (mig_enabled).
    allow_mig: bool = False
    dcgm_diag_level: int | None = None  # dcgmi diag -r N; None: not run (it takes minutes at 2 and more)


def _ev(gpu: dict, value, threshold) -> dict:
    return {"gpu": gpu.get("index"), "bus_id": gpu.get("bus_id"), "value": value, "threshold": threshold}


def _named(evidence: list[dict]) -> str:
    return ", ".join(f"GPU {e['gpu']}" for e in evidence)


def check_remapped_rows(gpus: list[dict]) -> Check:
    bad = [_ev(g, {"failure": g["remap_failure"], "pending": g["remap_pending"],
                   "uncorrectable": g["remap_uncorrectable"]}, "failure No, pending No")
           for g in gpus if g.get("remap_failure") or g.get("remap_pending")]
    if bad:
        return Check("gpu_remapped_rows", "fail",
                     f"{_named(bad)}: row remapping failed or is pending (reset the GPU; a failure means RMA)",
                     tuple(bad))
    # ECC on, and neither row remapping (Ampere and later) nor page retirement (before) readable: whether memory has
    # uncorrectable errors pending cannot be told (seen: an A100 in MIG mode, driver 510, N/A for both)
    blind = [_ev(g, "N/A", "remapped rows or retired pages reported") for g in gpus if g.get("ecc_mode") == "Enabled"
             and g.get("remap_pending") is None and g.get("retired_pending") is None]
    if blind:
        return Check("gpu_remapped_rows", "unknown", f"{_named(blind)}: ECC is on, but neither remapped rows nor "
                     "retired pages are reported (N/A): pending memory errors cannot be told", tuple(blind))
    known = [g for g in gpus if g.get("remap_pending") is not None]
    if not known:
        return Check("gpu_remapped_rows", "pass", "no GPU reports remapped rows (pre-Ampere: retired pages instead)")
    return Check("gpu_remapped_rows", "pass", f"{len(known)} GPU(s): no remap failure, none pending")


def check_correctable_remaps(gpus: list[dict], t: HealthThresholds) -> Check:
    bad = [_ev(g, g["remap_correctable"], t.max_correctable_remapped_rows)
           for g in gpus if (g.get("remap_correctable") or 0) > t.max_correctable_remapped_rows]
    if bad:
        values = ", ".join(f"GPU {e['gpu']}: {e['value']}" for e in bad)
        return Check("gpu_correctable_remaps", "warn",
                     f"correctable remapped rows above {t.max_correctable_remapped_rows}: {values}", tuple(bad))
    return Check("gpu_correctable_remaps", "pass",
                 f"correctable remapped rows at most {t.max_correctable_remapped_rows} on every GPU that has them")


def check_retired_pages(gpus: list[dict]) -> Check:
    pending = [g for g in gpus if g.get("retired_pending")]
    dbe = [_ev(g, {"double_bit": g.get("retired_dbe"), "pending": True}, "no page pending retirement")
           for g in pending if (g.get("retired_dbe") or 0) > 0]
    if dbe:
        return Check("gpu_retired_pages", "fail",
                     f"{_named(dbe)}: double-bit ECC pages pending retirement (reboot or reset the GPU)", tuple(dbe))
    if pending:
        ev = [_ev(g, {"single_bit": g.get("retired_sbe"), "pending": True}, "no page pending retirement")
              for g in pending]
        return Check("gpu_retired_pages", "warn", f"{_named(ev)}: single-bit ECC pages pending retirement",
                     tuple(ev))
    counts = [f"GPU {g['index']}: {g.get('retired_sbe') or 0} SBE, {g.get('retired_dbe') or 0} DBE retired"
              for g in gpus if g.get("retired_sbe") or g.get("retired_dbe")]
    return Check("gpu_retired_pages", "pass", "; ".join(counts) or "no retired page pending")


def _bus_key(bus_id: str | None) -> tuple[int, str, str] | None:
    """'00000000:01:00.0' and '0000:01:00' -> (0, '01', '00'): the PCI domain too (a GH200 node's GPUs are
    0009:01:00, 0019:01:00, ...), as a number ('0009' in the kernel log, '00000009' in nvidia-smi)."""
    parts = (bus_id or "").lower().split(":")
    if len(parts) < 3:
        return None
    try:
        domain = int(parts[-3], 16)
    except ValueError:
        return None
    return (domain, parts[-2], parts[-1].split(".")[0])


def check_xid(facts: HostFacts, gpus: list[dict], t: HealthThresholds) -> Check:
    if facts.xid is None:
        reason = facts.unknown.get("xid", "kernel log not captured")
        return Check("gpu_xid", "unknown", f"XIDs unknown: {reason}")
    by_bus = {_bus_key(g.get("bus_id")): g for g in gpus}
    hours = facts.xid.get("window_s", t.xid_window_hours * 3600) / 3600
    fatal, other = [], []
    events = facts.xid.get("events", [])
    # XID 154 says what the GPU needs now: only each GPU's newest counts (a reset done, the action back to none)
    newest_154 = {_bus_key(e["bus_id"]): i for i, e in enumerate(events) if e["xid"] == 154}
    for i, event in enumerate(events):
        gpu = by_bus.get(_bus_key(event["bus_id"]), {"index": None, "bus_id": event["bus_id"]})
        ev = _ev({"index": gpu.get("index"), "bus_id": event["bus_id"]}, event["xid"], list(t.unfit_xids))
        unfit = event["xid"] in t.unfit_xids and not (event["xid"] == 154 and (
            newest_154[_bus_key(event["bus_id"])] != i or _RECOVERED.search(event.get("detail") or "")))
        (fatal if unfit else other).append(ev)
    if fatal:
        codes = ", ".join(f"XID {e['value']} on {e['bus_id']}" for e in fatal[:8])
        return Check("gpu_xid", "fail", f"{len(fatal)} fatal XID event(s) in the last {hours:g} h: {codes}",
                     tuple(fatal[:50]))
    if other:
        codes = sorted({e["value"] for e in other})
        return Check("gpu_xid", "pass", f"no fatal XID in the last {hours:g} h; {len(other)} other XID event(s) "
                     f"({', '.join(map(str, codes))}: not in unfit_xids, not judged)", tuple(other[:50]))
    return Check("gpu_xid", "pass", f"no XID in the last {hours:g} h ({facts.xid.get('source')})")


def _on_gpus(test: dict, result: str) -> str:
    """" (GPU 1)" when the test names the GPUs of that result (not every GPU of a DCGM 3.x `- All` result)."""
    gpus = [g for g, r in (test.get("gpus") or {}).items() if r == result]
    return f" (GPU {', '.join(gpus)})" if gpus else ""


def check_dcgm(facts: HostFacts) -> Check | None:
    if facts.dcgm_diag is None:
        if "dcgm_diag" in facts.unknown:
            return Check("gpu_dcgm_diag", "unknown", f"dcgmi diag did not run: {facts.unknown['dcgm_diag']}")
        return None  # not configured
    tests = facts.dcgm_diag.get("tests", [])
    ev = [{"gpu": gpu, "bus_id": None, "value": f"{t['name']}: {result}", "threshold": "Pass"}
          for t in tests for gpu, result in (t.get("gpus") or {None: t["result"]}).items() if result in ("Fail",
                                                                                                        "Warn")]
    failed = [t for t in tests if t["result"] == "Fail"]
    version = facts.dcgm_diag.get("dcgm_version") or "unknown version"
    if failed:
        what = "; ".join(f"{t['name']}{_on_gpus(t, 'Fail')}: {(t.get('error') or t.get('warning') or 'Fail')[:200]}"
                         for t in failed)
        return Check("gpu_dcgm_diag", "fail", f"dcgmi diag (DCGM {version}) failed: {what}", tuple(ev))
    warned = [t for t in tests if t["result"] == "Warn"]
    if warned:
        what = "; ".join(f"{t['name']}: {t.get('warning') or t.get('error') or 'Warn'}"[:200] for t in warned)
        return Check("gpu_dcgm_diag", "warn", f"dcgmi diag (DCGM {version}) warns: {what}", tuple(ev))
    ran = sum(1 for t in tests if t["result"] == "Pass")
    return Check("gpu_dcgm_diag", "pass", f"dcgmi diag (DCGM {version}): {ran} test(s) passed, "
                 f"{len(tests) - ran} skipped")


def check_mig(gpus: list[dict], t: HealthThresholds, needs: HostNeeds | None = None,
              gpu_list: list[dict] | None = None) -> Check:
    """MIG on a GPU takes it away from whole-GPU cases (its instances are devices only for cases that ask for them,
    fleetbench.hosts.devices). Unfit when the host has fewer GPUs without MIG than its whole-GPU cases need and no
    case asks for MIG instances (unless `allow_mig`); otherwise each case finds its devices, or is skipped."""
    from fleetbench.hosts.devices import inventory, mig_gpus

    mig = mig_gpus(gpus, gpu_list)
    asks = (needs.mig if needs else {}) or {}
    wants = ", ".join(f"{n}x {p}" for p, n in sorted(asks.items()))
    if not mig:
        return Check("gpu_mig", "pass", "MIG disabled or not supported on every GPU" + (
            f"; the cases that ask for MIG instances ({wants}) are skipped (mig_unavailable)" if asks else ""))
    by_index = {g.get("index"): g for g in gpus}
    on = [_ev(by_index.get(i, {"index": i}), {"mig_mode": "Enabled", "mig_devices": len(devices) if gpu_list else
                                               by_index.get(i, {}).get("mig_devices", 0)}, "Disabled")
          for i, devices in mig.items()]
    total = max(len(gpus), len(gpu_list or []))
    whole, need = total - len(mig), needs.whole if needs else 1
    # the smallest whole-GPU case decides whether any can run; the larger ones are skipped one by one
    least = min(needs.fewest_whole_gpus, need) if needs and needs.fewest_whole_gpus else need
    what = f"{_named(on)}: MIG enabled ({inventory(mig, gpus)})"
    if least > whole and not asks and not t.allow_mig:
        return Check("gpu_mig", "fail", f"{what}, but the cases need {least} whole GPU(s) and {whole} GPU(s) run "
                     "without MIG (disable MIG, or give the benchmarks mig_profiles to run on its instances)",
                     tuple(on))
    if need > whole:
        rest = f"whole-GPU cases that need more than {whole} GPU(s) are skipped (mig_enabled)"
    elif need:
        rest = f"whole-GPU cases run on the {whole} GPU(s) without MIG"
    else:
        rest = "the cases run on MIG instances"
    return Check("gpu_mig", "pass", f"{what}; {rest}" + (f"; MIG cases ask for {wants}" if asks else ""), tuple(on))


def check_pcie(gpus: list[dict]) -> Check:
    """Width below max is always a fault (a downtrained link); generation below max counts only at P0, since
    idle GPUs lower their link speed to save power."""
    bad = []
    for g in gpus:
        if None not in (g.get("pcie_width_current"), g.get("pcie_width_max")) \
                and g["pcie_width_current"] < g["pcie_width_max"]:
            bad.append(_ev(g, f"x{g['pcie_width_current']}", f"x{g['pcie_width_max']}"))
        if None not in (g.get("pcie_gen_current"), g.get("pcie_gen_max")) and g["pcie_gen_current"] < g[
                "pcie_gen_max"] and g.get("performance_state") == "P0":
            bad.append(_ev(g, f"gen {g['pcie_gen_current']}", f"gen {g['pcie_gen_max']}"))
    if bad:
        what = ", ".join(f"GPU {e['gpu']} {e['value']} (max {e['threshold']})" for e in bad)
        return Check("gpu_pcie_link", "warn", f"PCIe link below its maximum: {what}", tuple(bad))
    known = [g for g in gpus if g.get("pcie_width_current") is not None]
    if not known:
        return Check("gpu_pcie_link", "unknown", "PCIe link width not reported")
    return Check("gpu_pcie_link", "pass", "; ".join(
        f"GPU {g['index']} gen {g.get('pcie_gen_current')} x{g['pcie_width_current']}" for g in known[:16]))


def check_clock_events(gpus: list[dict], t: HealthThresholds) -> Check:
    bad = [_ev(g, reason, "Not Active") for g in gpus for reason in t.idle_clock_reasons
           if (g.get("clock_reasons") or {}).get(reason)]
    if bad:
        what = ", ".join(f"GPU {e['gpu']} {e['value']}" for e in bad)
        return Check("gpu_clock_events", "warn", f"clocks held down at idle: {what}", tuple(bad))
    if not any(g.get("clock_reasons") for g in gpus):
        return Check("gpu_clock_events", "unknown", "clock event (throttle) reasons not reported")
    return Check("gpu_clock_events", "pass", f"none of {', '.join(t.idle_clock_reasons)} active at idle")


def check_power_limit(gpus: list[dict], t: HealthThresholds) -> Check:
    bad = []
    for g in gpus:
        limit, default = g.get("power_limit_w"), g.get("default_power_limit_w")
        if limit is not None and default and limit < default * t.min_power_limit_ratio:
            bad.append(_ev(g, limit, round(default * t.min_power_limit_ratio, 2)))
    if bad:
        what = ", ".join(f"GPU {e['gpu']} {e['value']:g} W (default-based threshold {e['threshold']:g} W)"
                         for e in bad)
        return Check("gpu_power_limit", "warn", f"power limit below the default: {what}", tuple(bad))
    known = [g for g in gpus if g.get("power_limit_w") is not None]
    if not known:
        return Check("gpu_power_limit", "unknown", "power limit not reported")
    return Check("gpu_power_limit", "pass", "; ".join(
        f"GPU {g['index']} {g['power_limit_w']:g} W" for g in known[:16]))


def check_persistence(gpus: list[dict], t: HealthThresholds) -> Check | None:
    if not t.require_persistence:
        return None
    off = [_ev(g, "Disabled", "Enabled") for g in gpus if g.get("persistence") is False]
    if off:
        return Check("gpu_persistence", "warn", f"{_named(off)}: persistence mode off (the driver re-initialises "
                     "between runs; enable it with nvidia-smi -pm 1 or nvidia-persistenced)", tuple(off))
    return Check("gpu_persistence", "pass", "persistence mode on")


def check_ecc_mode(gpus: list[dict]) -> Check:
    off = [_ev(g, "Disabled", "Enabled") for g in gpus if g.get("ecc_mode") == "Disabled"
           and not any(b.lower() in f"{g.get('brand') or ''} {g.get('name') or ''}".lower()
                       for b in NON_DATACENTER_BRANDS)]
    if off:
        return Check("gpu_ecc_mode", "warn", f"{_named(off)}: ECC disabled on a data-center GPU", tuple(off))
    on = sum(1 for g in gpus if g.get("ecc_mode") == "Enabled")
    return Check("gpu_ecc_mode", "pass", f"ECC enabled on {on} GPU(s); the others have no ECC or are not "
                 "data-center boards" if on < len(gpus) else f"ECC enabled on {on} GPU(s)")


def evaluate_health(facts: HostFacts, needs: HostNeeds) -> list[Check]:
    """The GPU health checks, when the health probes ran (folders without them give none)."""
    t = needs.health or HealthThresholds()
    if facts.gpu_health is None:
        # nvidia-smi -L alone still says which GPUs are in MIG mode; the kernel log's XIDs (a GPU fallen off the
        # bus is why nvidia-smi -q cannot read it) and dcgmi diag's results do not need nvidia-smi -q either
        rest = [c for c in ((check_mig([], t, needs, facts.gpu_list) if facts.gpu_list else None),
                            (check_xid(facts, [], t) if facts.xid is not None else None), check_dcgm(facts)) if c]
        if "gpu_health" not in facts.unknown or facts.driver_state:
            return rest  # not captured, or the driver checks already say why nvidia-smi gave nothing
        return [Check("gpu_health_probes", "unknown", f"GPU health unknown: {facts.unknown['gpu_health']}",
                      tuple({"gpu": None, "bus_id": None, "value": f"{name}: {why}", "threshold": "readable"}
                            for name, why in facts.probe_unreadable.items()))] + rest
    gpus = facts.gpu_health
    checks = [check_remapped_rows(gpus), check_retired_pages(gpus), check_xid(facts, gpus, t), check_dcgm(facts),
              check_mig(gpus, t, needs, facts.gpu_list), check_pcie(gpus), check_clock_events(gpus, t),
              check_power_limit(gpus, t),
              check_persistence(gpus, t), check_ecc_mode(gpus), check_correctable_remaps(gpus, t)]
    return [c for c in checks if c is not None]


#: Every health check, in table order (the fleet health table's columns).
HEALTH_CHECKS = ("gpu_remapped_rows", "gpu_retired_pages", "gpu_xid", "gpu_dcgm_diag", "gpu_mig", "gpu_pcie_link",
                 "gpu_clock_events", "gpu_power_limit", "gpu_persistence", "gpu_ecc_mode", "gpu_correctable_remaps",
                 "gpu_health_probes")


def _status_of(check) -> tuple[str, str]:
    return (check.name, check.status) if isinstance(check, Check) else (check["name"], check["status"])


def health_state(checks) -> str | None:
    """healthy | degraded | unfit from the GPU health checks among `checks` (Check objects or their dicts);
    None when there are none (not checked). An unknown health check counts as degraded, as in the verdict."""
    statuses = [status for name, status in map(_status_of, checks) if name in HEALTH_CHECKS]
    if not statuses:
        return None
    if "fail" in statuses:
        return "unfit"
    return "degraded" if set(statuses) - {"pass"} else "healthy"


def health_issues(checks) -> str:
    """The health checks that did not pass: "gpu_pcie_link:warn, gpu_persistence:warn"."""
    return ", ".join(f"{name}:{status}" for name, status in map(_status_of, checks)
                     if name in HEALTH_CHECKS and status != "pass")
