"""GPU health: parsers and rules on real published tool outputs (tests/fixtures/gpu-tools, see its SOURCES.md).

Every expected value below is read off the fixture file named in the test. Rule cases that no published
output shows (a remap failure, MIG on) change one field of a GPU parsed from a real file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fleetbench.hosts import HostNeeds, LocalRunner, evaluate, facts_from_dir, gather, verdict
from fleetbench.hosts import gpu_health as G
from fleetbench.hosts.facts import MAX_PROBE_BYTES
from fleetbench.hosts.health import (
    HEALTH_CHECKS,
    HealthThresholds,
    check_clock_events,
    check_correctable_remaps,
    check_mig,
    check_power_limit,
    check_remapped_rows,
    check_retired_pages,
)
from fleetbench.hosts.probes import XID_FILE, health_probes, on_path

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "gpu-tools"
P100_XML = FIX / "nvidia-smi-q-x_1xteslap100_510.47.03_ecc-aggregate-sbe.xml"
V100_TXT = FIX / "nvidia-smi-q-i1_v100-pcie-32gb_470.129.06_retired-pages-sbe1.txt"
RTX4060_TXT = FIX / "nvidia-smi-q_2xrtx4060ti_550.54.14_pcie-x4-downtrained.txt"
H100_MIG_TXT = FIX / "nvidia-smi-q_1xh100_590.48.01_mig-4-devices.txt"
H100_MIG_LIST = FIX / "nvidia-smi-L_1xh100_590.48.01_mig-3g-2g-2x1g.txt"
TOPO_4H100 = FIX / "nvidia-smi-topo-m_4xh100_nv18_8nic-phb_nic-legend.txt"
TOPO_8H100 = FIX / "nvidia-smi-topo-m_8xh100_nv18_2numa_spaces.txt"
TOPO_8V100 = FIX / "nvidia-smi-topo-m_8xv100-pcie_pix-node-sys_2xmlx5.txt"
TOPO_1H100_ANSI = FIX / "nvidia-smi-topo-m_1xh100_590.48.01_ansi-underlined-header.txt"
DCGM3 = FIX / "dcgmi-diag-r1_8xh200_dcgm3.1.8_persistence-mode-fail.txt"
DCGM4 = FIX / "dcgmi-diag-r2_1gpu_dcgm4.4.2_pass_new-format.txt"
JOURNAL_79 = FIX / "journalctl-k_xid79_gpu-fallen-off-bus.txt"
DMESG_62 = FIX / "dmesg_xid62_gtx.txt"
GPU_NEEDS = HostNeeds(gpus=1)
JOURNAL_HEAD = "# kernel log: journalctl -k --since -24h, window 86400 s\n"


def journal(lines: str = "") -> str:
    return JOURNAL_HEAD + lines


def folder(tmp_path: Path, **files: str | bytes) -> Path:
    """A captured probe folder: keyword names use _ for - and . (nvidia_smi_q_xml -> nvidia-smi-q.xml)."""
    names = {"nvidia_smi_q_xml": "nvidia-smi-q.xml", "nvidia_smi_q_txt": "nvidia-smi-q.txt",
             "topo": "nvidia-smi-topo-m.txt", "xid": "kernel-xid.txt", "dcgm": "dcgmi-diag.txt"}
    for key, content in files.items():
        path = tmp_path / names[key]
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return tmp_path


def by_name(checks) -> dict:
    return {c.name: c for c in checks}


# -- nvidia-smi -q -x / -q -----------------------------------------------------------------------
def test_xml_p100_values_read_off_the_file():
    parsed = G.parse_smi_xml(P100_XML.read_text())
    assert (parsed["driver_version"], parsed["cuda_version"], parsed["cuda_not_found"]) == ("510.47.03", "11.6", False)
    [gpu] = parsed["gpus"]
    assert gpu["name"] == "Tesla P100-PCIE-16GB" and gpu["bus_id"] == "00000000:00:04.0"
    assert gpu["uuid"] == "GPU-d3da8716-eaab-75db-efc1-60e88e1cd55e" and gpu["memory_total_mib"] == 16384
    assert gpu["persistence"] is False and gpu["mig_mode"] is None and gpu["ecc_mode"] == "Enabled"
    assert (gpu["volatile_correctable"], gpu["aggregate_correctable"], gpu["aggregate_uncorrectable"]) == (0, 3, 0)
    assert (gpu["retired_sbe"], gpu["retired_dbe"], gpu["retired_pending"]) == (0, 0, False)
    assert gpu["remap_pending"] is None  # <remapped_rows>N/A</remapped_rows> on Pascal
    assert (gpu["pcie_gen_current"], gpu["pcie_gen_max"], gpu["pcie_width_current"], gpu["pcie_width_max"]) == \
        (3, 3, 16, 16)
    assert (gpu["power_limit_w"], gpu["default_power_limit_w"], gpu["temperature_c"]) == (250.0, 250.0, 38.0)
    assert gpu["clock_reasons"]["gpu_idle"] is True and gpu["clock_reasons"]["hw_slowdown"] is False
    assert gpu["performance_state"] == "P0"


def test_text_v100_clocks_throttle_reasons_layout_and_retired_pages():
    parsed = G.parse_smi_text(V100_TXT.read_text())
    assert (parsed["driver_version"], parsed["cuda_version"]) == ("470.129.06", "11.4")
    [gpu] = parsed["gpus"]  # nvidia-smi -q -i 1: one GPU section of the 8 attached
    assert gpu["bus_id"] == "00000000:1C:00.0" and gpu["name"] == "Tesla V100-PCIE-32GB"
    assert gpu["persistence"] is True and gpu["ecc_mode"] == "Enabled"
    assert (gpu["retired_sbe"], gpu["retired_dbe"], gpu["retired_pending"]) == (1, 0, False)
    assert (gpu["aggregate_correctable"], gpu["aggregate_uncorrectable"]) == (3, 0)
    assert set(gpu["clock_reasons"]) == set(G.CLOCK_REASONS) and gpu["clock_reasons"]["gpu_idle"] is True
    assert not any(v for k, v in gpu["clock_reasons"].items() if k != "gpu_idle")
    assert (gpu["power_limit_w"], gpu["default_power_limit_w"], gpu["temperature_c"]) == (250.0, 250.0, 29.0)
    assert gpu["memory_total_mib"] == 32510


def test_text_rtx4060ti_clocks_event_reasons_layout_and_downtrained_link():
    parsed = G.parse_smi_text(RTX4060_TXT.read_text())
    assert (parsed["driver_version"], parsed["cuda_version"]) == ("550.54.14", "12.4")
    g0, g1 = parsed["gpus"]
    assert (g0["bus_id"], g1["bus_id"]) == ("00000000:03:00.0", "00000000:09:00.0")
    assert (g0["pcie_width_current"], g0["pcie_width_max"], g1["pcie_width_current"], g1["pcie_width_max"]) == \
        (4, 8, 8, 8)
    assert (g0["pcie_gen_current"], g0["pcie_gen_max"]) == (4, 4)
    assert g0["clock_reasons"]["gpu_idle"] is True and g0["clock_reasons"]["display_clocks_setting"] is False
    assert (g0["remap_correctable"], g0["remap_uncorrectable"], g0["remap_pending"], g0["remap_failure"]) == \
        (0, 0, False, False)
    assert g0["ecc_mode"] is None and g0["aggregate_correctable"] is None  # ECC Mode: N/A on GeForce
    assert (g0["power_limit_w"], g0["default_power_limit_w"]) == (165.0, 165.0)  # "GPU Power Readings" (R550)
    assert g0["brand"] == "GeForce" and g0["persistence"] is False


def test_text_r590_mig_device_blocks_are_counted(tmp_path):
    """R590 prints each MIG instance as a "MIG Device" block right in the GPU's block (no "MIG devices" section);
    the same run's `nvidia-smi -L` lists the same four."""
    text = H100_MIG_TXT.read_text()
    assert text.count("\n    MIG Device\n") == 4 and "MIG devices" not in text
    gpu = G.parse_smi_text(text)["gpus"][0]
    assert (gpu["mig_mode"], gpu["mig_devices"]) == ("Enabled", 4)
    assert len(G.parse_gpu_list(H100_MIG_LIST.read_text())[0]["mig"]) == 4
    mig = check_mig([gpu], HealthThresholds())  # no nvidia-smi -L: the count is all there is
    assert mig.status == "fail" and "GPU 0: 4 MIG device(s), profiles unknown without nvidia-smi -L" in mig.detail
    assert "no MIG device" not in mig.detail and mig.evidence[0]["value"]["mig_devices"] == 4
    facts = facts_from_dir(folder(tmp_path, nvidia_smi_q_txt=text))
    assert facts.gpu_health[0]["mig_devices"] == 4 and facts.driver_version == "590.48.01"


