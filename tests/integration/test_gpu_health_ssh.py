"""GPU health end to end over SSH: probe -> facts -> rules -> warehouse -> report, against the test sshd.

This machine has no GPU, so nvidia-smi, dcgmi and journalctl are fake scripts that print real published
outputs (tests/fixtures/gpu-tools, see its SOURCES.md); they reach the remote PATH through the host's
`probe_path`, exactly as a real host's /usr/local/nvidia/bin would. Everything else is real: the SSH
connection, the probe shell script, the folder of outputs, the warehouse (SQLite, migrated) and the report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest

from fleetbench.hosts import HostNeeds, evaluate, facts_from_dir, gather, reasons, verdict
from fleetbench.hosts.health import health_state
from fleetbench.hosts.probes import health_probes
from fleetbench.measure import _gpu_health
from fleetbench.run_model import HostVerdict
from fleetbench.warehouse import fetch_results, get_engine, store_run, upgrade
from fleetbench.warehouse.rows import host_row
from ssh_hosts import define_ssh_connection, sshd  # noqa: F401
from warehouse_rows import result_row, run_row

pytestmark = pytest.mark.integration

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "gpu-tools"
VENV_BIN = Path(sys.executable).parent


def fake_tools(bin_dir: Path, smi_xml: Path | None, smi_text: Path, topo: Path, journal: Path,
               dcgm: Path | None = None, dcgm_exit: int = 0) -> Path:
    """nvidia-smi answering -q -x, -q and topo -m with fixture files (exit 1 for anything else, as for a
    query this fake has no recording of); journalctl printing a kernel log; dcgmi printing a diagnostic."""
    bin_dir.mkdir(parents=True)
    xml = f"cat {smi_xml}" if smi_xml else 'echo "fake nvidia-smi: no XML recorded" >&2; exit 1'
    scripts = {
        "nvidia-smi": f'case "$*" in\n  "-q -x") {xml} ;;\n  "-q") cat {smi_text} ;;\n  "topo -m") cat {topo} ;;\n'
                      f'  *) echo "fake nvidia-smi: no recording of: $*" >&2; exit 1 ;;\nesac',
        "journalctl": f"cat {journal}",
        "dcgmi": f"cat {dcgm}; exit {dcgm_exit}" if dcgm else "exit 127",
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return bin_dir


def ssh_check(conn_id: str, folder: Path, bin_dir: Path, dcgm_level: int | None = None):
    import airflow.providers.ssh.hooks.ssh  # noqa: F401

    from fleetbench.hosts.ssh import SSHRunner

    gather(SSHRunner(conn_id), folder, extra=health_probes(dcgm_level=dcgm_level), path=(str(bin_dir),))
    facts = facts_from_dir(folder)
    checks = evaluate(facts, HostNeeds(gpus=1))
    return facts, checks


def app_xid_log() -> str:
    """The GTX's kernel log with its XID 62 (a reset required: unfit) made an application's MMU fault (31)."""
    text = (FIX / "dmesg_xid62_gtx.txt").read_text()
    assert text.count("): 62, ") == 1
    return text.replace("): 62, ", "): 31, ")


@pytest.fixture()
def hosts(sshd, monkeypatch, tmp_path):  # noqa: F811
    conn = define_ssh_connection(monkeypatch, "gpu_ssh")
    p100 = fake_tools(tmp_path / "p100-bin", FIX / "nvidia-smi-q-x_1xteslap100_510.47.03_ecc-aggregate-sbe.xml",
                      FIX / "nvidia-smi-q-i1_v100-pcie-32gb_470.129.06_retired-pages-sbe1.txt",
                      FIX / "nvidia-smi-topo-m_8xv100-pcie_pix-node-sys_2xmlx5.txt",
                      FIX / "journalctl-k_xid79_gpu-fallen-off-bus.txt",
                      FIX / "dcgmi-diag-r1_8xh200_dcgm3.1.8_persistence-mode-fail.txt", dcgm_exit=1)
    app_xid = tmp_path / "dmesg_xid31.txt"
    app_xid.write_text(app_xid_log())
    rtx = fake_tools(tmp_path / "rtx-bin", None, FIX / "nvidia-smi-q_2xrtx4060ti_550.54.14_pcie-x4-downtrained.txt",
                     FIX / "nvidia-smi-topo-m_4xh100_nv18_8nic-phb_nic-legend.txt", app_xid)
    return conn, p100, rtx


def test_probe_facts_rules_warehouse_report_over_ssh(hosts, tmp_path):
    conn, p100_bin, rtx_bin = hosts
    p100, p100_checks = ssh_check(conn, tmp_path / "p100", p100_bin, dcgm_level=1)
    rtx, rtx_checks = ssh_check(conn, tmp_path / "rtx", rtx_bin)

    # probes ran on the remote side, through the fake tools on its PATH
    assert p100.runner == "ssh:gpu_ssh" and p100.gpu_health_source == "nvidia-smi-q.xml"
    assert p100.gpu_health[0]["name"] == "Tesla P100-PCIE-16GB" and p100.gpu_health[0]["aggregate_correctable"] == 3
    assert p100.xid["source"] == "journalctl" and [e["xid"] for e in p100.xid["events"]] == [79]
    assert p100.dcgm_diag["dcgm_version"] == "3.1.8" and p100.topology["summary"][0] == "GPU pairs: 16 NODE, 12 PIX"
    assert json.loads((tmp_path / "p100" / "probes.json").read_text())["probes"][-1]["exit_code"] == 1  # dcgmi
    p100_by = {c.name: c for c in p100_checks}
    assert p100_by["gpu_xid"].status == "fail" and p100_by["gpu_dcgm_diag"].status == "fail"
    assert verdict(p100_checks) == "unfit" and health_state(p100_checks) == "unfit"
    # the XML probe failed on the 4060 Ti host: the -q text fallback gave the facts
    assert rtx.gpu_health_source == "nvidia-smi-q.txt" and len(rtx.gpu_health) == 2
    assert "fake nvidia-smi: no XML recorded" in rtx.unknown.get("gpu_health", "") or rtx.gpu_health
    rtx_by = {c.name: c for c in rtx_checks}
    assert rtx_by["gpu_pcie_link"].evidence[0] == {"gpu": 0, "bus_id": "00000000:03:00.0", "value": "x4",
                                                   "threshold": "x8"}
    assert rtx_by["gpu_xid"].status == "pass" and "31" in rtx_by["gpu_xid"].detail  # not fatal
    assert health_state(rtx_checks) == "degraded"

    engine = get_engine(f"sqlite:///{tmp_path}/w.db")
    upgrade(engine)
    check_warehouse_and_report(engine, {"p100": (p100, p100_checks), "rtx": (rtx, rtx_checks)})


def test_health_rows_and_report_on_postgres(pg_engine, tmp_path):
    """The same rows and report on PostgreSQL, from folders of the real outputs (no SSH needed for that part)."""
    p100_dir, rtx_dir = tmp_path / "p100", tmp_path / "rtx"
    p100_dir.mkdir()
    rtx_dir.mkdir()
    (p100_dir / "nvidia-smi-q.xml").write_bytes((FIX / "nvidia-smi-q-x_1xteslap100_510.47.03_ecc-aggregate-sbe.xml")
                                                .read_bytes())
    (p100_dir / "kernel-xid.txt").write_text("# kernel log: journalctl -k --since -24h, window 86400 s\n"
                                             + (FIX / "journalctl-k_xid79_gpu-fallen-off-bus.txt").read_text())
    (p100_dir / "dcgmi-diag.txt").write_bytes((FIX / "dcgmi-diag-r1_8xh200_dcgm3.1.8_persistence-mode-fail.txt")
                                              .read_bytes())
    (rtx_dir / "nvidia-smi-q.txt").write_bytes((FIX / "nvidia-smi-q_2xrtx4060ti_550.54.14_pcie-x4-downtrained.txt")
                                               .read_bytes())
    (rtx_dir / "kernel-xid.txt").write_text("# kernel log: dmesg, window 86400 s, uptime 300\n"
                                            + app_xid_log())
    hosts = {}
    for name, folder in (("p100", p100_dir), ("rtx", rtx_dir)):
        facts = facts_from_dir(folder)
        hosts[name] = (facts, evaluate(facts, HostNeeds(gpus=1)))
    upgrade(pg_engine)
    check_warehouse_and_report(pg_engine, hosts)


def check_warehouse_and_report(engine, hosts: dict) -> None:
    """host_facts keeps the health, each result row its host's health state; the report shows the table."""
    (p100, p100_checks), (rtx, rtx_checks) = hosts["p100"], hosts["rtx"]
    # warehouse: host_facts keeps the health, each result row its host's health state
    run = SimpleNamespace(dag_id="fleet_benchmark", run_id="r1")
    now = datetime.now(timezone.utc).isoformat()
    verdicts = {name: HostVerdict(host=name, verdict=verdict(checks), reasons=reasons(checks),
                                  checks=[c.to_dict() for c in checks], facts=facts.to_dict(), collected_at=now)
                for name, facts, checks in (("p100", p100, p100_checks), ("rtx", rtx, rtx_checks))}
    results = [result_row("a", host="rtx", host_gpu_health=_gpu_health(verdicts["rtx"])),
               result_row("a", host="p100", status="skipped", ips=None, host_gpu_health=_gpu_health(verdicts["p100"]))]
    store_run(engine, run_row("r1"), [host_row(run, v) for v in verdicts.values()], results)
    with engine.connect() as c:
        stored = {r.host: r for r in c.exec_driver_sql(
            "SELECT host, verdict, gpu_health, gpu_health_issues, gpu_health_json FROM host_facts")}
    assert stored["rtx"].gpu_health == "degraded" and "gpu_pcie_link:warn" in stored["rtx"].gpu_health_issues
    assert stored["p100"].gpu_health == "unfit" and "gpu_xid:fail" in stored["p100"].gpu_health_issues
    assert json.loads(stored["p100"].gpu_health_json)["xid"]["events"][0]["xid"] == 79
    assert {r["host"]: r["host_gpu_health"] for r in fetch_results(engine, run_id="r1")} == {"rtx": "degraded",
                                                                                            "p100": "unfit"}

    # report: the fleet health table (host x check) and the marked rows
    from fleetbench.report.queries import build_report
    from fleetbench.report.render import render_html

    report = build_report(engine)
    health = {h["host"]: h for h in report["fleet_health"]}
    assert health["rtx"]["checks"]["gpu_pcie_link"] == "warn" and health["rtx"]["degraded_results"] == 1
    assert health["p100"]["checks"]["gpu_dcgm_diag"] == "fail"
    assert [t.get("gpu_health") for t in report["throughput"] if t.get("host") == "rtx"] == ["degraded"]
    html = render_html(report, [])
    assert 'id="fleet-health-table"' in html and '<span class="st-warn">warn</span>' in html
    assert "<tr class='degraded'>" in html  # the throughput row of the degraded host


