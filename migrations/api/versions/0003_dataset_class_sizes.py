"""Private datasets may declare public per-class sizes (per-label training).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('datasets', sa.Column('class_sizes', sa.JSON(), nullable=True), schema='api')


def downgrade() -> None:
    op.drop_column('datasets', 'class_sizes', schema='api')