def test_xml_and_text_give_the_same_fields():
    xml_keys = set(G.parse_smi_xml(P100_XML.read_text())["gpus"][0])
    assert xml_keys == set(G.parse_smi_text(V100_TXT.read_text())["gpus"][0])


# -- topo -m, XID, dcgmi --------------------------------------------------------------------------
def test_topology_all_nvlink_with_nic_legend():
    topo = G.parse_topology(TOPO_4H100.read_text())
    assert topo["gpus"] == ["GPU0", "GPU1", "GPU2", "GPU3"] and set(topo["links"].values()) == {"NV18"}
    assert len(topo["links"]) == 6 and topo["nics"]["NIC7"] == "mlx5_7" and topo["gpu_nic"]["GPU0-NIC0"] == "PHB"
    assert topo["affinity"]["GPU3"] == {"cpu": "0-79", "numa": "0"}
    assert topo["summary"][0] == "all 6 GPU pairs NVLink (NV18)"


def test_topology_two_numa_nodes():
    topo = G.parse_topology(TOPO_8H100.read_text())
    assert topo["affinity"]["GPU0"]["cpu"] == "0-47,96-143" and topo["affinity"]["GPU7"]["numa"] == "1"
    assert topo["summary"] == ["all 28 GPU pairs NVLink (NV18)", "8 GPU(s) on NUMA node(s) 0, 1"]


