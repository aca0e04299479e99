"""What a baked image added to its base, on each result: `bake_inputs` (the bake's inputs hash, the one its tag carries)
and `harness_revision` (the git commit and the copied files' hash it was made with), on benchmark_results and
superseded_results (which copies its columns).

Rows kept the base image's registry digest only, so a night that ran new harness code (a git branch that moved, an
edited script under include/) looked like the night before: `compare` said the image had not changed and a finding
could not name it. Existing rows stay NULL (not known). Columns are added in place, as 0012's.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

TABLES = ("benchmark_results", "superseded_results")


def upgrade() -> None:
    for table in TABLES:
        op.add_column(table, sa.Column("bake_inputs", sa.String(64)))
        op.add_column(table, sa.Column("harness_revision", sa.String(200)))


def downgrade() -> None:
    for table in TABLES:
        op.drop_column(table, "harness_revision")
        op.drop_column(table, "bake_inputs")
