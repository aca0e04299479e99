"""A case on MIG instances says so: benchmark_results (and superseded_results, which copies its columns) get
`mig_profile` (e.g. 1g.10gb) and `mig_instances` (how many instances of it the case ran on).

Existing rows ran on whole GPUs (or none): both stay NULL. Columns are added in place (ALTER TABLE ... ADD
COLUMN on both databases), so SQLite does not rebuild the tables and the capacity_features view stays.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

TABLES = ("benchmark_results", "superseded_results")


def upgrade() -> None:
    for table in TABLES:
        op.add_column(table, sa.Column("mig_profile", sa.String(40)))
        op.add_column(table, sa.Column("mig_instances", sa.Integer))


def downgrade() -> None:
    for table in TABLES:
        op.drop_column(table, "mig_instances")
        op.drop_column(table, "mig_profile")
