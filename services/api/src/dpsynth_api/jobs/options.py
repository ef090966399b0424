"""Submission-time checks of training options that no schema can express.

They run before any budget is reserved, so a refused option costs nothing.
"""

from __future__ import annotations

from dpsynth_shared.dp_events import Neighbouring
from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.job_specs import FinetuneSpec

from dpsynth_api.tables import Dataset

DP_PROMISE_DOC = "docs/privacy/dp-promise.md"


def check_finetune_options(dataset: Dataset, spec: FinetuneSpec) -> None:
    """Refuse training options the platform cannot account for on this dataset.

    Raises:
        DpsynthError: 422 ``unsupported_neighbouring`` for DP-Promise on an add/remove
            dataset; 422 ``method_not_offered`` for DP-Promise on a replace-one dataset.
    """
    if spec.training.algorithm != "dp_promise":
        return
    relation = Neighbouring(dataset.neighbouring or Neighbouring.ADD_REMOVE)
    if relation == Neighbouring.ADD_REMOVE:
        raise DpsynthError(
            ErrorCode.UNSUPPORTED_NEIGHBOURING,
            "DP-Promise's phase 1 releases one noised latent per record: under add/remove "
            "adjacency that release has no finite epsilon (a record's noised latent is "
            "either there or not), so it is analysed under replace-one only, and group "
            "privacy never converts a replace-one analysis into an add/remove one. This "
            f"dataset is add/remove; see {DP_PROMISE_DOC}",
            dataset_neighbouring=str(relation), algorithm="dp_promise")
    raise DpsynthError(
        ErrorCode.METHOD_NOT_OFFERED,
        "DP-Promise is not offered: its phase 2 (DP-SGD, add/remove) could now enter this "
        "replace-one dataset through the ledger's group privacy, but phase 1 as published is "
        "not accountable (unclipped latents, a training target that depends on the clean "
        "latent, class-conditional release counts); only a corrected variant could be "
        f"offered; see {DP_PROMISE_DOC}",
        dataset_neighbouring=str(relation), algorithm="dp_promise")
