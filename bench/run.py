"""`make bench`: measure fleetbench itself, side by side with the plain alternative, in one run.

Parts (each bounded; `--quick` is the CI smoke version, smaller and with fewer repetitions):
  orchestration  the same cases through `airflow dags test fleet_benchmark` (and a real scheduler with
                 the LocalExecutor), through a stock mapped DockerOperator DAG, and as a plain
                 sequential `docker run` loop: wall-time ratios, overhead per case (fixed per run and
                 marginal per case), and the throughput each case reports (bench/bench_orchestration.py)
  parse          DAG parse time (a DagBag of dags/, as the dag-processor does: wall and CPU time) and
                 serialization for fleets of 10, 100 and 1,000 hosts x 20 cases (at 1,000: central lanes,
                 own queues, with a multi-node benchmark; also without gc.freeze()); task count; peak memory.
                 A DAG file that fails to import, or no fleet_benchmark DAG, stops the bench with the errors
  targets        the run-model bars side by side in one run, as ratios: all-in per case under `dags test` at
                 20 cases (fleetbench / stock DockerOperator), LocalExecutor s/case / 1.2 s, 1,000-host
                 parse / 1 s in each topology; `all_met` is None, and `not_measured` names the bars, where a bar
                 was not measured at its own size (`--quick` measures 4 and 2 cases and 100 hosts)
  warehouse      storing a night of results (with their step lines and metric samples) and a year of nights on
                 SQLite and PostgreSQL; the latency of the report's queries over that history (bench/bench_warehouse.py)
  attempts       a 20,000-result night stored, stored again by a retry (replaced), and measured again on a
                 new driver (a second attempt each, the first kept as superseded), on SQLite and
                 PostgreSQL; the report and its re-measured section over those nights (bench/bench_warehouse.py)
  telemetry      CPU cost of the GPU sampler at 0.5 s and 0.1 s periods, through the NVML seam
  logs           a 200 MB case log measured as a case's task does: time and peak RSS (bench/bench_logs.py)
  regression     the driver-upgrade scenario of tests/regression_scenario.py stored night by night and assessed
                 by the DAG's compare step: recall, false alarms per 1,000 checks, outlier nights, `fleetbench
                 compare` by driver, and the time a night's assessment takes (bench/bench_regression.py)
  regression_night  a 20,000-result night on 60 nights of history through the DAG's store and compare
                 steps (store_run, assess_run, store_findings), on SQLite and PostgreSQL (bench/bench_regression.py)
  metrics        a 20,000-result night with 5 metric samples per ok result stored on PostgreSQL, next to the same
                 night without samples: wall and CPU time (bench/bench_metrics.py)

The machine is shared and noisy: most figures are the median of several repetitions (3 or 5; in `--quick` often
one), and ratios are reported next to absolute times. Single runs, not medians: orchestration's `long_cases`
(one plain / fleetbench / plain sequence) and its `scheduler_localexecutor` (one LocalExecutor run), the
targets' LocalExecutor runs under `--quick` (one run; the full mode takes the median of three), regression_night
(each step timed once per backend), the regression part's `store_all_nights_s`, the warehouse part's
`rerun_night_s`, `history_fill_s` and `rollup_rebuild_s`, and the telemetry windows. Prints one table and writes
bench/results/<part>.json and bench/results/latest.json.
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
if dag is not None:  # none: the bench reports what the DagBag has instead
    DagSerialization.to_dict(dag)
serialize = time.perf_counter() - t
print(json.dumps({"parse_s": parse, "parse_cpu_s": parse_cpu, "serialize_s": serialize,
                  "errors": {str(f): str(e) for f, e in bag.import_errors.items()}, "dags": sorted(bag.dags),
                  "tasks": len(dag.tasks) if dag else None, "maxrss_mib": peak_rss_mib()}))
"""


PARSE_VARIANTS = ((10, False, False), (100, False, False), (1000, False, False), (1000, True, False),
                  (1000, False, True))


