"""The warehouse queries behind the report: one function per section, each a few set-based SQL
statements (aggregation, window functions and joins happen in the database), each returning plain
JSON-able data. The CLI (`fleetbench report`), the DAG's `report` task and the Airflow UI view
(`fleetbench.report.web`) all call `build_report`, so the three show the same numbers.

Filters (`Filters`, built and validated by `parse_filters`):

- `host`, `model`: one name each (the fleet config's name pattern); `dag_id`: one DAG's results.
- `since`, `until`: an ISO date (`2026-11-01`, whole UTC days, both inclusive) or an ISO date-time
  (`2026-11-01T02:00:00+00:00`, naive means UTC; `until` then exclusive), on the results' logical date.
  Without `since` the window is the `DEFAULT_DAYS` calendar days that end with the newest matching
  result (not "now": a warehouse that has been quiet for a month still shows its last month).

What "open regression" means: a `regressions` row found in the newest ok result of its
(DAG, host, case) up to the end of the window. A later ok measurement without that finding closes
it (recovered, or a new baseline); a later failed case does not (nothing was measured).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass
from datetime import date, datetime, time, timedelta, timezone
from typing import Any

from sqlalchemy import DateTime, Engine, and_, case, distinct, func, inspect, select, type_coerce

from fleetbench.config import NAME_PATTERN
from fleetbench.warehouse.schema import benchmark_results as br
from fleetbench.warehouse.schema import regressions as rg

DEFAULT_DAYS = 30
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
    """What the report shows. `since` inclusive, `until` exclusive, both aware UTC datetimes or None."""

    since: datetime | None = None
    until: datetime | None = None
    host: str | None = None
    model: str | None = None
    dag_id: str | None = None

    def describe(self) -> dict[str, str | None]:
        return {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in asdict(self).items()}


def _moment(field: str, text: str, end: bool) -> datetime:
    text = text.strip()
    if _DAY.match(text):
        try:
            day = date.fromisoformat(text)
        except ValueError as exc:
            raise FilterError(field, f"not a valid date: {text!r} ({exc})") from None
        # A day is a whole UTC day: `until` 2026-11-30 includes that day.
        return datetime.combine(day + timedelta(days=1) if end else day, time(), tzinfo=timezone.utc)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise FilterError(field, f"expected an ISO date (YYYY-MM-DD) or date-time (YYYY-MM-DDTHH:MM[:SS][+HH:MM]), "
                                 f"got {text!r}") from None
    if "T" not in text and " " not in text:  # fromisoformat also reads 20261101: be strict
        raise FilterError(field, f"expected an ISO date (YYYY-MM-DD) or date-time, got {text!r}")
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)


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


def _scope(f: Filters, *, window: tuple[datetime | None, datetime | None] | None = None, model: bool = True) -> list:
    """WHERE conditions on benchmark_results for the filters (and a [since, until) window)."""
    conds = []
    if f.dag_id:
        conds.append(br.c.dag_id == f.dag_id)
    if f.host:
        conds.append(br.c.host == f.host)
    if model and f.model:
        conds.append(br.c.model == f.model)
    since, until = window if window is not None else (f.since, f.until)
    if since is not None:
        conds.append(br.c.logical_date >= since)
    if until is not None:
        conds.append(br.c.logical_date < until)
    return conds


def _count(status: str):
    return func.sum(case((br.c.status == status, 1), else_=0))


# -- sections -------------------------------------------------------------------------------------
def resolve_window(conn, f: Filters) -> tuple[datetime | None, datetime | None, bool]:
    """(since, until, defaulted): without `since`, the DEFAULT_DAYS days ending with the newest matching result."""
    if f.since is not None:
        return f.since, f.until, False
    newest = aware(conn.execute(select(_ts(func.max(br.c.logical_date))).where(*_scope(f, window=(None, f.until)))).scalar())
    if newest is None:
        return None, f.until, True
    return datetime.combine(newest.date() - timedelta(days=DEFAULT_DAYS - 1), time(), tzinfo=timezone.utc), f.until, True


def filter_options(conn, f: Filters) -> dict[str, list[str]]:
    """Every host, model and DAG id the warehouse has results for (the view's drop-downs)."""
    def names(col):
        return [v for (v,) in conn.execute(select(col).distinct().where(col.is_not(None)).order_by(col))]
    return {"hosts": names(br.c.host), "models": names(br.c.model), "dag_ids": names(br.c.dag_id)}


def summary(conn, f: Filters) -> dict:
    row = conn.execute(select(
        func.count(distinct(br.c.run_id)).label("runs"), func.count().label("results"),
        _count("ok").label("ok"), _count("failed").label("failed"), _count("skipped").label("skipped"),
        func.count(distinct(br.c.host)).label("hosts"), func.count(distinct(br.c.model)).label("models"),
        _ts(func.min(br.c.logical_date)).label("first"), _ts(func.max(br.c.logical_date)).label("last"),
    ).where(*_scope(f))).one()._mapping
    return {k: (_iso(v) if k in ("first", "last") else int(v or 0)) for k, v in row.items()}


def host_summary(conn, f: Filters) -> list[dict]:
    """Per host: runs, ok/failed/skipped cases, the newest result and the newest ok one, GPU model, drivers seen."""
    rows = conn.execute(select(
        br.c.host, func.count(distinct(br.c.run_id)).label("runs"),
        _count("ok").label("ok"), _count("failed").label("failed"), _count("skipped").label("skipped"),
        _ts(func.max(br.c.logical_date)).label("last_seen"),
        _ts(func.max(case((br.c.status == "ok", br.c.logical_date)))).label("last_ok"),
        func.max(br.c.gpu_model).label("gpu_model"), func.count(distinct(br.c.driver_version)).label("drivers"),
        func.max(br.c.driver_version).label("max_driver"),
    ).where(*_scope(f)).group_by(br.c.host).order_by(br.c.host)).all()
    out = []
    for r in rows:
        m = dict(r._mapping)
        m["last_seen"], m["last_ok"] = _iso(m["last_seen"]), _iso(m["last_ok"])
        for k in ("runs", "ok", "failed", "skipped", "drivers"):
            m[k] = int(m[k] or 0)
        out.append(m)
    return out


def throughput(conn, f: Filters) -> list[dict]:
    """ok images/sec of every (host, case) over the window, one series each, oldest night first."""
    rows = conn.execute(select(
        br.c.model, br.c.host, br.c.case_key, br.c.num_gpus, br.c.batch_size_per_device, br.c.dag_id, br.c.run_id,
        br.c.logical_date, br.c.images_per_sec, br.c.driver_version,
    ).where(*_scope(f), br.c.status == "ok", br.c.images_per_sec.is_not(None))
        .order_by(br.c.model, br.c.host, br.c.case_key, br.c.logical_date, br.c.run_id)).all()
    series: dict[tuple, dict] = {}
    for r in rows:  # grouping an ordered result set (one query), not a query per series
        if not math.isfinite(r.images_per_sec):  # PostgreSQL floats can hold NaN and infinities
            continue
        s = series.setdefault((r.model, r.host, r.case_key), {
            "model": r.model, "host": r.host, "case_key": r.case_key, "num_gpus": r.num_gpus,
            "batch_size_per_device": r.batch_size_per_device, "points": []})
        s["points"].append({"logical_date": _iso(r.logical_date), "run_id": r.run_id, "dag_id": r.dag_id,
                            "images_per_sec": float(r.images_per_sec), "driver_version": r.driver_version})
    out = list(series.values())
    for s in out:
        values = [p["images_per_sec"] for p in s["points"]]
        s.update(n=len(values), latest=values[-1], latest_date=s["points"][-1]["logical_date"],
                 latest_driver=s["points"][-1]["driver_version"], min=min(values), max=max(values),
                 previous=values[-2] if len(values) > 1 else None)
        s["change_pct"] = (s["latest"] - s["previous"]) / s["previous"] * 100 if s["previous"] else None
    return out


def driver_changes(conn, f: Filters) -> list[dict]:
    """Nights on which a host reported another driver than on its previous night (LAG over the host's runs).

    The previous night may lie before the window, so an upgrade on the window's first night is found.
    """
    per_run = (select(br.c.dag_id, br.c.host, br.c.run_id, _ts(func.max(br.c.logical_date)).label("logical_date"),
                      func.max(br.c.driver_version).label("driver"))
               .where(*_scope(f, window=(None, f.until), model=False), br.c.driver_version.is_not(None))
               .group_by(br.c.dag_id, br.c.host, br.c.run_id).subquery("per_run"))
    lagged = select(
        per_run.c.dag_id, per_run.c.host, per_run.c.run_id, per_run.c.logical_date, per_run.c.driver,
        func.lag(per_run.c.driver).over(partition_by=(per_run.c.dag_id, per_run.c.host),
                                        order_by=(per_run.c.logical_date, per_run.c.run_id)).label("previous"),
    ).subquery("lagged")
    conds = [lagged.c.previous.is_not(None), lagged.c.previous != lagged.c.driver]
    if f.since is not None:
        conds.append(lagged.c.logical_date >= f.since)
    rows = conn.execute(select(lagged).where(*conds).order_by(lagged.c.logical_date, lagged.c.host)).all()
    return [{"host": r.host, "dag_id": r.dag_id, "run_id": r.run_id, "logical_date": _iso(r.logical_date),
             "from": r.previous, "to": r.driver} for r in rows]


def scaling(conn, f: Filters) -> list[dict]:
    """Speedup efficiency (N-GPU images/sec / (N x 1-GPU images/sec)) per model and GPU count (N >= 2; the 1-GPU
    case is the reference, 1.0 by definition): mean, min, max, cases, hosts."""
    rows = conn.execute(select(
        br.c.model, br.c.num_gpus, func.count().label("n"), func.avg(br.c.speedup_efficiency).label("mean"),
        func.min(br.c.speedup_efficiency).label("min"), func.max(br.c.speedup_efficiency).label("max"),
        func.count(distinct(br.c.host)).label("hosts"),
    ).where(*_scope(f), br.c.status == "ok", br.c.speedup_efficiency.is_not(None), br.c.num_gpus >= 2)
        .group_by(br.c.model, br.c.num_gpus).order_by(br.c.model, br.c.num_gpus)).all()
    return [{"model": r.model, "num_gpus": int(r.num_gpus), "n": int(r.n), "hosts": int(r.hosts),
             "mean": _num(r.mean), "min": _num(r.min), "max": _num(r.max)} for r in rows]


def efficiency(conn, f: Filters) -> list[dict]:
    """Images per joule and cost per million images per GPU model (catalog name, else as reported) and model."""
    gpu_expr = func.coalesce(br.c.gpu_catalog_name, br.c.gpu_model)
    rows = conn.execute(select(
        gpu_expr.label("gpu"), br.c.model, func.count().label("n"),
        func.avg(br.c.images_per_joule).label("images_per_joule"),
        func.avg(br.c.cost_per_million_images_usd).label("cost_per_million_images_usd"),
        func.sum(case((and_(br.c.images_per_joule.is_not(None), br.c.energy_source == "measured"), 1), else_=0)).label("measured"),
        func.sum(case((and_(br.c.images_per_joule.is_not(None), br.c.energy_source == "estimated"), 1), else_=0)).label("estimated"),
    ).where(*_scope(f), br.c.status == "ok", gpu_expr.is_not(None),
            (br.c.images_per_joule.is_not(None)) | (br.c.cost_per_million_images_usd.is_not(None)))
        .group_by(gpu_expr, br.c.model).order_by(gpu_expr, br.c.model)).all()
    return [{"gpu": r.gpu, "model": r.model, "n": int(r.n), "images_per_joule": _num(r.images_per_joule),
             "cost_per_million_images_usd": _num(r.cost_per_million_images_usd),
             "measured": int(r.measured or 0), "estimated": int(r.estimated or 0)} for r in rows]


def latest_run(conn, f: Filters) -> dict | None:
    """The newest run in the window (by logical date) that has matching results, with its case counts."""
    newest = conn.execute(select(br.c.dag_id, br.c.run_id, _ts(br.c.logical_date).label("logical_date"))
                          .where(*_scope(f)).order_by(br.c.logical_date.desc(), br.c.stored_at.desc(), br.c.run_id.desc())
                          .limit(1)).first()
    if newest is None:
        return None
    counts = conn.execute(select(func.count().label("total"), _count("ok").label("ok"), _count("failed").label("failed"),
                                 _count("skipped").label("skipped"))
                          .where(*_scope(f, window=(None, None)), br.c.dag_id == newest.dag_id,
                                 br.c.run_id == newest.run_id)).one()
    return {"dag_id": newest.dag_id, "run_id": newest.run_id, "logical_date": _iso(newest.logical_date),
            **{k: int(v or 0) for k, v in counts._mapping.items()}}


def failures(conn, f: Filters, run: dict | None) -> list[dict]:
    """The run's failed and skipped cases by failure class, with the hosts they happened on."""
    if run is None:
        return []
    rows = conn.execute(select(br.c.status, br.c.failure_class, br.c.host, func.count().label("n"))
                        .where(*_scope(f, window=(None, None)), br.c.dag_id == run["dag_id"], br.c.run_id == run["run_id"],
                               br.c.status != "ok")
                        .group_by(br.c.status, br.c.failure_class, br.c.host)).all()
    classes: dict[tuple[str, str], dict] = {}
    for r in rows:  # a handful of aggregated rows: (status, class, host) -> count
        name = r.failure_class or "unclassified"
        c = classes.setdefault((r.status, name), {"status": r.status, "failure_class": name, "count": 0, "hosts": {}})
        c["count"] += int(r.n)
        c["hosts"][r.host] = int(r.n)
    return sorted(classes.values(), key=lambda c: (-c["count"], c["status"], c["failure_class"]))


def open_regressions(conn, f: Filters) -> list[dict]:
    """Regressions found in the newest ok result of their (DAG, host, case) up to the window's end (see module doc)."""
    newest_ok = (select(br.c.dag_id, br.c.host, br.c.case_key, func.max(br.c.logical_date).label("newest"))
                 .where(*_scope(f, window=(None, f.until)), br.c.status == "ok")
                 .group_by(br.c.dag_id, br.c.host, br.c.case_key).subquery("newest_ok"))
    rows = conn.execute(
        select(rg.c.dag_id, rg.c.run_id, rg.c.host, rg.c.case_key, br.c.model, rg.c.metric, rg.c.direction,
               rg.c.baseline_value, rg.c.value, rg.c.delta_pct, rg.c.z_score, rg.c.p_value, rg.c.baseline_n,
               rg.c.changes, rg.c.severity, br.c.logical_date)
        .join(br, and_(br.c.dag_id == rg.c.dag_id, br.c.run_id == rg.c.run_id, br.c.host == rg.c.host,
                       br.c.case_key == rg.c.case_key))
        .join(newest_ok, and_(newest_ok.c.dag_id == br.c.dag_id, newest_ok.c.host == br.c.host,
                              newest_ok.c.case_key == br.c.case_key, newest_ok.c.newest == br.c.logical_date))
        .where(*_scope(f))
        .order_by(case((rg.c.severity == "major", 0), else_=1), rg.c.host, rg.c.case_key, rg.c.metric)).all()
    out = []
    for r in rows:
        m = dict(r._mapping)
        m["logical_date"] = _iso(m["logical_date"])
        try:
            m["changes"] = json.loads(m["changes"]) if m["changes"] else {}
        except ValueError:
            m["changes"] = {"note": str(m["changes"])}
        out.append(m)
    return out


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
        "hosts": [], "throughput": [], "driver_changes": [], "scaling": [], "efficiency": [],
        "latest_run": None, "failures": [], "regressions": [],
    }


