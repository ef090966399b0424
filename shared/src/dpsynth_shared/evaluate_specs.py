"""The specs of the evaluation job kinds: ``feature_net`` (a public feature network) and
``evaluate`` (a synthetic corpus against real reference data, optionally with a DP release).
Part of the job-spec union (:data:`dpsynth_shared.job_specs.JobSpec`, which re-exports them).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dpsynth_shared.spec_base import SpecBase
from dpsynth_shared.text import MAX_INT32, MIN_EPSILON


class FeatureNetSpec(SpecBase):
    """Non-private training of a feature network (a small CNN classifier) on a PUBLIC
    dataset, for the feature-space Fréchet distance and k-NN metrics of evaluate jobs.

    Its accuracy is measured on the dataset's held-out records (its ``holdout_fraction`` at
    upload) or, without one, on a seeded ``validation_fraction`` of its records that the
    network never trains on; the model records the accuracy, the validation size and the
    sha256 of its weights. Evaluations refuse a network below their accuracy check.
    """

    type: Literal["feature_net"] = "feature_net"
    dataset_id: str
    image_size: int = Field(32, ge=8, le=128, description="images are resized to this")
    channels: Literal[1, 3] = 1
    epochs: int = Field(10, ge=1, le=1000)
    batch_size: int = Field(128, ge=1, le=4096)
    learning_rate: float = Field(1e-3, gt=0, le=1)
    validation_fraction: float = Field(
        0.2, gt=0, lt=1, description="used only when the dataset has no held-out records")
    seed: int = Field(0, ge=0, le=MAX_INT32)

    @model_validator(mode="after")
    def _size(self) -> FeatureNetSpec:
        if self.image_size % 4:
            raise ValueError("image_size must be a multiple of 4")
        return self


ClassifierKind = Literal["cnn", "logreg", "mlp"]


def _default_classifiers() -> list[ClassifierKind]:
    return ["cnn", "logreg"]


class DpEvaluationSpec(BaseModel):
    """The DP part of an evaluate job (docs/privacy.md, "DP evaluations: selection inside the
    guarantee"): each classifier's TSTR accuracy on ALL the held-out records, released as
    (correct count + N(0, σ²)) / N̂_h with N̂_h a PUBLIC held-out size, σ calibrated by the
    ledger for ``target_epsilon`` (sensitivity √(number of classifiers)) and charged to the
    budget's held-out partition, which composes in parallel with training."""

    model_config = ConfigDict(extra="forbid")

    target_epsilon: float = Field(ge=MIN_EPSILON, le=100, description="the release's standalone "
                                  "epsilon at the dataset's delta")


class EvaluateSpec(SpecBase):
    """Compare a synthetic corpus with real reference data (docs/evaluation.md).

    The reference is a dataset with held-out records (``holdout_fraction`` at upload): its
    held-out records are the real test data, its training records the real training data.
    On a PRIVATE reference the evaluation reads private data outside any DP mechanism: it
    needs the owner scope, charges no epsilon but is recorded in the ledger's chain as a
    non-DP read, its report is owner-only and labelled non-DP, and every corpus released
    afterwards from that budget lists it in its manifest.

    Classifier hyperparameters are fixed in the code (docs/evaluation.md), never chosen here,
    so they can never be tuned on the test data.
    """

    type: Literal["evaluate"] = "evaluate"
    corpus_artifact_id: str = Field(description="a corpus artifact of a generate job")
    dataset_id: str = Field(description="the reference dataset (must have held-out records)")
    feature_model_id: str | None = Field(
        None, description="a feature network (a feature_net job's model) for the Fréchet "
        "distance, precision/recall, density/coverage and feature-space memorisation; "
        "without one those metrics are not computed")
    min_feature_accuracy: float = Field(
        0.5, gt=0, le=1, description="the feature network's accuracy on its public "
        "validation data, re-measured by the job, must reach max(this, 2 / classes)")
    classifiers: list[ClassifierKind] = Field(
        default_factory=_default_classifiers, min_length=1, max_length=3,
        description="downstream classifiers trained on synthetic and on real training data, "
        "tested on the real held-out data")
    inception: bool = Field(
        False, description="also compute Inception FID; needs the pytorch-fid InceptionV3 "
        "weights file configured on the worker (DPSYNTH_WORKER_INCEPTION_WEIGHTS)")
    prdc_k: int = Field(5, ge=1, le=100, description="k of the k-NN manifolds")
    max_images: int = Field(5000, ge=10, le=100_000, description="per set (synthetic, real "
                            "train, real held-out): a seeded subsample above this")
    include_private_images: bool = Field(
        True, description="private reference: show real images in the report (closest "
        "synthetic/real pairs, real sample grid); the report is owner-only either way")
    seed: int = Field(0, ge=0, le=MAX_INT32)
    dp: DpEvaluationSpec | None = Field(
        None, description="also release each classifier's TSTR accuracy on the held-out "
        "records with calibrated Gaussian noise, charged to the budget's held-out partition "
        "and shown to the job's readers (private, non-derived reference only); selecting a "
        "corpus by these numbers stays inside the guarantee, unlike the non-DP report")

    @model_validator(mode="after")
    def _distinct(self) -> EvaluateSpec:
        if len(set(self.classifiers)) != len(self.classifiers):
            raise ValueError("classifiers has duplicates")
        return self
