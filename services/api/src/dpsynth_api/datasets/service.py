"""Dataset use cases: upload (validate → canonical npz → store → ledger budget), read."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, BinaryIO

from dpsynth_shared.dp_events import Neighbouring
from dpsynth_shared.errors import DpsynthError, ErrorCode, NotFound
from dpsynth_shared.ids import new_dataset_id
from dpsynth_shared.ledger_contract import DEFAULT_WARNING_FRACTION, CreateBudget, PrivacyUnit
from dpsynth_shared.release_contract import (
    SizeRelease,
)
from pydantic import ValidationError
from sqlalchemy.orm import Session

from dpsynth_api import policies
from dpsynth_api.datasets import holdout, overlap, units
from dpsynth_api.datasets import repository as repo
from dpsynth_api.datasets.duplicates import resolve_duplicates
from dpsynth_api.datasets.ingest import (
    Ingested,
    IngestLimits,
    LayoutOptions,
    ingest_upload,
    write_canonical,
)
from dpsynth_api.datasets.limits import MIN_PRIVATE_RECORDS, check_record_count
from dpsynth_api.datasets.schemas import (
    DatasetMetadata,
)
from dpsynth_api.ports import LedgerPort, ObjectStore
from dpsynth_api.settings import ApiSettings
from dpsynth_api.tables import Dataset
from dpsynth_api.tenants.security import Principal, Scope
from dpsynth_api.uploads import safe_filename, spool, staging

log = logging.getLogger(__name__)


def parse_metadata(raw: str) -> DatasetMetadata:
    """The upload's ``metadata`` JSON field, validated (422 ``invalid_dataset``)."""
    try:
        return DatasetMetadata.model_validate_json(raw)
    except ValidationError as exc:
        errors = [{"loc": list(e["loc"]), "msg": e["msg"]} for e in exc.errors()]
        summary = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'metadata'}: {e['msg']}"
                            for e in errors)
        raise DpsynthError(ErrorCode.INVALID_DATASET, f"invalid metadata: {summary}",
                           errors=errors) from exc


def _limits(settings: ApiSettings) -> IngestLimits:
    return IngestLimits(settings.archive_limits, settings.max_image_pixels)


def upload_dataset(session: Session, *, principal: Principal, store: ObjectStore,
                   ledger: LedgerPort, settings: ApiSettings, metadata: str,
                   filename: str | None, upload: BinaryIO) -> Dataset:
    """Validate an upload, check its records against the tenant's, store its canonical form
    and (private) register its budget, or link it to the budget it overlaps.

    With ``holdout_fraction`` the upload is first cut in two (``datasets/holdout.py``): the
    held-out records go to their own npz beside the object and take no part in the row's
    sizes, N̂ or class checks; every record, held out or not, is hashed for overlap.

    Nothing is kept when any step fails: the stored objects are deleted and the row (with
    its record hashes) rolled back when the ledger refuses or cannot be reached.

    Raises:
        DpsynthError: 409 ``private_data_overlap`` / ``public_private_overlap``
            (datasets/overlap.py), 422 ``invalid_dataset``, the ledger's errors.
    """
    meta = parse_metadata(metadata)
    policies.check_upload(session, principal, meta)
    name = safe_filename(filename, "upload.zip")
    private = meta.visibility == "private"
    dataset_id = new_dataset_id()
    stored: list[str] = []
    try:
        # staged under the spool dir, held until the commit (uploads.py, issue 14, item 9)
        with staging(settings.spool_dir, "dataset") as tmp:
            store = tmp.journal(store)  # each object's key recorded before it is written
            raw = Path(tmp) / "upload"
            spool(upload, raw, max_bytes=settings.max_upload_bytes)
            column = units.subject_column_for(meta)
            data = ingest_upload(raw, name, private=private, label_domain=meta.label_domain,
                                 limits=_limits(settings), subject_column=column,
                                 layout=LayoutOptions(holdout_from=meta.holdout_from,
                                                      label_column=meta.label_column))
            # copies of one record refused or dropped before the split (issue 13, item 4);
            # every record is hashed, the held-out ones too: they are the budget's records
            data, hashes = resolve_duplicates(data, on_duplicate=meta.on_duplicate,
                                              private=private)
            # the minimum counts the records kept, after copies were dropped
            check_record_count(data.unit_count, private=private, minimum=MIN_PRIVATE_RECORDS,
                               what="images" if data.subjects is None else "subjects")
            subjects = _subject_hashes(settings, principal.tenant_id, data)
            split = holdout.split_for_upload(data, meta, hashes=hashes, subjects=subjects)
            train = split.train if split is not None else data
            canonical = write_canonical(train, Path(tmp) / "data.npz")
            overlap.lock_tenant(session, principal.tenant_id)  # held until commit
            link = _check_overlap(session, principal, meta, hashes, subjects)
            dataset = _new_row(dataset_id, meta, train, principal, link, ledger=ledger)
            stored.append(dataset.object_key)
            info = store.put_file(dataset.object_key, canonical)
            if split is not None:
                _store_holdout(dataset, split, store, Path(tmp), meta, stored)
            dataset.sha256, dataset.size_bytes = info.sha256, info.size
            repo.add(session, dataset)
            overlap.add_hashes(session, tenant_id=dataset.tenant_id, dataset_id=dataset.id,
                               budget_id=dataset.budget_id, visibility=dataset.visibility,
                               hashes=hashes + (subjects or []),
                               rows=holdout.record_rows(data, split))
            if private and link is None:
                ledger.create_budget(_budget_request(dataset, meta))
            session.commit()
    except BaseException:
        session.rollback()
        for key in stored:
            store.delete(key)
        raise
    log.info("dataset uploaded", extra={"dataset_id": dataset.id, "visibility": meta.visibility,
                                        "linked": link is not None})
    return dataset


