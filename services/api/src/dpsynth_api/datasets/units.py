"""The privacy unit of a private dataset: one image, or one subject (issue 4, item 2).

For h1-overlap (datasets/service.py ``upload_dataset``), the calls in order::

    column = units.subject_column_for(meta)        # before ingest; refuses bad metadata
    data = ingest_upload(raw, name, private=..., label_domain=..., limits=...,
                         subject_column=column)    # None: image unit, no subject parsing
    terms = units.resolve_units(meta, data)         # replaces _privacy_terms + check_class_sizes
    declared, delta = terms.declared_size, terms.delta
    Dataset(..., **terms.row_fields())              # privacy_unit, subject_count,
                                                    # partitions_disjoint
    CreateBudget(..., **terms.budget_fields())      # privacy_unit, partitions_disjoint

``Ingested.class_counts()`` already counts UNITS per class (subjects for a subject dataset),
so ``Dataset.class_counts`` and the DP class-size histogram count what one record is.

What a unit changes (DESIGN §3; docs/privacy.md "The privacy unit: images or subjects"):

* ``image`` (default): one record is one image; N̂ (``declared_size``) counts images.
* ``subject``: one record is every image of one subject (a patient, a customer) together.
  N̂ counts subjects, so q = expected_batch_size / N̂ is a rate over subjects and δ < 1/N̂
  is over subjects; per-class sizes N̂_c count the subjects with an image in class c. The
  label partitions are disjoint (per-label jobs compose in parallel) only when every subject's
  images all carry one class; otherwise the ledger sums a per-label job over its classes.

No error here names a subject id, a file or a true count of a private upload.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.ledger_contract import PrivacyUnit

from dpsynth_api.datasets.ingest import SUBJECTS_CSV, Ingested
from dpsynth_api.datasets.schemas import DatasetMetadata

DEFAULT_SUBJECT_COLUMN = "subjects"
"""The subject-id array of an ``.npz`` (and column of a Parquet file) when none is named."""

__all__ = ["DEFAULT_SUBJECT_COLUMN", "SUBJECTS_CSV", "UnitTerms", "default_delta",
           "partitions_disjoint", "resolve_units", "subject_column_for"]


def _invalid(detail: str, **ext: Any) -> DpsynthError:
    return DpsynthError(ErrorCode.INVALID_DATASET, detail, **ext)


def subject_column_for(meta: DatasetMetadata) -> str | None:
    """The subject-id column ingest must read, or None for an image-unit upload.

    Raises:
        DpsynthError: 422 ``invalid_dataset`` when ``privacy_unit`` is ``subject`` on a public
            dataset (a public dataset has no privacy unit), or ``subject_column`` is given
            without ``privacy_unit: subject``.
    """
    if meta.privacy_unit == PrivacyUnit.SUBJECT:
        if meta.visibility != "private":
            raise _invalid("privacy_unit 'subject' applies to private datasets only; a public "
                           "dataset has no privacy budget")
        return meta.subject_column or DEFAULT_SUBJECT_COLUMN
    if meta.subject_column is not None:
        raise _invalid("subject_column is given only with privacy_unit 'subject'")
    return None


def partitions_disjoint(labels: np.ndarray, subjects: np.ndarray | None) -> bool:
    """Whether every unit falls in exactly one class.

    Images always do (one label each). Subjects do when all images of each subject carry
    the same label; one subject with images in two classes makes the classes overlap, and a
    per-label job then composes sequentially (summed over its classes) in the ledger.
    """
    if subjects is None or subjects.size == 0:
        return True
    pairs = np.unique(np.stack([subjects.astype(np.int64), labels.astype(np.int64)]), axis=1)
    return bool(np.unique(pairs[0]).size == pairs.shape[1])


@dataclass(frozen=True)
class UnitTerms:
    """The privacy terms of an upload in its unit, validated.

    Attributes:
        privacy_unit: the unit (None for a public dataset).
        unit_count: the true number of units (images, or subjects).
        subject_count: the true number of subjects (subject unit only; owner-only).
        declared_size: N̂, the public number of units (>= ``unit_count``).
        delta: the dataset's delta (< 1/N̂ over units); None for a public dataset.
        partitions_disjoint: every unit in one class (None for a public dataset).
    """

    privacy_unit: PrivacyUnit | None
    unit_count: int
    subject_count: int | None
    declared_size: int
    delta: float | None
    partitions_disjoint: bool | None

    def row_fields(self) -> dict[str, Any]:
        """The api ``Dataset`` row's unit columns."""
        return {"privacy_unit": str(self.privacy_unit) if self.privacy_unit else None,
                "subject_count": self.subject_count,
                "partitions_disjoint": self.partitions_disjoint}

    def budget_fields(self) -> dict[str, Any]:
        """The ledger ``CreateBudget`` fields of the unit (private datasets only)."""
        assert self.privacy_unit is not None and self.partitions_disjoint is not None
        return {"privacy_unit": self.privacy_unit,
                "partitions_disjoint": self.partitions_disjoint}


