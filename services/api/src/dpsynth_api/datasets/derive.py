"""Derived datasets: class subsets and keyed-hash splits as SELECTIONS over a parent's records.

The api never reads private data after ingest (private objects open only with a ledger read
grant), so a derived dataset is not a copy: it is the parent's canonical object plus a
selection the worker applies when it loads the data inside the job
(``DatasetInfo.selection`` of the claim, ``dpsynth_worker.runners.selection``):

* ``classes``: keep the records whose label is one of these classes (labels are renumbered
  to the child's ``class_names``, in the parent's order);
* ``split`` (``{"rule": "keyed_hash_v1", "key", "fraction", "part"}``): then keep the
  records whose keyed content hash falls below ``fraction`` (``train``) or not
  (``holdout``), :func:`dpsynth_shared.record_splits.in_first_part`. Each record's side
  depends on the key and that record alone, so adding or removing one record of the parent
  changes the child by at most that record (issue 13, item 1). The key is drawn from OS
  entropy; the second part of a split of the same parent at the same fraction reuses it,
  so ``train`` and ``holdout`` are complementary. It never appears in a view;
* ``indices_key`` (splits made before issue 13, ``seeded_permutation_v0``): positions into
  the class-filtered records, a seeded permutation of the whole parent. Still applied by the
  worker; their guarantee covers the child's records only (docs/privacy.md).

A private child charges its parent's budget (``budget_id``), with its own public size
N̂_child setting the job's sample rate q = b / N̂_child; every record of the child is a
record of the budget, already covered by the parent's record hashes. The child's true size
(owner only) is counted from the record hashes, labels and sides stored at ingest (migration
0008) with the same rule, without reading the data.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from dpsynth_shared.errors import DpsynthError, ErrorCode, NotFound
from dpsynth_shared.ids import new_dataset_id
from dpsynth_shared.record_splits import LEGACY_RULE, SPLIT_RULE, draw_key, in_first_part
from sqlalchemy import select
from sqlalchemy.orm import Session

from dpsynth_api.datasets import repository as repo
from dpsynth_api.datasets.schemas import DeriveIn
from dpsynth_api.tables import Dataset
from dpsynth_api.tenants.security import Principal, Scope

SELECTING_KINDS = frozenset({"subset", "split"})
"""Derivations that read their parent's object (a link stores its own object)."""


def check_not_deleted(dataset: Dataset) -> None:
    """Refuse new work on a deleted dataset.

    Raises:
        DpsynthError: 410 ``dataset_deleted``.
    """
    if dataset.deleted_at is not None:
        raise DpsynthError(ErrorCode.DATASET_DELETED,
                           f"dataset {dataset.id} was deleted; its budget and ledger remain "
                           "readable, but no new job or derived dataset can use it",
                           dataset_id=dataset.id, deleted_at=dataset.deleted_at.isoformat())


def selection_of(dataset: Dataset) -> dict[str, object] | None:
    """The selection a worker applies to the dataset's object, or None (the whole object)."""
    derivation = dataset.derivation or {}
    if derivation.get("kind") not in SELECTING_KINDS:
        return None
    selection = derivation.get("selection")
    return dict(selection) if isinstance(selection, dict) else None


def derive_dataset(session: Session, *, principal: Principal, dataset_id: str,
                   body: DeriveIn) -> Dataset:
    """Create a subset or split of the tenant's dataset (no data copied or read).

    Raises:
        DpsynthError: 404 for another tenant's id, 410 ``dataset_deleted``, 422
            ``invalid_request`` for a selection that cannot be expressed or a size below
            the child's true count or with delta ≥ 1/N̂_child.
    """
    parent = repo.lock_for_tenant(session, tenant_id=principal.tenant_id,
                                  dataset_id=dataset_id)
    if parent is None:
        raise NotFound("dataset", dataset_id)
    check_not_deleted(parent)
    parent_selection = selection_of(parent) or {}
    if "indices_key" in parent_selection or "split" in parent_selection:
        raise DpsynthError(ErrorCode.INVALID_REQUEST,
                           f"dataset {parent.id} is a split; derive subsets and splits from "
                           "the dataset it was split from (a subset first, then its split)")
    if parent.privacy_unit == "subject" and body.kind == "split":
        raise DpsynthError(ErrorCode.INVALID_REQUEST,
                           "a split draws images, and this dataset's privacy unit is the "
                           "subject: one subject's images could fall in both parts (hold "
                           "subjects out at upload with holdout_fraction instead)")
    child_id = new_dataset_id()
    if body.kind == "subset":
        child = _subset(parent, body, child_id, parent_selection)
    else:
        child = _split(session, parent, body, child_id, parent_selection)
    _check_size(child, parent, body, principal)
    child.uploaded_by = principal.key_id
    try:
        repo.add(session, child)
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return child


