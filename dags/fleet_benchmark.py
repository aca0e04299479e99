"""fleet_benchmark: validate hosts -> pull and pin images -> run each case in a container -> collect -> store.

Wiring only; every step is a function in `fleetbench.airflow.pipeline`. The fleet config
(`include/config/fleet.yaml`, or `FLEETBENCH_CONFIG`) is read here for the schedule, the timeouts
and the host names; a config error shows up as this file's import error with the field that is wrong.

Each host gets a lane: `host_<name>.cases` picks the host's runnable cases and
`host_<name>.run_case` runs them, dynamically mapped, in the host's own pool (`fleetbench_<name>`,
one slot: one benchmark at a time per host, different hosts in parallel). Pools are created with
`fleetbench pools export > pools.json && airflow pools import pools.json` (see README).
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DAG, Param, TaskGroup, TriggerRule, get_current_context, task
from airflow.sdk.exceptions import AirflowFailException

from fleetbench.airflow import pipeline
from fleetbench.airflow.operators import BenchmarkCaseOperator
from fleetbench.config import load_config
from fleetbench.params import param_specs
from fleetbench.paths import default_config_path

CONFIG = load_config(default_config_path())


def items(seq) -> list:
    """All items of a mapped task's results in one request (iterating probes past the end, one call per item)."""
    return list(seq[:])

LONGEST_CASE_S = max(b.timeout_s for b in CONFIG.benchmarks)

with DAG(
    dag_id="fleet_benchmark",
    description="Benchmark every host of the GPU fleet and store the results",
    schedule=CONFIG.fleet.schedule,
    start_date=pendulum.datetime(2026, 1, 1, tz=CONFIG.fleet.timezone),
    catchup=False,
    max_active_runs=1,
    tags=["fleetbench", "benchmark"],
    default_args={"retries": 1, "retry_delay": timedelta(seconds=15)},
    doc_md=__doc__,
    params={name: Param(spec["default"], title=spec["title"], description=spec["description"], **spec["schema"])
            for name, spec in param_specs(CONFIG).items()},
) as dag:

    @task(retries=0)
    def plan() -> dict:
        ctx = get_current_context()
        dag_run = ctx["dag_run"]
        logical_date = ctx.get("logical_date") or dag_run.run_after
        run = {"dag_id": dag_run.dag_id, "run_id": dag_run.run_id,
               "logical_date": logical_date.isoformat() if logical_date else None,
               "run_type": str(getattr(dag_run.run_type, "value", dag_run.run_type))}
        return pipeline.make_plan(run, params=dict(ctx["params"]))

    @task(retries=0)
    def fleet_hosts(the_plan: dict) -> list[dict]:
        return the_plan["hosts"]

    @task(retries=0, map_index_template="{{ host_name }}")
    def validate_host(host: dict, the_plan: dict) -> dict:
        get_current_context()["host_name"] = host["name"]
        return pipeline.validate_host(host, the_plan["run"])

    @task.short_circuit(retries=0)
    def proceed(the_plan: dict, validations: list[dict]) -> bool:
        """A dry run ends here: plan and host verdicts logged, nothing pulled, run or stored."""
        return pipeline.proceed(the_plan, items(validations))

    @task(map_index_template="{{ host_name }}")
    def prepare_image(host: dict, validations: list[dict]) -> dict:
        get_current_context()["host_name"] = host["name"]
        return pipeline.prepare_host_images(host, items(validations))

    @task(task_id="cases", retries=0)
    def host_cases(the_plan: dict, validations: list[dict], prepared: list[dict], host: str) -> list[dict]:
        return pipeline.case_kwargs(the_plan, items(validations), items(prepared), host=host)

    @task(trigger_rule=TriggerRule.ALL_DONE, retries=0)
    def collect(the_plan: dict, validations: list[dict], prepared: list[dict], outcomes: list) -> dict:
        return pipeline.collect(the_plan, items(validations), items(prepared),
                                [o for lane in outcomes for o in items(lane)])

    @task(trigger_rule=TriggerRule.ALL_DONE)
    def store(the_plan: dict, validations: list[dict], collected: dict) -> dict:
        return pipeline.store(the_plan, items(validations), collected)

    @task(retries=0)
    def check_fleet(validations: list[dict], stored: dict) -> dict:
        pipeline.check_fleet(items(validations))
        return stored

    p = plan()
    hosts = fleet_hosts(p)
    validations = validate_host.partial(the_plan=p).expand(host=hosts)
    go = proceed(p, validations)
    prepared = prepare_image.partial(validations=validations).expand(host=hosts)
    go >> prepared
    outcomes = []
    for host in CONFIG.hosts:
        with TaskGroup(group_id=f"host_{host.name}", tooltip=f"cases on {host.name}"):
            runs = BenchmarkCaseOperator.partial(
                task_id="run_case",
                pool=pipeline.pool_name(host.name),
                execution_timeout=timedelta(seconds=LONGEST_CASE_S + 300),
                map_index_template="{{ task.case['case_key'] }}",
            ).expand_kwargs(host_cases(p, validations, prepared, host.name))
        outcomes.append(runs.output)
    collected = collect(p, validations, prepared, outcomes)
    stored = store(p, validations, collected)
    check_fleet(validations, stored)

    @task(trigger_rule=TriggerRule.ONE_FAILED, retries=0)
    def watcher() -> None:
        """Fails the run when any task failed (a leaf with all_done would otherwise hide it)."""
        raise AirflowFailException("a task of this run failed; its rows are recorded with the failure class")

    list(dag.tasks) >> watcher()
