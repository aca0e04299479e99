"""The warehouse queries behind the report: one function per section, each a few set-based SQL
statements (aggregation, window functions and joins happen in the database), each returning plain
JSON-able data. The CLI (`fleetbench report`), the DAG's `report` task and the Airflow UI view
(`fleetbench.report.web`) all call `build_report`, so the three show the same numbers.

At fleet scale (1,000 hosts x 20 cases a night, a year of nights: millions of results) the sections
read the rollups `store_run` keeps next to the results (`fleetbench.warehouse.rollup`) rather than
the results themselves: per host, the whole calendar months of the window from host_month_rollup
and the nights at its edges from run_host_rollup ("facts", see `_facts`); across the fleet,
run_case_rollup (a row per run, case and GPU type). What needs single results (the latest run's
failures, open regressions, one host's throughput series and scaling) reads them through indexes
that bound it to a run or a host. `runs` counts (DAG, run) pairs; a host is taken to report one GPU
type and one driver per run.

Throughput comes one series per (host, case) while there are at most `THROUGHPUT_MAX_SERIES` of
them with at most `THROUGHPUT_MAX_POINTS` points in all, and always with a host filter: each series is
the case's primary metric (`metric`, `value`, `unit`, `better`: images/sec, a bus bandwidth, a latency).
Beyond that (`throughput_mode` "fleet") it comes one series per case and GPU type: the fleet's median
images/sec each night (the rollup's), with that night's min, max and number of hosts; a note says so
and counts the results of other metrics it leaves out.

Filters (`Filters`, built and validated by `parse_filters`):

- `host`, `model`: one name each (the fleet config's name pattern); `dag_id`: one DAG's results.
- `dag_ids`: the DAGs whose results may be shown at all (the view sets it to the DAGs the Airflow user
  may read; None, the CLI's and the file report's, means every DAG). Every section, the drop-downs'
  options and the default window see only these DAGs' results; it is not a filter of the form.
- `since`, `until`: an ISO date (`2026-11-01`, whole UTC days, both inclusive) or an ISO date-time
  (`2026-11-01T02:00:00+00:00`, naive means UTC; `until` then exclusive), on the results' logical date.
  Without `since` the window is the `DEFAULT_DAYS` calendar days that end with the newest matching
  result (not "now": a warehouse that has been quiet for a month still shows its last month).

What "open regression" means: a confirmed `regressions` row (kind regression) found in the newest ok
result of its (DAG, host, case) up to the end of the window. The detector reports a confirmed
regression on every night until it is accepted or recovers (`fleetbench.regression.track`), so a
later ok night without it means it closed; a later failed case does not (nothing was measured).
Suspected findings (one night) and improvements are listed apart.
"""

from __future__ import annotations

import collections
import json
import math
import re
import statistics
from dataclasses import dataclass, replace
from datetime import date, datetime, time, timedelta, timezone
from typing import Any

from sqlalchemy import (
    DateTime,
    Engine,
    String,
    and_,
    case,
    cast,
    distinct,
    func,
    inspect,
    literal,
    select,
    text,
    type_coerce,
    union_all,
)

from fleetbench.config import NAME_PATTERN
from fleetbench.warehouse.engine import warehouse_display_url
from fleetbench.warehouse.read import on_host, set_includes
from fleetbench.warehouse.rollup import month_of, next_month
from fleetbench.warehouse.schema import MULTINODE_OK_ROWS
from fleetbench.warehouse.schema import benchmark_results as br
from fleetbench.warehouse.schema import host_facts as hf
from fleetbench.warehouse.schema import host_month_rollup as hm
from fleetbench.warehouse.schema import regression_acceptances as ra
from fleetbench.warehouse.schema import regressions as rg
from fleetbench.warehouse.schema import run_case_rollup as cr
from fleetbench.warehouse.schema import run_host_rollup as hr
from fleetbench.warehouse.schema import runs as rn
from fleetbench.warehouse.schema import superseded_results as sr

DEFAULT_DAYS = 30
# Throughput one series per (host, case) up to these many series and points, else the fleet's per case.
THROUGHPUT_MAX_SERIES = 100
THROUGHPUT_MAX_POINTS = 10_000
HOSTS, FLEET = "hosts", "fleet"
# Airflow's own dag_id rule (KEY_REGEX), at most 250 characters like the warehouse column.
DAG_ID_PATTERN = r"^[A-Za-z0-9_.-]{1,250}$"
_NAME = re.compile(NAME_PATTERN)
_DAG_ID = re.compile(DAG_ID_PATTERN)
_DAY = re.compile(r"^\d{4}-\d{2}-\d{2}$")
FILTER_FIELDS = ("since", "until", "host", "model", "dag_id")

# Report states, from worst to best.
NO_TABLES, OUTDATED, EMPTY, NO_MATCH, OK = "no_tables", "outdated", "empty", "no_match", "ok"


class FilterError(ValueError):
    """A filter value that is not allowed. `field` names the filter; str() is `field: message`."""

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


@dataclass(frozen=True)
class Filters:
    """What the report shows. `since` inclusive, `until` exclusive, both aware UTC datetimes or None;
    `dag_ids`: the only DAGs whose results may be read (None: all)."""

    since: datetime | None = None
    until: datetime | None = None
    host: str | None = None
    model: str | None = None
    dag_id: str | None = None
    dag_ids: frozenset[str] | None = None

    def describe(self) -> dict[str, str | None]:
        """The filters as chosen (not `dag_ids`: that is who reads, not what they asked for)."""
        values = {k: getattr(self, k) for k in FILTER_FIELDS}
        return {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in values.items()}


def _moment(field: str, text: str, end: bool) -> datetime:
    text = text.strip()
    if _DAY.match(text):
        try:
            day = date.fromisoformat(text)
        except ValueError as exc:
            raise FilterError(field, f"not a valid date: {text!r} ({exc})") from None
        # A day is a whole UTC day: `until` 2026-11-30 includes that day.
        try:
            return datetime.combine(day + timedelta(days=1) if end else day, time(), tzinfo=timezone.utc)
        except OverflowError:  # the day after 9999-12-31
            raise FilterError(field, f"{text!r} is out of range (the last day is 9999-12-30)") from None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise FilterError(field, f"expected an ISO date (YYYY-MM-DD) or date-time (YYYY-MM-DDTHH:MM[:SS][+HH:MM]), "
                                 f"got {text!r}") from None
    if "T" not in text and " " not in text:  # fromisoformat also reads 20261101: be strict
        raise FilterError(field, f"expected an ISO date (YYYY-MM-DD) or date-time, got {text!r}")
    try:
        return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)
    except OverflowError:  # e.g. 0001-01-01T00:00+01:00 is before year 1 in UTC
        raise FilterError(field, f"{text!r} is out of range in UTC (years 1 to 9999)") from None


def parse_filters(since: str | None = None, until: str | None = None, host: str | None = None,
                  model: str | None = None, dag_id: str | None = None) -> Filters:
    """Validate filter text (CLI options, query parameters); empty text means "not set". Raises FilterError."""
    values = {k: (v.strip() or None) if isinstance(v, str) else v
              for k, v in dict(since=since, until=until, host=host, model=model, dag_id=dag_id).items()}
    for field in ("host", "model"):
        v = values[field]
        if v is not None and not _NAME.fullmatch(v):
            raise FilterError(field, f"{v!r} is not a {field} name (must match {NAME_PATTERN})")
    if values["dag_id"] is not None and not _DAG_ID.fullmatch(values["dag_id"]):
        raise FilterError("dag_id", f"{values['dag_id']!r} is not a DAG id (must match {DAG_ID_PATTERN})")
    start = _moment("since", values["since"], end=False) if values["since"] else None
    stop = _moment("until", values["until"], end=True) if values["until"] else None
    if start and stop and start >= stop:
        raise FilterError("since", f"{values['since']} is not before until {values['until']}")
    return Filters(since=start, until=stop, host=values["host"], model=values["model"], dag_id=values["dag_id"])


# -- helpers --------------------------------------------------------------------------------------
def aware(value: Any) -> datetime | None:
    """A warehouse timestamp (datetime, or ISO text from SQLite aggregates) as an aware UTC datetime."""
    if value is None:
        return None
    dt = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)


def _iso(value: Any) -> str | None:
    dt = aware(value)
    return dt.isoformat() if dt else None


def _num(value: Any) -> float | None:
    return None if value is None else float(value)


