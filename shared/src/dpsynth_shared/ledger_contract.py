"""Request and response bodies of the ledger's HTTP API (``/v1`` of services/ledger).

The api and the workers call the ledger with a service token; these schemas are the
contract between them. Every epsilon figure is labelled by what it means:

* ``job_epsilon``: a job's standalone epsilon at the dataset's delta (tight accountant, PLD);
* ``dataset_epsilon_spent``: the RDP privacy filter's figure (the guarantee under adaptive use);
* ``dataset_tight_epsilon``: PLD epsilon of the realised sequence, NOT a guarantee under
  adaptive use (valid only had the sequence been fixed in advance).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, Field, model_validator

# isort: off
# re-exported: the chain views, the leases and grants, and the GDP envelope live in
# their own modules
from dpsynth_shared.audit_specs import (
    GdpEnvelope as GdpEnvelope, GdpEnvelopeRequest as GdpEnvelopeRequest,
)
from dpsynth_shared.chain_contract import (
    AnchorStatus as AnchorStatus, ApiJobRecord as ApiJobRecord, ChainKey as ChainKey,
    LedgerEntry as LedgerEntry, LimitUpdate as LimitUpdate, RecomputedCharge as
    RecomputedCharge, RecomputeReport as RecomputeReport, ReconcileReport as ReconcileReport,
    ReconcileRequest as ReconcileRequest, VerifyReport as VerifyReport, signed_message as
    signed_message,
)
from dpsynth_shared.lease_contract import (
    CloseRequest as CloseRequest, ExtendRequest as ExtendRequest, Lease as Lease, LeaseRequest
    as LeaseRequest, ReadGrant as ReadGrant, ReadGrantRequest as ReadGrantRequest,
)
# isort: on
from dpsynth_shared.dp_events import DpSgdEvent, Neighbouring, ParallelEvent
from dpsynth_shared.release_contract import (
    MAX_DELTA,
    MIN_DELTA,
    CentralImagesCharge,
    CentralImagesTerms,
    SizeRelease,
)
from dpsynth_shared.text import MAX_DECLARED_SIZE, MAX_INT32, MIN_EPSILON, ContractBody, Name

TIGHT_LABEL = (
    "tight PLD epsilon of the realised sequence, as if it had been fixed in advance; "
    "not a guarantee under adaptive use"
)
LINEAGE_LABEL = (
    "PLD composition of the model's steps and its DP ancestors' on the same budget, as if "
    "the sequence had been fixed in advance; not a guarantee under adaptive use (the "
    "guarantee is dataset_epsilon_spent, the RDP filter's figure)"
)
"""The label of a model's ``job_epsilon`` when it composes DP ancestors (issue 13, item 8):
each ancestor's output was seen before the next job was chosen."""


DEFAULT_WARNING_FRACTION = 0.8


class PrivacyUnit(StrEnum):
    """What one "record" of a private dataset is (docs/privacy.md).

    ``image``: one image (record-level DP). ``subject``: every image of one subject (a
    patient, a customer) together; the dataset trains only with user-level DP-SGD (Poisson
    sampling over subjects, one clipped contribution per subject) and N̂ counts subjects.
    """

    IMAGE = "image"
    SUBJECT = "subject"


class _Body(ContractBody):
    """A body of this contract (dpsynth_shared.text.ContractBody)."""