def derivation_view(derivation: dict[str, Any] | None, *, owner: bool) -> dict[str, Any] | None:
    """A derivation as views show it: a split names its ``rule``, never its key; the seed
    of a split made before issue 13 (``seeded_permutation_v0``) is shown to the owner only.
    """
    if derivation is None:
        return None
    view = dict(derivation)
    if view.get("kind") != "split":
        return view
    view.setdefault("rule", LEGACY_RULE if "seed" in view else SPLIT_RULE)
    if not owner:
        view.pop("seed", None)
    selection = view.get("selection")
    if isinstance(selection, dict) and isinstance(selection.get("split"), dict):
        rule = {k: v for k, v in selection["split"].items() if k != "key"}
        view["selection"] = {**selection, "split": rule}
    return view


def _base(parent: Dataset, child_id: str, name: str) -> Dataset:
    return Dataset(
        id=child_id, tenant_id=parent.tenant_id, name=name, visibility=parent.visibility,
        object_key=parent.object_key, source_format=parent.source_format,
        true_size=parent.true_size, declared_size=parent.declared_size,
        class_names=list(parent.class_names), class_counts=dict(parent.class_counts),
        image_shape=list(parent.image_shape), has_masks=parent.has_masks, delta=parent.delta,
        epsilon_limit=parent.epsilon_limit, neighbouring=parent.neighbouring,
        class_sizes=None, class_sizes_source=None,
        declared_public_by=parent.declared_public_by, uploaded_by="", sha256=parent.sha256,
        size_bytes=parent.size_bytes, budget_id=parent.budget_id, parent_id=parent.id,
        privacy_unit=parent.privacy_unit, subject_count=None,
        partitions_disjoint=parent.partitions_disjoint,
        warning_fraction=parent.warning_fraction)


def _subset(parent: Dataset, body: DeriveIn, child_id: str,
            parent_selection: dict[str, object]) -> Dataset:
    assert body.classes is not None
    unknown = sorted(set(body.classes) - set(parent.class_names))
    if unknown:
        raise DpsynthError(ErrorCode.INVALID_REQUEST, f"classes {unknown} are not classes of "
                           f"dataset {parent.id}", classes=unknown)
    kept = [c for c in parent.class_names if c in set(body.classes)]  # the parent's order
    child = _base(parent, child_id, body.name)
    child.class_names = kept
    child.class_counts = {c: int(parent.class_counts.get(c, 0)) for c in kept}
    child.true_size = sum(child.class_counts.values())
    sizes = parent.class_sizes
    if sizes:
        child.class_sizes = {c: int(sizes[c]) for c in kept}
        child.class_sizes_source = parent.class_sizes_source
    child.declared_size = body.declared_size or _default_size(parent, body)
    child.derivation = {"kind": "subset", "parent": parent.id, "classes": kept,
                        "selection": {**parent_selection, "classes": kept}}
    return child


def _default_size(parent: Dataset, body: DeriveIn) -> int:
    """The child's public N̂ from the parent's public sizes only (never from the data).

    Subset: the sum of the parent's DECLARED class sizes of the kept classes (each at least
    its class's true count), else N̂, at most N̂. Class sizes released by the DP histogram are
    noisy and may fall below a true count, so they are not used as a bound.
    Split (either part): the parent's N̂. A keyed-hash part keeps each record independently
    of the others, so it may keep all of them: ``ceil(fraction·N̂)`` would not bound its
    true count. A smaller N̂_child is the owner's declaration (checked in
    :func:`_check_size`).
    """
    n_hat = parent.declared_size
    if body.kind == "subset":
        assert body.classes is not None
        sizes = parent.class_sizes if parent.class_sizes_source == "declared" else None
        kept = set(body.classes) & set(parent.class_names)
        total = sum(int(sizes[c]) for c in kept) if sizes else n_hat
        return min(total, n_hat)
    return n_hat


def _sibling_key(session: Session, parent: Dataset, fraction: float) -> str | None:
    """The key of an earlier keyed-hash split of ``parent`` at ``fraction`` (complementary
    parts), or None."""
    rows = session.scalars(select(Dataset).where(Dataset.parent_id == parent.id,
                                                 Dataset.tenant_id == parent.tenant_id))
    for row in rows:
        d = row.derivation or {}
        split = (d.get("selection") or {}).get("split") or {}
        if d.get("kind") == "split" and d.get("fraction") == fraction and split.get("key"):
            return str(split["key"])
    return None