def _ts(expr):
    """Keep the DateTime type on an aggregate, so SQLite's text comes back as a datetime."""
    return type_coerce(expr, DateTime(timezone=True))


def _scope(f: Filters, *, window: tuple[datetime | None, datetime | None] | None = None, model: bool = True,
           table=br) -> list:
    """WHERE conditions on `table` (benchmark_results or a rollup) for the filters (and a [since, until) window)."""
    t = table.c
    conds = []
    if f.dag_ids is not None:
        conds.append(t.dag_id.in_(sorted(f.dag_ids)))
    if f.dag_id:
        conds.append(t.dag_id == f.dag_id)
    if f.host:
        conds.append(t.host == f.host)  # run_case_rollup has no host: read only without a host filter
    if model and f.model:
        conds.append(t.model == f.model)
    since, until = window if window is not None else (f.since, f.until)
    if since is not None:
        conds.append(t.logical_date >= since)
    if until is not None:
        conds.append(t.logical_date < until)
    return conds


def _int(value: Any) -> int:
    return int(value or 0)


# -- sections -------------------------------------------------------------------------------------
def resolve_window(conn, f: Filters) -> tuple[datetime | None, datetime | None, bool]:
    """(since, until, defaulted): without `since`, the DEFAULT_DAYS days ending with the newest matching result."""
    if f.since is not None:
        return f.since, f.until, False
    newest = aware(conn.execute(select(_ts(func.max(hr.c.logical_date)))
                                .where(*_scope(f, window=(None, f.until), table=hr))).scalar())
    if newest is None:
        return None, f.until, True
    return (datetime.combine(newest.date() - timedelta(days=DEFAULT_DAYS - 1), time(), tzinfo=timezone.utc),
            f.until, True)


def _distinct_values(conn, col) -> list[str]:
    """Every value of an indexed column, one index probe per value (a loose index scan), in order."""
    t, c = col.table.name, col.name
    return [v for (v,) in conn.execute(text(
        f"WITH RECURSIVE d(v) AS (SELECT MIN({c}) FROM {t} UNION ALL "
        f"SELECT (SELECT MIN({c}) FROM {t} WHERE {c} > d.v) FROM d WHERE d.v IS NOT NULL) "
        f"SELECT v FROM d WHERE v IS NOT NULL ORDER BY v"))]


def filter_options(conn, f: Filters, sets: bool = True) -> dict[str, list[str]]:
    """Every host, model and DAG id the warehouse has results for (the view's drop-downs); with `f.dag_ids`,
    those of the results of these DAGs only (read from host_month_rollup, rows per DAG, host, model and month).
    `sets`: the warehouse has multi-node sets (revision 0012), whose other hosts are options too."""
    dag_ids = _distinct_values(conn, hr.c.dag_id)
    if f.dag_ids is None:
        return {"hosts": _with_set_members(conn, _distinct_values(conn, hr.c.host), None, sets),
                "models": _distinct_values(conn, hr.c.model), "dag_ids": dag_ids}
    dag_ids = [d for d in dag_ids if d in f.dag_ids]
    if not dag_ids:
        return {"hosts": [], "models": [], "dag_ids": []}

    def values(col) -> list[str]:
        return list(conn.execute(select(col).distinct().where(hm.c.dag_id.in_(dag_ids)).order_by(col)).scalars())

    return {"hosts": _with_set_members(conn, values(hm.c.host), dag_ids, sets), "models": values(hm.c.model),
            "dag_ids": dag_ids}


def _with_set_members(conn, hosts: list[str], dag_ids: list[str] | None, sets: bool) -> list[str]:
    """`hosts` (the rollups': a multi-node set's rows are under its first host) and every other host of the sets of
    ok multi-node results (of `dag_ids`), in order: a host only ever second in its sets can be chosen too. Read
    through the multi-node rows' partial index; a warehouse before revision 0012 has no sets (`sets` False)."""
    if not sets or not hosts:
        return hosts
    query = select(br.c.host_set).distinct().where(text(MULTINODE_OK_ROWS), br.c.host_set.is_not(None))
    if dag_ids is not None:
        query = query.where(br.c.dag_id.in_(dag_ids))
    members = {h for (sets,) in conn.execute(query) for h in sets.split(",") if h}
    return sorted(set(hosts) | members) if members - set(hosts) else hosts


def _month_split(since: datetime | None, until: datetime | None) -> tuple[datetime | None, datetime | None] | None:
    """(a, b): the whole calendar months [a, b) inside [since, until) (None: unbounded), or None if there are none."""
    if since is not None and since != month_of(since) and month_of(since).year == 9999 and month_of(since).month == 12:
        return None  # no whole month starts after a day of December 9999 (there is no year 10000)
    a = None if since is None else (since if since == month_of(since) else next_month(month_of(since)))
    b = None if until is None else month_of(until)
    if a is not None and b is not None and a >= b:
        return None
    return a, b


def _facts(f: Filters, window: tuple[datetime | None, datetime | None], *, model: bool = True):
    """Per-host rows of the window as one subquery: host_month_rollup for its whole months, run_host_rollup
    (a row per run) for the nights before and after them. Columns: dag_id, host, model, gpu, driver_version,
    period (the month or the run: a (DAG, host, period) holds `host_runs` runs of the host, `model_runs` of them
    with a result of the row's model), first_date, last_date, last_ok, runs, host_runs, model_runs, results, ok,
    failed, skipped, gpu_model, scaled_gpus."""
    since, until = window
    split = _month_split(since, until)
    parts = []
    edges = [(since, until)]
    if split is not None:
        a, b = split
        conds = _scope(f, window=(None, None), model=model, table=hm)
        if a is not None:
            conds.append(hm.c.month >= a)
        if b is not None:
            conds.append(hm.c.month < b)
        parts.append(select(
            hm.c.dag_id, hm.c.host, hm.c.model, hm.c.gpu, hm.c.driver_version, cast(hm.c.month, String).label("period"),
            hm.c.first_date, hm.c.last_date, hm.c.last_ok, hm.c.runs, hm.c.host_runs, hm.c.model_runs, hm.c.results,
            hm.c.ok, hm.c.failed, hm.c.skipped, hm.c.gpu_model, hm.c.scaled_gpus).where(*conds))
        edges = [(since, a)] if since is not None and since < a else []
        if until is not None and b < until:
            edges.append((b, until))
    for lo, hi in edges:
        parts.append(select(
            hr.c.dag_id, hr.c.host, hr.c.model, hr.c.gpu, hr.c.driver_version, hr.c.run_id.label("period"),
            hr.c.logical_date.label("first_date"), hr.c.logical_date.label("last_date"),
            case((hr.c.ok > 0, hr.c.logical_date)).label("last_ok"), literal(1).label("runs"),
            literal(1).label("host_runs"), literal(1).label("model_runs"), hr.c.results, hr.c.ok, hr.c.failed,
            hr.c.skipped, hr.c.gpu_model, hr.c.scaled_gpus).where(*_scope(f, window=(lo, hi), model=model, table=hr)))
    return (parts[0] if len(parts) == 1 else union_all(*parts)).subquery("facts")


def summary(conn, f: Filters) -> dict:
    """Runs, results by status, hosts, models, the first and last night: the fleet's from run_case_rollup,
    one host's from run_host_rollup."""
    t = hr if f.host else cr
    # runs are (DAG, run) pairs: two DAGs on one schedule share their run ids (scheduled__<logical date>)
    runs = select(t.c.dag_id, t.c.run_id).where(*_scope(f, table=t)).distinct().subquery("runs")
    row = conn.execute(select(
        select(func.count()).select_from(runs).scalar_subquery().label("runs"),
        func.sum(t.c.results).label("results"),
        func.sum(t.c.ok).label("ok"), func.sum(t.c.failed).label("failed"), func.sum(t.c.skipped).label("skipped"),
        func.count(distinct(t.c.model)).label("models"),
        _ts(func.min(t.c.logical_date)).label("first"), _ts(func.max(t.c.logical_date)).label("last"),
    ).where(*_scope(f, table=t))).one()._mapping
    facts = _facts(f, (f.since, f.until))
    hosts = conn.execute(select(func.count(distinct(facts.c.host)))).scalar()
    out = {k: (_iso(v) if k in ("first", "last") else _int(v)) for k, v in row.items()}
    return {**out, "hosts": _int(hosts)}


