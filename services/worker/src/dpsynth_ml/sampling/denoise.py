"""The denoising core shared by image and layout-mask sampling.

Loading a model's denoiser per class (one shared denoiser, or one per class of a per-label
bundle), the per-image random streams (each image's generator is a function of the seed, its
class and its index only, see :mod:`dpsynth_ml.sampling.generate`), the sampler factory
(``ddpm``, ``ddim``, ``dpm_solver++`` schedulers built from the model's own scheduler
config) and the classifier-free-guided denoising loop that decodes samples to uint8 pixels.

Device: the model, the initial latents, the per-image generators (so the DDPM noise of every
step) and the guidance all live on one device (``device``, "cpu" by default); only the
decoded uint8 pixels come back to the host, once per batch. On the CPU the draws are the
ones they always were; on a GPU each image's generator is a CUDA generator seeded with the
same per-image seed, so a GPU corpus is reproducible on GPUs but differs from the CPU one.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from diffusers.schedulers.scheduling_ddim import DDIMScheduler
from diffusers.schedulers.scheduling_ddpm import DDPMScheduler
from diffusers.schedulers.scheduling_dpmsolver_multistep import DPMSolverMultistepScheduler
from torch import nn

from dpsynth_ml.models.architectures import ConditionalDenoiser, ModelBundle
from dpsynth_ml.models.codec import decode_samples
from dpsynth_ml.models.model_io import load_model, load_per_label_denoisers
from dpsynth_ml.spec import InvalidSpecError, ModelInfo, SamplerKind

_SEED_MASK = (1 << 64) - 1
_IMAGE_STREAM, _LAYOUT_STREAM, _LAYOUT_MODEL_STREAM = 0, 1, 2


def _check_sampler(kind: str) -> None:
    if kind not in ("ddpm", "ddim", "dpm_solver++"):
        raise InvalidSpecError(f"unknown sampler {kind!r}")


def _is_per_label(info: ModelInfo) -> bool:
    return bool(info.extra.get("per_label", False))


def _load(model_dir: Path, device: torch.device | str = "cpu",
          ) -> tuple[ModelBundle, ModelInfo, Mapping[int, ConditionalDenoiser]]:
    """The model (on ``device``), its info and the denoiser of each class index it can
    draw."""
    bundle, info = load_model(model_dir)
    device = torch.device(device)
    if device.type != "cpu":
        if bundle.vae is not None:
            _module(bundle.vae).to(device)
        bundle.unet.to(device)
        bundle.class_embedder.to(device)
    if not _is_per_label(info):
        shared = ConditionalDenoiser(bundle.unet, bundle.class_embedder).eval()
        return bundle, info, dict.fromkeys(range(info.num_classes), shared)
    by_name = load_per_label_denoisers(model_dir, bundle, info)
    if not by_name or any(name not in info.class_names for name in by_name):
        raise InvalidSpecError("a per-label bundle's denoisers must be named by its classes")
    return bundle, info, {info.class_names.index(n): d.to(device).eval()
                          for n, d in by_name.items()}


def _seeded(sequence: np.random.SeedSequence, device: torch.device | str) -> torch.Generator:
    return torch.Generator(device=torch.device(device)).manual_seed(
        int(sequence.generate_state(1, np.uint64)[0]))


def _image_generator(seed: int, cls: int, index: int,
                     device: torch.device | str = "cpu") -> torch.Generator:
    """The generator of one image: a function of (seed, class index, image index) only
    (and of the device type: a CUDA generator's stream is not the CPU one's)."""
    sequence = np.random.SeedSequence(seed & _SEED_MASK, spawn_key=(_IMAGE_STREAM, cls, index))
    return _seeded(sequence, device)


def _layout_model_generator(seed: int, cls: int, index: int,
                            device: torch.device | str = "cpu") -> torch.Generator:
    """The generator of one generated layout mask: (seed, class index, mask index) only."""
    sequence = np.random.SeedSequence(seed & _SEED_MASK,
                                      spawn_key=(_LAYOUT_MODEL_STREAM, cls, index))
    return _seeded(sequence, device)


def make_scheduler(bundle: ModelBundle, kind: SamplerKind, steps: int,
                   device: torch.device | None = None, *, pixel: bool = False) -> Any:
    """A fresh sampler (schedulers keep per-run state) from the model's scheduler config.

    ``pixel``: the model denoises pixels in [-1, 1], so every step's estimate of the clean
    image is held to that range (DDPM/DDIM: ``clip_sample``, Ho et al. 2020; DPM-Solver++:
    dynamic thresholding at the 99.5th percentile, Saharia et al. 2022). Without it an
    early, high-noise estimate outside the data range (the ε-prediction error is amplified
    by 1/√ᾱ_t there) drives the whole trajectory to saturated images. Latents have no such
    range and are never clipped.
    """
    config = bundle.scheduler.config
    clip: dict[str, Any] = ({"clip_sample": True, "clip_sample_range": 1.0} if pixel else {})
    if kind == "ddpm":
        scheduler: Any = DDPMScheduler.from_config(config, **clip)
    elif kind == "ddim":
        scheduler = DDIMScheduler.from_config(config, **clip)
    elif kind == "dpm_solver++":
        # The solver's own spacing (from t = T; "leading" would start at T - T/steps, which
        # costs most at the few steps DPM-Solver++ is for); no learned variance here.
        threshold: dict[str, Any] = ({"thresholding": True, "sample_max_value": 1.0,
                                      "dynamic_thresholding_ratio": 0.995} if pixel else {})
        scheduler = DPMSolverMultistepScheduler.from_config(
            config, algorithm_type="dpmsolver++", timestep_spacing="linspace",
            variance_type=None, **threshold)
    else:
        raise InvalidSpecError(f"unknown sampler {kind!r}")
    if device is None or device.type == "cpu":
        scheduler.set_timesteps(steps)
    else:
        scheduler.set_timesteps(steps, device=device)
    return scheduler


@torch.no_grad()
def _generate(bundle: ModelBundle, info: ModelInfo, denoiser: ConditionalDenoiser, label: int,
              n: int, *, sampler: SamplerKind, steps: int, guidance_scale: float,
              generators: list[torch.Generator],
              layout: torch.Tensor | None) -> np.ndarray:
    """Denoise ``n`` latents with class label ``label``, decode them to uint8 [n, H, W, C]
    (a pixel-space model's samples are the images: ``codec.decode_samples``)."""
    device = next(denoiser.parameters()).device
    scheduler = make_scheduler(bundle, sampler, steps, device, pixel=info.space == "pixel")
    size = int(bundle.unet.config["sample_size"])
    shape = (1, info.latent_channels, size, size)
    # each image's generator lives on the model's device (``_image_generator``): the initial
    # latents and DDPM's per-step noise are drawn there, never copied from the host
    latents = torch.cat([torch.randn(shape, generator=g, device=g.device) for g in generators])
    latents = latents.to(device) * scheduler.init_noise_sigma
    cond = torch.full((n,), label, dtype=torch.long, device=device)
    uncond = torch.full((n,), info.null_class, dtype=torch.long, device=device)
    if layout is not None:
        layout = layout.to(device)
    guided = guidance_scale != 1.0
    both_layout = None if layout is None or not guided else torch.cat([layout, layout])
    for t in scheduler.timesteps:
        model_in = scheduler.scale_model_input(latents, t)
        ts = torch.full((n,), int(t), dtype=torch.long, device=device)
        if not guided:
            eps = denoiser(model_in, ts, cond, layout=layout)
        else:
            # Guidance is over the class only: both branches see the image's layout.
            both = denoiser(torch.cat([model_in, model_in]), torch.cat([ts, ts]),
                            torch.cat([cond, uncond]), layout=both_layout)
            eps_cond, eps_uncond = both.chunk(2)
            eps = eps_uncond + guidance_scale * (eps_cond - eps_uncond)
        # One generator per image: DDPM's noise for an image is independent of its batch.
        latents = scheduler.step(eps, t, latents, generator=generators).prev_sample
    images = decode_samples(bundle, info, latents)  # in [0, 1]
    pixels = (images * 255.0).round().to(torch.uint8).permute(0, 2, 3, 1)
    array: np.ndarray = pixels.cpu().numpy()
    return array


def _module(part: object) -> nn.Module:
    """A diffusers part as the ``nn.Module`` it is (its ``to`` is typed for dtypes only)."""
    return cast("nn.Module", part)
