"""How a dataset's public size N̂ was made public (issue 13, item 2).

* ``datasets.declared_size_source``: ``declared`` (the owner's upper bound), ``dp_count``
  (a Gaussian count charged to the budget as its first event) or ``true_count`` (public data,
  or a replace-one dataset, where the count is public);
* ``datasets.size_release``: the DP count's release (σ, ε, margin, P[N̂ < N]).

Existing rows keep nulls: before this revision a private upload without ``declared_size`` got
its true count as N̂, and which rows did is not recorded (docs/privacy.md, "No exact private
count without DP").

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None

S = 'api'


def upgrade() -> None:
    op.add_column('datasets', sa.Column('declared_size_source', sa.String(20), nullable=True),
                  schema=S)
    op.add_column('datasets', sa.Column('size_release', sa.JSON(), nullable=True), schema=S)


def downgrade() -> None:
    op.drop_column('datasets', 'size_release', schema=S)
    op.drop_column('datasets', 'declared_size_source', schema=S)