def host_summary(conn, f: Filters) -> list[dict]:
    """Per host: runs, ok/failed/skipped cases, the newest result and the newest ok one, GPU model, drivers seen."""
    facts = _facts(f, (f.since, f.until))
    rows = conn.execute(select(
        facts.c.host, func.sum(facts.c.ok).label("ok"), func.sum(facts.c.failed).label("failed"),
        func.sum(facts.c.skipped).label("skipped"), _ts(func.max(facts.c.last_date)).label("last_seen"),
        _ts(func.max(facts.c.last_ok)).label("last_ok"), func.max(facts.c.gpu_model).label("gpu_model"),
        func.count(distinct(facts.c.driver_version)).label("drivers"),
        func.max(facts.c.driver_version).label("max_driver"),
    ).group_by(facts.c.host).order_by(facts.c.host)).all()
    # A (DAG, host, period)'s runs: the host's (any model) or, with a model filter, that model's; each run once,
    # though a model's rows are per GPU type (its CPU cases have none) and driver too.
    per_period = select(facts.c.host, func.max(facts.c.model_runs if f.model else facts.c.host_runs).label("runs")
                        ).group_by(facts.c.dag_id, facts.c.host, facts.c.period).subquery("per_period")
    runs = dict(conn.execute(select(per_period.c.host, func.sum(per_period.c.runs)).group_by(per_period.c.host)).all())
    out = []
    for r in rows:
        m = dict(r._mapping)
        m = {"host": m["host"], "runs": _int(runs.get(m["host"])), **{k: v for k, v in m.items() if k != "host"}}
        m["last_seen"], m["last_ok"] = _iso(m["last_seen"]), _iso(m["last_ok"])
        for k in ("runs", "ok", "failed", "skipped", "drivers"):
            m[k] = _int(m[k])
        out.append(m)
    return out


def throughput(conn, f: Filters, max_series: int = THROUGHPUT_MAX_SERIES,
               max_points: int = THROUGHPUT_MAX_POINTS) -> tuple[list[dict], str]:
    """(series, mode). Mode "hosts": the ok primary metric of every (host, case) over the window, one series each,
    oldest night first; with a host filter always, else while there are at most `max_series` series
    and `max_points` points. Mode "fleet": one series per case and GPU type, each night's fleet median
    (with that night's min, max and hosts)."""
    if f.host is None:
        # every ok result is a point of some metric (the rollup's `points` counts images/sec only)
        points = conn.execute(select(func.sum(cr.c.ok)).where(*_scope(f, table=cr))).scalar() or 0
        if points > max_points:
            return fleet_throughput(conn, f), FLEET
    series = host_throughput(conn, f)
    if f.host is None and len(series) > max_series:
        return fleet_throughput(conn, f), FLEET
    return series, HOSTS


def _finish(series: list[dict]) -> list[dict]:
    for s in series:
        values = [p["value"] for p in s["points"]]
        s.update(n=len(values), latest=values[-1], latest_date=s["points"][-1]["logical_date"],
                 latest_driver=s["points"][-1].get("driver_version"), previous=values[-2] if len(values) > 1 else None)
        s["change_pct"] = (s["latest"] - s["previous"]) / s["previous"] * 100 if s["previous"] else None
    return series


IMAGES = ("images_per_sec", "images/s", "higher")  # the primary metric of rows stored before rows named one


def host_throughput(conn, f: Filters) -> list[dict]:
    """One series per (host, case, primary metric and unit) from the results (bounded: one host's, or few in all):
    each ok night's `value` of the case's primary metric (images/sec, a bus bandwidth, a latency), with the
    metric's `unit` and `better` direction; points of images/sec also carry it as `images_per_sec`."""
    legacy = br.c.metric.is_(None)  # stored before rows named their metric: images/sec
    value = case((legacy, br.c.images_per_sec), else_=br.c.value)
    rows = conn.execute(select(
        br.c.model, br.c.benchmark, br.c.host, br.c.case_key, br.c.num_gpus, br.c.batch_size_per_device, br.c.dag_id,
        br.c.run_id, br.c.logical_date, value.label("value"), br.c.driver_version, br.c.mig_profile, br.c.nodes,
        func.coalesce(br.c.metric, IMAGES[0]).label("metric"), case((legacy, IMAGES[1]), else_=br.c.unit).label("unit"),
        func.coalesce(br.c.better, IMAGES[2]).label("better"),
    ).where(*_scope(f), br.c.status == "ok", value.is_not(None))
        .order_by(br.c.model, br.c.host, br.c.case_key, br.c.logical_date, br.c.run_id)).all()
    series: dict[tuple, dict] = {}
    for r in rows:  # grouping an ordered result set (one query), not a query per series
        if not math.isfinite(r.value):  # PostgreSQL floats can hold NaN and infinities
            continue
        better = "lower" if r.better == "lower" else "higher"
        # two DAGs benchmarking one host are two setups (as the regressions compare them): one series each
        s = series.setdefault((r.dag_id, r.model, r.host, r.case_key, r.metric, r.unit), {
            "dag_id": r.dag_id, "model": r.model, "benchmark": r.benchmark, "host": r.host, "case_key": r.case_key,
            "gpu": None,
            "num_gpus": r.num_gpus, "mig_profile": r.mig_profile, "nodes": r.nodes or 1,
            "batch_size_per_device": r.batch_size_per_device,
            "metric": r.metric, "unit": r.unit, "better": better, "label": f"{r.host} · {r.case_key}", "points": []})
        point = {"logical_date": _iso(r.logical_date), "run_id": r.run_id, "dag_id": r.dag_id,
                 "value": float(r.value), "driver_version": r.driver_version}
        if r.metric == IMAGES[0]:
            point["images_per_sec"] = point["value"]
        s["points"].append(point)
    out = _finish(_name_dags(list(series.values())))
    for s in out:
        values = [p["value"] for p in s["points"]]
        s.update(min=min(values), max=max(values), hosts=1)
    return out


def _name_dags(series: list[dict]) -> list[dict]:
    """Series of several DAGs in one window: each label also names its DAG (one DAG: as before)."""
    if len({s["dag_id"] for s in series}) > 1:
        for s in series:
            s["label"] = f"{s['label']} · {s['dag_id']}"
    return series


def fleet_throughput(conn, f: Filters) -> list[dict]:
    """One series per (model, case, GPU type) from run_case_rollup: each night's median over the hosts;
    the series' min and max are the lowest and highest single result of the window."""
    rows = conn.execute(select(
        cr.c.model, cr.c.case_key, cr.c.gpu, cr.c.num_gpus, cr.c.batch_size_per_device, cr.c.dag_id, cr.c.run_id,
        cr.c.logical_date, cr.c.ips_median, cr.c.ips_min, cr.c.ips_max, cr.c.hosts, cr.c.mig_profile, cr.c.nodes,
    ).where(*_scope(f, table=cr), cr.c.points > 0)
        .order_by(cr.c.model, cr.c.case_key, cr.c.gpu, cr.c.logical_date, cr.c.run_id)).all()
    series: dict[tuple, dict] = {}
    nights: dict[Any, str | None] = {}  # every series has the same few hundred nights
    for model, case_key, gpu, num_gpus, batch, dag_id, run_id, when, median, low, high, hosts, mig, nodes in rows:
        night = nights.get(when) or nights.setdefault(when, _iso(when))
        s = series.get((dag_id, model, case_key, gpu))
        if s is None:
            s = series[(dag_id, model, case_key, gpu)] = {
                "dag_id": dag_id, "model": model, "host": None, "case_key": case_key, "gpu": gpu, "num_gpus": num_gpus,
                "mig_profile": mig, "nodes": nodes or 1, "batch_size_per_device": batch, "metric": IMAGES[0],
                "unit": IMAGES[1], "better": IMAGES[2],
                "label": f"{case_key} · {gpu or 'GPU not reported'}", "points": []}
        s["points"].append({"logical_date": night, "run_id": run_id, "dag_id": dag_id, "value": float(median),
                            "images_per_sec": float(median), "min": float(low), "max": float(high),
                            "hosts": int(hosts)})
    out = _finish(_name_dags(list(series.values())))
    for s in out:
        s.update(min=min(p["min"] for p in s["points"]), max=max(p["max"] for p in s["points"]),
                 hosts=s["points"][-1]["hosts"])
    return out


