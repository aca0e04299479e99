"""Regressions and the warehouse: a run's results against their baselines (read), its findings (written).

`assess_run` reads, for each ok result of a run, its (host, case)'s ok results of the last
`history_days` and the acceptances (`read_history`, `read_acceptances`: the only reads), replays
them metric by metric (`fleetbench.regression.track`) and returns the last night's findings:
regressions and improvements, suspected or confirmed, with the metric they repeat (`same_change_as`).
`store_findings` makes the run's `regressions` rows exactly those findings, in one transaction.
"""

from __future__ import annotations

import collections.abc
import itertools
import json
import logging
import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Mapping, Sequence

from fleetbench.config import RegressionSettings
from fleetbench.regression.detect import (
    ENERGY_SOURCES,
    LEGACY_PRIMARY,
    SECONDARY,
    SEVERITIES,
    metrics_of,
    most_common,
    primary_of,
    severity_of,
    unit_of,
    what_changed,
)
from fleetbench.regression.track import (
    SEGMENT_FIELDS,
    TOO_FEW,
    NightIn,
    Verdict,
    segment_dict,
    segment_of,
    track,
)
from fleetbench.timestamps import utc

log = logging.getLogger("fleetbench.regression")


@dataclass
class RunAssessment:
    """What `assess_run` found for one run: its findings (regressions and improvements, suspected or confirmed),
    and how many cases had a verdict or too little history."""

    findings: list[dict] = field(default_factory=list)
    checked: int = 0
    insufficient_history: list[str] = field(default_factory=list)  # "host case_key"

    @property
    def regressions(self) -> list[dict]:
        return [f for f in self.findings if f["kind"] == "regression"]

    @property
    def confirmed(self) -> list[dict]:
        """Confirmed regressions: what is open, mailed and listed."""
        return [f for f in self.regressions if f["status"] == "confirmed"]

    @property
    def improvements(self) -> list[dict]:
        return [f for f in self.findings if f["kind"] == "improvement"]


# What the replay reads of a result (no telemetry: a year of them would not fit in memory).
HISTORY_COLUMNS = ("dag_id", "run_id", "logical_date", "host", "case_key", "image_digest", "driver_version",
                   "cuda_driver_version", "gpu_model", "images_per_sec", "duration_s", "energy_source", "energy_j",
                   "cost_usd", "step_cv", "step_count", "host_gpu_health", "metric", "value", "unit", "better",
                   "harness_revision", "precision", "price_source", "price_per_gpu_hour", "price_per_hour", "cpu_tdp_w")
HOSTS_PER_READ = 50  # hosts whose history is read at once


class HistoryRows(collections.abc.Sequence):
    """One (host, case)'s rows of `read_history`, oldest first, kept as the query returned them: a row is made a dict
    only when it is looked at (`series[i]`), and the replay reads `columns` (a fleet night reads a million rows,
    and a dict each would cost as much as the replay)."""

    def __init__(self, names: Sequence[str], rows: list):
        self.names = tuple(names)
        self._rows = rows
        self.columns: dict[str, list] = dict(zip(self.names, map(list, zip(*rows)))) if rows else {
            n: [] for n in self.names}

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [dict(zip(self.names, r)) for r in self._rows[i]]
        return dict(zip(self.names, self._rows[i]))


def read_history(conn, dag_id: str, hosts: Sequence[str], case_keys: Sequence[str], until, since,
                 run_id: str) -> dict[tuple[str, str], HistoryRows]:
    """The ok results of these hosts and cases with a logical date in [since, until) plus the run's own, oldest
    first, per (host, case). The one place that decides which stored results count as a night's result."""
    from sqlalchemy import or_, select

    from fleetbench.warehouse.schema import benchmark_results as br

    cols = [br.c[c] for c in HISTORY_COLUMNS]
    query = (select(*cols).where(br.c.dag_id == dag_id, br.c.status == "ok", br.c.host.in_(list(hosts)),
                                 br.c.case_key.in_(list(case_keys)), br.c.logical_date >= since,
                                 or_(br.c.logical_date < until, br.c.run_id == run_id))
             .order_by(br.c.host, br.c.case_key, br.c.logical_date, br.c.run_id))
    grouped: dict[tuple[str, str], list] = {}
    at_host, at_case = HISTORY_COLUMNS.index("host"), HISTORY_COLUMNS.index("case_key")
    at_run = HISTORY_COLUMNS.index("run_id")
    for r in conn.execute(query).all():  # fetched at once: a fleet night reads a million rows
        grouped.setdefault((r[at_host], r[at_case]), []).append(r)
    for series in grouped.values():  # in date order already; the run's own result last, even if another run
        series.sort(key=lambda m: m[at_run] == run_id)  # shares its logical date (a stable sort)
    return {key: HistoryRows(HISTORY_COLUMNS, series) for key, series in grouped.items()}


