"""MIG instances as a case's devices: `nvidia-smi -L` listings as published (tests/fixtures/gpu-tools, SOURCES.md),
the config's `mig_profiles`, the plan's MIG cases, the host rule and each case's devices or why it is skipped.

Every UUID and profile below is read off the fixture file named in the test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetbench.config import ConfigError, parse_config
from fleetbench.failures import FAILURE_CLASSES
from fleetbench.hosts import HostNeeds, evaluate, facts_from_dir, verdict
from fleetbench.hosts import gpu_health as G
from fleetbench.hosts.devices import assign, inventory, mig_gpus
from fleetbench.hosts.health import HealthThresholds, check_mig, evaluate_health
from fleetbench.measure import SKIPPED, case_fields, result_row
from fleetbench.plan import build_plan, expand_cases
from fleetbench.run_model import HostVerdict, RunInfo

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "gpu-tools"
MIXED_4A100 = FIX / "nvidia-smi-L_4xa100-80gb_gpu0-mig-4x1g.20gb.txt"  # GPU 0: 4x 1g.20gb; GPUs 1-3 whole
SEVEN_1G = FIX / "nvidia-smi-L_1xa100-80gb_535.216.01_mig-7x1g.10gb.txt"
GUIDE_8A100 = FIX / "nvidia-smi-L_8xa100-40gb_r470_mixed-mig-profiles.txt"
P100_XML = FIX / "nvidia-smi-q-x_1xteslap100_510.47.03_ecc-aggregate-sbe.xml"


def host_folder(tmp_path: Path, listing: Path | None = None, xml: Path | None = None) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    if listing:
        (tmp_path / "nvidia-smi-L.txt").write_bytes(listing.read_bytes())
    if xml:
        (tmp_path / "nvidia-smi-q.xml").write_bytes(xml.read_bytes())
    return tmp_path


def config(mig_profiles=None, num_gpus=(1,), whole=True, device="gpu") -> dict:
    benches = [{"name": "cmd", "image": "img", "harness": "command", "num_gpus": list(num_gpus), "device": device,
                "command": ["python3", "-c", "print(1)"], **({"mig_profiles": mig_profiles} if mig_profiles else {})}]
    if whole:
        benches.append({"name": "whole", "image": "img", "harness": "command", "num_gpus": [1, 4],
                        "command": ["python3", "-c", "print(1)"]})
    return {"hosts": [{"name": "a100"}], "images": [{"name": "img", "ref": "127.0.0.1:5000/x:1"}],
            "benchmarks": benches}


# -- nvidia-smi -L ---------------------------------------------------------------------------------
def test_gpu_list_reads_gpus_and_their_mig_devices():
    mixed = G.parse_gpu_list(MIXED_4A100.read_text())
    assert [(g["index"], g["name"], g["uuid"]) for g in mixed] == [
        (0, "NVIDIA A100-SXM4-80GB", "GPU-513536b6-7d19-9063-b049-1e69664bb298"),
        (1, "NVIDIA A100-SXM4-80GB", "GPU-d8594bd4-0fc3-8595-e355-7c98138f3b95"),
        (2, "NVIDIA A100-SXM4-80GB", "GPU-5e375e7e-b41f-155b-dcdc-534524c356fc"),
        (3, "NVIDIA A100-SXM4-80GB", "GPU-69ec2344-ebac-b028-f88f-452abb3d7f11")]
    assert mixed[0]["mig"][0] == {"profile": "1g.20gb", "device": 0, "uuid": "MIG-ce861fb0-a248-58ce-a9a8-f9adbc22a66a"}
    assert [d["device"] for d in mixed[0]["mig"]] == [0, 1, 2, 3] and all(not g["mig"] for g in mixed[1:])
    seven = G.parse_gpu_list(SEVEN_1G.read_text())
    assert len(seven) == 1 and [d["profile"] for d in seven[0]["mig"]] == ["1g.10gb"] * 7
    assert seven[0]["mig"][6]["uuid"] == "MIG-1aae4990-b962-574e-8375-119d6d9b9687"
    guide = G.parse_gpu_list(GUIDE_8A100.read_text())  # R470: compute-instance profiles (1c.3g.20gb) too
    assert {g["index"]: sorted({d["profile"] for d in g["mig"]}) for g in guide} == {
        0: ["1g.5gb"], 1: ["2g.10gb"], 2: ["3g.20gb"], 3: ["7g.40gb"], 4: ["1c.3g.20gb"], 5: ["4g.20gb"],
        6: ["1c.7g.40gb", "2c.7g.40gb", "3c.7g.40gb"], 7: ["1g.5gb", "2g.10gb", "4g.20gb"]}


@pytest.mark.parametrize("text, says", [
    ("", "empty output"),
    ("\x00\x01garbage", "binary data"),
    ("No devices were found\n", "no 'GPU N: NAME (UUID: GPU-...)' line"),
])
def test_gpu_list_that_is_not_one_is_unreadable(text, says):
    with pytest.raises(G.Unreadable, match="nvidia-smi -L") as err:
        G.parse_gpu_list(text)
    assert says in str(err.value)


def test_a_mig_device_of_an_unknown_profile_is_left_out_not_the_whole_list():
    """A profile name no case can ask for (a newer driver's) drops that device only: the host's other instances
    stay usable."""
    whole = G.parse_gpu_list(MIXED_4A100.read_text())
    odd = G.parse_gpu_list(MIXED_4A100.read_text().replace("MIG 1g.20gb", "MIG 1g.twenty", 1))
    assert [len(g["mig"]) for g in odd] == [len(g["mig"]) - (i == 0) for i, g in enumerate(whole)]
    assert "1g.twenty" not in {d["profile"] for g in odd for d in g["mig"]}


def test_facts_keep_the_list_and_take_the_gpus_from_it(tmp_path):
    facts = facts_from_dir(host_folder(tmp_path, MIXED_4A100))
    assert [g["index"] for g in facts.gpu_list] == [0, 1, 2, 3]
    assert [(g.index, g.uuid) for g in facts.gpus][1] == (1, "GPU-d8594bd4-0fc3-8595-e355-7c98138f3b95")
    assert facts.health()["gpu_list"] == facts.gpu_list
    broken = facts_from_dir(host_folder(tmp_path / "broken", FIX / "nvidia-smi-topo-m_8xh100_nv18_2numa_spaces.txt"))
    assert broken.gpu_list is None and "nvidia-smi -L: no 'GPU N" in broken.probe_unreadable["nvidia-smi-L.txt"]


# -- config and plan ----------------------------------------------------------------------------------
def test_mig_profiles_are_a_matrix_axis_with_their_own_case_keys():
    cfg = parse_config(config(["1g.20gb", "3g.40gb", "1g.10gb+me"], num_gpus=(1, 2)))
    keys = [c.case_key for c in expand_cases(cfg) if c.benchmark == "cmd"]
    assert keys == ["cmd.g1.mig-1g.20gb", "cmd.g1.mig-3g.40gb", "cmd.g1.mig-1g.10gb_me",
                    "cmd.g2.mig-1g.20gb", "cmd.g2.mig-3g.40gb", "cmd.g2.mig-1g.10gb_me"]
    whole = [c for c in expand_cases(cfg) if c.benchmark == "whole"]
    assert [c.case_key for c in whole] == ["whole.g1", "whole.g4"] and {c.mig_profile for c in whole} == {None}
    mig = next(c for c in expand_cases(cfg) if c.case_key == "cmd.g2.mig-3g.40gb")
    assert (mig.mig_profile, mig.mig_instances, mig.axes["mig_profile"]) == ("3g.40gb", 2, "3g.40gb")
    plan = build_plan(cfg, {"dag_id": "d", "run_id": "r"})
    needs = plan.host("a100").needs
    assert (needs.gpus, needs.whole_gpus, needs.mig) == (4, 4, {"1g.20gb": 2, "3g.40gb": 2, "1g.10gb+me": 2})


def test_mig_config_errors_name_the_field():
    with pytest.raises(ConfigError) as err:
        parse_config(config(["1g.20gb", "3g40gb"]))
    assert any(line.startswith("benchmarks[0].mig_profiles[1]: not a MIG profile as nvidia-smi -L names it")
               and "'3g40gb'" in line for line in err.value.errors), err.value.errors
    # a YAML block scalar's trailing newline: a profile nvidia-smi never names, and a second case key beside
    # 1g.20gb's that shared its container name
    with pytest.raises(ConfigError) as err:
        parse_config(config(["1g.20gb", "1g.20gb\n"]))
    assert any(line.startswith("benchmarks[0].mig_profiles[1]: not a MIG profile") for line in err.value.errors)
    with pytest.raises(ConfigError) as err:
        parse_config(config(["1g.20gb", "1g.20gb"]))
    assert err.value.errors[0].startswith("benchmarks[0].mig_profiles: must not repeat a value: '1g.20gb'")
    with pytest.raises(ConfigError) as err:
        parse_config(config(["1g.20gb"], num_gpus=(0,), whole=False, device="cpu"))
    assert "benchmarks[0].mig_profiles: MIG instances are GPU devices; a device cpu benchmark cannot ask for them" in \
        err.value.errors


# -- each case's devices ----------------------------------------------------------------------------
def cases_by_key(cfg_data: dict) -> dict:
    return {c.case_key: c for c in expand_cases(parse_config(cfg_data))}


def test_mig_case_gets_its_profiles_mig_uuids_and_whole_gpu_cases_the_gpus_without_mig(tmp_path):
    facts = facts_from_dir(host_folder(tmp_path, MIXED_4A100))
    listing = G.parse_gpu_list(MIXED_4A100.read_text())
    mig_uuids = [d["uuid"] for d in listing[0]["mig"]]
    cases = cases_by_key(config(["1g.20gb", "3g.40gb"], num_gpus=(1, 4, 5)))
    one = assign(cases["cmd.g1.mig-1g.20gb"], facts)
    assert one.device_ids == (mig_uuids[0],) and one.mig_profile == "1g.20gb" and not one.skipped
    assert assign(cases["cmd.g4.mig-1g.20gb"], facts).device_ids == tuple(mig_uuids)
    five = assign(cases["cmd.g5.mig-1g.20gb"], facts)
    assert (five.skip_class, five.skip_detail) == (
        "mig_unavailable", "the case asks for 5 MIG instance(s) of 1g.20gb; the host has 4 (GPU 0: 4x 1g.20gb)")
    other = assign(cases["cmd.g1.mig-3g.40gb"], facts)
    assert other.skip_class == "mig_unavailable" and "has 0 (GPU 0: 4x 1g.20gb)" in other.skip_detail
    # whole GPUs: GPU 0 is in MIG mode, so the case is named GPUs 1.. by UUID (a plain count may pick GPU 0)
    assert assign(cases["whole.g1"], facts).device_ids == (listing[1]["uuid"],)
    four = assign(cases["whole.g4"], facts)
    assert four.skip_class == "mig_enabled" and four.skip_detail.startswith(
        "the case needs 4 whole GPU(s), and MIG is enabled on GPU 0 (GPU 0: 4x 1g.20gb): 3 GPU(s) without MIG")
    assert {"mig_enabled", "mig_unavailable"} <= set(FAILURE_CLASSES)


def test_without_mig_whole_gpu_cases_are_as_before_and_mig_cases_skipped(tmp_path):
    facts = facts_from_dir(host_folder(tmp_path, xml=P100_XML))  # a P100: MIG not supported
    cases = cases_by_key(config(["1g.10gb"]))
    assert assign(cases["whole.g1"], facts).device_ids is None  # gpu_selection decides, as before
    unknown = assign(cases["cmd.g1.mig-1g.10gb"], facts)
    assert unknown.skip_class == "mig_unavailable" and "the host's MIG devices are unknown" in unknown.skip_detail
    seven = facts_from_dir(host_folder(tmp_path / "seven", SEVEN_1G))
    whole = assign(cases["whole.g1"], seven)
    assert whole.skip_class == "mig_enabled" and "0 GPU(s) without MIG" in whole.skip_detail
    assert assign(cases["cmd.g1.mig-1g.10gb"], seven).device_ids == (
        G.parse_gpu_list(SEVEN_1G.read_text())[0]["mig"][0]["uuid"],)


def test_a_gpu_in_mig_mode_without_instances_is_no_whole_gpu(tmp_path):
    xml = P100_XML.read_text().replace("<current_mig>N/A</current_mig>", "<current_mig>Enabled</current_mig>")
    assert "<current_mig>Enabled</current_mig>" in xml
    (tmp_path / "p100.xml").write_text(xml)
    facts = facts_from_dir(host_folder(tmp_path / "host", xml=tmp_path / "p100.xml"))
    assert mig_gpus(facts.gpu_health, facts.gpu_list) == {0: []} and inventory({0: []}) == "GPU 0: no MIG device"
    assert assign(cases_by_key(config(None))["whole.g1"], facts).skip_class == "mig_enabled"


# -- the host rule ----------------------------------------------------------------------------------
def test_host_rule_whole_gpu_cases_on_mig_gpus(tmp_path):
    facts = facts_from_dir(host_folder(tmp_path, MIXED_4A100))
    t = HealthThresholds()
    listing = facts.gpu_list
    unfit = check_mig([], t, HostNeeds(gpus=4, whole_gpus=4), listing)
    assert unfit.status == "fail" and unfit.detail.startswith(
        "GPU 0: MIG enabled (GPU 0: 4x 1g.20gb), but the cases need 4 whole GPU(s) and 3 GPU(s) run without MIG")
    assert unfit.evidence[0] == {"gpu": 0, "bus_id": None, "value": {"mig_mode": "Enabled", "mig_devices": 4},
                                 "threshold": "Disabled"}
    fits = check_mig([], t, HostNeeds(gpus=3, whole_gpus=3), listing)
    assert fits.status == "pass" and "whole-GPU cases run on the 3 GPU(s) without MIG" in fits.detail
    # a MIG case on the host: the host is fit; the whole-GPU cases that cannot run are skipped one by one
    mixed = check_mig([], t, HostNeeds(gpus=4, whole_gpus=4, mig={"1g.20gb": 1}), listing)
    assert mixed.status == "pass" and "more than 3 GPU(s) are skipped (mig_enabled)" in mixed.detail
    assert "MIG cases ask for 1x 1g.20gb" in mixed.detail
    assert check_mig([], HealthThresholds(allow_mig=True), HostNeeds(gpus=4), listing).status == "pass"
    only_mig = check_mig([], t, HostNeeds(gpus=1, whole_gpus=0, mig={"1g.20gb": 1}), listing)
    assert only_mig.status == "pass" and "the cases run on MIG instances" in only_mig.detail
    nothing = check_mig([], t, HostNeeds(gpus=1, whole_gpus=0, mig={"1g.10gb": 1}), [])
    assert nothing.status == "pass" and "(1x 1g.10gb) are skipped (mig_unavailable)" in nothing.detail


def test_verdict_of_a_mig_host_for_mig_cases(tmp_path):
    """A host folder with only -L (no -q output): gpu_mig still judges MIG."""
    facts = facts_from_dir(host_folder(tmp_path, SEVEN_1G))
    checks = {c.name: c for c in evaluate(facts, HostNeeds(gpus=1, whole_gpus=0, mig={"1g.10gb": 1}))}
    assert checks["gpu_count"].status == "pass" and checks["gpu_mig"].status == "pass"
    whole = evaluate(facts, HostNeeds(gpus=1))
    assert {c.name: c.status for c in whole}["gpu_mig"] == "fail" and verdict(whole) == "unfit"


# -- the row -------------------------------------------------------------------------------------------
def test_rows_say_the_mig_profile_or_why_the_case_was_skipped(tmp_path):
    facts = facts_from_dir(host_folder(tmp_path, MIXED_4A100))
    checks = evaluate_health(facts, HostNeeds(gpus=4, whole_gpus=4, mig={"1g.20gb": 1}))
    assert [(c.name, c.status) for c in checks] == [("gpu_mig", "pass")]
    v = HostVerdict(host="a100", verdict="ready", checks=[c.to_dict() for c in checks], facts=facts.to_dict())
    cases = cases_by_key(config(["1g.20gb", "3g.40gb"]))
    run = RunInfo(dag_id="d", run_id="r")
    skipped, _ = case_fields(cases["cmd.g1.mig-3g.40gb"], v, {"ref": "x"}, None)
    assert (skipped["status"], skipped["failure_class"]) == (SKIPPED, "mig_unavailable")
    assert "3g.40gb; the host has 0 (GPU 0: 4x 1g.20gb)" in skipped["failure_detail"]
    row = result_row(run, cases["cmd.g1.mig-3g.40gb"], v, None, skipped)
    assert (row["mig_profile"], row["mig_instances"], row["num_gpus"]) == ("3g.40gb", 1, 1)
    whole, _ = case_fields(cases["whole.g4"], v, {"ref": "x"}, None)
    assert (whole["status"], whole["failure_class"]) == (SKIPPED, "mig_enabled")
    whole_row = result_row(run, cases["whole.g1"], v, None, whole)
    assert (whole_row["mig_profile"], whole_row["mig_instances"]) == (None, None)
    # a case that can run gets to its task (no outcome here: the task did not report)
    ran, _ = case_fields(cases["cmd.g1.mig-1g.20gb"], v, {"ref": "x"}, None)
    assert ran["failure_class"] == "task_failed"


def test_capacity_does_not_judge_a_mig_case_by_the_whole_gpus_memory():
    from fleetbench.capacity import case_capacity

    cases = cases_by_key(config(["1g.20gb"]))
    assert case_capacity(cases["whole.g1"], {"a100": 81920.0}) == (81920.0, "GPU memory")
    assert case_capacity(cases["cmd.g1.mig-1g.20gb"], {"a100": 81920.0}) == (
        None, "the memory of a MIG 1g.20gb instance is not known to the plan")


def test_an_image_none_of_the_hosts_cases_can_run_is_not_pulled():
    """A CUDA 13 image on a GeForce host whose R535 driver cannot run it: its cases are skipped as driver_too_old, so
    the lane does not pull it (an NGC image is ~15 GB, every night); the host's other image is pulled."""
    from fleetbench.airflow.pipeline import collect, needed_images
    from fleetbench.plan import build_plan
    from fleetbench.run_model import HostImages, HostVerdict

    cfg = {"hosts": [{"name": "a100"}],
           "images": [{"name": "old", "ref": "127.0.0.1:5000/x:1", "cuda": "12.1"},
                      {"name": "new", "ref": "127.0.0.1:5000/y:1", "cuda": "13.0"}],
           "benchmarks": [{"name": b, "image": b, "harness": "command", "num_gpus": [1],
                           "command": ["python3", "-c", "print(1)"]} for b in ("old", "new")]}
    plan = build_plan(parse_config(cfg), {"dag_id": "d", "run_id": "r"}).to_xcom()
    validation = HostVerdict(host="a100", verdict="ready", reasons="", facts={
        "driver_version": "535.104.05", "cuda_driver_version": "12.2",
        "gpus": [{"index": 0, "name": "NVIDIA GeForce RTX 3090", "uuid": None, "memory_total_mib": 24576}]}).to_xcom()
    assert needed_images(plan, "a100", validation) == {"old"}
    prepared = HostImages(host="a100", images={"old": {"name": "old", "ref": "127.0.0.1:5000/x:1",
                                                       "pinned_ref": "127.0.0.1:5000/x:1", "digest": None}}).to_xcom()
    rows = {r["benchmark"]: r for r in collect(plan, [validation], [prepared], [])["rows"]}
    assert (rows["new"]["status"], rows["new"]["failure_class"]) == ("skipped", "driver_too_old")
    assert rows["old"]["failure_class"] == "task_failed"  # ran nowhere here: its task returned nothing