def left_out(series: list[dict]) -> list[dict]:
    """The primary metrics of the throughput series other than images/sec, per metric, unit and direction, with why
    the scaling section (`why_scaling`) and the energy and cost section (`why_energy`), both defined on images/sec,
    leave them out: [{"metric", "unit", "better", "cases", "why_scaling", "why_energy"}]."""
    from fleetbench.metrics import BYTE_UNITS, work_unit

    cases: dict[tuple, set] = {}
    for s in series:
        if s.get("metric", IMAGES[0]) != IMAGES[0]:
            cases.setdefault((s["metric"], s["unit"], s["better"]), set()).add((s.get("host"), s["case_key"]))
    out = []
    for (metric, unit, better), keys in sorted(cases.items()):
        work = work_unit(unit, better)
        if better == "lower":
            scaling = "lower is better (a latency or a time): it does not add up across GPUs, so it has no speedup"
            energy = "lower is better: a latency or a time does no work, so it has no energy or cost per unit"
        elif work is None:
            scaling = "not a rate per second: no speedup is defined on it"
            energy = "not a rate per second: no energy or cost per unit of work is defined on it"
        else:
            scaling = ("a bandwidth does not add up across GPUs (an NCCL bus bandwidth is already normalised for the "
                       "GPU count)" if work[0] in BYTE_UNITS else
                       "a team's own rate is not known to add up across GPUs the way images/sec does")
            energy = (f"its cost and energy per {'10^6 ' if work[1] == 1e6 else ''}{work[0]} are in the latest run's "
                      "table below")
        out.append({"metric": metric, "unit": unit, "better": better, "cases": len(keys), "why_scaling": scaling,
                    "why_energy": energy})
    return out


def fleet_other_results(conn, f: Filters) -> int:
    """Ok results of the window without a finite images/sec (another primary metric): the fleet trend, read
    from run_case_rollup's images/sec medians, leaves them out."""
    return _int(conn.execute(select(func.sum(cr.c.ok - cr.c.points)).where(*_scope(f, table=cr))).scalar())


def driver_changes(conn, f: Filters) -> list[dict]:
    """Nights on which a host reported another driver than on its previous night (with a driver).

    The previous night may lie before the window, so an upgrade on the window's first night is found.
    Per (DAG, host), each driver's first and last night up to the window's end: when they do not
    overlap (the usual upgrade, or several in turn), each driver after the first came in on its first
    night; a host whose drivers' nights interleave gets a LAG over its runs.
    """
    facts = _facts(f, (None, f.until), model=False)
    spans: dict[tuple[str, str], list[tuple]] = {}
    for dag_id, host, drv, first, last in conn.execute(select(
            facts.c.dag_id, facts.c.host, facts.c.driver_version, _ts(func.min(facts.c.first_date)),
            _ts(func.max(facts.c.last_date))).where(facts.c.driver_version.is_not(None))
            .group_by(facts.c.dag_id, facts.c.host, facts.c.driver_version)):
        spans.setdefault((dag_id, host), []).append((aware(first), aware(last), drv))
    changes, interleaved = [], []
    for (dag_id, host), drivers in spans.items():
        drivers.sort()
        if all(b[0] > a[1] for a, b in zip(drivers, drivers[1:])):
            changes += [(dag_id, host, b[0], a[2], b[2]) for a, b in zip(drivers, drivers[1:])
                        if f.since is None or b[0] >= f.since]
        else:
            interleaved.append((dag_id, host))
    out = []
    if changes:  # the run of each change: the first (by run id) on that night with the new driver
        first_run: dict[tuple, str] = {}
        nights = sorted({c[2] for c in changes})
        for dag_id, host, drv, night, run_id in conn.execute(select(
                hr.c.dag_id, hr.c.host, hr.c.driver_version, _ts(hr.c.logical_date), func.min(hr.c.run_id))
                .where(hr.c.logical_date.in_(nights), *_scope(f, window=(None, None), model=False, table=hr))
                .group_by(hr.c.dag_id, hr.c.host, hr.c.driver_version, hr.c.logical_date)):
            first_run[(dag_id, host, drv, aware(night))] = run_id
        out += [{"host": host, "dag_id": dag_id, "run_id": first_run.get((dag_id, host, new, night)),
                 "logical_date": _iso(night), "from": old, "to": new} for dag_id, host, night, old, new in changes]
    if interleaved:
        out += _lagged_driver_changes(conn, f, interleaved)
    return sorted(out, key=lambda c: (c["logical_date"], c["host"]))


def _lagged_driver_changes(conn, f: Filters, hosts: list[tuple[str, str]]) -> list[dict]:
    """Driver changes of these (DAG, host)s by a LAG over their runs (their nights up to the window's end)."""
    out = []
    for dag_id, host in hosts:
        one = replace(f, host=host, dag_id=dag_id, model=None)
        per_run = (select(hr.c.dag_id, hr.c.host, hr.c.run_id, _ts(func.max(hr.c.logical_date)).label("logical_date"),
                          func.max(hr.c.driver_version).label("driver"))
                   .where(*_scope(one, window=(None, one.until), model=False, table=hr),
                          hr.c.driver_version.is_not(None))
                   .group_by(hr.c.dag_id, hr.c.host, hr.c.run_id).subquery("per_run"))
        lagged = select(
            per_run.c.dag_id, per_run.c.host, per_run.c.run_id, per_run.c.logical_date, per_run.c.driver,
            func.lag(per_run.c.driver).over(partition_by=(per_run.c.dag_id, per_run.c.host),
                                            order_by=(per_run.c.logical_date, per_run.c.run_id)).label("previous"),
        ).subquery("lagged")
        conds = [lagged.c.previous.is_not(None), lagged.c.previous != lagged.c.driver]
        if one.since is not None:
            conds.append(lagged.c.logical_date >= one.since)
        out += [{"host": r.host, "dag_id": r.dag_id, "run_id": r.run_id, "logical_date": _iso(r.logical_date),
                 "from": r.previous, "to": r.driver} for r in conn.execute(select(lagged).where(*conds))]
    return out


def scaling(conn, f: Filters) -> list[dict]:
    """Speedup efficiency (N-GPU images/sec / (N x 1-GPU images/sec)) per model, GPU count and MIG profile (N >= 2;
    the 1-GPU case is the reference, 1.0 by definition; N instances of a MIG profile against 1 of it, a row of its
    own, `mig_profile` None for whole GPUs): mean, min, max, cases, hosts."""
    if f.host is not None:  # one host's results
        rows = conn.execute(select(
            br.c.model, br.c.num_gpus, br.c.mig_profile, func.count().label("n"),
            func.sum(br.c.speedup_efficiency).label("total"),
            func.min(br.c.speedup_efficiency).label("min"), func.max(br.c.speedup_efficiency).label("max"),
            func.count(distinct(br.c.host)).label("hosts"),
        ).where(*_scope(f), br.c.status == "ok", br.c.speedup_efficiency.is_not(None), br.c.num_gpus >= 2)
            .group_by(br.c.model, br.c.num_gpus, br.c.mig_profile)
            .order_by(br.c.model, br.c.num_gpus, br.c.mig_profile)).all()
        hosts = {(r.model, r.num_gpus, r.mig_profile): r.hosts for r in rows}
    else:  # the fleet's per case and night; hosts from the GPU counts each host had an efficiency for
        rows = conn.execute(select(
            cr.c.model, cr.c.num_gpus, cr.c.mig_profile, func.sum(cr.c.efficiency_n).label("n"),
            func.sum(cr.c.efficiency_sum).label("total"),
            func.min(cr.c.efficiency_min).label("min"), func.max(cr.c.efficiency_max).label("max"),
        ).where(*_scope(f, table=cr), cr.c.efficiency_n > 0, cr.c.num_gpus >= 2)
            .group_by(cr.c.model, cr.c.num_gpus, cr.c.mig_profile)
            .order_by(cr.c.model, cr.c.num_gpus, cr.c.mig_profile)).all()
        whole = _scaled_hosts(conn, f, {(r.model, r.num_gpus) for r in rows if r.mig_profile is None})
        hosts = {(m, n, None): h for (m, n), h in whole.items()}
        hosts.update(_mig_scaled_hosts(conn, f, {(r.model, r.num_gpus, r.mig_profile) for r in rows
                                                 if r.mig_profile is not None}))
    return [{"model": r.model, "num_gpus": int(r.num_gpus), "mig_profile": r.mig_profile, "n": int(r.n),
             "hosts": hosts.get((r.model, r.num_gpus, r.mig_profile), 0),
             "mean": float(r.total) / int(r.n), "min": _num(r.min), "max": _num(r.max)} for r in rows]