def test_topology_header_underlined_with_ansi_codes(tmp_path):
    """nvidia-smi writes `ESC[4m`...`ESC[0m` around the header row even into a file (the R590 capture has it)."""
    assert "\x1b[4mGPU0" in TOPO_1H100_ANSI.read_text()
    topo = G.parse_topology(TOPO_1H100_ANSI.read_text())
    assert topo["gpus"] == ["GPU0"] and topo["links"] == {}
    assert topo["affinity"] == {"GPU0": {"cpu": "0-19", "numa": "0"}}
    assert topo["summary"] == ["1 GPU(s) on NUMA node(s) 0"]
    lines = TOPO_8H100.read_text().split("\n")
    lines[0] = lines[0].replace("GPU0", "\x1b[4mGPU0", 1) + "\x1b[0m"
    assert G.parse_topology("\n".join(lines))["summary"] == G.parse_topology(TOPO_8H100.read_text())["summary"]
    facts = facts_from_dir(folder(tmp_path, topo=TOPO_1H100_ANSI.read_text()))
    assert facts.topology["gpus"] == ["GPU0"] and "nvidia-smi-topo-m.txt" not in facts.probe_unreadable


def test_topology_pcie_only_with_named_nics():
    topo = G.parse_topology(TOPO_8V100.read_text())
    assert topo["links"]["GPU0-GPU1"] == "PIX" and topo["links"]["GPU3-GPU4"] == "NODE"
    assert topo["gpu_nic"]["GPU7-mlx5_1"] == "SYS" and set(topo["nics"]) == {"mlx5_0", "mlx5_1"}
    assert topo["summary"][0] == "GPU pairs: 16 NODE, 12 PIX"


def test_dcgm3_fail_with_its_wrapped_error_text():
    diag = G.parse_dcgm_diag(DCGM3.read_text())
    assert (diag["dcgm_version"], diag["layout"]) == ("3.1.8", "3.x")
    tests = {t["name"]: t for t in diag["tests"]}
    assert tests["Persistence Mode"]["result"] == "Fail" and tests["Denylist"]["result"] == "Pass"
    error = tests["Persistence Mode"]["error"]
    assert error.startswith("Persistence mode for GPU 0 is currently disabled. The DCGM diagnostic requires "
                            "peristence mode to be enabled.")
    assert "Persistence mode for GPU 3 is currently disabled." in error
    assert len(diag["tests"]) == 9


def test_dcgm4_per_gpu_results():
    diag = G.parse_dcgm_diag(DCGM4.read_text())
    assert (diag["dcgm_version"], diag["layout"]) == ("4.4.2", "4.x")
    assert [(t["name"], t["section"], t["result"], t["gpus"]) for t in diag["tests"]] == [
        ("software", "Deployment", "Pass", {"0": "Pass"}), ("memory", "Hardware", "Pass", {"0": "Pass"}),
        ("pcie", "Integration", "Pass", {"0": "Pass"})]


def test_dcgm4_per_gpu_message_names_the_failure():
    """DCGM 4.x prints each GPU's message under `Warning: GPU1` (dcgmi's Diag.cpp), wrapped at 45 characters, also for
    a GPU that failed: the row was not read as a message, so the verdict said only the wrapped rest ('n GPU 1.')."""
    def row(name: str, info: str) -> str:
        return f"| {name:<25} | {info:<46} |"

    lines = DCGM4.read_text().splitlines()
    msg = "Detected 2 volatile double-bit ECC error(s) in GPU 1."
    table = [*lines[:11], row("", "GPU1: Pass"), lines[11], row("memory", "Fail"), row("", "GPU0: Pass"),
             row("", "GPU1: Fail"), row("Warning: GPU1", msg[:45]), row("", msg[45:]),
             row("Warning: GPU0", "A note on GPU 0."), lines[-1]]
    memory = G.parse_dcgm_diag("\n".join(table) + "\n")["tests"][1]
    assert (memory["name"], memory["result"], memory["gpus"]) == ("memory", "Fail", {"0": "Pass", "1": "Fail"})
    assert (memory["error"], memory["warning"]) == (msg, "A note on GPU 0.")


def test_xid_from_the_journal():
    xid = G.parse_xid_log(journal(JOURNAL_79.read_text()))
    assert xid["source"] == "journalctl" and xid["window_s"] == 86400
    assert [(e["bus_id"], e["xid"], e["detail"]) for e in xid["events"]] == [
        ("0000:01:00", 79, "GPU has fallen off the bus.")]


