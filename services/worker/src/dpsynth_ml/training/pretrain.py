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

Device: ``device`` (the worker's first device, :func:`dpsynth_ml.train_placed`) holds the
models, the training images, their latents and the layouts for the whole run; only the
minibatch indices and the dropped labels come from the host. On CUDA the forward passes run
under ``torch.autocast`` in bfloat16 (:data:`AUTOCAST_DTYPE`): pretraining is public and
non-private, so mixed precision touches no DP arithmetic; the weights, the optimiser and the
latent scaling stay float32. On the CPU nothing changes (no autocast): the same model as ever.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import torch
import torch.nn.functional as F
from diffusers.models.autoencoders.autoencoder_kl import AutoencoderKL
from torch import nn

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

#: Mixed precision of a pretrain on CUDA (public data only; never on a DP path).
AUTOCAST_DTYPE = torch.bfloat16


def autocast_for(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """bf16 autocast on CUDA, nothing elsewhere (the CPU runs stay bit-for-bit as before).

    For non-private training only: the DP finetune never calls this.
    """
    if device.type == "cuda":
        return torch.autocast(device_type="cuda", dtype=AUTOCAST_DTYPE)
    return contextlib.nullcontext()


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
                 hooks: TrainingHooks, rng: RngKind,
                 device: torch.device | str = "cpu") -> TrainingResult:
    """Pretrain VAE + UNet on a public dataset; see :func:`dpsynth_ml.train`. ``device``:
    where the models and data live (see the module docstring)."""
    device = torch.device(device)
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
    _bundle_to(bundle, device)
    x = images_to_tensor(dataset.images, image_size=spec.image_size,
                         channels=spec.channels).to(device)
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
                              channels=spec.channels, scaling_factor=scale).to(device)
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
                            "device": str(device),
                            "autocast": "bfloat16" if device.type == "cuda" else None,
                            **({"target": "masks"} if spec.target == "masks" else {})})
    _bundle_to(bundle, torch.device("cpu"))  # written from the host, as every model is
    model_dir = save_model(bundle, info, Path(out_dir) / "model")
    return TrainingResult(steps_completed=progress.done, stopped_early=stopped,
                          model_dir=model_dir, trainable_parameters=bundle.parameter_count(),
                          total_parameters=bundle.parameter_count(), rng=rng,
                          device=str(device))


def _bundle_to(bundle: ModelBundle, device: torch.device) -> None:
    """Every part of the model on ``device`` (no-op for parts already there)."""
    if bundle.vae is not None:
        _module(bundle.vae).to(device)
    bundle.unet.to(device)
    bundle.class_embedder.to(device)


def _train_vae(vae: AutoencoderKL, x: torch.Tensor, spec: PretrainTraining, epochs: int,
               lr: float, g: torch.Generator, progress: _Progress) -> bool:
    """Reconstruction MSE + KL_WEIGHT * KL; returns True if stopped early."""
    vae = vae.train()
    opt = torch.optim.AdamW(vae.parameters(), lr=lr)
    for idx in _batches(len(x), spec.batch_size, epochs, g):
        batch = x[idx.to(x.device)]
        with autocast_for(x.device):
            posterior = vae.encode(batch).latent_dist
            recon = vae.decode(posterior.sample(generator=g)).sample
            loss = (F.mse_loss(recon.float(), batch)
                    + KL_WEIGHT * posterior.kl().float().mean() / batch[0].numel())
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
    device = latents.device
    for idx in _batches(len(latents), spec.batch_size, spec.epochs, g):
        batch_labels = drop_labels(labels[idx], probability=spec.label_dropout,
                                   null_class=spec.num_classes, generator=g).to(device)
        on_device = idx.to(device)
        with autocast_for(device):
            loss = per_sample_diffusion_loss(
                denoiser, bundle.scheduler, latents[on_device], batch_labels, g,
                layout=None if layouts is None else layouts[on_device],
                timesteps=spec.timestep_distribution).float().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]  # torch's Tensor.backward
        opt.step()
        if progress.tick():
            return True
    denoiser.eval()
    return False


def _module(part: object) -> nn.Module:
    """A diffusers part as the ``nn.Module`` it is (its ``to`` is typed for dtypes only)."""
    return cast("nn.Module", part)
