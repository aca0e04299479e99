"""Initial warehouse: runs, host_facts, benchmark_results, steps.

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("dag_id", sa.String(250), primary_key=True),
        sa.Column("run_id", sa.String(250), primary_key=True),
        sa.Column("logical_date", TZ, index=True),
        sa.Column("run_type", sa.String(50)),
        sa.Column("fleet", sa.String(100)),
        sa.Column("config_digest", sa.String(64)),
        sa.Column("started_at", TZ),
        sa.Column("finished_at", TZ),
        sa.Column("cases_total", sa.Integer, nullable=False),
        sa.Column("cases_ok", sa.Integer, nullable=False),
        sa.Column("cases_failed", sa.Integer, nullable=False),
        sa.Column("cases_skipped", sa.Integer, nullable=False),
    )
    op.create_table(
        "host_facts",
        sa.Column("dag_id", sa.String(250), primary_key=True),
        sa.Column("run_id", sa.String(250), primary_key=True),
        sa.Column("host", sa.String(100), primary_key=True),
        sa.Column("verdict", sa.String(20), nullable=False),
        sa.Column("reasons", sa.Text),
        sa.Column("kernel", sa.String(100)),
        sa.Column("docker_version", sa.String(100)),
        sa.Column("driver_version", sa.String(50)),
        sa.Column("cuda_driver_version", sa.String(20)),
        sa.Column("gpu_count", sa.Integer),
        sa.Column("gpu_model", sa.String(200)),
        sa.Column("nvidia_runtime", sa.Boolean),
        sa.Column("facts_json", sa.Text),
        sa.Column("checks_json", sa.Text),
        sa.Column("collected_at", TZ),
    )
    op.create_table(
        "benchmark_results",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("dag_id", sa.String(250), nullable=False),
        sa.Column("run_id", sa.String(250), nullable=False),
        sa.Column("logical_date", TZ),
        sa.Column("host", sa.String(100), nullable=False),
        sa.Column("case_key", sa.String(250), nullable=False),
        sa.Column("benchmark", sa.String(100)),
        sa.Column("model", sa.String(100)),
        sa.Column("batch_size_per_device", sa.Integer),
        sa.Column("batch_size_global", sa.Integer),
        sa.Column("num_gpus", sa.Integer),
        sa.Column("variable_update", sa.String(50)),
        sa.Column("device", sa.String(10)),
        sa.Column("num_batches", sa.Integer),
        sa.Column("image_name", sa.String(100)),
        sa.Column("image_ref", sa.String(500)),
        sa.Column("image_digest", sa.String(100)),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("failure_class", sa.String(50)),
        sa.Column("failure_detail", sa.Text),
        sa.Column("images_per_sec", sa.Float),
        sa.Column("step_count", sa.Integer),
        sa.Column("exit_code", sa.Integer),
        sa.Column("started_at", TZ),
        sa.Column("finished_at", TZ),
        sa.Column("duration_s", sa.Float),
        sa.Column("driver_version", sa.String(50)),
        sa.Column("cuda_driver_version", sa.String(20)),
        sa.Column("gpu_model", sa.String(200)),
        sa.Column("command", sa.Text),
        sa.Column("log_path", sa.Text),
        sa.Column("energy_source", sa.String(20)),
        sa.Column("energy_j", sa.Float),
        sa.Column("stored_at", TZ),
        sa.UniqueConstraint("dag_id", "run_id", "host", "case_key", name="uq_benchmark_results_key"),
    )
    op.create_index("ix_benchmark_results_host_case_time", "benchmark_results", ["host", "case_key", "started_at"])
    op.create_index("ix_benchmark_results_logical_date", "benchmark_results", ["logical_date"])
    op.create_table(
        "steps",
        sa.Column("dag_id", sa.String(250), primary_key=True),
        sa.Column("run_id", sa.String(250), primary_key=True),
        sa.Column("host", sa.String(100), primary_key=True),
        sa.Column("case_key", sa.String(250), primary_key=True),
        sa.Column("step", sa.Integer, primary_key=True),
        sa.Column("images_per_sec", sa.Float),
        sa.Column("plusminus", sa.Float),
        sa.Column("jitter", sa.Float),
        sa.Column("loss", sa.Float),
    )


def downgrade() -> None:
    for table in ("steps", "benchmark_results", "host_facts", "runs"):
        op.drop_table(table)
