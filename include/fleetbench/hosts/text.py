"""`fleetbench host-check --format table`: the host-check JSON as a table for people."""

from __future__ import annotations

import textwrap

STRICT_EXIT = {"ready": 0, "unfit": 1, "degraded": 3}  # --strict: scripts gate on these


def format_table(result: dict, width: int = 120) -> str:
    """Verdict, one row per check (name, status, detail) and, under a check, its evidence per GPU."""
    checks = result.get("checks", [])
    name_w = max([len("CHECK")] + [len(c["name"]) for c in checks]) + 2
    status_w = 9
    detail_w = max(40, width - name_w - status_w)
    lines = [f"verdict: {result.get('verdict')}", "", f"{'CHECK':<{name_w}}{'STATUS':<{status_w}}DETAIL"]
    pad = " " * (name_w + status_w)
    for check in checks:
        detail = textwrap.wrap(check.get("detail") or "", detail_w) or [""]
        lines.append(f"{check['name']:<{name_w}}{check['status']:<{status_w}}{detail[0]}")
        lines += [pad + more for more in detail[1:]]
        if check["status"] != "pass":
            for ev in check.get("evidence", [])[:16]:
                where = "host" if ev.get("gpu") is None else f"GPU {ev['gpu']}"
                bus = f" ({ev['bus_id']})" if ev.get("bus_id") else ""
                lines.append(f"{pad}- {where}{bus}: {ev.get('value')} (threshold {ev.get('threshold')})")
    facts = result.get("facts", {})
    gpus = facts.get("gpus") or []
    lines += ["", f"kernel {facts.get('kernel') or '?'}, driver {facts.get('driver_version') or '?'}, "
              f"CUDA {facts.get('cuda_driver_version') or '?'}, Docker {facts.get('docker_version') or '?'}, "
              f"{len(gpus)} GPU(s)"]
    topology = (result.get("gpu_health") or {}).get("topology") or {}
    if topology.get("summary"):
        lines.append("topology: " + "; ".join(topology["summary"]))
    return "\n".join(lines)
