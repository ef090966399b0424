"""ledger: per-label jobs (one admission, one run per class) and declared class sizes

A per-label reservation keeps its one row (one id, one attempt fence, ``job_id`` still
unique); its per-class DP-SGD runs live in ``reservation_parts``, so the row's own DP columns
become nullable. Budgets record the public per-class sizes N̂_c; leases name their class.

Revision ID: 0002_ledger_per_label
Revises: 0001_ledger_initial
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0002_ledger_per_label"
down_revision = "0001_ledger_initial"
branch_labels = None
depends_on = None

S = "ledger"
_NULLABLE = [("noise_multiplier", sa.Double()), ("sample_rate", sa.Double()),
             ("expected_batch_size", sa.Integer()), ("rdp_per_step", sa.Double())]


def upgrade() -> None:
    op.add_column("budgets", sa.Column("class_sizes", postgresql.JSONB(), nullable=True),
                  schema=S)
    op.add_column("reservations", sa.Column("per_label", sa.Boolean(), nullable=False,
                                            server_default=sa.false()), schema=S)
    for name, type_ in _NULLABLE:
        op.alter_column("reservations", name, existing_type=type_, nullable=True, schema=S)
    op.create_table(
        "reservation_parts",
        sa.Column("reservation_id", sa.String(64),
                  sa.ForeignKey("ledger.reservations.reservation_id"), primary_key=True),
        sa.Column("partition", sa.String(200), primary_key=True),
        sa.Column("noise_multiplier", sa.Double(), nullable=False),
        sa.Column("sample_rate", sa.Double(), nullable=False),
        sa.Column("expected_batch_size", sa.Integer(), nullable=False),
        sa.Column("steps_planned", sa.BigInteger(), nullable=False),
        sa.Column("steps_reserved", sa.BigInteger(), nullable=False),
        sa.Column("steps_granted", sa.BigInteger(), nullable=False),
        sa.Column("rdp_per_step", sa.Double(), nullable=False),
        sa.Column("rdp_outstanding", sa.Double(), nullable=False),
        schema=S,
    )
    op.add_column("leases", sa.Column("partition", sa.String(200), nullable=True), schema=S)


def downgrade() -> None:
    # Per-label reservations have no whole-dataset DP columns, and accounting records are
    # never deleted: refuse the downgrade rather than lose them.
    count = op.get_bind().execute(
        sa.text(f"SELECT count(*) FROM {S}.reservations WHERE per_label")).scalar_one()
    if count:
        raise RuntimeError(f"{count} per-label reservation(s) exist; refusing to downgrade")
    op.drop_column("leases", "partition", schema=S)
    op.drop_table("reservation_parts", schema=S)
    for name, type_ in _NULLABLE:
        op.alter_column("reservations", name, existing_type=type_, nullable=False, schema=S)
    op.drop_column("reservations", "per_label", schema=S)
    op.drop_column("budgets", "class_sizes", schema=S)
