"""The held-out split at upload (``DatasetMetadata.holdout_fraction``; issue 5, item 1 and
issue 13, item 1).

An upload may set aside a fraction of its privacy UNITS (images, or subjects for a
``privacy_unit: subject`` dataset) as held-out records: the real test data of evaluate jobs.
They are written as a second canonical npz beside the dataset's object (under the same
prefix, so a private dataset's read grant covers both) and are excluded from everything
else: the dataset's object, its true size and class counts, the default and the minimum of
its declared size N̂, the class-size checks, and so from every job and derived dataset that
trains on it. Their record hashes are still stored with the dataset's (overlap detection
covers them: they are the budget's records too), with their positions and sides, so the
owner can list them (``GET /v1/datasets/{id}/holdout``).

The split is 1-stable (docs/privacy.md "Held-out and derived splits are 1-stable"): a unit
is held out iff its keyed hash falls below the fraction
(:func:`dpsynth_shared.record_splits.in_first_part`), where the unit's hash is the record's
content hash, or the subject's keyed hash (so all of a subject's images go to the same side,
and a subject is never on both sides). The side of a unit depends on the key, the fraction
and that unit alone: adding or removing one unit changes the training part by at most that
unit. The held-out count is therefore itself random (about f·U), and there is no class
stratification (a stratified quota depends on every other unit of the class).

The key is the owner's write-only ``holdout_key`` (the same key keeps the same held-out
records across versions of a dataset) or is drawn from OS entropy. It is used here, at
ingest, and never stored. At least one unit must fall on each side, else 422
``invalid_dataset``; the message names no count of a private upload.

A split the OWNER declared (issue 15, item 5): an image-folder archive with Hugging Face
split folders and ``holdout_from`` (``test`` or ``validation``) holds out the images of that
folder (``Ingested.held``; rule ``folder_split_v1``). Each unit's side is the folder its
owner put it in before uploading, a function of that unit alone fixed before any job, so
the split is 1-stable like the keyed hash; a subject with images on both sides is refused
(a subject is held out whole). Such a split has no public fraction: ``holdout_fraction``
stays None (a fraction measured from the folders would publish a private count), so a DP
evaluation, which needs a public held-out size, is not offered on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from dpsynth_shared.errors import DpsynthError, ErrorCode, NotFound
from dpsynth_shared.record_splits import LEGACY_RULE, SPLIT_RULE, draw_key, in_first_part
from sqlalchemy.orm import Session

from dpsynth_api.datasets import repository as repo
from dpsynth_api.datasets.ingest import Ingested
from dpsynth_api.datasets.overlap import RecordRows
from dpsynth_api.datasets.schemas import DatasetMetadata
from dpsynth_api.tenants.security import Principal

KeySource = Literal["owner", "platform"]
FOLDER_RULE = "folder_split_v1"
"""The rule of a split the owner declared with ``holdout_from`` (a split folder)."""


@dataclass(frozen=True)
class Split:
    """An upload cut in two: what the dataset trains on and what it holds out.

    Attributes:
        train: the training records (upload order kept).
        holdout: the held-out records (upload order kept).
        held: each image's side, ``[N]`` bool in upload order (True: held out).
        unit_held: each unit's side, ``[U]`` bool (images, or dense subjects).
        key_source: ``owner`` (the upload's ``holdout_key``) or ``platform``; None for a
            split the owner declared (no key).
        rule: the split's rule (``keyed_hash_v1``, or ``folder_split_v1``).
    """

    train: Ingested
    holdout: Ingested
    held: np.ndarray
    unit_held: np.ndarray
    key_source: KeySource | None
    rule: str = SPLIT_RULE

    @property
    def holdout_units(self) -> int:
        return int(self.unit_held.sum())


def held_out_units(unit_hashes: Sequence[str], fraction: float, key: bytes, *,
                   unit: str = "records") -> np.ndarray:
    """Which units are held out: a boolean mask ``[U]``, a function of each unit's own hash.

    Args:
        unit_hashes: each unit's hash (record content hashes, or keyed subject hashes).
        fraction: the held-out share f, 0 < f ≤ 0.5.
        key: the split's key.
        unit: what a unit is, for the refusal's wording.

    Raises:
        DpsynthError: 422 ``invalid_dataset`` when one side would be empty.
    """
    mask = in_first_part(key, unit_hashes, fraction)
    if not mask.any() or mask.all():
        raise DpsynthError(ErrorCode.INVALID_DATASET,
                           f"holdout_fraction {fraction:g} leaves no {unit} on one side of the "
                           f"held-out split; at least one of the upload's {unit} must be held "
                           "out and at least one kept (raise the fraction, upload more, or "
                           "upload again: each unit's side is a keyed hash of the unit)",
                           holdout_fraction=fraction)
    return mask


def _part(data: Ingested, keep: np.ndarray) -> Ingested:
    """The records at ``keep`` (sorted indices) as their own canonical dataset; subjects are
    renumbered densely within the part."""
    subjects = None
    if data.subjects is not None:
        subjects = np.unique(data.subjects[keep], return_inverse=True)[1].astype(np.int64)
        subjects = subjects.reshape(keep.shape[0])
    return Ingested(images=data.images[keep], labels=data.labels[keep],
                    class_names=list(data.class_names), source_format=data.source_format,
                    masks=None if data.masks is None else data.masks[keep], subjects=subjects)


def split_upload(data: Ingested, fraction: float, *, unit_hashes: Sequence[str],
                 key: str | None) -> Split:
    """Cut an ingested upload into its training part and its held-out part.

    Args:
        data: the whole upload (raw subject ids already dropped).
        fraction: the held-out share f.
        unit_hashes: one hash per unit: the records' content hashes (image unit) or the
            keyed subject hashes by dense subject index (subject unit).
        key: the owner's ``holdout_key``, or None to draw one from OS entropy (discarded
            after the split).

    Raises:
        DpsynthError: 422 ``invalid_dataset`` when one side would be empty.
    """
    if len(unit_hashes) != data.unit_count:
        raise ValueError("one hash per unit is needed")
    unit = "subjects" if data.subjects is not None else "records"
    secret = key.encode() if key is not None else draw_key()
    mask = held_out_units(unit_hashes, fraction, secret, unit=unit)
    held = mask if data.subjects is None else mask[data.subjects]
    return Split(train=_part(data, np.flatnonzero(~held)),
                 holdout=_part(data, np.flatnonzero(held)), held=held, unit_held=mask,
                 key_source="owner" if key is not None else "platform")


def declared_split(data: Ingested) -> Split:
    """The split the owner declared (``data.held``: each image in the ``holdout_from``
    folder), units whole.

    Raises:
        DpsynthError: 422 ``invalid_dataset``: a subject with images on both sides; no unit
            on one side.
    """
    assert data.held is not None
    held = data.held.astype(bool)
    if data.subjects is None:
        unit_held = held
    else:
        count = np.bincount(data.subjects, minlength=data.unit_count)
        in_holdout = np.bincount(data.subjects, weights=held, minlength=data.unit_count)
        mixed = int(np.count_nonzero((in_holdout > 0) & (in_holdout < count)))
        if mixed:
            raise DpsynthError(ErrorCode.INVALID_DATASET,
                               f"{mixed} subject(s) have images both in the held-out folder "
                               "and in the training folders; a subject is held out whole: "
                               "move each subject's images to one side")
        unit_held = in_holdout > 0
    if not unit_held.any() or unit_held.all():
        raise DpsynthError(ErrorCode.INVALID_DATASET, "the held-out folder (holdout_from) "
                           "must hold some of the upload's records and the training folders "
                           "the others; one side is empty (after duplicates were removed)")
    return Split(train=_part(data, np.flatnonzero(~held)),
                 holdout=_part(data, np.flatnonzero(held)), held=held, unit_held=unit_held,
                 key_source=None, rule=FOLDER_RULE)


def split_for_upload(data: Ingested, meta: DatasetMetadata, *, hashes: Sequence[str],
                     subjects: Sequence[str] | None) -> Split | None:
    """The upload's held-out split (None without ``holdout_fraction`` or ``holdout_from``):
    units are the records (``hashes``) or, for a subject upload, the subjects (their keyed
    ``subjects`` hashes, by dense subject index); with ``holdout_from``, the folders."""
    if data.held is not None:
        return declared_split(data)
    if meta.holdout_fraction is None:
        return None
    key = meta.holdout_key.get_secret_value() if meta.holdout_key is not None else None
    return split_upload(data, meta.holdout_fraction,
                        unit_hashes=hashes if subjects is None else subjects, key=key)


def record_rows(data: Ingested, split: Split | None) -> RecordRows:
    """What is stored beside the upload's hashes (its images', then its subjects'):
    positions, sides and class indices (``overlap.add_hashes``)."""
    held = None if split is None else split.held
    count = data.subject_count or 0
    sides = [False] * count if split is None or data.subjects is None \
        else split.unit_held.astype(bool).tolist()
    return RecordRows.of_upload(data.labels, held, sides)


def holdout_key(object_key: str) -> str:
    """Where a dataset's held-out npz lives: beside its object (``.../holdout.npz``)."""
    return object_key.rsplit("/", 1)[0] + "/holdout.npz"


