"""fleet_benchmark: validate hosts -> pull and pin images -> run each case in a container -> collect -> store ->
compare.

Wiring only; every step is a function in `fleetbench.airflow.pipeline`. The fleet config
(`include/config/fleet.yaml`, or `FLEETBENCH_CONFIG`) is read here for the schedule, the timeouts
and the host names; a config error shows up as this file's import error with the field that is wrong.

Each host gets a lane: `host_<name>.cases` picks the host's runnable cases and
`host_<name>.run_case` runs them, dynamically mapped, one at a time (`max_active_tis_per_dag=1`;
with `fleet.host_pools` also in the host's own one-slot pool `fleetbench_<name>`, exclusive across
DAGs; pools come from `fleetbench pools export > pools.json && airflow pools import pools.json`).
Cases that span hosts (README "Multi-node cases") run in the `multinode` group once every lane is done,
one at a time, so each holds all of its hosts.

The top-level `validate_host` / `prepare_image` map over the hosts without a queue, on the default
queue. With the CeleryExecutor, a host with a `queue` (a Celery worker on the GPU host itself, README
"Deploying at fleet scale") is validated and prepared by its lane's `cases` task on that queue (its
engine is the worker's own socket), and its cases run there too.
"""

from __future__ import annotations

from contextlib import contextmanager
from datetime import timedelta

import pendulum
from airflow.sdk import DAG, Asset, Param, TaskGroup, TriggerRule, get_current_context, task

from fleetbench.airflow import parse_speed, pipeline
from fleetbench.airflow.multinode import MultiNodeCaseOperator, MultiNodeCasesOperator
from fleetbench.airflow.operators import (
    LANE_IMAGES,
    LANE_VALIDATION,
    BenchmarkCaseOperator,
    HostCasesOperator,
    LaneCasesOperator,
)
from fleetbench.airflow.operators import all_items as items
from fleetbench.config import load_config_once
from fleetbench.params import param_specs
from fleetbench.paths import default_config_path
from fleetbench.runs import pool_name

CONFIG = load_config_once(default_config_path())
parse_speed.cache_operator_defaults()  # before the first .partial(): see fleetbench/airflow/parse_speed.py
parse_speed.fast_edges()  # before the first dependency edge (same module)


# The `cases` tasks of the lanes of hosts with a queue of their own: they validate and prepare their host too.
OWN_QUEUE_LANES = [f"host_{h.name}.cases" for h in CONFIG.hosts if h.queue]


def every_host(results: list) -> list:
    """A step's results of every host, as one list: the lanes' mapped `run_case` outcomes, each lane's list."""
    out = []
    for r in results:
        if r is not None:
            out.extend(items(r))
    return out


def own_queue_lanes(key: str) -> list:
    """`validation` or `images` of each own-queue lane (None where the run has no case on the host), read when
    collect runs: handed over as arguments they would be 2,000 more dependency edges in a 1,000-host DAG."""
    if not OWN_QUEUE_LANES:
        return []
    return list(get_current_context()["ti"].xcom_pull(task_ids=OWN_QUEUE_LANES, key=key) or [])


# Cases that span hosts (benchmarks with nodes > 1) get the `multinode` group; without them, no extra task.
MULTINODE = any(n > 1 for b in CONFIG.benchmarks for n in b.nodes)
LONGEST_CASE_S = max(b.timeout_s for b in CONFIG.benchmarks)
# A host's probes (SSH, nvidia-smi, a GPU smoke container) and collecting a night's outcomes end well within
# these; past them something hangs, and the task fails instead of holding the run (its cases become rows
# with host_check_failed / the collect task's failure).
VALIDATE_TIMEOUT = timedelta(minutes=15) + timedelta(  # plus the longest dcgmi diag a host's check runs
    seconds=max((h.gpu_health.dcgm_timeout_s() for h in CONFIG.hosts), default=0.0))