def open_regressions_since(conn, dag_id: str, hosts: Sequence[str], until, since) -> datetime | None:
    """The first night of the oldest confirmed regression still open on these hosts before `until` (a finding of the
    newest earlier night of its case, that night in [since, until)), or None. Whenever it began: on a sparse
    schedule (weekly) the nights before a recent start leave the window too, and the baseline took in the regressed
    nights until the finding closed by itself (it began in the older half of the window, before). A night without
    such findings costs one small read of the regressions table."""
    from sqlalchemy import and_, select

    from fleetbench.warehouse.schema import regressions as rg
    from fleetbench.warehouse.schema import runs as rn

    old = conn.execute(select(rg.c.host, rg.c.case_key, rg.c.run_id, rg.c.since_date)
                       .join(rn, and_(rn.c.dag_id == rg.c.dag_id, rn.c.run_id == rg.c.run_id))
                       .where(rg.c.dag_id == dag_id, rg.c.host.in_(list(hosts)), rg.c.kind == "regression",
                              rg.c.status == "confirmed", rg.c.since_date.is_not(None), rn.c.logical_date >= since,
                              rn.c.logical_date < until)).all()
    if not old:
        return None
    newest = _newest_runs(conn, dag_id, sorted({(h, c) for h, c, _, _ in old}), until, since)
    began = [utc(d) for h, c, r, d in old if newest.get((h, c)) == r and utc(d) is not None]
    return min(began) if began else None


def _newest_runs(conn, dag_id: str, keys: Sequence[tuple[str, str]], until, since) -> dict[tuple[str, str], str]:
    """(host, case) -> the run id of its newest ok night in [since, until)."""
    from sqlalchemy import select

    from fleetbench.warehouse.schema import benchmark_results as br

    out: dict[tuple[str, str], str] = {}
    for host, case_key in keys:
        row = conn.execute(select(br.c.run_id).where(
            br.c.dag_id == dag_id, br.c.host == host, br.c.case_key == case_key, br.c.status == "ok",
            br.c.logical_date < until, br.c.logical_date >= since).order_by(br.c.logical_date.desc()).limit(1)).first()
        if row is not None:
            out[(host, case_key)] = row[0]
    return out


def read_acceptances(conn, dag_id: str, hosts: Sequence[str]) -> dict[tuple[str, str], list[datetime]]:
    from sqlalchemy import select

    from fleetbench.warehouse.schema import regression_acceptances as ra

    out: dict[tuple[str, str], list[datetime]] = {}
    for host, case_key, since in conn.execute(select(ra.c.host, ra.c.case_key, ra.c.since)
                                              .where(ra.c.dag_id == dag_id, ra.c.host.in_(list(hosts)))):
        out.setdefault((host, case_key), []).append(utc(since))
    return out


