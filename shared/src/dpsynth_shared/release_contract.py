"""Request and response bodies of the ledger's one-shot releases and evaluation reads.

Part of the ledger's HTTP contract (:mod:`dpsynth_shared.ledger_contract` re-exports every
name, so either import works): the Gaussian count that may set a private dataset's public
size N̂ (issue 13, item 2), the class-size histogram, the non-DP evaluation reads and the DP
evaluation releases charged to the held-out partition (issue 13, item 6). Each release is
one Gaussian mechanism the ledger calibrates and charges before the caller draws the noise
(docs/privacy.md).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from dpsynth_shared.dp_events import DpSgdEvent, GaussianEvent, Neighbouring
from dpsynth_shared.text import MIN_EPSILON, ContractBody

MIN_DELTA = 1e-30
MAX_DELTA = 0.5
"""The δ a budget may have (issue 14, item 4). Beyond 0.5 a "guarantee" means nothing (a
mechanism publishing a random half of the records is (0, 0.5)-DP) and δ → 1 made a one-shot
calibration run for minutes; 1e-30 is far below any δ a dataset needs (δ < 1/N̂, N̂ ≤ 10^9),
and a subnormal δ (5e-324) reaches no accountant. Every existing use (1e-10 ... 0.3, and
δ < 1/N̂) lies inside."""


class _Body(ContractBody):
    """A body of this contract (dpsynth_shared.text.ContractBody)."""


class SizeRelease(_Body):
    """A charged DP count that set ``declared_size`` (the api drew the noise)."""

    release_id: str
    target_epsilon: float = Field(ge=MIN_EPSILON, le=100)
    sigma: float = Field(gt=0, description="noise std of the count (sensitivity 1)")
    margin_z: float = Field(ge=0, description="N̂ = ceil(N + Z + margin_z·σ)")
    failure_probability: float = Field(ge=0, le=1, description="P[N̂ < N] = Φ(−margin_z)")


class SizeReleasePlanRequest(_Body):
    """Calibrate the Gaussian count of a dataset's size before its budget exists."""

    epsilon_limit: float = Field(ge=MIN_EPSILON, le=100)
    delta: float = Field(ge=MIN_DELTA, le=MAX_DELTA,
                         description="declared or fixed; never from the count")
    neighbouring: Neighbouring = Neighbouring.ADD_REMOVE
    target_epsilon: float = Field(ge=MIN_EPSILON, le=100, description="the count's standalone "
                                  "epsilon at delta (add/remove: sensitivity 1)")


class SizeReleasePlan(BaseModel):
    """σ of the count N + N(0, σ²) and what it would charge a fresh budget."""

    event: GaussianEvent
    target_epsilon: float
    epsilon: float = Field(description="the release's standalone PLD epsilon at delta")
    delta: float
    admission_order: int
    rdp_charge: float = Field(description="RDP at the order added to every partition")
    rdp_budget: float
    admissible: bool = Field(description="the charge fits the budget of epsilon_limit")
    dataset_epsilon_spent_after: float
    accountant: str


class HistogramRequest(_Body):
    """Release the dataset's class sizes through a Gaussian histogram, charged to its budget."""

    target_epsilon: float = Field(ge=MIN_EPSILON, le=100, description="the release's standalone "
                                  "epsilon at the dataset's delta (add/remove)")
    dry_run: bool = False


class HistogramRelease(BaseModel):
    """The calibrated release: σ, its charge to every partition, the budget before/after.

    Every record falls in exactly one class, so the histogram (one count per declared label,
    L2 sensitivity 1 under add/remove) is ONE Gaussian mechanism of noise std σ; each
    partition (``"*"`` and every label) is charged its full RDP α*/(2σ²) once.
    """

    release_id: str | None = Field(None, description="None for a dry run")
    dataset_id: str
    event: GaussianEvent
    target_epsilon: float
    epsilon: float = Field(description="the release's standalone PLD epsilon at delta")
    delta: float
    admission_order: int
    rdp_charge: float = Field(description="RDP at the order added to each partition")
    partitions: list[str]
    dataset_epsilon_spent_before: float
    dataset_epsilon_spent_after: float
    dataset_epsilon_remaining_after: float
    admissible: bool
    charged: bool
    accountant: str


class SetClassSizes(_Body):
    """Public class sizes set after upload, from a charged histogram release."""

    class_sizes: dict[str, int]
    source: Literal["dp_histogram"] = "dp_histogram"
    release_id: str = Field(description="the histogram release they post-process")


class EvaluationRequest(_Body):
    """api → ledger, at the submission of an evaluate job on a PRIVATE reference: authorise
    one non-DP read of the budget's data (no epsilon is charged; the read is recorded)."""

    dataset_id: str = Field(description="the budget (the reference dataset's budget_id)")
    job_id: str
    reference_dataset_id: str = Field(description="the dataset the job evaluates against")
    requested_by: str = Field(description="the api key id (owner scope) that submitted it")
    purpose: Literal["evaluate"] = "evaluate"


class Evaluation(BaseModel):
    """A non-DP evaluation read authorised on a budget; ``touched_at`` once a worker took
    its read grant. Each authorisation and each grant is a chained ledger entry
    (``evaluation_authorised``, ``evaluation_read``) with no charge."""

    evaluation_id: str
    dataset_id: str
    job_id: str
    reference_dataset_id: str
    requested_by: str
    purpose: str
    created_at: datetime
    touched_at: datetime | None = None
    grants: int = 0