def parse_variants(variants, repeats: int, unfrozen: int = 0) -> dict:
    """Median parse of each (hosts, own queues, multi-node) fleet; see bench_parse. `unfrozen`: at 1,000 hosts
    also the median of that many parses without gc.freeze(), as measured before 2026-12-03 (0: none). Raises
    when a DAG file of dags/ fails to import or the fleet_benchmark DAG (its task count) is missing."""
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

            def parse_runs(gc_mode: str, times: int) -> list[dict]:
                runs = []
                for _ in range(times):
                    proc = subprocess.run([sys.executable, "-c", PARSE_SNIPPET, str(ROOT / "dags"), gc_mode], env=env,
                                          capture_output=True, text=True)
                    if proc.returncode != 0:
                        raise RuntimeError(f"parse of dags/ ({name}) exited {proc.returncode}:\n{proc.stderr[-3000:]}")
                    run = json.loads(proc.stdout.strip().splitlines()[-1])
                    if run["errors"] or run["tasks"] is None:  # a parse that left DAGs out measures nothing
                        errors = "\n".join(f"{f}:\n{e}" for f, e in run["errors"].items())
                        raise RuntimeError(f"parse of dags/ ({name}): {len(run['errors'])} import error(s), "
                                           f"fleet_benchmark {'missing' if run['tasks'] is None else 'parsed'} "
                                           f"(DAGs: {', '.join(run['dags']) or 'none'})\n{errors}")
                    runs.append(run)
                return runs

            runs = parse_runs("freeze", repeats)
            out[name] = {"cases": hosts * 20 + (hosts // 2 if multinode else 0),
                         "parse_s": round(median([r["parse_s"] for r in runs]), 3),
                         "parse_cpu_s": round(median([r["parse_cpu_s"] for r in runs]), 3),  # steadier when busy
                         "serialize_s": round(median([r["serialize_s"] for r in runs]), 3),
                         "tasks": runs[0]["tasks"], "import_errors": len(runs[0]["errors"]),
                         "maxrss_mib": round(median([r["maxrss_mib"] for r in runs]), 1)}
            if hosts == 1000 and unfrozen:  # as measured before 2026-12-03 (no gc.freeze), to compare with
                unfrozen_runs = parse_runs("no-freeze", unfrozen)
                out[name]["parse_unfrozen_s"] = round(median([r["parse_s"] for r in unfrozen_runs]), 3)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return out


def bench_parse(quick: bool) -> dict:
    # the two topologies: lanes on central workers, and every host on a Celery queue of its own
    # and a fleet with a multi-node benchmark (README "Multi-node cases": 2 more tasks, an edge from each lane)
    repeats, unfrozen = (2, 1) if quick else (5, 5)
    out = parse_variants(PARSE_VARIANTS, repeats, unfrozen=unfrozen)
    out["repeats"] = {"frozen": repeats, "unfrozen_at_1000_hosts": unfrozen}
    out["target_parse_s_at_1000_hosts"] = TARGET_PARSE_S
    out["target_met"] = max(out[name]["parse_s"] for name in ("1000_hosts", "1000_hosts_own_queues",
                                                              "1000_hosts_multinode")) < TARGET_PARSE_S
    return out


# -- 3. the typed run model's targets, side by side ------------------------------------------------
# The bars, each at the size it is set for: 20 cases (a host's night) and 1,000 hosts.
BAR_CASES, BAR_HOSTS = 20, 1000
BARS = ("dags_test_per_case_at_20_cases", "localexecutor_per_case_at_20_cases", "parse_1000_hosts",
        "parse_1000_hosts_own_queues", "parse_1000_hosts_multinode")


def bench_targets(quick: bool) -> dict:
    """The three bars of the run-model reshaping, measured in one run and each given as a ratio to its bar
    (<= 1 meets it): the all-in cost per case under `airflow dags test` at 20 cases against the stock mapped
    DockerOperator DAG's in the same repetitions (interleaved, median of 3), the trigger-to-finish cost per case
    on a real scheduler with the LocalExecutor (bar 1.2 s; median of three runs), and the parse of a 1,000-host
    fleet with central lanes, with a queue per host and with a multi-node benchmark (bar 1 s, median of 5).
    `--quick`: 4 cases under `dags test`, one LocalExecutor run of 2 cases and 100 hosts, once each: the same
    paths, smaller, so no bar is measured at its own size (a run's fixed cost spread over 2 or 4 cases is not its
    cost per case at 20). `ratios` has what was measured, named by its size; `all_met` judges the bars measured at
    their own size, and is None, with `not_measured` naming the rest, unless every bar was."""
    from bench_orchestration import (
        SMOKE_IMAGE,
        STOCK_DAGS,
        TARGET_OVERHEAD_PER_CASE_S,
        commands,
        measure,
        migrate,
        plain_loop,
        scheduler_run,
    )

    n, sched_n, hosts = (4, 2, 100) if quick else (BAR_CASES, BAR_CASES, BAR_HOSTS)
    workdir = Path(tempfile.mkdtemp(prefix="fleetbench-targets-"))
    try:
        migrate(airflow_env(workdir / "airflow", ROOT / "dags"))
        migrate(airflow_env(workdir / "stock-airflow", STOCK_DAGS))
        subprocess.run(["docker", "pull", "-q", SMOKE_IMAGE], capture_output=True, check=True)
        config = fleet_config(["localhost"], ["trivial"], [8 * (i + 1) for i in range(n)], 5)
        cases = measure(workdir, config, 1 if quick else 3, with_stock=True)
        sched_config = fleet_config(["localhost"], ["trivial"], [8 * (i + 1) for i in range(sched_n)], 5)
        sched_runs = scheduler_run(workdir, sched_config, runs=1 if quick else 3)
        sched_s = statistics.median(sched_runs)
        # the plain loop of the scheduler's cases: the dags test cases' own when they are the same
        sched_plain_s = cases["plain_loop_s"] if sched_n == n else plain_loop(commands(sched_config))[0]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    sched_per_case = (sched_s - sched_plain_s) / sched_n
    parse = parse_variants(((hosts, False, False), (hosts, True, False), (hosts, False, True)), 1 if quick else 5)
    fb, stock = cases["fleetbench_overhead_per_case_s"], cases["stock_overhead_per_case_s"]
    out = {"cases": cases, "parse": parse}
    out["scheduler_localexecutor"] = {"cases": sched_n, "trigger_to_finish_s": round(sched_s, 2),
                                      "runs_s": [round(w, 2) for w in sched_runs],
                                      "plain_loop_s": round(sched_plain_s, 2),
                                      "overhead_per_case_s": round(sched_per_case, 3)}
    dags_test_ratio = round(fb / stock, 3) if stock > 0 else None
    sched_ratio = round(sched_per_case / TARGET_OVERHEAD_PER_CASE_S, 3)
    parse_ratios = {name: round(v["parse_s"] / TARGET_PARSE_S, 3) for name, v in parse.items()}
    out["ratios"] = {  # measured / bar: <= 1 meets the bar
        f"dags_test_per_case_fleetbench_over_stock_at_{n}": dags_test_ratio,
        f"localexecutor_per_case_at_{sched_n}_over_1.2_s": sched_ratio,
        **{f"parse_{name}_over_1_s": r for name, r in parse_ratios.items()},
    }
    at_size = {  # bar -> its ratio, where measured at the bar's own size
        "dags_test_per_case_at_20_cases": dags_test_ratio if n == BAR_CASES else None,
        "localexecutor_per_case_at_20_cases": sched_ratio if sched_n == BAR_CASES else None,
        **{f"parse_{name}": r for name, r in parse_ratios.items() if hosts == BAR_HOSTS},
    }
    out["not_measured"] = [bar for bar in BARS if at_size.get(bar) is None]
    out["all_met"] = None if out["not_measured"] else all(at_size[bar] <= 1 for bar in BARS)
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