def _upload_of(session: Session, dataset: Dataset) -> Dataset:
    """The upload (or linked upload) whose object a subset reads: up its parents."""
    row = dataset
    while (row.derivation or {}).get("kind") in SELECTING_KINDS and row.parent_id:
        parent = session.get(Dataset, row.parent_id)
        if parent is None or parent.tenant_id != dataset.tenant_id:
            break
        row = parent
    return row


def _split_counts(session: Session, parent: Dataset, parent_selection: dict[str, object],
                  rule: dict[str, Any]) -> dict[str, int] | None:
    """The true class counts of a keyed-hash split of ``parent`` (owner only), from the
    record hashes, labels and sides stored at ingest; None when the parent's upload
    predates them (migration 0008)."""
    upload = _upload_of(session, parent)
    records = repo.training_records(session, dataset_id=upload.id)
    if records is None:
        return None
    names = list(upload.class_names)
    kept = parent_selection.get("classes")
    wanted = ({names.index(str(c)) for c in kept if str(c) in names}
              if isinstance(kept, list) else set(range(len(names))))
    chosen = [(h, label) for h, label in records if label in wanted]
    first = in_first_part(bytes.fromhex(str(rule["key"])), [h for h, _ in chosen],
                          float(rule["fraction"]))
    side = first if rule["part"] == "train" else ~first
    counts = np.bincount(np.asarray([label for _, label in chosen], dtype=np.int64)[side],
                         minlength=len(names))
    return {c: int(counts[names.index(c)]) for c in parent.class_names}


def _split(session: Session, parent: Dataset, body: DeriveIn, child_id: str,
           parent_selection: dict[str, object]) -> Dataset:
    assert body.fraction is not None and body.part is not None
    key = _sibling_key(session, parent, body.fraction) or draw_key().hex()
    rule = {"rule": SPLIT_RULE, "key": key, "fraction": body.fraction, "part": body.part}
    child = _base(parent, child_id, body.name)
    counts = _split_counts(session, parent, parent_selection, rule)
    derivation: dict[str, Any] = {"kind": "split", "parent": parent.id,
                                  "fraction": body.fraction, "part": body.part,
                                  "rule": SPLIT_RULE,
                                  "selection": {**parent_selection, "split": rule}}
    if counts is None:
        # An upload from before migration 0008: its records' labels and sides were not
        # stored, so the child's count is bounded by the parent's (the size check stays
        # valid; the owner's true_size is that bound, flagged here).
        child.class_counts = {}
        derivation["true_size_is_upper_bound"] = True
    else:
        child.class_counts = counts
        child.true_size = sum(counts.values())
    child.declared_size = body.declared_size or _default_size(parent, body)
    child.derivation = derivation
    return child


def _check_size(child: Dataset, parent: Dataset, body: DeriveIn,
                principal: Principal) -> None:
    """N̂_child bounds the child's true count; delta stays below 1/N̂_child.

    The default N̂_child is computed from public sizes only and always bounds the true
    count. A declared size below it can only be checked against the true count of the
    selection, a private statistic: that needs the owner scope (owners see the true counts),
    so a submit-scoped key cannot learn a class count from refusals.

    Raises:
        DpsynthError: 403 ``forbidden``; 400 ``invalid_request`` (the detail never states
            the true count).
    """
    default = _default_size(parent, body)
    if (body.declared_size is not None and body.declared_size < default
            and parent.visibility == "private" and not principal.has(Scope.OWNER)):
        raise DpsynthError(ErrorCode.FORBIDDEN,
                           f"a declared_size below the public bound {default} is checked "
                           "against the true number of records selected, which only the "
                           "owner scope may learn; omit it or use an owner key")
    if child.declared_size < child.true_size:
        raise DpsynthError(ErrorCode.INVALID_REQUEST,
                           f"declared_size {child.declared_size} is smaller than the number "
                           "of records the selection keeps; the public size N̂ must be at "
                           "least the true count")
    if child.delta is not None and child.delta >= 1.0 / child.declared_size:
        raise DpsynthError(ErrorCode.INVALID_REQUEST,
                           f"the budget's delta {child.delta:g} is not below 1/N̂ = "
                           f"{1.0 / child.declared_size:g} of the derived dataset; declare a "
                           "smaller size", delta=child.delta)
