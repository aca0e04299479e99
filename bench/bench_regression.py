"""`make bench` part: regressions an operator can trust. The driver-upgrade scenario of
tests/regression_scenario.py (20 hosts x 10 cases x 40 nights, seed 24) stored night by night with
`store_run` into a fresh SQLite warehouse, each night from 8 on assessed with `assess_run` and its
findings stored with `store_findings` (the DAG's compare step), then scored: recall of confirmed
findings at -2/-5/-10/-25/+10 %, confirmed (and suspected) false alarms per 1,000 unchanged checks by
noise band, outlier nights flagged and confirmed, and `fleetbench compare` by driver. Also the time
a night's assessment takes. Run through `bench/run.py --only regression`.

The figures before issue 24 (single-night robust z against the last 7 results whatever the driver,
no confirmation), same scenario and seed: confirmed-as-raised false alarms per 1,000 checks 33.3
(< 1 % noise), 34.5 (1-2 %), 54.2 (>= 2 %), of which plain noise 0.0 / 9.6 / 25.8; 170 of 173 outlier
nights raised; recall (any night from the change) -2 % 6/10, -5 % 8/10, -10 % 9/10, -25 % 10/10;
open on the last night 0/10 for every effect; compare by driver right at -5 % 4/10, -10 % 9/10,
+10 % 7/10, 0 false verdicts.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from common import median

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from regression_scenario import (  # noqa: E402  (tests/ holds the scenario, shared with its test)
    NEW_DRIVER,
    OLD_DRIVER,
    evaluate,
    evaluate_compare,
    generate,
    night_run_id,
    store_nights,
)

FIRST = 8


def bench_regression(quick: bool) -> dict:
    from fleetbench.regression import assess_run, compare, store_findings
    from fleetbench.warehouse import get_engine, upgrade

    folder = tempfile.mkdtemp(prefix="fleetbench-bench-regression-")
    try:
        engine = get_engine(f"sqlite:///{folder}/w.db")
        upgrade(engine)
        sc = generate(hosts=10 if quick else 20)
        start = time.monotonic()
        store_nights(engine, sc)
        stored_s = time.monotonic() - start
        per_night = []
        for n in range(FIRST, sc.nights):
            t = time.monotonic()
            store_findings(engine, "fleet_benchmark", night_run_id(n),
                           assess_run(engine, "fleet_benchmark", night_run_id(n)).findings)
            per_night.append(time.monotonic() - t)
        scores = evaluate(engine, sc)
        by_driver = evaluate_compare(sc, compare(engine, f"driver={OLD_DRIVER[0]}", f"driver={NEW_DRIVER[0]}"))
        engine.dispose()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {
        "scenario": {"hosts": sc.hosts, "cases": 10, "nights": sc.nights, "seed": sc.seed},
        "store_all_nights_s": round(stored_s, 2),
        "assess_and_store_night_s_median": round(median(per_night), 3),
        "assess_and_store_last_night_s": round(per_night[-1], 3),
        "checks_by_noise_band": scores["checks"],
        "confirmed_false_alarms_per_1000": scores["false_alarms_per_1000"],
        "suspected_per_1000": scores["suspected_per_1000"],
        "outlier_nights": scores["outlier_nights"], "outliers_flagged_suspected": scores["outliers_flagged"],
        "outliers_confirmed": scores["outliers_confirmed"],
        "recall_confirmed": scores["recall"], "open_on_last_night": scores["open_on_last_night"],
        "recall_5pct_under_2pct_noise": scores["recall_5pct_under_2pct_noise"],
        "compare_by_driver_right": by_driver["right"], "compare_by_driver_false_verdicts": by_driver["false_verdicts"],
        "compare_by_driver_not_enough_nights": by_driver["not_enough_nights"],
    }


# -- a fleet's night (`bench/run.py --only regression_night`) ---------------------------------------
NIGHT_HISTORY = 60  # nights before the timed one: the noise scale's window (scale_window)
DROP_EVERY = 50  # one host in this many runs 10 % slower on the timed night: findings to store


def bench_regression_night(quick: bool) -> dict:
    """The DAG's store and compare steps for one fleet night of `hosts` x 20 = 20,000 results on top of
    NIGHT_HISTORY nights of history: `store_run`, `assess_run` (every result's nights replayed, metric by
    metric) and `store_findings`, each timed once, on SQLite and PostgreSQL (a fresh database each; the history
    filled in bulk SQL as the warehouse part fills it, without step lines; the timed night's results stored with
    their step lines, energy and cost as the DAG stores them). One host in DROP_EVERY is 10 % slower that night
    (its wall time, energy and cost 1/0.9 of its usual), so there are findings to store: the detector checks
    images_per_sec, duration_s, energy_j and cost_usd. Target: the three together in under 10 s."""
    from bench_warehouse import derived, fill_history, night_rows, step_rows
    from common import PG_URL
    from fleetbench.regression import assess_run, store_findings
    from fleetbench.warehouse import get_engine, store_run, upgrade
    from pg_databases import fresh_database

    hosts = 100 if quick else 1000
    history = 12 if quick else NIGHT_HISTORY
    out: dict = {"hosts": hosts, "results_per_night": hosts * 20, "history_nights": history,
                 "slower_hosts": len(range(0, hosts, DROP_EVERY)), "target_total_s": 10.0}
    folder = tempfile.mkdtemp(prefix="fleetbench-bench-night-")
    try:
        with fresh_database(PG_URL, prefix="fb_bench") as pg:
            for label, url in (("sqlite", f"sqlite:///{folder}/w.db"), ("postgresql", pg)):
                engine = get_engine(url)
                try:
                    upgrade(engine)
                    res = fill_history(engine, range(history), hosts)
                    run, rows = night_rows(history, hosts)
                    for r in rows:
                        if int(r["host"].rsplit("-", 1)[1]) % DROP_EVERY == 0 and r["images_per_sec"] is not None:
                            r["images_per_sec"] *= 0.9
                            r["value"] *= 0.9  # the primary metric, which the detector reads
                            r["duration_s"] /= 0.9
                            derived(r)  # energy, cost and the rest follow, as `derive` makes them
                    steps = list(step_rows(rows))
                    t0, c0 = time.monotonic(), time.process_time()
                    store_run(engine, run, [], rows, steps)
                    t1, c1 = time.monotonic(), time.process_time()
                    assessment = assess_run(engine, run["dag_id"], run["run_id"])
                    t2, c2 = time.monotonic(), time.process_time()
                    stored = store_findings(engine, run["dag_id"], run["run_id"], assessment.findings)
                    t3, c3 = time.monotonic(), time.process_time()
                    res.update(store_run_s=round(t1 - t0, 2), assess_run_s=round(t2 - t1, 2),
                               store_findings_s=round(t3 - t2, 2), total_s=round(t3 - t0, 2),
                               # this process's CPU time (a loaded machine's wall time is mostly waiting; the
                               # PostgreSQL server's own work is not in it)
                               store_run_cpu_s=round(c1 - c0, 2), assess_run_cpu_s=round(c2 - c1, 2),
                               store_findings_cpu_s=round(c3 - c2, 2), total_cpu_s=round(c3 - c0, 2),
                               step_rows=len(steps), checked=assessment.checked, findings=stored,
                               regressions=len(assessment.regressions),
                               findings_by_metric=dict(sorted(Counter(
                                   f["metric"] for f in assessment.findings).items())))
                    out[label] = res
                finally:
                    engine.dispose()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return out
