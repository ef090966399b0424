"""Admitting a ``dp_train`` job (issue 20): direct DP training of a downstream model on a
PRIVATE dataset, reserved and charged exactly like a whole-dataset finetune (one DP-SGD
run: q = expected_batch_size / N̂, steps from the epochs and N̂, the dataset's delta; the
dataset's privacy unit decides record- or subject-level). The model it registers carries
``model_kind: classifier``: it is no diffusion model, so it can be neither a finetune's base
nor a generate job's model (:func:`refuse_non_diffusion`).
"""

from __future__ import annotations

from dpsynth_shared.dp_train_specs import DpTrainSpec
from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.job_specs import steps_for
from dpsynth_shared.ledger_contract import ReserveRequest
from dpsynth_shared.plan_limits import check_plan_size

from dpsynth_api.datasets.derive import check_not_deleted
from dpsynth_api.datasets.service import get_dataset
from dpsynth_api.jobs.kinds.base import Admission, AdmitContext, budget_terms, require_visibility

CLASSIFIER = "classifier"
"""``Model.info["model_kind"]`` of a model a dp_train job produced."""

_PRIVATE_ONLY = ("dp_train jobs train with differential privacy on PRIVATE datasets; a "
                 "public dataset needs no DP (train on it without a budget)")


def admit(ctx: AdmitContext, spec: DpTrainSpec) -> Admission:
    """The private dataset and the reservation of one DP-SGD run.

    Raises:
        DpsynthError: 404, 410 ``dataset_deleted``, 422 ``visibility_mismatch`` /
            ``invalid_spec``, and the plan-size refusals of
            :func:`~dpsynth_shared.plan_limits.check_plan_size`.
    """
    dataset = get_dataset(ctx.session, principal=ctx.principal, dataset_id=spec.dataset_id)
    check_not_deleted(dataset)
    require_visibility(dataset, "private", "dp_train", _PRIVATE_ONLY)
    batch = spec.training.expected_batch_size
    if batch > dataset.declared_size:
        raise DpsynthError(ErrorCode.INVALID_SPEC,
                           f"expected_batch_size {batch} exceeds the dataset's declared size "
                           f"N̂ = {dataset.declared_size} (the sample rate q = batch / N̂ "
                           "must be at most 1)", declared_size=dataset.declared_size)
    budget_id, population = budget_terms(dataset)
    steps = steps_for(epochs=spec.training.epochs, expected_batch_size=batch,
                      declared_size=dataset.declared_size)
    reserve = ReserveRequest(job_id=ctx.job_id, dataset_id=budget_id,
                             target_epsilon=spec.privacy.target_epsilon,
                             expected_batch_size=batch, steps=steps,
                             population_size=population)
    check_plan_size(reserve, ctx.limits)  # the ledger's bounds (api setting), refused early
    return Admission(dataset=dataset, steps=steps, reserve=reserve)
