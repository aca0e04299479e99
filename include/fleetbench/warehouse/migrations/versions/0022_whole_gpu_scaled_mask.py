"""MIG instances out of the rollups' whole-GPU scaling masks.

run_host_rollup.scaled_gpus (and host_month_rollup's, the OR of a month's) has bit n set for an ok n-GPU result with
a speedup efficiency. A case of n instances of a MIG profile set the same bit as n whole GPUs, so the report's
whole-GPU scaling row of n GPUs counted a host that had scaled only on MIG instances among its hosts (its
efficiency figures were already apart: revision 0021). The mask now counts whole GPUs only (`mig_profile IS NULL`,
`fleetbench.warehouse.rollup.SCALED_GPUS`); the MIG rows' hosts come from the results.

This revision recomputes the masks of the run_host_rollup rows of every run with an ok MIG result that has an
efficiency, and of the host_month_rollup rows of the months those runs fall in (the OR of the month's run rows);
other rows are already right, and no other column changes. Downgrade recomputes the same rows with MIG counted.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-06
"""

from datetime import datetime, timezone

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)
GPU = "CASE WHEN num_gpus > 0 THEN COALESCE(gpu_catalog_name, gpu_model) END"
SCALED = "status = 'ok' AND speedup_efficiency IS NOT NULL AND num_gpus BETWEEN 2 AND 62"
# The runs whose masks the two expressions make differ: an ok MIG result of 2..62 instances with an efficiency.
AFFECTED = f"SELECT DISTINCT dag_id, run_id FROM benchmark_results WHERE {SCALED} AND mig_profile IS NOT NULL"
KEY = ("host", "model", "gpu", "driver_version", "logical_date")


def masks_sql(whole_gpus_only: bool) -> str:
    """Each run_host_rollup group's mask of one run (a copy of the rollup's grouping as of this revision)."""
    mig = " AND mig_profile IS NULL" if whole_gpus_only else ""
    return f"""
SELECT host, model, {GPU} AS gpu, driver_version, logical_date,
    COALESCE(CAST(SUM(DISTINCT CASE WHEN {SCALED}{mig} THEN CAST(1 AS BIGINT) << num_gpus END) AS BIGINT), 0)
FROM benchmark_results
WHERE dag_id = :dag_id AND run_id = :run_id
GROUP BY host, model, {GPU}, driver_version, logical_date
"""


def month_of(value: datetime) -> datetime:
    value = value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)
    return datetime(value.year, value.month, 1, tzinfo=timezone.utc)


def next_month(month: datetime) -> datetime:
    return month.replace(year=month.year + 1, month=1) if month.month == 12 else month.replace(month=month.month + 1)


def recompute(whole_gpus_only: bool) -> None:
    bind = op.get_bind()
    hr = sa.table("run_host_rollup", sa.column("id"), sa.column("dag_id"), sa.column("run_id"), sa.column("host"),
                  sa.column("model"), sa.column("gpu"), sa.column("driver_version"), sa.column("logical_date", TZ),
                  sa.column("scaled_gpus"))
    hm = sa.table("host_month_rollup", sa.column("id"), sa.column("dag_id"), sa.column("host"), sa.column("model"),
                  sa.column("gpu"), sa.column("driver_version"), sa.column("month", TZ), sa.column("scaled_gpus"))
    masks = sa.text(masks_sql(whole_gpus_only)).columns(logical_date=TZ)
    months: set[tuple[str, datetime]] = set()
    for dag_id, run_id in bind.execute(sa.text(AFFECTED)).all():
        want = {tuple(r[:5]): int(r[5]) for r in bind.execute(masks, {"dag_id": dag_id, "run_id": run_id})}
        changed = []
        for r in bind.execute(sa.select(hr).where(hr.c.dag_id == dag_id, hr.c.run_id == run_id)):
            mask = want.get(tuple(getattr(r, k) for k in KEY))
            if mask is not None and mask != r.scaled_gpus:
                changed.append({"row": r.id, "mask": mask})
            if r.logical_date is not None:
                months.add((dag_id, month_of(r.logical_date)))
        if changed:
            bind.execute(hr.update().where(hr.c.id == sa.bindparam("row")).values(scaled_gpus=sa.bindparam("mask")),
                         changed)
    for dag_id, month in sorted(months):
        ored: dict[tuple, int] = {}
        for r in bind.execute(sa.select(hr).where(hr.c.dag_id == dag_id, hr.c.logical_date >= month,
                                                  hr.c.logical_date < next_month(month))):
            key = (r.host, r.model, r.gpu, r.driver_version)
            ored[key] = ored.get(key, 0) | int(r.scaled_gpus)
        changed = [{"row": r.id, "mask": ored[key]}
                   for r in bind.execute(sa.select(hm).where(hm.c.dag_id == dag_id, hm.c.month == month))
                   if (key := (r.host, r.model, r.gpu, r.driver_version)) in ored and ored[key] != r.scaled_gpus]
        if changed:
            bind.execute(hm.update().where(hm.c.id == sa.bindparam("row")).values(scaled_gpus=sa.bindparam("mask")),
                         changed)


def upgrade() -> None:
    recompute(whole_gpus_only=True)


def downgrade() -> None:
    recompute(whole_gpus_only=False)
