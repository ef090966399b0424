"""Idempotency keys of creating POSTs (issue 14, item 8).

``idempotency_keys`` keeps, per tenant and client-chosen key, the fingerprint of the first
request (method, path, body hash) and, once it finished, its response (status, the headers a
client needs, body), so a replay returns the first response instead of doing the work again.
A row in state ``in_progress`` is the lock that turns a concurrent duplicate into a 409. Rows
expire (``expires_at``) and are purged by the api (docs/hardening-requests.md).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None

S = 'api'


def upgrade() -> None:
    op.create_table(
        'idempotency_keys',
        sa.Column('tenant_id', sa.String(40), primary_key=True),
        sa.Column('key', sa.String(255), primary_key=True),
        sa.Column('method', sa.String(10), nullable=False),
        sa.Column('path', sa.String(500), nullable=False),
        sa.Column('fingerprint', sa.String(64), nullable=False),
        sa.Column('state', sa.String(12), nullable=False),
        sa.Column('status_code', sa.Integer(), nullable=True),
        sa.Column('response_headers', sa.JSON(), nullable=True),
        sa.Column('response_body', sa.LargeBinary(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
        schema=S,
    )
    op.create_index('ix_api_idempotency_keys_expires_at', 'idempotency_keys', ['expires_at'],
                    schema=S)


def downgrade() -> None:
    op.drop_index('ix_api_idempotency_keys_expires_at', table_name='idempotency_keys', schema=S)
    op.drop_table('idempotency_keys', schema=S)