def test_cli_table_and_strict_exit_codes(hosts, tmp_path):
    conn, p100_bin, rtx_bin = hosts
    env = os.environ.copy()

    def cli(*args):
        return subprocess.run([str(VENV_BIN / "fleetbench"), "host-check", "--gpus", "1", *args],
                              capture_output=True, text=True, timeout=120, env=env)

    # over SSH: this machine's Docker has no NVIDIA runtime and its GPU smoke container fails, so the host is unfit
    # whatever its GPUs say (without the smoke container, a runc-only Docker could still serve --gpus through the
    # toolkit's hook: nvidia_runtime would be unknown)
    table = cli("--ssh", conn, "--probe-path", str(rtx_bin), "--format", "table", "--strict",
                "--gpu-smoke-image", "fleetbench/base:bookworm", "--save", str(tmp_path / "rtx"))
    assert table.returncode == 1, (table.stdout, table.stderr[-2000:])
    assert table.stdout.startswith("verdict: unfit")
    lines = table.stdout.splitlines()
    assert any(ln.startswith("nvidia_runtime") and " fail " in ln for ln in lines)
    assert any(ln.startswith("gpu_pcie_link") and " warn " in ln for ln in lines)
    assert "- GPU 0 (00000000:03:00.0): x4 (threshold x8)" in table.stdout
    assert "topology: all 6 GPU pairs NVLink (NV18)" in table.stdout
    unfit = cli("--ssh", conn, "--probe-path", str(p100_bin), "--strict", "--dcgm-level", "1")
    assert unfit.returncode == 1, unfit.stderr[-2000:]
    result = json.loads(unfit.stdout)
    assert result["verdict"] == "unfit" and {"verdict", "facts", "checks"} <= set(result)
    assert result["gpu_health"]["dcgm_diag"]["tests"][4]["result"] == "Fail"
    assert json.loads(cli("--ssh", conn, "--probe-path", str(p100_bin)).stdout)["verdict"] == "unfit"  # exit 0

    # --strict on the GPU health alone: the health outputs of the SSH run, without the Docker ones
    health_only = tmp_path / "health-only"
    health_only.mkdir()
    for name in ("nvidia-smi-q.txt", "nvidia-smi-topo-m.txt", "kernel-xid.txt", "uname-r.txt"):
        (health_only / name).write_bytes((tmp_path / "rtx" / name).read_bytes())
    degraded = cli("--facts", str(health_only), "--strict")
    assert degraded.returncode == 3, degraded.stdout
    assert json.loads(degraded.stdout)["verdict"] == "degraded"
    (health_only / "kernel-xid.txt").write_text("# kernel log: journalctl -k --since -24h, window 86400 s\n"
                                                + (FIX / "journalctl-k_xid79_gpu-fallen-off-bus.txt").read_text())
    assert cli("--facts", str(health_only), "--strict").returncode == 1
    assert cli("--facts", str(health_only)).returncode == 0
    bad = cli("--facts", str(health_only), "--dcgm-level", "1")
    assert bad.returncode == 2 and "use them with --local or --ssh" in bad.stderr and "Traceback" not in bad.stderr


