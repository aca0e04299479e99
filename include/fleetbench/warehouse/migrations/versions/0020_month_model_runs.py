"""A host's runs of one model per month: host_month_rollup.model_runs.

The report's Hosts table with a model filter counted a host's runs of a month as the sum of `runs` over the
month's rows of that model. Those rows are per GPU type and driver too, and a model's CPU cases have no GPU
type, so a host that ran a model on its GPU and on its CPU every night was counted twice per run.
`model_runs` is the host's runs with a result of the row's model that month (any GPU type and driver), the
same on each of those rows (`fleetbench.warehouse.rollup.MONTH_SQL`).

This revision adds the column (0 at first, as the statement needs a value for the rows there) and computes it
for every stored row from run_host_rollup, one (DAG, month) at a time, with the statement below (the count
of `fleetbench.warehouse.rollup.MONTH_SQL` as of this revision); no other column changes. Downgrade drops it.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06
"""

from datetime import datetime, timezone

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)
MODEL_RUNS = """
UPDATE host_month_rollup SET model_runs = (
    SELECT COUNT(DISTINCT h.run_id) FROM run_host_rollup h
    WHERE h.dag_id = host_month_rollup.dag_id AND h.host = host_month_rollup.host
      AND COALESCE(h.model, '') = COALESCE(host_month_rollup.model, '')
      AND h.logical_date >= :m0 AND h.logical_date < :m1)
WHERE dag_id = :dag_id AND month = :m0
"""


def _month(value) -> datetime:
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    value = value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)
    return datetime(value.year, value.month, 1, tzinfo=timezone.utc)


def _next(month: datetime) -> datetime:
    return month.replace(year=month.year + 1, month=1) if month.month == 12 else month.replace(month=month.month + 1)


def upgrade() -> None:
    op.add_column("host_month_rollup", sa.Column("model_runs", sa.Integer, nullable=False, server_default="0"))
    bind = op.get_bind()
    months = {(dag_id, _month(m)) for dag_id, m in bind.execute(sa.text(
        "SELECT DISTINCT dag_id, month FROM host_month_rollup"))}
    update = sa.text(MODEL_RUNS).bindparams(sa.bindparam("m0", type_=TZ), sa.bindparam("m1", type_=TZ))
    for dag_id, month in sorted(months):
        bind.execute(update, {"dag_id": dag_id, "m0": month, "m1": _next(month)})


def downgrade() -> None:
    with op.batch_alter_table("host_month_rollup") as batch:
        batch.drop_column("model_runs")