def _mig_scaled_hosts(conn, f: Filters, wanted: set[tuple]) -> dict[tuple, int]:
    """Distinct hosts with an ok result of N instances of a MIG profile with a speedup efficiency, per (model, N,
    profile), from the results in one grouped query (MIG cases are few; the rollup's bit masks count GPUs, not
    instances)."""
    if not wanted:
        return {}
    rows = conn.execute(select(br.c.model, br.c.num_gpus, br.c.mig_profile, func.count(distinct(br.c.host))).where(
        *_scope(f), br.c.status == "ok", br.c.speedup_efficiency.is_not(None), br.c.mig_profile.is_not(None),
        br.c.num_gpus >= 2).group_by(br.c.model, br.c.num_gpus, br.c.mig_profile))
    return {(m, n, p): int(c) for m, n, p, c in rows if (m, n, p) in wanted}


def results_command(f: Filters) -> str:
    """The `fleetbench results` command line that lists the results of these filters (a host's, in a window)."""
    words = ["fleetbench", "results", "--host", f.host or ""]
    if f.since is None and f.until is None:
        words.append("--all")  # without a window, `results` reads the latest run only
    if f.since is not None:
        words += ["--since", f.since.date().isoformat() if f.since.time() == time() else f.since.isoformat()]
    if f.until is not None:  # the report's until is exclusive, as `results --until` takes a date-time
        words += ["--until", f.until.isoformat()]
    if f.dag_id:
        words += ["--dag-id", f.dag_id]
    return " ".join(words)


def host_sets(conn, f: Filters, limit: int = 5) -> list[str]:
    """The first `limit` host sets ("a,b") of ok multi-node results in the filters' scope that include `f.host`."""
    return [s for (s,) in conn.execute(
        select(br.c.host_set).distinct().where(*_scope(replace(f, host=None)), on_host(br, f.host),
                                               text(MULTINODE_OK_ROWS)).order_by(br.c.host_set).limit(limit))]


def node_scaling(conn, f: Filters) -> list[dict]:
    """Speedup efficiency across nodes (README "Multi-node cases"): per model, batch, GPUs per node and nodes, the
    ok multi-node results' total images/sec and efficiency (N-node total / (N x 1-node images/sec)), and their
    host sets. Empty on a warehouse before revision 0012."""
    rows = conn.execute(select(
        br.c.model, br.c.batch_size_per_device, br.c.num_gpus, br.c.nodes, func.count().label("n"),
        func.avg(br.c.images_per_sec).label("images_per_sec"), func.avg(br.c.node_efficiency).label("mean"),
        func.min(br.c.node_efficiency).label("min"), func.max(br.c.node_efficiency).label("max"),
        func.count(distinct(br.c.host_set)).label("sets"), func.max(br.c.host_set).label("host_set"),
    ).where(*_scope(replace(f, host=None)), *([on_host(br, f.host)] if f.host else []),
            # a set's row is stored under its first host: a host's are those of every set it is in
            text(MULTINODE_OK_ROWS))  # its partial index: only multi-node rows are read
        .group_by(br.c.model, br.c.batch_size_per_device, br.c.num_gpus, br.c.nodes)
        .order_by(br.c.model, br.c.batch_size_per_device, br.c.num_gpus, br.c.nodes)).all()
    return [{"model": r.model, "batch_size": r.batch_size_per_device, "num_gpus": r.num_gpus, "nodes": int(r.nodes),
             "n": int(r.n), "images_per_sec": _num(r.images_per_sec), "mean": _num(r.mean), "min": _num(r.min),
             "max": _num(r.max), "sets": int(r.sets), "host_set": r.host_set} for r in rows]


def _scaled_hosts(conn, f: Filters, wanted: set[tuple]) -> dict[tuple, int]:
    """Distinct hosts with an ok N-GPU result with a speedup efficiency, per (model, N), from the rollup's bit masks."""
    if not wanted:
        return {}
    facts = _facts(f, (f.since, f.until))
    masks: dict[tuple, int] = {}
    for model, host, mask in conn.execute(select(facts.c.model, facts.c.host, facts.c.scaled_gpus).distinct()
                                          .where(facts.c.scaled_gpus != 0)):
        masks[(model, host)] = masks.get((model, host), 0) | int(mask)
    out: dict[tuple, int] = {}
    for (model, _host), mask in masks.items():
        for m, n in wanted:
            if m == model and 2 <= n <= 62 and mask >> n & 1:
                out[(m, n)] = out.get((m, n), 0) + 1
    return out


CPU_LABEL = "none (CPU)"  # the efficiency table's "GPU model" of CPU cases (and of GPUs that reported no name)


def efficiency(conn, f: Filters) -> list[dict]:
    """Images per joule and cost per million images per GPU model (catalog name, else as reported; `CPU_LABEL`
    for CPU cases) and model: the fleet's from run_case_rollup, one host's from run_host_rollup."""
    t = hr if f.host else cr
    rows = conn.execute(select(
        t.c.gpu, t.c.model, func.sum(t.c.energy_cost_n).label("n"),
        func.sum(t.c.images_per_joule_sum).label("ipj_sum"), func.sum(t.c.images_per_joule_n).label("ipj_n"),
        func.sum(t.c.cost_per_million_sum).label("cost_sum"), func.sum(t.c.cost_per_million_n).label("cost_n"),
        func.sum(t.c.energy_measured).label("measured"), func.sum(t.c.energy_estimated).label("estimated"),
    ).where(*_scope(f, table=t), t.c.energy_cost_n > 0)
        .group_by(t.c.gpu, t.c.model).order_by(t.c.gpu, t.c.model)).all()
    return [{"gpu": r.gpu if r.gpu is not None else CPU_LABEL, "model": r.model, "n": int(r.n),
             "images_per_joule": float(r.ipj_sum) / int(r.ipj_n) if r.ipj_n else None,
             "cost_per_million_images_usd": float(r.cost_sum) / int(r.cost_n) if r.cost_n else None,
             "measured": _int(r.measured), "estimated": _int(r.estimated)} for r in rows]


def latest_run(conn, f: Filters) -> dict | None:
    """The newest run in the window (by logical date) that has matching results, with its case counts."""
    newest = conn.execute(select(hr.c.dag_id, hr.c.run_id, _ts(hr.c.logical_date).label("logical_date"))
                          .where(*_scope(f, table=hr))
                          .order_by(hr.c.logical_date.desc(), hr.c.stored_at.desc(), hr.c.run_id.desc())
                          .limit(1)).first()
    if newest is None:
        return None
    counts = conn.execute(select(func.sum(hr.c.results).label("total"), func.sum(hr.c.ok).label("ok"),
                                 func.sum(hr.c.failed).label("failed"), func.sum(hr.c.skipped).label("skipped"))
                          .where(*_scope(f, window=(None, None), table=hr), hr.c.dag_id == newest.dag_id,
                                 hr.c.run_id == newest.run_id)).one()
    return {"dag_id": newest.dag_id, "run_id": newest.run_id, "logical_date": _iso(newest.logical_date),
            **{k: _int(v) for k, v in counts._mapping.items()}}


