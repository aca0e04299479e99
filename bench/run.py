"""`make bench`: measure fleetbench itself, side by side with the plain alternative, in one run.

Parts (each bounded; `--quick` is the CI smoke version):
  orchestration  the same cases through `airflow dags test fleet_benchmark` (and a real scheduler with
                 the LocalExecutor) vs a plain sequential `docker run` loop: wall-time ratio, overhead
                 seconds per case, and the throughput each case reports both ways
  parse          DAG parse time (a DagBag of dags/, as the dag-processor does) for fleets of 10, 100
                 and 1,000 hosts x 20 cases; task count; peak memory
  warehouse      storing one night of results, a stretch of nights, on SQLite and PostgreSQL; the
                 latency of the report's queries over that history
  telemetry      CPU cost of the GPU sampler at 0.5 s and 0.1 s periods, through the NVML seam

The machine is shared and noisy: every figure is the median of several repetitions, and ratios are
reported next to absolute times. Prints one table and writes bench/results/<part>.json and
bench/results/latest.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the test suite's local Airflow deployment helper
RESULTS = ROOT / "bench" / "results"
VENV_BIN = Path(sys.executable).parent
SMOKE_IMAGE = "127.0.0.1:5000/fleetbench/cpu-smoke:latest"
HARNESS = ["python3", "/opt/fleetbench/tf_cnn_benchmarks.py"]
PG_URL = os.environ.get("FLEETBENCH_BENCH_PG", "postgresql+psycopg2://fleetbench:fleetbench@127.0.0.1:5432/fleetbench")


def median(values):
    return statistics.median(values) if values else None


def fleet_config(hosts: list[str], models, batch_sizes, num_batches: int, telemetry: float = 0.5) -> dict:
    return {
        "fleet": {"name": "bench", "timezone": "UTC", "schedule": None},
        "hosts": [{"name": h, "connection": "local"} for h in hosts],
        "images": [{"name": "cpu-smoke", "ref": SMOKE_IMAGE, "pull_policy": "if-missing", "command": HARNESS}],
        "benchmarks": [{"name": "bench", "image": "cpu-smoke", "device": "cpu", "models": list(models),
                        "batch_sizes": list(batch_sizes), "num_gpus": [0], "num_batches": num_batches,
                        "num_warmup_batches": 1, "timeout_s": 600, "telemetry_period_s": telemetry}],
    }


# -- 1. orchestration overhead ------------------------------------------------------------------
def plain_loop(cases: list[list[str]]) -> tuple[float, list[float]]:
    """The runbook: `docker run --rm` each case in turn. Returns wall time and each case's images/sec."""
    from fleetbench.parsing import parse_log

    start = time.monotonic()
    ips = []
    for argv in cases:
        out = subprocess.run(["docker", "run", "--rm", "--network", "none", SMOKE_IMAGE, *argv],
                             capture_output=True, text=True, check=True).stdout
        ips.append(parse_log(out, "tf_cnn_benchmarks").total_images_per_sec)
    return time.monotonic() - start, ips