def test_xid_of_a_mig_instance_is_its_gpus():
    """On a MIG GPU the driver names the GPU instance (and compute instance) after the bus id (open-gpu-kernel-modules
    kernel_rc.c; NVIDIA's A100 memory error management guide). Those lines were not read: XID 94/95 passed."""
    from fleetbench.hosts.facts import HostFacts
    from fleetbench.hosts.health import HealthThresholds, check_xid

    log = journal(
        "Jul 14 09:12:01 gpu-a100-01 kernel: NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User "
        "Channel (0x9). RST: No, D-RST: No\n"
        "Jul 14 09:20:44 gpu-a100-01 kernel: NVRM: Xid (PCI:0000:01:00 GPU-I:01 GPU-CI:00): 95, pid=7301, "
        "name=python3, Uncontained: LTC TAG (0x2,0x1). RST: Yes, D-RST: No\n")
    xid = G.parse_xid_log(log)
    assert [(e["bus_id"], e["xid"], e["detail"][:8]) for e in xid["events"]] == [
        ("0000:01:00", 94, "pid=7194"), ("0000:01:00", 95, "pid=7301")]
    check = check_xid(HostFacts(xid=xid), [{"index": 0, "bus_id": "00000000:01:00.0"}], HealthThresholds())
    assert check.status == "fail" and "XID 94 on 0000:01:00" in check.detail


def test_xid_from_dmesg_is_windowed_by_uptime():
    lines = DMESG_62.read_text()
    recent = G.parse_xid_log(f"# kernel log: dmesg, window 86400 s, uptime 200.5\n{lines}")
    assert [(e["xid"], e["detail"]) for e in recent["events"]] == [(62, "12b2(1fa0) 00000000 00000000")]
    old = G.parse_xid_log(f"# kernel log: dmesg, window 3600 s, uptime {121.33 + 3600 + 60}\n{lines}")
    assert old["events"] == [] and old["window_s"] == 3600


# -- rules ---------------------------------------------------------------------------------------
def test_rtx4060ti_host_is_degraded_by_its_x4_link_and_persistence_off(tmp_path):
    facts = facts_from_dir(folder(tmp_path, nvidia_smi_q_txt=RTX4060_TXT.read_text(), xid=journal()))
    checks = by_name(evaluate(facts, GPU_NEEDS))
    assert checks["gpu_pcie_link"].status == "warn"
    assert checks["gpu_pcie_link"].evidence == ({"gpu": 0, "bus_id": "00000000:03:00.0", "value": "x4",
                                                 "threshold": "x8"},)
    assert checks["gpu_persistence"].status == "warn" and [e["gpu"] for e in checks["gpu_persistence"].evidence] \
        == [0, 1]
    assert checks["gpu_ecc_mode"].status == "pass"  # no ECC on GeForce: not a fault
    assert checks["gpu_remapped_rows"].status == "pass" and checks["gpu_xid"].status == "pass"
    assert checks["gpu_power_limit"].status == "pass" and checks["gpu_clock_events"].status == "pass"
    assert "gpu_dcgm_diag" not in checks  # off by default
    assert verdict(list(checks.values())) == "degraded"
    # the GPU list comes from -q when neither the query CSV nor the table was captured
    assert [g.name for g in facts.gpus] == ["NVIDIA GeForce RTX 4060 Ti"] * 2
    assert facts.driver_version == "550.54.14"


def test_xid_79_in_the_window_makes_the_host_unfit(tmp_path):
    facts = facts_from_dir(folder(tmp_path, nvidia_smi_q_xml=P100_XML.read_text(), xid=journal(JOURNAL_79.read_text())))
    check = by_name(evaluate(facts, GPU_NEEDS))["gpu_xid"]
    assert check.status == "fail" and "XID 79 on 0000:01:00" in check.detail
    assert check.evidence[0]["value"] == 79
    assert check.evidence[0]["threshold"] == [48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 154]


def test_xid_62_a_micro_controller_halt_makes_the_host_unfit(tmp_path):
    """XID 62 asks for a GPU reset (NVIDIA's XID catalog); it passed as 'application-level'."""
    xid = f"# kernel log: dmesg, window 86400 s, uptime 300\n{DMESG_62.read_text()}"
    facts = facts_from_dir(folder(tmp_path, nvidia_smi_q_xml=P100_XML.read_text(), xid=xid))
    check = by_name(evaluate(facts, GPU_NEEDS))["gpu_xid"]
    assert check.status == "fail" and "XID 62 on 0000:01:00" in check.detail


APP_XIDS = """[  120.1] NVRM: Xid (PCI:0000:01:00): 13, pid=4242, name=python3, Graphics Exception: ESR 0x404490=0x8
[  121.2] NVRM: Xid (PCI:0000:01:00): 31, pid=4242, name=python3, Ch 00000010, intr 10000000. MMU Fault
[  122.3] NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)
"""


@pytest.mark.parametrize("lines, status, detail", [
    (APP_XIDS, "pass", "3 other XID event(s) (13, 31, 154: not in unfit_xids, not judged)"),
    ("[  123.4] NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset "
     "Required)\n", "fail", "XID 154 on 0000:01:00"),
    # a reset done: the newest XID 154 of the GPU says no action is needed any more
    ("[  123.4] NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset "
     "Required)\n[  160.0] NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x1 (GPU Reset "
     "Required) to 0x0 (None)\n", "pass", "2 other XID event(s) (154: not in unfit_xids, not judged)"),
    ("[  123.5] NVRM: Xid (PCI:0000:01:00): 119, pid=1, name=nvidia-smi, Timeout after 6s of waiting for RPC "
     "response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL)\n", "fail", "XID 119 on 0000:01:00"),
])
def test_application_xids_pass_and_a_required_reset_fails(tmp_path, lines, status, detail):
    """An application's fault (13, 31) is listed, not judged; XID 154 is the driver saying the GPU needs a reset or
    the node a reboot (unless the action went back to none), and a GSP timeout (119) needs a reset."""
    xid = f"# kernel log: dmesg, window 86400 s, uptime 300\n{lines}"
    facts = facts_from_dir(folder(tmp_path, nvidia_smi_q_xml=P100_XML.read_text(), xid=xid))
    check = by_name(evaluate(facts, GPU_NEEDS))["gpu_xid"]
    assert check.status == status and detail in check.detail