def unit_costs(conn, f: Filters, run: dict | None) -> list[dict]:
    """The run's cost and energy per unit of its primary metrics (`fleetbench.metrics.per_unit`), per metric, unit
    and GPU model (`CPU_LABEL` for CPU cases): total cost (energy) / total work at the measured rates, over the ok
    cases that have a cost (energy), with how many of them had their energy measured and estimated. Rate metrics
    where higher is better only: a latency does no work. One GROUP BY over the run's rows."""
    from fleetbench.metrics import ESTIMATED, MEASURED, work_unit

    if run is None:
        return []
    work = br.c.value * br.c.duration_s
    has_energy = br.c.energy_source.in_((MEASURED, ESTIMATED)) & br.c.energy_j.is_not(None)
    gpu = case((br.c.num_gpus > 0, func.coalesce(br.c.gpu_catalog_name, br.c.gpu_model)))  # as rollup.GPU
    rows = conn.execute(select(
        br.c.metric, br.c.unit, gpu.label("gpu"), func.count().label("n"),
        func.sum(case((br.c.cost_usd.is_not(None), br.c.cost_usd))).label("cost"),
        func.sum(case((br.c.cost_usd.is_not(None), work))).label("cost_work"),
        func.sum(case((has_energy, br.c.energy_j))).label("energy"),
        func.sum(case((has_energy, work))).label("energy_work"),
        func.sum(case((has_energy & (br.c.energy_source == MEASURED), 1), else_=0)).label("measured"),
        func.sum(case((has_energy & (br.c.energy_source == ESTIMATED), 1), else_=0)).label("estimated"),
    ).where(*_scope(f, window=(None, None)), br.c.dag_id == run["dag_id"], br.c.run_id == run["run_id"],
            br.c.status == "ok", br.c.better == "higher", br.c.value > 0, br.c.duration_s > 0)
        .group_by(br.c.metric, br.c.unit, gpu).order_by(br.c.metric, br.c.unit, gpu)).all()
    out = []
    for r in rows:
        unit = work_unit(r.unit, "higher")
        if unit is None:
            continue
        thing, amount = unit
        cost = float(r.cost) / float(r.cost_work) * amount if r.cost_work else None
        energy = float(r.energy) / 3600.0 / float(r.energy_work) * amount if r.energy_work else None
        out.append({"metric": r.metric, "unit": r.unit, "gpu": r.gpu if r.gpu is not None else CPU_LABEL,
                    "n": int(r.n), "per": f"10^6 {thing}" if amount == 1e6 else thing,
                    "cost_per_unit_usd": cost if cost is None or math.isfinite(cost) else None,
                    "energy_per_unit_wh": energy if energy is None or math.isfinite(energy) else None,
                    # a figure of measured and estimated energy together says so (`measured`, `estimated`: cases)
                    "measured": _int(r.measured), "estimated": _int(r.estimated)})
    return out


def failures(conn, f: Filters, run: dict | None) -> list[dict]:
    """The run's failed and skipped cases by failure class, with the hosts they happened on."""
    if run is None:
        return []
    rows = conn.execute(select(br.c.status, br.c.failure_class, br.c.host, func.count().label("n"))
                        .where(*_scope(f, window=(None, None)), br.c.dag_id == run["dag_id"],
                               br.c.run_id == run["run_id"], br.c.status != "ok")
                        .group_by(br.c.status, br.c.failure_class, br.c.host)).all()
    classes: dict[tuple[str, str], dict] = {}
    for r in rows:  # a handful of aggregated rows: (status, class, host) -> count
        name = r.failure_class or "unclassified"
        c = classes.setdefault((r.status, name), {"status": r.status, "failure_class": name, "count": 0, "hosts": {}})
        c["count"] += int(r.n)
        c["hosts"][r.host] = int(r.n)
    return sorted(classes.values(), key=lambda c: (-c["count"], c["status"], c["failure_class"]))


def open_regressions(conn, f: Filters, include_suspected: bool = False,
                     kinds: tuple[str, ...] = ("regression",)) -> list[dict]:
    """Findings of the newest ok result of their (DAG, host, case) up to the window's end (see module doc):
    confirmed regressions by default; `include_suspected` adds the one-night ones, `kinds` improvements."""
    later = br.alias("later")
    conds = [later.c.dag_id == br.c.dag_id, later.c.host == br.c.host, later.c.case_key == br.c.case_key,
             later.c.status == "ok"]
    if f.model:
        conds.append(later.c.model == f.model)
    if f.until is not None:
        conds.append(later.c.logical_date < f.until)
    # The newest ok night of the finding's (DAG, host, case): a backward walk of the (host, case, night) index.
    newest_ok = (select(later.c.logical_date).where(*conds).order_by(later.c.logical_date.desc()).limit(1)
                 .correlate(br).scalar_subquery())
    rows = conn.execute(
        select(rg.c.dag_id, rg.c.run_id, rg.c.host, rg.c.case_key, br.c.model, rg.c.metric, rg.c.direction,
               rg.c.baseline_value, rg.c.value, rg.c.delta_pct, rg.c.z_score, rg.c.p_value, rg.c.baseline_n,
               rg.c.changes, rg.c.severity, br.c.logical_date, rg.c.kind, rg.c.status, rg.c.basis, rg.c.since_date,
               rg.c.since_run_id, rg.c.detectable_pct, rg.c.same_change_as, rg.c.segment, rg.c.baseline_segment,
               rg.c.unit, br.c.host_set)
        .join(br, and_(br.c.dag_id == rg.c.dag_id, br.c.run_id == rg.c.run_id, br.c.host == rg.c.host,
                       br.c.case_key == rg.c.case_key))
        # a host's findings include those of the multi-node cases whose set includes it (stored under its first host)
        .where(*_scope(replace(f, host=None)), *([on_host(br, f.host)] if f.host else []),
               br.c.logical_date == newest_ok, rg.c.kind.in_(kinds),
               rg.c.status.in_(("confirmed", "suspected") if include_suspected else ("confirmed",)))
        .order_by(case((rg.c.status == "confirmed", 0), else_=1), case((rg.c.severity == "major", 0), else_=1),
                  rg.c.host, rg.c.case_key, rg.c.metric)).all()
    out = []
    for r in rows:
        m = dict(r._mapping)
        m["logical_date"] = _iso(m["logical_date"])
        m["since_date"] = _iso(m["since_date"])
        for name in ("changes", "segment", "baseline_segment"):
            try:
                m[name] = json.loads(m[name]) if m[name] else {}
            except ValueError:
                m[name] = {"note": str(m[name])}
        out.append(m)
    return out


def fleet_health(conn, f: Filters, hosts: list[str]) -> list[dict]:
    """Per host of the report: its newest host check with GPU health of the window's runs (the one collected last, as
    /metrics' host verdict: a backfill of an older night run after a repair checked the GPUs as they are now),
    each health check's status, and how many of the host's results in the window were measured while its
    GPUs were degraded or unfit (benchmark_results.host_gpu_health)."""
    from fleetbench.hosts.health import HEALTH_CHECKS

    if not hosts:
        return []
    conds = [hf.c.gpu_health.isnot(None), hf.c.host.in_(hosts)]
    if f.dag_ids is not None:
        conds.append(hf.c.dag_id.in_(sorted(f.dag_ids)))
    if f.dag_id:
        conds.append(hf.c.dag_id == f.dag_id)
    if f.since is not None:
        conds.append(rn.c.logical_date >= f.since)
    if f.until is not None:
        conds.append(rn.c.logical_date < f.until)
    ranked = (select(hf.c.host, hf.c.run_id, hf.c.gpu_health, hf.c.gpu_health_issues, hf.c.checks_json,
                     _ts(rn.c.logical_date).label("logical_date"),
                     func.row_number().over(partition_by=hf.c.host,
                                            order_by=(hf.c.collected_at.desc().nulls_last(),
                                                      rn.c.logical_date.desc()))
                     .label("nth"))
              .join(rn, and_(rn.c.dag_id == hf.c.dag_id, rn.c.run_id == hf.c.run_id)).where(*conds).subquery())
    newest = conn.execute(select(ranked).where(ranked.c.nth == 1).order_by(ranked.c.host)).all()
    if not newest:
        return []
    checked = [r.host for r in newest]
    unhealthy = ("degraded", "unfit")
    # a host's own results measured on unhealthy GPUs, and the multi-node results of its sets where its own check of
    # that run was unhealthy (a set's row has the worst health of its hosts, and is stored under its first host)
    measured = collections.Counter(dict(conn.execute(
        select(br.c.host, func.count()).where(*_scope(f), br.c.host.in_(checked), br.c.host_gpu_health.in_(unhealthy),
                                              br.c.nodes < 2)
        .group_by(br.c.host)).all()))
    measured.update(dict(conn.execute(
        select(hf.c.host, func.count()).select_from(br).join(hf, and_(
            hf.c.dag_id == br.c.dag_id, hf.c.run_id == br.c.run_id, set_includes(br.c.host_set, hf.c.host)))
        .where(*_scope(replace(f, host=None)), *([on_host(br, f.host)] if f.host else []),
               text(MULTINODE_OK_ROWS),  # the multi-node rows' partial index, not a scan of the window
               br.c.host_gpu_health.in_(unhealthy), hf.c.host.in_(checked), hf.c.gpu_health.in_(unhealthy))
        .group_by(hf.c.host)).all()))
    out = []
    for r in newest:
        try:
            checks = {c["name"]: c["status"] for c in json.loads(r.checks_json or "[]")
                      if isinstance(c, dict) and c.get("name") in HEALTH_CHECKS}
        except (ValueError, TypeError):
            checks = {}
        out.append({"host": r.host, "gpu_health": r.gpu_health, "issues": r.gpu_health_issues, "run_id": r.run_id,
                    "logical_date": _iso(r.logical_date), "checks": checks,
                    "degraded_results": _int(measured.get(r.host))})
    return out


