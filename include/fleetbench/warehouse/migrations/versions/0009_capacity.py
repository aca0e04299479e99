"""Capacity profiles: a case's measured container memory and what the plan predicted for it.

- benchmark_results gets
  - peak_mem_mib, peak_mem_source: the container's peak memory (CPU cases; cgroup v2 `memory.peak`,
    v1 `memory.max_usage_in_bytes`, or the engine's sampled stats), next to peak_gpu_mem_mib;
  - capacity_mib: the memory the case had (the container's memory limit for a CPU case, the GPU's
    memory for a GPU case) when it was known;
  - predicted_mem_mib, capacity_note: the plan's prediction for the case and its verdict in words
    (`fleetbench.capacity`), so an OOM the prediction said would fit shows as a miss.
  Rows stored before this revision keep NULL there (nothing was measured or predicted).
- capacity_features is created again with these columns (and device, benchmark, image and the global
  batch); `oom` is 1 for gpu_oom and oom_killed rows. SQLite checks views when a batch rebuilds the
  table, so the view is dropped first and created after.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

NEW_COLUMNS = [
    ("peak_mem_mib", sa.Float),
    ("peak_mem_source", sa.String(20)),
    ("capacity_mib", sa.Float),
    ("predicted_mem_mib", sa.Float),
    ("capacity_note", sa.Text),
]

# The view as revision 0003 made it (for downgrade).
CAPACITY_FEATURES_0003 = """
CREATE VIEW capacity_features AS
SELECT r.dag_id, r.run_id, r.logical_date, r.host, r.case_key,
       r.model, r.batch_size_per_device, r.num_gpus, r.precision, r.gpu_model,
       r.peak_gpu_mem_mib, r.mean_power_w, r.energy_source, r.mean_gpu_util_pct, r.images_per_sec,
       r.status, r.failure_class,
       CASE WHEN r.failure_class = 'gpu_oom' THEN 1 ELSE 0 END AS gpu_oom
FROM benchmark_results r
WHERE r.status <> 'skipped'
"""

# Plain SQL that SQLite and PostgreSQL both read: 0003's columns first, in their order, then the new ones.
CAPACITY_FEATURES = """
CREATE VIEW capacity_features AS
SELECT r.dag_id, r.run_id, r.logical_date, r.host, r.case_key,
       r.model, r.batch_size_per_device, r.num_gpus, r.precision, r.gpu_model,
       r.peak_gpu_mem_mib, r.mean_power_w, r.energy_source, r.mean_gpu_util_pct, r.images_per_sec,
       r.status, r.failure_class,
       CASE WHEN r.failure_class = 'gpu_oom' THEN 1 ELSE 0 END AS gpu_oom,
       r.benchmark, r.image_name, r.device, r.batch_size_global, r.command,
       r.peak_mem_mib, r.peak_mem_source, r.capacity_mib, r.predicted_mem_mib, r.capacity_note,
       CASE WHEN r.failure_class IN ('gpu_oom', 'oom_killed') THEN 1 ELSE 0 END AS oom
FROM benchmark_results r
WHERE r.status <> 'skipped'
"""


def upgrade() -> None:
    op.execute("DROP VIEW IF EXISTS capacity_features")
    with op.batch_alter_table("benchmark_results") as batch:
        for name, type_ in NEW_COLUMNS:
            batch.add_column(sa.Column(name, type_))
    op.execute(CAPACITY_FEATURES)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS capacity_features")
    with op.batch_alter_table("benchmark_results") as batch:
        for name, _ in reversed(NEW_COLUMNS):
            batch.drop_column(name)
    op.execute(CAPACITY_FEATURES_0003)
