"""Host facts of superseded attempts are kept: a rerun's host check no longer overwrites the one the earlier
attempt ran under.

- superseded_host_facts: a host_facts row (one host's check in one run) that a later store of the run
  replaced with another check (another `collected_at`), or dropped (the run no longer has the host), as it
  was, with when (`superseded_at`).
- superseded_results.host_collected_at: the `collected_at` of the host check the attempt was stored with;
  its facts are the host_facts row of the run and host with that `collected_at`, or, once a later check
  replaced it, the superseded_host_facts row.

Existing rows: attempts superseded before this revision keep host_collected_at NULL (the check they ran
under was replaced before it could be kept; their own row still has the driver, CUDA driver, GPU health and
image digest). The column is added in place (ALTER TABLE ... ADD COLUMN on both databases).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)

# host_facts' columns (name, type) as of revision 0011 (0001, and the GPU health of 0006).
HOST_COLUMNS = [
    ("verdict", sa.String(20)),
    ("reasons", sa.Text),
    ("kernel", sa.String(100)),
    ("docker_version", sa.String(100)),
    ("driver_version", sa.String(50)),
    ("cuda_driver_version", sa.String(20)),
    ("gpu_count", sa.Integer),
    ("gpu_model", sa.String(200)),
    ("nvidia_runtime", sa.Boolean),
    ("facts_json", sa.Text),
    ("checks_json", sa.Text),
    ("collected_at", TZ),
    ("gpu_health", sa.String(20)),
    ("gpu_health_issues", sa.Text),
    ("gpu_health_json", sa.Text),
]


def upgrade() -> None:
    op.create_table(
        "superseded_host_facts",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("dag_id", sa.String(250), nullable=False),
        sa.Column("run_id", sa.String(250), nullable=False),
        sa.Column("host", sa.String(100), nullable=False),
        *[sa.Column(name, type_, nullable=name != "verdict") for name, type_ in HOST_COLUMNS],
        sa.Column("superseded_at", TZ, nullable=False),
        sa.UniqueConstraint("dag_id", "run_id", "host", "superseded_at", name="uq_superseded_host_facts_key"),
    )
    op.add_column("superseded_results", sa.Column("host_collected_at", TZ))


def downgrade() -> None:
    """The kept host checks go with their table; superseded attempts keep their own driver and health columns."""
    with op.batch_alter_table("superseded_results") as batch:
        batch.drop_column("host_collected_at")
    op.drop_table("superseded_host_facts")
