"""Sampling from a model directory with classifier-free guidance (Ho & Salimans 2022).

Generation is post-processing of the DP model, so its seed may be recorded and reused.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from diffusers import DDIMScheduler, DDPMScheduler
from PIL import Image

from dpsynth_ml.model_io import load_model
from dpsynth_ml.models import ConditionalDenoiser, ModelBundle
from dpsynth_ml.spec import InvalidSpecError, ModelInfo, SampleResult, SamplerKind

_BATCH = 64


def sample(model_dir: Path, *, samples_per_class: int, sampler: SamplerKind, steps: int,
           guidance_scale: float, seed: int, out_dir: Path,
           classes: Sequence[int] | None = None,
           progress: Callable[[int, int], None] | None = None) -> SampleResult:
    """Generate images per class and write ``out_dir/<class_name>/<i>.png``.

    Args:
        model_dir: a dpsynth model directory.
        samples_per_class: images per class.
        sampler: "ddpm" (ancestral) or "ddim" (deterministic, eta=0).
        steps: number of denoising steps (``set_timesteps(steps)``).
        guidance_scale: w in eps = eps_uncond + w (eps_cond - eps_uncond); 1 = conditional only.
        seed: seed of the generation noise.
        out_dir: output root.
        classes: model class indices to generate (default: all).
        progress: called with (images done, images total).

    Returns:
        Counts per class name.
    """
    if samples_per_class < 0 or steps < 1:
        raise InvalidSpecError("samples_per_class must be >= 0 and steps >= 1")
    bundle, info = load_model(model_dir)
    wanted = list(range(info.num_classes)) if classes is None else list(classes)
    if any(not 0 <= c < info.num_classes for c in wanted):
        raise InvalidSpecError("classes must be model class indices")
    dirs = _class_dirs(info)
    denoiser = ConditionalDenoiser(bundle.unet, bundle.class_embedder).eval()
    g = torch.Generator().manual_seed(seed)
    counts: dict[str, int] = {}
    total, done = samples_per_class * len(wanted), 0
    for cls in wanted:
        target = Path(out_dir) / dirs[cls]
        target.mkdir(parents=True, exist_ok=True)
        for start in range(0, samples_per_class, _BATCH):
            n = min(_BATCH, samples_per_class - start)
            images = _generate(bundle, info, denoiser, cls, n, sampler=sampler, steps=steps,
                               guidance_scale=guidance_scale, generator=g)
            for i, image in enumerate(images):
                _save_png(image, target / f"{start + i}.png")
            done += n
            if progress is not None:
                progress(done, total)
        counts[info.class_names[cls]] = samples_per_class
    return SampleResult(out_dir=Path(out_dir), counts=counts, seed=seed)


def _class_dirs(info: ModelInfo) -> list[str]:
    """File-system-safe, unique directory names for the class names."""
    names: list[str] = []
    for idx, name in enumerate(info.class_names):
        safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or f"class_{idx}"
        names.append(safe if safe not in names else f"{safe}_{idx}")
    return names


def _make_scheduler(bundle: ModelBundle, kind: SamplerKind, steps: int) -> Any:
    config = bundle.scheduler.config
    if kind == "ddpm":
        scheduler: Any = DDPMScheduler.from_config(config)
    elif kind == "ddim":
        scheduler = DDIMScheduler.from_config(config)
    else:
        raise InvalidSpecError(f"unknown sampler {kind!r}")
    scheduler.set_timesteps(steps)
    return scheduler


@torch.no_grad()
def _generate(bundle: ModelBundle, info: ModelInfo, denoiser: ConditionalDenoiser, cls: int,
              n: int, *, sampler: SamplerKind, steps: int, guidance_scale: float,
              generator: torch.Generator) -> np.ndarray:
    """Denoise ``n`` latents of class ``cls`` and decode them to uint8 [n, H, W, C]."""
    scheduler = _make_scheduler(bundle, sampler, steps)
    size = int(bundle.unet.config["sample_size"])
    latents = torch.randn((n, info.latent_channels, size, size), generator=generator)
    latents = latents * scheduler.init_noise_sigma
    cond = torch.full((n,), cls, dtype=torch.long)
    uncond = torch.full((n,), info.null_class, dtype=torch.long)
    for t in scheduler.timesteps:
        model_in = scheduler.scale_model_input(latents, t)
        ts = torch.full((n,), int(t), dtype=torch.long)
        if guidance_scale == 1.0:
            eps = denoiser(model_in, ts, cond)
        else:
            both = denoiser(torch.cat([model_in, model_in]), torch.cat([ts, ts]),
                            torch.cat([cond, uncond]))
            eps_cond, eps_uncond = both.chunk(2)
            eps = eps_uncond + guidance_scale * (eps_cond - eps_uncond)
        latents = scheduler.step(eps, t, latents, generator=generator).prev_sample
    images = bundle.vae.decode(latents / info.vae_scaling_factor).sample.clamp(-1.0, 1.0)
    pixels = ((images + 1.0) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1)
    return pixels.numpy()


def _save_png(image: np.ndarray, path: Path) -> None:
    Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image).save(path)
