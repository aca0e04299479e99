"""fleetbench_maintenance: daily, on every Docker engine of the fleet, remove what fleetbench left behind.

Stopped containers fleetbench created and baked images superseded by a newer bake, older than the
age limits below; never anything fleetbench did not create (see `fleetbench.cleanup` for the rules).
Wiring only: the fleet config is read when the run starts, not when this file is parsed.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DAG, Param, get_current_context, task

from fleetbench import cleanup

with DAG(
    dag_id="fleetbench_maintenance",
    description="Remove stopped fleetbench containers and superseded baked images",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["fleetbench", "maintenance"],
    default_args={"retries": 2, "retry_delay": timedelta(minutes=5)},
    params={
        "container_max_age_h": Param(24, type="number", minimum=0, description="remove stopped containers older than this"),
        "image_max_age_h": Param(168, type="number", minimum=0, description="remove superseded baked images older than this"),
        "dry_run": Param(False, type="boolean", description="only log what would be removed"),
        "scope": Param({}, type="object", description="only objects carrying all these labels, e.g. {\"org.fleetbench.dag_id\": \"...\"}"),
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
                                 scope=p["scope"] or None, dry_run=p["dry_run"])

    clean.expand(engine=engines())
