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
import signal
import threading
import time
from contextlib import ExitStack, contextmanager
from datetime import datetime, timezone
from pathlib import Path

from fleetbench import runs
from fleetbench.config import GB, load_config
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
    from fleetbench.capacity import plan_capacity
    from fleetbench.params import apply_params
    from fleetbench.plan import build_plan, plan_table

    path = Path(config_path or default_config_path())
    plan = build_plan(apply_params(load_config(path), params), {**run, "config_path": str(path)}, params)
    if not plan.cases:
        raise ValueError(f"{path}: the plan has no cases (check benchmarks[*].hosts)")
    plan = plan_capacity(plan)  # each case's predicted peak memory against its capacity (skip, warn or run)
    log.info("plan: %d case(s) on %d host(s) from %s%s\n%s", len(plan.cases), len(plan.hosts), path,
             " (dry run: nothing will be pulled, run or stored)" if plan.run.dry_run else "", plan_table(plan.cases))
    return plan.to_xcom()


def planned_host(plan, name: str) -> dict | None:
    """The host as planned for this run; None when the run has no case on it (e.g. a `hosts` parameter)."""
    host = RunPlan.load(plan).host(name)
    return host.to_xcom() if host else None


def proceed(plan, validations: list) -> bool:
    """False for a dry run: log the verdicts and stop before anything is pulled or run."""
    plan = RunPlan.load(plan)
    if not plan.run.dry_run:
        return True
    for v in (HostVerdict.load(v) for v in validations if v):
        log.info("dry run: host %s is %s%s", v.host, v.verdict, f" ({v.reasons})" if v.reasons else "")
    log.info("dry run: %d case(s) planned; stopping here", len(plan.cases))
    return False


# -- validate host ----------------------------------------------------------------------------
def validate_host(host, run, timeout_s: float | None = None) -> dict:
    """Gather the host's facts into the run's artifact folder and judge them against the host's needs.

    When the host's cases need GPUs, a GPU smoke container runs too (`gpu_smoke_image`, else the
    host's benchmark image of the oldest CUDA: `smoke_default`). An unreachable host is a verdict
    (`reachable: fail`), not a crash; so is a check that has not ended after `timeout_s` (every probe
    has its own timeout: this is the backstop for one that hangs regardless, e.g. in an SSH library).
    """
    from fleetbench.hosts import HostFacts, HostNeeds, evaluate, facts_from_dir, gather, reasons, runner_for, verdict
    from fleetbench.hosts.probes import health_probes

    host, run = PlannedHost.load(host), RunInfo.load(run)
    folder = runs.facts_dir(run.dag_id, run.run_id, host.name)
    needs = HostNeeds(gpus=host.needs.gpus, image_cuda=host.needs.image_cuda, min_free_bytes=int(host.min_free_gb * GB),
                      health=host.gpu_health.thresholds(), whole_gpus=host.needs.whole_gpus, mig=dict(host.needs.mig))
    smoke_image = (host.gpu_smoke_image or smoke_default(host.images)) if needs.gpus else None
    health = (health_probes(host.gpu_health.xid_window_hours, host.gpu_health.dcgm_diag_level) if needs.gpus
              else ())
    try:
        with deadline(timeout_s, f"the host check of {host.name} did not end within {timeout_s} s"):
            gather(runner_for(host.connection, host.docker_url), folder, gpu_smoke_image=smoke_image, extra=health,
                   path=tuple(host.probe_path))
        facts = facts_from_dir(folder)
    except (Exception, DeadlinePassed) as exc:  # e.g. the artifact folder cannot be written: still a verdict
        log.exception("gathering facts on %s failed", host.name)
        facts = HostFacts(unreachable=f"facts could not be gathered: {exc}")
    if host.connection != "local" and facts.docker_engine_id and not facts.unreachable:
        facts.case_engine_id = case_engine_id(host)  # the `engine` check: are the probes' and the cases' one?
    checks = evaluate(facts, needs)
    result = HostVerdict(host=host.name, verdict=verdict(checks), reasons=reasons(checks),
                         checks=[c.to_dict() for c in checks], facts=facts.to_dict(), facts_dir=str(folder),
                         collected_at=datetime.now(timezone.utc).isoformat())
    log.info("host %s: %s%s", host.name, result.verdict, f" ({result.reasons})" if result.reasons else "")
    return result.to_xcom()


def smoke_default(images) -> str | None:
    """The GPU smoke container's image when the host names none: of its benchmark images the one of the oldest CUDA
    (one whose CUDA the driver cannot run would fail the smoke container, and the host with it, for that image
    alone), else the first."""
    known = [i for i in images if i.cuda]
    if known:
        return min(known, key=lambda i: tuple(int(p) for p in i.cuda.split("."))).ref
    return images[0].ref if images else None


