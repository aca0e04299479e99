"""Regressions that are suspected or confirmed, per-segment baselines, improvements, acceptances.

- regressions: kind (regression | improvement), status (suspected | confirmed), basis, since_run_id,
  since_date, segment, baseline_segment, detectable_pct, same_change_as. Rows found before this
  revision were single-night alarms: they become kind "regression", status "suspected".
- regression_acceptances: a level accepted as the new baseline of a (DAG, host, case) from a date on.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)
NEW_COLUMNS = [
    ("basis", sa.String(20)), ("since_run_id", sa.String(250)), ("since_date", TZ), ("segment", sa.Text),
    ("baseline_segment", sa.Text), ("detectable_pct", sa.Float), ("same_change_as", sa.String(50)),
]


def upgrade() -> None:
    with op.batch_alter_table("regressions") as batch:
        batch.add_column(sa.Column("kind", sa.String(20), nullable=False, server_default="regression"))
        batch.add_column(sa.Column("status", sa.String(20), nullable=False, server_default="suspected"))
        for name, type_ in NEW_COLUMNS:
            batch.add_column(sa.Column(name, type_))
    op.create_table(
        "regression_acceptances",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("dag_id", sa.String(250), nullable=False),
        sa.Column("host", sa.String(100), nullable=False),
        sa.Column("case_key", sa.String(250), nullable=False),
        sa.Column("since", TZ, nullable=False),
        sa.Column("accepted_at", TZ, nullable=False),
        sa.Column("accepted_by", sa.String(100)),
        sa.Column("note", sa.Text),
        sa.UniqueConstraint("dag_id", "host", "case_key", "since", name="uq_regression_acceptances_key"),
    )


def downgrade() -> None:
    op.drop_table("regression_acceptances")
    with op.batch_alter_table("regressions") as batch:
        for name, _ in reversed(NEW_COLUMNS):
            batch.drop_column(name)
        batch.drop_column("status")
        batch.drop_column("kind")
