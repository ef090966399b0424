"""What a model is conditioned on, read from its stored info (never from its weights)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dpsynth_shared.errors import DpsynthError, ErrorCode

from dpsynth_api.tables import Dataset, Model


def layout_channels(info: Mapping[str, Any]) -> int:
    """The number of layout channels a model's denoiser takes (0: no layout conditioning).

    Read from, in order: ``layout_channels`` (the api's stored info), ``extra.layout_channels``
    (``dpsynth_model.json`` as the ML core writes it), and ``layout_conditioning: true`` (a
    pretrain job's metadata; counted as one channel when the number is not given).
    """
    value = info.get("layout_channels")
    extra = info.get("extra")
    if value is None and isinstance(extra, Mapping):
        value = extra.get("layout_channels")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return 1 if info.get("layout_conditioning") is True else 0


def model_target(info: Mapping[str, Any]) -> str:
    """What a model generates: "images", or "masks" for a layout generator.

    Read from ``target`` (the api's stored info, and a training job's metadata), else
    ``extra.target`` (``dpsynth_model.json`` as the ML core writes it); "images" when unset.
    """
    value = info.get("target")
    extra = info.get("extra")
    if value is None and isinstance(extra, Mapping):
        value = extra.get("target")
    return "masks" if value == "masks" else "images"


def check_layout_generator(model: Model, trained_on: Dataset | None) -> None:
    """Refuse a model as a source of layout masks unless its masks may be released.

    A layout generator is a model trained with ``target: masks`` that is either DP-trained
    (its training was charged to the dataset's budget; sampling it is post-processing) or
    trained without private data (pretrained on a PUBLIC dataset, or uploaded). A model
    trained on private data without DP would leak its records and is refused (no job makes
    one today; the check stays).

    Args:
        model: the tenant's model named by ``layout_source.model_id``.
        trained_on: the dataset the model was trained on (``model.dataset_id``), if any.

    Raises:
        DpsynthError: 422 ``invalid_spec`` for a model that is not a layout generator; 409
            ``not_publishable`` for a test-rng model; 422 ``private_conditioning_refused``
            for a model trained on private data without DP.
    """
    if model_target(model.info or {}) != "masks":
        raise DpsynthError(
            ErrorCode.INVALID_SPEC,
            f"model {model.id} is not a layout generator: layout_source.model_id takes a "
            "model trained with target 'masks' (a pretrain on public masks, or a DP "
            "finetune on a dataset's masks)", model_id=model.id)
    if model.rng == "test":
        raise DpsynthError(ErrorCode.NOT_PUBLISHABLE,
                           f"layout model {model.id} was trained with a test random "
                           "generator (rng: test); its masks can never be published",
                           model_id=model.id)
    if model.dp or model.dataset_id is None:
        return
    if trained_on is None or trained_on.visibility != "public":
        raise DpsynthError(
            ErrorCode.PRIVATE_CONDITIONING_REFUSED,
            f"layout model {model.id} was trained on private data without differential "
            "privacy: its masks could copy private records, so no charge could cover them",
            model_id=model.id, dataset_id=model.dataset_id)