def test_an_xid_names_its_gpu_by_pci_domain_too():
    """GH200 and GB200 nodes put their GPUs at 0009:01:00, 0019:01:00, ...: one bus number in other PCI domains. The
    event named the last GPU of that bus number, not its own."""
    from fleetbench.hosts.facts import HostFacts
    from fleetbench.hosts.health import HealthThresholds, check_xid

    gpus = [{"index": i, "bus_id": f"0000{d}:01:00.0"} for i, d in enumerate(("0009", "0019", "0029", "0039"))]
    facts = HostFacts(xid={"source": "journalctl", "window_s": 86400,
                           "events": [{"bus_id": "0009:01:00", "xid": 79, "detail": ""}]})
    check = check_xid(facts, gpus, HealthThresholds())
    assert check.status == "fail" and check.evidence[0]["gpu"] == 0


def test_dcgm_fail_makes_the_host_unfit_and_names_the_test(tmp_path):
    facts = facts_from_dir(folder(tmp_path, nvidia_smi_q_xml=P100_XML.read_text(), xid=journal(),
                                  dcgm=DCGM3.read_text()))
    checks = evaluate(facts, GPU_NEEDS)
    check = by_name(checks)["gpu_dcgm_diag"]
    assert check.status == "fail" and "DCGM 3.1.8" in check.detail and "Persistence Mode: Persistence mode for " \
        "GPU 0 is currently disabled" in check.detail
    assert verdict(checks) == "unfit"
    (tmp_path / "4").mkdir()
    passing = facts_from_dir(folder(tmp_path / "4", nvidia_smi_q_xml=P100_XML.read_text(), xid=journal(),
                                    dcgm=DCGM4.read_text()))
    assert by_name(evaluate(passing, GPU_NEEDS))["gpu_dcgm_diag"].detail == "dcgmi diag (DCGM 4.4.2): 3 test(s) " \
        "passed, 0 skipped"


def test_p100_healthy_but_persistence_off(tmp_path):
    facts = facts_from_dir(folder(tmp_path, nvidia_smi_q_xml=P100_XML.read_text(), xid=journal()))
    checks = by_name(evaluate(facts, GPU_NEEDS))
    bad = {n: c.status for n, c in checks.items() if n in HEALTH_CHECKS and c.status != "pass"}
    assert bad == {"gpu_persistence": "warn"}
    assert checks["gpu_retired_pages"].status == "pass" and checks["gpu_ecc_mode"].detail == "ECC enabled on 1 GPU(s)"
    assert checks["gpu_power_limit"].detail == "GPU 0 250 W"
    lenient = HostNeeds(gpus=1, health=HealthThresholds(require_persistence=False))
    assert "gpu_persistence" not in by_name(evaluate(facts, lenient))


def test_rules_on_one_changed_field_of_a_real_gpu():
    [p100] = G.parse_smi_xml(P100_XML.read_text())["gpus"]
    [rtx, _] = G.parse_smi_text(RTX4060_TXT.read_text())["gpus"]
    t = HealthThresholds()
    failed = check_remapped_rows([dict(rtx, remap_failure=True)])
    assert failed.status == "fail" and failed.evidence[0]["gpu"] == 0
    assert check_remapped_rows([dict(rtx, remap_pending=True, remap_uncorrectable=1)]).status == "fail"
    assert check_remapped_rows([rtx]).status == "pass"
    assert check_retired_pages([dict(p100, retired_pending=True, retired_dbe=2)]).status == "fail"
    assert check_retired_pages([dict(p100, retired_pending=True, retired_sbe=4)]).status == "warn"
    corr = check_correctable_remaps([dict(rtx, remap_correctable=3)], t)
    assert corr.status == "warn" and corr.evidence[0]["value"] == 3 and corr.evidence[0]["threshold"] == 0
    assert check_correctable_remaps([dict(rtx, remap_correctable=3)],
                                    HealthThresholds(max_correctable_remapped_rows=8)).status == "pass"
    mig = check_mig([dict(p100, mig_mode="Enabled", mig_devices=7)], t)
    assert mig.status == "fail" and mig.evidence[0]["value"] == {"mig_mode": "Enabled", "mig_devices": 7}
    assert check_mig([dict(p100, mig_mode="Enabled")], HealthThresholds(allow_mig=True)).status == "pass"
    capped = check_power_limit([dict(p100, power_limit_w=200.0)], t)
    assert capped.status == "warn" and capped.evidence[0]["value"] == 200.0 and capped.evidence[0]["threshold"] == 250
    assert check_power_limit([dict(p100, power_limit_w=200.0)], HealthThresholds(min_power_limit_ratio=0.8)).status \
        == "pass"
    hot = check_clock_events([dict(p100, clock_reasons={**p100["clock_reasons"], "hw_thermal_slowdown": True})], t)
    assert hot.status == "warn" and hot.evidence[0]["value"] == "hw_thermal_slowdown"