def list_held_out(session: Session, *, principal: Principal,
                  dataset_id: str) -> list[tuple[int, str]]:
    """The held-out records of the tenant's upload: (position in the upload, content hash).

    Owner scope only (the router's dependency): the list is a private statistic of the
    upload (its length is the held-out count).

    Raises:
        NotFound: another tenant's or an unknown dataset.
        DpsynthError: 422 ``no_holdout`` for a dataset without its own held-out split
            (derived datasets have none); 409 ``conflict`` for a split made before the
            records' sides were stored (``seeded_permutation_v0``).
    """
    dataset = repo.get_for_tenant(session, tenant_id=principal.tenant_id,
                                  dataset_id=dataset_id)
    if dataset is None:
        raise NotFound("dataset", dataset_id)
    if dataset.holdout_fraction is None and dataset.holdout_rule != FOLDER_RULE:
        raise DpsynthError(ErrorCode.NO_HOLDOUT, f"dataset {dataset.id} has no held-out "
                           "records of its own (holdout_fraction, or holdout_from 'test' for "
                           "split folders, at upload)",
                           dataset_id=dataset.id)
    if (dataset.holdout_rule or LEGACY_RULE) == LEGACY_RULE:
        raise DpsynthError(ErrorCode.CONFLICT, f"dataset {dataset.id}'s held-out split was "
                           f"made by the {LEGACY_RULE} rule, before the platform recorded "
                           "each record's side; its held-out records cannot be listed",
                           dataset_id=dataset.id, holdout_rule=LEGACY_RULE)
    return repo.held_out_records(session, dataset_id=dataset.id)
