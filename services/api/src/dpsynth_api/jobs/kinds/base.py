"""What admitting a job of any kind yields, and the admission rules several kinds share.

A kind's ``admit`` resolves the spec's inputs for the submitting tenant, applies the kind's
privacy rules and says what the submission then does (reserve budget, record a read at the
ledger, seed the job's result). It reserves nothing and writes nothing itself: a dry run
admits exactly as a submission does (docs/architecture.md, "Job flow" 1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.ledger_contract import ReserveRequest
from dpsynth_shared.plan_limits import PlanLimits
from sqlalchemy.orm import Session

from dpsynth_api.ports import LedgerPort
from dpsynth_api.tables import Dataset, Job
from dpsynth_api.tenants.security import Principal


@dataclass(frozen=True)
class AdmitContext:
    """What every kind's admission is given besides its spec."""

    session: Session
    principal: Principal
    job_id: str  # the id the job will have (a ledger request names it)
    limits: PlanLimits  # the ledger's bounds on a plan, refused early


@dataclass
class Admission:
    """An admitted spec: the job row's inputs and what submitting it does at the ledger."""

    dataset: Dataset | None = None
    model_id: str | None = None
    steps: int | None = None
    # a DP training's reservation: planned by a dry run, reserved before the row exists
    reserve: ReserveRequest | None = None
    # the privacy block of a job without a reservation that a dry run shows (evaluate)
    plan: dict[str, Any] | None = None
    # records at the ledger what the job will read, before the row exists, and returns the
    # job's privacy block (evaluate); never called by a dry run
    authorise: Callable[[LedgerPort], dict[str, Any]] | None = None
    # what the api records in the new job's result (a worker's result never replaces it)
    result: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # shown by the dry run
    # an identical earlier job to answer with instead of running this one (content-addressed
    # pretraining reuse); nothing is inserted, reserved or sent then
    reuse_of: Job | None = None


Admit = Callable[[AdmitContext, Any], Admission]
"""A kind's admission: ``admit(ctx, spec)``. The spec is the kind's own spec class; the
table (``kinds.ADMISSIONS``) is keyed by the spec's ``type``, which its discriminator fixes,
and a unit test checks every entry's spec annotation against its key."""


def require_visibility(dataset: Dataset, wanted: str, job_type: str, why: str) -> None:
    """Refuse a dataset of the wrong visibility for this kind.

    Raises:
        DpsynthError: 422 ``visibility_mismatch`` saying ``why``.
    """
    if dataset.visibility == wanted:
        return
    raise DpsynthError(ErrorCode.VISIBILITY_MISMATCH,
                       f"dataset {dataset.id} is {dataset.visibility}: {why}",
                       dataset_visibility=dataset.visibility, job_type=job_type)


def require_masks_for_target(dataset: Dataset, target: str) -> None:
    """A layout generator (target 'masks') trains on the dataset's masks: it must have them."""
    if target == "masks" and not dataset.has_masks:
        raise DpsynthError(ErrorCode.INVALID_SPEC,
                           f"target 'masks' trains a layout generator on the dataset's layout "
                           f"masks, and dataset {dataset.id} carries none", dataset_id=dataset.id)


def budget_terms(dataset: Dataset) -> tuple[str, int | None]:
    """The ledger budget a job on ``dataset`` charges and the population it samples from.

    A derived or linked dataset charges its parent's budget (``budget_id``) with its own
    public size N̂ (``population_size``: the ledger sets q = expected_batch_size / N̂ of the
    child); a dataset that owns its budget passes None (the budget's declared size).
    """
    budget_id = dataset.budget_id or dataset.id
    return budget_id, (dataset.declared_size if budget_id != dataset.id else None)
