"""Initial api schema: tenants, api keys, datasets, models, jobs, artifacts.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('tenants',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('is_admin', sa.Boolean(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    schema='api'
    )
    op.create_table('api_keys',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('tenant_id', sa.String(length=40), nullable=False),
    sa.Column('secret_sha256', sa.String(length=64), nullable=False),
    sa.Column('scopes', sa.JSON(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['tenant_id'], ['api.tenants.id'], ),
    sa.PrimaryKeyConstraint('id'),
    schema='api'
    )
    op.create_index(op.f('ix_api_api_keys_tenant_id'), 'api_keys', ['tenant_id'], unique=False, schema='api')
    op.create_table('datasets',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('tenant_id', sa.String(length=40), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('visibility', sa.String(length=10), nullable=False),
    sa.Column('object_key', sa.String(length=300), nullable=False),
    sa.Column('source_format', sa.String(length=10), nullable=False),
    sa.Column('true_size', sa.Integer(), nullable=False),
    sa.Column('declared_size', sa.Integer(), nullable=False),
    sa.Column('class_names', sa.JSON(), nullable=False),
    sa.Column('class_counts', sa.JSON(), nullable=False),
    sa.Column('image_shape', sa.JSON(), nullable=False),
    sa.Column('delta', sa.Float(), nullable=True),
    sa.Column('epsilon_limit', sa.Float(), nullable=True),
    sa.Column('neighbouring', sa.String(length=20), nullable=True),
    sa.Column('declared_public_by', sa.String(length=40), nullable=True),
    sa.Column('uploaded_by', sa.String(length=40), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('size_bytes', sa.BigInteger(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['tenant_id'], ['api.tenants.id'], ),
    sa.PrimaryKeyConstraint('id'),
    schema='api'
    )
    op.create_index(op.f('ix_api_datasets_tenant_id'), 'datasets', ['tenant_id'], unique=False, schema='api')
    op.create_table('jobs',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('tenant_id', sa.String(length=40), nullable=False),
    sa.Column('type', sa.String(length=20), nullable=False),
    sa.Column('spec', sa.JSON(), nullable=False),
    sa.Column('state', sa.String(length=20), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('dataset_id', sa.String(length=40), nullable=True),
    sa.Column('model_id', sa.String(length=40), nullable=True),
    sa.Column('progress_step', sa.Integer(), nullable=False),
    sa.Column('progress_total', sa.Integer(), nullable=False),
    sa.Column('epsilon_so_far', sa.Float(), nullable=True),
    sa.Column('eta_s', sa.Float(), nullable=True),
    sa.Column('progress_message', sa.String(length=200), nullable=True),
    sa.Column('reservation_id', sa.String(length=40), nullable=True),
    sa.Column('privacy', sa.JSON(), nullable=True),
    sa.Column('result', sa.JSON(), nullable=False),
    sa.Column('worker_id', sa.String(length=200), nullable=True),
    sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('error_code', sa.String(length=60), nullable=True),
    sa.Column('error_message', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['tenant_id'], ['api.tenants.id'], ),
    sa.PrimaryKeyConstraint('id'),
    schema='api'
    )
    op.create_index('ix_jobs_state_heartbeat', 'jobs', ['state', 'heartbeat_at'], unique=False, schema='api')
    op.create_index('ix_jobs_tenant_created', 'jobs', ['tenant_id', 'created_at', 'id'], unique=False, schema='api')
    op.create_table('models',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('tenant_id', sa.String(length=40), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('object_key', sa.String(length=300), nullable=False),
    sa.Column('source', sa.String(length=10), nullable=False),
    sa.Column('dataset_id', sa.String(length=40), nullable=True),
    sa.Column('job_ids', sa.JSON(), nullable=False),
    sa.Column('produced_by_job_id', sa.String(length=40), nullable=True),
    sa.Column('dp', sa.Boolean(), nullable=False),
    sa.Column('job_epsilon', sa.Float(), nullable=True),
    sa.Column('delta', sa.Float(), nullable=True),
    sa.Column('rng', sa.String(length=20), nullable=True),
    sa.Column('info', sa.JSON(), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('size_bytes', sa.BigInteger(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['tenant_id'], ['api.tenants.id'], ),
    sa.PrimaryKeyConstraint('id'),
    schema='api'
    )
    op.create_index(op.f('ix_api_models_tenant_id'), 'models', ['tenant_id'], unique=False, schema='api')
    op.create_table('artifacts',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('tenant_id', sa.String(length=40), nullable=False),
    sa.Column('job_id', sa.String(length=40), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(length=20), nullable=False),
    sa.Column('object_key', sa.String(length=300), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('size_bytes', sa.BigInteger(), nullable=False),
    sa.Column('owner_only', sa.Boolean(), nullable=False),
    sa.Column('non_dp', sa.Boolean(), nullable=False),
    sa.Column('checkpoint_step', sa.Integer(), nullable=True),
    sa.Column('model_id', sa.String(length=40), nullable=True),
    sa.Column('info', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['api.jobs.id'], ),
    sa.ForeignKeyConstraint(['tenant_id'], ['api.tenants.id'], ),
    sa.PrimaryKeyConstraint('id'),
    schema='api'
    )
    op.create_index(op.f('ix_api_artifacts_job_id'), 'artifacts', ['job_id'], unique=False, schema='api')


def downgrade() -> None:
    op.drop_index(op.f('ix_api_artifacts_job_id'), table_name='artifacts', schema='api')
    op.drop_table('artifacts', schema='api')
    op.drop_index(op.f('ix_api_models_tenant_id'), table_name='models', schema='api')
    op.drop_table('models', schema='api')
    op.drop_index('ix_jobs_tenant_created', table_name='jobs', schema='api')
    op.drop_index('ix_jobs_state_heartbeat', table_name='jobs', schema='api')
    op.drop_table('jobs', schema='api')
    op.drop_index(op.f('ix_api_datasets_tenant_id'), table_name='datasets', schema='api')
    op.drop_table('datasets', schema='api')
    op.drop_index(op.f('ix_api_api_keys_tenant_id'), table_name='api_keys', schema='api')
    op.drop_table('api_keys', schema='api')
    op.drop_table('tenants', schema='api')
