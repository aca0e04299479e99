"""Cost and energy of CPU cases: the host's hourly price, the CPU TDP an energy estimate used, the CPU utilisation.

- price_per_hour: the host's `price_per_hour` (USD per hour of the whole machine) when a case's cost
  came from it (CPU cases, GPU cases without a GPU price); GPU prices stay in price_per_gpu_hour.
- cpu_tdp_w: the CPU TDP (W) a CPU case's estimated energy was computed from (`energy_source` estimated).
- mean_cpu_util_pct: the case container's share of the host's logical CPUs over its command.

Rows stored before this revision keep NULL in all three: nothing they hold tells the price, TDP or CPU
time of a past night (CPU cases ran without the telemetry wrapper then).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

COLUMNS = (("price_per_hour", sa.Float), ("cpu_tdp_w", sa.Float), ("mean_cpu_util_pct", sa.Float))


def upgrade() -> None:
    with op.batch_alter_table("benchmark_results") as batch:
        for name, type_ in COLUMNS:
            batch.add_column(sa.Column(name, type_))


def downgrade() -> None:
    with op.batch_alter_table("benchmark_results") as batch:
        for name, _ in reversed(COLUMNS):
            batch.drop_column(name)
