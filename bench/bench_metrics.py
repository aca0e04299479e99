"""`make bench` part: metric samples. A night of 20,000 results (1,000 hosts x 20 cases) with 5 metric samples
per ok result (`bench_warehouse.SAMPLES`: 99,000 result_metrics rows; the failed 1 % have none) stored by
`store_run` on PostgreSQL, next to the same night without samples; the target is under 5 s. Each night is stored with
its results' step lines (`bench_warehouse.step_rows`: 11 per ok result), as the DAG stores them. Median of 3 nights on
a fresh database (quick: 100 hosts), with the CPU time the client and the PostgreSQL backend spent (less at the
mercy of other load on the machine than the wall time). Run through `bench/run.py --only metrics`.
"""

from __future__ import annotations

import time

from bench_warehouse import CASES, SAMPLES, metric_rows, night_rows, step_rows
from common import PG_URL, median

NIGHTS = 3


def backend_cpu_s(database: str) -> float:
    """CPU seconds (user + system) the PostgreSQL backends serving `database` have used so far (their processes'
    /proc stat; 0 where the server runs elsewhere). With the client's own CPU time it is the work a store did,
    which the wall time on a shared, loaded machine hides."""
    import os

    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f" {database} ".encode() not in f.read().replace(b"\0", b" ") + b" ":
                    continue
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            continue
    return total


def bench_metrics(quick: bool) -> dict:
    from fleetbench.warehouse import get_engine, store_run, upgrade
    from pg_databases import fresh_database

    hosts = 100 if quick else 1000
    out = {"hosts": hosts, "results_per_night": hosts * len(CASES),
           "metric_rows_per_night": len(metric_rows(night_rows(0, hosts)[1])), "samples_per_ok_result": len(SAMPLES),
           "step_rows_per_night": sum(1 for _ in step_rows(night_rows(0, hosts)[1])), "nights": NIGHTS}
    with fresh_database(PG_URL, prefix="fb_bench_metrics") as pg:
        engine = get_engine(pg)
        try:
            upgrade(engine)
            for label, with_samples, first in (("without_samples", False, 0), ("with_samples", True, NIGHTS)):
                times, client, server = [], [], []
                database = pg.rsplit("/", 1)[1]
                for n in range(first, first + NIGHTS):
                    run, rows = night_rows(n, hosts)
                    samples = metric_rows(rows) if with_samples else []
                    steps = list(step_rows(rows))
                    start, cpu, db = time.monotonic(), time.process_time(), backend_cpu_s(database)
                    store_run(engine, run, [], rows, steps, metric_rows=samples)
                    times.append(round(time.monotonic() - start, 3))
                    client.append(round(time.process_time() - cpu, 3))
                    server.append(round(backend_cpu_s(database) - db, 3))
                out[f"night_store_s_{label}"] = {"median": median(times), "each": times}
                out[f"night_cpu_s_{label}"] = {"client": median(client), "postgres": median(server)}
        finally:
            engine.dispose()
    return out