class CreateBudget(_Body):
    dataset_id: str
    tenant_id: str
    epsilon_limit: float = Field(ge=MIN_EPSILON, le=100)
    delta: float = Field(ge=MIN_DELTA, le=MAX_DELTA)
    declared_size: int = Field(ge=1, le=MAX_DECLARED_SIZE)
    neighbouring: Neighbouring = Neighbouring.ADD_REMOVE
    partitions: list[Name] = Field(default_factory=list, description="declared label domain")
    class_sizes: dict[str, int] | None = Field(
        None, description="public per-class sizes N̂_c declared by the owner (per-label "
        "training): one per declared label, each in [1, declared_size]")
    privacy_unit: PrivacyUnit = PrivacyUnit.IMAGE
    partitions_disjoint: bool = Field(
        True, description="every unit falls in exactly one declared label, so per-label jobs "
        "compose in parallel over the labels; False (a subject with images in two classes): "
        "a per-label job's classes are summed (sequential composition)")
    warning_fraction: float = Field(DEFAULT_WARNING_FRACTION, gt=0, le=1,
                                    description="warn when spent >= this fraction of the limit")
    size_release: SizeRelease | None = Field(
        None, description="declared_size is a charged DP count (issue 13, item 2): the ledger "
        "charges the Gaussian count to every partition as the budget's first DP event; None: "
        "declared by the owner (or public under replace-one)")
    declared_size_source: Literal["declared", "dp_count", "true_count"] | None = Field(
        None, description="how N̂ was made public: an owner's upper bound, a charged DP count "
        "(with size_release), or the true count (replace-one only, where it is public); "
        "default: dp_count with a size_release, else declared")

    @model_validator(mode="after")
    def _source_matches_release(self) -> CreateBudget:
        if self.declared_size_source is None:
            self.declared_size_source = "dp_count" if self.size_release else "declared"
        if (self.declared_size_source == "dp_count") != (self.size_release is not None):
            raise ValueError("declared_size_source 'dp_count' goes with a size_release, and "
                             "only with it")
        if (self.declared_size_source == "true_count"
                and self.neighbouring != Neighbouring.REPLACE_ONE):
            raise ValueError("only a replace-one dataset may publish its true count")
        return self


class Charge(BaseModel):
    """One line of a dataset's charge history (from the hash-chained entries)."""

    seq: int
    at: datetime
    kind: str
    job_id: str | None = None
    reservation_id: str | None = None
    steps: int | None = None
    rdp_delta: float = 0.0
    dataset_epsilon_spent_after: float | None = None
    dataset_tight_epsilon_after: float | None = None


class BudgetView(BaseModel):
    dataset_id: str
    tenant_id: str
    epsilon_limit: float
    delta: float
    neighbouring: Neighbouring
    declared_size: int
    admission_order: int
    accountant: str
    rdp_budget: float
    rdp_spent: float = Field(description="max over partitions of committed RDP at the order")
    rdp_reserved: float
    dataset_epsilon_spent: float
    dataset_epsilon_reserved: float = Field(
        description="filter figure of spent + open reservations, minus spent")
    dataset_epsilon_remaining: float
    dataset_tight_epsilon: float | None = Field(
        None, description="tight PLD epsilon of the first dataset_tight_epsilon_as_of "
        "charging events, computed in the background (None: not computed yet)")
    dataset_tight_epsilon_as_of: int | None = Field(
        None, description="how many of the dataset's charging events (leases granted, "
        "releases) dataset_tight_epsilon includes (None: not computed yet)")
    dataset_tight_epsilon_pending: bool = Field(
        False, description="the dataset has charging events the tight figure does not "
        "include yet (the background computation is behind)")
    dataset_tight_epsilon_label: str = TIGHT_LABEL
    partitions: dict[str, float] = Field(default_factory=dict,
                                         description="committed RDP per partition")
    class_sizes: dict[str, int] | None = Field(
        None, description="public per-class sizes N̂_c (None: not declared)")
    privacy_unit: PrivacyUnit = PrivacyUnit.IMAGE
    partitions_disjoint: bool = True
    epsilon_limit_initial: float | None = Field(
        None, description="the limit set at creation (a limit is only ever lowered; the "
        "admission order was chosen from this one)")
    warning_fraction: float = DEFAULT_WARNING_FRACTION
    warning: bool = Field(False, description="dataset_epsilon_spent >= warning_fraction * "
                          "epsilon_limit")
    partition_epsilon_spent: dict[str, float] = Field(
        default_factory=dict, description="filter epsilon of each partition's committed RDP "
        "(per-label datasets: one per label, and '*')")
    history: list[Charge] = Field(default_factory=list)


class LabelShape(_Body):
    """One class's DP-SGD run in a per-label job: q_c = expected_batch_size / N̂_c."""

    expected_batch_size: int = Field(ge=1, le=MAX_INT32,
                                     description="mean Poisson batch of the class")
    steps: int = Field(ge=1, description="logical steps of the class's model, from 0")


