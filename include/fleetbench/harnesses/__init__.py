"""Harnesses: one module each (argv for a case, log -> metric samples), and their registry.

Adding a harness is one module with a `HARNESS` (a `base.Harness`), its parser and tests, and a line here.
"""

from __future__ import annotations

from fleetbench.harnesses import command, nccl_tests, tf_cnn, torch_synthetic
from fleetbench.harnesses.base import CasePoint, Harness, Measured, MetricSample

HARNESSES: dict[str, Harness] = {h.name: h for h in (tf_cnn.HARNESS, torch_synthetic.HARNESS, command.HARNESS,
                                                      nccl_tests.HARNESS)}
DEFAULT = tf_cnn.HARNESS.name

# Every matrix axis a benchmark can have (BenchmarkSpec fields); each harness names the ones it uses.
MATRIX_AXES = ("models", "batch_sizes", "num_gpus", "variable_update", "precisions", "channels_last", "compile",
               "collectives", "size_ranges")


def get(name: str | None) -> Harness:
    """The harness of that name (None: tf_cnn_benchmarks); KeyError names the known ones."""
    try:
        return HARNESSES[name or DEFAULT]
    except KeyError:
        raise KeyError(f"unknown harness {name!r} (known: {', '.join(sorted(HARNESSES))})") from None


__all__ = ["HARNESSES", "MATRIX_AXES", "CasePoint", "Harness", "Measured", "MetricSample", "get"]