def test_check_json_carries_evidence_only_for_checks_that_have_it(tmp_path):
    facts = facts_from_dir(folder(tmp_path, nvidia_smi_q_txt=RTX4060_TXT.read_text(), xid=journal()))
    as_json = {c["name"]: c for c in json.loads(json.dumps([c.to_dict() for c in evaluate(facts, GPU_NEEDS)]))}
    assert as_json["gpu_pcie_link"]["evidence"][0] == {"gpu": 0, "bus_id": "00000000:03:00.0", "value": "x4",
                                                       "threshold": "x8"}
    assert set(as_json["kernel"]) == {"name", "status", "detail"}


def test_old_folders_without_health_outputs_get_no_health_checks():
    facts = facts_from_dir(Path(__file__).resolve().parents[1] / "fixtures" / "hosts" / "h100-590-cuda13.1")
    assert not [c for c in evaluate(facts, GPU_NEEDS) if c.name.startswith("gpu_") and c.name != "gpu_smoke"
                and c.name != "gpu_count"]


# -- bad input -----------------------------------------------------------------------------------
def test_truncated_xml_is_unreadable_and_the_text_fallback_is_used(tmp_path):
    xml = P100_XML.read_text()
    facts = facts_from_dir(folder(tmp_path, nvidia_smi_q_xml=xml[:len(xml) // 2], nvidia_smi_q_txt=V100_TXT.read_text(),
                                  xid=journal()))
    assert facts.gpu_health[0]["name"] == "Tesla V100-PCIE-32GB"
    assert facts.gpu_health_source.startswith("nvidia-smi-q.txt (nvidia-smi-q.xml: nvidia-smi -q -x: not complete XML")
    (tmp_path / "x").mkdir()
    alone = facts_from_dir(folder(tmp_path / "x", nvidia_smi_q_xml=xml[:len(xml) // 2], xid=journal()))
    assert "not complete XML" in alone.probe_unreadable["nvidia-smi-q.xml"]
    assert "may be truncated" in alone.probe_unreadable["nvidia-smi-q.xml"]
    checks = evaluate(alone, GPU_NEEDS)
    probe = by_name(checks)["gpu_health_probes"]
    assert probe.status == "unknown" and probe.evidence[0]["value"].startswith("nvidia-smi-q.xml: nvidia-smi -q -x")
    assert verdict(checks) != "ready"


@pytest.mark.parametrize("content, says", [
    (bytes(range(256)) * 64, "binary data"),
    (JOURNAL_79.read_text(), "no GPU section"),  # real text, but no layout these parsers know
    ("", "empty output"),
])
def test_garbage_and_unknown_layouts_are_probe_unreadable(tmp_path, content, says):
    facts = facts_from_dir(folder(tmp_path, nvidia_smi_q_txt=content, topo=content, dcgm=content, xid=content))
    for name in ("nvidia-smi-q.txt", "nvidia-smi-topo-m.txt", "dcgmi-diag.txt", "kernel-xid.txt"):
        assert name in facts.probe_unreadable, name
    assert says in facts.probe_unreadable["nvidia-smi-q.txt"]
    assert facts.gpu_health is None and facts.topology is None and facts.xid is None and facts.dcgm_diag is None


def test_xml_with_entities_is_not_parsed(tmp_path):
    bomb = '<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaaaaaaaa">]><nvidia_smi_log>&a;</nvidia_smi_log>'
    with pytest.raises(G.Unreadable, match="declares XML entities"):
        G.parse_smi_xml(bomb)


def test_a_50_mb_output_is_read_bounded_and_unreadable(tmp_path):
    big = tmp_path / "nvidia-smi-q.xml"
    unit = P100_XML.read_bytes()
    with big.open("wb") as out:
        for _ in range(50 * 2**20 // len(unit) + 1):
            out.write(unit)
    assert big.stat().st_size >= 50 * 2**20
    (tmp_path / XID_FILE).write_text(journal())
    facts = facts_from_dir(tmp_path)
    detail = facts.probe_unreadable["nvidia-smi-q.xml"]
    assert f"only its first {MAX_PROBE_BYTES // 2**20} MiB were read" in detail and "not parsed" in detail
    assert by_name(evaluate(facts, GPU_NEEDS))["gpu_health_probes"].status == "unknown"


def test_probe_path_and_ranges_are_checked_before_anything_runs():
    with pytest.raises(ValueError, match="not a plain absolute folder"):
        on_path(health_probes(), ("bin; rm -rf /",))
    with pytest.raises(ValueError, match="level must be 1 to 4"):
        health_probes(dcgm_level=7)
    with pytest.raises(ValueError, match="XID window"):
        health_probes(xid_window_hours=0)
    assert health_probes(dcgm_level=2)[-1].argv == ("dcgmi", "diag", "-r", "2")


# -- the XID probe script itself, with fake journalctl/dmesg on PATH -------------------------------
def fake_tools(bin_dir: Path, **scripts: str) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
    return bin_dir


def run_xid_probe(tmp_path: Path, bin_dir: Path):
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    gather(LocalRunner(env=env), out, probes=(), extra=health_probes(xid_window_hours=6)[3:4])
    return facts_from_dir(out), out


def test_xid_probe_reads_the_journal(tmp_path):
    bin_dir = fake_tools(tmp_path / "bin", journalctl=f'echo "$@" > {tmp_path}/args; cat {JOURNAL_79}',
                         dmesg="exit 1")
    facts, out = run_xid_probe(tmp_path, bin_dir)
    assert (tmp_path / "args").read_text().split() == ["-k", "--since", "-6h", "--no-pager"]
    assert facts.xid["source"] == "journalctl" and facts.xid["window_s"] == 6 * 3600
    assert [e["xid"] for e in facts.xid["events"]] == [79]


def test_xid_probe_says_permission_denied_not_healthy(tmp_path):
    bin_dir = fake_tools(
        tmp_path / "bin",
        # as journalctl does: -q hides this line (and it exits 0 either way)
        journalctl='case " $* " in *" -q "*) exit 0;; esac; echo "No journal files were opened due to insufficient '
                   'permissions."',
        dmesg='echo "dmesg: read kernel buffer failed: Operation not permitted" >&2; exit 1')
    facts, _ = run_xid_probe(tmp_path, bin_dir)
    assert facts.xid is None
    assert facts.unknown["xid"].startswith("kernel-xid.txt: permission denied reading the kernel log")
    assert "read kernel buffer failed: Operation not permitted" in facts.unknown["xid"]
    facts.gpu_health = G.parse_smi_xml(P100_XML.read_text())["gpus"]
    check = by_name(evaluate(facts, GPU_NEEDS))["gpu_xid"]
    assert check.status == "unknown" and "permission denied" in check.detail


def test_a_regression_says_when_its_hosts_gpu_health_changed():
    from fleetbench.regression.detect import what_changed
    from warehouse_rows import result_row

    baseline = [result_row("a", run_id=f"r{i}", host_gpu_health="healthy") for i in range(4)]
    now = result_row("a", run_id="r9", ips=80.0, host_gpu_health="degraded")
    assert what_changed(now, baseline)["host_gpu_health"] == {"before": "healthy", "after": "degraded"}
    assert "host_gpu_health" not in what_changed(result_row("a", host_gpu_health="healthy"), baseline)
    # results stored before the health checks existed (None) are no change
    unchecked = [result_row("a", run_id=f"r{i}") for i in range(4)]
    assert "host_gpu_health" not in what_changed(now, unchecked)


# -- DCGM 3.x levels 2+, a GPU nvidia-smi cannot read, R610's power section, CUDA past the table -----------------
DCGM3_R3 = FIX / "dcgmi-diag-r3_4xa10g_dcgm3.3.9_targeted-power-fail-gpu1.txt"
R610_Q = FIX / "nvidia-smi-q_1xrtx2080super_610.57.04_ceiling-power-limit.txt"


def test_dcgm3_level3_results_per_gpu_set_and_a_failed_gpu(tmp_path):
    """DCGM 3.x prints its Integration, Hardware and Stress tests' results per set of GPUs (`Pass - All`,
    `Pass - GPUs: 0, 2, 3` then `Fail - GPU: 1`): every test is read, and a GPU's failure fails the host."""
    diag = G.parse_dcgm_diag(DCGM3_R3.read_text())
    got = {t["name"]: (t["section"], t["result"], t["gpus"]) for t in diag["tests"]}
    assert len(got) == 16 and got["PCIe"] == ("Integration", "Pass", {}) and got["EUD Test"] == ("Stress", "Skip", {})
    assert got["Diagnostic"] == ("Hardware", "Pass", {})  # the stress test of that name, not the table's header
    assert got["Targeted Power"] == ("Stress", "Fail", {"0": "Pass", "2": "Pass", "3": "Pass", "1": "Fail"})
    power = next(t for t in diag["tests"] if t["name"] == "Targeted Power")
    assert power["warning"].startswith("GPU 1 Max power of 224.1 did not reach desired power minimum")
    assert "error" not in next(t for t in diag["tests"] if t["name"] == "Inforom")
    checks = evaluate(facts_from_dir(folder(tmp_path, nvidia_smi_q_xml=P100_XML.read_text(), xid=journal(),
                                            dcgm=DCGM3_R3.read_text())), GPU_NEEDS)
    check = by_name(checks)["gpu_dcgm_diag"]
    assert check.status == "fail" and check.detail.startswith(
        "dcgmi diag (DCGM 3.3.9) failed: Targeted Power (GPU 1): GPU 1 Max power of 224.1")
    assert [e["gpu"] for e in check.evidence] == ["1"] and verdict(checks) == "unfit"


def test_dcgm3_diagnostic_test_that_fails_fails_the_host(tmp_path):
    """DCGM 3.x's level 3/4 GPU stress test is a Hardware row named `Diagnostic`, the header's name: it was skipped
    as a header, and a GPU that failed it (the only failure) passed the host check."""
    text = DCGM3_R3.read_text()
    failed = (text.replace("| Diagnostic                | Pass - All                                     |",
                           "| Diagnostic                | Fail - GPU: 2                                  |")
              .replace("Fail - GPU: 1", "Pass - GPU: 1"))
    assert failed.count("Fail - GPU: 2") == 1 and "Fail - GPU: 1" not in failed
    got = {t["name"]: t for t in G.parse_dcgm_diag(failed)["tests"]}
    assert (got["Diagnostic"]["result"], got["Diagnostic"]["gpus"]) == ("Fail", {"2": "Fail"})
    checks = evaluate(facts_from_dir(folder(tmp_path, nvidia_smi_q_xml=P100_XML.read_text(), xid=journal(),
                                            dcgm=failed)), GPU_NEEDS)
    check = by_name(checks)["gpu_dcgm_diag"]
    assert check.status == "fail" and "Diagnostic (GPU 2)" in check.detail and verdict(checks) == "unfit"


def test_xids_and_dcgm_are_judged_when_nvidia_smi_q_cannot_read_the_gpu(tmp_path):
    """A GPU fallen off the bus is why `nvidia-smi -q` fails ("Unable to determine the device handle"): the kernel
    log's XID 79 and dcgmi's failure still make the host unfit, next to the unknown health probes."""
    lost = "Unable to determine the device handle for GPU0000:01:00.0: Unknown Error\n"
    facts = facts_from_dir(folder(tmp_path, nvidia_smi_q_txt=lost, xid=journal(JOURNAL_79.read_text()),
                                  dcgm=DCGM3.read_text()))
    assert facts.gpu_health is None
    checks = by_name(evaluate(facts, GPU_NEEDS))
    assert checks["gpu_health_probes"].status == "unknown"
    assert checks["gpu_xid"].status == "fail" and "XID 79 on 0000:01:00" in checks["gpu_xid"].detail
    assert checks["gpu_dcgm_diag"].status == "fail"
    assert verdict(list(checks.values())) == "unfit"


def test_r610_power_limits_under_the_ceiling_block(tmp_path):
    """R610 nests the limits under `GPU Ceiling Power Limit`: read there, a healthy board is not 'unknown'."""
    [gpu] = G.parse_smi_text(R610_Q.read_text())["gpus"]
    assert (gpu["power_limit_w"], gpu["default_power_limit_w"]) == (250.0, 250.0)
    facts = facts_from_dir(folder(tmp_path, nvidia_smi_q_txt=R610_Q.read_text(), xid=journal()))
    assert by_name(evaluate(facts, GPU_NEEDS))["gpu_power_limit"].status == "pass"
    lowered = R610_Q.read_text().replace("            Current Power Limit                        : 250.00 W",
                                         "            Current Power Limit                        : 150.00 W")
    (tmp_path / "low").mkdir()
    low = facts_from_dir(folder(tmp_path / "low", nvidia_smi_q_txt=lowered, xid=journal()))
    assert by_name(evaluate(low, GPU_NEEDS))["gpu_power_limit"].status == "warn"
    xml = ("<?xml version=\"1.0\" ?><nvidia_smi_log><driver_version>610.43.02</driver_version><attached_gpus>1"
           "</attached_gpus><gpu id=\"00000000:01:00.0\"><product_name>NVIDIA H200</product_name><gpu_power_readings>"
           "<gpu_ceiling_power_limit><current_power_limit>700.00 W</current_power_limit><default_power_limit>700.00 W"
           "</default_power_limit></gpu_ceiling_power_limit></gpu_power_readings></gpu></nvidia_smi_log>")
    [x] = G.parse_smi_xml(xml)["gpus"]
    assert (x["power_limit_w"], x["default_power_limit_w"]) == (700.0, 700.0)


def test_ecc_on_with_neither_remapped_rows_nor_retired_pages_readable_is_unknown():
    """An A100 in MIG mode (a published driver 510 `nvidia-smi -q -x`) says N/A for remapped rows and for every retired
    page count: both memory checks passed ('pre-Ampere: retired pages instead'). Unknown, as a PCIe width not
    reported is; a board without ECC (GeForce) and one that reports retired pages (pre-Ampere) still pass."""
    a100 = {"index": 0, "bus_id": "00000000:00:04.0", "name": "NVIDIA A100-SXM4-40GB", "ecc_mode": "Enabled",
            "remap_pending": None, "remap_failure": None, "retired_pending": None}
    check = check_remapped_rows([a100])
    assert check.status == "unknown" and check.detail.startswith("GPU 0: ECC is on, but neither remapped rows")
    assert check.evidence[0]["bus_id"] == "00000000:00:04.0"
    geforce = {**a100, "name": "NVIDIA GeForce RTX 4090", "ecc_mode": None}
    v100 = {**a100, "name": "Tesla V100-SXM2-16GB", "retired_pending": False}
    assert check_remapped_rows([geforce]).status == check_remapped_rows([v100]).status == "pass"
    assert check_remapped_rows([v100, a100]).status == "unknown"