class _Shape(_Body):
    """A job's shape: one whole-dataset run, or one run per class (``per_label``)."""

    expected_batch_size: int | None = Field(None, ge=1, le=MAX_INT32,
                                            description="whole-dataset job")
    steps: int | None = Field(None, ge=1, description="whole-dataset job")
    per_label: dict[str, LabelShape] | None = Field(
        None, min_length=1, description="per-label job (parallel composition over the "
        "declared labels): class name -> its run; each class's noise is calibrated so that "
        "its model alone meets target_epsilon")

    @model_validator(mode="after")
    def _one_shape(self) -> _Shape:
        whole = self.expected_batch_size is not None and self.steps is not None
        partial = (self.expected_batch_size is None) != (self.steps is None)
        if partial or whole == (self.per_label is not None):
            raise ValueError("give either expected_batch_size and steps (whole-dataset job) "
                             "or per_label (one run per class), not both")
        return self


_RELATION = ("the neighbouring relation the job's mechanism is analysed under (DP-SGD with "
             "Poisson sampling: add_remove). An add_remove job enters a replace_one dataset "
             "through group privacy at distance 2 (Mironov 2017, Prop. 2); a replace_one job "
             "never enters an add_remove dataset (422 unsupported_neighbouring)")


_POPULATION = ("public size N̂ of the dataset the job reads when it is not the budget's own "
               "upload but a dataset derived from or linked to it (it sets q = "
               "expected_batch_size / N̂); None: the budget's declared_size")


_CENTRAL = ("a whole-dataset finetune's DP central-image release (training.central_images): "
            "the plan composes it with the DP-SGD part (dataset_epsilon_spent_after, the "
            "tight figure and admissible count both) and the admission refuses the job when "
            "both do not fit now. The reservation holds the DP-SGD part only: the release is "
            "charged as its own event when the job starts, and refused then if it no longer "
            "fits")


class PlanRequest(_Shape):
    dataset_id: str
    target_epsilon: float = Field(ge=MIN_EPSILON, le=100)
    population_size: int | None = Field(None, ge=1, le=MAX_DECLARED_SIZE,
                                        description=_POPULATION)
    neighbouring: Neighbouring = Field(Neighbouring.ADD_REMOVE, description=_RELATION)
    central_images: CentralImagesTerms | None = Field(None, description=_CENTRAL)


class LabelPlan(BaseModel):
    """The calibrated run of one class of a per-label job."""

    event: DpSgdEvent
    expected_batch_size: int
    class_size: int = Field(description="the public N̂_c that sets q_c")
    job_epsilon: float = Field(description="standalone epsilon of this class's model")
    rdp_per_step: float
    rdp_total: float


class Plan(BaseModel):
    """A calibrated DP-SGD job: what it would be and what it would cost."""

    dataset_id: str
    event: DpSgdEvent | ParallelEvent = Field(
        discriminator="kind", description="DP-SGD (whole dataset) or, per label, a parallel "
        "event of the classes' DP-SGD runs")
    expected_batch_size: int | None = Field(description="None for a per-label job")
    job_epsilon: float = Field(description="standalone epsilon; per label: max over classes")
    delta: float
    admission_order: int
    rdp_per_step: float | None = Field(description="None for a per-label job")
    rdp_total: float = Field(description="RDP the job adds at the order to each partition it "
                             "touches; per label: the max over classes")
    dataset_epsilon_spent_before: float
    dataset_epsilon_spent_after: float
    dataset_tight_epsilon_after: float | None = Field(
        None, description="tight figure of the realised sequence plus this job (dry runs and "
        "plans only, and only while the composition stays within the ledger's bound; never "
        "computed for an admission)")
    dataset_tight_epsilon_label: str = TIGHT_LABEL
    admissible: bool
    max_admissible_target_epsilon: float | None = Field(
        description="largest target_epsilon of this shape (q, steps) the filter would admit now; "
        "None when even a tiny one would not fit, and in the plan of an accepted "
        "reservation (computed for plans, dry runs and refusals only)")
    accountant: str
    per_label: dict[str, LabelPlan] | None = Field(None, description="per-label job: each "
                                                   "class's calibrated run")
    composition: Literal["single", "parallel", "sequential"] = Field(
        "single", description="how the job's runs enter the budget: one whole-dataset run; "
        "per label, in parallel over disjoint labels (max); or summed over labels when the "
        "labels are not disjoint in the privacy unit (a subject in two classes)")
    notes: list[str] = Field(default_factory=list, description="what the plan assumed, in "
                             "words (group privacy, sequential per-label composition, ...)")
    central_images: CentralImagesCharge | None = Field(
        None, description="the central-image release the job makes before DP-SGD, composed "
        "into dataset_epsilon_spent_after, dataset_tight_epsilon_after and admissible "
        "(job_epsilon, rdp_total and max_admissible_target_epsilon stay the DP-SGD part's; "
        "the largest target is the one that fits beside the release)")


