"""The reference for `make bench`'s orchestration part: the same benchmark commands as one mapped
stock DockerOperator (provider defaults, container removed on success), nothing else. What Airflow
alone costs per case, next to what fleetbench costs. Commands come from the JSON file in
$FLEETBENCH_STOCK_COMMANDS; the image from $FLEETBENCH_STOCK_IMAGE."""

import json
import os

import pendulum
from airflow.providers.docker.operators.docker import DockerOperator
from airflow.sdk import DAG

_path = os.environ.get("FLEETBENCH_STOCK_COMMANDS")
COMMANDS = json.loads(open(_path).read()) if _path else [["true"]]

with DAG("stock_docker", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False):
    DockerOperator.partial(task_id="run", image=os.environ.get("FLEETBENCH_STOCK_IMAGE", "scratch"),
                           network_mode="none", auto_remove="success", mount_tmp_dir=False).expand(command=COMMANDS)
