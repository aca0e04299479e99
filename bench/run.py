"""`make bench`: measure fleetbench itself, side by side with the plain alternative, in one run.

Parts (each bounded; `--quick` is the CI smoke version):
  orchestration  the same cases through `airflow dags test fleet_benchmark` (and a real scheduler with
                 the LocalExecutor), through a stock mapped DockerOperator DAG, and as a plain
                 sequential `docker run` loop: wall-time ratios, overhead per case (fixed per run and
                 marginal per case), and the throughput each case reports (bench/bench_orchestration.py)
  parse          DAG parse time (a DagBag of dags/, as the dag-processor does: wall and CPU time) and
                 serialization for fleets of 10, 100 and 1,000 hosts x 20 cases (at 1,000: central lanes,
                 own queues, with a multi-node benchmark); task count; peak memory
  targets        the run-model bars side by side in one run, as ratios: all-in per case under `dags test` at
                 20 cases (fleetbench / stock DockerOperator), LocalExecutor s/case / 1.2 s, 1,000-host
                 parse / 1 s in each topology
  warehouse      storing a night of results and a year of nights on SQLite and PostgreSQL; the
                 latency of the report's queries over that history (bench/bench_warehouse.py)
  attempts       a 20,000-result night stored, stored again by a retry (replaced), and measured again on a
                 new driver (a second attempt each, the first kept as superseded), on SQLite and
                 PostgreSQL; the report and its re-measured section over those nights (bench/bench_warehouse.py)
  telemetry      CPU cost of the GPU sampler at 0.5 s and 0.1 s periods, through the NVML seam
  logs           a 200 MB case log measured as a case's task does: time and peak RSS (bench/bench_logs.py)
  regression_night  a 20,000-result night on 60 nights of history through the DAG's store and compare
                 steps (store_run, assess_run, store_findings), on SQLite and PostgreSQL (bench/bench_regression.py)

The machine is shared and noisy: every figure is the median of several repetitions, and ratios are
reported next to absolute times. Prints one table and writes bench/results/<part>.json and
bench/results/latest.json.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import yaml

from common import ROOT, median  # noqa: E402  (bench/ is the script directory)

sys.path.insert(0, str(ROOT / "tests"))  # the test suite's helpers (PostgreSQL databases, local Airflow)
RESULTS = ROOT / "bench" / "results"
from bench_orchestration import airflow_env, bench_orchestration, fleet_config  # noqa: E402

TARGET_PARSE_S = 1.0  # at 1,000 hosts


# -- 2. DAG parse time -------------------------------------------------------------------------
# A DagBag of dags/ in a fresh process with Airflow imported, its objects frozen out of the garbage
# collector's reach (the dag-processor forks its file parser from a process that has Airflow loaded
# and has called gc.freeze(): airflow/dag_processing/manager.py, before_run): fleetbench's imports
# and the config load are part of the time. Without the freeze, each full collection during the parse
# walks Airflow's ~190,000 objects too (~0.2 s at 1,000 hosts), which no dag-processor parse does.
# The serialization the dag-processor does next is timed separately.
PARSE_SNIPPET = r"""
import gc, json, resource, sys, time
def peak_rss_mib():  # this process's own peak (VmHWM); ru_maxrss keeps the parent's peak at the fork
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
from airflow.dag_processing.dagbag import DagBag
from airflow.serialization.serialized_objects import DagSerialization
if sys.argv[2] == "freeze":
    gc.freeze()
t, cpu = time.perf_counter(), time.process_time()
bag = DagBag(dag_folder=sys.argv[1])
parse, parse_cpu = time.perf_counter() - t, time.process_time() - cpu
dag = bag.dags.get("fleet_benchmark")
t = time.perf_counter()
DagSerialization.to_dict(dag)
serialize = time.perf_counter() - t
print(json.dumps({"parse_s": parse, "parse_cpu_s": parse_cpu, "serialize_s": serialize,
                  "errors": len(bag.import_errors), "tasks": len(dag.tasks) if dag else None,
                  "maxrss_mib": peak_rss_mib()}))
