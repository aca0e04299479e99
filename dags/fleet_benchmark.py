"""fleet_benchmark: plan -> per host: validate, pull and pin images, run each case in a container -> collect and
store -> compare with baselines and report; beside the report, outcome.

Wiring only; every step is a function in `fleetbench.airflow.pipeline`. The fleet config
(`include/config/fleet.yaml`, or `FLEETBENCH_CONFIG`) is read here for the schedule, the timeouts
and the host names; a config error shows up as this file's import error with the field that is wrong.

Every host gets a lane of the same shape: `host_<name>.cases` checks the host, pulls and pins its images
and returns its runnable cases (the verdict and the images go to XCom under `validation` and `images`),
and `host_<name>.run_case` runs them, dynamically mapped, one at a time (`max_active_tis_per_dag=1`;
with `fleet.host_pools` also in the host's own one-slot pool `fleetbench_<name>`, exclusive across
DAGs; pools come from `fleetbench pools export > pools.json && airflow pools import pools.json`).
The lanes run side by side. A host without a `queue` has its lane on the default queue; with the
CeleryExecutor, a host with a `queue` (a Celery worker on the GPU host itself, README "Deploying at
fleet scale") has its whole lane on that queue, its engine being the worker's own socket.
Cases that span hosts (README "Multi-node cases") run in the `multinode` group once every lane is done,
one at a time, so each holds all of its hosts.
"""

from __future__ import annotations

from contextlib import contextmanager
from datetime import timedelta

import pendulum
from airflow.sdk import DAG, Asset, Param, TaskGroup, TriggerRule, get_current_context, task

from fleetbench.airflow import parse_speed, pipeline
from fleetbench.airflow.operators import (
    EXECUTION_GRACE_S,
    LANE_IMAGES,
    LANE_VALIDATION,
    BenchmarkCaseOperator,
    LaneCasesOperator,
)
from fleetbench.airflow.operators import all_items as items
from fleetbench.airflow.task_gc import freeze_startup_objects
from fleetbench.config import load_config_once
from fleetbench.params import param_specs
from fleetbench.paths import default_config_path
from fleetbench.runs import lane_id, pool_name

CONFIG = load_config_once(default_config_path())
parse_speed.cache_operator_defaults()  # before the first .partial(): see fleetbench/airflow/parse_speed.py
parse_speed.fast_edges()  # before the first dependency edge (same module)


# Every host's lane starts with its `cases` task, which validates and prepares the host too.
LANES = {h.name: f"{lane_id(h.name)}.cases" for h in CONFIG.hosts}


def every_host(results: list) -> list:
    """A step's results of every host, as one list: the lanes' mapped `run_case` outcomes, each lane's list."""
    out = []
    for r in results:
        if r is not None:
            out.extend(items(r))
    return out


def from_lanes(key: str, the_plan) -> list:
    """`validation` or `images` of every planned host's lane (None where the run has no case on the host or the lane
    failed first), read when the task runs: handed over as arguments they would be 2,000 more dependency edges in a
    1,000-host DAG. The lanes are the run's plan's, not those of the config as it is when this task runs (each task
    parses the DAG file again: a host removed from the config during the night had its results read by nobody,
    its cases stored as host_check_failed in a green run)."""
    lanes = [f"{lane_id(h)}.cases" for h in pipeline.planned_hosts(the_plan)]
    return list(get_current_context()["ti"].xcom_pull(task_ids=lanes, key=key) or []) if lanes else []


def unparsed_lane_outcomes(the_plan) -> list:
    """The `run_case` outcomes of the planned hosts that have no lane in the DAG as this task parsed it (removed from
    the config during the night), read by task id: every map index of each."""
    gone = [f"{lane_id(h)}.run_case" for h in pipeline.planned_hosts(the_plan) if h not in LANES]
    if not gone:
        return []
    return [o for o in get_current_context()["ti"].xcom_pull(task_ids=gone) or [] if o is not None]