def _store_holdout(dataset: Dataset, split: holdout.Split, store: ObjectStore, tmp: Path,
                   meta: DatasetMetadata, stored: list[str]) -> None:
    """Write the held-out records beside the dataset's object and record them on the row."""
    key = holdout.holdout_key(dataset.object_key)
    stored.append(key)
    held = store.put_file(key, write_canonical(split.holdout, tmp / "holdout.npz"))
    dataset.holdout_fraction, dataset.holdout_rule = meta.holdout_fraction, split.rule
    dataset.holdout_key_source = split.key_source
    dataset.holdout_size, dataset.holdout_units = split.holdout.size, split.holdout_units
    dataset.holdout_object_key = key
    dataset.holdout_sha256, dataset.holdout_size_bytes = held.sha256, held.size


def _subject_hashes(settings: ApiSettings, tenant_id: str, data: Ingested) -> list[str] | None:
    """The keyed hashes of a subject upload's subjects (None: not a subject upload).

    The raw ids (``data.subject_ids``) are dropped from the ingested data once hashed.
    """
    if data.subject_ids is None:
        return None
    key = settings.record_hash_key.get_secret_value().encode()
    found = overlap.subject_hashes(key, tenant_id, data.subject_ids)
    data.subject_ids = None  # the raw ids go no further than this
    return found


def _shared_counts(found: overlap.Overlap, subjects: list[str] | None) -> dict[str, int]:
    """The problem's (and a link's) counts: images, and subjects for a subject upload."""
    counts = {"overlapping_records": found.records}
    if subjects is not None:
        counts["overlapping_subjects"] = found.subjects
    return counts


def _shared_text(found: overlap.Overlap, subjects: list[str] | None) -> str:
    if subjects is None:
        return f"{found.records} record(s)"
    return (f"{found.records + found.subjects} record(s) or subject(s) ({found.records} "
            f"image(s), {found.subjects} subject(s))")


