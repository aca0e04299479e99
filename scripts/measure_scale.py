#!/usr/bin/env python3
"""How large a fleet one Airflow deployment parses and schedules: fleet_benchmark's DAG-file parse time,
task counts and serialized size for generated fleets (README "Deploying at fleet scale").

For each fleet size it writes a fleet config (N hosts x C cases per host: one CPU benchmark, models x
batch sizes) and parses dags/fleet_benchmark.py the way the dag-processor's per-file child process does
(`airflow.dag_processing.processor._parse_file`): the file stability check, a DagBag of the one file
(load_op_links=False), then `DagSerialization.to_dict` of each DAG. Every repetition runs in a fresh
Python process with Airflow already imported and its objects frozen out of the garbage collector's
reach (as the dag-processor forks it, after gc.freeze()), so fleetbench's own imports and the config
load are part of the time, as they are for the dag-processor.

    .venv/bin/python scripts/measure_scale.py                      # 10, 100, 1000 hosts x 20 cases, 5 runs each
    .venv/bin/python scripts/measure_scale.py --hosts 10,2000 --repeat 3 --json

Nothing here touches Docker, SSH or a database. Output: one line per fleet size (medians), and the
per-run task instances a DAG run of that fleet creates (fixed tasks + per-host tasks + mapped items).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DAG_FILE = ROOT / "dags" / "fleet_benchmark.py"
MODELS = ["trivial", "lenet", "resnet50", "inception3", "vgg16", "alexnet", "googlenet", "resnet152"]
DEFAULT_MAX_MAP_LENGTH = 1024

CHILD = r"""
import gc, json, os, sys, time
import airflow  # imported before the clock starts, as in the dag-processor's forked child
from airflow.dag_processing.dagbag import DagBag
from airflow.serialization.serialized_objects import DagSerialization
try:
    from airflow.dag_processing.dagbag import check_dag_file_stability
except ImportError:  # where it lives in other 3.x releases
    from airflow.dag_processing.processor import check_dag_file_stability
