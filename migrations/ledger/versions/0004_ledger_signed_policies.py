"""ledger: signed chain entries, the privacy unit, label disjointness and budget policies

* ``entries.signature`` / ``entries.key_id``: each new entry (chain head) is signed with the
  ledger's Ed25519 chain key when it is inserted (the append-only trigger forbids updates,
  so older entries stay unsigned and verify says so).
* ``budgets.privacy_unit`` (image | subject), ``budgets.partitions_disjoint`` (per-label jobs
  compose in parallel only when every unit falls in one label), ``budgets.warning_fraction``
  and ``budgets.epsilon_limit_initial`` (the limit only ever falls; backfilled).

Revision ID: 0004_ledger_signed_policies
Revises: 0003_ledger_steps_planned
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_ledger_signed_policies"
down_revision = "0003_ledger_steps_planned"
branch_labels = None
depends_on = None

S = "ledger"


def upgrade() -> None:
    op.add_column("entries", sa.Column("signature", sa.Text(), nullable=True), schema=S)
    op.add_column("entries", sa.Column("key_id", sa.String(64), nullable=True), schema=S)
    op.add_column("budgets", sa.Column("privacy_unit", sa.String(10), nullable=False,
                                       server_default="image"), schema=S)
    op.add_column("budgets", sa.Column("partitions_disjoint", sa.Boolean(), nullable=False,
                                       server_default=sa.true()), schema=S)
    op.add_column("budgets", sa.Column("warning_fraction", sa.Double(), nullable=False,
                                       server_default="0.8"), schema=S)
    op.add_column("budgets", sa.Column("epsilon_limit_initial", sa.Double(), nullable=True),
                  schema=S)
    op.execute("UPDATE ledger.budgets SET epsilon_limit_initial = epsilon_limit")


def downgrade() -> None:
    for name in ("epsilon_limit_initial", "warning_fraction", "partitions_disjoint",
                 "privacy_unit"):
        op.drop_column("budgets", name, schema=S)
    op.drop_column("entries", "key_id", schema=S)
    op.drop_column("entries", "signature", schema=S)