def assess_run(engine, dag_id: str, run_id: str, settings: RegressionSettings | None = None) -> RunAssessment:
    """Each ok result of one run: its nights replayed (`fleetbench.regression.track`), the last night's findings;
    reads only."""
    from sqlalchemy import select

    from fleetbench.warehouse.schema import benchmark_results as br

    settings = settings or RegressionSettings()
    out = RunAssessment()
    detected_at = datetime.now(timezone.utc).isoformat()
    with engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(
            select(br.c.host, br.c.case_key, br.c.logical_date, br.c.telemetry_json)
            .where(br.c.dag_id == dag_id, br.c.run_id == run_id, br.c.status == "ok")
            .order_by(br.c.host, br.c.case_key))]
        undated = [r for r in rows if utc(r["logical_date"]) is None]
        for r in undated:
            log.warning("%s %s: no logical date on the result, no baseline", r["host"], r["case_key"])
            out.insufficient_history.append(f"{r['host']} {r['case_key']}")
        rows = [r for r in rows if utc(r["logical_date"]) is not None]
        if not rows:
            return out
        when = max(utc(r["logical_date"]) for r in rows)
        hosts = sorted({r["host"] for r in rows})
        cases = sorted({r["case_key"] for r in rows})
        for i in range(0, len(hosts), HOSTS_PER_READ):
            chunk = hosts[i:i + HOSTS_PER_READ]
            since = when - timedelta(days=settings.history_days)
            if (began := open_regressions_since(conn, dag_id, chunk, when, since)) is not None:
                # an open confirmed regression keeps its baseline however long it stays open (it closes when
                # accepted or recovered, not when its baseline's nights leave the window)
                since = min(since, began - timedelta(days=settings.history_days))
            history = read_history(conn, dag_id, chunk, cases, when, since, run_id)
            accepted = read_acceptances(conn, dag_id, chunk)
            for row in (r for r in rows if r["host"] in chunk):
                key = (row["host"], row["case_key"])
                series = history.get(key, [])
                unjudged: list[tuple[str, str]] = []
                found = assess_series(series, settings, accepted.get(key, ()), detected_at, unjudged)
                for metric, reason in unjudged:
                    if reason != TOO_FEW:
                        log.info("%s %s: %s not compared: %s", *key, metric, reason)
                if found is None:
                    if any(reason == TOO_FEW for _, reason in unjudged) or not unjudged:
                        log.info("%s %s: insufficient history (%d earlier ok result(s), need %d in the baseline's "
                                 "segment)", *key, len(series) - 1, settings.min_history)
                        out.insufficient_history.append(f"{key[0]} {key[1]}")
                    continue
                out.checked += 1
                if found:
                    base_rows = [s for s in series[:-1] if s["run_id"] in found[0]["baseline_window"]]
                    # the history has no telemetry (a year of it would not fit): the baseline's, for the findings only
                    telemetry = dict(conn.execute(
                        select(br.c.run_id, br.c.telemetry_json).where(
                            br.c.dag_id == dag_id, br.c.host == key[0], br.c.case_key == key[1],
                            br.c.run_id.in_(sorted({b["run_id"] for b in base_rows})))).all()) if base_rows else {}
                    base_rows = [{**b, "telemetry_json": telemetry.get(b["run_id"])} for b in base_rows]
                    changes = what_changed({**series[-1], "telemetry_json": row["telemetry_json"]}, base_rows,
                                           previous_digest=most_common(b["image_digest"] for b in base_rows))
                    for f in found:
                        f["changes"] = changes
                out.findings += found
    return out


def assess_series(series: Sequence[Mapping[str, Any]], settings: RegressionSettings,
                  accepted: Sequence[datetime] = (), detected_at: str | None = None,
                  unjudged: list[tuple[str, str]] | None = None) -> list[dict] | None:
    """The findings of the last night of one (host, case)'s nights (oldest first); None: no verdict at all.
    `unjudged`: a list that gets (metric, why) for each metric with a value on the last night but no verdict
    (`track`'s reasons: too little history, a baseline median that is not positive)."""
    if not series:
        return None
    row = series[-1]
    findings, judged = [], False
    cols, common, primaries = {}, None, []
    unit = primary_of(row)[1]
    for metric, direction in metrics_of(row):
        if _value_of(row, primary_of(row), metric, unit) is None:
            continue  # the last night has no value of this metric: no verdict, whatever the nights before it
        if common is None:
            cols = _columns(series)
            common = _night_fields(cols, dated=bool(accepted))
            primaries = _primaries(cols)
        nights = _nights(cols, metric, unit, common, primaries)
        why: list[str] = []
        verdict = track(nights, direction, settings, accepted, last_only=True, why=why)[-1]
        if verdict is None:
            if unjudged is not None:
                unjudged += [(metric, reason) for reason in why]
            continue
        judged = True
        if verdict.kind is not None:
            findings.append(finding_row(row, metric, direction, verdict, series, settings, detected_at))
    group_findings(findings, primary_of(row)[0])
    return findings if judged else None


