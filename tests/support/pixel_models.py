"""A real tiny pixel-space model folder, built with diffusers directly (not by the ML core):
what a pixel model is on disk, so the platform's upload, storage and download can be tested
against the layout alone (docs/architecture.md, "Model folders").

The layout is a latent model's without ``vae/``: ``dpsynth_model.json`` (``space: pixel``,
``latent_channels == channels``, ``vae_scaling_factor == 1.0``), ``unet/`` working on the
images (``sample_size == image_size``, ``in_channels == out_channels == channels``),
``scheduler/`` and, for a ``UNet2DConditionModel``, ``class_embedder/`` written as the ML
core writes it (``dpsynth_ml.models.model_io``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

PIXEL_CROSS_ATTENTION_DIM = 16


def pixel_model_dir(dest: Path, *, class_names: list[str], image_size: int = 16,
                    channels: int = 1,
                    unet_class: Literal["UNet2DConditionModel", "UNet2DModel"] =
                    "UNet2DConditionModel",
                    info: dict[str, Any] | None = None) -> Path:
    """Write a tiny pixel-space model folder at ``dest`` and return it.

    Args:
        dest: the folder (created).
        class_names: the model's classes (the null class is one more row).
        image_size: the side of its square images (the UNet's ``sample_size``).
        channels: the images' channels (the UNet's in and out channels).
        unet_class: the diffusers class of the denoiser.
        info: overrides of ``dpsynth_model.json``'s fields.
    """
    import torch
    from diffusers import DDPMScheduler, UNet2DConditionModel, UNet2DModel
    from safetensors.torch import save_file

    torch.manual_seed(0)
    dest.mkdir(parents=True, exist_ok=True)
    rows = len(class_names) + 1  # the last row: the null class (guidance)
    unet: UNet2DConditionModel | UNet2DModel
    if unet_class == "UNet2DConditionModel":
        unet = UNet2DConditionModel(
            sample_size=image_size, in_channels=channels, out_channels=channels,
            layers_per_block=1, block_out_channels=(16, 32),
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
            cross_attention_dim=PIXEL_CROSS_ATTENTION_DIM, attention_head_dim=8,
            norm_num_groups=8)
    else:
        unet = UNet2DModel(
            sample_size=image_size, in_channels=channels, out_channels=channels,
            layers_per_block=1, block_out_channels=(16, 32),
            down_block_types=("DownBlock2D", "AttnDownBlock2D"),
            up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=8,
            num_class_embeds=rows)
    unet.save_pretrained(dest / "unet", safe_serialization=True)
    DDPMScheduler(num_train_timesteps=1000).save_pretrained(dest / "scheduler")
    if unet_class == "UNet2DConditionModel":
        embedder = dest / "class_embedder"
        embedder.mkdir(exist_ok=True)
        weight = torch.nn.Embedding(rows, PIXEL_CROSS_ATTENTION_DIM).weight.detach()
        save_file({"weight": weight.contiguous()}, str(embedder / "model.safetensors"))
        (embedder / "config.json").write_text(json.dumps(
            {"num_embeddings": rows, "embedding_dim": PIXEL_CROSS_ATTENTION_DIM,
             "null_class": rows - 1}, indent=2, sort_keys=True))
    payload: dict[str, Any] = {
        "format_version": 1, "preset": "tiny", "space": "pixel", "image_size": image_size,
        "channels": channels, "latent_channels": channels, "vae_scaling_factor": 1.0,
        "num_classes": len(class_names), "class_names": list(class_names),
        "null_class": len(class_names), "rng": "os", "training_kind": "pretrain", "steps": 0,
        "extra": {"unet_class": unet_class, "layout_channels": 0}, **(info or {})}
    (dest / "dpsynth_model.json").write_text(json.dumps(payload, indent=2, sort_keys=True))
    return dest


def folder_files(folder: Path) -> dict[str, bytes]:
    """Every file of a folder by its posix path inside it."""
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}
