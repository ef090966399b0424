"""The privacy unit of a private dataset: one image, or one subject (issue 4, item 2).

For h1-overlap (datasets/service.py ``upload_dataset``), the calls in order::

    column = units.subject_column_for(meta)        # before ingest; refuses bad metadata
    data = ingest_upload(raw, name, private=..., label_domain=..., limits=...,
                         subject_column=column)    # None: image unit, no subject parsing
    released = units.release_size(ledger, meta, data.unit_count)  # size_epsilon only
    terms = units.resolve_units(meta, data, released=released, owner=...)
    declared, delta = terms.declared_size, terms.delta
    Dataset(..., **terms.row_fields())              # privacy_unit, subject_count,
                                                    # partitions_disjoint, size source
    CreateBudget(..., **terms.budget_fields())      # privacy_unit, partitions_disjoint

``Ingested.class_counts()`` already counts UNITS per class (subjects for a subject dataset),
so ``Dataset.class_counts`` and the DP class-size histogram count what one record is.

What a unit changes (docs/privacy.md "The privacy unit: images or subjects"):

* ``image`` (default): one record is one image; N̂ (``declared_size``) counts images.
* ``subject``: one record is every image of one subject (a patient, a customer) together.
  N̂ counts subjects, so q = expected_batch_size / N̂ is a rate over subjects and δ < 1/N̂
  is over subjects; per-class sizes N̂_c count the subjects with an image in class c. The
  label partitions are disjoint (per-label jobs compose in parallel) only when every subject's
  images all carry one class; the owner declares it (default false), else the ledger sums a
  per-label job over its classes.

N̂ is public, so it never defaults to the true count of a private add/remove dataset (issue
13, item 2; docs/privacy.md "No exact private count without DP"): the owner declares an upper
bound, or asks for a charged DP count (:func:`release_size`), or, under replace-one, where the
count is public (a replacement never changes it), N̂ may be the true count. Whether the labels
are disjoint in the unit is declared too (item 3) and only checked against the data.

No error here names a subject id, a file or a true count of a private upload (the owner scope
alone gets the count in the refusal of a too small ``declared_size``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from dpsynth_shared.dp_events import Neighbouring
from dpsynth_shared.errors import REFUSAL_EXCEEDS, BudgetExhausted, DpsynthError, ErrorCode
from dpsynth_shared.ids import new_id
from dpsynth_shared.ledger_contract import PrivacyUnit
from dpsynth_shared.release_contract import SizeRelease, SizeReleasePlanRequest
from dpsynth_shared.secure_noise import NormalSource, SecureNormal

from dpsynth_api.datasets.ingest import SUBJECTS_CSV, Ingested
from dpsynth_api.datasets.schemas import DatasetMetadata
from dpsynth_api.ports import LedgerPort

DEFAULT_SUBJECT_COLUMN = "subjects"
"""The subject-id array of an ``.npz`` (and column of a Parquet file) when none is named."""

SIZE_MARGIN_Z = 6.0
"""N̂ = ⌈N + Z + z·σ⌉ with z = 6: P[N̂ < N] = Φ(−6) ≈ 9.9e-10 < 1e-9."""
DP_COUNT_DELTA = 1e-6
"""δ of a dataset whose N̂ is a DP count and which declares none: fixed, never from a count."""

SizeSource = Literal["declared", "dp_count", "true_count"]

__all__ = ["DEFAULT_SUBJECT_COLUMN", "DP_COUNT_DELTA", "SIZE_MARGIN_Z", "SUBJECTS_CSV",
           "ReleasedSize", "UnitTerms", "declared_disjoint", "default_delta", "noisy_size",
           "partitions_disjoint", "release_size", "resolve_units", "subject_column_for"]


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


def declared_disjoint(meta: DatasetMetadata, data: Ingested) -> bool:
    """The owner's ``partitions_disjoint``, checked against the data (never computed from it).

    Default: true for the image unit (one label per image: it always holds), false for the
    subject unit (safe: a per-label job is then summed over its classes). A declared true
    that the data contradicts is refused; the refusal says only that, nothing about which
    subject or how many.

    Raises:
        DpsynthError: 422 ``invalid_dataset``.
    """
    declared = meta.partitions_disjoint
    if declared is None:
        declared = meta.privacy_unit != PrivacyUnit.SUBJECT
    if declared and not partitions_disjoint(data.labels, data.subjects):
        raise _invalid("partitions_disjoint is declared true, but the data has a subject with "
                       "images in two or more classes; declare partitions_disjoint false "
                       "(per-label jobs are then summed over their classes)")
    return declared


@dataclass(frozen=True)
class ReleasedSize:
    """N̂ released as a charged DP count: ``declared_size`` and the release the ledger charges."""

    declared_size: int
    release: SizeRelease
    epsilon: float
    delta: float

    def row_value(self) -> dict[str, Any]:
        """The dataset row's ``size_release`` (shown to every reader: all of it is public)."""
        return {**self.release.model_dump(mode="json"), "epsilon": self.epsilon,
                "delta": self.delta}