# Cases that span hosts (benchmarks with nodes > 1) get the `multinode` group; without them, no extra task.
MULTINODE = any(n > 1 for b in CONFIG.benchmarks for n in b.nodes)
LONGEST_CASE_S = max(b.timeout_s for b in CONFIG.benchmarks)
# What a case task shows before it runs; running, it is its own case's timeout_s as planned, and the grace
# (`operators.case_execution_timeout`: a config edited during the night no longer kills its cases)
CASE_TASK_TIMEOUT = timedelta(seconds=LONGEST_CASE_S + EXECUTION_GRACE_S)
# A host's probes (SSH, nvidia-smi, a GPU smoke container, plus the longest dcgmi diag its check runs) end well
# within this; past it something hangs, and the host's verdict says so (unreachable) instead of holding the run.
HOST_CHECK_TIMEOUT_S = 15 * 60
# Collecting and storing a night's outcomes ends well within this; past it the store task fails.
STORE_TIMEOUT = timedelta(minutes=30)
# Up to this many hosts each lane is a task group (collapsible in the UI); a larger fleet gets the same
# task ids (`host_<name>.run_case`) without groups, which parse ~10% faster at 1,000 hosts.
MAX_GROUPED_LANES = 100


@contextmanager
def lane(host: str):
    """A host's lane: yields `in_lane(step) -> task id` giving `host_<host>.<step>` either way."""
    group_id = lane_id(host)
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

    # Every task returns its result as one XCom (multiple_outputs=False): a `-> dict` task would also push each key
    # as an XCom of its own that nothing reads (~10 ms an XCom, 30 of them a run).
    @task(retries=0, multiple_outputs=False)
    def plan() -> dict:
        freeze_startup_objects()  # each task's first step: fleetbench/airflow/task_gc.py
        ctx = get_current_context()
        dag_run = ctx["dag_run"]
        logical_date = ctx.get("logical_date") or dag_run.run_after
        run = {"dag_id": dag_run.dag_id, "run_id": dag_run.run_id,
               "logical_date": logical_date.isoformat() if logical_date else None,
               "run_type": str(getattr(dag_run.run_type, "value", dag_run.run_type))}
        the_plan, slices = pipeline.make_split_plan(run, params=dict(ctx["params"]))
        # the lanes this run has (the DAG as the scheduler last parsed it) against the hosts the config names now
        pipeline.check_lanes(the_plan, ctx["ti"].get_task_states(dag_id=dag_run.dag_id, run_ids=[dag_run.run_id])
                             .get(dag_run.run_id, {}))
        for key, cases in slices.items():  # each lane reads its host's cases, not the night's
            ctx["ti"].xcom_push(key=key, value=cases)
        return the_plan

    # A host whose lane failed (a crash) costs its own cases only: store runs whatever happened to the lanes
    # (ALL_DONE; a lane without a verdict has its cases recorded as host_check_failed, one that failed after it
    # as task_failed). A dry run ends here (the short circuit skips every later task): plan and host verdicts
    # logged, nothing pulled, run or stored.
    @task.short_circuit(trigger_rule=TriggerRule.ALL_DONE, execution_timeout=STORE_TIMEOUT, multiple_outputs=False)
    def store(the_plan: dict, outcomes: list) -> dict | None:
        """Every planned case as a classified row (`pipeline.collect`), then the run stored whole, in one
        transaction (`pipeline.store`): the rows never travel through XCom. Returns the run's counts."""
        freeze_startup_objects()
        # read once, with every case: each step below takes the model as it is
        the_plan = pipeline.plan_cases(the_plan, get_current_context()["ti"])
        validations = from_lanes(LANE_VALIDATION, the_plan)
        if not pipeline.proceed(the_plan, validations, whole_run=True):
            return None
        collected = pipeline.collect(the_plan, validations, from_lanes(LANE_IMAGES, the_plan),
                                     every_host(outcomes) + unparsed_lane_outcomes(the_plan))
        return pipeline.store(the_plan, collected)

    # Retried by hand only (clear `report`): a retry would compare the night again and could mail its news twice.
    @task(trigger_rule=TriggerRule.ALL_DONE, outlets=[WAREHOUSE], retries=0, multiple_outputs=False)
    def report(the_plan: dict, stored: dict | None) -> dict:
        """Each stored (host, case) against its baseline (regressions stored, logged, mailed if configured; the
        run's `accept_baselines` accepted), then the HTML report with plots in <data dir>/reports/, which marks
        the warehouse asset updated. A failed comparison still gets its report, then fails the task
        (`pipeline.assess_and_report`)."""
        freeze_startup_objects()
        ctx = get_current_context()
        summary, regressions = pipeline.assess_and_report(the_plan, stored, ctx["dag_run"].triggering_user_name)
        ctx["outlet_events"][WAREHOUSE].extra = summary
        return {**summary, "regressions": regressions}

    p = plan()
    # Every host's lane is `cases` -> `run_case`; the lanes' outcomes travel to store as one list.
    outcomes, lane_runs = [], []
    for host in CONFIG.hosts:
        with lane(host.name) as in_lane:
            on_host = {"queue": host.queue} if host.queue else {}  # Celery: the worker on the GPU host
            # the host's pool (fleet.host_pools) for its check too: its GPU smoke container, dcgmi diag and pulls
            # must not run beside another DAG's benchmark on those GPUs
            in_pool = {"pool": pool_name(host.name)} if CONFIG.fleet.host_pools else {}
            # No retry: a pull has its own bounded retries, and a host check that failed is a verdict.
            cases = LaneCasesOperator(task_id=in_lane("cases"), retries=0, host=host.name, plan=p,
                                      host_check_timeout_s=HOST_CHECK_TIMEOUT_S + host.gpu_health.dcgm_timeout_s(),
                                      **in_pool, **on_host)
            p >> cases
            runs = BenchmarkCaseOperator.partial(
                task_id=in_lane("run_case"),
                # one benchmark at a time on the host, with or without pools (a missing pool would stall the night)
                max_active_tis_per_dag=1,
                **in_pool,
                execution_timeout=CASE_TASK_TIMEOUT, execution_grace_s=EXECUTION_GRACE_S,  # running: its own case's
                map_index_template="{{ task.case['case_key'] }}",
                **on_host,
            ).expand_kwargs(cases.output)
        outcomes.append(runs.output)
        lane_runs.append(runs)
    if MULTINODE:  # README "Multi-node cases": after every lane, one case at a time (holds all its hosts)
        from fleetbench.airflow.multinode import MultiNodeCaseOperator, MultiNodeCasesOperator  # only then

        with TaskGroup(group_id="multinode", tooltip="cases that span hosts"):
            multi = MultiNodeCasesOperator(task_id="cases", retries=0, plan=p, trigger_rule=TriggerRule.ALL_DONE)
            lane_runs >> multi
            multi_runs = MultiNodeCaseOperator.partial(
                task_id="run_case", max_active_tis_per_dag=1,
                execution_timeout=CASE_TASK_TIMEOUT, execution_grace_s=EXECUTION_GRACE_S,  # running: its own case's
                map_index_template="{{ task.case['case_key'] }}",
            ).expand_kwargs(multi.output)
        outcomes.append(multi_runs.output)
    stored = store(p, outcomes)
    report(p, stored)

    @task(trigger_rule=TriggerRule.ALL_DONE, retries=0, multiple_outputs=False)
    def outcome(stored: dict | None) -> dict:
        """Fails the run when every host was unfit or a task of it failed (leaves with all_done would hide it);
        else returns the run's summary.

        It runs beside `report`, not after it: the report is a leaf of the DAG, so the run fails when the
        report does anyway. It asks for the run's failed tasks instead of hanging off every task: 2,000
        edges into one task made a 1,000-host DAG's parse time grow with the square of the fleet."""
        freeze_startup_objects()
        ctx = get_current_context()
        pipeline.fail_if_tasks_failed(ctx["ti"], ctx["dag_run"].dag_id, ctx["dag_run"].run_id,
                                      every_host_unfit=(stored or {}).get("every_host_unfit"))
        return dict(stored or {})

    outcome(stored)

# Trigger parameters go on the DAG once its tasks exist: Airflow deep-copies a DAG's params into every
# task made inside it and serializes each copy (at 1,000 hosts: +1 s parse, +5 s serialization), while
# a task's run reads the DAG's params merged with the run's conf either way.
dag.params = {name: Param(spec["default"], title=spec["title"], description=spec["description"], **spec["schema"])
              for name, spec in param_specs(CONFIG).items()}
