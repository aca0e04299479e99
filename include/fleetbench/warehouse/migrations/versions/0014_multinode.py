"""Multi-node cases: each result's hosts, roles and speedup efficiency across nodes.

- benchmark_results and superseded_results (which copies its columns) get
  - nodes: the number of hosts the case ran on (NOT NULL, 1 for every row stored before: one host each);
  - host_set: the hosts of a multi-node case, "a,b" (NULL for one host);
  - roles_json: each role's host, job (ps | worker), task index, address and how it ended;
  - node_efficiency, node_baseline_images_per_sec: total images/sec / (nodes x the 1-node images/sec of the
    same model, batch and GPUs per node), and that 1-node figure (`fleetbench.metrics.match_nodes`).
  Columns are added in place (ALTER TABLE ... ADD COLUMN on both databases): no table is rebuilt and the
  capacity_features view stays as it is.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

TABLES = ("benchmark_results", "superseded_results")


def new_columns() -> list[sa.Column]:
    return [sa.Column("nodes", sa.Integer, nullable=False, server_default="1"),
            sa.Column("host_set", sa.Text),
            sa.Column("roles_json", sa.Text),
            sa.Column("node_efficiency", sa.Float),
            sa.Column("node_baseline_images_per_sec", sa.Float)]


def upgrade() -> None:
    for table in TABLES:
        for column in new_columns():
            op.add_column(table, column)


def downgrade() -> None:
    for table in TABLES:
        for column in reversed(new_columns()):
            op.drop_column(table, column.name)
