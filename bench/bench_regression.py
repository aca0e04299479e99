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
from pathlib import Path

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
        "assess_and_store_night_s_median": round(sorted(per_night)[len(per_night) // 2], 3),
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