def test_validate_host_takes_the_hosts_gpu_health_settings(hosts, data_dir, smoke_image, tmp_path):
    """validate_host as the DAG calls it, on a plan from a config whose GPU host is reached over SSH: the
    host's probe_path and gpu_health settings reach the probes and the rules, and host_facts keeps the result."""
    from fleet_configs import smoke_config, write_config
    from fleetbench.airflow.pipeline import make_plan, validate_host

    conn, _, rtx_bin = hosts
    cfg = smoke_config(smoke_image, models=("trivial",), batch_sizes=(8,), device="gpu", num_gpus=[1])
    cfg["hosts"][0].update(connection=conn, probe_path=[str(rtx_bin)],
                           gpu_health={"require_persistence": False, "dcgm_diag_level": 1, "xid_window_hours": 6})
    run = {"dag_id": "fleet_benchmark", "run_id": "health_test", "logical_date": None, "run_type": "manual"}
    plan = make_plan(run, str(write_config(tmp_path / "fleet.yaml", cfg)))
    result = HostVerdict.load(validate_host(plan["hosts"][0], plan["run"]))
    checks = {c["name"]: c for c in result.checks}
    assert checks["gpu_pcie_link"]["status"] == "warn" and "gpu_persistence" not in checks
    # dcgmi is not installed on this host (the fake exits 127): unknown, saying so
    assert checks["gpu_dcgm_diag"]["status"] == "unknown" and "dcgmi-diag.txt" in checks["gpu_dcgm_diag"]["detail"]
    probes = json.loads((Path(result.facts_dir) / "probes.json").read_text())["probes"]
    xid = next(p for p in probes if p["filename"] == "kernel-xid.txt")
    assert xid["command"][-1] == "6" and xid["command"][3] == str(rtx_bin)  # the window, and the probe path
    assert result.host_facts.xid["window_s"] == 6 * 3600
    row = host_row(SimpleNamespace(dag_id="fleet_benchmark", run_id="health_test"), result)
    assert row["gpu_health"] == "degraded" and "gpu_dcgm_diag:unknown" in row["gpu_health_issues"]
