"""The evaluation report's JSON document (``report.json`` of an evaluate job).

The worker writes it, the api serves it (``GET /v1/jobs/{id}/report``) and the CLI prints
its ``headline``. Every metric carries its name as computed: the Fréchet distance in the
feature space of a dpsynth feature network is ``fd_dpsynth`` and is never called FID; Inception
FID appears only when computed with the pinned InceptionV3 weights.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from dpsynth_shared.audit_specs import AuditSummary

REPORT_VERSION = 1

SELECTION_CAVEAT = (
    "non-DP selection: evaluations on private data that are not DP (non_dp_evaluations, "
    "and every number of a non-DP evaluation report) read the private training and held-out "
    "records outside any DP mechanism; if you chose which corpus or model to release by "
    "looking at them, the released epsilon does not cover that choice. To select inside the "
    "guarantee, compare candidates by DP evaluations (an evaluate job with dp: "
    "{target_epsilon}), whose numbers are charged to the dataset's held-out partition; "
    "choosing among k candidates then costs k DP evaluations, all charged")
"""The statement a corpus manifest, an evaluation report and the docs make about selection
(issue 13, item 6; docs/privacy.md "DP evaluations: selection inside the guarantee")."""



class _Doc(BaseModel):
    model_config = ConfigDict(extra="allow")


class FeatureNetworkCheck(_Doc):
    model_id: str
    architecture: str
    sha256: str = Field(description="sha256 of the network's weights file")
    dataset_id: str = Field(description="the PUBLIC dataset it was trained on")
    accuracy: float = Field(description="re-measured by this job on the public validation "
                            "records")
    recorded_accuracy: float | None = None
    validation_size: int
    threshold: float
    passed: bool


class ClassifierScore(_Doc):
    classifier: str
    train_on: Literal["synthetic", "real"]
    accuracy: float = Field(description="on the real held-out records")
    train_size: int
    test_size: int
    chance: float


class Memorisation(_Doc):
    space: Literal["pixel", "features"]
    synthetic: int
    flagged: int = Field(description="synthetic images much closer to a training image than "
                         "to any held-out one (ratio below threshold), or exact copies")
    threshold: float
    exact_copies: int
    fraction_closer_to_train: float = Field(
        description="share of synthetic images whose nearest training image is nearer than "
        "their nearest held-out image; for samples that behave like fresh real images it is "
        "about the training share N_train / (N_train + N_holdout) (the nearest of all real "
        "images is equally likely to be any of them)")
    median_ratio: float = Field(description="median of d_train / d_holdout")


class Headline(_Doc):
    """The numbers the CLI prints (None when not computed)."""

    tstr_accuracy: dict[str, float] = Field(default_factory=dict, description="classifier "
                                            "trained on synthetic, tested on real held-out")
    real_accuracy: dict[str, float] = Field(default_factory=dict, description="the same "
                                            "classifier trained on the real training data")
    fd_dpsynth: float | None = Field(None, description="Fréchet distance, synthetic vs real "
                                     "held-out, in the feature network's space (not FID)")
    fd_dpsynth_real_train: float | None = Field(
        None, description="the same between real training and real held-out data: the floor "
        "set by sampling noise")
    inception_fid: float | None = None
    precision: float | None = None
    recall: float | None = None
    density: float | None = None
    coverage: float | None = None
    memorisation_flagged: int | None = None
    memorisation_fraction_closer_to_train: float | None = None


class EvaluationReport(_Doc):
    report_version: Literal[1] = 1
    job_id: str
    corpus_artifact_id: str
    generate_job_id: str
    model_id: str | None
    dataset_id: str = Field(description="the reference dataset")
    reference_visibility: Literal["public", "private"]
    non_dp: bool = Field(description="computed from private data outside a DP mechanism")
    contains_private_images: bool
    corpus_manifest: dict[str, Any] = Field(default_factory=dict, description="privacy "
                                            "figures and sampling of the corpus")
    sizes: dict[str, int] = Field(default_factory=dict, description="synthetic, real_train, "
                                  "real_holdout (after the max_images cap)")
    headline: Headline
    classifiers: list[ClassifierScore] = Field(default_factory=list)
    feature_network: FeatureNetworkCheck | None = None
    per_class: dict[str, dict[str, float]] = Field(default_factory=dict, description="per "
                                                   "class: counts, tstr recall, fd_dpsynth")
    memorisation: list[Memorisation] = Field(default_factory=list)
    selection_caveat: str | None = Field(None, description="on a private reference: "
                                         "SELECTION_CAVEAT (selection by these numbers is "
                                         "not covered by the released epsilon)")
    holdout_caveat: str | None = Field(
        None, description="the held-out records could not all be checked against what the "
        "corpus's model lineage trained on (an uploaded model, a split older than issue 13, "
        "or private training data the caller may not see): the numbers may be optimistic")
    dp_evaluation: dict[str, Any] | None = Field(
        None, description="the DP release of the job (evaluate with dp): noisy TSTR "
        "accuracies on the held-out records, ε, δ, σ, N̂_h, charged to the held-out partition")
    audit: AuditSummary | None = Field(
        None, description="the corpus's model is DP: the latest privacy audit of the finetune "
        "that produced it (or of another of its recipe family) when the job was claimed, or "
        "status 'not_audited'; None for a model no finetune produced (and in older reports)")
    notes: list[str] = Field(default_factory=list)
    settings: dict[str, Any] = Field(default_factory=dict, description="the spec and the "
                                     "fixed classifier hyperparameters")