def dags_test(workdir: Path, config: dict) -> tuple[float, list[float]]:
    """One `airflow dags test fleet_benchmark` (Airflow home migrated beforehand, not timed)."""
    from fleetbench.warehouse import fetch_results, get_engine

    cfg_path = workdir / "fleet.yaml"
    cfg_path.write_text(yaml.safe_dump(config))
    warehouse = f"sqlite:///{workdir}/warehouse-{time.monotonic_ns()}.db"
    env = {**os.environ, **airflow_env(workdir), "FLEETBENCH_CONFIG": str(cfg_path), "FLEETBENCH_WAREHOUSE_URL": warehouse}
    start = time.monotonic()
    proc = subprocess.run([str(VENV_BIN / "airflow"), "dags", "test", "fleet_benchmark"], env=env,
                          capture_output=True, text=True)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise RuntimeError(f"dags test failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    rows = fetch_results(get_engine(warehouse))
    assert all(r["status"] == "ok" for r in rows), [r["failure_detail"] for r in rows]
    return wall, [r["images_per_sec"] for r in sorted(rows, key=lambda r: r["case_key"])]


def airflow_env(workdir: Path) -> dict:
    return {"AIRFLOW_HOME": str(workdir / "airflow"), "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{workdir}/airflow/airflow.db",
            "FLEETBENCH_DATA_DIR": str(workdir / "data")}


def dags_test_startup(workdir: Path) -> float:
    """What `airflow dags test` costs with nothing to run: interpreter, Airflow import, DAG parse, DB setup."""
    env = {**os.environ, **airflow_env(workdir)}
    start = time.monotonic()
    subprocess.run([str(VENV_BIN / "airflow"), "dags", "list", "-o", "plain"], env=env, capture_output=True, check=True)
    return time.monotonic() - start


def scheduler_run(workdir: Path, config: dict) -> float:
    """Trigger-to-finish wall time of one run on a real scheduler + LocalExecutor (startup not timed)."""
    from airflow_cluster import LocalAirflow

    cfg_path = workdir / "fleet-sched.yaml"
    cfg_path.write_text(yaml.safe_dump(config))
    from fleetbench.airflow.pipeline import pools
    from fleetbench.config import parse_config

    (workdir / "pools.json").write_text(json.dumps(pools(parse_config(config))))
    env = {"FLEETBENCH_CONFIG": str(cfg_path), "FLEETBENCH_WAREHOUSE_URL": f"sqlite:///{workdir}/sched.db",
           "FLEETBENCH_DATA_DIR": str(workdir / "data"), "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING"}
    with LocalAirflow(workdir / "sched-airflow", PG_URL, env=env) as airflow:
        airflow.cli("pools", "import", str(workdir / "pools.json"))
        airflow.wait_for_dag("fleet_benchmark")
        start = time.monotonic()
        airflow.trigger("fleet_benchmark", run_id="bench")
        [run] = airflow.wait_for_runs("fleet_benchmark", 1, timeout=900)
        wall = time.monotonic() - start
        if run["state"] != "success":
            raise RuntimeError(f"scheduler run failed:\n{airflow.logs()}")
    return wall


def bench_orchestration(quick: bool) -> dict:
    from fleetbench.config import parse_config
    from fleetbench.plan import expand_cases

    workdir = Path(tempfile.mkdtemp(prefix="fleetbench-bench-"))
    try:
        subprocess.run([str(VENV_BIN / "airflow"), "db", "migrate"], env={**os.environ, **airflow_env(workdir)},
                       capture_output=True, check=True)
        subprocess.run(["docker", "pull", "-q", SMOKE_IMAGE], capture_output=True, check=True)
        reps = 1 if quick else 3
        n = 4 if quick else 10
        long_batches = 60 if quick else 450  # lenet bs 32: ~4 s (quick) / ~30 s per case on this machine
        scenarios = {
            "short": fleet_config(["localhost"], ["trivial"], [8 * (i + 1) for i in range(n)], 5),
            "long": fleet_config(["localhost"], ["lenet"], [32 + i for i in range(2 if quick else 3)], long_batches),
        }
        out = {"startup_s": median([dags_test_startup(workdir) for _ in range(reps)])}
        for name, config in scenarios.items():
            argvs = [c.command[len(HARNESS):] for c in expand_cases(parse_config(config))]
            argvs = [[*HARNESS, *a] for a in argvs]
            plain, fb, plain_ips, fb_ips = [], [], [], []
            for _ in range(reps):
                wall, ips = plain_loop(argvs)
                plain.append(wall)
                plain_ips.append(ips)
                wall, ips = dags_test(workdir, config)
                fb.append(wall)
                fb_ips.append(ips)
            p, f = median(plain), median(fb)
            ratios = [statistics.median(a) / statistics.median(b) for a, b in zip(zip(*fb_ips), zip(*plain_ips))]
            out[name] = {
                "cases": len(argvs), "plain_loop_s": round(p, 2), "dags_test_s": round(f, 2),
                "wall_ratio": round(f / p, 3),
                "overhead_per_case_s": round((f - p) / len(argvs), 3),
                "overhead_per_case_excl_startup_s": round((f - out["startup_s"] - p) / len(argvs), 3),
                "throughput_ratio_median": round(statistics.median(ratios), 3),
                "throughput_ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
            }
        if not quick:
            config = scenarios["short"]
            out["short"]["scheduler_s"] = round(scheduler_run(workdir, config), 2)
            out["short"]["scheduler_overhead_per_case_s"] = round(
                (out["short"]["scheduler_s"] - out["short"]["plain_loop_s"]) / out["short"]["cases"], 3)
        return out
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


# -- 2. DAG parse time -------------------------------------------------------------------------
PARSE_SNIPPET = r"""
import json, resource, sys, time
from airflow.dag_processing.dagbag import DagBag
t = time.perf_counter()
bag = DagBag(dag_folder=sys.argv[1])
parse = time.perf_counter() - t
dag = bag.dags.get("fleet_benchmark")
print(json.dumps({"parse_s": parse, "errors": len(bag.import_errors), "tasks": len(dag.tasks) if dag else None,
                  "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def bench_parse(quick: bool) -> dict:
    out = {}
    workdir = Path(tempfile.mkdtemp(prefix="fleetbench-parse-"))
    try:
        for hosts in (10, 100, 1000):
            config = fleet_config([f"gpu-{i:04d}" for i in range(hosts)], ["resnet50", "vgg16", "inception3", "resnet152"],
                                  [32, 64, 128, 256, 512], 100)
            config["benchmarks"][0]["device"] = "gpu"
            config["benchmarks"][0]["num_gpus"] = [1]
            path = workdir / f"fleet-{hosts}.yaml"
            path.write_text(yaml.safe_dump(config))
            env = {**os.environ, **airflow_env(workdir), "FLEETBENCH_CONFIG": str(path)}
            runs = []
            for _ in range(2 if quick else 5):
                proc = subprocess.run([sys.executable, "-c", PARSE_SNIPPET, str(ROOT / "dags")], env=env,
                                      capture_output=True, text=True, check=True)
                runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            out[f"{hosts}_hosts"] = {"cases": hosts * 20, "parse_s": round(median([r["parse_s"] for r in runs]), 3),
                                     "tasks": runs[0]["tasks"], "import_errors": runs[0]["errors"],
                                     "maxrss_mib": round(median([r["maxrss_mib"] for r in runs]), 1)}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return out


# -- 3. warehouse ------------------------------------------------------------------------------
def night_rows(night: int, n: int, hosts: int) -> tuple[dict, list[dict]]:
    date = datetime(2026, 1, 1, 2, tzinfo=timezone.utc) + timedelta(days=night)
    run_id = f"scheduled__{date.isoformat()}"
    run = {"dag_id": "fleet_benchmark", "run_id": run_id, "logical_date": date, "run_type": "scheduled", "fleet": "bench",
           "config_digest": "x", "started_at": date, "finished_at": date + timedelta(hours=1),
           "cases_total": n, "cases_ok": n, "cases_failed": 0, "cases_skipped": 0}
    rows = []
    per_host = n // hosts
    for i in range(n):
        host, case = divmod(i, per_host)
        rows.append({"dag_id": "fleet_benchmark", "run_id": run_id, "logical_date": date, "host": f"gpu-{host:04d}",
                     "case_key": f"cnn.resnet50.bs{32 + case}.g1.replicated", "benchmark": "cnn", "model": "resnet50",
                     "batch_size_per_device": 32 + case, "batch_size_global": 32 + case, "num_gpus": 1,
                     "variable_update": "replicated", "device": "gpu", "num_batches": 100, "image_name": "tf1",
                     "image_ref": "nvcr.io/nvidia/tensorflow:23.03-tf1-py3", "image_digest": "sha256:" + "a" * 64,
                     "status": "ok", "images_per_sec": 300.0 + (i % 17), "step_count": 11, "exit_code": 0,
                     "started_at": date, "finished_at": date + timedelta(minutes=2), "duration_s": 120.0,
                     "driver_version": "535.104.05" if night < 180 else "550.54.15", "cuda_driver_version": "12.2",
                     "gpu_model": "NVIDIA A100-SXM4-40GB", "command": '["python"]', "energy_source": "none"})
    return run, rows


def bench_warehouse(quick: bool) -> dict:
    from fleetbench.warehouse import get_engine, store_run, upgrade
    from pg_databases import fresh_database

    per_night = 2000 if quick else 20000
    nights = 10 if quick else 365
    hosts = 100 if quick else 1000
    out = {"rows_per_night": per_night, "nights": nights}
    workdir = Path(tempfile.mkdtemp(prefix="fleetbench-wh-"))
    try:
        with fresh_database(PG_URL, prefix="fb_bench") as pg:
            for label, url in (("sqlite", f"sqlite:///{workdir}/w.db"), ("postgresql", pg)):
                engine = get_engine(url)
                upgrade(engine)
                times = []
                for night in range(nights):
                    run, rows = night_rows(night, per_night, hosts)
                    start = time.monotonic()
                    store_run(engine, run, [], rows)
                    times.append(time.monotonic() - start)
                run, rows = night_rows(nights - 1, per_night, hosts)
                start = time.monotonic()
                store_run(engine, run, [], rows)  # a rerun of the last night: upsert over existing keys
                rerun = time.monotonic() - start
                out[label] = {"night_store_s_median": round(median(times), 3), "night_store_s_max": round(max(times), 3),
                              "history_store_s": round(sum(times), 1), "rerun_night_s": round(rerun, 3),
                              "queries_s": time_report_queries(engine)}
                engine.dispose()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return out


def time_report_queries(engine) -> dict:
    """Median latency of what people run over the whole history: the latest run's table, and every
    query of the HTML report / UI view (`build_report`) over all nights stored."""
    from fleetbench.report.queries import build_report, parse_filters
    from fleetbench.warehouse import fetch_results, latest_run_id

    queries = {
        "latest_run_results": lambda: fetch_results(engine, run_id=latest_run_id(engine)),
        "report_all_history": lambda: build_report(engine, parse_filters(since="2026-01-01", until="2027-12-31")),
    }
    out = {}
    for name, fn in queries.items():
        samples = []
        for _ in range(3):
            start = time.monotonic()
            fn()
            samples.append(time.monotonic() - start)
        out[name] = round(median(samples), 3)
    return out


# -- 4. telemetry ------------------------------------------------------------------------------
class _FakeGpus:
    """Eight GPUs behind the NVML seam; each call does the little work a real binding does (no driver here)."""

    def devices(self):
        return [{"index": i, "name": "NVIDIA H200", "uuid": f"GPU-{i}"} for i in range(8)]

    def sample(self, index):
        return {"power_w": 400.0 + index, "util_pct": 99.0, "mem_used_mib": 80000.0, "sm_clock_mhz": 1980, "temp_c": 60}

    def energy_mj(self, index):
        return time.monotonic() * 1000.0

    def close(self):
        pass


def bench_telemetry(quick: bool) -> dict:
    from fleetbench.telemetry.wrapper import Sampler

    seconds = 3 if quick else 20
    out = {"gpus": 8, "window_s": seconds}
    for period in (0.5, 0.1):
        sampler = Sampler(_FakeGpus(), period_s=period).start()
        time.sleep(seconds)
        report = sampler.stop()
        out[f"period_{period}s"] = {"cpu_s": report["sampler_cpu_s"],
                                   "cpu_pct_of_one_core": round(100 * report["sampler_cpu_s"] / seconds, 3),
                                   "samples_per_gpu": report["gpus"][0]["samples"]}
    return out


PARTS = {"orchestration": bench_orchestration, "parse": bench_parse, "warehouse": bench_warehouse,
         "telemetry": bench_telemetry}


def flatten(prefix: str, value, rows: list) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            flatten(f"{prefix}.{k}" if prefix else k, v, rows)
    else:
        rows.append((prefix, value))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small and fast: the CI smoke check")
    parser.add_argument("--only", choices=sorted(PARTS), action="append", help="run only these parts")
    args = parser.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    results = {"when": datetime.now(timezone.utc).isoformat(), "quick": args.quick, "machine":
               {"cpus": os.cpu_count(), "python": platform.python_version(), "kernel": platform.release()}}
    for name in args.only or PARTS:
        start = time.monotonic()
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        results[name] = PARTS[name](args.quick)
        results[name]["bench_wall_s"] = round(time.monotonic() - start, 1)
        (RESULTS / f"{name}.json").write_text(json.dumps(results[name], indent=2))
    (RESULTS / "latest.json").write_text(json.dumps(results, indent=2))
    rows: list = []
    for name in args.only or PARTS:
        flatten(name, results[name], rows)
    width = max(len(k) for k, _ in rows)
    print(f"{'measure'.ljust(width)}  value")
    print(f"{'-' * width}  -----")
    for key, value in rows:
        print(f"{key.ljust(width)}  {value}")
    print(f"\nwritten: {RESULTS / 'latest.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
