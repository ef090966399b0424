"""Bodies of the dataset endpoints."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from dpsynth_shared.dp_events import Neighbouring
from dpsynth_shared.ledger_contract import PrivacyUnit
from pydantic import BaseModel, ConfigDict, Field, model_validator


class DatasetMetadata(BaseModel):
    """The ``metadata`` form field of an upload (a JSON string)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    visibility: Literal["public", "private"]
    epsilon_limit: float | None = Field(None, gt=0, le=100)
    delta: float | None = Field(None, gt=0, lt=1)
    label_domain: list[str] | None = Field(None, min_length=1, max_length=100_000)
    declared_size: int | None = Field(None, ge=1)
    neighbouring: Neighbouring = Neighbouring.ADD_REMOVE
    class_sizes: dict[str, int] | None = Field(
        None, description="private datasets, for per-label training: the public size N̂_c of "
        "every class of label_domain, each at least 1, at least the true number of records "
        "of the class and at most the dataset's declared size N̂; they set each class's "
        "sample rate and are shown to everyone who can see the dataset")
    privacy_unit: PrivacyUnit = Field(
        PrivacyUnit.IMAGE, description="private datasets: what one record is. 'subject': "
        "all images of one subject together (user-level DP; declared_size then counts "
        "subjects); the upload must carry a subject id per image")
    subject_column: str | None = Field(
        None, min_length=1, max_length=200, description="privacy_unit 'subject': the name of "
        "the subject-id column (Parquet) or array (npz; default 'subjects'); image folders "
        "carry a subjects.csv (path,subject)")
    warning_fraction: float | None = Field(
        None, gt=0, le=1, description="private datasets: warn when spent reaches this "
        "fraction of the limit (default 0.8)")
    on_overlap: Literal["refuse", "link"] = Field(
        "refuse", description="a private upload sharing records with one of the tenant's "
        "private datasets: 'refuse' (409 private_data_overlap) or 'link' (the new dataset "
        "charges the existing dataset's budget; its epsilon_limit, delta and neighbouring "
        "are the budget's, and epsilon_limit may be omitted; given ones are ignored)")
    holdout_fraction: float | None = Field(
        None, gt=0, le=0.5, description="set aside this share of the upload's units (images, "
        "or subjects for privacy_unit 'subject') as held-out records: the real test data of "
        "evaluate jobs, never trained on and excluded from the declared size N̂, the class "
        "sizes and every derived dataset; stratified by class, seeded, at least one unit on "
        "each side")
    holdout_seed: int | None = Field(
        None, ge=0, le=2**63 - 1, description="the held-out split's seed (default: drawn "
        "from OS entropy); recorded with the dataset, so the split can be reproduced")

    @model_validator(mode="after")
    def _holdout(self) -> DatasetMetadata:
        if self.holdout_seed is not None and self.holdout_fraction is None:
            raise ValueError("holdout_seed is given only with holdout_fraction")
        return self

    @model_validator(mode="after")
    def _class_sizes(self) -> DatasetMetadata:
        if self.class_sizes is None:
            return self
        if self.visibility != "private":
            raise ValueError("class_sizes are declared for private datasets only")
        if self.label_domain is not None and set(self.class_sizes) != set(self.label_domain):
            raise ValueError("class_sizes must give a size for every class of label_domain, "
                             "and only for those")
        if any(n < 1 for n in self.class_sizes.values()):
            raise ValueError("every class size must be at least 1")
        return self

    @model_validator(mode="after")
    def _private_needs_budget(self) -> DatasetMetadata:
        if self.visibility == "private":
            if self.epsilon_limit is None and self.on_overlap != "link":
                raise ValueError("a private dataset needs an epsilon_limit")
            if self.label_domain is None:
                raise ValueError("a private dataset needs a label_domain (the public list "
                                 "of class names)")
        elif self.epsilon_limit is not None or self.delta is not None:
            raise ValueError("a public dataset has no privacy budget (epsilon_limit, delta)")
        elif self.on_overlap != "refuse":
            raise ValueError("on_overlap applies to private uploads only (a public upload "
                             "sharing records with private data is always refused)")
        if self.label_domain is not None and len(set(self.label_domain)) != len(self.label_domain):
            raise ValueError("label_domain has duplicate class names")
        return self


class DatasetOut(BaseModel):
    dataset_id: str
    tenant_id: str
    name: str
    visibility: Literal["public", "private"]
    declared_size: int
    true_size: int | None = Field(None, description="owner scope only")
    class_counts: dict[str, int] | None = Field(None, description="owner scope only")
    class_names: list[str]
    image_shape: list[int]
    has_masks: bool = Field(False, description="one layout mask per image (DP-DocLDM); a "
                            "private dataset's masks are private and share its budget")
    delta: float | None = None
    epsilon_limit: float | None = None
    neighbouring: Neighbouring | None = None
    class_sizes: dict[str, int] | None = Field(None, description="public per-class sizes "
                                               "(per-label training): declared at upload or "
                                               "released by a charged DP histogram")
    class_sizes_source: Literal["declared", "dp_histogram"] | None = None
    declared_public_by: str | None = Field(None, description="audit: the key that declared "
                                           "the data public")
    budget_id: str | None = Field(None, description="the ledger budget this private dataset "
                                  "charges (its own id, or the dataset it derives from or is "
                                  "linked to)")
    parent_id: str | None = None
    derivation: dict[str, Any] | None = Field(None, description="how the dataset was derived "
                                              "(subset, split, link); None for an upload")
    deleted_at: datetime | None = Field(None, description="the data was deleted; the budget, "
                                        "its ledger and the record hashes remain")
    privacy_unit: PrivacyUnit | None = None
    subject_count: int | None = Field(None, description="owner scope only: true number of "
                                      "subjects (privacy_unit 'subject')")
    partitions_disjoint: bool | None = Field(None, description="every unit falls in one class "
                                             "(per-label jobs compose in parallel)")
    warning_fraction: float | None = None
    holdout_fraction: float | None = Field(None, description="the share of the upload's "
                                           "units held out at upload (None: none)")
    holdout_seed: int | None = Field(None, description="the held-out split's seed")
    holdout_size: int | None = Field(None, description="owner scope only: the number of "
                                     "held-out images (excluded from true_size)")
    source_format: str
    sha256: str
    size_bytes: int
    created_at: datetime


