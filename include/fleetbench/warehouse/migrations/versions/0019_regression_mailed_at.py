"""When a finding was mailed: regressions.mailed_at.

The report task decided what to mail from the findings stored before the send: "mailed already" was "the case's
previous night had a confirmed finding at min_severity". So a mail that failed was never sent later (the next
night found the finding stored), a cleared report task mailed the night again, and a backfilled night mailed a
change the nightly runs had mailed. `mailed_at` is set on the findings of a mail once it has been sent
(`fleetbench.regression.store.mark_mailed`), and `to_mail` counts a change as mailed only where it is set.

Rows stored before this revision: nothing recorded their mails. A confirmed major regression is taken as mailed
at its `detected_at` (what the old rule would not mail again), so an upgrade does not mail every open change once
more; minor ones stay unmarked, so a change confirmed as minor is still mailed when it turns major (with
`min_severity: minor`, an open minor change is mailed once more after the upgrade). Downgrade drops the column.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("regressions", sa.Column("mailed_at", sa.DateTime(timezone=True)))
    op.execute("UPDATE regressions SET mailed_at = detected_at "
               "WHERE kind = 'regression' AND status = 'confirmed' AND severity = 'major'")


def downgrade() -> None:
    with op.batch_alter_table("regressions") as batch:
        batch.drop_column("mailed_at")
