"""Where a dataset's public class sizes come from: declared at upload, or a DP histogram.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('datasets', sa.Column('class_sizes_source', sa.String(20), nullable=True),
                  schema='api')
    op.execute("UPDATE api.datasets SET class_sizes_source = 'declared' "
               "WHERE class_sizes IS NOT NULL")


def downgrade() -> None:
    op.drop_column('datasets', 'class_sizes_source', schema='api')