# What a night's cost and estimated energy were worked out at: a price or a TDP changed in the config or the GPU
# catalog moves every night's figure with it, and is a new baseline (as energy measured another way), not a finding.
BASIS_COLUMNS = ("price_source", "price_per_gpu_hour", "price_per_hour", "cpu_tdp_w")

# What the replay reads of a row: its segment, date, step-level noise, run, primary metric and metric values.
REPLAY_COLUMNS = (*SEGMENT_FIELDS, "logical_date", "step_cv", "step_count", "run_id", "metric", "unit", "better",
                  "value", "images_per_sec", "energy_source", *SECONDARY, *BASIS_COLUMNS)


def _columns(series: Sequence[Mapping[str, Any]]) -> dict[str, list]:
    """The columns the replay reads (`REPLAY_COLUMNS`), a missing field as None: `HistoryRows.columns` as they are,
    else taken from the row dicts."""
    if isinstance(series, HistoryRows) and all(c in series.columns for c in REPLAY_COLUMNS):
        return series.columns
    return {c: [r.get(c) for r in series] for c in REPLAY_COLUMNS}


def _primaries(cols: Mapping[str, list]) -> list[tuple]:
    """Each row's `detect.primary_of`, from its columns."""
    return [(m, u, "lower" if b == "lower" else "higher") if m else LEGACY_PRIMARY if ips is not None else
            (None, None, "higher")
            for m, u, b, ips in zip(cols["metric"], cols["unit"], cols["better"], cols["images_per_sec"])]


def _night_fields(cols: Mapping[str, list], dated: bool = True) -> tuple[list, list, list, list]:
    """What every metric's nights share, as columns: (segments, whens, step-level standard errors, run_ids). `dated`:
    False leaves `when` None (the replay reads it only against acceptances)."""
    segments = list(zip(*(cols[f] for f in SEGMENT_FIELDS)))
    ses = [float(cv) / math.sqrt(n) if cv is not None and n else None for cv, n in zip(cols["step_cv"],
                                                                                         cols["step_count"])]
    whens = [utc(d) for d in cols["logical_date"]] if dated else [None] * len(segments)
    return segments, whens, ses, cols["run_id"]


def nights_of(series: Sequence[Mapping[str, Any]], metric: str, unit: str | None = None) -> list[NightIn]:
    """A metric's nights for `track` (`detect.metric_value`: a night whose primary metric is another one, or in
    another unit than `unit`, has no value). Energy compares like with like: a night whose energy came another
    way (measured, estimated) starts a new baseline, as does a cost at another price and a CPU estimate at another
    TDP (`BASIS_COLUMNS`)."""
    cols = _columns(series)
    return _nights(cols, metric, unit, _night_fields(cols), _primaries(cols))


def _nights(cols: Mapping[str, list], metric: str, unit: str | None, common: tuple[list, list, list, list],
            primaries: list[tuple]) -> list[NightIn]:
    """`nights_of` from the columns, the shared fields (`_night_fields`) and each row's primary metric worked out
    once for all the metrics (a fleet night builds a million nights)."""
    segments, whens, ses, run_ids = common
    n = len(segments)
    if primaries and primaries.count(primaries[0]) == n:  # one primary metric throughout: by column
        name, row_unit, _ = primaries[0]
        if name == metric:
            values = ([None] * n if unit is not None and row_unit is not None and row_unit != unit else
                      [v if m else ips for v, m, ips in zip(cols["value"], cols["metric"], cols["images_per_sec"])])
        elif metric in SECONDARY:
            values = cols[metric]
        else:
            values = [None] * n
    else:
        values = [_value_of(r, p, metric, unit) for r, p in zip(_dicts(cols), primaries)]
    if metric == "energy_j":
        sources = cols["energy_source"]
        values = [v if m in ENERGY_SOURCES else None for v, m in zip(values, sources)]
        # a CPU case's estimate is the host's TDP x utilisation: a new cpu_tdp_w is a new baseline
        measures = [s if t is None else (s, t) for s, t in zip(sources, cols["cpu_tdp_w"])]
    elif metric == "cost_usd":  # price x time: a new price is a new baseline
        measures = list(zip(cols["price_source"], cols["price_per_gpu_hour"], cols["price_per_hour"]))
    else:
        measures = itertools.repeat(None)
    # Another precision is another workload, never compared with this one (a new baseline, as energy measured another
    # way): a tf_cnn_benchmarks case's key does not name it (--use_fp16 in the benchmark's extra_args).
    if cols.get("precision"):  # a result stored without one ran at the default, fp32 (as capacity reads it)
        measures = list(zip(measures, [p or "fp32" for p in cols["precision"]]))
    return list(map(NightIn, values, segments, whens, ses, run_ids, measures))


