"""Record content hashes and the overlap rules of uploads (issue 4, item 1).

The budget belongs to the records, not to an upload: every uploaded record (public and
private) gets a content hash, stored as one ``RecordHash`` row in the same transaction as
its dataset row, and kept when the dataset is deleted. A new upload is compared with the
hashes of the uploading tenant only (docs/privacy.md "Records, overlap and derived data"):

* private upload ∩ one of the tenant's private datasets (deleted ones included) → 409
  ``private_data_overlap``, or, with ``on_overlap: "link"``, the upload charges the existing
  budget;
* public upload ∩ the tenant's private records → 409 ``public_private_overlap``;
* private upload ∩ a public dataset: accepted (public records carry no budget, and training
  on a record that is also public costs nothing the filter has to count).

Refusals name the tenant's own overlapping dataset ids and a count, never a record (no
index, no file name, no hash).

For a ``privacy_unit: subject`` dataset the record is the subject: each of its subjects
also gets a keyed hash (:func:`subject_hashes`, HMAC-SHA256 under the api's
``record_hash_key``) in the same table, so a new upload with NEW images of an existing
subject overlaps like a re-uploaded image. The raw subject ids are never stored.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np
from dpsynth_shared.record_splits import HASH_SCHEME, record_hashes
from sqlalchemy import Boolean, DateTime, Integer, String, bindparam, func, insert, literal, select
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

from dpsynth_api.db import utcnow
from dpsynth_api.tables import RecordHash, Tenant

SUBJECT_SCHEME = "dpsynth-subject-v1"
"""Prefix of every keyed subject message (another hash space than the pixel hashes)."""

# The content hash (sha256 over the canonical pixels) lives in dpsynth_shared: the worker
# recomputes it from the stored object to apply a derived dataset's keyed-hash split.
__all__ = ["HASH_SCHEME", "SUBJECT_SCHEME", "Overlap", "RecordRows", "add_hashes",
           "find_overlap", "lock_tenant", "record_hashes", "subject_hashes"]


def subject_hashes(key: bytes, tenant_id: str, subject_ids: Sequence[str]) -> list[str]:
    """The keyed hash of each subject: HMAC-SHA256(key, ``scheme|tenant|id``), hex.

    Keyed, not a plain sha256: subject ids are often low-entropy (patient numbers), and a
    plain hash of one could be inverted from a database dump by trying every id. Without
    the key (an api setting, never in the database) the stored hashes reveal nothing. The
    tenant is part of the message, so the same id of two tenants hashes differently. The
    ids are the normalised raw ids of ingest (``Ingested.subject_ids``: ``str(int)`` or the
    stripped string), so ``7`` and ``"7"`` hash the same. Subject ids are assumed stable
    within a tenant; a new key makes every later hash differ from the stored ones.

    Args:
        key: the api's ``record_hash_key``.
        tenant_id: the uploading tenant.
        subject_ids: the normalised raw ids, one per subject.

    Returns:
        One lowercase hex digest (64 characters) per id, in order.
    """
    prefix = f"{SUBJECT_SCHEME}|{tenant_id}|"
    return [hmac.new(key, (prefix + str(s)).encode(), hashlib.sha256).hexdigest()
            for s in subject_ids]


@dataclass(frozen=True)
class Overlap:
    """What an upload shares with the tenant's stored records of one visibility.

    Attributes:
        datasets: the tenant's datasets holding at least one of the upload's records
            (sorted ids; deleted datasets included).
        budgets: the distinct ledger budgets of those datasets (private only).
        records: how many records (images) of the upload are among them.
        subjects: how many subjects of the upload are among them (subject hashes).
    """

    datasets: list[str]
    budgets: list[str]
    records: int
    subjects: int = 0


def lock_tenant(session: Session, tenant_id: str) -> None:
    """Serialise the tenant's uploads (``SELECT … FOR UPDATE`` on its row) until commit,
    so two concurrent uploads of the same records cannot both pass the overlap check."""
    session.execute(select(Tenant.id).where(Tenant.id == tenant_id).with_for_update())


def find_overlap(session: Session, *, tenant_id: str, hashes: list[str],
                 visibility: str, subjects: Sequence[str] = ()) -> Overlap | None:
    """The upload's overlap with the tenant's stored records of ``visibility``, or None.

    Only the tenant's own rows are searched: telling a tenant that another tenant holds an
    image would itself reveal membership. One statement: the upload's hashes (pixel hashes
    and keyed ``subjects`` hashes together) travel as one array parameter and are joined
    through ``unnest`` against the (tenant, hash) index.
    """
    if not hashes and not subjects:
        return None
    wanted_all = sorted(set(hashes) | set(subjects))
    array = bindparam("hashes", wanted_all, type_=ARRAY(String(64)))
    wanted = func.unnest(array).table_valued("h").render_derived(name="wanted")
    stmt = (select(RecordHash.record_hash, RecordHash.dataset_id, RecordHash.budget_id)
            .join(wanted, RecordHash.record_hash == wanted.c.h)
            .where(RecordHash.tenant_id == tenant_id, RecordHash.visibility == visibility)
            .distinct())
    found = session.execute(stmt).all()
    if not found:
        return None
    matched = {row.record_hash for row in found}
    return Overlap(datasets=sorted({row.dataset_id for row in found}),
                   budgets=sorted({row.budget_id for row in found if row.budget_id}),
                   records=sum(1 for h in hashes if h in matched),
                   subjects=sum(1 for h in subjects if h in matched))


@dataclass(frozen=True)
class RecordRows:
    """What is stored beside each hash (migration 0008), parallel to the hashes: a record's
    position in the upload, its side of the held-out split and its class index (None where
    a row has none: a subject row has a side only)."""

    positions: Sequence[int | None]
    held_out: Sequence[bool | None]
    labels: Sequence[int | None]

    @staticmethod
    def of_upload(labels: np.ndarray, held: np.ndarray | None,
                  subject_sides: Sequence[bool] = ()) -> RecordRows:
        """The rows of an upload: its images in upload order (``held``: each image's side;
        None: no held-out split, every image is trained on), then one row per subject
        (``subject_sides``)."""
        n, s = int(labels.shape[0]), len(subject_sides)
        sides = [False] * n if held is None else held.astype(bool).tolist()
        return RecordRows(positions=[*range(n), *([None] * s)],
                          held_out=[*sides, *(bool(v) for v in subject_sides)],
                          labels=[*labels.astype(int).tolist(), *([None] * s)])


def add_hashes(session: Session, *, tenant_id: str, dataset_id: str, budget_id: str | None,
               visibility: str, hashes: list[str], rows: RecordRows | None = None,
               now: datetime | None = None) -> None:
    """Insert one ``RecordHash`` row per record (flush only), with ``rows`` beside them.

    One ``INSERT … SELECT … unnest(:hashes), unnest(:positions), …`` statement: each
    column travels as a single array parameter (70k rows in a fraction of a second, where
    an executemany of 70k parameter sets takes seconds); the arrays have equal lengths, so
    PostgreSQL zips their ``unnest`` rows.
    """
    if not hashes:
        return
    at = now or utcnow()
    n = len(hashes)
    if rows is None:
        rows = RecordRows(positions=[None] * n, held_out=[None] * n, labels=[None] * n)
    if not len(rows.positions) == len(rows.held_out) == len(rows.labels) == n:
        raise ValueError("RecordRows must be parallel to the hashes")
    each = func.unnest(bindparam("hashes", list(hashes), type_=ARRAY(String(64))))
    positions = func.unnest(bindparam("positions", list(rows.positions),
                                      type_=ARRAY(Integer)))
    held = func.unnest(bindparam("held_out", list(rows.held_out), type_=ARRAY(Boolean)))
    labels = func.unnest(bindparam("labels", list(rows.labels), type_=ARRAY(Integer)))
    select_rows = select(literal(tenant_id, String(40)), each, literal(dataset_id, String(40)),
                         literal(budget_id, String(40)), literal(visibility, String(10)),
                         literal(at, DateTime(timezone=True)), positions, held, labels)
    session.execute(insert(RecordHash).from_select(
        ["tenant_id", "record_hash", "dataset_id", "budget_id", "visibility", "created_at",
         "position", "held_out", "label"], select_rows))