CHANGE_MAP_MAX_CELLS = 4000  # host x case cells; more: filter by host or model
CHANGE_MAP_NIGHTS = 15  # the newest nights of the window the map reads: the newest and its baseline's


def _change_map_since(conn, f: Filters) -> datetime | None:
    """The logical date of the window's CHANGE_MAP_NIGHTS-th newest night (None: it has fewer), from the rollups:
    run_case_rollup for the fleet, run_host_rollup for one host."""
    t = hr if f.host else cr
    return aware(conn.execute(select(_ts(t.c.logical_date)).where(*_scope(f, table=t)).distinct()
                              .order_by(t.c.logical_date.desc()).offset(CHANGE_MAP_NIGHTS - 1).limit(1)).scalar())


def change_map(conn, f: Filters) -> dict:
    """Host x case: each (host, case)'s newest ok primary metric (images/sec, bus bandwidth, a latency: `metric`,
    `value`, compared only with nights of the same metric and unit) in the window against its baseline, so a drop on
    some hosts is not averaged away. Where a finding is open on that night (confirmed or suspected, regression
    or improvement) its change against its own baseline is shown; elsewhere the change against the median of
    the earlier ok nights with the same driver, CUDA driver and image digest among the window's newest
    CHANGE_MAP_NIGHTS nights (None with fewer than 3), so a year's window reads as few rows as a fortnight's.
    {"hosts", "cases", "cells": {host: {case_key: {"delta_pct", "status", "kind", "metric", "unit", "better"}}},
    "skipped"}: "skipped" is how many (host, case) cells there are when more than CHANGE_MAP_MAX_CELLS (counted up
    to one past it)."""
    since = _change_map_since(conn, f)
    if since is not None and (f.since is None or since > f.since):
        f = replace(f, since=since)
    pairs = conn.execute(select(func.count()).select_from(
        select(br.c.dag_id, br.c.host, br.c.case_key).where(*_scope(f), br.c.status == "ok").distinct()
        .limit(CHANGE_MAP_MAX_CELLS + 1).subquery())).scalar()  # DISTINCT ... LIMIT: stops at one past the cap
    if pairs > CHANGE_MAP_MAX_CELLS:
        return {"hosts": [], "cases": [], "cells": {}, "skipped": pairs}
    legacy = br.c.metric.is_(None)  # a row stored before rows named their metric: images/sec
    value = case((legacy, br.c.images_per_sec), else_=br.c.value)
    rows = conn.execute(
        select(br.c.dag_id, br.c.host, br.c.case_key, func.coalesce(br.c.metric, "images_per_sec").label("metric"),
               value.label("value"), case((legacy, "images/s"), else_=br.c.unit).label("unit"),
               func.coalesce(br.c.better, "higher").label("better"), br.c.driver_version,
               br.c.cuda_driver_version, br.c.image_digest)
        .where(*_scope(f), br.c.status == "ok", value.is_not(None))
        .order_by(br.c.host, br.c.case_key, br.c.logical_date)).all()
    series: dict[tuple[str, str, str], list] = {}
    for r in rows:  # two DAGs benchmarking one host are two setups: a cell each, its column naming the DAG
        series.setdefault((r.dag_id, r.host, r.case_key), []).append(r)
    several = len({dag for dag, _, _ in series}) > 1

    def column(case_key: str, dag_id: str) -> str:
        return f"{case_key} · {dag_id}" if several else case_key

    cells: dict[str, dict[str, dict]] = {}
    for (dag_id, host, case_key), nights in series.items():
        last = nights[-1]
        same = [n.value for n in nights[:-1]
                if (n.metric, n.unit, n.driver_version, n.cuda_driver_version, n.image_digest)
                == (last.metric, last.unit, last.driver_version, last.cuda_driver_version, last.image_digest)
                and math.isfinite(n.value)]
        base = statistics.median(same) if len(same) >= 3 else None  # of an even count: the mean of the middle two
        delta = (last.value - base) / base * 100.0 if base and math.isfinite(last.value) else None
        cells.setdefault(host, {})[column(case_key, dag_id)] = {"delta_pct": delta, "status": None, "kind": None,
                                                "metric": last.metric, "unit": last.unit,
                                                "better": "lower" if last.better == "lower" else "higher"}
    for r in open_regressions(conn, f, include_suspected=True, kinds=("regression", "improvement")):
        cell = cells.get(r["host"], {}).get(column(r["case_key"], r["dag_id"]))
        if cell is not None and r["metric"] == cell["metric"]:
            cell.update(delta_pct=r["delta_pct"], status=r["status"], kind=r["kind"])
    return {"hosts": sorted(cells), "cases": sorted({c for row in cells.values() for c in row}), "cells": cells,
            "skipped": None}


REMEASURED_MAX = 200  # (night, host) rows of the re-measured section


def remeasured(conn, f: Filters) -> list[dict]:
    """Nights of the window that were measured again (a rerun or a backfill added attempts), per run and
    host, newest first: how many attempts were superseded and why (driver changed, image changed, rerun
    of a failed result: `superseded_why`, written when the attempt was superseded). One GROUP BY over
    superseded_results, no join: a re-measured year stays a short answer."""
    if not inspect(conn).has_table(sr.name):
        return []
    query = (select(sr.c.dag_id, sr.c.run_id, sr.c.host, _ts(func.min(sr.c.logical_date)).label("logical_date"),
                    sr.c.superseded_why, func.count().label("n"),
                    _ts(func.max(sr.c.superseded_at)).label("superseded_at"))
             .where(*_scope(f, table=sr)).group_by(sr.c.dag_id, sr.c.run_id, sr.c.host, sr.c.superseded_why)
             .order_by(func.min(sr.c.attempt), sr.c.superseded_why))  # reasons in the order they happened
    merged: dict[tuple, dict] = {}
    for r in conn.execute(query):
        row = merged.setdefault((r.dag_id, r.run_id, r.host), {
            "dag_id": r.dag_id, "run_id": r.run_id, "host": r.host, "logical_date": _iso(r.logical_date),
            "superseded": 0, "superseded_at": None, "reasons": []})
        row["superseded"] += _int(r.n)
        row["superseded_at"] = max(filter(None, (row["superseded_at"], _iso(r.superseded_at))), default=None)
        for reason in (r.superseded_why or "rerun").split("; "):
            if reason not in row["reasons"]:
                row["reasons"].append(reason)
    out = sorted(merged.values(), key=lambda r: (r["logical_date"] or "", r["run_id"], r["host"]), reverse=True)
    return out[:REMEASURED_MAX]


# Every section as (connection, filters) -> data, e.g. to time them one by one.
SECTIONS = {
    "resolve_window": resolve_window, "filter_options": filter_options, "summary": summary,
    "host_summary": host_summary, "throughput": throughput, "driver_changes": driver_changes, "scaling": scaling,
    "efficiency": efficiency, "latest_run": latest_run,
    "failures": lambda conn, f: failures(conn, f, latest_run(conn, f)), "open_regressions": open_regressions,
    "remeasured": remeasured, "node_scaling": node_scaling, "change_map": change_map,
    "unit_costs": lambda conn, f: unit_costs(conn, f, latest_run(conn, f)),
    "fleet_health": lambda conn, f: fleet_health(conn, f, [h["host"] for h in host_summary(conn, f)]),
    "capacity": lambda conn, f: capacity(conn, f),
}


def capacity(conn, f: Filters, settings=None) -> list[dict]:
    """Capacity profiles (fleetbench.capacity) of the report's model filter: every result they learned from,
    not only this window's (a profile is the whole history), fitted with `settings` (`fleet.capacity` as a
    `capacity.Settings`; None: the defaults). Empty on a warehouse before revision 0009."""
    from sqlalchemy.exc import SQLAlchemyError

    from fleetbench.capacity import Settings, report_section

    try:
        with conn.begin_nested():  # a failed read leaves the report's connection usable
            dag_ids = {f.dag_id} if f.dag_id else None
            if f.dag_ids is not None:
                dag_ids = set(f.dag_ids) & dag_ids if dag_ids else set(f.dag_ids)
            return report_section(conn, f.model, dag_ids, settings or Settings())
    except SQLAlchemyError:
        return []