def _dicts(cols: Mapping[str, list]) -> list[dict]:
    names = list(cols)
    return [dict(zip(names, r)) for r in zip(*cols.values())]


def _value_of(r: Mapping[str, Any], primary: tuple, metric: str, unit: str | None) -> float | None:
    """`detect.metric_value(r, metric, unit)` with the row's `primary_of` already worked out."""
    name, row_unit, _ = primary
    if name == metric:
        if unit is not None and row_unit is not None and row_unit != unit:
            return None
        return r.get("value") if r.get("metric") else r.get("images_per_sec")
    return r.get(metric) if metric in SECONDARY else None


def finding_row(row: Mapping[str, Any], metric: str, direction: str, v: Verdict,
                series: Sequence[Mapping[str, Any]], settings: RegressionSettings,
                detected_at: str | None) -> dict:
    """A `regressions` row for the last night's verdict."""
    since = series[v.since] if v.since is not None else row
    # A confirmed finding's severity is its change's (`track`: the candidate nights', the largest so far), not the
    # night's: one night either side of major_effect_pct would flip it, and the gauge and report with it.
    change = v.change_pct if v.status == "confirmed" and v.change_pct is not None else v.delta_pct
    bad = -change if direction == "higher" else change
    return {
        "dag_id": row["dag_id"], "run_id": row["run_id"], "host": row["host"], "case_key": row["case_key"],
        "metric": metric, "unit": unit_of(row, metric), "direction": direction, "baseline_value": v.baseline_value,
        "value": v.value,
        "delta_pct": v.delta_pct, "z_score": v.z_score, "p_value": None, "baseline_n": v.baseline_n,
        "baseline_window": list(v.baseline_runs), "changes": {},
        "severity": severity_of(abs(bad), settings), "detected_at": detected_at or datetime.now(timezone.utc),
        "kind": v.kind, "status": v.status, "basis": v.basis, "since_run_id": since["run_id"],
        "since_date": since["logical_date"], "segment": segment_dict(segment_of(row)),
        "baseline_segment": segment_dict(v.baseline_segment[:len(SEGMENT_FIELDS)]),
        "detectable_pct": v.detectable_pct, "same_change_as": None, "newly_confirmed": v.newly_confirmed,
        "nights_delta_pct": v.nights_delta_pct,
    }


# Findings that are one change seen through several metrics: a slower run takes longer, costs more
# (price x time) and uses more energy. The first metric found of the chain (the primary metric, then these) is
# the change; the others name it in `same_change_as`, so they are counted and mailed once.
SAME_CHANGE = ("duration_s", "cost_usd", "energy_j")


def group_findings(findings: list[dict], primary: str | None = "images_per_sec") -> None:
    """Set `same_change_as` on the findings of one (host, case) that repeat an earlier metric's finding of the
    same kind and status (the chain: the row's primary metric, then `SAME_CHANGE`), and no more severe: energy up
    35 % (major) beside a 4 % throughput drop (minor) is more than that drop explains, and a change of its own
    (as one, it was neither mailed at `min_severity: major` nor counted as major on /metrics), which the metrics
    after it (cost and energy after a major duration change) repeat in turn."""
    first: dict[tuple[str, str], tuple[str, int]] = {}
    for metric in ((primary,) if primary else ()) + tuple(m for m in SAME_CHANGE if m != primary):
        for f in findings:
            if f["metric"] == metric:
                key, rank = (f["kind"], f["status"]), SEVERITIES.index(f.get("severity") or "minor")
                if key in first and rank <= first[key][1]:
                    f["same_change_as"] = first[key][0]
                else:  # the first of its kind, or more severe than the change before it: it heads the rest
                    first[key] = (metric, rank)


