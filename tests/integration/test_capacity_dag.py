"""Capacity profiles end to end with dag.test(): the smoke harness under a container memory limit.

The smoke harness holds a pool of max(1024, batch) images (32x32x3 float32 for `trivial`) plus the batch's
activations, so above batch 1024 its peak memory grows ~36 MiB per 1024 images: batch 8192 needs ~307 MiB.
Night 1 learns from batches 2048..6144 under a 256 MiB limit; night 2 plans 2048, 4096 and 8192: 8192 is
predicted to need more than the limit less its margin and is skipped (predicted_oom, the prediction in
the detail), the others run and use what was predicted, within the stated spread. Night 3 forces 8192:
the kernel OOM-kills it, and the next profile knows the smallest batch that died with 256 MiB.
"""

from __future__ import annotations

import json

import pytest

from fleet_configs import containers_of, run_fleet_dag, smoke_config, write_config

pytestmark = [pytest.mark.integration, pytest.mark.dagrun]

LIMIT = "256m"
MARGIN_PCT = 12.0  # the fleet's fleet.capacity.margin_pct: not the default (10), so the report shows whose it used
BIG = "smoke.trivial.bs8192.g0.parameter_server"


def night(monkeypatch, tmp_path, smoke_image, batches, run_conf=None):
    cfg = smoke_config(smoke_image, models=("trivial",), batch_sizes=batches, num_batches=3, timeout_s=120,
                       container={"mem_limit": LIMIT})
    cfg["fleet"]["capacity"] = {"margin_pct": MARGIN_PCT}
    dag_run = run_fleet_dag(monkeypatch, write_config(tmp_path / "fleet.yaml", cfg), run_conf=run_conf)
    from fleetbench.warehouse import fetch_results, get_engine

    rows = {r["batch_size_per_device"]: r for r in fetch_results(get_engine(), run_id=dag_run.run_id)}
    return dag_run, rows


def test_profile_learns_then_skips_the_batch_that_would_not_fit(airflow_db, data_dir, smoke_image, docker_api,
                                                                 tmp_path, monkeypatch):
    from fleetbench.capacity import Settings, fit_profiles, read_rows
    from fleetbench.warehouse import get_engine

    # Night 1: nothing known yet; every case runs and its container's peak memory is stored.
    run1, rows = night(monkeypatch, tmp_path, smoke_image, (2048, 3072, 4096, 5120, 6144))
    assert run1.state == "success"
    for batch, r in rows.items():
        assert r["status"] == "ok", r
        assert r["peak_mem_source"] in ("cgroup_v1", "cgroup_v2", "engine_stats")
        assert 30 < r["peak_mem_mib"] < 256, r  # under the limit, and more than an idle Python
        assert r["capacity_mib"] == 256.0 and r["predicted_mem_mib"] is None
        assert r["capacity_note"].startswith("no prediction: no result of this benchmark, harness")
    assert rows[6144]["peak_mem_mib"] > rows[2048]["peak_mem_mib"] + 100  # memory grows with the batch
    learned = {b: r["peak_mem_mib"] for b, r in rows.items()}

    # Night 2: 8192 is predicted over 256 MiB less 12 %, and skipped with the prediction; the rest run.
    run2, rows = night(monkeypatch, tmp_path, smoke_image, (2048, 4096, 8192))
    assert run2.state == "success"
    big = rows[8192]
    assert (big["status"], big["failure_class"]) == ("skipped", "predicted_oom")
    assert big["failure_detail"].startswith("predicted OOM: ") and "container limit 256 MiB" in big["failure_detail"]
    assert big["predicted_mem_mib"] > 256 * 0.9 and big["capacity_mib"] == 256.0 and big["peak_mem_mib"] is None
    profile = fit_profiles(read_rows(get_engine(), ["trivial"]), Settings())[
        ("tf_cnn_benchmarks", "trivial", "fp32", "cpu", "", "smoke")]
    print(profile.explain(), learned, {b: (r["predicted_mem_mib"], r["peak_mem_mib"]) for b, r in rows.items()})
    for batch in (2048, 4096):
        r = rows[batch]
        assert r["status"] == "ok" and r["capacity_note"].startswith("fits: "), r
        spread = float(r["capacity_note"].split("+- ")[1].split(" MiB")[0])
        assert abs(r["peak_mem_mib"] - r["predicted_mem_mib"]) <= spread, (r["peak_mem_mib"], r["capacity_note"])
    assert containers_of(docker_api, run2.run_id) == []
    # The night's report fitted its capacity section with the fleet's settings, as the plan did.
    report = json.loads((data_dir / "reports" / "report.json").read_text())
    assert [p["margin_pct"] for p in report["capacity"] if p["model"] == "trivial"] == [MARGIN_PCT]

    # Night 3: a manual run forces 8192: it runs, the kernel OOM-kills it, and the profile records the bound.
    run3, rows = night(monkeypatch, tmp_path, smoke_image, (8192,), run_conf={"force_cases": [BIG]})
    assert run3.state == "success"
    big = rows[8192]
    assert (big["status"], big["failure_class"]) == ("failed", "oom_killed"), big
    assert big["capacity_note"].startswith("predicted OOM") and "forced by force_cases" in big["capacity_note"]
    assert json.loads(big["command"])[3] == "--batch_size=8192"
    profile = fit_profiles(read_rows(get_engine(), ["trivial"]), Settings())[
        ("tf_cnn_benchmarks", "trivial", "fp32", "cpu", "", "smoke")]
    assert profile.ooms == {256.0: 8192} and profile.misses == []  # predicted, so not a miss
    assert profile.largest_fitting(256.0, 10.0) < 8192
