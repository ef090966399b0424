"""Admitting an ``evaluate`` job (issue 5, item 2).

An evaluate job compares a corpus artifact of the tenant (404 otherwise) with a reference
dataset's held-out records (422 ``no_holdout`` without them; 410 when deleted), optionally
through a feature network of the tenant (``kinds/feature_net.py``). On a PRIVATE reference
it reads private data outside any DP mechanism: it needs the ``owner`` scope (403), the
ledger records the read (``POST /v1/evaluations``: an ``evaluation_authorised`` entry, no
epsilon charged) before the job exists, its report is owner-only and labelled non-DP, and
every later release of a corpus of the same budget lists it in its manifest
(``artifacts/releases.py``).

It is refused (409 ``holdout_trained_on``) when the reference's held-out records were
trained on by the corpus's model or its lineage (``jobs/eval_overlap.py``; issue 15, item
8); where that cannot be decided, the privacy block's ``holdout_overlap`` carries the caveat
for the report's headline.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

from dpsynth_shared.errors import DpsynthError, ErrorCode, NotFound
from dpsynth_shared.evaluation import SELECTION_CAVEAT
from dpsynth_shared.job_specs import EvaluateSpec, public_holdout_size
from dpsynth_shared.job_types import JobType
from dpsynth_shared.release_contract import EvaluationRequest
from sqlalchemy.orm import Session

from dpsynth_api.datasets.derive import check_not_deleted, selection_of
from dpsynth_api.datasets.service import get_dataset
from dpsynth_api.jobs.eval_overlap import HoldoutCheck, check_holdout_not_trained_on
from dpsynth_api.jobs.kinds.base import Admission, AdmitContext, budget_terms
from dpsynth_api.jobs.kinds.feature_net import is_feature_net
from dpsynth_api.models.service import get_model
from dpsynth_api.ports import LedgerPort
from dpsynth_api.tables import Artifact, Dataset, Job, Model
from dpsynth_api.tenants.security import Principal, Scope


def admit(ctx: AdmitContext, spec: EvaluateSpec) -> Admission:
    """The reference dataset of an evaluate job, its privacy block, and, on submission, the
    ledger's record of the read (:func:`authorise`).

    Raises:
        DpsynthError: the refusals of :func:`resolve_evaluate`.
    """
    reference, _, _, check = resolve_evaluate(ctx.session, ctx.principal, spec)
    return Admission(dataset=reference,
                     plan=evaluation_privacy(reference, None, spec, check=check),
                     authorise=partial(authorise, principal=ctx.principal, dataset=reference,
                                       job_id=ctx.job_id, spec=spec, check=check))


def authorise(ledger: LedgerPort, *, principal: Principal, dataset: Dataset, job_id: str,
              spec: EvaluateSpec, check: HoldoutCheck | None) -> dict[str, Any]:
    """An evaluate job's privacy block; on a PRIVATE reference the ledger first records the
    non-DP read (before the job row exists: a read is never unrecorded, at worst an
    authorisation is recorded for a job that never ran)."""
    evaluation_id = None
    if dataset.visibility == "private":
        budget_id, _ = budget_terms(dataset)
        evaluation = ledger.authorise_evaluation(EvaluationRequest(
            dataset_id=budget_id, job_id=job_id, reference_dataset_id=dataset.id,
            requested_by=principal.key_id))
        evaluation_id = evaluation.evaluation_id
    return evaluation_privacy(dataset, evaluation_id, spec, check=check)


def corpus_artifact(session: Session, *, tenant_id: str, artifact_id: str) -> Artifact:
    """The tenant's corpus artifact (404 for anything else, other tenants' ids included)."""
    artifact = session.get(Artifact, artifact_id)
    if artifact is None or artifact.tenant_id != tenant_id or artifact.kind != "corpus":
        raise NotFound("corpus artifact", artifact_id)
    return artifact


def feature_model(session: Session, principal: Principal, model_id: str) -> Model:
    """The tenant's feature network (404 for another tenant's id; 422 for another kind).

    Only a model registered by one of the tenant's feature_net jobs qualifies: an uploaded
    model or a diffusion model can never stand in for it.
    """
    model = get_model(session, principal=principal, model_id=model_id)
    producer = session.get(Job, model.produced_by_job_id) if model.produced_by_job_id else None
    if not is_feature_net(model) or producer is None or producer.type != JobType.FEATURE_NET:
        raise DpsynthError(ErrorCode.INVALID_SPEC,
                           f"model {model.id} is not a feature network: feature_model_id takes "
                           "the model of a feature_net job", model_id=model.id)
    return model


def feature_dataset(session: Session, model: Model) -> Dataset:
    """The PUBLIC dataset a feature network was trained on (its validation data).

    Raises:
        DpsynthError: 410 ``dataset_deleted``; 422 ``invalid_spec`` when it is not public.
    """
    dataset = session.get(Dataset, model.dataset_id) if model.dataset_id else None
    if dataset is None or dataset.tenant_id != model.tenant_id:
        raise DpsynthError(ErrorCode.INVALID_SPEC, f"feature network {model.id} names no "
                           "dataset of yours", model_id=model.id)
    check_not_deleted(dataset)
    if dataset.visibility != "public":
        raise DpsynthError(ErrorCode.INVALID_SPEC, f"feature network {model.id} was not "
                           "trained on a public dataset", model_id=model.id)
    return dataset


def resolve_evaluate(session: Session, principal: Principal,
                     spec: EvaluateSpec
                     ) -> tuple[Dataset, Artifact, Model | None, HoldoutCheck]:
    """The reference dataset, the corpus, the feature network of an evaluate job, and the
    check that the reference's held-out records were not trained on (for its privacy block).

    Raises:
        DpsynthError: 404 (unknown ids or another tenant's), 410 ``dataset_deleted``, 422
            ``no_holdout`` / ``invalid_spec``, 403 ``forbidden`` (private reference without
            the owner scope), 409 ``holdout_trained_on`` (the reference's
            held-out records were trained on by the corpus's model lineage).
    """
    artifact = corpus_artifact(session, tenant_id=principal.tenant_id,
                               artifact_id=spec.corpus_artifact_id)
    dataset = get_dataset(session, principal=principal, dataset_id=spec.dataset_id)
    check_not_deleted(dataset)
    if not dataset.holdout_object_key:
        raise DpsynthError(ErrorCode.NO_HOLDOUT,
                           f"dataset {dataset.id} has no held-out records: upload the "
                           "reference data with holdout_fraction (derived datasets have no "
                           "held-out part of their own)", dataset_id=dataset.id)
    if dataset.visibility == "private" and not principal.has(Scope.OWNER):
        raise DpsynthError(ErrorCode.FORBIDDEN,
                           f"dataset {dataset.id} is private: evaluating against it reads its "
                           "records outside any DP mechanism, which only the data's owner "
                           "may do; the 'owner' scope is required", required_scope="owner")
    check = check_holdout_not_trained_on(session, reference=dataset, artifact=artifact,
                                         owner=principal.has(Scope.OWNER))
    if spec.dp is not None:
        check_dp_reference(dataset)
    model = None
    if spec.feature_model_id is not None:
        model = feature_model(session, principal, spec.feature_model_id)
        feature_dataset(session, model)
    return dataset, artifact, model, check


def check_dp_reference(dataset: Dataset) -> None:
    """A DP evaluation needs a private, non-derived, image-unit reference whose held-out part
    has a public size N̂_h (its declared N̂ and holdout_fraction).

    Raises:
        DpsynthError: 422 ``invalid_spec`` naming why (nothing about the data).
    """
    why = None
    if dataset.visibility != "private":
        why = "the reference is public: its numbers need no DP (leave dp out)"
    elif dataset.parent_id is not None or selection_of(dataset) is not None:
        why = ("the reference is a derived dataset: a DP evaluation reads the held-out part of "
               "an upload; evaluate against the upload itself")
    elif dataset.privacy_unit == "subject":
        why = ("the reference's privacy unit is the subject: one subject moves as many "
               "held-out counts as it has images, so the count sensitivity is not 1; DP "
               "evaluations are offered for image-unit datasets")
    elif dataset.holdout_rule == "folder_split_v1":
        why = ("the reference's held-out part is a split folder (holdout_from), which has no "
               "public size; a DP evaluation needs one: upload with holdout_fraction instead")
    elif not dataset.holdout_fraction or not dataset.declared_size:
        why = "the reference has no public held-out size (declared N̂ and holdout_fraction)"
    if why is not None:
        raise DpsynthError(ErrorCode.INVALID_SPEC, f"dp evaluation refused: {why}",
                           dataset_id=dataset.id)


def dp_plan(dataset: Dataset, spec: EvaluateSpec) -> dict[str, Any] | None:
    """The DP part of an evaluate job's privacy block (None without ``spec.dp``): what will
    be released, normalised by which PUBLIC held-out size, and where it is charged. σ is
    calibrated and the charge admitted by the ledger when the worker releases (committed at
    once, like the class-size histogram), after the counts are computed and before any noise
    is drawn."""
    if spec.dp is None:
        return None
    holdout_size = public_holdout_size(declared_size=int(dataset.declared_size),
                                       holdout_fraction=float(dataset.holdout_fraction or 0))
    metrics = [f"tstr_accuracy/{kind}" for kind in spec.classifiers]
    return {
        "target_epsilon": spec.dp.target_epsilon, "metrics": metrics,
        "holdout_size": holdout_size, "sensitivity": math.sqrt(len(metrics)),
        "partition": "*holdout", "budget_id": dataset.budget_id or dataset.id,
        "released_to": "the job's readers",
        "notes": [
            "each classifier is trained on the synthetic corpus only; its number of correctly "
            "classified held-out records moves by at most 1 when one held-out record is added "
            f"or removed, so the {len(metrics)} counts have L2 sensitivity "
            f"√{len(metrics)}",
            f"released: (count + N(0, σ²)) / N̂_h with N̂_h = {holdout_size}, a public size "
            "(declared N̂ · f / (1 − f)), never the true held-out count",
            "charged to the budget's held-out partition, which composes in parallel with "
            "training (the split is 1-stable: the two parts are disjoint); the ledger "
            "calibrates σ and admits the release through the filter when the job releases",
        ],
    }


def evaluation_privacy(dataset: Dataset, evaluation_id: str | None, spec: EvaluateSpec, *,
                       check: HoldoutCheck | None = None) -> dict[str, Any]:
    """The privacy block of an evaluate job (shown by ``dry_run`` and on the job); ``dp``
    is the DP release's plan for an evaluate spec with ``dp``; ``check`` the held-out check
    :func:`resolve_evaluate` made (its caveat leads the notes and the report)."""
    private = dataset.visibility == "private"
    block: dict[str, Any] = {
        "dp": dp_plan(dataset, spec),
        "epsilon_charged": 0.0,
        "non_dp_read": private,
        "reference_visibility": dataset.visibility,
        "budget_id": (dataset.budget_id or dataset.id) if private else None,
        "evaluation_id": evaluation_id,
        "report_access": "owner_only" if private else "tenant",
        "notes": ([
            "no epsilon is charged: the evaluation is not differentially private",
            "it reads the private training and held-out records outside any DP mechanism; "
            "the ledger records the read (evaluation_authorised, then evaluation_read)",
            "its report is owner-only and labelled non-DP, and is never bundled with a corpus",
            "every corpus of this budget released afterwards lists this evaluation in its "
            "manifest (non_dp_evaluations)",
            SELECTION_CAVEAT,
        ] if private else [
            "no epsilon is charged and no private data is read: the reference is public",
        ]),
    }
    if check is not None:
        # the check made at resolution (resolve_evaluate): its caveat leads the notes
        block["holdout_overlap"] = check.block()
        if check.caveat():
            block["notes"].insert(0, check.caveat())
    return block
