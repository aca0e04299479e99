"""Every execution of a case is kept: attempts on benchmark_results, superseded attempts in their own table.

- benchmark_results gets `attempt` (1, 2, ... per run, host and case, in the order they were stored)
  and `attempt_id` (the identity of the execution's container outcome, `fleetbench.warehouse.attempts`).
  It keeps one row per (run, host, case): the current attempt. Rows stored before this revision become
  attempt 1, with no attempt_id (their identity was not recorded): the next store of such a case adds
  attempt 2.
- superseded_results: an attempt a later one replaced, the whole row as it was (benchmark_results'
  columns as of this revision), its steps and metric samples as JSON, when it was superseded, by which attempt and why
  (driver changed, image changed, rerun of a failed result).

Columns are added in place (ALTER TABLE ... ADD COLUMN on both databases), so SQLite does not rebuild
benchmark_results and the capacity_features view stays as it is.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)

# benchmark_results' columns (name, type, nullable) as of revision 0010, copied into superseded_results.
RESULT_COLUMNS = [
    ("dag_id", sa.String(250), False),
    ("run_id", sa.String(250), False),
    ("logical_date", TZ, True),
    ("host", sa.String(100), False),
    ("case_key", sa.String(250), False),
    ("benchmark", sa.String(100), True),
    ("model", sa.String(100), True),
    ("batch_size_per_device", sa.Integer, True),
    ("batch_size_global", sa.Integer, True),
    ("num_gpus", sa.Integer, True),
    ("variable_update", sa.String(50), True),
    ("device", sa.String(10), True),
    ("num_batches", sa.Integer, True),
    ("image_name", sa.String(100), True),
    ("image_ref", sa.String(500), True),
    ("image_digest", sa.String(100), True),
    ("status", sa.String(20), False),
    ("failure_class", sa.String(50), True),
    ("failure_detail", sa.String(None), True),
    ("images_per_sec", sa.Float, True),
    ("step_count", sa.Integer, True),
    ("exit_code", sa.Integer, True),
    ("started_at", TZ, True),
    ("finished_at", TZ, True),
    ("duration_s", sa.Float, True),
    ("driver_version", sa.String(50), True),
    ("cuda_driver_version", sa.String(20), True),
    ("gpu_model", sa.String(200), True),
    ("command", sa.String(None), True),
    ("log_path", sa.String(None), True),
    ("energy_source", sa.String(20), True),
    ("energy_j", sa.Float, True),
    ("stored_at", TZ, True),
    ("mean_power_w", sa.Float, True),
    ("peak_gpu_mem_mib", sa.Float, True),
    ("mean_gpu_util_pct", sa.Float, True),
    ("telemetry_json", sa.String(None), True),
    ("precision", sa.String(10), True),
    ("gpu_catalog_name", sa.String(100), True),
    ("time_for_batches_s", sa.Float, True),
    ("accuracy_top1", sa.Float, True),
    ("time_to_accuracy_s", sa.Float, True),
    ("step_median_images_per_sec", sa.Float, True),
    ("step_spread_images_per_sec", sa.Float, True),
    ("step_cv", sa.Float, True),
    ("speedup_efficiency", sa.Float, True),
    ("speedup_baseline_case_key", sa.String(250), True),
    ("price_per_gpu_hour", sa.Float, True),
    ("price_source", sa.String(20), True),
    ("cost_usd", sa.Float, True),
    ("cost_per_million_images_usd", sa.Float, True),
    ("energy_kwh", sa.Float, True),
    ("images_per_joule", sa.Float, True),
    ("carbon_g_per_kwh", sa.Float, True),
    ("carbon_g", sa.Float, True),
    ("host_gpu_health", sa.String(20), True),  # 0006
    ("price_per_hour", sa.Float, True),  # 0007
    ("cpu_tdp_w", sa.Float, True),
    ("mean_cpu_util_pct", sa.Float, True),
    ("peak_mem_mib", sa.Float, True),  # 0009
    ("peak_mem_source", sa.String(20), True),
    ("capacity_mib", sa.Float, True),
    ("predicted_mem_mib", sa.Float, True),
    ("capacity_note", sa.Text, True),
    ("harness", sa.String(50), True),  # 0010
    ("metric", sa.String(100), True),
    ("value", sa.Float, True),
    ("unit", sa.String(20), True),
    ("better", sa.String(10), True),
]


def upgrade() -> None:
    op.add_column("benchmark_results", sa.Column("attempt", sa.Integer, nullable=False, server_default="1"))
    op.add_column("benchmark_results", sa.Column("attempt_id", sa.String(64)))
    op.create_table(
        "superseded_results",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        *[sa.Column(name, type_, nullable=nullable) for name, type_, nullable in RESULT_COLUMNS],
        sa.Column("attempt", sa.Integer, nullable=False, server_default="1"),
        sa.Column("attempt_id", sa.String(64)),
        sa.Column("steps_json", sa.Text),
        sa.Column("metrics_json", sa.Text),
        sa.Column("superseded_at", TZ, nullable=False),
        sa.Column("superseded_by", sa.Integer),
        sa.Column("superseded_why", sa.Text),
        sa.UniqueConstraint("dag_id", "run_id", "host", "case_key", "attempt", name="uq_superseded_results_key"),
    )
    op.create_index("ix_superseded_results_date", "superseded_results", ["logical_date"])


def downgrade() -> None:
    """Superseded attempts go with their table; the current ones stay in benchmark_results."""
    op.drop_index("ix_superseded_results_date", table_name="superseded_results")
    op.drop_table("superseded_results")
    op.drop_column("benchmark_results", "attempt_id")
    op.drop_column("benchmark_results", "attempt")
