"""The steps of one fleet_benchmark run: the bodies of its tasks.

The DAG file wires these into tasks. Each reads its inputs from XCom as the typed run model
(`fleetbench.run_model`: RunPlan, HostVerdict, HostImages, CaseOutcome; a dict or the model itself)
and returns JSON for the next XCom; raw logs and probe outputs stay in files under the run's
artifact folder (`fleetbench.runs`). The work itself lives in the core (plan, hosts, prepare,
measure, metrics, warehouse, regression, report); keeping these free of Airflow's context makes
every step testable on its own.
"""

from __future__ import annotations

import logging
from contextlib import ExitStack
from pathlib import Path

import requests

from fleetbench import runs
from fleetbench.config import load_config
from fleetbench.measure import FAILED, OK, SKIPPED
from fleetbench.paths import default_config_path
from fleetbench.run_model import HostImages, HostVerdict, PlannedHost, RunInfo, RunPlan, by_host

log = logging.getLogger(__name__)
# Host checks, images, log parsing and the warehouse are imported where they run, not when the DAG
# file is parsed: the dag-processor re-parses it every few minutes.


# -- plan -------------------------------------------------------------------------------------
def make_plan(run: dict, config_path: str | None = None, params: dict | None = None) -> dict:
    """Read the fleet config, apply the run's parameters, expand the cases (`fleetbench.plan.build_plan`).

    `run` holds dag_id, run_id, logical_date, run_type. The plan is logged as a table (what a dry run shows).
    """
    return _build_plan(run, config_path, params).to_xcom()


def make_split_plan(run: dict, config_path: str | None = None, params: dict | None = None) -> tuple[dict, dict]:
    """`make_plan` as the `plan` task pushes it: the plan without its cases (its return value) and the case slices,
    one XCom each (`RunPlan.split`; the tasks read them with `plan_cases`)."""
    return _build_plan(run, config_path, params).split()


def plan_cases(plan, ti, hosts: list[str] | None = None, plan_task_id: str = "plan") -> RunPlan:
    """The run's plan with the cases of `hosts` (None: every case) read from the `plan` task's slices."""
    return RunPlan.load(plan).with_cases(lambda key: ti.xcom_pull(task_ids=plan_task_id, key=key), hosts)


def _build_plan(run: dict, config_path: str | None, params: dict | None) -> RunPlan:
    from fleetbench.capacity import plan_capacity
    from fleetbench.params import apply_params, whole_numbers
    from fleetbench.plan import build_plan, plan_table

    params = whole_numbers(params)
    path = Path(config_path or default_config_path())
    plan = build_plan(apply_params(load_config(path), params), {**run, "config_path": str(path)}, params)
    if not plan.cases:
        if (params or {}).get("hosts"):  # the run's own choice left nothing, not the config
            raise ValueError(f"hosts parameter {list(params['hosts'])}: no case of {path} is left on these hosts "
                             "(a multi-node case runs only with every host of its configured set)")
        raise ValueError(f"{path}: the plan has no cases (check benchmarks[*].hosts)")
    plan = plan_capacity(plan)  # each case's predicted peak memory against its capacity (skip, warn or run)
    log.info("plan: %d case(s) on %d host(s) from %s%s\n%s", len(plan.cases), len(plan.hosts), path,
             " (dry run: nothing will be pulled, run or stored)" if plan.run.dry_run else "", plan_table(plan.cases))
    return plan


def check_lanes(plan, task_ids) -> None:
    """Every host the run plans has a lane among the run's tasks (`task_ids`, what the scheduler created from the DAG
    as last parsed). The plan reads the fleet config when the run starts; a host added since the dag-processor's
    last parse has no lane yet, and its cases would be recorded as host_check_failed in a run that succeeds."""
    have = set(task_ids)
    missing = [h.name for h in RunPlan.load(plan).hosts if f"{runs.lane_id(h.name)}.cases" not in have]
    if missing:
        raise ValueError(f"host(s) {', '.join(missing)} of the fleet config have no lane in this run: the config "
                         "changed after the DAG was last parsed; trigger the run again once the dag-processor has "
                         "parsed it (its min_file_process_interval)")


