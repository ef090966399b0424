"""Admitting a ``feature_net`` job, and what a feature network may be used for (issue 5,
item 2).

A feature_net job trains a feature network WITHOUT privacy, so it accepts PUBLIC datasets
only (422 ``visibility_mismatch``); the model it registers carries ``model_kind:
feature_net`` and can be used only as an evaluate job's ``feature_model_id`` (never as a
finetune base or a generate model: :func:`refuse_feature_net`, 422 ``invalid_spec``).
"""

from __future__ import annotations

from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.job_specs import FeatureNetSpec

from dpsynth_api.datasets.derive import check_not_deleted
from dpsynth_api.datasets.service import get_dataset
from dpsynth_api.jobs.kinds.base import Admission, AdmitContext, require_visibility
from dpsynth_api.tables import Model

FEATURE_NET = "feature_net"
"""``Model.info["model_kind"]`` of a feature network (set only from a feature_net job)."""

_PUBLIC_ONLY = ("feature_net jobs train without differential privacy, so they only accept "
                "PUBLIC datasets")


def admit(ctx: AdmitContext, spec: FeatureNetSpec) -> Admission:
    """The public dataset a feature_net job trains on.

    Raises:
        DpsynthError: 404, 410 ``dataset_deleted``, 422 ``visibility_mismatch``.
    """
    dataset = get_dataset(ctx.session, principal=ctx.principal, dataset_id=spec.dataset_id)
    check_not_deleted(dataset)
    require_visibility(dataset, "public", "feature_net", _PUBLIC_ONLY)
    return Admission(dataset=dataset)


def is_feature_net(model: Model) -> bool:
    """Whether a model is a feature network (not a diffusion model)."""
    return (model.info or {}).get("model_kind") == FEATURE_NET


def refuse_feature_net(model: Model, role: str) -> None:
    """A feature network, or a classifier a dp_train job produced, cannot be a diffusion
    model's base or be sampled.

    Raises:
        DpsynthError: 422 ``invalid_spec``.
    """
    if (model.info or {}).get("model_kind") == "classifier":
        raise DpsynthError(ErrorCode.INVALID_SPEC,
                           f"model {model.id} is a classifier (a dp_train job's model), not a "
                           f"diffusion model: it cannot be the {role}", model_id=model.id)
    if is_feature_net(model):
        raise DpsynthError(ErrorCode.INVALID_SPEC,
                           f"model {model.id} is a feature network (a feature_net job's "
                           f"classifier), not a diffusion model: it cannot be the {role}; use "
                           "it as an evaluate job's feature_model_id", model_id=model.id)
