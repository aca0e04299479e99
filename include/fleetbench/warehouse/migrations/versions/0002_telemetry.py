"""GPU telemetry per result: mean power, peak GPU memory, mean utilisation, the wrapper's report.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("benchmark_results") as batch:
        batch.add_column(sa.Column("mean_power_w", sa.Float))
        batch.add_column(sa.Column("peak_gpu_mem_mib", sa.Float))
        batch.add_column(sa.Column("mean_gpu_util_pct", sa.Float))
        batch.add_column(sa.Column("telemetry_json", sa.Text))


def downgrade() -> None:
    with op.batch_alter_table("benchmark_results") as batch:
        for column in ("telemetry_json", "mean_gpu_util_pct", "peak_gpu_mem_mib", "mean_power_w"):
            batch.drop_column(column)