def to_mail(engine, dag_id: str, findings: Sequence[Mapping[str, Any]], min_severity: str) -> list[Mapping[str, Any]]:
    """The night's findings to mail: each confirmed change once (the first metric of its chain, `group_findings`),
    at `min_severity` or worse, unless a mail of that change is on record: a confirmed finding of the same kind
    and (DAG, host, case), through any metric, with `mailed_at` set (`mark_mailed`, once the mail was sent), of
    tonight's run or of the same change: its first night (`since_run_id`), or a night on or after that
    (`since_date`), earlier or later than tonight.

    So a change confirmed as minor is mailed the night it turns major (with min_severity major it was never
    mailed); one confirmed through `duration_s` one night and through images/sec the next is mailed once; a mail
    that failed is sent the next night; a cleared report task does not mail its night again; and a backfill that
    measures old nights again on a new driver does not mail the change the nightly runs mailed."""
    from sqlalchemy import and_, or_, select

    from fleetbench.regression.detect import SEVERITIES
    from fleetbench.warehouse.schema import benchmark_results as br
    from fleetbench.warehouse.schema import regressions as rg

    floor = SEVERITIES.index(min_severity)
    candidates = [f for f in findings if f["status"] == "confirmed" and not f.get("same_change_as")
                  and SEVERITIES.index(f["severity"]) >= floor]
    if not candidates:
        return []
    out = []
    with engine.connect() as conn:
        for f in candidates:
            same = [rg.c.run_id == f["run_id"]]
            if f.get("since_run_id"):
                same.append(rg.c.since_run_id == f["since_run_id"])
            if utc(f.get("since_date")) is not None:
                same.append(br.c.logical_date >= utc(f["since_date"]))
            mailed = conn.execute(
                select(rg.c.id)
                .outerjoin(br, and_(br.c.dag_id == rg.c.dag_id, br.c.run_id == rg.c.run_id, br.c.host == rg.c.host,
                                    br.c.case_key == rg.c.case_key))
                .where(rg.c.dag_id == dag_id, rg.c.host == f["host"], rg.c.case_key == f["case_key"],
                       rg.c.kind == f["kind"], rg.c.status == "confirmed", rg.c.mailed_at.is_not(None), or_(*same))
                .limit(1)).first()
            if mailed is None:
                out.append(f)
    return out


def mark_mailed(engine, findings: Sequence[Mapping[str, Any]], when: datetime | None = None) -> int:
    """Record that these stored findings were mailed (`mailed_at`): call it once the mail has been sent, so a mail
    that failed is sent again the next night (`to_mail`). Returns the rows marked."""
    from sqlalchemy import and_, update

    from fleetbench.warehouse.schema import REGRESSION_KEY, regressions

    when = when or datetime.now(timezone.utc)
    marked = 0
    with engine.begin() as conn:
        for f in findings:
            marked += conn.execute(update(regressions).where(and_(*(regressions.c[k] == f[k] for k in REGRESSION_KEY)))
                                   .values(mailed_at=when)).rowcount
    return marked


def _db_row(finding: Mapping[str, Any]) -> dict:
    from fleetbench.warehouse.schema import regressions

    # mailed_at is not a finding's: `mark_mailed` sets it, and detecting the night again keeps it
    row = {c.name: finding.get(c.name) for c in regressions.columns if c.name not in ("id", "mailed_at")}
    for name in ("baseline_window", "changes", "segment", "baseline_segment"):
        if row[name] is not None and not isinstance(row[name], str):
            row[name] = json.dumps(row[name], sort_keys=True)
    row["detected_at"] = utc(row["detected_at"]) or datetime.now(timezone.utc)
    row["since_date"] = utc(row["since_date"])
    row["kind"] = row["kind"] or "regression"  # a finding handed in without them is a regression someone confirmed
    row["status"] = row["status"] or "confirmed"
    return row


