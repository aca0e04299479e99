"""Result rows for warehouse tests."""

from __future__ import annotations

# What fleetbench.metrics.derive adds to a row (revision 0003 columns), with plausible numbers.
DERIVED = {
    "precision": "fp32", "gpu_catalog_name": "A100 SXM4 40GB", "time_for_batches_s": 64.0, "accuracy_top1": None,
    "time_to_accuracy_s": None, "step_median_images_per_sec": 100.5, "step_spread_images_per_sec": 1.0,
    "step_cv": 0.005, "speedup_efficiency": 1.0, "speedup_baseline_case_key": None, "price_per_gpu_hour": 1.99,
    "price_source": "catalog", "cost_usd": 0.0331667, "cost_per_million_images_usd": 5.527778, "energy_kwh": 0.0066667,
    "images_per_joule": 0.25, "carbon_g_per_kwh": 400.0, "carbon_g": 2.6666667,
}


def run_row(run_id: str = "r1", dag_id: str = "fleet_benchmark") -> dict:
    return {"dag_id": dag_id, "run_id": run_id, "logical_date": "2026-12-01T02:00:00+00:00", "run_type": "scheduled",
            "fleet": "test", "config_digest": "abc", "started_at": "2026-12-01T02:00:01+00:00",
            "finished_at": "2026-12-01T02:10:00+00:00", "cases_total": 2, "cases_ok": 2, "cases_failed": 0,
            "cases_skipped": 0}


def result_row(case_key: str, run_id: str = "r1", host: str = "h1", ips: float | None = 100.0, status: str = "ok",
               **extra) -> dict:
    row = {"dag_id": "fleet_benchmark", "run_id": run_id, "logical_date": "2026-12-01T02:00:00+00:00", "host": host,
           "case_key": case_key, "benchmark": "cnn", "model": "resnet50", "batch_size_per_device": 64,
           "batch_size_global": 64, "num_gpus": 1, "variable_update": "replicated", "device": "gpu", "num_batches": 100,
           "image_name": "tf1", "image_ref": "127.0.0.1:5000/tf:1", "image_digest": "sha256:" + "a" * 64,
           "status": status, "failure_class": None if status == "ok" else "gpu_oom", "failure_detail": None,
           "images_per_sec": ips, "step_count": 2, "exit_code": 0, "started_at": "2026-12-01T02:00:05+00:00",
           "finished_at": "2026-12-01T02:01:05+00:00", "duration_s": 60.0, "driver_version": "535.104.05",
           "cuda_driver_version": "12.2", "gpu_model": "NVIDIA A100-SXM4-40GB", "command": ["python", "x.py"],
           "log_path": "/tmp/x.log", "energy_source": "none", "energy_j": None}
    row.update(extra)
    return row


def step_rows(case_key: str, n: int, run_id: str = "r1", host: str = "h1", base: float = 100.0) -> list[dict]:
    return [{"dag_id": "fleet_benchmark", "run_id": run_id, "host": host, "case_key": case_key, "step": i,
             "images_per_sec": base + i, "plusminus": 0.1, "jitter": 0.2, "loss": 7.0} for i in range(1, n + 1)]