COLLECT_TIMEOUT = timedelta(minutes=30)
# Up to this many hosts each lane is a task group (collapsible in the UI); a larger fleet gets the same
# task ids (`host_<name>.run_case`) without groups, which parse ~10% faster at 1,000 hosts.
MAX_GROUPED_LANES = 100


@contextmanager
def lane(host: str):
    """A host's lane: yields `in_lane(step) -> task id` giving `host_<host>.<step>` either way."""
    group_id = f"host_{host}"
    if len(CONFIG.hosts) <= MAX_GROUPED_LANES:
        with TaskGroup(group_id=group_id, tooltip=f"cases on {host}"):
            yield lambda step: step
    else:
        yield lambda step: f"{group_id}.{step}"


WAREHOUSE = Asset(name=pipeline.WAREHOUSE_ASSET_NAME, uri=pipeline.WAREHOUSE_ASSET_URI)

with DAG(
    dag_id="fleet_benchmark",
    description="Benchmark every host of the GPU fleet and store the results",
    schedule=CONFIG.fleet.schedule,
    start_date=pendulum.datetime(2026, 1, 1, tz=CONFIG.fleet.timezone),
    catchup=False,
    max_active_runs=1,
    # every host's lane may run at once (Airflow's default is 16 tasks per DAG: 16 hosts in parallel);
    # [core] parallelism and the workers' slots still cap it (README "Deploying at fleet scale")
    max_active_tasks=max(16, 2 * len(CONFIG.hosts)),
    tags=["fleetbench", "benchmark"],
    default_args={"retries": 1, "retry_delay": timedelta(seconds=15)},
    doc_md=__doc__,
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
        return pipeline.central_hosts(the_plan)  # hosts with their own queue are validated in their lane

    @task(retries=0, map_index_template="{{ host_name }}", execution_timeout=VALIDATE_TIMEOUT)
    def validate_host(host: dict, the_plan: dict) -> dict:
        get_current_context()["host_name"] = host["name"]
        return pipeline.validate_host(host, the_plan["run"])

    # A host whose check failed (its execution_timeout, a crash) costs its own cases only: the steps after the
    # checks run whatever happened to them (ALL_DONE; a failed or skipped check has no verdict, and its host's
    # cases are recorded as host_check_failed), so the other hosts are prepared and run.
    @task.short_circuit(retries=0, trigger_rule=TriggerRule.ALL_DONE)
    def proceed(the_plan: dict, validations: list[dict]) -> bool:
        """A dry run ends here: plan and host verdicts logged, nothing pulled, run or stored."""
        return pipeline.proceed(the_plan, items(validations))

    @task(map_index_template="{{ host_name }}", trigger_rule=TriggerRule.ALL_DONE)
    def prepare_image(host: dict, validations: list[dict]) -> dict:
        get_current_context()["host_name"] = host["name"]
        return pipeline.prepare_host_images(host, items(validations))

    @task(trigger_rule=TriggerRule.ALL_DONE, retries=0, execution_timeout=COLLECT_TIMEOUT)
    def collect(the_plan: dict, validations: list, prepared: list, outcomes: list) -> dict:
        """Every planned case as a row; the run's host verdicts ride along for store and check_fleet."""
        return pipeline.collect(the_plan, items(validations) + own_queue_lanes(LANE_VALIDATION),
                                items(prepared) + own_queue_lanes(LANE_IMAGES), every_host(outcomes))

    @task(trigger_rule=TriggerRule.ALL_DONE)
    def store(the_plan: dict, collected: dict) -> dict:
        return pipeline.store(the_plan, collected)

    @task(retries=0)
    def compare(the_plan: dict, stored: dict) -> dict:
        """Each stored (host, case) against its baseline: regressions stored, logged, mailed if configured; then the
        `accept_baselines` of the run accepted."""
        return pipeline.detect_regressions(the_plan, stored, get_current_context()["dag_run"].triggering_user_name)

    @task(trigger_rule=TriggerRule.ALL_DONE, outlets=[WAREHOUSE])
    def report(the_plan: dict, stored: dict) -> dict:
        """HTML report with plots in <data dir>/reports/; marks the warehouse asset updated (also when compare
        failed)."""
        summary = pipeline.write_report(the_plan, stored)
        get_current_context()["outlet_events"][WAREHOUSE].extra = summary
        return summary

    @task(retries=0)
    def check_fleet(collected: dict, stored: dict, regressions: dict) -> dict:
        pipeline.check_fleet(collected["validations"])
        return {**stored, "regressions": regressions}  # the run's summary

    p = plan()
    hosts = fleet_hosts(p)
    validations = validate_host.partial(the_plan=p).expand(host=hosts)
    go = proceed(p, validations)
    prepared = prepare_image.partial(validations=validations).expand(host=hosts)
    go >> prepared
    # Every host's lane is `cases` -> `run_case`; the lanes' outcomes travel to collect as one list.
    outcomes, lane_runs = [], []
    for host in CONFIG.hosts:
        with lane(host.name) as in_lane:
            on_host = {"queue": host.queue} if host.queue else {}  # Celery: the worker on the GPU host
            if host.queue:  # its engine is the worker's local socket: validated and pulled there, in `cases`
                cases = LaneCasesOperator(task_id=in_lane("cases"), host=host.name, plan=p, **on_host)
                p >> cases
            else:
                cases = HostCasesOperator(task_id=in_lane("cases"), retries=0, host=host.name, prepared=prepared,
                                          plan=p, validations=validations)
            runs = BenchmarkCaseOperator.partial(
                task_id=in_lane("run_case"),
                # one benchmark at a time on the host, with or without pools (a missing pool would stall the night)
                max_active_tis_per_dag=1,
                **({"pool": pool_name(host.name)} if CONFIG.fleet.host_pools else {}),
                execution_timeout=timedelta(seconds=LONGEST_CASE_S + 300),
                map_index_template="{{ task.case['case_key'] }}",
                **on_host,
            ).expand_kwargs(cases.output)
        outcomes.append(runs.output)
        lane_runs.append(runs)
    if MULTINODE:  # README "Multi-node cases": after every lane, one case at a time (holds all its hosts)
        with TaskGroup(group_id="multinode", tooltip="cases that span hosts"):
            multi = MultiNodeCasesOperator(task_id="cases", retries=0, prepared=prepared, plan=p,
                                           validations=validations, trigger_rule=TriggerRule.ALL_DONE)
            lane_runs >> multi
            multi_runs = MultiNodeCaseOperator.partial(
                task_id="run_case", max_active_tis_per_dag=1,
                execution_timeout=timedelta(seconds=LONGEST_CASE_S + 300),
                map_index_template="{{ task.case['case_key'] }}",
            ).expand_kwargs(multi.output)
        outcomes.append(multi_runs.output)
    collected = collect(p, validations, prepared, outcomes)
    stored = store(p, collected)
    regressions = compare(p, stored)
    check = check_fleet(collected, stored, regressions)
    rep = report(p, stored)
    regressions >> rep

    @task(trigger_rule=TriggerRule.ALL_DONE, retries=0)
    def outcome() -> None:
        """The run's last task: fails the run when any task of it failed (leaves with all_done would hide it).

        It asks for the run's failed tasks instead of hanging off every task: 2,000 edges into one
        task made a 1,000-host DAG's parse time grow with the square of the fleet."""
        ctx = get_current_context()
        pipeline.fail_if_tasks_failed(ctx["ti"], ctx["dag_run"].dag_id, ctx["dag_run"].run_id)

    [check, rep] >> outcome()

# Trigger parameters go on the DAG once its tasks exist: Airflow deep-copies a DAG's params into every
# task made inside it and serializes each copy (at 1,000 hosts: +1 s parse, +5 s serialization), while
# a task's run reads the DAG's params merged with the run's conf either way.
dag.params = {name: Param(spec["default"], title=spec["title"], description=spec["description"], **spec["schema"])
              for name, spec in param_specs(CONFIG).items()}
