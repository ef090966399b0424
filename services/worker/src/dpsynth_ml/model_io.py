"""The on-disk model directory: save, load (safetensors only), hash, read info.

Layout::

    vae/ unet/ scheduler/          diffusers save_pretrained (safetensors); unet/ is a
                                   UNet2DConditionModel or a UNet2DModel (its config's
                                   ``_class_name``; no other class is loaded)
    class_embedder/model.safetensors + config.json
                                   the class-token table (UNet2DConditionModel only; a
                                   UNet2DModel keeps its table as ``class_embedding``)
    unet_lora/                     finetune checkpoints under trainable "lora" only:
                                   adapter_model.safetensors (peft's adapter state dict)
                                   + adapter_config.json (rank, alpha, target projections)
    dpsynth_model.json             ModelInfo

LoRA: a released model is a plain diffusers UNet with the adapters merged into its weights
(W + alpha/r B A). A checkpoint keeps them apart so that a resume continues exactly: its
``unet/`` holds the unmerged base weights (bit-identical to the base model's) and
``unet_lora/`` the adapters, which :func:`load_model` injects again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import torch
from diffusers import AutoencoderKL, DDPMScheduler, UNet2DModel
from safetensors.torch import load_file, save_file
from torch import nn

from dpsynth_ml.models import UNET_CLASSES, ModelBundle
from dpsynth_ml.spec import MODEL_FORMAT_VERSION, InvalidSpecError, ModelInfo
from dpsynth_ml.trainable import (
    add_lora,
    has_lora,
    load_lora_state_dict,
    lora_config,
    lora_state_dict,
    plain_unet,
)

INFO_FILE = "dpsynth_model.json"
LORA_DIR = "unet_lora"
_EMBEDDER_WEIGHTS = "model.safetensors"
_LORA_WEIGHTS = "adapter_model.safetensors"
_LORA_CONFIG = "adapter_config.json"


def save_model(bundle: ModelBundle, info: ModelInfo, model_dir: Path, *,
               keep_adapters: bool = False) -> Path:
    """Write ``bundle`` and ``info`` as a model directory (created if needed).

    ``info.extra`` is stamped with ``unet_class`` and ``layout_channels`` (0 when none),
    read from the bundle itself.

    Args:
        bundle: the model parts.
        info: metadata stamped into ``dpsynth_model.json``.
        model_dir: destination directory.
        keep_adapters: LoRA only. False (released models): the adapters are merged into a
            plain UNet. True (checkpoints): the unmerged base UNet plus ``unet_lora/``.

    Returns:
        ``model_dir``.
    """
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    bundle.vae.save_pretrained(model_dir / "vae", safe_serialization=True)
    lora = has_lora(bundle.unet)
    unet = plain_unet(bundle.unet, merge=not keep_adapters)
    unet.save_pretrained(model_dir / "unet", safe_serialization=True)
    lora_dir = model_dir / LORA_DIR
    if lora and keep_adapters:
        lora_dir.mkdir(exist_ok=True)
        save_file(lora_state_dict(bundle.unet), str(lora_dir / _LORA_WEIGHTS))
        (lora_dir / _LORA_CONFIG).write_text(json.dumps(lora_config(bundle.unet), indent=2,
                                                         sort_keys=True))
    elif lora_dir.exists():
        shutil.rmtree(lora_dir)  # a stale checkpoint's adapters must not be loaded again
    bundle.scheduler.save_pretrained(model_dir / "scheduler")
    if not isinstance(bundle.unet, UNet2DModel):
        emb_dir = model_dir / "class_embedder"
        emb_dir.mkdir(exist_ok=True)
        weight = bundle.class_embedder.weight.detach().cpu().contiguous()
        save_file({"weight": weight}, str(emb_dir / _EMBEDDER_WEIGHTS))
        emb_config = {"num_embeddings": int(weight.shape[0]),
                      "embedding_dim": int(weight.shape[1]),
                      "null_class": int(weight.shape[0]) - 1}
        (emb_dir / "config.json").write_text(json.dumps(emb_config, indent=2, sort_keys=True))
    extra = {**info.extra, "unet_class": bundle.unet_class,
             "layout_channels": bundle.layout_channels}
    write_model_info(dataclasses.replace(info, extra=extra), model_dir)
    return model_dir


def write_model_info(info: ModelInfo, model_dir: Path) -> None:
    """Write ``dpsynth_model.json``."""
    payload: dict[str, Any] = dataclasses.asdict(info)
    payload["class_names"] = list(info.class_names)
    payload["extra"] = dict(info.extra)
    (Path(model_dir) / INFO_FILE).write_text(json.dumps(payload, indent=2, sort_keys=True))


def read_model_info(model_dir: Path) -> ModelInfo:
    """Read ``dpsynth_model.json`` of a model directory.

    Raises:
        InvalidSpecError: if the file is missing or of an unknown format version.
    """
    path = Path(model_dir) / INFO_FILE
    if not path.is_file():
        raise InvalidSpecError(f"not a dpsynth model directory: {model_dir}")
    raw = json.loads(path.read_text())
    if raw.get("format_version") != MODEL_FORMAT_VERSION:
        raise InvalidSpecError(f"unsupported model format {raw.get('format_version')!r}")
    raw["class_names"] = tuple(raw["class_names"])
    return ModelInfo(**raw)


def load_model(model_dir: Path) -> tuple[ModelBundle, ModelInfo]:
    """Load a model directory using safetensors only (never pickle).

    The UNet class is read from ``unet/config.json``'s ``_class_name`` and must be
    ``UNet2DConditionModel`` or ``UNet2DModel``. A checkpoint's ``unet_lora/`` adapters
    are injected into the (unmerged) UNet.

    Returns:
        The model parts (in eval mode, on CPU) and their info.

    Raises:
        InvalidSpecError: a missing or unknown part, or a class table that does not have
            ``num_classes + 1`` rows.
    """
    model_dir = Path(model_dir)
    info = read_model_info(model_dir)
    vae = AutoencoderKL.from_pretrained(model_dir / "vae", use_safetensors=True,
                                        low_cpu_mem_usage=False)
    unet = _load_unet(model_dir / "unet")
    recorded = info.extra.get("unet_class")
    if recorded is not None and recorded != type(unet).__name__:
        raise InvalidSpecError(f"the model info says {recorded}, unet/ holds "
                               f"{type(unet).__name__}")
    scheduler = DDPMScheduler.from_pretrained(model_dir / "scheduler")
    if isinstance(unet, UNet2DModel):
        embedder = unet.class_embedding
        if not isinstance(embedder, nn.Embedding) or unet.config.get("class_embed_type"):
            raise InvalidSpecError("a UNet2DModel must carry its classes as num_class_embeds")
    else:
        weights = load_file(str(model_dir / "class_embedder" / _EMBEDDER_WEIGHTS))["weight"]
        embedder = nn.Embedding(weights.shape[0], weights.shape[1])
        with torch.no_grad():
            embedder.weight.copy_(weights)
    if embedder.num_embeddings != info.num_classes + 1:
        raise InvalidSpecError("class embedder rows do not match num_classes + 1")
    lora_dir = model_dir / LORA_DIR
    if lora_dir.is_dir():
        saved = json.loads((lora_dir / _LORA_CONFIG).read_text())
        add_lora(unet, rank=int(saved["rank"]), alpha=float(saved["alpha"]),
                 targets=[str(t) for t in saved["targets"]])
        load_lora_state_dict(unet, load_file(str(lora_dir / _LORA_WEIGHTS)))
    bundle = ModelBundle(vae=vae.eval(), unet=unet.eval(), class_embedder=embedder.eval(),
                         scheduler=scheduler)
    return bundle, info


def _load_unet(unet_dir: Path) -> Any:
    """The UNet of ``unet_dir``, of the allowed class its config names."""
    config_path = unet_dir / "config.json"
    if not config_path.is_file():
        raise InvalidSpecError(f"model has no unet config: {config_path}")
    name = json.loads(config_path.read_text()).get("_class_name")
    if not isinstance(name, str) or name not in UNET_CLASSES:
        raise InvalidSpecError(f"unet class {name!r} is not allowed (allowed: "
                               f"{', '.join(UNET_CLASSES)})")
    return UNET_CLASSES[name].from_pretrained(  # type: ignore[attr-defined]
        unet_dir, use_safetensors=True, low_cpu_mem_usage=False)


def model_hash(model_dir: Path) -> str:
    """SHA-256 over the sorted files of a model directory.

    Each file contributes its POSIX relative path, a NUL byte, its size and its bytes, so
    renames and content changes both change the hash.

    Args:
        model_dir: the model directory.

    Returns:
        Hex digest.
    """
    root = Path(model_dir)
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        digest.update(rel.encode() + b"\0" + str(path.stat().st_size).encode() + b"\0")
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()
