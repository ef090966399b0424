"""The on-disk model directory: save, load (safetensors only), read info.

A directory's content hashes are in :mod:`dpsynth_ml.models.hashing`.

Layout::

    vae/ unet/ scheduler/          diffusers save_pretrained (safetensors); unet/ is a
                                   UNet2DConditionModel or a UNet2DModel (its config's
                                   ``_class_name``; no other class is loaded); a
                                   pixel-space model (info ``space: "pixel"``) has no vae/
    class_embedder/model.safetensors + config.json
                                   the class-token table (UNet2DConditionModel only; a
                                   UNet2DModel keeps its table as ``class_embedding``)
    unet_lora/                     finetune checkpoints under trainable "lora" only:
                                   adapter_model.safetensors (peft's adapter state dict)
                                   + adapter_config.json (rank, alpha, target projections)
    dpsynth_model.json             ModelInfo (a file without ``space`` is a latent model,
                                   as every model written before pixel space existed)

LoRA: a released model is a plain diffusers UNet with the adapters merged into its weights
(W + alpha/r B A). A checkpoint keeps them apart so that a resume continues exactly: its
``unet/`` holds the unmerged base weights (bit-identical to the base model's) and
``unet_lora/`` the adapters, which :func:`load_model` injects again.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import torch
from diffusers.models.autoencoders.autoencoder_kl import AutoencoderKL
from diffusers.models.modeling_utils import ModelMixin
from diffusers.models.unets.unet_2d import UNet2DModel
from diffusers.schedulers.scheduling_ddpm import DDPMScheduler
from safetensors.torch import load_file, save_file
from torch import nn

from dpsynth_ml.models.architectures import UNET_CLASSES, ConditionalDenoiser, ModelBundle
from dpsynth_ml.models.codec import check_space

# the content hashes live in their own module; model_hash is re-exported for existing callers
from dpsynth_ml.models.hashing import _part_fingerprint
from dpsynth_ml.models.hashing import model_hash as model_hash
from dpsynth_ml.models.trainable import (
    add_lora,
    has_lora,
    load_lora_state_dict,
    lora_config,
    lora_state_dict,
    plain_unet,
)
from dpsynth_ml.spec import MODEL_FORMAT_VERSION, InvalidSpecError, ModelInfo

INFO_FILE = "dpsynth_model.json"
LORA_DIR = "unet_lora"
_EMBEDDER_WEIGHTS = "model.safetensors"
_LORA_WEIGHTS = "adapter_model.safetensors"
_LORA_CONFIG = "adapter_config.json"


def save_model(bundle: ModelBundle, info: ModelInfo, model_dir: Path, *,
               keep_adapters: bool = False) -> Path:
    """Write ``bundle`` and ``info`` as a model directory (created if needed).

    ``info.extra`` is stamped with ``unet_class`` and ``layout_channels`` (0 when none),
    read from the bundle itself. A pixel-space bundle (no VAE) writes no ``vae/``.

    Args:
        bundle: the model parts.
        info: metadata stamped into ``dpsynth_model.json``.
        model_dir: destination directory.
        keep_adapters: LoRA only. False (released models): the adapters are merged into a
            plain UNet. True (checkpoints): the unmerged base UNet plus ``unet_lora/``.

    Returns:
        ``model_dir``.

    Raises:
        InvalidSpecError: if ``info.space`` disagrees with the bundle (a VAE or none).
    """
    check_space(bundle, info)
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    if bundle.vae is not None:
        bundle.vae.save_pretrained(model_dir / "vae", safe_serialization=True)
    elif (model_dir / "vae").exists():
        shutil.rmtree(model_dir / "vae")  # a pixel model must not be read with another's VAE
    lora = has_lora(bundle.unet)
    unet = cast("ModelMixin", plain_unet(bundle.unet, merge=not keep_adapters))  # a UNet
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

    A file without ``space`` (written before pixel-space models) reads as ``"latent"``.

    Raises:
        InvalidSpecError: if the file is missing or of an unknown format version or space.
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
    are injected into the (unmerged) UNet. A pixel-space model has no VAE (``bundle.vae``
    is None) and its UNet's output channels are the image channels.

    Returns:
        The model parts (in eval mode, on CPU) and their info.

    Raises:
        InvalidSpecError: a missing or unknown part, a part the model's space excludes (a
            pixel model's vae/), or a class table that does not have ``num_classes + 1``
            rows.
    """
    model_dir = Path(model_dir)
    info = read_model_info(model_dir)
    vae: AutoencoderKL | None = None
    if info.space == "latent":
        vae = AutoencoderKL.from_pretrained(model_dir / "vae", use_safetensors=True,
                                            low_cpu_mem_usage=False).eval()
    elif (model_dir / "vae").exists():
        raise InvalidSpecError("a pixel-space model has no vae/")
    unet = _load_unet(model_dir / "unet")
    if info.space == "pixel" and int(unet.config["out_channels"]) != info.channels:
        raise InvalidSpecError("a pixel-space model's UNet must output the image channels")
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
    bundle = ModelBundle(vae=vae, unet=unet.eval(), class_embedder=embedder.eval(),
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


# --- Per-label bundles (DP-DocLDM): one denoiser per class, a shared VAE and scheduler ---
#
#     vae/ scheduler/                    shared (frozen during finetuning, identical per class;
#                                        no vae/ in pixel space)
#     denoisers/<index>/unet/            the denoiser of the class ``class_names[index]``
#     denoisers/<index>/class_embedder/  its class table (UNet2DConditionModel only)
#     unet/ class_embedder/              a copy of the first bundled class's denoiser, so that
#                                        load_model() and single-denoiser tools open the folder
#     dpsynth_model.json                 extra["per_label"] = True,
#                                        extra["denoisers"] = {class name: "denoisers/<index>"},
#                                        extra["steps_by_partition"] = {class name: steps}
#
# Each per-label denoiser is unconditional: it was trained with every label set to the null
# class, so it is sampled with labels = info.null_class (guidance has no effect).

DENOISERS_DIR = "denoisers"
_DENOISER_PARTS = ("unet", "class_embedder")
_SHARED_PARTS = ("vae", "scheduler")


def save_per_label_model(class_model_dirs: Mapping[str, Path], model_dir: Path) -> Path:
    """Bundle single-denoiser model directories (one per class) into one model directory.

    Args:
        class_model_dirs: class name -> a model directory written by :func:`save_model`
            for that class (released form: no LoRA adapters kept apart), in bundle order.
            All must share the label domain, the VAE and the scheduler (byte-identical).
        model_dir: destination (replaced if it exists).

    Returns:
        ``model_dir``.

    Raises:
        InvalidSpecError: no class, an unknown class name, or parts that differ.
    """
    if not class_model_dirs:
        raise InvalidSpecError("a per-label bundle needs at least one class")
    infos = {name: read_model_info(Path(d)) for name, d in class_model_dirs.items()}
    first_name = next(iter(class_model_dirs))
    first_dir, first = Path(class_model_dirs[first_name]), infos[first_name]
    shared_hashes = {part: _part_fingerprint(first_dir / part) for part in _SHARED_PARTS}
    denoisers: dict[str, str] = {}
    for name, info in infos.items():
        source = Path(class_model_dirs[name])
        if name not in info.class_names or info.class_names != first.class_names:
            raise InvalidSpecError(f"class {name!r} is not in the bundle's label domain")
        if (source / LORA_DIR).exists():
            raise InvalidSpecError("bundle released models, not checkpoints with adapters")
        if any(_part_fingerprint(source / p) != h for p, h in shared_hashes.items()):
            raise InvalidSpecError(f"class {name!r} has another VAE or scheduler")
        denoisers[name] = f"{DENOISERS_DIR}/{info.class_names.index(name)}"
    model_dir = Path(model_dir)
    if model_dir.exists():
        shutil.rmtree(model_dir)
    model_dir.mkdir(parents=True)
    for part in (*_SHARED_PARTS, *_DENOISER_PARTS):
        if (first_dir / part).is_dir():
            shutil.copytree(first_dir / part, model_dir / part)
    for name, rel in denoisers.items():
        for part in _DENOISER_PARTS:
            if (Path(class_model_dirs[name]) / part).is_dir():
                shutil.copytree(Path(class_model_dirs[name]) / part, model_dir / rel / part)
    extra = {**{k: v for k, v in first.extra.items() if k != "per_label_class"},
             "per_label": True, "denoisers": denoisers,
             "steps_by_partition": {name: info.steps for name, info in infos.items()}}
    rng = "test" if any(info.rng == "test" for info in infos.values()) else first.rng
    write_model_info(dataclasses.replace(first, steps=sum(i.steps for i in infos.values()),
                                         rng=rng, extra=extra), model_dir)
    return model_dir


def per_label_denoiser_dirs(info: ModelInfo) -> dict[str, str]:
    """Class name -> the denoiser's folder (relative) of a per-label bundle; {} otherwise."""
    if not info.extra.get("per_label"):
        return {}
    raw = info.extra.get("denoisers")
    if not isinstance(raw, Mapping):
        raise InvalidSpecError("a per-label model must list its denoisers")
    return {str(k): str(v) for k, v in raw.items()}


def export_denoiser(model_dir: Path, class_name: str, dest: Path, *,
                    link: bool = False) -> Path:
    """Write one class of a per-label bundle as a plain single-denoiser model directory.

    Args:
        model_dir: the per-label bundle.
        class_name: which class.
        dest: destination directory (created; must not hold an older model).
        link: symlink the parts instead of copying them (read-only views).

    Returns:
        ``dest``, whose info has ``steps`` = that class's steps.

    Raises:
        InvalidSpecError: not a per-label bundle, or no denoiser for ``class_name``.
    """
    model_dir, dest = Path(model_dir), Path(dest)
    info = read_model_info(model_dir)
    dirs = per_label_denoiser_dirs(info)
    if class_name not in dirs:
        raise InvalidSpecError(f"the model has no per-label denoiser for {class_name!r}")
    rel = Path(dirs[class_name])
    if rel.is_absolute() or ".." in rel.parts:
        raise InvalidSpecError("a denoiser folder must lie inside the model")
    dest.mkdir(parents=True, exist_ok=True)
    parts = [(model_dir / p, dest / p) for p in _SHARED_PARTS
             if (model_dir / p).is_dir()]  # a pixel model has no vae/
    parts += [(model_dir / rel / p, dest / p) for p in _DENOISER_PARTS
              if (model_dir / rel / p).is_dir()]
    for source, target in parts:
        if link:
            target.symlink_to(source.resolve(), target_is_directory=True)
        else:
            shutil.copytree(source, target)
    steps = info.extra.get("steps_by_partition", {})
    extra = {k: v for k, v in info.extra.items()
             if k not in ("per_label", "denoisers", "steps_by_partition")}
    extra["per_label_class"] = class_name
    class_steps = int(steps.get(class_name, 0)) if isinstance(steps, Mapping) else 0
    write_model_info(dataclasses.replace(info, steps=class_steps, extra=extra), dest)
    return dest


def load_model_denoiser(model_dir: Path, class_name: str) -> tuple[ModelBundle, ModelInfo]:
    """Load one class of a per-label bundle as a single model (shared VAE and scheduler).

    Returns:
        The parts (the class's denoiser as ``unet`` / ``class_embedder``) and an info with
        that class's ``steps`` and ``extra["per_label_class"]``. Sample it with labels =
        ``info.null_class``: per-label denoisers are unconditional.
    """
    with tempfile.TemporaryDirectory(prefix="dpsynth-denoiser-") as tmp:
        view = export_denoiser(model_dir, class_name, Path(tmp) / "model", link=True)
        return load_model(view)  # everything is read into memory before the view goes


def load_per_label_denoisers(model_dir: Path, bundle: ModelBundle | None = None,
                             info: ModelInfo | None = None) -> dict[str, ConditionalDenoiser]:
    """Every class's denoiser of a per-label bundle, keyed by class name.

    ``bundle`` and ``info`` (from :func:`load_model` on the same folder) are accepted for
    symmetry with the sampler's loading and are not needed.

    Returns:
        class name -> ``ConditionalDenoiser`` (eval mode, CPU), to be called with labels =
        the model's null class.
    """
    del bundle
    info = info if info is not None else read_model_info(Path(model_dir))
    out: dict[str, ConditionalDenoiser] = {}
    for name in per_label_denoiser_dirs(info):
        parts, _ = load_model_denoiser(model_dir, name)
        out[name] = ConditionalDenoiser(parts.unet, parts.class_embedder).eval()
    return out
