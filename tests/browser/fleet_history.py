"""A small fleet history in the warehouse, written with the warehouse's own `store_run`, for the report tests.

Five nights (2026-11-01 .. 05, 02:00 UTC) of `fleet_benchmark`:
- gpu-a (A100, 1/2/4-GPU resnet50 and 1-GPU vgg16): driver 535.104.05, upgraded to 550.54.15 on
  night 4, where 1-GPU resnet50 drops ~12 % and stays down: an open regression on night 5. The
  2-GPU case regressed on night 4 and recovered on night 5: closed, not shown.
- gpu-b (H100, 1-GPU resnet50): steady; its night-5 vgg16 case timed out.
- gpu-c: every case fails every night (gpu_oom, nonzero_exit): a host with only failures.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from warehouse_rows import result_row

DAG = "fleet_benchmark"
NIGHTS = [datetime(2026, 11, d, 2, 0, tzinfo=timezone.utc) for d in range(1, 6)]
OLD_DRIVER, NEW_DRIVER = "535.104.05", "550.54.15"
PRICE = {"gpu-a": 1.99, "gpu-b": 3.50}
GPU = {"gpu-a": ("NVIDIA A100-SXM4-40GB", "A100 SXM4 40GB"), "gpu-b": ("NVIDIA H100 80GB HBM3", "H100 SXM5 80GB"),
       "gpu-c": ("NVIDIA A10", "A10")}


def run_id(night: int) -> str:
    return f"scheduled__{NIGHTS[night].isoformat()}"


def _ok(host: str, model: str, gpus: int, bs: int, ips: float, night: int, driver: str, one_gpu: float | None) -> dict:
    when = NIGHTS[night]
    eff = ips / (gpus * one_gpu) if one_gpu else None
    price = PRICE[host]
    mean_w = 300.0 * gpus
    return result_row(
        f"tf.{model}.bs{bs}.g{gpus}.replicated", run_id=run_id(night), host=host, ips=ips,
        logical_date=when.isoformat(), started_at=(when + timedelta(minutes=1)).isoformat(),
        finished_at=(when + timedelta(minutes=2)).isoformat(), model=model, num_gpus=gpus,
        batch_size_per_device=bs, batch_size_global=bs * gpus, driver_version=driver, gpu_model=GPU[host][0],
        gpu_catalog_name=GPU[host][1], precision="fp32", speedup_efficiency=eff,
        speedup_baseline_case_key=f"tf.{model}.bs{bs}.g1.replicated" if one_gpu else None,
        price_per_gpu_hour=price, price_source="host", cost_per_million_images_usd=price * gpus / (3600 * ips) * 1e6,
        energy_source="estimated", mean_power_w=mean_w, energy_j=mean_w * 60, images_per_joule=ips / mean_w)


def nightly_rows(night: int) -> list[dict]:
    driver = NEW_DRIVER if night >= 3 else OLD_DRIVER
    slow = 0.88 if night >= 3 else 1.0  # the new driver costs gpu-a's 1-GPU resnet50 12 %
    a1 = 400.0 * slow + night
    a2 = 760.0 * (0.85 if night == 3 else 1.0) + night
    rows = [
        _ok("gpu-a", "resnet50", 1, 64, a1, night, driver, a1),
        _ok("gpu-a", "resnet50", 2, 64, a2, night, driver, a1),
        _ok("gpu-a", "resnet50", 4, 64, 1400.0 + night, night, driver, a1),
        _ok("gpu-a", "vgg16", 1, 32, 250.0 + night, night, driver, 250.0 + night),
        _ok("gpu-b", "resnet50", 1, 64, 900.0 + 2 * night, night, OLD_DRIVER, 900.0 + 2 * night),
    ]
    when = NIGHTS[night]
    common = {"run_id": run_id(night), "logical_date": when.isoformat(),
              "started_at": (when + timedelta(minutes=1)).isoformat(),
              "finished_at": (when + timedelta(minutes=2)).isoformat()}
    if night == 4:
        rows.append(result_row("tf.vgg16.bs32.g1.replicated", host="gpu-b", ips=None, status="failed", model="vgg16",
                               batch_size_per_device=32, failure_class="timeout", driver_version=OLD_DRIVER,
                               gpu_model=GPU["gpu-b"][0], **common))
    rows += [
        result_row("tf.resnet50.bs256.g1.replicated", host="gpu-c", ips=None, status="failed",
                   batch_size_per_device=256, failure_class="gpu_oom", driver_version=OLD_DRIVER,
                   gpu_model=GPU["gpu-c"][0], **common),
        result_row("tf.vgg16.bs32.g1.replicated", host="gpu-c", ips=None, status="failed", model="vgg16",
                   batch_size_per_device=32, failure_class="nonzero_exit", exit_code=1, driver_version=OLD_DRIVER,
                   gpu_model=GPU["gpu-c"][0], **common),
    ]
    return rows


def run_row(night: int, rows: list[dict]) -> dict:
    when = NIGHTS[night]
    return {"dag_id": DAG, "run_id": run_id(night), "logical_date": when.isoformat(), "run_type": "scheduled",
            "fleet": "test", "config_digest": "abc", "started_at": when.isoformat(),
            "finished_at": (when + timedelta(minutes=30)).isoformat(), "cases_total": len(rows),
            "cases_ok": sum(r["status"] == "ok" for r in rows),
            "cases_failed": sum(r["status"] == "failed" for r in rows),
            "cases_skipped": sum(r["status"] == "skipped" for r in rows)}


def finding(night: int, host: str, case_key: str, baseline: float, value: float, severity: str = "major") -> dict:
    return {"dag_id": DAG, "run_id": run_id(night), "host": host, "case_key": case_key, "metric": "images_per_sec",
            "direction": "higher", "baseline_value": baseline, "value": value,
            "delta_pct": (value - baseline) / baseline * 100, "z_score": -12.5, "p_value": 0.001, "baseline_n": 3,
            "baseline_window": [run_id(n) for n in range(max(0, night - 3), night)],
            "changes": {"driver_version": {"before": OLD_DRIVER, "after": NEW_DRIVER}}, "severity": severity,
            "detected_at": (NIGHTS[night] + timedelta(hours=1)).isoformat()}


def store_history(engine, nights: int = 5) -> None:
    """Migrate the warehouse and store `nights` nights (and the regressions found in them)."""
    from fleetbench.regression import store_findings
    from fleetbench.warehouse import store_run, upgrade

    upgrade(engine)
    for night in range(nights):
        rows = nightly_rows(night)
        store_run(engine, run_row(night, rows), [], rows)
        if night == 3:
            store_findings(engine, DAG, run_id(3), [
                finding(3, "gpu-a", "tf.resnet50.bs64.g1.replicated", 401.0, 400.0 * 0.88 + 3),
                finding(3, "gpu-a", "tf.resnet50.bs64.g2.replicated", 761.0, 760.0 * 0.85 + 3)])
        if night == 4:
            store_findings(engine, DAG, run_id(4), [
                finding(4, "gpu-a", "tf.resnet50.bs64.g1.replicated", 401.5, 400.0 * 0.88 + 4)])