def planned_hosts(plan) -> list[str]:
    """The names of the hosts the run plans (its lanes), as the plan task read the fleet config."""
    return [h.name for h in RunPlan.load(plan).hosts]


def planned_host(plan, name: str) -> dict | None:
    """The host as planned for this run; None when the run has no case on it (e.g. a `hosts` parameter)."""
    host = RunPlan.load(plan).host(name)
    return host.to_xcom() if host else None


def proceed(plan, validations: list, whole_run: bool = False) -> bool:
    """False for a dry run: log the verdicts and stop before anything is pulled or run. With `whole_run` (`store`,
    which gets every lane's verdict), a dry run in which a planned host got no verdict (its lane's task failed: the
    check crashed or never ran) fails, naming the hosts: a dry run is there to validate the hosts, and it ended
    green with that host unmentioned."""
    plan = RunPlan.load(plan)
    if not plan.run.dry_run:
        return True
    verdicts = [HostVerdict.load(v) for v in validations if v]
    for v in verdicts:
        log.info("dry run: host %s is %s%s", v.host, v.verdict, f" ({v.reasons})" if v.reasons else "")
    log.info("dry run: %d case(s) planned; stopping here", plan.case_count)
    checked = {v.host for v in verdicts}
    missing = [h.name for h in plan.hosts if h.name not in checked]
    if whole_run and missing:
        from airflow.sdk.exceptions import AirflowFailException

        raise AirflowFailException(
            "dry run: the check of host(s) " + ", ".join(missing) + " did not finish (see the task log of "
            + ", ".join(f"{runs.lane_id(h)}.cases" for h in missing) + ")")
    return False


# -- validate host ----------------------------------------------------------------------------
def validate_host(host, run, timeout_s: float | None = None) -> dict:
    """Check the host into the run's artifact folder (`fleetbench.hosts.check.check_host`): its facts, judged
    against what its cases need. An unreachable host, or a check past `timeout_s`, is a verdict, not a crash."""
    from fleetbench.hosts.check import check_host

    host, run = PlannedHost.load(host), RunInfo.load(run)
    result = check_host(host, runs.facts_dir(run.dag_id, run.run_id, host.name), timeout_s)
    log.info("host %s: %s%s", host.name, result.verdict, f" ({result.reasons})" if result.reasons else "")
    return result.to_xcom()


# -- prepare image ----------------------------------------------------------------------------
def needed_images(plan, host: str, validation) -> set[str]:
    """The images of the host's cases (its own and the multi-node ones it is in) that one of them can run on it: an
    image whose every case there is skipped on the host's devices (`driver_too_old`: the driver cannot run its CUDA,
    `too_few_gpus`, `mig_enabled`, `mig_unavailable`) is not pulled (~15 GB of an NGC image, every night)."""
    from fleetbench.hosts.devices import assign

    facts = HostVerdict.load(validation).host_facts
    return {c.image for c in RunPlan.load(plan).cases if host in c.hosts and not assign(c, facts).skipped}


