"""Datasets may carry one layout mask per image (DP-DocLDM layout conditioning).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('datasets', sa.Column('has_masks', sa.Boolean(), nullable=False,
                                        server_default=sa.false()), schema='api')


def downgrade() -> None:
    op.drop_column('datasets', 'has_masks', schema='api')
