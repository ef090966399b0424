"""A freshly initialised pixel-space model: the base of a finetune with no public pretraining.

DP-FETA's route needs no public data: the denoiser starts from its initialisation, is warmed
up on the DP central images of the private set (``FinetuneTraining.central_images``) and then
DP-fine-tuned. The initial weights are drawn from a seeded generator and depend on nothing
but the architecture, the class names and the seed, all public. Only pixel-space models
can start this way: a latent model's autoencoder must have been trained (on public data)
before any latent means anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from dpsynth_ml.models.architectures import build_bundle, plan_model
from dpsynth_ml.models.model_io import save_model
from dpsynth_ml.spec import MODEL_FORMAT_VERSION, InvalidSpecError, ModelInfo, PretrainTraining


def initial_model(spec: PretrainTraining, class_names: Sequence[str], out_dir: Path) -> Path:
    """Write an untrained pixel-space model for ``class_names`` under ``out_dir / "model"``.

    ``spec`` gives the architecture (preset or custom), image size, channels, conditioning
    and seed; its epochs, batch size and learning rate are not used (nothing is trained).
    The model's info says ``steps`` 0 and ``extra.initialised_only`` true.

    Raises:
        InvalidSpecError: a latent-space spec, layout conditioning or masks as target, or
            ``num_classes`` different from the number of class names.
    """
    if spec.space != "pixel":
        raise InvalidSpecError("only a pixel-space model can start untrained: a latent "
                               "model's autoencoder must be pretrained on public data")
    if spec.layout_conditioning or spec.target != "images":
        raise InvalidSpecError("an initialised-only model is an image model without layout "
                               "conditioning")
    names = tuple(str(n) for n in class_names)
    if len(names) != spec.num_classes or len(set(names)) != len(names):
        raise InvalidSpecError("num_classes must equal the number of distinct class names")
    plan = plan_model(spec)
    torch.manual_seed(spec.seed)  # module initialisation draws from the global generator
    bundle = build_bundle(plan, num_classes=spec.num_classes)
    info = ModelInfo(format_version=MODEL_FORMAT_VERSION, preset=spec.preset,
                     image_size=spec.image_size, channels=spec.channels,
                     latent_channels=plan.latent_channels, vae_scaling_factor=1.0,
                     num_classes=spec.num_classes, class_names=names,
                     null_class=spec.num_classes, rng="os", training_kind="pretrain",
                     steps=0, space="pixel",
                     extra={"class_conditional": spec.class_conditional, "seed": spec.seed,
                            "unet_class": plan.unet_class, "layout_channels": 0,
                            "trainable_parameters": bundle.parameter_count(),
                            "initialised_only": True})
    return save_model(bundle, info, Path(out_dir) / "model")
