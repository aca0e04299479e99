"""GPU health: the host's health state, failing checks and health facts on host_facts; each result's host health.

- host_facts.gpu_health: healthy | degraded | unfit from the GPU health checks (NULL: not checked).
- host_facts.gpu_health_issues: the health checks that did not pass, "name:status, ...".
- host_facts.gpu_health_json: the health facts (per-GPU ECC, retired pages, remapped rows, clocks, PCIe,
  power, MIG; topology; XID events; DCGM diagnostic) as JSON.
- benchmark_results.host_gpu_health: the host's gpu_health in the run that measured the result.

Rows stored before this revision were measured without health checks: their columns stay NULL, which
reads as "not checked", never as healthy. Adding a column does not rebuild benchmark_results, so the
capacity_features view and the rollups stay as they are.

Revision ID: 0006
Revises: 0004
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("host_facts") as batch:
        batch.add_column(sa.Column("gpu_health", sa.String(20)))
        batch.add_column(sa.Column("gpu_health_issues", sa.Text))
        batch.add_column(sa.Column("gpu_health_json", sa.Text))
    op.add_column("benchmark_results", sa.Column("host_gpu_health", sa.String(20)))


def downgrade() -> None:
    op.drop_column("benchmark_results", "host_gpu_health")
    with op.batch_alter_table("host_facts") as batch:
        for column in ("gpu_health_json", "gpu_health_issues", "gpu_health"):
            batch.drop_column(column)