def _check_overlap(session: Session, principal: Principal, meta: DatasetMetadata,
                   hashes: list[str], subjects: list[str] | None = None,
                   ) -> tuple[Dataset, dict[str, int]] | None:
    """Apply the overlap rules (datasets/overlap.py); the budget's dataset and the counts
    of shared records (and subjects) when a private upload is to be linked, else None.

    A subject upload overlaps through its images' hashes and through its subjects' keyed
    hashes: new images of a subject already in a private dataset are that subject's record.

    Raises:
        DpsynthError: 409 ``public_private_overlap``; 409 ``private_data_overlap`` (also
            when a requested link is impossible, with ``link_refused``).
    """
    tenant = principal.tenant_id
    found = overlap.find_overlap(session, tenant_id=tenant, hashes=hashes, visibility="private",
                                 subjects=subjects or ())
    if found is None:
        if meta.visibility == "private" and meta.epsilon_limit is None:
            raise DpsynthError(ErrorCode.INVALID_DATASET, "a private dataset that shares no "
                               "record with your private datasets needs an epsilon_limit "
                               "(on_overlap 'link' found nothing to link to)")
        return None
    counts = _shared_counts(found, subjects)
    ext: dict[str, Any] = {"datasets": found.datasets, **counts}
    if meta.visibility == "public":
        raise DpsynthError(ErrorCode.PUBLIC_PRIVATE_OVERLAP,
                           f"{found.records} record(s) of this upload are records of your "
                           "private dataset(s); private data cannot be re-declared public",
                           **ext)
    if meta.on_overlap != "link":
        raise DpsynthError(ErrorCode.PRIVATE_DATA_OVERLAP,
                           f"{_shared_text(found, subjects)} of this upload are already in "
                           "your private dataset(s) (deleted ones included), whose budget "
                           "they belong to; upload with on_overlap 'link' to charge that "
                           "budget", **ext)
    if len(found.budgets) != 1:
        raise DpsynthError(ErrorCode.PRIVATE_DATA_OVERLAP,
                           "this upload shares records with datasets of different budgets "
                           f"({', '.join(found.budgets)}); a dataset charges one budget, so "
                           "it cannot be linked", link_refused="several_budgets",
                           budgets=found.budgets, **ext)
    root = session.get(Dataset, found.budgets[0])
    assert root is not None and root.tenant_id == tenant
    _check_link(meta, root, ext)
    return root, counts


def _check_link(meta: DatasetMetadata, root: Dataset, ext: dict[str, Any]) -> None:
    """A linked upload lives inside its budget's terms: its classes are partitions of the
    budget, its unit is the budget's (declared size and delta are checked with the data).

    Raises:
        DpsynthError: 409 ``private_data_overlap`` with ``link_refused``.
    """
    outside = sorted(set(meta.label_domain or []) - set(root.class_names))
    if outside:
        raise DpsynthError(ErrorCode.PRIVATE_DATA_OVERLAP,
                           f"cannot link: label_domain has {len(outside)} class(es) that "
                           f"budget {root.id} does not have: "
                           f"{', '.join(repr(c) for c in outside[:5])}"
                           f"{' and more' if len(outside) > 5 else ''}; a linked upload's "
                           f"classes must be classes of the budget it charges "
                           f"({', '.join(repr(c) for c in root.class_names[:10])}"
                           f"{', ...' if len(root.class_names) > 10 else ''})",
                           link_refused="label_domain", unknown_labels=outside[:5], **ext)
    if str(meta.privacy_unit) != (root.privacy_unit or "image"):
        raise DpsynthError(ErrorCode.PRIVATE_DATA_OVERLAP,
                           f"cannot link: budget {root.id} counts privacy unit "
                           f"{root.privacy_unit or 'image'!r}, this upload "
                           f"{str(meta.privacy_unit)!r}", link_refused="privacy_unit", **ext)


