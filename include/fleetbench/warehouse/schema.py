"""Warehouse schema (SQLAlchemy Core). Changes go through an Alembic revision in `migrations/versions/`."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)

metadata = MetaData()

RUN_KEY = ("dag_id", "run_id")
HOST_KEY = ("dag_id", "run_id", "host")
RESULT_KEY = ("dag_id", "run_id", "host", "case_key")
STEP_KEY = ("dag_id", "run_id", "host", "case_key", "step")

# The rows of benchmark_results that report sections and the plan read, each with its partial index (revision
# 0016): a query that names the same condition, word for word, reads only those rows (SQLite matches a partial
# index's WHERE term by term, with literals, not bound parameters). Results with a memory reading (the capacity
# profiles' points), OOMs (their bounds: the index holds every column the bounds' GROUP BY reads; the night of
# each, which a later ok result must beat to lift it, comes from the few OOM rows themselves), OOMs the plan said
# would fit (the misses), and multi-node results (the
# "Scaling across nodes" table).
MEMORY_READING_ROWS = "status = 'ok' AND (peak_gpu_mem_mib IS NOT NULL OR peak_mem_mib IS NOT NULL)"
OOM_ROWS = "failure_class IN ('gpu_oom', 'oom_killed')"
MISSED_OOM_ROWS = "failure_class IN ('gpu_oom', 'oom_killed') AND capacity_note LIKE 'fits%'"
MULTINODE_OK_ROWS = "status = 'ok' AND nodes >= 2"
OOM_BOUND_COLUMNS = ("model", "harness", "precision", "device", "capacity_mib", "failure_class",
                     "batch_size_per_device", "dag_id")


def _partial(name: str, where: str, *columns: str) -> Index:
    return Index(name, *columns, sqlite_where=text(where), postgresql_where=text(where))


runs = Table(
    "runs", metadata,
    Column("dag_id", String(250), primary_key=True),
    Column("run_id", String(250), primary_key=True),
    Column("logical_date", DateTime(timezone=True), index=True),
    Column("run_type", String(50)),
    Column("fleet", String(100)),
    Column("config_digest", String(64)),
    Column("started_at", DateTime(timezone=True)),
    Column("finished_at", DateTime(timezone=True)),
    Column("cases_total", Integer, nullable=False, default=0),
    Column("cases_ok", Integer, nullable=False, default=0),
    Column("cases_failed", Integer, nullable=False, default=0),
    Column("cases_skipped", Integer, nullable=False, default=0),
)

host_facts = Table(
    "host_facts", metadata,
    Column("dag_id", String(250), primary_key=True),
    Column("run_id", String(250), primary_key=True),
    Column("host", String(100), primary_key=True),
    Column("verdict", String(20), nullable=False),
    Column("reasons", Text),
    Column("kernel", String(100)),
    Column("docker_version", String(100)),
    Column("driver_version", String(50)),
    Column("cuda_driver_version", String(20)),
    Column("gpu_count", Integer),
    Column("gpu_model", String(200)),
    Column("nvidia_runtime", Boolean),
    Column("facts_json", Text),
    Column("checks_json", Text),
    Column("collected_at", DateTime(timezone=True)),
    # GPU health (revision 0006): healthy | degraded | unfit, NULL when not checked; the health checks that
    # did not pass ("gpu_pcie_link:warn, ..."); the health facts (ECC, remaps, XIDs, topology, DCGM) as JSON.
    Column("gpu_health", String(20)),
    Column("gpu_health_issues", Text),
    Column("gpu_health_json", Text),
)

benchmark_results = Table(
    "benchmark_results", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("dag_id", String(250), nullable=False),
    Column("run_id", String(250), nullable=False),
    Column("logical_date", DateTime(timezone=True)),
    Column("host", String(100), nullable=False),
    Column("case_key", String(250), nullable=False),
    Column("benchmark", String(100)),
    Column("model", String(100)),
    Column("batch_size_per_device", Integer),
    Column("batch_size_global", Integer),
    Column("num_gpus", Integer),
    Column("variable_update", String(50)),
    Column("device", String(10)),
    Column("num_batches", Integer),
    Column("image_name", String(100)),
    Column("image_ref", String(500)),
    Column("image_digest", String(100)),
    Column("status", String(20), nullable=False),
    Column("failure_class", String(50)),
    Column("failure_detail", Text),
    Column("images_per_sec", Float),
    Column("step_count", Integer),
    Column("exit_code", Integer),
    Column("started_at", DateTime(timezone=True)),
    Column("finished_at", DateTime(timezone=True)),
    Column("duration_s", Float),
    Column("driver_version", String(50)),
    Column("cuda_driver_version", String(20)),
    Column("gpu_model", String(200)),
    Column("command", Text),
    Column("log_path", Text),
    Column("energy_source", String(20)),
    Column("energy_j", Float),
    Column("stored_at", DateTime(timezone=True)),
    Column("mean_power_w", Float),
    Column("peak_gpu_mem_mib", Float),
    Column("mean_gpu_util_pct", Float),
    Column("telemetry_json", Text),
    # Derived metrics (fleetbench.metrics.derive; revision 0003).
    Column("precision", String(10)),
    Column("gpu_catalog_name", String(100)),
    Column("time_for_batches_s", Float),
    Column("accuracy_top1", Float),
    Column("time_to_accuracy_s", Float),
    Column("step_median_images_per_sec", Float),
    Column("step_spread_images_per_sec", Float),
    Column("step_cv", Float),
    Column("speedup_efficiency", Float),
    Column("speedup_baseline_case_key", String(250)),
    Column("price_per_gpu_hour", Float),
    Column("price_source", String(20)),
    Column("cost_usd", Float),
    Column("cost_per_million_images_usd", Float),
    Column("energy_kwh", Float),
    Column("images_per_joule", Float),
    Column("carbon_g_per_kwh", Float),
    Column("carbon_g", Float),
    # The health of the host's GPUs when the case ran: host_facts.gpu_health of its run (revision 0006).
    Column("host_gpu_health", String(20)),
    # Cost and energy of CPU cases (revision 0007).
    Column("price_per_hour", Float),
    Column("cpu_tdp_w", Float),
    Column("mean_cpu_util_pct", Float),
    # Capacity (revision 0009, fleetbench.capacity): the container's peak memory (CPU cases) and where it
    # was read, the memory the case had, and the plan's prediction for it.
    Column("peak_mem_mib", Float),
    Column("peak_mem_source", String(20)),
    Column("capacity_mib", Float),
    Column("predicted_mem_mib", Float),
    Column("capacity_note", Text),
    # The case's harness and its primary metric (revision 0010): images_per_sec for tf_cnn_benchmarks,
    # avg_busbw (GB/s) for nccl_tests, ...; `better` is the direction (higher | lower). Every metric
    # sample of the case is in result_metrics.
    Column("harness", String(50)),
    Column("metric", String(100)),
    Column("value", Float),
    Column("unit", String(20)),
    Column("better", String(10)),
    # Which execution of the case this row is (revision 0011, `fleetbench.warehouse.attempts`): its number
    # (1, 2, ... in the order they were stored) and the identity of its container outcome.
    Column("attempt", Integer, nullable=False, server_default="1"),
    Column("attempt_id", String(64)),
    # The MIG profile the case ran on and how many of its instances (revision 0012, fleetbench.hosts.devices);
    # NULL for whole-GPU and CPU cases.
    Column("mig_profile", String(40)),
    Column("mig_instances", Integer),
    # Multi-node cases (revision 0014, fleetbench.multinode): the number of hosts, the host set ("a,b"; NULL
    # for one host), each role's host, job, task index and end (JSON), and the speedup efficiency across
    # nodes: total images/sec / (nodes x the 1-node images/sec of the same model, batch and GPUs per node).
    Column("nodes", Integer, nullable=False, server_default="1"),
    Column("host_set", Text),
    Column("roles_json", Text),
    Column("node_efficiency", Float),
    Column("node_baseline_images_per_sec", Float),
    # What a baked image added to its base (revision 0023, fleetbench.bake): the bake's inputs hash (its tag's) and
    # the harness revision (git commit, copied files' hash). image_digest stays the base's registry digest, so these
    # say when the harness code changed under one base (NULL: not baked, or stored before 0023).
    Column("bake_inputs", String(64)),
    Column("harness_revision", String(200)),
    UniqueConstraint(*RESULT_KEY, name="uq_benchmark_results_key"),
    Index("ix_benchmark_results_host_case_time", "host", "case_key", "started_at"),
    Index("ix_benchmark_results_logical_date", "logical_date"),
    Index("ix_benchmark_results_case_time", "case_key", "started_at"),
    # A (host, case)'s results by night: open regressions, one host's series (revision 0004).
    Index("ix_benchmark_results_host_case_date", "host", "case_key", "logical_date"),
    # Partial indexes (revision 0016), see MEMORY_READING_ROWS.
    _partial("ix_benchmark_results_memory_readings", MEMORY_READING_ROWS, "logical_date"),
    _partial("ix_benchmark_results_ooms", OOM_ROWS, *OOM_BOUND_COLUMNS),
    _partial("ix_benchmark_results_missed_ooms", MISSED_OOM_ROWS, "logical_date"),
    _partial("ix_benchmark_results_multinode", MULTINODE_OK_ROWS, "logical_date"),
)

RESULT_COLUMNS = [c.name for c in benchmark_results.columns if c.name != "id"]
ATTEMPT_KEY = (*RESULT_KEY, "attempt")

# Attempts that a later execution of the same (run, host, case) replaced as the current result
# (revision 0005, `fleetbench.warehouse.attempts`): the whole row as it was, its steps as JSON, and
# when and why it was superseded. benchmark_results holds only current attempts, so everything that
# reads it (rollups, report, view, regressions) counts each night once.
# A later revision that adds a column to benchmark_results adds it to superseded_results too (this table copies
# benchmark_results' columns; the migration contract compares both with the migrated database).
superseded_results = Table(
    "superseded_results", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    *[c._copy() for c in benchmark_results.columns if c.name != "id"],
    Column("steps_json", Text),  # [{"step", "images_per_sec", "plusminus", "jitter", "loss"}, ...]
    Column("metrics_json", Text),  # its result_metrics rows: [{"metric", "labels", "value", "unit", "better"}, ...]
    Column("superseded_at", DateTime(timezone=True), nullable=False),
    Column("superseded_by", Integer),  # the attempt that replaced it; NULL: a rerun no longer planned the case
    Column("superseded_why", Text),  # `attempts.remeasure_reasons` against that attempt, "; "-joined
    # The host check the attempt was stored with (revision 0015): the host_facts row of its run and host with
    # this collected_at, or once a later check replaced it, the superseded_host_facts row.
    Column("host_collected_at", DateTime(timezone=True)),
    UniqueConstraint(*ATTEMPT_KEY, name="uq_superseded_results_key"),
    Index("ix_superseded_results_date", "logical_date"),
)

# A host check of a run that a later store replaced (another collected_at) or dropped, as it was (revision 0015).
SUPERSEDED_HOST_KEY = ("dag_id", "run_id", "host", "superseded_at")
superseded_host_facts = Table(
    "superseded_host_facts", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    *[Column(c.name, c.type, nullable=c.nullable) for c in host_facts.columns],
    Column("superseded_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint(*SUPERSEDED_HOST_KEY, name="uq_superseded_host_facts_key"),
)

steps = Table(
    "steps", metadata,
    Column("dag_id", String(250), primary_key=True),
    Column("run_id", String(250), primary_key=True),
    Column("host", String(100), primary_key=True),
    Column("case_key", String(250), primary_key=True),
    Column("step", Integer, primary_key=True),
    Column("images_per_sec", Float),
    Column("plusminus", Float),
    Column("jitter", Float),
    Column("loss", Float),
)

# Every metric sample of a case (revision 0007): one row per result and (metric, labels). `labels` is
# the sample's labels as sorted JSON ("{}" for none), part of the key; the result's key ties it to its
# benchmark_results row (as steps).
METRIC_KEY = ("dag_id", "run_id", "host", "case_key", "metric", "labels")

result_metrics = Table(
    "result_metrics", metadata,
    Column("dag_id", String(250), primary_key=True),
    Column("run_id", String(250), primary_key=True),
    Column("host", String(100), primary_key=True),
    Column("case_key", String(250), primary_key=True),
    Column("metric", String(100), primary_key=True),
    Column("labels", String(2000), primary_key=True),
    Column("value", Float, nullable=False),
    Column("unit", String(20), nullable=False),
    Column("better", String(10), nullable=False),
    CheckConstraint("better IN ('higher', 'lower')", name="ck_result_metrics_better"),
    Index("ix_result_metrics_metric_host", "metric", "host", "case_key"),
)

# Regressions found by comparing a run against its baseline (one row per run, host, case and metric).
REGRESSION_KEY = ("dag_id", "run_id", "host", "case_key", "metric")

regressions = Table(
    "regressions", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("dag_id", String(250), nullable=False),
    Column("run_id", String(250), nullable=False),
    Column("host", String(100), nullable=False),
    Column("case_key", String(250), nullable=False),
    Column("metric", String(100), nullable=False),
    Column("direction", String(10), nullable=False),  # "higher" | "lower": which way is better
    Column("baseline_value", Float, nullable=False),
    Column("value", Float, nullable=False),
    Column("delta_pct", Float, nullable=False),
    Column("z_score", Float, nullable=True),
    Column("p_value", Float, nullable=True),
    Column("baseline_n", Integer, nullable=False),
    Column("baseline_window", Text, nullable=False),  # JSON list of the baseline's run ids
    Column("changes", Text),  # JSON: what differed from the baseline (driver, digest, clocks)
    Column("severity", String(20), nullable=False),
    Column("detected_at", DateTime(timezone=True), nullable=False),
    # Revision 0008 (`fleetbench.regression.track`): what kind of finding, how sure, since when, against what.
    Column("kind", String(20), nullable=False, server_default="regression"),  # "regression" | "improvement"
    Column("status", String(20), nullable=False, server_default="suspected"),  # "suspected" | "confirmed"
    Column("basis", String(20)),  # "night", "nights", "segment", "open": what confirmed it (or keeps it open)
    Column("since_run_id", String(250)),  # the finding's first night
    Column("since_date", DateTime(timezone=True)),
    Column("segment", Text),  # JSON: the result's driver, CUDA driver, image digest (health state)
    Column("baseline_segment", Text),  # JSON: the baseline's
    Column("detectable_pct", Float),  # the smallest change one night can show for this case and metric
    Column("same_change_as", String(100)),  # the metric whose finding this one repeats (cost of a slower run)
    # revision 0013
    Column("unit", String(20)),  # the unit of baseline_value and value
    # revision 0019: when the finding was mailed (set once the mail is sent; `fleetbench.regression.store.to_mail`)
    Column("mailed_at", DateTime(timezone=True)),
    UniqueConstraint(*REGRESSION_KEY, name="uq_regressions_key"),
    CheckConstraint("direction IN ('higher', 'lower')", name="ck_regressions_direction"),
    Index("ix_regressions_host_case_time", "host", "case_key", "detected_at"),
)

# Levels someone accepted as the new baseline of a (DAG, host, case) from `since` on (revision 0008):
# `fleetbench regressions accept`. The regression open against the old baseline is closed by it.
regression_acceptances = Table(
    "regression_acceptances", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("dag_id", String(250), nullable=False),
    Column("host", String(100), nullable=False),
    Column("case_key", String(250), nullable=False),
    Column("since", DateTime(timezone=True), nullable=False),
    Column("accepted_at", DateTime(timezone=True), nullable=False),
    Column("accepted_by", String(100)),
    Column("note", Text),
    UniqueConstraint("dag_id", "host", "case_key", "since", name="uq_regression_acceptances_key"),
)

# Rollups of benchmark_results (revision 0004), rewritten by `store_run` in the transaction that writes
# the run's results, from the results as they are after the write (`fleetbench.warehouse.rollup`):
# the report reads these instead of scanning a year of results.
#
# run_host_rollup: one row per run, host, model, GPU type, driver and logical date (in practice a
# host's models per night): case counts by status, energy and cost sums, and which GPU counts had a
# speedup efficiency (bit n of scaled_gpus set: an ok case of n whole GPUs with one, 2 <= n <= 62; revision
# 0022: not n MIG instances).
run_host_rollup = Table(
    "run_host_rollup", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("dag_id", String(250), nullable=False),
    Column("run_id", String(250), nullable=False),
    Column("host", String(100), nullable=False),
    Column("model", String(100)),
    Column("gpu", String(200)),  # gpu_catalog_name, else gpu_model as reported
    Column("driver_version", String(50)),
    Column("logical_date", DateTime(timezone=True)),
    Column("stored_at", DateTime(timezone=True)),  # the newest row's
    Column("gpu_model", String(200)),  # the highest reported
    Column("results", Integer, nullable=False),
    Column("ok", Integer, nullable=False),
    Column("failed", Integer, nullable=False),
    Column("skipped", Integer, nullable=False),
    Column("energy_cost_n", Integer, nullable=False),  # ok results with images/J or cost per 10^6 images
    Column("images_per_joule_n", Integer, nullable=False),
    Column("images_per_joule_sum", Float),
    Column("cost_per_million_n", Integer, nullable=False),
    Column("cost_per_million_sum", Float),
    Column("energy_measured", Integer, nullable=False),  # of the images/J figures: measured, estimated
    Column("energy_estimated", Integer, nullable=False),
    Column("scaled_gpus", BigInteger, nullable=False),
    Index("ix_run_host_rollup_run", "dag_id", "run_id"),
    Index("ix_run_host_rollup_date", "logical_date"),
    Index("ix_run_host_rollup_host_date", "host", "logical_date"),
    Index("ix_run_host_rollup_model_date", "model", "logical_date"),
)

# host_month_rollup: run_host_rollup summed per calendar month (UTC) of logical dates, per DAG, host,
# model, GPU type and driver: a year of a 1,000-host fleet in some 12,000 rows. `runs` counts the
# group's runs, `host_runs` the host's runs that month (any model), `model_runs` its runs with a result of
# the row's model (any GPU type and driver: revision 0020); first_date, last_date and
# last_ok are logical dates; scaled_gpus is the bitwise OR of the month's masks.
host_month_rollup = Table(
    "host_month_rollup", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("dag_id", String(250), nullable=False),
    Column("host", String(100), nullable=False),
    Column("model", String(100)),
    Column("gpu", String(200)),
    Column("driver_version", String(50)),
    Column("month", DateTime(timezone=True), nullable=False),  # its first instant
    Column("first_date", DateTime(timezone=True)),
    Column("last_date", DateTime(timezone=True)),
    Column("last_ok", DateTime(timezone=True)),
    Column("runs", Integer, nullable=False),
    Column("host_runs", Integer, nullable=False),
    Column("model_runs", Integer, nullable=False),
    Column("results", Integer, nullable=False),
    Column("ok", Integer, nullable=False),
    Column("failed", Integer, nullable=False),
    Column("skipped", Integer, nullable=False),
    Column("gpu_model", String(200)),
    Column("scaled_gpus", BigInteger, nullable=False),
    Index("ix_host_month_rollup_dag_month", "dag_id", "month"),
    Index("ix_host_month_rollup_month", "month"),
)

# run_case_rollup: the fleet per run, case, GPU type and logical date: case counts by status, ok
# images/sec over the hosts (median, min, max of the finite values; how many points, on how many
# hosts), speedup efficiency and energy and cost sums of the ok results.
run_case_rollup = Table(
    "run_case_rollup", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("dag_id", String(250), nullable=False),
    Column("run_id", String(250), nullable=False),
    Column("case_key", String(250), nullable=False),
    Column("gpu", String(200)),
    Column("logical_date", DateTime(timezone=True)),
    Column("model", String(100)),
    Column("num_gpus", Integer),
    Column("batch_size_per_device", Integer),
    Column("results", Integer, nullable=False),
    Column("ok", Integer, nullable=False),
    Column("failed", Integer, nullable=False),
    Column("skipped", Integer, nullable=False),
    Column("points", Integer, nullable=False),
    Column("hosts", Integer, nullable=False),
    Column("ips_median", Float),
    Column("ips_min", Float),
    Column("ips_max", Float),
    Column("efficiency_n", Integer, nullable=False),
    Column("efficiency_sum", Float),
    Column("efficiency_min", Float),
    Column("efficiency_max", Float),
    Column("energy_cost_n", Integer, nullable=False),
    Column("images_per_joule_n", Integer, nullable=False),
    Column("images_per_joule_sum", Float),
    Column("cost_per_million_n", Integer, nullable=False),
    Column("cost_per_million_sum", Float),
    Column("energy_measured", Integer, nullable=False),
    Column("energy_estimated", Integer, nullable=False),
    # the case's MIG profile and nodes (revision 0021): the report keeps MIG and multi-node cases off the
    # whole-GPU charts and scaling rows of the same GPU count
    Column("mig_profile", String(40)),
    Column("nodes", Integer),
    Index("ix_run_case_rollup_run", "dag_id", "run_id"),
    Index("ix_run_case_rollup_date", "logical_date"),
)

ROLLUPS = (run_host_rollup, host_month_rollup, run_case_rollup)

# Views (created by migrations with plain SQL, not part of `metadata`).
CAPACITY_FEATURES_VIEW = "capacity_features"

