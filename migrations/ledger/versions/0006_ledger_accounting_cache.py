"""ledger: accounting caches shared by every ledger replica (issue 14, item 1)

``calibrations``: one row per calibrated job shape (the noise multiplier σ calibration
returned, keyed by the full shape: kind, target ε, sampling rate, steps, δ, relation, PLD
interval and accountant version), so a shape is calibrated once for all processes.

``tight_figures``: the tight PLD figure of a dataset's realised sequence after each charging
entry (``seq``), computed by the ledger's background worker and read by the budget views
(``events``: how many charging events it includes). Neither table is part of the chain:
both are derived, and can be dropped and recomputed at any time.

Revision ID: 0006_ledger_accounting_cache
Revises: 0005_ledger_evaluations
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_ledger_accounting_cache"
down_revision = "0005_ledger_evaluations"
branch_labels = None
depends_on = None

S = "ledger"


def upgrade() -> None:
    tz = sa.DateTime(timezone=True)
    op.create_table(
        "calibrations",
        sa.Column("shape", sa.Text(), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("target_epsilon", sa.Double(), nullable=False),
        sa.Column("sample_rate", sa.Double(), nullable=False),
        sa.Column("steps", sa.BigInteger(), nullable=False),
        sa.Column("delta", sa.Double(), nullable=False),
        sa.Column("relation", sa.String(16), nullable=False),
        sa.Column("discretization", sa.Double(), nullable=False),
        sa.Column("accountant", sa.Text(), nullable=False),
        sa.Column("sigma", sa.Double(), nullable=False),
        sa.Column("created_at", tz, nullable=False),
        schema=S,
    )
    op.create_table(
        "tight_figures",
        sa.Column("dataset_id", sa.String(64), primary_key=True),
        sa.Column("seq", sa.BigInteger(), primary_key=True),
        sa.Column("discretization", sa.Double(), primary_key=True),
        sa.Column("accountant", sa.Text(), nullable=False),
        sa.Column("events", sa.Integer(), nullable=False),
        sa.Column("epsilon", sa.Double(), nullable=False),
        sa.Column("computed_at", tz, nullable=False),
        schema=S,
    )


def downgrade() -> None:
    op.drop_table("tight_figures", schema=S)
    op.drop_table("calibrations", schema=S)
