"""1-stable held-out splits (issue 13, item 1): the held-out split at upload is a keyed hash
of each unit, no longer a seeded permutation of the whole upload.

* ``datasets.holdout_rule``: ``keyed_hash_v1`` (new uploads) or ``seeded_permutation_v0``
  (held-out splits made before this revision; their guarantee covers the training part
  only, docs/privacy.md "Held-out and derived splits are 1-stable");
* ``datasets.holdout_key_source``: ``owner`` (a write-only ``holdout_key``, used at ingest
  and never stored) or ``platform`` (drawn from OS entropy and discarded after ingest);
* ``record_hashes.position`` / ``held_out`` / ``label``: each record's position in the
  upload, its side of the held-out split and its class index (subject rows: ``held_out``
  only). They list the held-out records for their owner and give the true size of a
  keyed-hash derived split without reading the data again.

Existing rows keep nulls (unknown): the old splits cannot be recomputed without the data.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

S = 'api'
_DATASET_COLUMNS = (('holdout_rule', sa.String(30)), ('holdout_key_source', sa.String(10)))
_RECORD_COLUMNS = (('position', sa.Integer()), ('held_out', sa.Boolean()),
                   ('label', sa.Integer()))


def upgrade() -> None:
    for name, kind in _DATASET_COLUMNS:
        op.add_column('datasets', sa.Column(name, kind, nullable=True), schema=S)
    op.execute("UPDATE api.datasets SET holdout_rule = 'seeded_permutation_v0' "
               "WHERE holdout_fraction IS NOT NULL")
    for name, kind in _RECORD_COLUMNS:
        op.add_column('record_hashes', sa.Column(name, kind, nullable=True), schema=S)


def downgrade() -> None:
    for name, _ in reversed(_RECORD_COLUMNS):
        op.drop_column('record_hashes', name, schema=S)
    for name, _ in reversed(_DATASET_COLUMNS):
        op.drop_column('datasets', name, schema=S)
