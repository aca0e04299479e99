"""Harnesses and metric samples: each result's harness and primary metric, and every metric sample.

- benchmark_results: `harness`, and the primary metric `metric`, `value`, `unit`, `better`
  (higher | lower). Rows stored before are tf_cnn_benchmarks results: their primary metric is
  images_per_sec (images/s, higher), its value the row's images_per_sec (NULL where the case failed).
- result_metrics: one row per result and metric sample (metric, labels as sorted JSON), filled here
  from the rows stored before: images_per_sec and accuracy_top1 where they have a value.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

BACKFILL_PRIMARY = """
UPDATE benchmark_results
SET harness = 'tf_cnn_benchmarks', metric = 'images_per_sec', value = images_per_sec, unit = 'images/s',
    better = 'higher'
WHERE metric IS NULL
"""

BACKFILL_SAMPLES = """
INSERT INTO result_metrics (dag_id, run_id, host, case_key, metric, labels, value, unit, better)
SELECT dag_id, run_id, host, case_key, '{metric}', '{{}}', {column}, '{unit}', 'higher'
FROM benchmark_results
WHERE {column} IS NOT NULL AND status = 'ok'
"""


def upgrade() -> None:
    with op.batch_alter_table("benchmark_results") as batch:
        batch.add_column(sa.Column("harness", sa.String(50)))
        batch.add_column(sa.Column("metric", sa.String(100)))
        batch.add_column(sa.Column("value", sa.Float))
        batch.add_column(sa.Column("unit", sa.String(20)))
        batch.add_column(sa.Column("better", sa.String(10)))
    op.create_table(
        "result_metrics",
        sa.Column("dag_id", sa.String(250), primary_key=True),
        sa.Column("run_id", sa.String(250), primary_key=True),
        sa.Column("host", sa.String(100), primary_key=True),
        sa.Column("case_key", sa.String(250), primary_key=True),
        sa.Column("metric", sa.String(100), primary_key=True),
        sa.Column("labels", sa.String(2000), primary_key=True),
        sa.Column("value", sa.Float, nullable=False),
        sa.Column("unit", sa.String(20), nullable=False),
        sa.Column("better", sa.String(10), nullable=False),
        sa.CheckConstraint("better IN ('higher', 'lower')", name="ck_result_metrics_better"),
    )
    op.create_index("ix_result_metrics_metric_host", "result_metrics", ["metric", "host", "case_key"])
    op.execute(BACKFILL_PRIMARY)
    for metric, column, unit in (("images_per_sec", "images_per_sec", "images/s"),
                                 ("accuracy_top1", "accuracy_top1", "1")):
        op.execute(BACKFILL_SAMPLES.format(metric=metric, column=column, unit=unit))


def downgrade() -> None:
    op.drop_index("ix_result_metrics_metric_host", table_name="result_metrics")
    op.drop_table("result_metrics")
    with op.batch_alter_table("benchmark_results") as batch:
        for column in ("better", "unit", "value", "metric", "harness"):
            batch.drop_column(column)