def default_delta(declared_size: int) -> float:
    """DESIGN §3: delta defaults to min(1e-6, 1/(10·N̂)), N̂ counted in units."""
    return min(1e-6, 1.0 / (10.0 * declared_size))


def resolve_units(meta: DatasetMetadata, data: Ingested) -> UnitTerms:
    """Validate N̂, delta and the class sizes in the dataset's unit; compute disjointness.

    * ``declared_size`` N̂ counts units (subjects for a subject dataset) and must be at least
      the true number of units (default: that number);
    * ``delta`` < 1/N̂ (default min(1e-6, 1/(10·N̂)));
    * each declared class size N̂_c counts the units with a record in class c, is at least
      that true count and at most N̂;
    * ``partitions_disjoint``: every unit falls in one class.

    Args:
        meta: the upload's metadata (``subject_column_for`` already accepted it).
        data: the ingested arrays (``data.subjects`` set exactly for a subject upload).

    Raises:
        DpsynthError: 422 ``invalid_dataset``; the detail names classes at most, never a
            true count, a subject id or a file.
    """
    subject = meta.privacy_unit == PrivacyUnit.SUBJECT
    if subject and data.subjects is None:
        raise _invalid("privacy_unit 'subject' needs a subject id for every image")
    if not subject and data.subjects is not None:
        raise _invalid("the upload carries subject ids but privacy_unit is not 'subject'")
    units = data.unit_count
    unit_name = "subjects" if subject else "records"
    declared = meta.declared_size if meta.declared_size is not None else units
    if declared < units:
        raise _invalid(f"declared_size {declared} is smaller than the number of {unit_name} "
                       f"uploaded; the public size N̂ must be at least the true count of "
                       f"{unit_name}")
    private = meta.visibility == "private"
    if not private:
        return UnitTerms(None, units, None, declared, None, None)
    delta = meta.delta if meta.delta is not None else default_delta(declared)
    if delta >= 1.0 / declared:
        raise _invalid(f"delta {delta:g} must be smaller than 1/N̂ = {1.0 / declared:g} "
                       f"(N̂ counts {unit_name}; a larger delta allows releasing a "
                       f"{'subject' if subject else 'record'} outright)")
    _check_class_sizes(meta, data, declared, unit_name)
    disjoint = partitions_disjoint(data.labels, data.subjects)
    return UnitTerms(PrivacyUnit.SUBJECT if subject else PrivacyUnit.IMAGE, units,
                     units if subject else None, declared, delta, disjoint)


def _check_class_sizes(meta: DatasetMetadata, data: Ingested, declared: int,
                       unit_name: str) -> None:
    """Declared class sizes bound the true per-class unit counts and N̂ (see
    ``service.check_class_sizes`` for the reasons); they count ``unit_name``."""
    if meta.class_sizes is None:
        return
    counts = data.class_counts()
    if set(meta.class_sizes) != set(counts):
        raise _invalid("class_sizes must give a size for every class of the dataset's label "
                       "domain, and only for those")
    small = sorted(c for c, n in meta.class_sizes.items() if n < counts[c])
    if small:
        raise _invalid(f"class_sizes are smaller than the number of {unit_name} uploaded for "
                       f"{', '.join(map(repr, small))}; each public class size N̂_c must be at "
                       f"least the class's true count of {unit_name}", classes=small)
    large = sorted(c for c, n in meta.class_sizes.items() if n > declared)
    if large:
        raise _invalid(f"class_sizes exceed the declared dataset size N̂ = {declared} for "
                       f"{', '.join(map(repr, large))}; a class cannot be larger than the "
                       "dataset", classes=large)
