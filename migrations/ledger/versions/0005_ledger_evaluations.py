"""ledger: non-DP evaluation reads of a budget's private data (recorded, never charged)

``evaluations``: one row per evaluate job on a private reference (``job_id`` unique: the api's
authorisation is idempotent), with the number of read grants workers took for it and when
the first was taken. Every authorisation and every grant is also a chained, signed, anchored
entry (``evaluation_authorised`` / ``evaluation_read``) with no charge.

Revision ID: 0005_ledger_evaluations
Revises: 0004_ledger_signed_policies
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_ledger_evaluations"
down_revision = "0004_ledger_signed_policies"
branch_labels = None
depends_on = None

S = "ledger"


def upgrade() -> None:
    tz = sa.DateTime(timezone=True)
    op.create_table(
        "evaluations",
        sa.Column("evaluation_id", sa.String(64), primary_key=True),
        sa.Column("dataset_id", sa.String(64), sa.ForeignKey("ledger.budgets.dataset_id"),
                  nullable=False),
        sa.Column("job_id", sa.String(64), nullable=False),
        sa.Column("reference_dataset_id", sa.String(64), nullable=False),
        sa.Column("requested_by", sa.String(64), nullable=False),
        sa.Column("purpose", sa.String(32), nullable=False),
        sa.Column("created_at", tz, nullable=False),
        sa.Column("touched_at", tz, nullable=True),
        sa.Column("grants", sa.Integer(), nullable=False, server_default="0"),
        sa.UniqueConstraint("job_id", name="uq_evaluations_job_id"),
        schema=S,
    )
    op.create_index("ix_ledger_evaluations_dataset_id", "evaluations", ["dataset_id"], schema=S)


def downgrade() -> None:
    op.drop_index("ix_ledger_evaluations_dataset_id", table_name="evaluations", schema=S)
    op.drop_table("evaluations", schema=S)