class DatasetPage(BaseModel):
    items: list[DatasetOut]
    next_cursor: str | None = None


def dataset_out(dataset: object, *, owner: bool) -> DatasetOut:
    """The public view of a dataset row; the true count and class counts only for owners."""
    from dpsynth_api.tables import Dataset

    assert isinstance(dataset, Dataset)
    return DatasetOut(
        dataset_id=dataset.id, tenant_id=dataset.tenant_id, name=dataset.name,
        visibility=dataset.visibility,
        declared_size=dataset.declared_size,
        true_size=dataset.true_size if owner else None,
        class_counts=dataset.class_counts if owner else None,
        class_names=dataset.class_names, image_shape=dataset.image_shape,
        has_masks=bool(dataset.has_masks), delta=dataset.delta,
        epsilon_limit=dataset.epsilon_limit,
        neighbouring=Neighbouring(dataset.neighbouring) if dataset.neighbouring else None,
        class_sizes=dataset.class_sizes,
        class_sizes_source=dataset.class_sizes_source,
        declared_public_by=dataset.declared_public_by,
        budget_id=dataset.budget_id, parent_id=dataset.parent_id,
        derivation=dataset.derivation, deleted_at=dataset.deleted_at,
        privacy_unit=PrivacyUnit(dataset.privacy_unit) if dataset.privacy_unit else None,
        subject_count=dataset.subject_count if owner else None,
        partitions_disjoint=dataset.partitions_disjoint,
        warning_fraction=dataset.warning_fraction,
        holdout_fraction=dataset.holdout_fraction, holdout_seed=dataset.holdout_seed,
        holdout_size=dataset.holdout_size if owner else None,
        source_format=dataset.source_format,
        sha256=dataset.sha256, size_bytes=dataset.size_bytes, created_at=dataset.created_at)


class ClassSizesReleaseIn(BaseModel):
    """``POST /v1/datasets/{id}/class-sizes/release``: release the class sizes through a
    Gaussian histogram charged to the dataset's budget."""

    model_config = ConfigDict(extra="forbid")

    target_epsilon: float = Field(gt=0, le=100, description="the release's standalone epsilon "
                                  "at the dataset's delta")
    dry_run: bool = Field(False, description="show sigma and the budget impact; charge nothing")


class ClassSizesReleaseOut(BaseModel):
    dataset_id: str
    dry_run: bool
    charged: bool = Field(description="the histogram's RDP was charged to every partition")
    release_id: str | None = None
    class_sizes: dict[str, int] | None = Field(
        None, description="the released public sizes max(1, ceil(count + N(0, sigma^2))), "
        "at most declared_size; None for a dry run")
    class_sizes_source: Literal["dp_histogram"] | None = None
    target_epsilon: float
    epsilon: float = Field(description="the release's standalone PLD epsilon at delta")
    sigma: float = Field(description="noise std added to each class count")
    sensitivity: float = Field(description="L2 sensitivity of the histogram")
    delta: float
    admission_order: int
    rdp_charge: float = Field(description="RDP at the order charged to every partition")
    admissible: bool
    dataset_epsilon_spent_before: float
    dataset_epsilon_spent_after: float
    dataset_epsilon_remaining_after: float


class DeriveIn(BaseModel):
    """``POST /v1/datasets/{id}/derive``: a selection over the parent's records.

    ``subset`` keeps the records of ``classes``; ``split`` draws a random partition of the
    parent's records (a permutation from OS entropy, data-independent) and keeps the
    ``train`` part (a ``fraction`` of them) or the ``holdout`` part (the rest). A private
    child charges its parent's budget; no data is copied.
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    kind: Literal["subset", "split"]
    classes: list[str] | None = Field(None, min_length=1, max_length=100_000,
                                      description="subset: the class names kept")
    fraction: float | None = Field(None, gt=0, lt=1, description="split: the train part's "
                                   "share of the parent's records")
    part: Literal["train", "holdout"] | None = Field(None, description="split: which part")
    declared_size: int | None = Field(
        None, ge=1, description="the child's public size N̂ (at least its true count); "
        "default: a public bound computed from the parent's public sizes (split: "
        "ceil(fraction·N̂) for train, N̂ - floor(fraction·N̂) for holdout; subset: the sum "
        "of the parent's class sizes of the classes kept, else N̂)")

    @model_validator(mode="after")
    def _shape(self) -> DeriveIn:
        if self.kind == "subset":
            if self.classes is None or self.fraction is not None or self.part is not None:
                raise ValueError("a subset names its classes (and no fraction or part)")
            if len(set(self.classes)) != len(self.classes):
                raise ValueError("classes has duplicate names")
        elif self.fraction is None or self.part is None or self.classes is not None:
            raise ValueError("a split gives a fraction and a part (and no classes)")
        return self