class EvaluationGrantRequest(_Body):
    attempt: int = Field(ge=1)
    worker_id: str


class DpEvaluationRequest(_Body):
    """worker → ledger: charge one DP evaluation release to the budget's HELD-OUT partition.

    The released numbers are ``len(metrics)`` counts of correctly classified held-out records
    (one per downstream classifier trained on the synthetic corpus only); adding or removing
    one held-out record moves each count by at most 1, so the vector's L2 sensitivity is
    √len(metrics) (the same under replace-one). The ledger calibrates σ for
    ``target_epsilon`` at the dataset's δ and charges only the held-out partition (docs/
    privacy.md, "DP evaluations").
    """

    job_id: str
    attempt: int = Field(ge=1)
    target_epsilon: float = Field(ge=MIN_EPSILON, le=100, description="the release's standalone "
                                  "epsilon at the dataset's delta")
    metrics: list[str] = Field(min_length=1, max_length=3, description="the released "
                               "numbers, e.g. ['tstr_accuracy/cnn']")
    holdout_size: int = Field(ge=1, description="the PUBLIC held-out size N̂_h that "
                              "normalises the counts (never the true held-out count)")
    dry_run: bool = False


class DpEvaluationRelease(BaseModel):
    """A calibrated DP evaluation release: σ of the Gaussian added to each count, and the
    charge to the held-out partition (the training partitions are untouched)."""

    release_id: str | None = Field(None, description="None for a dry run")
    evaluation_id: str
    dataset_id: str
    job_id: str
    event: GaussianEvent
    metrics: list[str]
    holdout_size: int
    target_epsilon: float
    epsilon: float = Field(description="the release's standalone PLD epsilon at delta")
    delta: float
    admission_order: int
    rdp_charge: float = Field(description="RDP at the order added to the held-out partition")
    partition: str = Field(description="the held-out partition's name")
    dataset_epsilon_spent_before: float
    dataset_epsilon_spent_after: float
    admissible: bool
    charged: bool
    accountant: str


class CentralImagesTerms(_Body):
    """The public terms of a finetune's DP central-image release (DP-FETA warm-up): what the
    ledger calibrates and charges it from. A job's reservation request carries them so that
    its plan composes the release with the DP-SGD part (:class:`CentralImagesRequest` adds
    the job and attempt that charge it)."""

    target_epsilon: float = Field(ge=MIN_EPSILON, le=100, description="the release's "
                                  "standalone epsilon at the dataset's delta")
    image_size: int = Field(ge=1, le=4096, description="side of the model's images")
    channels: int = Field(ge=1, le=4)
    downsample: int = Field(ge=1, le=8)
    sample_rate: float | None = Field(None, gt=0, lt=1, description="None: one query over "
                                      "every unit; else Poisson-subsampled queries")
    queries: int = Field(1, ge=1, le=64)
    second_moments: bool = Field(False, description="the release also carries each class's "
                                 "second moments (sensitivity x sqrt(2))")


class CentralImagesRequest(CentralImagesTerms):
    """worker → ledger: charge a finetune's DP central-image release (DP-FETA warm-up) to the
    budget of the job's reservation, before the worker draws the noise.

    The ledger computes the public bound from the image shape
    (:func:`dpsynth_shared.central_images.central_image_bound`), calibrates the noise for
    ``target_epsilon`` at the dataset's δ and charges every partition once (docs/privacy.md,
    "Central images"). Each accepted call is a new charge (a retried attempt pays again).
    """

    job_id: str
    attempt: int = Field(ge=1)
    dry_run: bool = False


class CentralImagesCharge(BaseModel):
    """The central-image release a job's plan composes with its DP-SGD part (calibrated as
    the worker's release will be; charged only when the job starts, as its own event)."""

    event: DpSgdEvent | GaussianEvent = Field(discriminator="kind")
    bound: float = Field(description="public L2 bound of one unit's centred contribution")
    noise_std: float
    epsilon: float = Field(description="the release's standalone PLD epsilon at delta")
    rdp_charge: float = Field(description="RDP at the order it adds to each partition")
    partitions: list[str]


class CentralImagesRelease(BaseModel):
    """A calibrated central-image release and its charge to every partition of the budget."""

    release_id: str | None = Field(None, description="None for a dry run")
    reservation_id: str
    dataset_id: str
    job_id: str
    event: DpSgdEvent | GaussianEvent = Field(
        discriminator="kind", description="gaussian: one full-data query (sigma = noise std "
        "on each coordinate of each class sum, sensitivity under the dataset's relation); "
        "dp_sgd: `queries` subsampled queries (noise std = noise_multiplier x bound, x sqrt(2) "
        "with second moments)")
    bound: float = Field(description="public L2 bound of one unit's centred contribution")
    second_moments: bool = Field(False, description="whether the release carries the class "
                                 "second moments (scaled by 1/bound) beside the class sums")
    noise_std: float = Field(description="std of the Gaussian noise the worker adds to each "
                             "coordinate of each class sum (and of each scaled second "
                             "moment)")
    target_epsilon: float
    epsilon: float = Field(description="the release's standalone PLD epsilon at delta")
    delta: float
    admission_order: int
    rdp_charge: float = Field(description="RDP at the order added to each partition")
    partitions: list[str]
    dataset_epsilon_spent_before: float
    dataset_epsilon_spent_after: float
    admissible: bool
    charged: bool
    accountant: str
