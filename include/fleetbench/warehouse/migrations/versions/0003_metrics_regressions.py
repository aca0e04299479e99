"""Derived metrics on benchmark_results, the regressions table, the capacity_features view.

- benchmark_results gets the columns `fleetbench.metrics.derive` fills. Rows written before this
  revision keep NULL there, except two that follow from what the row already has:
  energy_kwh = energy_j / 3.6e6 and time_for_batches_s = num_batches x batch_size_global / images_per_sec.
- regressions: one row per (dag_id, run_id, host, case_key, metric) that got worse than its baseline.
- capacity_features: task features (model, batch per device, GPUs, precision, GPU model) next to
  resource features (peak GPU memory, power, utilisation, throughput, status, failure class) for
  capacity planning and OOM prediction; skipped cases (never ran) are left out.
- ix_benchmark_results_case_time for reports of one case across hosts over time.

SQLite note for later revisions: a batch ALTER of benchmark_results rebuilds the table, and SQLite
checks views when it renames the rebuilt table in place. Drop capacity_features before such a batch
and create it again after (as `downgrade` here does).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)

NEW_COLUMNS = [
    ("precision", sa.String(10)),
    ("gpu_catalog_name", sa.String(100)),
    ("time_for_batches_s", sa.Float),
    ("accuracy_top1", sa.Float),
    ("time_to_accuracy_s", sa.Float),
    ("step_median_images_per_sec", sa.Float),
    ("step_spread_images_per_sec", sa.Float),
    ("step_cv", sa.Float),
    ("speedup_efficiency", sa.Float),
    ("speedup_baseline_case_key", sa.String(250)),
    ("price_per_gpu_hour", sa.Float),
    ("price_source", sa.String(20)),
    ("cost_usd", sa.Float),
    ("cost_per_million_images_usd", sa.Float),
    ("energy_kwh", sa.Float),
    ("images_per_joule", sa.Float),
    ("carbon_g_per_kwh", sa.Float),
    ("carbon_g", sa.Float),
]

# Plain SQL that SQLite and PostgreSQL both read.
CAPACITY_FEATURES = """
CREATE VIEW capacity_features AS
SELECT r.dag_id, r.run_id, r.logical_date, r.host, r.case_key,
       r.model, r.batch_size_per_device, r.num_gpus, r.precision, r.gpu_model,
       r.peak_gpu_mem_mib, r.mean_power_w, r.energy_source, r.mean_gpu_util_pct, r.images_per_sec,
       r.status, r.failure_class,
       CASE WHEN r.failure_class = 'gpu_oom' THEN 1 ELSE 0 END AS gpu_oom
FROM benchmark_results r
WHERE r.status <> 'skipped'
"""


def upgrade() -> None:
    with op.batch_alter_table("benchmark_results") as batch:
        for name, type_ in NEW_COLUMNS:
            batch.add_column(sa.Column(name, type_))
    op.create_index("ix_benchmark_results_case_time", "benchmark_results", ["case_key", "started_at"])
    op.execute("UPDATE benchmark_results SET energy_kwh = energy_j / 3600000.0 WHERE energy_j IS NOT NULL")
    op.execute("UPDATE benchmark_results SET time_for_batches_s = num_batches * batch_size_global / images_per_sec "
               "WHERE images_per_sec > 0 AND num_batches IS NOT NULL AND batch_size_global IS NOT NULL")
    op.create_table(
        "regressions",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("dag_id", sa.String(250), nullable=False),
        sa.Column("run_id", sa.String(250), nullable=False),
        sa.Column("host", sa.String(100), nullable=False),
        sa.Column("case_key", sa.String(250), nullable=False),
        sa.Column("metric", sa.String(50), nullable=False),
        sa.Column("direction", sa.String(10), nullable=False),
        sa.Column("baseline_value", sa.Float, nullable=False),
        sa.Column("value", sa.Float, nullable=False),
        sa.Column("delta_pct", sa.Float, nullable=False),
        sa.Column("z_score", sa.Float, nullable=True),
        sa.Column("p_value", sa.Float, nullable=True),
        sa.Column("baseline_n", sa.Integer, nullable=False),
        sa.Column("baseline_window", sa.Text, nullable=False),
        sa.Column("changes", sa.Text),
        sa.Column("severity", sa.String(20), nullable=False),
        sa.Column("detected_at", TZ, nullable=False),
        sa.UniqueConstraint("dag_id", "run_id", "host", "case_key", "metric", name="uq_regressions_key"),
        sa.CheckConstraint("direction IN ('higher', 'lower')", name="ck_regressions_direction"),
    )
    op.create_index("ix_regressions_host_case_time", "regressions", ["host", "case_key", "detected_at"])
    op.execute(CAPACITY_FEATURES)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS capacity_features")
    op.drop_index("ix_regressions_host_case_time", table_name="regressions")
    op.drop_table("regressions")
    op.drop_index("ix_benchmark_results_case_time", table_name="benchmark_results")
    with op.batch_alter_table("benchmark_results") as batch:
        for name, _ in reversed(NEW_COLUMNS):
            batch.drop_column(name)
