"""The OOM indexes of 0016 as 0016 makes them now, on a warehouse that took its first version.

0016's first version indexed the OOM results on (logical_date) and had no index of the missed OOMs; it was changed
in place. A warehouse migrated by the first version kept that index through later upgrades: the capacity profiles'
OOM bounds were no longer read from the index alone. Here each of the two indexes is made again where its columns
are not the ones 0016 gives (`fleetbench.warehouse.schema.OOM_BOUND_COLUMNS`, on the day of this revision), and
made where it is missing; a warehouse that has them as they should be is not touched.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-07
"""

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

INDEXES = [
    ("ix_benchmark_results_ooms", "failure_class IN ('gpu_oom', 'oom_killed')",
     ["model", "harness", "precision", "device", "capacity_mib", "failure_class", "batch_size_per_device", "dag_id"]),
    ("ix_benchmark_results_missed_ooms", "failure_class IN ('gpu_oom', 'oom_killed') AND capacity_note LIKE 'fits%'",
     ["logical_date"]),
]


def upgrade() -> None:
    have = {i["name"]: i["column_names"] for i in sa.inspect(op.get_bind()).get_indexes("benchmark_results")}
    for name, where, columns in INDEXES:
        if have.get(name) == columns:
            continue
        if name in have:
            op.drop_index(name, table_name="benchmark_results")
        op.create_index(name, "benchmark_results", columns, sqlite_where=sa.text(where),
                        postgresql_where=sa.text(where))


def downgrade() -> None:
    pass  # the indexes are 0016's: 0016 removes them
