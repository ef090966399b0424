"""Non-private pretraining on a public dataset: VAE first, then the latent UNet.

This follows the latent diffusion recipe (Rombach et al. 2022) that DP-LDMs starts from:
the autoencoder is trained for reconstruction with a small KL term, latents are rescaled to
unit variance (scaling factor = 1 / std), then a class-conditional UNet is trained with
label dropout so that classifier-free guidance has a null class.

The architecture is a preset (tiny, small, base) or a custom diffusers config checked
against the platform's allow-list (:func:`dpsynth_ml.models.architectures.plan_model`). With
``layout_conditioning`` (DP-DocLDM), the dataset's masks are encoded by the trained, frozen
VAE and concatenated to every noisy latent the UNet sees.

A pixel-space pretrain (``spec.space == "pixel"``) has no autoencoder phase: the UNet is
trained on the images in [-1, 1] (scaling factor 1), and layout masks are concatenated as
preprocessed pixels (:mod:`dpsynth_ml.models.codec`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from diffusers.models.autoencoders.autoencoder_kl import AutoencoderKL

from dpsynth_ml.data import images_to_tensor, load_dataset, training_view
from dpsynth_ml.models.architectures import (
    ConditionalDenoiser,
    ModelBundle,
    build_bundle,
    plan_model,
)
from dpsynth_ml.models.codec import encode_with
from dpsynth_ml.models.model_io import save_model
from dpsynth_ml.spec import (
    MODEL_FORMAT_VERSION,
    InvalidSpecError,
    ModelInfo,
    PretrainTraining,
    RngKind,
    TrainingResult,
)
from dpsynth_ml.training.diffusion import drop_labels, per_sample_diffusion_loss
from dpsynth_ml.training.hooks import TrainingHooks

#: KL weight: small, so the VAE behaves like a regularised autoencoder (LDM "KL-reg").
KL_WEIGHT = 1e-4


class _Progress:
    """Counts optimisation steps over both phases and forwards them to the hooks."""

    def __init__(self, hooks: TrainingHooks, total: int) -> None:
        self.hooks, self.total, self.done = hooks, total, 0

    def tick(self) -> bool:
        """Count one step; return True if the platform asked to stop."""
        self.done += 1
        self.hooks.on_progress(self.done, self.total)
        return self.hooks.should_stop()


def _batches(n: int, batch_size: int, epochs: int, g: torch.Generator) -> Iterator[torch.Tensor]:
    for _ in range(epochs):
        perm = torch.randperm(n, generator=g)
        yield from torch.split(perm, batch_size)


def run_pretrain(spec: PretrainTraining, *, dataset_path: Path, out_dir: Path,
                 hooks: TrainingHooks, rng: RngKind) -> TrainingResult:
    """Pretrain VAE + UNet on a public dataset; see :func:`dpsynth_ml.train`."""
    # target "masks": a layout generator, trained on the masks in place of the images
    dataset = training_view(load_dataset(dataset_path), spec.target)
    if len(dataset.class_names) != spec.num_classes:
        raise InvalidSpecError("num_classes must equal the dataset's number of classes")
    if spec.layout_conditioning and dataset.masks is None:
        raise InvalidSpecError("layout_conditioning needs a dataset with layout masks")
    plan = plan_model(spec)
    g = torch.Generator().manual_seed(spec.seed)
    torch.manual_seed(spec.seed)  # module initialisation draws from the global generator
    bundle = build_bundle(plan, num_classes=spec.num_classes)
    x = images_to_tensor(dataset.images, image_size=spec.image_size, channels=spec.channels)
    labels = torch.from_numpy(dataset.labels)
    per_epoch = -(-len(dataset) // spec.batch_size)
    progress = _Progress(hooks, per_epoch * (plan.vae_epochs + spec.epochs))
    stopped, scale = False, 1.0  # pixel space: no autoencoder, the images are the input
    if bundle.vae is not None:
        stopped = _train_vae(bundle.vae, x, spec, plan.vae_epochs, plan.vae_learning_rate,
                             g, progress)
        scale = _latent_scaling(bundle.vae, x)
    layouts = None
    if spec.layout_conditioning and not stopped and dataset.masks is not None:
        # DP-DocLDM: the masks are encoded by the same (now frozen) autoencoder.
        layouts = encode_with(bundle.vae, dataset.masks, image_size=spec.image_size,
                              channels=spec.channels, scaling_factor=scale)
    if not stopped:
        stopped = _train_unet(bundle, x, labels, scale, spec, g, progress, layouts)
    info = ModelInfo(format_version=MODEL_FORMAT_VERSION, preset=spec.preset,
                     image_size=spec.image_size, channels=spec.channels,
                     latent_channels=plan.latent_channels, vae_scaling_factor=scale,
                     num_classes=spec.num_classes, class_names=dataset.class_names,
                     null_class=spec.num_classes, rng=rng, training_kind="pretrain",
                     steps=progress.done, space=plan.space,
                     extra={"class_conditional": spec.class_conditional, "seed": spec.seed,
                            "unet_class": plan.unet_class,
                            "layout_channels": plan.layout_channels,
                            "trainable_parameters": bundle.parameter_count(),
                            **({"target": "masks"} if spec.target == "masks" else {})})
    model_dir = save_model(bundle, info, Path(out_dir) / "model")
    return TrainingResult(steps_completed=progress.done, stopped_early=stopped,
                          model_dir=model_dir, trainable_parameters=bundle.parameter_count(),
                          total_parameters=bundle.parameter_count(), rng=rng)


def _train_vae(vae: AutoencoderKL, x: torch.Tensor, spec: PretrainTraining, epochs: int,
               lr: float, g: torch.Generator, progress: _Progress) -> bool:
    """Reconstruction MSE + KL_WEIGHT * KL; returns True if stopped early."""
    vae = vae.train()
    opt = torch.optim.AdamW(vae.parameters(), lr=lr)
    for idx in _batches(len(x), spec.batch_size, epochs, g):
        posterior = vae.encode(x[idx]).latent_dist
        recon = vae.decode(posterior.sample(generator=g)).sample
        loss = F.mse_loss(recon, x[idx]) + KL_WEIGHT * posterior.kl().mean() / x[idx][0].numel()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if progress.tick():
            return True
    vae.eval().requires_grad_(False)
    return False


def _latent_scaling(vae: AutoencoderKL, x: torch.Tensor) -> float:
    """1 / std of the latents, so the diffusion sees unit-variance inputs (LDM §4.3.2)."""
    with torch.no_grad():
        latents = torch.cat([vae.encode(c).latent_dist.mean for c in torch.split(x, 256)])
    return float(1.0 / latents.std().clamp_min(1e-6))


def _train_unet(bundle: ModelBundle, x: torch.Tensor, labels: torch.Tensor, scale: float,
                spec: PretrainTraining, g: torch.Generator, progress: _Progress,
                layouts: torch.Tensor | None = None) -> bool:
    """Class-conditional epsilon-prediction training; returns True if stopped early.

    ``layouts`` (encoded masks, one per image) condition every prediction when given. A
    pixel-space model (no VAE) trains on ``x`` itself (``scale`` is 1).
    """
    latents = x
    if bundle.vae is not None:
        bundle.vae.eval().requires_grad_(False)
        with torch.no_grad():
            latents = torch.cat([bundle.vae.encode(c).latent_dist.mean
                                 for c in torch.split(x, 256)])
        latents = latents * scale
    if not spec.class_conditional:
        labels = torch.full_like(labels, spec.num_classes)  # everything is the null class
    denoiser = ConditionalDenoiser(bundle.unet, bundle.class_embedder).train()
    opt = torch.optim.AdamW(denoiser.parameters(), lr=spec.learning_rate)
    for idx in _batches(len(latents), spec.batch_size, spec.epochs, g):
        batch_labels = drop_labels(labels[idx], probability=spec.label_dropout,
                                   null_class=spec.num_classes, generator=g)
        loss = per_sample_diffusion_loss(
            denoiser, bundle.scheduler, latents[idx], batch_labels, g,
            layout=None if layouts is None else layouts[idx],
            timesteps=spec.timestep_distribution).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]  # torch's Tensor.backward
        opt.step()
        if progress.tick():
            return True
    denoiser.eval()
    return False