class ReserveRequest(_Shape):
    job_id: str
    dataset_id: str
    target_epsilon: float = Field(ge=MIN_EPSILON, le=100)
    dry_run: bool = False
    population_size: int | None = Field(None, ge=1, le=MAX_DECLARED_SIZE,
                                        description=_POPULATION)
    neighbouring: Neighbouring = Field(Neighbouring.ADD_REMOVE, description=_RELATION)
    central_images: CentralImagesTerms | None = Field(None, description=_CENTRAL)


class ReservationState(StrEnum):
    OPEN = "open"          # admitted, no private data read yet
    TOUCHED = "touched"    # a read grant was issued
    CLOSED = "closed"      # committed / released


class LabelReservation(BaseModel):
    """One class's part of a per-label reservation (steps counted per class, from 0)."""

    event: DpSgdEvent = Field(description="the class's mechanism (steps = steps reserved)")
    expected_batch_size: int
    class_size: int
    steps_planned: int = Field(description="steps admitted with the job (before extensions)")
    steps_reserved: int
    steps_granted: int
    job_epsilon: float
    job_epsilon_granted: float


class Reservation(BaseModel):
    reservation_id: str
    job_id: str
    dataset_id: str
    state: ReservationState
    event: DpSgdEvent | ParallelEvent = Field(
        discriminator="kind", description="the reserved mechanism (steps = steps reserved); "
        "a parallel event over the classes for a per-label job")
    expected_batch_size: int | None = Field(description="None for a per-label job")
    steps_planned: int | None = Field(None, description="the job's training length as "
                                      "admitted, before extensions (per label: see per_label)")
    steps_reserved: int = Field(description="per label: summed over classes")
    steps_granted: int = Field(description="per label: summed over classes")
    current_attempt: int
    job_epsilon: float = Field(description="standalone epsilon of the reserved steps "
                               "(per label: max over classes)")
    job_epsilon_granted: float = Field(description="standalone epsilon of the granted steps "
                                       "(per label: max over classes)")
    per_label: dict[str, LabelReservation] | None = None
    plan: Plan | None = None


class JobEpsilonRequest(_Body):
    """The reservations whose steps produced a model (itself and its DP ancestors), and the
    central-image releases on its path (a DP warm-up before DP-SGD)."""

    dataset_id: str
    reservation_ids: list[str] = Field(min_length=1)
    steps_used: dict[str, int | dict[str, int]] | None = Field(
        None, description="per reservation id, the steps on the model's own path (per label: "
        "per class) when fewer than granted: after a crash, the replayed steps of the lost "
        "attempt are charged but did not produce the model; each ≤ the granted steps; "
        "absent ids count all their granted steps")
    release_ids: list[str] = Field(
        default_factory=list, description="further central-image releases (release_id of "
        "POST /v1/reservations/{id}/central-images) on the model's path; every release "
        "charged under one of reservation_ids is composed anyway. Their events compose with "
        "the reservations' steps; each must be a charged release of dataset_id")


class JobEpsilon(BaseModel):
    """Tight (PLD) epsilon of the composition of the steps that produced a model."""

    dataset_id: str
    reservation_ids: list[str]
    job_epsilon: float = Field(description="per label: max over classes")
    delta: float
    steps_granted: int
    steps_used: int = Field(0, description="steps composed into job_epsilon (summed)")
    accountant: str
    per_label: dict[str, float] | None = Field(
        None, description="per-label reservations among them: each class model's epsilon "
        "(its class's granted steps composed with the other reservations)")