def case_engine_id(host) -> str | None:
    """The ID of the Docker engine at the host's docker_url (the one its images and cases go to), as `docker info`
    gives it; None when it does not answer (the image step then says so: docker_unreachable)."""
    from fleetbench.engines import engine_client

    try:
        with engine_client(host.docker_url, host.docker_tls_conn_id, timeout=60) as api:
            engine_id = api.info().get("ID")
    except Exception as exc:  # noqa: BLE001 - unreachable, TLS settings: not this check's verdict
        log.warning("host %s: the Docker engine at %s did not say its ID: %s", host.name, host.docker_url, exc)
        return None
    return engine_id if isinstance(engine_id, str) and engine_id else None


class DeadlinePassed(BaseException):
    """Raised by `deadline` when its time is up. Not an Exception (and so not an OSError, as TimeoutError is): the
    probes' runners turn OSErrors into a failed probe or an unreachable host and go on, which would swallow it."""


@contextmanager
def deadline(seconds: float | None, message: str):
    """Raise DeadlinePassed(message) in this thread once `seconds` have passed (SIGALRM: the main thread of a task's
    process, where an operator runs). None, or not the main thread: no deadline. An alarm already set (Airflow's
    execution_timeout) is set again afterwards for the time it had left."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum, frame):
        raise DeadlinePassed(message)

    started = time.monotonic()
    previous = signal.signal(signal.SIGALRM, expired)
    outer, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - started), 0.001))


# -- prepare image ----------------------------------------------------------------------------
def prepare_host_images(host, validations: list) -> dict:
    """Check disk, pull, pin and (if configured) bake every image the host's cases need, on the host's own engine.

    Each image's result is `fleetbench.images.PreparedImage` as a dict: cases run its `pinned_ref`
    (the pulled digest, or the baked image's id); `digest` stays the pulled image's registry digest.
    """
    host = PlannedHost.load(host)
    validation = by_host(HostVerdict.load(v) for v in validations if v).get(host.name)
    if validation is None or validation.unfit:
        return HostImages(host=host.name, skipped=True).to_xcom()
    from docker.errors import DockerException

    from fleetbench.engines import engine_client
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
        images = {i.name: _prepare_one(api, i, free_hint) for i in host.images}
    return HostImages(host=host.name, images=images).to_xcom()


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
    returning left its outcome file next to its log, read here through `fleetbench.runs.outcome_path`."""
    from fleetbench.airflow.multinode import set_problem
    from fleetbench.measure import case_fields, not_run, outcome_from_file, planned_metric, result_row
    from fleetbench.warehouse.rows import metric_sample_rows

    plan = RunPlan.load(plan)
    run = plan.run
    verdicts = by_host(HostVerdict.load(v) for v in validations if v)
    images = by_host(HostImages.load(p) for p in prepared if p)
    done = {(o["host"], o["case_key"]): o for o in outcomes if o}
    rows, step_rows, metric_rows = [], [], []
    for case in plan.cases:
        verdict, host_images = verdicts.get(case.host), images.get(case.host)
        image = host_images.images.get(case.image) if host_images else None
        outcome = done.get((case.host, case.case_key))
        problem = set_problem(case, verdicts, images) if case.nodes > 1 else None
        if outcome is None and problem is None and verdict is not None and not verdict.unfit:
            outcome = outcome_from_file(str(runs.case_log_dir(run.dag_id, run.run_id, case.host)), case.case_key)
        if problem is not None and outcome is None:  # a host of the set could not run it
            fields, steps = {**not_run(*problem), **planned_metric(case)}, []
        else:
            fields, steps = case_fields(case, verdict, image, outcome)
        fields = dict(fields)
        samples = fields.pop("metric_samples", None) or []
        rows.append({**result_row(run, case, verdict, image, fields),
                     "attempt_id": _attempt_id(run, case, verdict, image, outcome, fields)})
        key = {"dag_id": run.dag_id, "run_id": run.run_id, "host": case.host, "case_key": case.case_key}
        step_rows += [{**key, **s} for s in steps]
        metric_rows += metric_sample_rows(key, samples)
    return {"rows": rows, "steps": step_rows, "metrics": metric_rows,
            "validations": [v.to_xcom() for v in verdicts.values()]}


def _attempt_id(run, case, verdict, image: dict | None, outcome: dict | None, fields: dict) -> str:
    """The attempt's identity (`fleetbench.warehouse.attempts`): its container outcome when the case ran;
    else the run's start and the host check's time, which a cleared and rerun run renews."""
    from fleetbench.warehouse.attempts import attempt_id

    ran = verdict is not None and not verdict.unfit and not (image or {}).get("failure_class")
    return attempt_id(case.host, case.case_key, outcome if ran else None,
                      (run.started_at, verdict.collected_at if verdict else None, fields["status"],
                       fields["failure_class"]))


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
SUMMARY_FINDINGS = 50  # findings listed in the report task's return value (XCom); all are stored and logged


class NothingToAccept(ValueError):
    """An `accept_baselines` item that matched no ok result of the DAG (raised after the night's findings are
    stored and mailed)."""


def detect_regressions(plan, stored: dict, triggered_by: str | None = None) -> dict:
    """Compare each stored (host, case) of the run with its baseline (`fleetbench.regression`): store the
    findings in `regressions` (replacing an earlier detection of the run), log them, mail them when
    `fleet.notify` is set. Returns a small summary for the run (counts and the first findings).

    With the `accept_baselines` parameter, the named hosts' (and cases') current level becomes their
    baseline once the night is assessed (`fleetbench.regression.accept_many`, as `fleetbench regressions
    accept`), and the night is assessed again; an item that matches nothing fails the task, naming it."""
    from fleetbench.notify import notify
    from fleetbench.params import accept_targets
    from fleetbench.regression import accept_many, assess_run, describe, store_findings
    from fleetbench.regression.store import mark_mailed, to_mail
    from fleetbench.warehouse import get_engine

    run = RunPlan.load(plan).run
    if stored.get("run_id") not in (None, run.run_id):
        raise ValueError(f"stored rows of run {stored['run_id']!r}, not of {run.run_id!r}")
    fleet = run.fleet_settings
    items = list(run.params.get("accept_baselines") or [])
    accepted, unmatched = [], []
    engine = get_engine()
    try:
        result = assess_run(engine, run.dag_id, run.run_id, fleet.regressions)
        store_findings(engine, run.dag_id, run.run_id, result.findings)
        if items:
            targets = accept_targets(items)
            done = accept_many(engine, targets, run.dag_id, accepted_by=triggered_by or run.dag_id,
                               note=f"accept_baselines of run {run.run_id}", settings=fleet.regressions,
                               assessed_by_caller=(run.dag_id, run.run_id))
            for item, target in zip(items, targets):
                unmatched += [] if done[target] else [item]
                for a in done[target]:
                    log.info("accepted %s %s from %s on as the new baseline (%s)", a["host"], a["case_key"],
                             a["since"].isoformat(), "the open regression's level" if a["had_open_regression"]
                             else "the newest segment")
                    accepted.append(f"{a['host']}/{a['case_key']} since {a['since'].isoformat()}")
            result = assess_run(engine, run.dag_id, run.run_id, fleet.regressions)
            store_findings(engine, run.dag_id, run.run_id, result.findings)
        # Mailed: each change once, the first night it is confirmed at notify.min_severity or worse (not again as
        # cost or energy, nor the next night through another metric, nor by a backfill or a cleared task), until a
        # send is on record: fleetbench.regression.store.to_mail
        news = (to_mail(engine, run.dag_id, result.confirmed, fleet.notify.min_severity) if fleet.notify is not None
                else [f for f in result.confirmed if f.get("newly_confirmed") and not f.get("same_change_as")])
    finally:
        engine.dispose()
    confirmed = result.confirmed
    log.info("compared %d case(s) with their baseline; %d without enough history; %d confirmed regression(s) "
             "(%d newly), %d suspected, %d improvement(s)", result.checked, len(result.insufficient_history),
             len(confirmed), sum(1 for f in confirmed if f.get("newly_confirmed")),
             sum(1 for f in result.regressions if f["status"] == "suspected"), len(result.improvements))
    for imp in result.improvements:
        log.info("improvement (%s): %s %s: %s %+.1f %%", imp["status"], imp["host"], imp["case_key"], imp["metric"],
                 imp["delta_pct"])
    for f in result.regressions:
        if f["status"] == "suspected":
            log.info("suspected (one night, not confirmed): %s", describe(f))
    sent = notify(news, fleet.notify, run.to_xcom())
    if sent["mailed"]:  # only once sent: a mail that failed is sent the next night
        engine = get_engine()
        try:
            mark_mailed(engine, news)
        finally:
            engine.dispose()
    if unmatched:
        raise NothingToAccept("accept_baselines: " + "; ".join(
            f"{item!r} matched no ok result of {run.dag_id} (nothing accepted for it)" for item in unmatched))
    return {
        "run_id": run.run_id, "checked": result.checked, "insufficient_history": len(result.insufficient_history),
        "regressions": len(confirmed), "changes": sum(1 for f in confirmed if not f.get("same_change_as")),
        "newly_confirmed": sum(1 for f in confirmed if f.get("newly_confirmed") and not f.get("same_change_as")),
        "major": sum(1 for f in confirmed if f["severity"] == "major"),
        "suspected": sum(1 for f in result.regressions if f["status"] == "suspected"),
        "improvements": len(result.improvements), "mailed": sent["mailed"], "accepted": accepted,
        "findings": [{k: (round(f[k], 3) if isinstance(f[k], float) else f[k])
                      for k in ("host", "case_key", "metric", "baseline_value", "value", "delta_pct", "z_score",
                                "severity", "kind", "status", "same_change_as")}
                     | {"changed": sorted(f["changes"])} for f in result.findings[:SUMMARY_FINDINGS]],
    }


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
