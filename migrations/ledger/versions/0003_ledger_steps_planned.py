"""ledger: whole-dataset reservations keep the steps planned at admission

Extensions (replayed steps after a crash) grow ``steps_reserved``; the job's training length
must not grow with them, so the planned length is stored beside it (per-label runs already
have it in ``reservation_parts``). Existing rows are backfilled with ``steps_reserved``.

Revision ID: 0003_ledger_steps_planned
Revises: 0002_ledger_per_label
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_ledger_steps_planned"
down_revision = "0002_ledger_per_label"
branch_labels = None
depends_on = None

S = "ledger"


def upgrade() -> None:
    op.add_column("reservations", sa.Column("steps_planned", sa.BigInteger(), nullable=True),
                  schema=S)
    op.execute("UPDATE ledger.reservations SET steps_planned = steps_reserved "
               "WHERE NOT per_label")


def downgrade() -> None:
    op.drop_column("reservations", "steps_planned", schema=S)