def noisy_size(count: int, sigma: float, rng: NormalSource | None = None) -> int:
    """N̂ = max(1, ⌈N + Z + z·σ⌉), Z ~ N(0, σ²) from the OS CSPRNG (never a user seed)."""
    rng = rng if rng is not None else SecureNormal()
    return max(1, math.ceil(count + float(rng.normal(0.0, sigma)) + SIZE_MARGIN_Z * sigma))


def release_size(ledger: LedgerPort, meta: DatasetMetadata, count: int) -> ReleasedSize:
    """Draw N̂ for an upload that asks for a DP count (``size_epsilon``).

    The ledger calibrates σ for ``size_epsilon`` at δ (declared, else
    :data:`DP_COUNT_DELTA`) and checks the charge fits a budget of ``epsilon_limit``; then the
    noise is drawn here. Nothing is published until the ledger has charged the release in the
    budget's creation (``CreateBudget.size_release``), in the upload's transaction.

    Raises:
        BudgetExhausted: the count alone does not fit the limit (nothing drawn or charged).
    """
    assert meta.size_epsilon is not None and meta.epsilon_limit is not None
    delta = meta.delta if meta.delta is not None else DP_COUNT_DELTA
    plan = ledger.plan_size_release(SizeReleasePlanRequest(
        epsilon_limit=meta.epsilon_limit, delta=delta, neighbouring=meta.neighbouring,
        target_epsilon=meta.size_epsilon))
    if not plan.admissible:
        raise BudgetExhausted(f"the DP count of the dataset's size at ε {meta.size_epsilon:g} "
                              f"alone does not fit the epsilon limit {meta.epsilon_limit:g}: "
                              "lower size_epsilon, raise epsilon_limit, or give "
                              "declared_size instead (nothing was spent)",
                              rdp_requested=plan.rdp_charge, rdp_budget=plan.rdp_budget,
                              target_epsilon=meta.size_epsilon,
                              refusal=REFUSAL_EXCEEDS, field="size_epsilon")
    sigma = plan.event.sigma
    release = SizeRelease(release_id=new_id("release"), target_epsilon=meta.size_epsilon,
                          sigma=sigma, margin_z=SIZE_MARGIN_Z,
                          failure_probability=0.5 * math.erfc(SIZE_MARGIN_Z / math.sqrt(2.0)))
    return ReleasedSize(noisy_size(count, sigma), release, plan.epsilon, delta)


@dataclass(frozen=True)
class UnitTerms:
    """The privacy terms of an upload in its unit, validated.

    Attributes:
        privacy_unit: the unit (None for a public dataset).
        unit_count: the true number of units (images, or subjects).
        subject_count: the true number of subjects (subject unit only; owner-only).
        declared_size: N̂, the public number of units (>= ``unit_count`` when declared; a DP
            count falls below it with probability Φ(−6) < 1e-9, which privacy tolerates).
        delta: the dataset's delta (< 1/N̂ over units); None for a public dataset.
        partitions_disjoint: declared: every unit in one class (None for a public dataset).
        size_source: how N̂ was made public: ``declared`` (an upper bound), ``dp_count``
            (a charged Gaussian count) or ``true_count`` (public data, or replace-one).
    """

    privacy_unit: PrivacyUnit | None
    unit_count: int
    subject_count: int | None
    declared_size: int
    delta: float | None
    partitions_disjoint: bool | None
    size_source: SizeSource = "declared"

    def row_fields(self) -> dict[str, Any]:
        """The api ``Dataset`` row's unit columns."""
        return {"privacy_unit": str(self.privacy_unit) if self.privacy_unit else None,
                "subject_count": self.subject_count,
                "partitions_disjoint": self.partitions_disjoint,
                "declared_size_source": self.size_source}

    def budget_fields(self) -> dict[str, Any]:
        """The ledger ``CreateBudget`` fields of the unit (private datasets only)."""
        assert self.privacy_unit is not None and self.partitions_disjoint is not None
        return {"privacy_unit": self.privacy_unit,
                "partitions_disjoint": self.partitions_disjoint}