def prepare_host_images(host, validations: list, needed: set[str] | None = None) -> dict:
    """Check disk, pull, pin and (if configured) bake every image the host's cases need (of `needed`, when given),
    on the host's own engine.

    Each image's result is `fleetbench.images.PreparedImage` as a dict: cases run its `pinned_ref`
    (the pulled digest, or the baked image's id); `digest` stays the pulled image's registry digest. An image left
    out of `needed` has no entry: its cases are recorded with why their devices refused them.
    """
    host = PlannedHost.load(host)
    validation = by_host(HostVerdict.load(v) for v in validations if v).get(host.name)
    if validation is None or validation.unfit:
        return HostImages(host=host.name, skipped=True).to_xcom()
    from docker.errors import DockerException

    from fleetbench.engines import api_version_of, engine_client
    from fleetbench.images import PreparedImage

    def unreachable(why: str) -> dict:
        log.error("host %s: Docker engine %s %s", host.name, host.docker_url, why)
        return HostImages(host=host.name, images={i.name: PreparedImage(
            i.name, i.ref, failure_class="docker_unreachable", error=why).to_dict() for i in host.images}).to_xcom()

    with ExitStack() as stack:
        try:
            api = stack.enter_context(engine_client(host.docker_url, host.docker_tls_conn_id))
        except ValueError as exc:  # a missing or incomplete TLS connection: the engine cannot be reached
            return unreachable(f"TLS client configuration: {exc}")
        except DockerException as exc:  # the engine did not answer (e.g. over TLS, refused the certificate)
            return unreachable(f"Docker engine not reachable: {exc}")
        free_hint = validation.facts.get("docker_root_free_bytes")
        unused = [i.name for i in host.images if needed is not None and i.name not in needed]
        if unused:
            log.info("host %s: not pulling %s: none of the host's cases can run there (see their skip class)",
                     host.name, ", ".join(unused))
        images = {}
        for spec in host.images:
            if spec.name in unused:
                continue
            try:
                images[spec.name] = _prepare_one(api, spec, free_hint)
            except (DockerException, requests.RequestException) as exc:  # the engine broke off: this image's, named
                log.error("host %s: image %s: Docker engine %s: %s", host.name, spec.name, host.docker_url, exc)
                images[spec.name] = PreparedImage(spec.name, spec.ref, failure_class="docker_unreachable",
                                                  error=f"Docker engine not reachable: {exc}"[:2000]).to_dict()
            if free_hint is not None and str(getattr(api, "base_url", "")) != "http+docker://localhost":
                # a remote engine (a local one's free space is measured before each pull): the host check's df,
                # less what each image took since
                free_hint = max(0, free_hint - _bytes_added(api, images[spec.name]))
        return HostImages(host=host.name, images=images, api_version=api_version_of(api)).to_xcom()


def _bytes_added(api, prepared: dict) -> int:
    """What preparing one image added to the engine's data root, at most: what its pull added
    (`fleetbench.prepare.pulled_bytes`: nothing for an image the engine had), and a fresh bake's own layer. The next
    image's min_free_gb check on a remote engine is made against the host check's free space less this."""
    from docker.errors import DockerException

    from fleetbench.prepare import pulled_bytes

    def size(ref: str | None) -> int:
        return int(api.inspect_image(ref).get("Size") or 0) if ref else 0

    added = 0
    try:
        if prepared.get("pulled"):  # the pulled image: a baked one's base
            pulled = prepared.get("base_pinned_ref") or prepared.get("pinned_ref") or prepared["ref"]
            added += pulled_bytes(api, pulled, prepared.get("fetched_layers"))
        if prepared.get("baked_id") and not prepared.get("bake_cache_hit"):
            added += max(0, size(prepared["baked_id"]) - size(prepared.get("base_pinned_ref")))
    except (DockerException, requests.RequestException):
        pass
    return added


def _prepare_one(api, spec, free_hint: int | None) -> dict:
    """One image: registry credentials for its registry only (`fleetbench.airflow.connections`), then `prepare`."""
    from fleetbench.airflow.connections import registry_auth
    from fleetbench.images import PreparedImage
    from fleetbench.prepare import prepare
    from fleetbench.registry import registry_of, server_host

    try:
        auth = registry_auth(spec.credentials_conn_id, registry_of(spec.ref))
        push_auth = (registry_auth(spec.bake.push_conn_id, server_host(spec.bake.push_to))
                     if spec.bake and spec.bake.push_to else None)
    except Exception as exc:  # a missing or broken connection is a named failure, not a crash
        return PreparedImage(spec.name, spec.ref, failure_class="registry_auth",
                             error=f"registry credentials: {exc}").to_dict()
    return prepare(api, spec, auth_config=auth, push_auth_config=push_auth, free_bytes_hint=free_hint).to_dict()


