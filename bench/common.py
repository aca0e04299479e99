"""What the parts of `make bench` share."""

from __future__ import annotations

import os
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PG_URL = os.environ.get("FLEETBENCH_BENCH_PG", "postgresql+psycopg2://fleetbench:fleetbench@127.0.0.1:5432/fleetbench")


def median(values):
    return statistics.median(values) if values else None