"""


PARSE_VARIANTS = ((10, False, False), (100, False, False), (1000, False, False), (1000, True, False),
                  (1000, False, True))


def parse_variants(variants, repeats: int, unfrozen: bool = False) -> dict:
    """Median parse of each (hosts, own queues, multi-node) fleet; see bench_parse. `unfrozen`: at 1,000 hosts
    also the parse without gc.freeze(), as measured before 2026-12-03."""
    out = {}
    workdir = Path(tempfile.mkdtemp(prefix="fleetbench-parse-"))
    try:
        for hosts, own_queue, multinode in variants:
            config = fleet_config([f"gpu-{i:04d}" for i in range(hosts)],
                                  ["resnet50", "vgg16", "inception3", "resnet152"], [32, 64, 128, 256, 512], 100)
            config["benchmarks"][0]["device"] = "gpu"
            config["benchmarks"][0]["num_gpus"] = [1]
            if own_queue:
                for host in config["hosts"]:
                    host["queue"] = host["name"]
            if multinode:  # every pair of hosts also runs resnet50 bs 64 as one 2-node ps/worker case
                config["benchmarks"].append({**config["benchmarks"][0], "name": "dist", "models": ["resnet50"],
                                             "batch_sizes": [64], "nodes": [2]})
            name = f"{hosts}_hosts" + ("_own_queues" if own_queue else "") + ("_multinode" if multinode else "")
            path = workdir / f"fleet-{name}.yaml"
            path.write_text(yaml.safe_dump(config))
            env = {**os.environ, **airflow_env(workdir / "airflow", ROOT / "dags"), "FLEETBENCH_CONFIG": str(path)}

            def parse_runs(gc_mode: str) -> list[dict]:
                runs = []
                for _ in range(repeats):
                    proc = subprocess.run([sys.executable, "-c", PARSE_SNIPPET, str(ROOT / "dags"), gc_mode], env=env,
                                          capture_output=True, text=True, check=True)
                    runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
                return runs

            runs = parse_runs("freeze")
            out[name] = {"cases": hosts * 20 + (hosts // 2 if multinode else 0),
                         "parse_s": round(median([r["parse_s"] for r in runs]), 3),
                         "parse_cpu_s": round(median([r["parse_cpu_s"] for r in runs]), 3),  # steadier when busy
                         "serialize_s": round(median([r["serialize_s"] for r in runs]), 3),
                         "tasks": runs[0]["tasks"], "import_errors": runs[0]["errors"],
                         "maxrss_mib": round(median([r["maxrss_mib"] for r in runs]), 1)}
            if hosts == 1000 and unfrozen:  # as measured before 2026-12-03 (no gc.freeze), to compare with
                out[name]["parse_unfrozen_s"] = round(median([r["parse_s"] for r in parse_runs("no-freeze")]), 3)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return out


def bench_parse(quick: bool) -> dict:
    # the two topologies: lanes on central workers, and every host on a Celery queue of its own
    # and a fleet with a multi-node benchmark (README "Multi-node cases": 2 more tasks, an edge from each lane)
    out = parse_variants(PARSE_VARIANTS, 2 if quick else 5, unfrozen=not quick)
    out["target_parse_s_at_1000_hosts"] = TARGET_PARSE_S
    out["target_met"] = max(out[name]["parse_s"] for name in ("1000_hosts", "1000_hosts_own_queues",
                                                              "1000_hosts_multinode")) < TARGET_PARSE_S
    return out


# -- 3. the typed run model's targets, side by side ------------------------------------------------
def bench_targets(quick: bool) -> dict:
    """The three bars of the run-model reshaping, measured in one run and each given as a ratio to its bar
    (<= 1 meets it): the all-in cost per case under `airflow dags test` at 20 cases against the stock mapped
    DockerOperator DAG's in the same repetitions (interleaved, median of 3), the trigger-to-finish cost per case
    on a real scheduler with the LocalExecutor (bar 1.2 s; median of three runs), and the parse of a 1,000-host
    fleet with central lanes, with a queue per host and with a multi-node benchmark (bar 1 s, median of 5).
    `--quick`: 4 cases and 100 hosts, once each, and no scheduler run."""
    from bench_orchestration import (
        SMOKE_IMAGE,
        STOCK_DAGS,
        TARGET_OVERHEAD_PER_CASE_S,
        measure,
        migrate,
        scheduler_run,
    )

    n, hosts = (4, 100) if quick else (20, 1000)
    workdir = Path(tempfile.mkdtemp(prefix="fleetbench-targets-"))
    try:
        migrate(airflow_env(workdir / "airflow", ROOT / "dags"))
        migrate(airflow_env(workdir / "stock-airflow", STOCK_DAGS))
        subprocess.run(["docker", "pull", "-q", SMOKE_IMAGE], capture_output=True, check=True)
        config = fleet_config(["localhost"], ["trivial"], [8 * (i + 1) for i in range(n)], 5)
        cases = measure(workdir, config, 1 if quick else 3, with_stock=True)
        sched_runs = None if quick else scheduler_run(workdir, config, runs=3)
        sched_s = None if quick else statistics.median(sched_runs)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    sched_per_case = None if sched_s is None else (sched_s - cases["plain_loop_s"]) / n
    parse = parse_variants(((hosts, False, False), (hosts, True, False), (hosts, False, True)), 1 if quick else 5)
    fb, stock = cases["fleetbench_overhead_per_case_s"], cases["stock_overhead_per_case_s"]
    out = {"cases": cases, "parse": parse}
    if sched_s is not None:
        out["scheduler_localexecutor"] = {"trigger_to_finish_s": round(sched_s, 2),
                                          "runs_s": [round(w, 2) for w in sched_runs],
                                          "overhead_per_case_s": round(sched_per_case, 3)}
    out["ratios"] = {  # measured / bar: <= 1 meets the bar
        f"dags_test_per_case_fleetbench_over_stock_at_{n}": round(fb / stock, 3) if stock > 0 else None,
        **({} if sched_per_case is None else {
            "localexecutor_per_case_over_1.2_s": round(sched_per_case / TARGET_OVERHEAD_PER_CASE_S, 3)}),
        **{f"parse_{name}_over_1_s": round(v["parse_s"] / TARGET_PARSE_S, 3) for name, v in parse.items()},
    }
    out["all_met"] = all(r is not None and r <= 1 for r in out["ratios"].values())
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


from bench_logs import bench_logs  # noqa: E402  (bench/ is the script directory)
from bench_metrics import bench_metrics  # noqa: E402
from bench_regression import bench_regression, bench_regression_night  # noqa: E402
from bench_warehouse import bench_attempts, bench_warehouse  # noqa: E402

PARTS = {"orchestration": bench_orchestration, "parse": bench_parse, "targets": bench_targets,
         "warehouse": bench_warehouse, "attempts": bench_attempts, "telemetry": bench_telemetry, "logs": bench_logs,
         "regression": bench_regression, "regression_night": bench_regression_night, "metrics": bench_metrics}


def flatten(prefix: str, value, rows: list) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            flatten(f"{prefix}.{k}" if prefix else k, v, rows)
    else:
        rows.append((prefix, value))


def byte_compile() -> list[str]:
    """Measure fleetbench as it runs deployed, its modules loaded from bytecode like Airflow's and the providers'
    (pip compiled those when it installed them). fleetbench is an editable install, whose bytecode Python
    writes on first import, unless PYTHONDONTWRITEBYTECODE is set, as in this machine's shells: then every
    Airflow task process compiles fleetbench's ~30 modules again (~35 ms a process, ~1 s per LocalExecutor run of
    20 cases), a cost no deployment pays. Compiling first is what the first import would have done."""
    folders = [ROOT / "include", ROOT / "dags", ROOT / "plugins", ROOT / "bench" / "stock_dags"]
    for folder in folders:
        if not compileall.compile_dir(str(folder), quiet=1):
            raise RuntimeError(f"byte-compiling {folder} failed")
    return [str(f.relative_to(ROOT)) for f in folders]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small and fast: the CI smoke check")
    parser.add_argument("--only", choices=sorted(PARTS), action="append", help="run only these parts")
    args = parser.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    results = {"when": datetime.now(timezone.utc).isoformat(), "quick": args.quick, "machine":
               {"cpus": os.cpu_count(), "python": platform.python_version(), "kernel": platform.release()},
               "byte_compiled": byte_compile()}
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