# -- collect ----------------------------------------------------------------------------------
def collect(plan, validations: list, prepared: list, outcomes: list) -> dict:
    """One classified row per planned case: measured, failed, or skipped with the reason. Nothing is dropped.

    Cases were measured by their own tasks (`fleetbench.measure.measure`); a task that died before
    returning left its outcome file next to its log, read here through `fleetbench.runs.outcome_path`
    (`fleetbench.measure.collect_rows`)."""
    from fleetbench.measure import collect_rows

    verdicts = by_host(HostVerdict.load(v) for v in validations if v)
    images = by_host(HostImages.load(p) for p in prepared if p)
    collected = collect_rows(RunPlan.load(plan), verdicts, images, [o for o in outcomes if o])
    return {**collected, "validations": [v.to_xcom() for v in verdicts.values()]}


# -- store ------------------------------------------------------------------------------------
def store(plan, collected: dict) -> dict:
    """Derive the metrics of every row and store the run whole, in one transaction (`fleetbench.warehouse`)."""
    from fleetbench.metrics import MetricSettings, derive, load_catalog_or_none
    from fleetbench.warehouse import get_engine, store_run, upgrade
    from fleetbench.warehouse.rows import host_row, run_row

    plan = RunPlan.load(plan)
    run = plan.run
    if not collected:
        raise RuntimeError(f"run {run.run_id}: the collect step did not finish (see the `store` task's log), so there "
                           "are no rows to store; clear `store` to collect and store the run again")
    # Derived metrics (training time, step spread, speedup, cost, energy) on every row before it is written.
    rows = derive(collected["rows"], collected["steps"], load_catalog_or_none(), MetricSettings.from_plan(plan))
    counts = {s: sum(1 for r in rows if r["status"] == s) for s in (OK, FAILED, SKIPPED)}
    hosts = [host_row(run, HostVerdict.load(v)) for v in collected["validations"]]
    engine = get_engine()
    try:
        upgrade(engine)
        # The counts as stored: a row that could not be stored as measured is failed (store_error) there.
        stored = store_run(engine, run_row(run, counts, len(rows)), hosts, rows, collected["steps"],
                           metric_rows=collected.get("metrics", ()))
    finally:
        engine.dispose()
    counts = {s: stored[s] for s in (OK, FAILED, SKIPPED)}
    log.info("stored %d result row(s) for run %s: %s", stored["written"], run.run_id, counts)
    return {**counts, "total": stored["total"], "run_id": run.run_id,
            "every_host_unfit": every_host_unfit(collected["validations"])}


# -- compare ----------------------------------------------------------------------------------
def detect_regressions(plan, stored: dict, triggered_by: str | None = None) -> dict:
    """The night against its baselines (`fleetbench.regression.night.assess_night`): findings stored, logged and
    mailed, `accept_baselines` applied. Returns a small summary for the run (counts and the first findings)."""
    from fleetbench.regression.night import assess_night

    run = RunPlan.load(plan).run
    if stored.get("run_id") not in (None, run.run_id):
        raise ValueError(f"stored rows of run {stored['run_id']!r}, not of {run.run_id!r}")
    return assess_night(run, triggered_by)


# -- report -----------------------------------------------------------------------------------
# The Airflow Asset the report task updates: other DAGs can be scheduled on new results.
WAREHOUSE_ASSET_NAME = "fleetbench_warehouse"
WAREHOUSE_ASSET_URI = "x-fleetbench://warehouse/benchmark_results"


