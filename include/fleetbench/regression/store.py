"""Regressions and the warehouse: a run's results against their baselines (read), its findings (written).

`assess_run` reads each ok result of a run and its baseline window from `benchmark_results` and
`steps` and judges them with `fleetbench.regression.detect`; `store_findings` makes the run's
`regressions` rows exactly those findings, in one transaction.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Mapping, Sequence

from fleetbench.config import RegressionSettings
from fleetbench.regression.detect import assess_case, findings_of
from fleetbench.timestamps import utc

log = logging.getLogger("fleetbench.regression")


@dataclass
class RunAssessment:
    """What `assess_run` found for one run: the regressions, and how many cases had a verdict or too little history."""

    findings: list[dict] = field(default_factory=list)
    checked: int = 0
    insufficient_history: list[str] = field(default_factory=list)  # "host case_key"
    improvements: list[dict] = field(default_factory=list)


def _digest_is(column, digest: str | None):
    return column.is_(None) if digest is None else column == digest


def assess_run(engine, dag_id: str, run_id: str, settings: RegressionSettings | None = None) -> RunAssessment:
    """Check every ok result of one run against its baseline (see the module docstring); reads only."""
    from sqlalchemy import and_, select

    from fleetbench.warehouse.schema import benchmark_results as br
    from fleetbench.warehouse.schema import steps

    settings = settings or RegressionSettings()
    out = RunAssessment()
    detected_at = datetime.now(timezone.utc).isoformat()
    with engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(
            select(br).where(br.c.dag_id == dag_id, br.c.run_id == run_id, br.c.status == "ok")
            .order_by(br.c.host, br.c.case_key))]
        for row in rows:
            label = f"{row['host']} {row['case_key']}"
            when = utc(row["logical_date"])
            if when is None:
                log.warning("%s: no logical date on the result, no baseline", label)
                out.insufficient_history.append(label)
                continue
            same_case = and_(br.c.dag_id == dag_id, br.c.host == row["host"], br.c.case_key == row["case_key"],
                             br.c.logical_date < when)
            baseline = [dict(r._mapping) for r in conn.execute(
                select(br).where(same_case, br.c.status == "ok", _digest_is(br.c.image_digest, row["image_digest"]))
                .order_by(br.c.logical_date.desc(), br.c.run_id.desc()).limit(settings.window))]
            if len(baseline) < settings.min_history:
                log.info("%s: insufficient history (%d earlier ok result(s) with image digest %s, need %d)",
                         label, len(baseline), row["image_digest"], settings.min_history)
                out.insufficient_history.append(label)
                continue
            out.checked += 1
            previous = conn.execute(select(br.c.image_digest).where(same_case, br.c.image_digest.is_not(None))
                                    .order_by(br.c.logical_date.desc(), br.c.run_id.desc()).limit(1)).scalar()
            run_ids = [row["run_id"]] + [b["run_id"] for b in baseline]
            samples = conn.execute(select(steps.c.run_id, steps.c.images_per_sec).where(
                steps.c.dag_id == dag_id, steps.c.host == row["host"], steps.c.case_key == row["case_key"],
                steps.c.run_id.in_(run_ids))).all()
            run_steps = [v for r, v in samples if r == row["run_id"] and v is not None]
            base_steps = [v for r, v in samples if r != row["run_id"] and v is not None]
            checks = assess_case(row, baseline, settings)
            out.findings += findings_of(row, baseline, checks, run_steps, base_steps, previous, detected_at)
            out.improvements += [{"host": row["host"], "case_key": row["case_key"], "metric": c.metric,
                                  "delta_pct": c.delta_pct, "z_score": c.z_score} for c in checks if c.improvement]
    return out


def _db_row(finding: Mapping[str, Any]) -> dict:
    from fleetbench.warehouse.schema import regressions

    row = {c.name: finding.get(c.name) for c in regressions.columns if c.name != "id"}
    for name in ("baseline_window", "changes"):
        if row[name] is not None and not isinstance(row[name], str):
            row[name] = json.dumps(row[name], sort_keys=True)
    row["detected_at"] = utc(row["detected_at"]) or datetime.now(timezone.utc)
    return row


def store_findings(engine, dag_id: str, run_id: str, findings: Sequence[Mapping[str, Any]]) -> int:
    """Make the run's `regressions` rows exactly `findings`, in one transaction; returns the rows written.

    Upserted on (dag_id, run_id, host, case_key, metric), so detecting again is idempotent; the run's
    rows that are not findings any more (a rerun that recovered) are deleted.
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