# -- the whole report -----------------------------------------------------------------------------
def blank_report(f: Filters | None = None, warehouse: str = "") -> dict:
    """A report with every section empty (the shape `build_report` fills)."""
    f = f or Filters()
    return {
        "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "warehouse": warehouse, "filters": f.describe(),
        "window": {"since": None, "until": None, "defaulted": f.since is None},
        "state": OK, "notes": [], "options": {"hosts": [], "models": [], "dag_ids": []},
        "summary": {"runs": 0, "results": 0, "ok": 0, "failed": 0, "skipped": 0, "hosts": 0, "models": 0,
                    "first": None, "last": None},
        "hosts": [], "throughput": [], "throughput_mode": HOSTS, "fleet_other_results": 0, "left_out": [],
        "driver_changes": [], "scaling": [], "efficiency": [],
        "node_scaling": [], "latest_run": None, "failures": [], "regressions": [], "fleet_health": [], "suspected": [],
        "improvements": [],
        "change_map": {"hosts": [], "cases": [], "cells": {}, "skipped": None}, "capacity": [], "remeasured": [],
    }


def build_report(engine: Engine, f: Filters | None = None, *, max_series: int | None = None,
                 max_points: int | None = None, capacity_settings=None) -> dict:
    """Every section of the report as plain data (JSON-able), read in one connection.

    `max_series`, `max_points`: when throughput turns from one series per (host, case) to the fleet's
    per case (default THROUGHPUT_MAX_SERIES, THROUGHPUT_MAX_POINTS).

    `state` says what the warehouse held: `no_tables` (nothing stored yet), `outdated` (a schema older
    than revision 0004, whose derived metrics, regressions and rollups the report reads), `empty`
    (tables, no results), `no_match` (results, none matching the filters) or `ok`; `notes` explain odd states
    (one run only, hosts with only failures, sections without data) in words for people.
    """
    f = f or Filters()
    report = blank_report(f, warehouse_display_url(engine.url))
    tables = set(inspect(engine).get_table_names())
    if br.name not in tables:
        report["state"] = NO_TABLES
        report["notes"].append("No results yet: nothing has been stored in this warehouse (the fleet DAG creates "
                               "its tables with the first run; `fleetbench db upgrade` creates them by hand).")
        return report
    from fleetbench.warehouse import schema_behind

    if behind := schema_behind(engine):  # its queries would name columns it lacks: an error that read as an outage
        report["state"] = OUTDATED
        report["notes"].append(behind)
        return report
    if not {rg.name, hr.name, hm.name, cr.name, ra.name} <= tables:
        report["state"] = OUTDATED
        report["notes"].append("This warehouse's schema predates the report (it needs revision 0003's derived metrics "
                               "and regressions, revision 0004's rollups and revision 0008's regression states): run "
                               "`fleetbench db upgrade`, or let the fleet DAG's next run do it.")
        return report
    # GPU health (revision 0006): read when the warehouse has it.
    health = "gpu_health" in {c["name"] for c in inspect(engine).get_columns(hf.name)}
    nodes = "nodes" in {c["name"] for c in inspect(engine).get_columns(br.name)}  # revision 0012
    with engine.connect() as conn:
        report["options"] = filter_options(conn, f, sets=nodes)
        if not report["options"]["hosts"]:
            report["state"] = EMPTY
            report["notes"].append("No results yet: the warehouse has tables but no benchmark results."
                                   if f.dag_ids is None else
                                   "No results yet of the DAGs you may read.")
            return report
        if f.dag_ids is not None:  # of the readable DAGs, those with results here: a short IN list
            f = replace(f, dag_ids=frozenset(report["options"]["dag_ids"]))
        since, until, defaulted = resolve_window(conn, f)
        scoped = replace(f, since=since, until=until)
        report["window"] = {"since": _iso(since), "until": _iso(until), "defaulted": defaulted}
        report["summary"] = summary(conn, scoped)
        if report["summary"]["results"] == 0:
            report["state"] = NO_MATCH
            report["notes"].append("No results match these filters.")
            if f.host and nodes and (sets := host_sets(conn, scoped)):
                report["notes"].append(
                    f"{f.host} has no results of its own here, but is in multi-node sets ({', '.join(sets)}), whose "
                    f"results are stored under each set's first host: `{results_command(scoped)}` lists them.")
            return report
        report["hosts"] = host_summary(conn, scoped)
        report["throughput"], report["throughput_mode"] = throughput(
            conn, scoped, THROUGHPUT_MAX_SERIES if max_series is None else max_series,
            THROUGHPUT_MAX_POINTS if max_points is None else max_points)
        if report["throughput_mode"] == FLEET:
            report["fleet_other_results"] = fleet_other_results(conn, scoped)
        report["left_out"] = left_out(report["throughput"])
        report["driver_changes"] = driver_changes(conn, scoped)
        report["remeasured"] = remeasured(conn, scoped)
        report["scaling"] = scaling(conn, scoped)
        if nodes:
            report["node_scaling"] = node_scaling(conn, scoped)
        report["efficiency"] = efficiency(conn, scoped)
        report["latest_run"] = latest_run(conn, scoped)
        report["failures"] = failures(conn, scoped, report["latest_run"])
        report["unit_costs"] = unit_costs(conn, scoped, report["latest_run"])
        report["regressions"] = open_regressions(conn, scoped)
        report["suspected"] = [r for r in open_regressions(conn, scoped, include_suspected=True)
                               if r["status"] == "suspected"]
        report["improvements"] = open_regressions(conn, scoped, include_suspected=True, kinds=("improvement",))
        report["change_map"] = change_map(conn, scoped)
        if health:
            # the hosts of the report, and those of the multi-node sets of its open regressions
            report["fleet_health"] = fleet_health(conn, scoped, sorted(
                {h["host"] for h in report["hosts"]} | {h for r in report["regressions"] for h in set_hosts(r)}))
            _mark_health(report)
        report["capacity"] = capacity(conn, scoped, capacity_settings)
    report["notes"] += notes(report)
    return report


HEALTH_ORDER = ("healthy", "degraded", "unfit")  # worse to the right


def set_hosts(row: dict) -> list[str]:
    """The hosts a row is of: its multi-node set's ("a,b"), else its own."""
    return [h for h in (row.get("host_set") or "").split(",") if h] or [row["host"]]


def _mark_health(report: dict) -> None:
    """Mark the throughput series and open regressions with their hosts' GPU health (newest check): a multi-node
    set's, the worst of its hosts' (its row is stored under its first host, whatever host of it is unhealthy)."""
    state = {h["host"]: h["gpu_health"] for h in report["fleet_health"]}
    for row in (*report["throughput"], *report["regressions"]):
        known = [state[h] for h in set_hosts(row) if h in state]
        if known:
            row["gpu_health"] = max(known, key=lambda v: HEALTH_ORDER.index(v) if v in HEALTH_ORDER else 0)


def notes(report: dict) -> list[str]:
    """Plain-words explanations of odd states in a report with results."""
    out = []
    s = report["summary"]
    if s["runs"] == 1:
        out.append("Only one run so far: the throughput plots show single points; trends, driver changes and "
                   "regressions need more nights.")
    for h in report["hosts"]:
        if h["ok"] == 0:
            out.append(f"Host {h['host']} has no ok result among these results ({h['failed']} failed, "
                       f"{h['skipped']} skipped): nothing of it to plot; see the failures.")
    issues = {h["host"]: h for h in report.get("fleet_health", []) if h["gpu_health"] != "healthy"}
    for host in sorted({h for r in report["regressions"] for h in set_hosts(r)} & set(issues)):
        h = issues[host]
        out.append(f"Host {host} has open regressions and its GPUs were {h['gpu_health']} at its newest check "
                   f"({h['issues']}): the drop may be the hardware, not the software.")
    if report["throughput_mode"] == FLEET:
        if report["throughput"]:
            out.append(f"Throughput: too many hosts and cases in this range for a line each; shown per case and GPU "
                       f"type, the fleet's median images/sec each night ({len(report['throughput'])} series, with "
                       f"each night's min, max and hosts in the points). Filter by host for one host's series.")
        if report.get("fleet_other_results"):
            out.append(f"Throughput across the fleet is images/sec only: {report['fleet_other_results']} ok results "
                       f"with another primary metric (a bandwidth, a latency, a command's own metric) are not in "
                       f"these charts. Filter by host to see them, one chart per metric and unit.")
    if not report["throughput"] and not report.get("fleet_other_results"):
        out.append("No ok results with a throughput in this range.")
    return out
