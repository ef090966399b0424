"""Copies of one record inside one upload (issue 13, item 4; docs/privacy.md "Duplicates
inside one upload").

The guarantee is stated per record as hashed (``overlap.record_hashes``: sha256 over the
canonical pixels). If an upload holds the same image k times, DP-SGD samples and clips each
copy on its own, so adding or removing that record moves the training set by k rows: the
per-record epsilon then protects it only at group size k. Overlap with EARLIER uploads is
caught by the record hashes (``datasets/overlap.py``); copies INSIDE one upload are caught
here, after ingest and before the held-out split (so one copy can never sit on both sides):

* a private upload refuses them by default (``on_duplicate: "refuse"``: 422
  ``duplicate_records``), or keeps the first copy of each record and drops the others
  (``on_duplicate: "deduplicate"``);
* copies that DISAGREE are refused whatever the option: the same pixels under two labels,
  two subjects (``privacy_unit: subject``: one image cannot be two people's record) or two
  layout masks, or in two split folders (``train/`` and ``test/`` with ``holdout_from``:
  one image trained on and held out). Which copy is right is the owner's call, and a
  record in two classes or two subjects would also break the partitions the ledger
  composes in parallel;
* a public upload has no per-record guarantee to dilute: its copies are kept as uploaded
  unless the upload names an ``on_duplicate`` (then the same rules apply).

Refusals give counts only: never an index, a file name or a hash.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import numpy as np
from dpsynth_shared.errors import DpsynthError, ErrorCode

from dpsynth_api.datasets import overlap
from dpsynth_api.datasets.ingest import Ingested

OnDuplicate = Literal["refuse", "deduplicate"]
"""What an upload does with copies of one record (``DatasetMetadata.on_duplicate``)."""

__all__ = ["Copies", "OnDuplicate", "find_copies", "resolve_duplicates"]


@dataclasses.dataclass(frozen=True)
class Copies:
    """The copies inside one upload.

    Attributes:
        first: for each record, the index of the first record with its hash (itself when it
            is the first).
        disagreeing: how many copies differ from their first copy in label, subject or mask.
    """

    first: np.ndarray
    disagreeing: int

    @property
    def count(self) -> int:
        """How many records are copies of an earlier record (k copies of one image: k − 1)."""
        return int(np.count_nonzero(self.first != np.arange(self.first.size)))

    @property
    def keep(self) -> np.ndarray:
        """The mask of first copies (the records :func:`resolve_duplicates` keeps)."""
        return np.asarray(self.first == np.arange(self.first.size))


def find_copies(data: Ingested, hashes: list[str]) -> Copies:
    """Group an upload's records by content hash and check that copies agree.

    Args:
        data: the ingested arrays.
        hashes: ``overlap.record_hashes(data.images)``, in record order.
    """
    seen: dict[str, int] = {}
    first = np.asarray([seen.setdefault(h, i) for i, h in enumerate(hashes)], dtype=np.int64)
    copies = np.flatnonzero(first != np.arange(first.size))
    if copies.size == 0:
        return Copies(first, 0)
    originals = first[copies]
    differs = data.labels[copies] != data.labels[originals]
    if data.subjects is not None:
        differs |= data.subjects[copies] != data.subjects[originals]
    if data.masks is not None:
        flat = data.masks.reshape(data.masks.shape[0], -1)
        differs |= np.any(flat[copies] != flat[originals], axis=1)
    if data.held is not None:  # one image in train/ and in test/: trained on and held out
        differs |= data.held[copies] != data.held[originals]
    return Copies(first, int(np.count_nonzero(differs)))


def _refusal(copies: Copies, *, subject: bool, folders: bool = False) -> DpsynthError:
    what = "label, subject or layout mask" if subject else "label or layout mask"
    if folders:
        what = what.replace(" or ", ", split folder (train/, test/) or ")
    if copies.disagreeing:
        return DpsynthError(
            ErrorCode.DUPLICATE_RECORDS,
            f"{copies.count} record(s) of this upload are copies of another record of it "
            f"(identical pixels), and {copies.disagreeing} of them carry another {what} than "
            "the first copy; one record cannot be both, so such copies are refused whatever "
            "on_duplicate says: remove the wrong copies and upload again",
            duplicate_records=copies.count, disagreeing_records=copies.disagreeing)
    return DpsynthError(
        ErrorCode.DUPLICATE_RECORDS,
        f"{copies.count} record(s) of this upload are copies of another record of it "
        "(identical pixels): a record uploaded k times would be protected only at group size "
        "k. Remove the copies, or upload with on_duplicate 'deduplicate' to keep the first "
        "copy of each", duplicate_records=copies.count, disagreeing_records=0)


def resolve_duplicates(data: Ingested, *, on_duplicate: OnDuplicate | None,
                       private: bool) -> tuple[Ingested, list[str]]:
    """Apply the upload's ``on_duplicate`` to copies of one record inside it.

    Args:
        data: the ingested arrays (before the held-out split).
        on_duplicate: the upload's option; None is ``"refuse"`` for a private upload and
            keeps a public upload's copies as uploaded.
        private: whether the upload is private.

    Returns:
        The records to keep (``data`` itself when nothing changes) and their content hashes,
        in record order.

    Raises:
        DpsynthError: 422 ``duplicate_records`` with ``duplicate_records`` (how many records
            are copies of an earlier one) and ``disagreeing_records`` (how many of them
            differ from their first copy); never an index, file name or hash.
    """
    hashes = overlap.record_hashes(data.images)
    mode = on_duplicate if on_duplicate is not None else ("refuse" if private else None)
    if mode is None:
        return data, hashes
    copies = find_copies(data, hashes)
    if copies.count == 0:
        return data, hashes
    if mode == "refuse" or copies.disagreeing:
        raise _refusal(copies, subject=data.subjects is not None,
                       folders=data.held is not None)
    keep = copies.keep
    # Copies agree on their subject, so every subject keeps its first image and the dense
    # subject indices (and ``subject_ids``) stay valid as they are.
    kept = dataclasses.replace(
        data, images=np.ascontiguousarray(data.images[keep]), labels=data.labels[keep],
        masks=data.masks[keep] if data.masks is not None else None,
        subjects=data.subjects[keep] if data.subjects is not None else None,
        held=data.held[keep] if data.held is not None else None)
    return kept, [h for h, k in zip(hashes, keep.tolist(), strict=True) if k]
