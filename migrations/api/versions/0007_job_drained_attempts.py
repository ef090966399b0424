"""Graceful drains of a job (issue 6): the number of its attempts that ended with a worker
shutdown (``worker_shutdown``) rather than a lost worker. The reaper counts them apart
from ``max_attempts``, under their own cap (``max_drained_attempts``).

Existing jobs start at 0 (server default): their earlier interruptions count as lost, as
they did before.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None

S = 'api'


def upgrade() -> None:
    op.add_column('jobs', sa.Column('drained_attempts', sa.Integer(), nullable=False,
                                    server_default='0'), schema=S)


def downgrade() -> None:
    op.drop_column('jobs', 'drained_attempts', schema=S)
