"""Record hashes (overlap refusal), derived datasets and their budget, deletion, the
privacy unit, per-dataset warning fraction and the per-tenant cap on dataset limits.

Existing private datasets charge their own budget (``budget_id = id``).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None

S = 'api'
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.add_column('tenants', sa.Column('max_dataset_epsilon_limit', sa.Float(), nullable=True),
                  schema=S)
    for column in (sa.Column('budget_id', sa.String(40), nullable=True),
                   sa.Column('parent_id', sa.String(40), nullable=True),
                   sa.Column('derivation', sa.JSON(), nullable=True),
                   sa.Column('deleted_at', TS, nullable=True),
                   sa.Column('privacy_unit', sa.String(10), nullable=True),
                   sa.Column('subject_count', sa.Integer(), nullable=True),
                   sa.Column('partitions_disjoint', sa.Boolean(), nullable=True),
                   sa.Column('warning_fraction', sa.Float(), nullable=True)):
        op.add_column('datasets', column, schema=S)
    op.create_index('ix_api_datasets_budget_id', 'datasets', ['budget_id'], schema=S)
    op.execute("UPDATE api.datasets SET budget_id = id, privacy_unit = 'image', "
               "partitions_disjoint = true WHERE visibility = 'private'")
    op.create_table(
        'record_hashes',
        sa.Column('id', sa.BigInteger(), primary_key=True, autoincrement=True),
        sa.Column('tenant_id', sa.String(40), nullable=False),
        sa.Column('record_hash', sa.String(64), nullable=False),
        sa.Column('dataset_id', sa.String(40), nullable=False),
        sa.Column('budget_id', sa.String(40), nullable=True),
        sa.Column('visibility', sa.String(10), nullable=False),
        sa.Column('created_at', TS, nullable=False),
        schema=S)
    op.create_index('ix_record_hashes_tenant_hash', 'record_hashes',
                    ['tenant_id', 'record_hash'], schema=S)
    op.create_index('ix_api_record_hashes_dataset_id', 'record_hashes', ['dataset_id'],
                    schema=S)


def downgrade() -> None:
    op.drop_table('record_hashes', schema=S)
    op.drop_index('ix_api_datasets_budget_id', 'datasets', schema=S)
    for name in ('warning_fraction', 'partitions_disjoint', 'subject_count', 'privacy_unit',
                 'deleted_at', 'derivation', 'parent_id', 'budget_id'):
        op.drop_column('datasets', name, schema=S)
    op.drop_column('tenants', 'max_dataset_epsilon_limit', schema=S)
