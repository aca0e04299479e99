"""Regressions of any metric: `regressions.metric` as wide as a result's metric name, and the finding's unit.

- regressions.metric and same_change_as: VARCHAR(50) -> VARCHAR(100), the width of benchmark_results.metric (a
  harness's primary metric, e.g. a team's own `command` metric, is a finding's metric now). SQLite does not
  enforce a VARCHAR's length, so only PostgreSQL alters the column; SQLite keeps its table as it is.
- regressions.unit: the unit of the finding's values (the result's primary metric's unit; s, J, USD for
  wall time, energy and cost). Findings stored before get the unit of their metric (images_per_sec:
  images/s, duration_s: s, energy_j: J, cost_usd: USD).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

UNITS = (("images_per_sec", "images/s"), ("duration_s", "s"), ("energy_j", "J"), ("cost_usd", "USD"))


def upgrade() -> None:
    op.add_column("regressions", sa.Column("unit", sa.String(20)))
    if op.get_bind().dialect.name != "sqlite":
        op.alter_column("regressions", "metric", type_=sa.String(100), existing_type=sa.String(50),
                        existing_nullable=False)
        op.alter_column("regressions", "same_change_as", type_=sa.String(100), existing_type=sa.String(50))
    for metric, unit in UNITS:
        op.execute(sa.text("UPDATE regressions SET unit = :unit WHERE metric = :metric AND unit IS NULL")
                   .bindparams(unit=unit, metric=metric))


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        # a finding of a metric name longer than 50 characters does not fit the old column: it goes
        op.execute("DELETE FROM regressions WHERE LENGTH(metric) > 50")
        op.execute("UPDATE regressions SET same_change_as = NULL WHERE LENGTH(same_change_as) > 50")
        op.alter_column("regressions", "metric", type_=sa.String(50), existing_type=sa.String(100),
                        existing_nullable=False)
        op.alter_column("regressions", "same_change_as", type_=sa.String(50), existing_type=sa.String(100))
    with op.batch_alter_table("regressions") as batch:
        batch.drop_column("unit")
