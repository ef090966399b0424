"""Bodies of the dataset endpoints."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from dpsynth_shared.dp_events import Neighbouring
from dpsynth_shared.ledger_contract import PrivacyUnit
from dpsynth_shared.release_contract import MAX_DELTA, MIN_DELTA
from dpsynth_shared.text import MIN_EPSILON, Name
from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator


class DatasetMetadata(BaseModel):
    """The ``metadata`` form field of an upload (a JSON string)."""

    model_config = ConfigDict(extra="forbid")

    name: Name = Field(min_length=1, max_length=200)
    visibility: Literal["public", "private"]
    epsilon_limit: float | None = Field(None, ge=MIN_EPSILON, le=100)
    delta: float | None = Field(None, ge=MIN_DELTA, le=MAX_DELTA)
    label_domain: list[Name] | None = Field(None, min_length=1, max_length=10_000)
    declared_size: int | None = Field(
        None, ge=1, le=100_000_000, description="the public size N̂ (at most 10^8): an upper "
        "bound on the number of units (images, or subjects), at least the true count; shown "
        "to every reader and setting "
        "every job's sample rate. A private add/remove dataset gives this or size_epsilon "
        "(its true count is never published by default)")
    size_epsilon: float | None = Field(
        None, ge=MIN_EPSILON, le=100, description="private add/remove datasets, instead of "
        "declared_size: N̂ is a DP count of the units, ceil(N + N(0, sigma^2) + 6 sigma) "
        "(below N with probability < 1e-9), charged to the budget at this standalone epsilon "
        "as its first event; delta is then the declared one or 1e-6")
    partitions_disjoint: bool | None = Field(
        None, description="private datasets: every unit (image, or subject) falls in exactly "
        "one class, so per-label jobs compose in parallel; checked at upload, never computed "
        "(default: true for the image unit, false for the subject unit)")
    neighbouring: Neighbouring = Neighbouring.ADD_REMOVE
    class_sizes: dict[Name, int] | None = Field(
        None, description="private datasets, for per-label training: the public size N̂_c of "
        "every class of label_domain, each at least 1, at least the true number of records "
        "of the class and at most the dataset's declared size N̂; they set each class's "
        "sample rate and are shown to everyone who can see the dataset")
    privacy_unit: PrivacyUnit = Field(
        PrivacyUnit.IMAGE, description="private datasets: what one record is. 'subject': "
        "all images of one subject together (user-level DP; declared_size then counts "
        "subjects); the upload must carry a subject id per image")
    subject_column: Name | None = Field(
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
    on_duplicate: Literal["refuse", "deduplicate"] | None = Field(
        None, description="records with identical pixels inside this upload: 'refuse' (422 "
        "duplicate_records, the default of a private upload: a record uploaded k times is "
        "protected only at group size k) or 'deduplicate' (keep the first copy of each). "
        "Copies with another label, subject or layout mask are refused either way. A public "
        "upload keeps its copies unless this is given")
    holdout_fraction: float | None = Field(
        None, gt=0, le=0.5, description="set aside about this share of the upload's units "
        "(images, or subjects for privacy_unit 'subject') as held-out records: the real test "
        "data of evaluate jobs, never trained on and excluded from the declared size N̂, the "
        "class sizes and every derived dataset. Each unit is held out iff a keyed hash of "
        "its own content (or subject id) falls below the fraction, so adding or removing a "
        "unit moves no other unit (docs/privacy.md); at least one unit on each side")
    holdout_from: Literal["test", "validation"] | None = Field(
        None, description="an image-folder archive with Hugging Face split folders "
        "(train/<label>/…, test/<label>/…): the split whose images are held out, instead of "
        "holdout_fraction. Each image's side is the folder its owner put it in before "
        "uploading (docs/datasets.md); an archive with two or more split folders needs it")
    label_column: Name | None = Field(
        None, min_length=1, max_length=200, description="an image-folder archive labelled "
        "by metadata.csv / metadata.jsonl: the column holding each image's class name "
        "(default 'label'; the file column is 'file_name')")
    holdout_key: SecretStr | None = Field(
        None, min_length=16, max_length=512, description="write-only: the key of the "
        "held-out split's hash (default: drawn from OS entropy). The same key holds out the "
        "same records in every version of a dataset. Used at ingest only: never stored, "
        "never shown")
    holdout_seed: int | None = Field(
        None, description="removed: the held-out split is no longer a seeded permutation; "
        "an upload giving it is refused (use holdout_key)", json_schema_extra={
            "deprecated": True})

    @model_validator(mode="after")
    def _holdout(self) -> DatasetMetadata:
        if self.holdout_seed is not None:
            raise ValueError("holdout_seed is no longer accepted: the held-out split is a "
                             "keyed hash of each unit, not a seeded permutation of the "
                             "upload (docs/privacy.md, 'Held-out and derived splits are "
                             "1-stable'); give holdout_key to hold out the same records "
                             "across versions, or omit it")
        if self.holdout_key is not None and self.holdout_fraction is None:
            raise ValueError("holdout_key is given only with holdout_fraction")
        if self.holdout_from is not None and self.holdout_fraction is not None:
            raise ValueError("give holdout_fraction (a share of the upload, by a keyed hash) "
                             "or holdout_from (a split folder), not both")
        return self

    @model_validator(mode="after")
    def _size(self) -> DatasetMetadata:
        if self.size_epsilon is None:
            return self
        if self.visibility != "private":
            raise ValueError("size_epsilon is for private datasets (a public size is public)")
        if self.declared_size is not None:
            raise ValueError("give declared_size or size_epsilon, not both")
        if self.neighbouring != Neighbouring.ADD_REMOVE:
            raise ValueError("size_epsilon is for add/remove datasets: under replace_one the "
                             "size is public; omit both to publish the true count")
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
        elif self.partitions_disjoint is not None:
            raise ValueError("partitions_disjoint is declared for private datasets only")
        elif self.epsilon_limit is not None or self.delta is not None:
            raise ValueError("a public dataset has no privacy budget (epsilon_limit, delta)")
        elif self.on_overlap != "refuse":
            raise ValueError("on_overlap applies to private uploads only (a public upload "
                             "sharing records with private data is always refused)")
        if self.label_domain is not None and len(set(self.label_domain)) != len(self.label_domain):
            raise ValueError("label_domain has duplicate class names")
        return self


class DatasetSummary(BaseModel):
    """A dataset in ``GET /v1/datasets``: no per-class detail (names, counts, sizes), so a
    page's size does not grow with the number of classes; ``GET /v1/datasets/{id}``
    (``DatasetOut``) has it."""

    dataset_id: str
    tenant_id: str
    name: str
    visibility: Literal["public", "private"]
    declared_size: int
    declared_size_source: Literal["declared", "dp_count", "true_count"] | None = Field(
        None, description="how N̂ was made public: declared by the owner (an upper bound), "
        "a charged DP count (size_release), or the true count (public data; replace-one); "
        "None: a dataset from before this was recorded")
    size_release: dict[str, Any] | None = Field(
        None, description="declared_size_source 'dp_count': the release (release_id, "
        "target_epsilon, epsilon, sigma, margin_z, failure_probability = P[N̂ < N], delta)")
    true_size: int | None = Field(None, description="owner scope only")
    num_classes: int = Field(description="the number of classes (K)")
    image_shape: list[int]
    has_masks: bool = Field(False, description="one layout mask per image (DP-DocLDM); a "
                            "private dataset's masks are private and share its budget")
    delta: float | None = None
    epsilon_limit: float | None = None
    neighbouring: Neighbouring | None = None
    class_sizes_source: Literal["declared", "dp_histogram"] | None = None
    declared_public_by: str | None = Field(None, description="audit: the key that declared "
                                           "the data public")
    budget_id: str | None = Field(None, description="the ledger budget this private dataset "
                                  "charges (its own id, or the dataset it derives from or is "
                                  "linked to)")
    parent_id: str | None = None
    derivation: dict[str, Any] | None = Field(None, description="how the dataset was derived "
                                              "(subset, split, link); None for an upload. "
                                              "The list omits the classes a subset keeps")
    deleted_at: datetime | None = Field(None, description="the data was deleted; the budget, "
                                        "its ledger and the record hashes remain")
    privacy_unit: PrivacyUnit | None = None
    subject_count: int | None = Field(None, description="owner scope only: true number of "
                                      "subjects (privacy_unit 'subject')")
    partitions_disjoint: bool | None = Field(None, description="declared by the owner and "
                                             "checked at upload: every unit falls in one class "
                                             "(per-label jobs compose in parallel)")
    warning_fraction: float | None = None
    holdout_fraction: float | None = Field(None, description="the share of the upload's "
                                           "units held out at upload (None: none)")
    holdout_rule: Literal["keyed_hash_v1", "folder_split_v1", "seeded_permutation_v0"] | None \
        = Field(None, description="how the held-out split was made: 'keyed_hash_v1' (each "
                "unit by a keyed hash of itself: the guarantee covers every record of the "
                "upload), 'folder_split_v1' (the owner's split folder, holdout_from: each "
                "unit by the folder it was uploaded in; no public fraction), or "
                "'seeded_permutation_v0' (before issue 13: the guarantee covers the training "
                "part only, docs/privacy.md)")
    holdout_key_source: Literal["owner", "platform"] | None = Field(
        None, description="whose key made the keyed-hash split: the owner's holdout_key "
        "(never shown) or one drawn by the platform")
    holdout_size: int | None = Field(None, description="owner scope only: the number of "
                                     "held-out images (excluded from true_size)")
    source_format: str
    sha256: str | None = Field(None, description="of the stored canonical file; owner scope "
                               "only for a private dataset (a membership oracle)")
    size_bytes: int | None = Field(None, description="of the stored canonical file; owner "
                                   "scope only for a private dataset (it gives the count)")
    created_at: datetime


class DatasetOut(DatasetSummary):
    """One dataset, with its per-class detail."""

    class_names: list[str]
    class_counts: dict[str, int] | None = Field(None, description="owner scope only")
    class_sizes: dict[str, int] | None = Field(None, description="public per-class sizes "
                                               "(per-label training): declared at upload or "
                                               "released by a charged DP histogram")


class DatasetPage(BaseModel):
    items: list[DatasetSummary] = Field(description="no per-class detail: see "
                                        "GET /v1/datasets/{dataset_id}")
    next_cursor: str | None = None


class HeldOutRecord(BaseModel):
    index: int = Field(description="the record's position in the upload (its canonical "
                       "order: the row of an .npz or Parquet file, the ingest order of an "
                       "image folder; after on_duplicate 'deduplicate', among the copies "
                       "kept)")
    record_hash: str = Field(description="unkeyed sha256 of the record's canonical content "
                             "(dpsynth_shared.record_splits.record_hashes)")


class HoldoutOut(BaseModel):
    """``GET /v1/datasets/{id}/holdout`` (owner scope): the held-out records of an upload,
    so an evaluation can be reproduced outside the platform."""

    items: list[HeldOutRecord]


def dataset_out(dataset: object, *, owner: bool) -> DatasetOut:
    """The public view of a dataset row; the true count and class counts only for owners,
    and, for a private dataset, the stored file's hash and size too (the size of an
    uncompressed npz gives the exact count; the hash is a membership oracle)."""
    from dpsynth_api.tables import Dataset

    assert isinstance(dataset, Dataset)
    return DatasetOut(**_summary_fields(dataset, owner=owner),
                      class_counts=dataset.class_counts if owner else None,
                      class_names=dataset.class_names, class_sizes=dataset.class_sizes)


def dataset_summary(dataset: object, *, owner: bool) -> DatasetSummary:
    """A dataset as ``GET /v1/datasets`` lists it: :func:`dataset_out` without per-class
    detail (class names, counts and sizes, the classes a subset keeps), so its size does
    not grow with the number of classes (issue 14, item 5)."""
    from dpsynth_api.tables import Dataset

    assert isinstance(dataset, Dataset)
    fields = _summary_fields(dataset, owner=owner)
    fields["derivation"] = _without_classes(fields["derivation"])
    return DatasetSummary(**fields)


def _without_classes(view: dict[str, Any] | None) -> dict[str, Any] | None:
    if view is None:
        return None
    view = {k: v for k, v in view.items() if k != "classes"}
    if isinstance(view.get("selection"), dict):
        view["selection"] = {k: v for k, v in view["selection"].items() if k != "classes"}
    return view


def _summary_fields(dataset: Any, *, owner: bool) -> dict[str, Any]:
    from dpsynth_api.datasets.derive import derivation_view

    file_visible = owner or dataset.visibility != "private"
    return dict(
        dataset_id=dataset.id, tenant_id=dataset.tenant_id, name=dataset.name,
        visibility=dataset.visibility,
        declared_size=dataset.declared_size,
        declared_size_source=dataset.declared_size_source,
        size_release=dataset.size_release,
        true_size=dataset.true_size if owner else None,
        num_classes=len(dataset.class_names), image_shape=dataset.image_shape,
        has_masks=bool(dataset.has_masks), delta=dataset.delta,
        epsilon_limit=dataset.epsilon_limit,
        neighbouring=Neighbouring(dataset.neighbouring) if dataset.neighbouring else None,
        class_sizes_source=dataset.class_sizes_source,
        declared_public_by=dataset.declared_public_by,
        budget_id=dataset.budget_id, parent_id=dataset.parent_id,
        derivation=derivation_view(dataset.derivation, owner=owner),
        deleted_at=dataset.deleted_at,
        privacy_unit=PrivacyUnit(dataset.privacy_unit) if dataset.privacy_unit else None,
        subject_count=dataset.subject_count if owner else None,
        partitions_disjoint=dataset.partitions_disjoint,
        warning_fraction=dataset.warning_fraction,
        holdout_fraction=dataset.holdout_fraction, holdout_rule=dataset.holdout_rule,
        holdout_key_source=dataset.holdout_key_source,
        holdout_size=dataset.holdout_size if owner else None,
        source_format=dataset.source_format,
        sha256=dataset.sha256 if file_visible else None,
        size_bytes=dataset.size_bytes if file_visible else None, created_at=dataset.created_at)


class ClassSizesReleaseIn(BaseModel):
    """``POST /v1/datasets/{id}/class-sizes/release``: release the class sizes through a
    Gaussian histogram charged to the dataset's budget."""

    model_config = ConfigDict(extra="forbid")

    target_epsilon: float = Field(ge=MIN_EPSILON, le=100, description="the release's "
                                  "standalone epsilon at the dataset's delta (at least 1e-3)")
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

    ``subset`` keeps the records of ``classes``; ``split`` keeps the records whose keyed
    hash (a key from OS entropy, shared by the two parts of one parent at one fraction)
    falls below ``fraction`` (``train``, about that share) or not (``holdout``): each
    record's side depends on that record alone (docs/privacy.md). A private child charges
    its parent's budget; no data is copied.
    """

    model_config = ConfigDict(extra="forbid")

    name: Name = Field(min_length=1, max_length=200)
    kind: Literal["subset", "split"]
    classes: list[Name] | None = Field(None, min_length=1, max_length=100_000,
                                      description="subset: the class names kept")
    fraction: float | None = Field(None, gt=0, lt=1, description="split: the train part's "
                                   "expected share of the parent's records")
    part: Literal["train", "holdout"] | None = Field(None, description="split: which part")
    declared_size: int | None = Field(
        None, ge=1, le=100_000_000, description="the child's public size N̂ (at least its "
        "true count, at most 10^8); default: a public bound computed from the parent's "
        "public sizes (split: the "
        "parent's N̂, since a keyed-hash part may keep any number of records; subset: the "
        "sum of the parent's class sizes of the classes kept, else N̂). A smaller size is "
        "checked against the true count: owner scope only")

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
