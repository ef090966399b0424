"""The on-disk model directory: save, load (safetensors only), hash, read info.

Layout::

    vae/ unet/ scheduler/          diffusers save_pretrained (safetensors)
    class_embedder/model.safetensors + config.json
    dpsynth_model.json             ModelInfo
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
from safetensors.torch import load_file, save_file
from torch import nn

from dpsynth_ml.models import ModelBundle
from dpsynth_ml.spec import MODEL_FORMAT_VERSION, InvalidSpecError, ModelInfo

INFO_FILE = "dpsynth_model.json"
_EMBEDDER_WEIGHTS = "model.safetensors"


def save_model(bundle: ModelBundle, info: ModelInfo, model_dir: Path) -> Path:
    """Write ``bundle`` and ``info`` as a model directory (created if needed).

    Args:
        bundle: the model parts.
        info: metadata stamped into ``dpsynth_model.json``.
        model_dir: destination directory.

    Returns:
        ``model_dir``.
    """
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    bundle.vae.save_pretrained(model_dir / "vae", safe_serialization=True)
    bundle.unet.save_pretrained(model_dir / "unet", safe_serialization=True)
    bundle.scheduler.save_pretrained(model_dir / "scheduler")
    emb_dir = model_dir / "class_embedder"
    emb_dir.mkdir(exist_ok=True)
    weight = bundle.class_embedder.weight.detach().cpu().contiguous()
    save_file({"weight": weight}, str(emb_dir / _EMBEDDER_WEIGHTS))
    emb_config = {"num_embeddings": int(weight.shape[0]), "embedding_dim": int(weight.shape[1]),
                  "null_class": int(weight.shape[0]) - 1}
    (emb_dir / "config.json").write_text(json.dumps(emb_config, indent=2, sort_keys=True))
    write_model_info(info, model_dir)
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

    Returns:
        The model parts (in eval mode, on CPU) and their info.
    """
    model_dir = Path(model_dir)
    info = read_model_info(model_dir)
    vae = AutoencoderKL.from_pretrained(model_dir / "vae", use_safetensors=True,
                                        low_cpu_mem_usage=False)
    unet = UNet2DConditionModel.from_pretrained(model_dir / "unet", use_safetensors=True,
                                        low_cpu_mem_usage=False)
    scheduler = DDPMScheduler.from_pretrained(model_dir / "scheduler")
    weights = load_file(str(model_dir / "class_embedder" / _EMBEDDER_WEIGHTS))["weight"]
    embedder = nn.Embedding(weights.shape[0], weights.shape[1])
    with torch.no_grad():
        embedder.weight.copy_(weights)
    if weights.shape[0] != info.num_classes + 1:
        raise InvalidSpecError("class embedder rows do not match num_classes + 1")
    bundle = ModelBundle(vae=vae.eval(), unet=unet.eval(), class_embedder=embedder.eval(),
                         scheduler=scheduler)
    return bundle, info


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
