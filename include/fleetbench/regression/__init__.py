"""Regressions: each (host, case, metric) of a run against its baseline, stored; and the before/after report.

- `detect`: the statistics, pure (robust z, minimum effect, Mann-Whitney, what changed);
- `track`: a (host, case, metric)'s nights replayed: segments, baselines, suspected and confirmed, open;
- `store`: a run's results and their history read from the warehouse, its findings written to it,
  acceptances;
- `compare`: the before/after report of `fleetbench compare` (nightly values, intervals).
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
from fleetbench.regression.store import RunAssessment, accept, accept_many, assess_run, store_findings
from fleetbench.regression.track import SEGMENT_FIELDS, NightIn, Verdict, track

__all__ = ["MAD_TO_SIGMA", "METRICS", "SEGMENT_FIELDS", "SEVERITIES", "MetricCheck", "NightIn", "NoResults",
           "RunAssessment", "Verdict", "accept", "accept_many", "assess_case", "assess_run", "average_ranks",
           "check_metric", "compare", "compare_case", "describe", "detect_case", "format_compare", "mad",
           "mann_whitney_u", "median", "parse_side", "robust_z", "store_findings", "track", "what_changed"]