def write_report(plan: dict, stored: dict | None) -> dict:
    """Write the fleet's report (`fleetbench.report.write_report`: HTML, a `plot-*.svg` per plot, JSON; this DAG's
    results of the last 30 days with results) into `<FLEETBENCH_DATA_DIR>/reports/` once the run's rows are stored.
    Returns where it is and the run's counts: the extra of the `fleetbench_warehouse` asset event.

    A report that cannot be written fails the `report` task, never the rows: they are stored (and compared)
    before it is written. It fails rather than logging and going on, because a report that silently stops
    updating misleads the people who read it; the task is a leaf, so the run fails, and clearing it writes the
    report again. The asset event is emitted only with a report, so a DAG that reacts to it finds the report
    in place.
    """
    from fleetbench.report import parse_filters
    from fleetbench.report import write_report as write

    run = RunPlan.load(plan).run
    if not stored or stored.get("run_id") != run.run_id:
        raise RuntimeError(f"the rows of run {run.run_id} were not stored, so there is nothing new to report")
    from fleetbench.capacity import settings_of

    # The capacity section fits with the fleet's own capacity settings (window, margin, points), as the plan did.
    written = write(filters=parse_filters(dag_id=run.dag_id), capacity_settings=settings_of(run.fleet_settings),
                    plot_format="svg")
    log.info("report of %d result(s) of %d run(s) written to %s (%d plot(s))", written["summary"]["results"],
             written["summary"]["runs"], written["html"], len(written["plots"]))
    return {"dag_id": run.dag_id, "run_id": run.run_id, "report": written["html"], "state": written["state"],
            **{k: stored.get(k) for k in ("total", OK, FAILED, SKIPPED)}}


def assess_and_report(plan, stored: dict | None, triggered_by: str | None = None) -> tuple[dict, dict]:
    """The `report` task: the night against its baselines (`detect_regressions`), then the report
    (`write_report`). Returns (the report's summary, the regressions' summary).

    One task rather than two (a `compare` task before `report`): on a scheduler each task costs about a second
    of scheduling and process start, on the path from the last case to the end of the run. The report is
    written also when the comparison fails (from what is stored); the task then fails with the comparison's
    error, so the run fails and the `fleetbench_warehouse` asset is not marked updated for that night."""
    if not stored:
        return write_report(plan, stored), {}  # raises: the rows were not stored, there is nothing to report
    try:
        regressions = detect_regressions(plan, stored, triggered_by)
    except Exception:
        try:
            write_report(plan, stored)
            log.info("the report was written; the comparison's error follows")
        except Exception as exc:  # the comparison's error is the one the task reports
            log.error("the report could not be written either: %s", exc)
        raise
    return write_report(plan, stored), regressions


FAILED_TASK_STATES = ("failed", "upstream_failed")


def failed_tasks(ti, dag_id: str, run_id: str) -> list[str]:
    """`task_id` (`task_id_<map index>` for a mapped one) of each task of the run that failed or whose upstream did."""
    states = ti.get_task_states(dag_id=dag_id, run_ids=[run_id]).get(run_id, {})
    return sorted(t for t, state in states.items() if state in FAILED_TASK_STATES)


def every_host_unfit(validations: list) -> str | None:
    """When every host of the run is unfit (nothing ran): one message naming each host and why; else None."""
    verdicts = [HostVerdict.load(v) for v in validations if v]
    if verdicts and all(v.unfit for v in verdicts):
        return "every host is unfit, nothing ran: " + "; ".join(f"{v.host}: {v.reasons}" for v in verdicts)
    return None


def fail_if_tasks_failed(ti, dag_id: str, run_id: str, every_host_unfit: str | None = None) -> None:
    """Fail (no retry) with one message when every host of the run was unfit (`every_host_unfit`, the store
    task's), or naming the run's failed tasks; their cases are recorded with a failure class all the same."""
    from airflow.sdk.exceptions import AirflowFailException

    problems = [every_host_unfit] if every_host_unfit else []
    failed = failed_tasks(ti, dag_id, run_id)
    if failed:
        shown = ", ".join(failed[:20]) + (f" and {len(failed) - 20} more" if len(failed) > 20 else "")
        problems.append(f"{len(failed)} task(s) of this run failed: {shown}; "
                        "their cases are recorded in the warehouse with the failure class")
    if problems:
        raise AirflowFailException(". ".join(problems))
    log.info("no task of run %s failed", run_id)
