"""Precision of torch_synthetic results stored before it was read from `--precision`.

`fleetbench.metrics.precision_of` read only tf_cnn_benchmarks' `--use_fp16` / `--auto_mixed_precision`, so a
torch_synthetic case run with `--precision=bf16` or `--precision=fp16` was stored as `fp32`. Precision keys the
capacity profiles (a bf16 reading taught the fp32 line and its OOM bounds) and the speedup baselines. This
revision sets `precision` of every current and superseded result whose command carries `--precision=<p>` to what
the command says (the first precision flag, as `precision_of` reads it as of this revision; copied here, not
imported, so the revision stays what it was). Rows already right are not written. Speedup figures stored with
the old grouping are left as stored: the run's other rows they were scaled against are not known here.

Downgrade changes nothing: 0017's code reads the corrected values as they are.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-05
"""

import json
import re

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

FP16_FLAG = re.compile(r"^--(use_fp16|auto_mixed_precision)(?:=(.*))?$")
PRECISION_FLAG = re.compile(r"^--precision=(fp32|fp16|bf16)$")
FALSE = {"false", "0", "no", "off", "f", "n"}
TABLES = ("benchmark_results", "superseded_results")


def precision_of(command: str):
    try:
        args = json.loads(command)
    except ValueError:
        args = command.split()
    if not isinstance(args, list):
        return None
    for arg in args:
        if (m := PRECISION_FLAG.match(str(arg))) is not None:
            return m.group(1)
        m = FP16_FLAG.match(str(arg))
        if m and (m.group(2) is None or m.group(2).strip().lower() not in FALSE):
            return "fp16"
    return "fp32"


def upgrade() -> None:
    conn = op.get_bind()
    for table in TABLES:
        rows = conn.execute(sa.text(f"SELECT id, command, precision FROM {table} "
                                    "WHERE command LIKE '%--precision=%'")).all()
        fixes = [{"id": i, "p": p} for i, command, stored in rows
                 if (p := precision_of(command)) is not None and p != stored]
        if fixes:
            conn.execute(sa.text(f"UPDATE {table} SET precision = :p WHERE id = :id"), fixes)


def downgrade() -> None:
    pass
