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

import logging
from datetime import timedelta

import pendulum
from airflow.sdk import DAG, BaseOperator, Param, get_current_context, task

from fleetbench import cleanup
from fleetbench.config import ConfigError, load_config_once
from fleetbench.paths import default_config_path

log = logging.getLogger(__name__)


def fleet_queues() -> list[str]:
    """Every host queue of the fleet config (the default queue's engines are cleaned by `clean`)."""
    try:
        cfg = load_config_once(default_config_path())
    except (ConfigError, OSError):  # fleet_benchmark's import error names the problem; clean what can be reached
        return []
    return sorted({h.queue for h in cfg.hosts if h.queue})


PARAMS = {
    "container_max_age_h": Param(24, type="number", minimum=0, description="remove stopped containers older than this"),
    "image_max_age_h": Param(168, type="number", minimum=0,
                             description="remove superseded baked images older than this"),
    "dry_run": Param(False, type="boolean", description="only log what would be removed"),
    "scope": Param({}, type="object", description="only objects carrying all these labels, "
                                                  "e.g. {\"org.fleetbench.dag_id\": \"...\"}"),
}


# What a whole-engine cleanup (no `scope`) keeps whatever the ages say: a case container that just stopped is still
# read (its state, its log) by its own task, which removes it; a superseded bake may be a night's pinned image.
MIN_AGE_H = 1.0


def clean_engine(engine: dict, params: dict) -> dict:
    ages = params["container_max_age_h"], params["image_max_age_h"]
    if not params["scope"] and min(ages) < MIN_AGE_H:
        log.warning("a cleanup of the whole engine keeps what is younger than %g h (asked: containers %g h, images "
                    "%g h); give a scope to remove younger objects", MIN_AGE_H, *ages)
        ages = tuple(max(a, MIN_AGE_H) for a in ages)
    return cleanup.clean_url(engine["docker_url"], *ages, scope=params["scope"] or None, dry_run=params["dry_run"],
                             docker_tls_conn_id=engine.get("docker_tls_conn_id"))


class CleanQueueOperator(BaseOperator):
    """`clean_<queue>`: on a host queue's worker, clean every engine of that queue (usually its one local socket).

    One plain task per queue, with no upstream edge: a fleet of 1,000 own-queue hosts adds 1,000 of these
    to the DAG, and a decorated, mapped task pair per queue made the folder's parse time four times longer.
    """

    def __init__(self, *, engines_queue: str, **kwargs) -> None:
        super().__init__(queue=engines_queue, **kwargs)
        self.engines_queue = engines_queue

    def execute(self, context) -> list[dict]:
        """Each engine of the queue in turn; one that cannot be cleaned (unreachable) does not stop the others: the
        task fails at the end, naming every engine that could not be cleaned."""
        from airflow.sdk.exceptions import AirflowException

        engines = [e for e in cleanup.engines_of() if e["queue"] == self.engines_queue]
        done, failed = [], []
        for engine in engines:
            try:
                done.append(clean_engine(engine, context["params"]))
            except Exception as exc:  # noqa: BLE001 - named below, after the other engines are cleaned
                self.log.exception("cleaning %s failed", engine["docker_url"])
                failed.append(f"{engine['docker_url']}: {exc}")
        if failed:
            raise AirflowException(f"{len(failed)} of {len(engines)} engine(s) of queue {self.engines_queue} could "
                                   f"not be cleaned (the others were): " + "; ".join(failed))
        return done


with DAG(
    dag_id="fleetbench_maintenance",
    description="Remove stopped or orphaned fleetbench containers and superseded baked images",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["fleetbench", "maintenance"],
    default_args={"retries": 2, "retry_delay": timedelta(minutes=5)},
    doc_md=__doc__,
) as dag:

    @task
    def engines() -> list[dict]:
        """The engines the default queue's workers reach: local sockets and TLS engines of hosts without a queue."""
        return [e for e in cleanup.engines_of() if e["queue"] is None]

    @task(map_index_template="{{ task_label }}")
    def clean(engine: dict) -> dict:
        ctx = get_current_context()
        ctx["task_label"] = ",".join(engine["hosts"])
        return clean_engine(engine, ctx["params"])

    clean.expand(engine=engines())
    for queue in fleet_queues():
        CleanQueueOperator(task_id=f"clean_{queue}", engines_queue=queue)

# Params go on the DAG once its tasks exist (as in fleet_benchmark): set earlier, Airflow deep-copies them into
# every task; a run's tasks read the DAG's params merged with its conf either way.
dag.params = PARAMS