def store_findings(engine, dag_id: str, run_id: str, findings: Sequence[Mapping[str, Any]]) -> int:
    """Make the run's `regressions` rows exactly `findings`, in one transaction; returns the rows written.

    Upserted on (dag_id, run_id, host, case_key, metric), so detecting again is idempotent; the run's
    rows that are not findings any more (a rerun that recovered) are deleted. A row kept keeps its `mailed_at`.
    """
    from sqlalchemy import and_, delete, not_, tuple_

    from fleetbench.warehouse import upsert_rows
    from fleetbench.warehouse.schema import REGRESSION_KEY, regressions

    rows = sorted((_db_row(f) for f in findings), key=lambda r: tuple(str(r[k]) for k in REGRESSION_KEY))
    if any((r["dag_id"], r["run_id"]) != (dag_id, run_id) for r in rows):
        raise ValueError(f"findings of another run than {dag_id}/{run_id}")
    keep = [(r["host"], r["case_key"], r["metric"]) for r in rows]
    stale = and_(regressions.c.dag_id == dag_id, regressions.c.run_id == run_id)
    if keep:
        stale = and_(stale, not_(tuple_(regressions.c.host, regressions.c.case_key, regressions.c.metric).in_(keep)))
    with engine.begin() as conn:
        conn.execute(delete(regressions).where(stale))
        upsert_rows(conn, regressions, rows, REGRESSION_KEY)
    return len(rows)


def acceptances_mark(engine, dag_id: str) -> tuple:
    """The DAG's acceptances in short: how many, and the newest `accepted_at` (an accept again updates it)."""
    from sqlalchemy import func, select

    from fleetbench.warehouse.schema import regression_acceptances as ra

    with engine.connect() as conn:
        return tuple(conn.execute(select(func.count(), func.max(ra.c.accepted_at)).where(ra.c.dag_id == dag_id)).one())


ASSESS_TRIES = 5


def assess_and_store(engine, dag_id: str, run_id: str, settings: RegressionSettings | None = None) -> RunAssessment:
    """`assess_run`, then `store_findings`; again while an acceptance landed meanwhile. An operator's `fleetbench
    regressions accept` during the night's report stores the run's findings with it, and the report's, read before
    it, overwrote them: the regression accepted was open again (until the next night). An acceptance stored after
    this check re-assesses the run itself, after its own write."""
    for _ in range(ASSESS_TRIES):
        mark = acceptances_mark(engine, dag_id)
        result = assess_run(engine, dag_id, run_id, settings)
        store_findings(engine, dag_id, run_id, result.findings)
        if acceptances_mark(engine, dag_id) == mark:
            break
        log.info("%s %s: a baseline was accepted while the run was assessed: assessing it again", dag_id, run_id)
    return result


def _newest_ok(conn, dag_id: str | None, host: str, case_key: str | None) -> list[dict]:
    """The newest ok result of each (DAG, host, case) matching (the night an open regression is read from); a
    multi-node case whose set includes `host` matches too, under the host it is stored under (its set's first)."""
    from sqlalchemy import func, select

    from fleetbench.warehouse.read import on_host
    from fleetbench.warehouse.schema import benchmark_results as br

    conds = [br.c.status == "ok", on_host(br, host)]  # a multi-node case of the host's set too
    if dag_id:
        conds.append(br.c.dag_id == dag_id)
    if case_key:
        conds.append(br.c.case_key == case_key)
    newest = (select(br.c.dag_id, br.c.host, br.c.case_key, func.max(br.c.logical_date).label("newest"))
              .where(*conds).group_by(br.c.dag_id, br.c.host, br.c.case_key).subquery())
    cols = [br.c[c] for c in HISTORY_COLUMNS]
    query = (select(*cols).join(newest, (newest.c.dag_id == br.c.dag_id) & (newest.c.host == br.c.host)
                                & (newest.c.case_key == br.c.case_key) & (newest.c.newest == br.c.logical_date))
             .where(*conds).order_by(br.c.dag_id, br.c.host, br.c.case_key))
    return [dict(r._mapping) for r in conn.execute(query)]