def build_report(engine: Engine, f: Filters | None = None) -> dict:
    """Every section of the report as plain data (JSON-able), read in one connection.

    `state` says what the warehouse held: `no_tables` (nothing stored yet), `outdated` (a schema older
    than revision 0003, whose derived-metric columns and regressions the report reads), `empty`
    (tables, no results), `no_match` (results, none matching the filters) or `ok`; `notes` explain odd states
    (one run only, hosts with only failures, sections without data) in words for people.
    """
    f = f or Filters()
    report = blank_report(f, engine.url.render_as_string(hide_password=True))
    tables = set(inspect(engine).get_table_names())
    if br.name not in tables:
        report["state"] = NO_TABLES
        report["notes"].append("No results yet: nothing has been stored in this warehouse (the fleet DAG creates "
                               "its tables with the first run; `fleetbench db upgrade` creates them by hand).")
        return report
    if rg.name not in tables:  # revision 0003 added it together with the derived-metric columns
        report["state"] = OUTDATED
        report["notes"].append("This warehouse's schema predates the report (it needs revision 0003's derived metrics "
                               "and regressions): run `fleetbench db upgrade`, or let the fleet DAG's next run do it.")
        return report
    with engine.connect() as conn:
        report["options"] = filter_options(conn, f)
        if not report["options"]["hosts"]:
            report["state"] = EMPTY
            report["notes"].append("No results yet: the warehouse has tables but no benchmark results.")
            return report
        since, until, defaulted = resolve_window(conn, f)
        scoped = Filters(since=since, until=until, host=f.host, model=f.model, dag_id=f.dag_id)
        report["window"] = {"since": _iso(since), "until": _iso(until), "defaulted": defaulted}
        report["summary"] = summary(conn, scoped)
        if report["summary"]["results"] == 0:
            report["state"] = NO_MATCH
            report["notes"].append("No results match these filters.")
            return report
        report["hosts"] = host_summary(conn, scoped)
        report["throughput"] = throughput(conn, scoped)
        report["driver_changes"] = driver_changes(conn, scoped)
        report["scaling"] = scaling(conn, scoped)
        report["efficiency"] = efficiency(conn, scoped)
        report["latest_run"] = latest_run(conn, scoped)
        report["failures"] = failures(conn, scoped, report["latest_run"])
        report["regressions"] = open_regressions(conn, scoped)
    report["notes"] += notes(report)
    return report


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
    if not report["throughput"]:
        out.append("No ok results with a throughput in this range.")
    return out
