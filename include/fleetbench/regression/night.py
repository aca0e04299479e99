"""A night against its baselines: assess the run's results, accept named baselines, store the findings, mail the news.

The body of the DAG's comparison (`fleetbench.airflow.pipeline.detect_regressions`, in the `report` task); the
statistics are in `detect` and `track`, the warehouse side in `store`.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

SUMMARY_FINDINGS = 50  # findings listed in the report task's return value (XCom); all are stored and logged


class NothingToAccept(ValueError):
    """An `accept_baselines` item that matched no ok result of the DAG (raised after the night's findings are
    stored and mailed)."""


def assess_night(run, triggered_by: str | None = None) -> dict:
    """Compare each stored (host, case) of the run (`fleetbench.run_model.RunInfo`) with its baseline: store the
    findings in `regressions` (replacing an earlier detection of the run), log them, mail them when
    `fleet.notify` is set. Returns a small summary for the run (counts and the first findings).

    With the `accept_baselines` parameter, the named hosts' (and cases') current level becomes their
    baseline once the night is assessed (`fleetbench.regression.accept_many`, as `fleetbench regressions
    accept`), and the night is assessed again; an item that matches nothing raises NothingToAccept, naming it."""
    from fleetbench.notify import notify
    from fleetbench.params import accept_targets
    from fleetbench.regression import accept_many, describe
    from fleetbench.regression.store import assess_and_store, mark_mailed, to_mail
    from fleetbench.warehouse import get_engine

    fleet = run.fleet_settings
    items = list(run.params.get("accept_baselines") or [])
    accepted, unmatched = [], []
    engine = get_engine()
    try:
        result = assess_and_store(engine, run.dag_id, run.run_id, fleet.regressions)
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
            result = assess_and_store(engine, run.dag_id, run.run_id, fleet.regressions)
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
    for f in confirmed:  # every open change, whether or not it is news tonight (mailed once: notify below)
        if not f.get("same_change_as"):
            log.warning("confirmed regression (%s%s): %s", f["severity"],
                        ", new tonight" if f.get("newly_confirmed") else "", describe(f))
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