def _segment_start(conn, row: Mapping[str, Any]):
    """The first night of the newest unbroken run of nights in the row's segment (driver, CUDA driver, digest)."""
    from sqlalchemy import select

    from fleetbench.warehouse.schema import benchmark_results as br

    cols = [br.c[c] for c in HISTORY_COLUMNS]
    start = row["logical_date"]
    for r in conn.execute(select(*cols).where(br.c.dag_id == row["dag_id"], br.c.host == row["host"],
                                              br.c.case_key == row["case_key"], br.c.status == "ok",
                                              br.c.logical_date <= row["logical_date"])
                          .order_by(br.c.logical_date.desc())):
        if segment_of(dict(r._mapping)) != segment_of(row):
            break
        start = r.logical_date
    return start


def accept(engine, host: str, case_key: str | None = None, dag_id: str | None = None,
           accepted_by: str | None = None, note: str | None = None,
           settings: RegressionSettings | None = None) -> list[dict]:
    """Accept the current level of a host's cases (one case, or every case) as their new baseline
    (`accept_many` with one target); an empty list when nothing matched."""
    return accept_many(engine, [(host, case_key)], dag_id, accepted_by, note, settings)[(host, case_key)]


def accept_many(engine, targets: Sequence[tuple[str, str | None]], dag_id: str | None = None,
                accepted_by: str | None = None, note: str | None = None, settings: RegressionSettings | None = None,
                assessed_by_caller: tuple[str, str] | None = None) -> dict[tuple[str, str | None], list[dict]]:
    """Accept the current level of hosts' cases as their new baseline: what `fleetbench regressions accept` and
    fleet_benchmark's `accept_baselines` parameter do. `targets`: (host, case_key), case_key None for every case
    of the host.

    For each (DAG, host, case) matched: from the first night of the confirmed regression open on its newest
    night, else from the first night of its newest segment (a new driver, CUDA driver or digest not yet
    the baseline). Then the newest run of each (DAG, host, case) is assessed again and its findings
    stored, so the open list changes at once (except `assessed_by_caller`, a (dag_id, run_id) the caller
    assesses itself). Returns what was accepted per target; an empty list for a target that matched no ok
    result. Accepting twice is harmless (one row per (DAG, host, case, since)).
    """
    from sqlalchemy import select

    from fleetbench.warehouse import upsert_rows
    from fleetbench.warehouse.schema import regression_acceptances as ra
    from fleetbench.warehouse.schema import regressions as rg

    now = datetime.now(timezone.utc)
    done: dict[tuple[str, str | None], list[dict]] = {}
    rows: dict[tuple, dict] = {}  # (dag_id, host, case_key, since) -> the acceptance: one row each
    rerun = set()
    with engine.connect() as conn:
        for host, case_key in targets:
            accepted = done.setdefault((host, case_key), [])
            for row in _newest_ok(conn, dag_id, host, case_key):
                open_since = conn.execute(
                    select(rg.c.since_date).where(rg.c.dag_id == row["dag_id"], rg.c.run_id == row["run_id"],
                                                  rg.c.host == row["host"], rg.c.case_key == row["case_key"],
                                                  rg.c.kind == "regression", rg.c.status == "confirmed",
                                                  rg.c.since_date.is_not(None))
                    .order_by(rg.c.since_date).limit(1)).scalar()
                since = utc(open_since) or utc(_segment_start(conn, row))
                a = {"dag_id": row["dag_id"], "host": row["host"], "case_key": row["case_key"], "since": since,
                     "accepted_at": now, "accepted_by": accepted_by, "note": note,
                     "had_open_regression": open_since is not None}
                accepted.append(a)
                rows[(a["dag_id"], a["host"], a["case_key"], since)] = a
                rerun.add((row["dag_id"], row["run_id"]))
    if not rows:
        return done
    with engine.begin() as conn:
        upsert_rows(conn, ra, [{k: a[k] for k in ("dag_id", "host", "case_key", "since", "accepted_at", "accepted_by",
                                                  "note")} for _, a in sorted(rows.items(), key=lambda kv: str(kv[0]))],
                    ("dag_id", "host", "case_key", "since"))
    for dag, run_id in sorted(rerun - {assessed_by_caller}):
        assess_and_store(engine, dag, run_id, settings)
    return done
