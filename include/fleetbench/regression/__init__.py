"""Regressions: each (host, case, metric) of a run against its baseline, stored; and the before/after report.

- `detect`: the statistics, pure (robust z, minimum effect, Mann-Whitney, what changed);
- `store`: a run's results and baselines read from the warehouse, its findings written to it;
- `compare`: the before/after report of `fleetbench compare`.
"""

from fleetbench.regression.compare import NoResults, compare, compare_case, format_compare, parse_side
from fleetbench.regression.detect import (
                                          MAD_TO_SIGMA,
                                          METRICS,
                                          SEVERITIES,
                                          MetricCheck,
                                          assess_case,
                                          average_ranks,
                                          check_metric,
                                          describe,
                                          detect_case,
                                          mad,
                                          mann_whitney_u,
                                          median,
                                          robust_z,
                                          what_changed,
)
from fleetbench.regression.store import RunAssessment, assess_run, store_findings

__all__ = ["MAD_TO_SIGMA", "METRICS", "SEVERITIES", "MetricCheck", "NoResults", "RunAssessment", "assess_case",
           "assess_run", "average_ranks", "check_metric", "compare", "compare_case", "describe", "detect_case",
           "format_compare", "mad", "mann_whitney_u", "median", "parse_side", "robust_z", "store_findings",
           "what_changed"]
