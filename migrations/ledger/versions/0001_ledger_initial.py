"""ledger: budgets, accumulators, reservations, leases, append-only hash chain

Revision ID: 0001_ledger_initial
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001_ledger_initial"
down_revision = None
branch_labels = None
depends_on = None

S = "ledger"
GENESIS_HASH = "0" * 64  # dpsynth_shared.dp_events.GENESIS_HASH (frozen into this migration)


def upgrade() -> None:
    tz = sa.DateTime(timezone=True)
    op.create_table(
        "budgets",
        sa.Column("dataset_id", sa.String(64), primary_key=True),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("epsilon_limit", sa.Double(), nullable=False),
        sa.Column("delta", sa.Double(), nullable=False),
        sa.Column("declared_size", sa.BigInteger(), nullable=False),
        sa.Column("neighbouring", sa.String(16), nullable=False),
        sa.Column("admission_order", sa.Integer(), nullable=False),
        sa.Column("rdp_budget", sa.Double(), nullable=False),
        sa.Column("created_at", tz, nullable=False),
        schema=S,
    )
    op.create_table(
        "accumulators",
        sa.Column("dataset_id", sa.String(64), sa.ForeignKey("ledger.budgets.dataset_id"),
                  primary_key=True),
        sa.Column("partition", sa.String(200), primary_key=True),
        sa.Column("committed", sa.Double(), nullable=False),
        sa.Column("reserved", sa.Double(), nullable=False),
        schema=S,
    )
    op.create_table(
        "reservations",
        sa.Column("reservation_id", sa.String(64), primary_key=True),
        sa.Column("job_id", sa.String(64), nullable=False),
        sa.Column("dataset_id", sa.String(64), sa.ForeignKey("ledger.budgets.dataset_id"),
                  nullable=False),
        sa.Column("partition", sa.String(200), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("noise_multiplier", sa.Double(), nullable=False),
        sa.Column("sample_rate", sa.Double(), nullable=False),
        sa.Column("expected_batch_size", sa.Integer(), nullable=False),
        sa.Column("target_epsilon", sa.Double(), nullable=False),
        sa.Column("steps_reserved", sa.BigInteger(), nullable=False),
        sa.Column("steps_granted", sa.BigInteger(), nullable=False),
        sa.Column("current_attempt", sa.Integer(), nullable=False),
        sa.Column("rdp_per_step", sa.Double(), nullable=False),
        sa.Column("rdp_outstanding", sa.Double(), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=True),
        sa.Column("created_at", tz, nullable=False),
        sa.Column("closed_at", tz, nullable=True),
        sa.UniqueConstraint("job_id", name="uq_reservations_job_id"),
        schema=S,
    )
    op.create_index("ix_ledger_reservations_dataset_id", "reservations", ["dataset_id"], schema=S)
    op.create_table(
        "leases",
        sa.Column("lease_id", sa.String(64), primary_key=True),
        sa.Column("reservation_id", sa.String(64),
                  sa.ForeignKey("ledger.reservations.reservation_id"), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("start_step", sa.BigInteger(), nullable=False),
        sa.Column("steps", sa.BigInteger(), nullable=False),
        sa.Column("granted_at", tz, nullable=False),
        sa.Column("expires_at", tz, nullable=False),
        sa.Column("ended_at", tz, nullable=True),
        schema=S,
    )
    op.create_index("ix_ledger_leases_reservation_id", "leases", ["reservation_id"], schema=S)
    op.create_table(
        "entries",
        sa.Column("seq", sa.BigInteger(), sa.Identity(always=False), primary_key=True),
        sa.Column("at", tz, nullable=False),
        sa.Column("dataset_id", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("payload", postgresql.JSONB(), nullable=False),
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.UniqueConstraint("hash", name="entries_hash_key"),
        schema=S,
    )
    op.create_index("ix_ledger_entries_dataset_id", "entries", ["dataset_id"], schema=S)
    op.create_table(
        "chain_head",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("hash", sa.Text(), nullable=False),
        schema=S,
    )
    op.execute(f"INSERT INTO {S}.chain_head (id, seq, hash) VALUES (1, 0, '{GENESIS_HASH}')")
    # Append-only: the entries can be read and inserted, never changed or removed.
    op.execute(f"""
        CREATE FUNCTION {S}.entries_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          RAISE EXCEPTION 'ledger.entries is append-only (% refused)', TG_OP
            USING ERRCODE = 'insufficient_privilege';
        END $$;
    """)
    op.execute(f"""
        CREATE TRIGGER entries_append_only BEFORE UPDATE OR DELETE ON {S}.entries
        FOR EACH ROW EXECUTE FUNCTION {S}.entries_append_only();
    """)
    op.execute(f"""
        CREATE TRIGGER entries_no_truncate BEFORE TRUNCATE ON {S}.entries
        FOR EACH STATEMENT EXECUTE FUNCTION {S}.entries_append_only();
    """)


def downgrade() -> None:
    op.execute(f"DROP TRIGGER IF EXISTS entries_no_truncate ON {S}.entries")
    op.execute(f"DROP TRIGGER IF EXISTS entries_append_only ON {S}.entries")
    op.execute(f"DROP FUNCTION IF EXISTS {S}.entries_append_only()")
    op.drop_table("chain_head", schema=S)
    op.drop_index("ix_ledger_entries_dataset_id", table_name="entries", schema=S)
    op.drop_table("entries", schema=S)
    op.drop_index("ix_ledger_leases_reservation_id", table_name="leases", schema=S)
    op.drop_table("leases", schema=S)
    op.drop_index("ix_ledger_reservations_dataset_id", table_name="reservations", schema=S)
    op.drop_table("reservations", schema=S)
    op.drop_table("accumulators", schema=S)
    op.drop_table("budgets", schema=S)