gc.freeze()  # the dag-processor freezes its objects before it forks the child (manager.py, before_run)
path = sys.argv[1]
t0 = time.perf_counter()
check_dag_file_stability(path)
t1 = time.perf_counter()
bag = DagBag(dag_folder=path, load_op_links=False)
t2 = time.perf_counter()
data = {dag_id: DagSerialization.to_dict(dag) for dag_id, dag in bag.dags.items()}
t3 = time.perf_counter()
dag = bag.dags.get("fleet_benchmark")
print(json.dumps({
    "errors": {k: v[-500:] for k, v in bag.import_errors.items()},
    "stability_s": t1 - t0, "parse_s": t2 - t1, "serialize_s": t3 - t2,
    "tasks": len(dag.tasks) if dag else None,
    "task_groups": len(dag.task_group_dict) if dag else None,
    "serialized_bytes": len(json.dumps(data["fleet_benchmark"], default=str)) if dag else None,
}))
"""


def shape(cases_per_host: int) -> tuple[int, int]:
    """(models, batch sizes) with models x batch sizes = cases per host, as many models as possible (20 = 5 x 4)."""
    for models in range(min(len(MODELS), cases_per_host), 0, -1):
        if cases_per_host % models == 0:
            return models, cases_per_host // models
    return 1, cases_per_host


def fleet_config(hosts: int, cases_per_host: int, own_queue_every: int = 0) -> dict:
    """N hosts x C CPU cases per host. Hosts are topology (a): probed over SSH, engine over TLS; every
    `own_queue_every`-th host is topology (b) instead: its own Celery queue and local socket."""
    models, batches = shape(cases_per_host)

    def host(i: int) -> dict:
        name = f"gpu-{i:05d}"
        if own_queue_every and i % own_queue_every == 0:
            return {"name": name, "queue": name}
        return {"name": name, "connection": f"ssh_{name}", "docker_url": f"tcp://{name}.fleet.invalid:2376",
                "docker_tls_conn_id": "fleet_docker_tls"}

    return {
        "fleet": {"name": f"scale-{hosts}", "schedule": "0 2 * * *"},
        "hosts": [host(i) for i in range(hosts)],
        "images": [{"name": "cpu-smoke", "ref": "127.0.0.1:5000/fleetbench/cpu-smoke:latest",
                    "command": ["python3", "/opt/fleetbench/tf_cnn_benchmarks.py"]}],
        "benchmarks": [{"name": "scale", "image": "cpu-smoke", "device": "cpu", "num_gpus": [0],
                        "models": MODELS[:models], "batch_sizes": [8 * (i + 1) for i in range(batches)]}],
    }


def write_config(folder: Path, hosts: int, cases_per_host: int, own_queue_every: int) -> Path:
    path = folder / f"fleet-{hosts}.yaml"
    path.write_text(yaml.safe_dump(fleet_config(hosts, cases_per_host, own_queue_every), sort_keys=False))
    return path


def parse_once(config: Path, home: Path) -> dict:
    env = {**os.environ, "FLEETBENCH_CONFIG": str(config), "AIRFLOW_HOME": str(home),
           "AIRFLOW__CORE__DAGS_FOLDER": str(DAG_FILE.parent), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/unused.db",
           "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING", "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "0"}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(DAG_FILE)], env=env, capture_output=True, text=True,
                          timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"parsing failed ({proc.returncode}): {proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if result["errors"]:
        raise RuntimeError(f"import errors: {result['errors']}")
    return result


def task_instances_per_run(hosts: int, cases_per_host: int, own_queue_hosts: int, fixed_tasks: int) -> int:
    """Task instances one run creates: the unmapped tasks + one per mapped item (run_case per case); every lane's
    unmapped `cases` task validates and prepares its host, whatever its queue."""
    # fixed_tasks counts every task once (the mapped ones too); mapped ones expand to their items
    mapped_tasks = hosts  # one run_case per lane
    return fixed_tasks - mapped_tasks + hosts * cases_per_host


def measure(sizes: list[int], cases_per_host: int, repeat: int, own_queue_every: int) -> list[dict]:
    out = []
    with tempfile.TemporaryDirectory(prefix="fleetbench-scale-") as tmp:
        folder = Path(tmp)
        (folder / "airflow").mkdir()
        for hosts in sizes:
            config = write_config(folder, hosts, cases_per_host, own_queue_every)
            runs = [parse_once(config, folder / "airflow") for _ in range(repeat)]
            first = runs[0]
            own = sum(1 for i in range(hosts) if own_queue_every and i % own_queue_every == 0)
            med = {k: statistics.median(r[k] for r in runs) for k in ("stability_s", "parse_s", "serialize_s")}
            out.append({
                "hosts": hosts, "cases_per_host": cases_per_host, "cases": hosts * cases_per_host,
                "own_queue_hosts": own, "repeat": repeat, **{f"{k}_median": round(v, 3) for k, v in med.items()},
                "total_s_median": round(statistics.median(r["stability_s"] + r["parse_s"] + r["serialize_s"]
                                                          for r in runs), 3),
                "parse_s_all": [round(r["parse_s"], 3) for r in runs],
                "tasks": first["tasks"], "task_groups": first["task_groups"],
                "serialized_kib": round(first["serialized_bytes"] / 1024, 1),
                "task_instances_per_run": task_instances_per_run(hosts, cases_per_host, own, first["tasks"]),
                "largest_map": max(hosts - own, cases_per_host),
                "fits_default_max_map_length": max(hosts - own, cases_per_host) <= DEFAULT_MAX_MAP_LENGTH,
            })
            print(_line(out[-1]), file=sys.stderr, flush=True)
    return out


def _line(r: dict) -> str:
    return (f"{r['hosts']:>6} hosts x {r['cases_per_host']} cases: parse {r['parse_s_median']:.2f} s, serialize "
            f"{r['serialize_s_median']:.2f} s, total {r['total_s_median']:.2f} s (median of {r['repeat']}); "
            f"{r['tasks']} tasks, {r['serialized_kib']} KiB serialized, {r['task_instances_per_run']} task instances "
            f"per run; largest map {r['largest_map']} "
            f"({'ok' if r['fits_default_max_map_length'] else 'over'} max_map_length 1024)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", default="10,100,1000", help="comma-separated fleet sizes (default 10,100,1000)")
    ap.add_argument("--cases-per-host", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=5, help="parses per size; the median is reported (default 5)")
    ap.add_argument("--own-queue-every", type=int, default=0,
                    help="every N-th host gets its own Celery queue (topology b); 0: none (default)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.hosts.split(",") if s.strip()]
    results = measure(sizes, args.cases_per_host, args.repeat, args.own_queue_every)
    meta = {"measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "cpus": os.cpu_count(),
            "python": platform.python_version(), "machine": platform.machine()}
    try:
        from importlib.metadata import version

        meta["airflow"] = version("apache-airflow")
    except Exception:  # noqa: BLE001
        pass
    if args.json:
        print(json.dumps({"meta": meta, "results": results}, indent=1))
    else:
        print(json.dumps(meta))
        for r in results:
            print(_line(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