def default_delta(declared_size: int) -> float:
    """delta defaults to min(1e-6, 1/(10·N̂)) for a DECLARED N̂ counted in units, never a true
    count (docs/privacy.md, "What a private dataset carries")."""
    return min(1e-6, 1.0 / (10.0 * declared_size))


def _size(meta: DatasetMetadata, units: int, released: ReleasedSize | None, unit_name: str,
          owner: bool) -> tuple[int, SizeSource]:
    """N̂ and where it comes from; never the true count of a private add/remove dataset."""
    if released is not None:
        return released.declared_size, "dp_count"  # may fall below N: see docs/privacy.md
    if meta.declared_size is None:
        if meta.visibility == "private" and meta.neighbouring != Neighbouring.REPLACE_ONE:
            raise _invalid(
                "a private dataset states its public size: declared_size N̂ (an upper bound "
                f"on its number of {unit_name}, made public) or size_epsilon (a DP count of "
                "them, charged to its budget); under add/remove the exact count is private, "
                "so it is never published by default")
        return units, "true_count"
    if meta.declared_size < units:
        # the uploader holds the data; the exact count goes to an owner key only
        raise _invalid(f"declared_size {meta.declared_size} is smaller than the number of "
                       f"{unit_name} uploaded; the public size N̂ must be at least the true "
                       f"count of {unit_name}", **({"unit_count": units} if owner else {}))
    return meta.declared_size, "declared"


def resolve_units(meta: DatasetMetadata, data: Ingested, *,
                  released: ReleasedSize | None = None, owner: bool = False) -> UnitTerms:
    """Validate N̂, delta and the class sizes in the dataset's unit; check the declared
    disjointness.

    * ``declared_size`` N̂ counts units (subjects for a subject dataset): declared (at least
      the true number of units), or ``released`` as a charged DP count; the true count only
      for public data and under replace-one (where it is public);
    * ``delta`` < 1/N̂ (default min(1e-6, 1/(10·N̂)) for a declared N̂, and
      :data:`DP_COUNT_DELTA` for a DP count: never a function of a true count);
    * each declared class size N̂_c counts the units with a record in class c, is at least
      that true count and at most N̂;
    * ``partitions_disjoint``: declared (:func:`declared_disjoint`).

    Args:
        meta: the upload's metadata (``subject_column_for`` already accepted it).
        data: the ingested arrays (``data.subjects`` set exactly for a subject upload).
        released: N̂ drawn by :func:`release_size` (``size_epsilon``), else None.
        owner: the uploader holds the owner scope (a refusal may carry the true count).

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
    declared, source = _size(meta, units, released, unit_name, owner)
    private = meta.visibility == "private"
    if not private:
        return UnitTerms(None, units, None, declared, None, None, source)
    if meta.delta is not None:
        delta = meta.delta
    else:
        delta = released.delta if released is not None else default_delta(declared)
    if delta >= 1.0 / declared:
        raise _invalid(f"delta {delta:g} must be smaller than 1/N̂ = {1.0 / declared:g} "
                       f"(N̂ counts {unit_name}; a larger delta allows releasing a "
                       f"{'subject' if subject else 'record'} outright)")
    _check_class_sizes(meta, data, declared, unit_name)
    disjoint = declared_disjoint(meta, data)
    return UnitTerms(PrivacyUnit.SUBJECT if subject else PrivacyUnit.IMAGE, units,
                     units if subject else None, declared, delta, disjoint, source)


def _check_class_sizes(meta: DatasetMetadata, data: Ingested, declared: int,
                       unit_name: str) -> None:
    """Declared class sizes bound the true per-class unit counts and N̂ (see
    docs/privacy.md "Per-label jobs" for the reasons); they count ``unit_name``."""
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
