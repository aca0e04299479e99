"""The warehouse's current state as OpenMetrics text, for Prometheus: the view's `/fleetbench/metrics`.

What a fleet operator alerts on, one scrape's worth (not the history: that is the report's):

    fleetbench_images_per_second{dag_id,host,case_key,model,num_gpus,gpu}   the newest ok result's images/sec
    fleetbench_case_value{...same,metric,unit,better}                     that result's primary metric (any harness)
    fleetbench_case_energy_joules{...same}, fleetbench_case_cost_usd{...}  that result's energy and cost
    fleetbench_case_logical_date_seconds{...same}                         the night it was measured
    fleetbench_open_regressions{dag_id,host,severity}                     open findings (see report.queries)
    fleetbench_host_verdict{dag_id,host,verdict}                          1 for the newest check's verdict, else 0
    fleetbench_last_run_timestamp_seconds{dag_id}                         when the newest run finished
    fleetbench_last_run_age_seconds{dag_id}                               how long ago that was
    fleetbench_last_run_cases{dag_id,status}                              that run's cases by status

`gpu` is the result's GPU (catalog name, else the model as reported), empty for a CPU case (`num_gpus` 0: the
host's GPU idled, as in the rollups). Results and host checks older than `WINDOW_DAYS` before the newest result
are left out (a retired host or case drops out of the scrape). Only the DAGs in `Filters.dag_ids` are read, as
in the rest of the view.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from sqlalchemy import and_, case, func, select

from fleetbench.report.queries import Filters, aware, open_regressions
from fleetbench.warehouse.schema import benchmark_results as br
from fleetbench.warehouse.schema import host_facts, runs

CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
WINDOW_DAYS = 30
VERDICTS = ("ready", "degraded", "unfit")
SEVERITIES = ("minor", "major")
# mig_profile (empty: whole GPUs), nodes (1: one host) and host_set (empty: one host) keep a MIG slice and a multi-node
# total apart from the whole-GPU, one-host series of the same num_gpus and gpu, which alerts aggregate by.
CASE_LABELS = ("dag_id", "host", "case_key", "model", "num_gpus", "gpu", "mig_profile", "nodes", "host_set")


@dataclass
class Family:
    """One metric family: its samples as (labels, value)."""

    name: str
    help: str
    unit: str = ""
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)

    def add(self, labels: dict, value) -> None:
        if value is not None and math.isfinite(float(value)):
            self.samples.append(({k: "" if v is None else str(v) for k, v in labels.items()}, float(value)))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    return repr(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)


def render(families: list[Family]) -> str:
    """OpenMetrics text: every family as a gauge with HELP (and UNIT), its samples, then `# EOF`."""
    lines = []
    for fam in families:
        lines.append(f"# TYPE {fam.name} gauge")
        if fam.unit:
            lines.append(f"# UNIT {fam.name} {fam.unit}")
        lines.append(f"# HELP {fam.name} {_escape(fam.help)}")
        for labels, value in fam.samples:
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            lines.append(f"{fam.name}{{{text}}} {_number(value)}" if text else f"{fam.name} {_number(value)}")
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def _dags(table, f: Filters) -> list:
    return [table.c.dag_id.in_(sorted(f.dag_ids))] if f.dag_ids is not None else []


def _epoch(value) -> float | None:
    moment = aware(value)
    return moment.timestamp() if moment is not None else None


def latest_results(conn, f: Filters, since: datetime | None) -> list[dict]:
    """The newest ok result of every (DAG, host, case) since `since`: one row each (the newest stored wins a tie)."""
    conds = [br.c.status == "ok", *_dags(br, f)] + ([br.c.logical_date >= since] if since is not None else [])
    newest = (select(br.c.dag_id, br.c.host, br.c.case_key, func.max(br.c.logical_date).label("d"))
              .where(*conds).group_by(br.c.dag_id, br.c.host, br.c.case_key).subquery())
    rows = conn.execute(
        select(br.c.dag_id, br.c.host, br.c.case_key, br.c.model, br.c.num_gpus,
               case((br.c.num_gpus > 0, func.coalesce(br.c.gpu_catalog_name, br.c.gpu_model))).label("gpu"),
               br.c.mig_profile, func.coalesce(br.c.nodes, 1).label("nodes"), br.c.host_set, br.c.images_per_sec,
               br.c.metric, br.c.value, br.c.unit, br.c.better, br.c.energy_j, br.c.cost_usd, br.c.logical_date)
        .join(newest, and_(br.c.dag_id == newest.c.dag_id, br.c.host == newest.c.host,
                           br.c.case_key == newest.c.case_key, br.c.logical_date == newest.c.d))
        .where(br.c.status == "ok")
        .order_by(br.c.dag_id, br.c.host, br.c.case_key, br.c.stored_at)).mappings().all()
    return list({(r["dag_id"], r["host"], r["case_key"]): dict(r) for r in rows}.values())


def latest_verdicts(conn, f: Filters, since: datetime | None) -> dict[tuple[str, str], str]:
    """{(DAG, host): the verdict of its newest check since `since`}."""
    conds = _dags(host_facts, f) + ([host_facts.c.collected_at >= since] if since is not None else [])
    newest = (select(host_facts.c.dag_id, host_facts.c.host, func.max(host_facts.c.collected_at).label("t"))
              .where(*conds).group_by(host_facts.c.dag_id, host_facts.c.host).subquery())
    rows = conn.execute(
        select(host_facts.c.dag_id, host_facts.c.host, host_facts.c.verdict)
        .join(newest, and_(host_facts.c.dag_id == newest.c.dag_id, host_facts.c.host == newest.c.host,
                           host_facts.c.collected_at == newest.c.t))
        .order_by(host_facts.c.dag_id, host_facts.c.host, host_facts.c.run_id)).all()
    return {(r.dag_id, r.host): r.verdict for r in rows}


def latest_runs(conn, f: Filters) -> list[dict]:
    """The newest run (by logical date) of every DAG."""
    newest = (select(runs.c.dag_id, func.max(runs.c.logical_date).label("d")).where(*_dags(runs, f))
              .group_by(runs.c.dag_id).subquery())
    rows = conn.execute(
        select(runs).join(newest, and_(runs.c.dag_id == newest.c.dag_id, runs.c.logical_date == newest.c.d))
        .order_by(runs.c.dag_id, runs.c.finished_at)).mappings().all()
    return list({r["dag_id"]: dict(r) for r in rows}.values())


def collect(engine, f: Filters | None = None, now: datetime | None = None) -> list[Family]:
    """Every family, read in one connection. A warehouse without tables yet (nothing stored) has none: the page is
    just `# EOF`, an answer, not an outage. A warehouse at an older revision raises SchemaBehind, saying so."""
    from sqlalchemy import inspect

    from fleetbench.warehouse import SchemaBehind, schema_behind

    if "benchmark_results" not in inspect(engine).get_table_names():
        return []
    if behind := schema_behind(engine):  # not an outage, nor an empty answer: an upgrade to run
        raise SchemaBehind(behind)
    f = f or Filters()
    now = now or datetime.now(timezone.utc)
    ips = Family("fleetbench_images_per_second", "Throughput of the newest ok result of each host and case.")
    primary = Family("fleetbench_case_value", "The primary metric of the newest ok result of each host and case "
                     "(images/sec, NCCL bus bandwidth, a team's own), with its metric, unit and which way is better.")
    energy = Family("fleetbench_case_energy_joules", "Energy of that result (measured or estimated).", "joules")
    cost = Family("fleetbench_case_cost_usd", "Cost of that result at the host's price.")
    night = Family("fleetbench_case_logical_date_seconds", "Logical date (Unix time) of that result's run.",
                   "seconds")
    regressions = Family("fleetbench_open_regressions",
                         "Open changes (regressions found in the newest ok result of their host and case, each "
                         "change once), per severity.")
    verdict = Family("fleetbench_host_verdict", "1 for the verdict of the host's newest check, 0 for the others.")
    last_ts = Family("fleetbench_last_run_timestamp_seconds", "When the DAG's newest run finished (Unix time).",
                     "seconds")
    last_age = Family("fleetbench_last_run_age_seconds", "Seconds since the DAG's newest run finished.", "seconds")
    last_cases = Family("fleetbench_last_run_cases", "Cases of the DAG's newest run by status.")
    with engine.connect() as conn:
        newest = aware(conn.execute(select(func.max(br.c.logical_date)).where(*_dags(br, f))).scalar())
        since = newest - timedelta(days=WINDOW_DAYS) if newest is not None else None
        measured = set()  # (dag_id, host) with a result in the window: a 0 when nothing is open
        for r in latest_results(conn, f, since):
            measured.add((r["dag_id"], r["host"]))
            labels = {k: r[k] for k in CASE_LABELS}
            ips.add(labels, r["images_per_sec"])
            if r["metric"]:
                primary.add({**labels, "metric": r["metric"], "unit": r["unit"], "better": r["better"]}, r["value"])
            energy.add(labels, r["energy_j"])
            cost.add(labels, r["cost_usd"])
            night.add(labels, _epoch(r["logical_date"]))
        verdicts = latest_verdicts(conn, f, since)
        # as the results: a host without a result in the window (retired) drops out, its old findings with it.
        # Each change once, as `regressions list` shows them: the time, energy and cost findings that repeat a
        # primary metric's (same_change_as) are that change, not more of them.
        found = [r for r in (open_regressions(conn, Filters(dag_ids=f.dag_ids, since=since))
                             if newest is not None else []) if not r.get("same_change_as")]
        run_rows = latest_runs(conn, f)
    hosts = sorted(set(verdicts) | measured | {(r["dag_id"], r["host"]) for r in found})
    for dag_id, host in hosts:
        for severity in SEVERITIES:
            n = sum(1 for r in found if (r["dag_id"], r["host"], r["severity"]) == (dag_id, host, severity))
            regressions.add({"dag_id": dag_id, "host": host, "severity": severity}, n)
    for (dag_id, host), value in sorted(verdicts.items()):
        for v in VERDICTS:
            verdict.add({"dag_id": dag_id, "host": host, "verdict": v}, 1 if value == v else 0)
    for r in run_rows:
        finished = _epoch(r["finished_at"])
        last_ts.add({"dag_id": r["dag_id"]}, finished)
        last_age.add({"dag_id": r["dag_id"]}, max(0.0, now.timestamp() - finished) if finished is not None else None)
        for status in ("ok", "failed", "skipped"):
            last_cases.add({"dag_id": r["dag_id"], "status": status}, r[f"cases_{status}"])
    return [ips, primary, energy, cost, night, regressions, verdict, last_ts, last_age, last_cases]
