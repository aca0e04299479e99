"""A night of fleet_benchmark as data (plan, host verdicts, prepared images, case outcomes) for fault tests,
and a one-task DAG that runs a case with BenchmarkCaseOperator under Airflow's own task runner.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fleet_configs import smoke_config, write_config

REAL_LOGS = Path(__file__).resolve().parent / "fixtures" / "real-logs"  # SOURCES.md there
REAL_LOG = REAL_LOGS / "tfcnn_resnet50_1gpu_lambda-2080ti-tf115.log"
AIRFLOW = str(Path(sys.executable).parent / "airflow")


def night(tmp_path: Path, run_id: str, image_ref: str = "127.0.0.1:5000/fleetbench/cpu-smoke:latest",
          models=("trivial",), batch_sizes=(8,)) -> tuple[dict, list[dict], list[dict]]:
    """(plan, validations, prepared) of a one-host run of fleet_benchmark: host `localhost` ready, its image pinned."""
    from fleetbench.airflow.pipeline import make_plan

    config = write_config(tmp_path / f"fleet-{run_id}.yaml",
                          smoke_config(image_ref, models=models, batch_sizes=batch_sizes))
    plan = make_plan({"dag_id": "fleet_benchmark", "run_id": run_id, "logical_date": "2026-12-01T02:00:00+00:00",
                      "run_type": "manual"}, str(config))
    validations = [{"host": "localhost", "verdict": "ready", "reasons": "", "checks": [],
                    "facts": {"kernel": "6.1.0-test", "docker_version": "20.10.24"},
                    "collected_at": "2026-12-01T02:00:01+00:00"}]
    prepared = [{"host": "localhost", "images": {"cpu-smoke": {"ref": image_ref, "digest": "sha256:" + "a" * 64,
                                                               "pinned_ref": image_ref, "failure_class": None}}}]
    return plan, validations, prepared


def measured_outcomes(plan: dict, log_path: Path = REAL_LOG) -> list[dict]:
    """Every case of the plan ended with exit 0 and a real tf_cnn_benchmarks log (a measured row with steps)."""
    return [{"host": c["host"], "case_key": c["case_key"], "exit_code": 0, "oom_killed": False, "timed_out": False,
             "start_error_class": None, "log_path": str(log_path), "duration_s": 60.0,
             "started_at": "2026-12-01T02:01:00+00:00", "finished_at": "2026-12-01T02:02:00+00:00"}
            for c in plan["cases"]]


# -- a case under Airflow's task runner --------------------------------------------------------
KILL_DAG_ID = "fault_case_kill"
KILL_DAG = '''"""One benchmark case under Airflow's task runner, for the fault tests (settings from the environment)."""
import os
from datetime import timedelta

import pendulum
from airflow.sdk import DAG

from fleetbench.airflow.operators import BenchmarkCaseOperator

TOKEN = os.environ["FB_FAULT_TOKEN"]
LIMIT = os.environ.get("FB_FAULT_EXECUTION_TIMEOUT_S")

with DAG(dag_id="%s", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False):
    BenchmarkCaseOperator(
        task_id="run_case", image=os.environ["FB_FAULT_IMAGE"],
        command=["sh", "-c", "echo case started; sleep 300"], container_name="fbtest-" + TOKEN + "-kill",
        labels={"org.fleetbench.managed": "true", "org.fleetbench.test": TOKEN},
        case={"host": "localhost", "case_key": os.environ["FB_FAULT_CASE_KEY"]}, log_dir=os.environ["FB_FAULT_LOG_DIR"],
        timeout_s=600, retries=0, execution_timeout=timedelta(seconds=float(LIMIT)) if LIMIT else None,
    )
''' % KILL_DAG_ID


def write_kill_dag(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{KILL_DAG_ID}.py"
    path.write_text(KILL_DAG)
    return path


def kill_dag_env(token: str, image: str, case_key: str, log_dir: Path, execution_timeout_s: float | None = None,
                 ) -> dict:
    env = {"FB_FAULT_TOKEN": token, "FB_FAULT_IMAGE": image, "FB_FAULT_CASE_KEY": case_key,
           "FB_FAULT_LOG_DIR": str(log_dir)}
    if execution_timeout_s:
        env["FB_FAULT_EXECUTION_TIMEOUT_S"] = str(execution_timeout_s)
    return env


def private_airflow_env(home: Path, dags_folder: Path) -> dict:
    """The environment of an `airflow` CLI with its own home, SQLite metadata DB and DAG folder."""
    env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db"}
    home.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([AIRFLOW, "db", "migrate"], env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"airflow db migrate failed: {proc.stderr[-3000:]}")
    return env
