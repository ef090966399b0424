"""Held-out records of a dataset (issue 5): the split's fraction and seed, the held-out
npz's key, hash and size, and the number of held-out images and units.

Existing datasets have no held-out records (all columns null).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None

S = 'api'
_COLUMNS = (('holdout_fraction', sa.Float()), ('holdout_seed', sa.BigInteger()),
            ('holdout_size', sa.Integer()), ('holdout_units', sa.Integer()),
            ('holdout_object_key', sa.String(300)), ('holdout_sha256', sa.String(64)),
            ('holdout_size_bytes', sa.BigInteger()))


def upgrade() -> None:
    for name, kind in _COLUMNS:
        op.add_column('datasets', sa.Column(name, kind, nullable=True), schema=S)


def downgrade() -> None:
    for name, _ in reversed(_COLUMNS):
        op.drop_column('datasets', name, schema=S)
