"""A multi-node set's row is stored under its first host and carries the worst GPU health of its hosts: the report
charged that health to the first host (a healthy one shown with "results on degraded GPUs", the degraded one's
regression shown as healthy, no "the drop may be the hardware" note). Now the set's hosts answer for it."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from attempts_contract import host_check
from fleetbench.regression.store import assess_and_store
from fleetbench.report import build_report, parse_filters
from fleetbench.warehouse import get_engine, store_run, upgrade
from warehouse_rows import result_row

KEY = "tf.resnet50.bs64.g1.replicated"
SET_KEY = f"{KEY}.n2.gpu-10+gpu-1"


def night(d: int) -> datetime:
    return datetime(2026, 11, d, 2, 0, tzinfo=timezone.utc)


def row(host: str, case_key: str, d: int, ips: float, **extra) -> dict:
    w = night(d)
    return result_row(case_key, run_id=f"scheduled__{w.isoformat()}", host=host, ips=ips, logical_date=w.isoformat(),
                      started_at=(w + timedelta(minutes=1)).isoformat(),
                      finished_at=(w + timedelta(minutes=2)).isoformat(), metric="images_per_sec", value=ips,
                      unit="images/s", better="higher", **extra)


@pytest.fixture()
def engine(tmp_path):
    """14 nights: gpu-1 and gpu-10 alone, and the set gpu-10+gpu-1 (stored under gpu-10); on nights 13-14 gpu-1's
    check says degraded, the set's rows say so too and its throughput drops (a confirmed regression)."""
    engine = get_engine(f"sqlite:///{tmp_path}/w.db")
    upgrade(engine)
    for d in range(1, 15):
        bad = d >= 13

        def health(h: str) -> str:
            return "degraded" if bad and h == "gpu-1" else "healthy"

        rows = [row(h, KEY, d, base + d % 3, host_gpu_health=health(h)) for h, base in (("gpu-1", 100.0),
                                                                                       ("gpu-10", 110.0))]
        ips = (140.0 if bad else 200.0) + d % 3
        rows.append(row("gpu-10", SET_KEY, d, ips, nodes=2, host_set="gpu-10,gpu-1", node_efficiency=0.95,
                        node_baseline_images_per_sec=ips / 1.9, host_gpu_health="degraded" if bad else "healthy"))
        run_id = f"scheduled__{night(d).isoformat()}"
        checks = [host_check("535.104.05", (night(d) + timedelta(minutes=1)).isoformat(), host=h, run_id=run_id,
                             health=health(h), verdict="degraded" if health(h) == "degraded" else "ready",
                             gpu_health_issues="gpu_ecc:warn" if health(h) == "degraded" else None)
                  for h in ("gpu-1", "gpu-10")]
        at = night(d).isoformat()
        store_run(engine, {"dag_id": "fleet_benchmark", "run_id": run_id, "logical_date": at, "run_type": "scheduled",
                           "fleet": "test", "config_digest": "abc", "started_at": at, "finished_at": at,
                           "cases_total": 3, "cases_ok": 3, "cases_failed": 0, "cases_skipped": 0}, checks, rows)
        assess_and_store(engine, "fleet_benchmark", run_id)
    yield engine
    engine.dispose()


@pytest.mark.parametrize("host", [None, "gpu-1", "gpu-10"])
def test_a_sets_regression_has_the_health_of_its_degraded_host(engine, host):
    report = build_report(engine, parse_filters(host=host))
    [finding] = [r for r in report["regressions"] if r["case_key"] == SET_KEY]
    assert (finding["host"], finding["host_set"], finding["gpu_health"]) == ("gpu-10", "gpu-10,gpu-1", "degraded")
    assert any(n.startswith("Host gpu-1 has open regressions and its GPUs were degraded") for n in report["notes"])
    assert not any(n.startswith("Host gpu-10 has open regressions") for n in report["notes"])
    health = {h["host"]: h for h in report["fleet_health"]}
    assert (health["gpu-1"]["gpu_health"], health["gpu-10"]["gpu_health"]) == ("degraded", "healthy")


def test_results_on_degraded_gpus_count_under_the_host_that_was_degraded(engine):
    """gpu-1: its own 2 nights and the set's 2 (its check was degraded then); gpu-10, healthy throughout: none (the
    set's rows, stored under it, counted 2 there). Filtered to gpu-10, only the set's rows are in scope."""
    degraded = {h["host"]: h["degraded_results"] for h in build_report(engine, parse_filters())["fleet_health"]}
    assert degraded == {"gpu-1": 4, "gpu-10": 0}
    degraded = {h["host"]: h["degraded_results"]
                for h in build_report(engine, parse_filters(host="gpu-10"))["fleet_health"]}
    assert degraded == {"gpu-1": 2, "gpu-10": 0}
