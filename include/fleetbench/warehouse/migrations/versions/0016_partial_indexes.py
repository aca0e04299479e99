"""Partial indexes for the report sections that read benchmark_results itself, so a year of history does not
make them scan every result:

- ix_benchmark_results_memory_readings (logical_date): ok results with a memory reading, the points of the
  capacity profiles (`fleetbench.capacity.read_rows`, the report's capacity section and the plan);
- ix_benchmark_results_ooms (model, harness, precision, device, capacity_mib, failure_class, batch size per
  device, dag_id): OOM results, the profiles' bounds, read from the index alone;
- ix_benchmark_results_missed_ooms (logical_date): OOMs whose plan said "fits" (the misses);
- ix_benchmark_results_multinode (logical_date): ok multi-node results, the "Scaling across nodes" table.

The conditions and columns are written here as they are in `fleetbench.warehouse.schema` (MEMORY_READING_ROWS,
OOM_ROWS, MISSED_OOM_ROWS, MULTINODE_OK_ROWS, OOM_BOUND_COLUMNS) on the day of this revision; the queries name
the conditions word for word. Existing rows are indexed when the index is created; nothing else changes.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

INDEXES = [
    ("ix_benchmark_results_memory_readings",
     "status = 'ok' AND (peak_gpu_mem_mib IS NOT NULL OR peak_mem_mib IS NOT NULL)", ["logical_date"]),
    ("ix_benchmark_results_ooms", "failure_class IN ('gpu_oom', 'oom_killed')",
     ["model", "harness", "precision", "device", "capacity_mib", "failure_class", "batch_size_per_device", "dag_id"]),
    ("ix_benchmark_results_missed_ooms", "failure_class IN ('gpu_oom', 'oom_killed') AND capacity_note LIKE 'fits%'",
     ["logical_date"]),
    ("ix_benchmark_results_multinode", "status = 'ok' AND nodes >= 2", ["logical_date"]),
]


def upgrade() -> None:
    for name, where, columns in INDEXES:
        op.create_index(name, "benchmark_results", columns, sqlite_where=sa.text(where),
                        postgresql_where=sa.text(where))


def downgrade() -> None:
    for name, _, _ in reversed(INDEXES):
        op.drop_index(name, table_name="benchmark_results", if_exists=True)  # the missed OOMs' came later (0024)
