"""The MIG profile and nodes of each run_case_rollup row.

The report's scaling table and throughput charts of the whole fleet read run_case_rollup, which had a case's
model and GPU count but not whether its GPUs were MIG instances or how many hosts it spanned: 2 x 1g.10gb was
averaged into the same "2 GPUs" scaling row as two whole GPUs, and a MIG or multi-node case was drawn on the
whole-GPU chart of its GPU count (`fleetbench.report.queries.scaling`, `fleetbench.report.plots`).

This revision adds `mig_profile` and `nodes` and fills them for every stored row from the results of its case
(a case key has one profile and one node count; one pass over the results finds the MIG and multi-node cases,
every other row is whole GPUs on one node); no other column changes. Downgrade drops them.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

# One pass over the results: the few cases on MIG instances or across hosts; every other row is whole GPUs on one node.
ODD_CASES = """
SELECT dag_id, run_id, case_key, MAX(mig_profile), MAX(nodes) FROM benchmark_results
WHERE mig_profile IS NOT NULL OR nodes > 1
GROUP BY dag_id, run_id, case_key
"""
SET = """
UPDATE run_case_rollup SET mig_profile = :mig_profile, nodes = :nodes
WHERE dag_id = :dag_id AND run_id = :run_id AND case_key = :case_key
"""


def upgrade() -> None:
    op.add_column("run_case_rollup", sa.Column("mig_profile", sa.String(40)))
    op.add_column("run_case_rollup", sa.Column("nodes", sa.Integer))
    bind = op.get_bind()
    bind.execute(sa.text("UPDATE run_case_rollup SET nodes = 1"))
    odd = [{"dag_id": d, "run_id": r, "case_key": k, "mig_profile": m, "nodes": n or 1}
           for d, r, k, m, n in bind.execute(sa.text(ODD_CASES))]
    if odd:
        bind.execute(sa.text(SET), odd)


def downgrade() -> None:
    with op.batch_alter_table("run_case_rollup") as batch:
        batch.drop_column("nodes")
        batch.drop_column("mig_profile")