def _new_row(dataset_id: str, meta: DatasetMetadata, data: Ingested, principal: Principal,
             link: tuple[Dataset, dict[str, int]] | None, *, ledger: LedgerPort) -> Dataset:
    """The dataset row of an upload (sha256 and size set once stored).

    With ``size_epsilon`` N̂ is a DP count: σ is planned by the ledger and the noise drawn
    here; the ledger charges it when the budget is created (``_budget_request``), in this
    upload's transaction, before anything is returned or committed.
    """
    owner = principal.has(Scope.OWNER)
    if link is None:
        released = (units.release_size(ledger, meta, data.unit_count)
                    if meta.size_epsilon is not None else None)
        # N̂, delta, class sizes in the unit; the declared partitions_disjoint checked
        terms = units.resolve_units(meta, data, released=released, owner=owner)
        key = f"{meta.visibility}/datasets/{dataset_id}/data.npz"
        row = _row(dataset_id, key, meta, data, principal, terms.declared_size, terms.delta,
                   "", 0)
        for column, value in terms.row_fields().items():
            setattr(row, column, value)
        row.size_release = released.row_value() if released is not None else None
        if meta.visibility == "private":
            row.budget_id = dataset_id
            row.warning_fraction = (meta.warning_fraction if meta.warning_fraction is not None
                                    else DEFAULT_WARNING_FRACTION)
        return row
    root, shared = link
    assert root.budget_id is not None and root.delta is not None
    if meta.size_epsilon is not None:
        raise DpsynthError(ErrorCode.INVALID_DATASET, "a linked upload charges an existing "
                           "budget: declare its declared_size (size_epsilon is for a new "
                           "budget)", datasets=[root.id], **shared)
    # the budget's relation applies: under add/remove N̂ must be declared (never the count)
    linked_meta = meta.model_copy(update={"delta": root.delta, "neighbouring": Neighbouring(
        root.neighbouring or Neighbouring.ADD_REMOVE)})
    declared = meta.declared_size
    if declared is not None and declared >= data.unit_count and root.delta >= 1.0 / declared:
        raise DpsynthError(ErrorCode.PRIVATE_DATA_OVERLAP,
                           f"cannot link: the budget's delta {root.delta:g} is not below "
                           f"1/N̂ = {1.0 / declared:g} of this upload",
                           link_refused="delta", datasets=[root.id], **shared)
    # N̂ (>= the true count of units) and class sizes checked at the budget's delta
    terms = units.resolve_units(linked_meta, data, owner=owner)
    # The object lives under the budget's prefix: the budget's read grant covers it.
    key = f"private/datasets/{root.budget_id}/linked/{dataset_id}/data.npz"
    row = _row(dataset_id, key, meta, data, principal, terms.declared_size, root.delta, "", 0)
    for column, value in terms.row_fields().items():
        setattr(row, column, value)
    row.epsilon_limit, row.neighbouring = root.epsilon_limit, root.neighbouring
    row.budget_id, row.parent_id = root.budget_id, root.id
    row.derivation = {"kind": "link", "parent": root.id, **shared}
    row.warning_fraction = root.warning_fraction
    return row


def _row(dataset_id: str, key: str, meta: DatasetMetadata, data: Ingested, principal: Principal,
         declared: int, delta: float | None, sha256: str, size: int) -> Dataset:
    private = meta.visibility == "private"
    return Dataset(
        id=dataset_id, tenant_id=principal.tenant_id, name=meta.name, visibility=meta.visibility,
        object_key=key, source_format=data.source_format, true_size=data.size,
        declared_size=declared, class_names=data.class_names, class_counts=data.class_counts(),
        image_shape=data.image_shape, has_masks=data.masks is not None, delta=delta,
        epsilon_limit=meta.epsilon_limit,
        neighbouring=str(meta.neighbouring) if private else None,
        class_sizes=dict(meta.class_sizes) if meta.class_sizes is not None else None,
        class_sizes_source="declared" if meta.class_sizes is not None else None,
        declared_public_by=None if private else principal.key_id,
        uploaded_by=principal.key_id, sha256=sha256, size_bytes=size)


def _budget_request(dataset: Dataset, meta: DatasetMetadata) -> CreateBudget:
    assert dataset.epsilon_limit is not None and dataset.delta is not None
    return CreateBudget(dataset_id=dataset.id, tenant_id=dataset.tenant_id,
                        epsilon_limit=dataset.epsilon_limit, delta=dataset.delta,
                        declared_size=dataset.declared_size, neighbouring=meta.neighbouring,
                        partitions=list(dataset.class_names), class_sizes=dataset.class_sizes,
                        privacy_unit=PrivacyUnit(dataset.privacy_unit or "image"),
                        partitions_disjoint=bool(dataset.partitions_disjoint
                                                 if dataset.partitions_disjoint is not None
                                                 else True),
                        warning_fraction=dataset.warning_fraction or DEFAULT_WARNING_FRACTION,
                        declared_size_source=dataset.declared_size_source or "declared",
                        size_release=(SizeRelease.model_validate({
                            k: dataset.size_release[k] for k in SizeRelease.model_fields})
                            if dataset.size_release is not None else None))


def get_dataset(session: Session, *, principal: Principal, dataset_id: str) -> Dataset:
    """The tenant's dataset or 404 ``not_found`` (also for other tenants' ids)."""
    dataset = repo.get_for_tenant(session, tenant_id=principal.tenant_id, dataset_id=dataset_id)
    if dataset is None:
        raise NotFound("dataset", dataset_id)
    return dataset


def list_datasets(session: Session, *, principal: Principal, limit: int,
                  cursor: str | None) -> list[Dataset]:
    """One page of the tenant's datasets, newest first (``limit + 1`` rows)."""
    return repo.list_for_tenant(session, tenant_id=principal.tenant_id, limit=limit,
                                cursor=cursor)
