"""The non-private warm-up of the whole denoiser on the released central images.

Post-processing of the DP release (:mod:`dpsynth_ml.warmup.release`): the images are public,
so this is ordinary training (ordinary torch randomness, no clipping, no noise). Every UNet
parameter is trained (LoRA adapters included when injected), and the class embedder when the
finetune trains one; afterwards the parameters' ``requires_grad`` flags are restored (the
DP finetune's trainable selection) and their gradients cleared, so DP-SGD's optimizer and
EMA start from the warmed-up weights. Same objective and noise schedule as the finetune
(:func:`dpsynth_ml.training.diffusion.per_sample_diffusion_loss`), same label dropout, the
images (optionally augmented, :mod:`dpsynth_ml.warmup.augment`) mapped into the model's
space as :mod:`dpsynth_ml.models.codec` maps records (pixels in [-1, 1], or scaled VAE
posterior means). With ``warmup_ema_decay`` the warm-up ends on an exponential moving average
of its weights (decay ramped up as min(decay, (1+t)/(10+t))): on a designer slice of
Fashion-MNIST it lifted the classifier accuracy of a 1,500-step warm-up from 53 % to 61 %.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from dpsynth_ml.models.architectures import ConditionalDenoiser, ModelBundle
from dpsynth_ml.models.codec import check_space, pixels_to_model
from dpsynth_ml.spec import CentralImages, ModelInfo, TimestepDistribution
from dpsynth_ml.training.diffusion import drop_labels, per_sample_diffusion_loss
from dpsynth_ml.warmup.augment import augment as augment_images
from dpsynth_ml.warmup.release import CentralRelease, ReleasedBatches


@torch.no_grad()
def encode_unit_images(bundle: ModelBundle, info: ModelInfo, images: torch.Tensor,
                       device: torch.device) -> torch.Tensor:
    """Float images in [0, 1] [n, c, H, W] in the model's space, on ``device``: pixel space
    ``x·2 − 1``; latent space the VAE's posterior means × the scaling factor (as
    :func:`dpsynth_ml.models.codec.encode_records` does for uint8 records)."""
    check_space(bundle, info)
    x = pixels_to_model(images.to(device))
    if bundle.vae is None:
        return x
    latents: torch.Tensor = bundle.vae.encode(x).latent_dist.mean * info.vae_scaling_factor
    return latents


def warm_up(denoiser: ConditionalDenoiser, bundle: ModelBundle, info: ModelInfo,
            release: CentralRelease, labels: torch.Tensor, spec: CentralImages, *,
            train_embedder: bool, label_dropout: float, device: torch.device,
            generator: torch.Generator,
            timesteps: TimestepDistribution = "uniform") -> list[float]:
    """Train ``denoiser`` (already on ``device``) for ``spec.warmup_steps`` steps.

    Args:
        denoiser: UNet + class embedder of the finetune (before its DP engine is built).
        bundle, info: the model (its VAE encodes a latent model's batches).
        release: the released images (each batch repeats them, or with second moments draws
            fresh images from each class's released Gaussian,
            :func:`~dpsynth_ml.warmup.release.sample_released`), drawn on ``device``
            (:class:`~dpsynth_ml.warmup.release.ReleasedBatches`).
        labels: int64 [n], model class indices of the released entries (the null class for
            an unconditional model).
        spec: steps, batch size, learning rate, augmentation.
        train_embedder: whether the class embedder is trained (as in the finetune).
        label_dropout: the finetune's classifier-free-guidance dropout.
        device: the training device.
        generator: a CPU torch generator (batches, augmentation, diffusion draws).

    Returns:
        The loss of each step (public: computed on released images only).
    """
    size = int(release.images.shape[1])
    embedder = {id(p) for p in bundle.class_embedder.parameters()}
    flags = {name: p.requires_grad for name, p in denoiser.named_parameters()}
    params = []
    for p in denoiser.parameters():
        p.requires_grad_(train_embedder or id(p) not in embedder)
        if p.requires_grad:
            params.append(p)
    vae_device = None
    if bundle.vae is not None:  # encode each batch where the denoiser trains
        vae_device = next(bundle.vae.parameters()).device
        cast("nn.Module", bundle.vae).to(device).eval()
    optimizer = torch.optim.Adam(params, lr=spec.warmup_learning_rate)
    ema = ([p.detach().clone() for p in params] if spec.warmup_ema_decay is not None
           else None)
    null_class = info.null_class
    batches = ReleasedBatches(release, image_size=size, device=device)
    step_losses: list[torch.Tensor] = []  # on the device: no host sync per step
    was_training = denoiser.training
    denoiser.train()
    try:
        for _ in range(spec.warmup_steps):
            idx = torch.randint(0, len(release.labels), (spec.warmup_batch_size,),
                                generator=generator)
            batch = batches(idx, generator)
            if spec.augment:
                batch = augment_images(batch, generator)
            latents = encode_unit_images(bundle, info, batch, device)
            batch_labels = drop_labels(labels[idx], probability=label_dropout,
                                       null_class=null_class, generator=generator)
            loss = per_sample_diffusion_loss(denoiser, bundle.scheduler, latents,
                                             batch_labels.to(device), generator,
                                             timesteps=timesteps).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]  # torch's Tensor.backward
            optimizer.step()
            step_losses.append(loss.detach())
            if ema is not None and spec.warmup_ema_decay is not None:
                done = len(step_losses)
                _ema_update(ema, params, min(spec.warmup_ema_decay,
                                             (1.0 + done) / (10.0 + done)))
        if ema is not None:
            with torch.no_grad():
                for average, p in zip(ema, params, strict=True):
                    p.copy_(average)
    finally:
        for name, p in denoiser.named_parameters():
            p.requires_grad_(flags[name])
            p.grad = None
        if bundle.vae is not None and vae_device is not None:
            cast("nn.Module", bundle.vae).to(vae_device)
        denoiser.train(was_training)
    return torch.stack(step_losses).tolist() if step_losses else []


@torch.no_grad()
def _ema_update(ema: list[torch.Tensor], params: list[nn.Parameter], decay: float) -> None:
    """ema ← decay·ema + (1 − decay)·params."""
    for average, p in zip(ema, params, strict=True):
        average.mul_(decay).add_(p.detach(), alpha=1.0 - decay)
