"""fleetbench_maintenance: daily, on every Docker engine of the fleet, remove what fleetbench left behind.

Stopped containers fleetbench created, case containers still running past their own timeout (their
task's worker died), and baked images superseded by a newer bake, older than the age limits below;
never anything fleetbench did not create (see `fleetbench.cleanup` for the rules).

Each engine is cleaned by a worker that reaches it: hosts with a queue of their own (topology b) on
that queue, the others (local socket, TLS engines with the same client the cases use) on the default
queue. The queues come from the fleet config when this file is parsed (a task's queue is fixed then);
which engines each queue cleans is read when the run starts.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DAG, Param, get_current_context, task

from fleetbench import cleanup
from fleetbench.config import ConfigError, load_config
from fleetbench.paths import default_config_path


def fleet_queues() -> list[str | None]:
    """None (the default queue) and every host queue of the fleet config."""
    try:
        cfg = load_config(default_config_path())
    except (ConfigError, OSError):  # fleet_benchmark's import error names the problem; clean what can be reached
        return [None]
    return [None] + sorted({h.queue for h in cfg.hosts if h.queue})


with DAG(
    dag_id="fleetbench_maintenance",
    description="Remove stopped or orphaned fleetbench containers and superseded baked images",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["fleetbench", "maintenance"],
    default_args={"retries": 2, "retry_delay": timedelta(minutes=5)},
    params={
        "container_max_age_h": Param(24, type="number", minimum=0,
                                     description="remove stopped containers older than this"),
        "image_max_age_h": Param(168, type="number", minimum=0,
                                 description="remove superseded baked images older than this"),
        "dry_run": Param(False, type="boolean", description="only log what would be removed"),
        "scope": Param({}, type="object", description="only objects carrying all these labels, "
                                                      "e.g. {\"org.fleetbench.dag_id\": \"...\"}"),
    },
    doc_md=__doc__,
) as dag:

    @task
    def engines() -> list[dict]:
        return cleanup.engines_of()

    @task(map_index_template="{{ task_label }}")
    def clean(engine: dict) -> dict:
        ctx = get_current_context()
        ctx["task_label"] = ",".join(engine["hosts"])
        p = ctx["params"]
        return cleanup.clean_url(engine["docker_url"], p["container_max_age_h"], p["image_max_age_h"],
                                 scope=p["scope"] or None, dry_run=p["dry_run"],
                                 docker_tls_conn_id=engine.get("docker_tls_conn_id"))

    listed = engines()
    for queue in fleet_queues():

        @task(task_id="engines_default" if queue is None else f"engines_{queue}")
        def of_queue(all_engines: list[dict], queue: str | None = queue) -> list[dict]:
            return [e for e in all_engines if e["queue"] == queue]

        on_queue = {"queue": queue} if queue else {}
        clean.override(task_id="clean" if queue is None else f"clean_{queue}",
                       **on_queue).expand(engine=of_queue(listed))
