"""LayoutLMv3 token classification from an allow-listed config, made DP-trainable.

Only known ``config.json`` keys are accepted, each within bounds; ``auto_map`` (remote code)
or any other key is refused, and ``trust_remote_code`` is never used. Weights come only from
``model.safetensors`` (never pickle). Nothing touches the Hugging Face hub
(``HF_HUB_OFFLINE=1`` is set before transformers is imported here).

opacus cannot give per-example gradients to some LayoutLMv3 parameters (docs/kie.md,
/work/shared/reference §2.3): the raw ``cls_token`` and ``pos_embed`` ``nn.Parameter``s of the
visual branch, and the ``rel_pos*`` attention-bias Linears (used by indexing ``.weight``, so
opacus' hooks never see them). No image is fed, so the whole visual branch (also
``patch_embed``, its ``LayerNorm`` and ``norm``) gets no gradient either. These are FROZEN and
their names returned (:attr:`KieModel.frozen`); every other parameter is trained.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dpsynth_ml.dp import DpSgdEngine
from dpsynth_ml.errors import InvalidSpecError

os.environ.setdefault("HF_HUB_OFFLINE", "1")
from transformers import LayoutLMv3Config, LayoutLMv3ForTokenClassification

MAX_CONFIG_BYTES = 1024 * 1024
MAX_WEIGHTS_BYTES = 4 * 1024 ** 3

#: key -> (type, low, high) for the config keys that are passed on to LayoutLMv3Config.
_INT_KEYS: dict[str, tuple[int, int]] = {
    "vocab_size": (8, 300_000), "hidden_size": (8, 4096), "num_hidden_layers": (1, 48),
    "num_attention_heads": (1, 64), "intermediate_size": (8, 16384),
    "max_position_embeddings": (8, 4096), "type_vocab_size": (1, 16),
    "max_2d_position_embeddings": (1001, 4096), "coordinate_size": (1, 1024),
    "shape_size": (1, 1024), "rel_pos_bins": (1, 1024), "max_rel_pos": (1, 4096),
    "rel_2d_pos_bins": (1, 1024), "max_rel_2d_pos": (1, 4096), "input_size": (16, 1024),
    "num_channels": (1, 4), "patch_size": (1, 64), "pad_token_id": (0, 300_000),
    "bos_token_id": (0, 300_000), "eos_token_id": (0, 300_000),
}
_FLOAT_KEYS: dict[str, tuple[float, float]] = {
    "hidden_dropout_prob": (0.0, 0.9), "attention_probs_dropout_prob": (0.0, 0.9),
    "classifier_dropout": (0.0, 0.9), "layer_norm_eps": (1e-12, 1e-2),
    "initializer_range": (1e-6, 1.0),
}
_BOOL_KEYS = frozenset({"has_relative_attention_bias", "has_spatial_attention_bias",
                        "text_embed", "visual_embed"})
_ACTIVATIONS = frozenset({"gelu", "relu", "gelu_new", "silu", "tanh"})
#: informational keys that are accepted and dropped (labels come from the dataset)
_IGNORED_KEYS = frozenset({"architectures", "transformers_version", "torch_dtype", "dtype",
                           "id2label", "label2id", "_name_or_path", "output_hidden_states",
                           "output_attentions", "return_dict", "chunk_size_feed_forward",
                           "is_encoder_decoder", "problem_type", "num_labels",
                           "tie_word_embeddings", "model_type", "hidden_act"})
_ARCHITECTURES = frozenset({"LayoutLMv3ForTokenClassification", "LayoutLMv3Model"})
_VISUAL = ("layoutlmv3.cls_token", "layoutlmv3.pos_embed", "layoutlmv3.patch_embed.",
           "layoutlmv3.LayerNorm.", "layoutlmv3.norm.")
_REL_POS = "layoutlmv3.encoder.rel_pos"


@dataclass
class KieModel:
    """A LayoutLMv3 token classifier ready for DP training.

    Attributes:
        model: the transformers module.
        label_names: the label vocabulary (index = class).
        frozen: names of the parameters frozen because opacus cannot train them.
    """

    model: LayoutLMv3ForTokenClassification
    label_names: tuple[str, ...]
    frozen: tuple[str, ...] = field(default=())

    @property
    def config(self) -> LayoutLMv3Config:
        config: LayoutLMv3Config = self.model.config
        return config


def tiny_config(*, vocab_size: int = 512, max_seq_len: int = 64,
                hidden_dropout_prob: float = 0.1) -> dict[str, Any]:
    """A tiny from-scratch config (hidden 96, 2 layers, 2 heads, coordinate = shape = 16)."""
    return {"model_type": "layoutlmv3", "vocab_size": vocab_size, "hidden_size": 96,
            "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 192,
            "coordinate_size": 16, "shape_size": 16, "max_position_embeddings": max_seq_len + 2,
            "max_2d_position_embeddings": 1024, "visual_embed": False, "input_size": 64,
            "patch_size": 16, "hidden_dropout_prob": hidden_dropout_prob,
            "attention_probs_dropout_prob": hidden_dropout_prob, "pad_token_id": 1,
            "bos_token_id": 0, "eos_token_id": 2}


def validate_config(raw: Mapping[str, object],
                    label_names: tuple[str, ...]) -> LayoutLMv3Config:
    """An allow-listed, bounded :class:`LayoutLMv3Config` with the dataset's labels.

    Raises:
        InvalidSpecError: an unknown or out-of-bounds key, or inconsistent sizes.
    """
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        if key in _INT_KEYS:
            low, high = _INT_KEYS[key]
            if isinstance(value, bool) or not isinstance(value, int) \
                    or not low <= value <= high:
                raise InvalidSpecError(f"config key {key!r} must be an integer in "
                                       f"[{low}, {high}]")
        elif key in _FLOAT_KEYS:
            lo, hi = _FLOAT_KEYS[key]
            if value is None and key == "classifier_dropout":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not lo <= float(value) <= hi:
                raise InvalidSpecError(f"config key {key!r} must be a number in [{lo}, {hi}]")
        elif key in _BOOL_KEYS:
            if not isinstance(value, bool):
                raise InvalidSpecError(f"config key {key!r} must be a boolean")
        elif key not in _IGNORED_KEYS:
            raise InvalidSpecError(f"config key {key!r} is not allowed")
        if key not in _IGNORED_KEYS:
            kwargs[key] = value
    if raw.get("model_type", "layoutlmv3") != "layoutlmv3":
        raise InvalidSpecError("config model_type must be 'layoutlmv3'")
    arch = raw.get("architectures", [])
    if not isinstance(arch, list) or not set(arch) <= _ARCHITECTURES:
        raise InvalidSpecError(f"config architectures must be among {sorted(_ARCHITECTURES)}")
    act = raw.get("hidden_act", "gelu")
    if not isinstance(act, str) or act not in _ACTIVATIONS:
        raise InvalidSpecError(f"config hidden_act must be one of {sorted(_ACTIVATIONS)}")
    if raw.get("text_embed", True) is not True:
        raise InvalidSpecError("config text_embed must be true (KIE reads the words)")
    if not 1 <= len(label_names) <= 256:
        raise InvalidSpecError("between 1 and 256 labels are needed")
    config = LayoutLMv3Config(hidden_act=act,
                              id2label=dict(enumerate(label_names)),
                              label2id={n: i for i, n in enumerate(label_names)}, **kwargs)
    if config.hidden_size % config.num_attention_heads:
        raise InvalidSpecError("hidden_size must be a multiple of num_attention_heads")
    if 4 * config.coordinate_size + 2 * config.shape_size != config.hidden_size:
        raise InvalidSpecError("4 * coordinate_size + 2 * shape_size must equal hidden_size")
    special_ids(config)
    return config


def special_ids(config: LayoutLMv3Config) -> tuple[int, int, int]:
    """(pad, bos/CLS, eos/SEP) token ids of ``config``, each an int < vocab_size."""
    ids = (config.pad_token_id, config.bos_token_id, config.eos_token_id)
    out = tuple(i for i in ids if isinstance(i, int) and 0 <= i < config.vocab_size)
    if len(out) != 3:
        raise InvalidSpecError("pad/bos/eos token ids must be integers < vocab_size")
    return out[0], out[1], out[2]


def freeze_unsupported(model: LayoutLMv3ForTokenClassification) -> tuple[str, ...]:
    """Freeze the parameters opacus cannot train (module docstring); return their names."""
    frozen = []
    for name, param in model.named_parameters():
        if name.startswith(_VISUAL) or name.startswith(_REL_POS):
            param.requires_grad_(False)
            frozen.append(name)
    return tuple(frozen)


def build_kie_model(config: Mapping[str, object], label_names: tuple[str, ...], *,
                    seed: int = 0, check: bool = True) -> KieModel:
    """A randomly initialised model from ``config`` (validated), unsupported parts frozen.

    Args:
        seed: torch seed of the (public) initialisation.
        check: run :func:`check_dp_compatible` (opacus validator + per-sample smoke test).
    """
    cfg = validate_config(config, label_names)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LayoutLMv3ForTokenClassification(cfg)
    kie = KieModel(model, tuple(label_names), freeze_unsupported(model))
    if check:
        check_dp_compatible(kie)
    return kie


def _read_config(directory: Path) -> dict[str, object]:
    path = directory / "config.json"
    if not path.is_file() or path.stat().st_size > MAX_CONFIG_BYTES:
        raise InvalidSpecError("the model directory needs a config.json under 1 MiB")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidSpecError("config.json is not valid JSON") from exc
    if not isinstance(raw, dict):
        raise InvalidSpecError("config.json must be a JSON object")
    return raw


def load_kie_model(directory: str | Path, label_names: tuple[str, ...], *,
                   check: bool = True) -> KieModel:
    """A model from ``config.json`` + ``model.safetensors`` (safetensors only).

    Keys may carry the ``layoutlmv3.`` prefix or not (a bare ``LayoutLMv3Model``); a
    classifier whose shape does not match ``label_names`` is left out and initialised anew
    (fine-tuning a pretrained base for new labels). Any other missing or unexpected
    tensor is an error.

    Raises:
        InvalidSpecError: a missing/oversized file, a refused config, mismatching tensors.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    directory = Path(directory)
    kie = build_kie_model(_read_config(directory), label_names, check=False)
    weights = directory / "model.safetensors"
    if not weights.is_file() or weights.stat().st_size > MAX_WEIGHTS_BYTES:
        raise InvalidSpecError("the model directory needs a model.safetensors (no pickle)")
    try:
        tensors = load_file(str(weights))
    except (SafetensorError, OSError) as exc:
        raise InvalidSpecError("model.safetensors cannot be read") from exc
    own = kie.model.state_dict()
    state = {}
    for key, value in tensors.items():
        name = key if key.startswith(("layoutlmv3.", "classifier.")) else f"layoutlmv3.{key}"
        if name.startswith("classifier.") and name in own and own[name].shape != value.shape:
            continue
        state[name] = value
    missing, unexpected = kie.model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.startswith("classifier.")]
    if missing or unexpected:
        raise InvalidSpecError(f"model.safetensors does not match config.json: "
                               f"missing {sorted(missing)[:3]}, unexpected "
                               f"{sorted(unexpected)[:3]}")
    if check:
        check_dp_compatible(kie)
    return kie


def save_kie_model(kie: KieModel, directory: str | Path,
                   metadata: Mapping[str, object] | None = None) -> Path:
    """Write ``config.json``, ``model.safetensors`` and ``dpsynth_kie.json`` (label names,
    frozen parameters and ``metadata``) into ``directory``; return it."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = {k: v for k, v in kie.config.to_dict().items()
              if k in _INT_KEYS or k in _FLOAT_KEYS or k in _BOOL_KEYS
              or k in {"model_type", "hidden_act"}}
    config["architectures"] = ["LayoutLMv3ForTokenClassification"]
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    state = {k: v.detach().to("cpu").contiguous() for k, v in kie.model.state_dict().items()}
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    meta = {"format": "dpsynth-kie-model/1", "label_names": list(kie.label_names),
            "frozen_parameters": list(kie.frozen), **(metadata or {})}
    (directory / "dpsynth_kie.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
    return directory


def check_dp_compatible(kie: KieModel, *, seq_len: int = 8) -> None:
    """opacus' ModuleValidator (inside :class:`DpSgdEngine`) plus a smoke test: one
    two-example micro-batch must give every trainable parameter a finite per-example
    gradient. Nothing is released or applied; the model is left unwrapped.

    Raises:
        InvalidSpecError: if the model cannot be trained under opacus.
    """
    model = kie.model
    trainable = [p for p in model.parameters() if p.requires_grad]
    cfg = kie.config
    try:
        engine = DpSgdEngine(model, torch.optim.SGD(trainable, lr=0.0), noise_multiplier=1.0,
                             max_grad_norm=1.0, expected_batch_size=1)
    except ValueError as exc:
        raise InvalidSpecError(f"the KIE model is not DP-compatible: {exc}") from exc
    try:
        device = next(model.parameters()).device
        pad, bos, eos = special_ids(cfg)
        ids = torch.full((2, seq_len), pad, dtype=torch.long, device=device)
        ids[:, 0], ids[:, 1:-1], ids[:, -1] = bos, eos + 1, eos
        bbox = torch.zeros((2, seq_len, 4), dtype=torch.long, device=device)
        logits = engine.module(input_ids=ids % cfg.vocab_size, bbox=bbox,
                               attention_mask=torch.ones_like(ids)).logits
        with warnings.catch_warnings():
            # integer inputs never require grad: opacus' full backward hook warns, expected
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            logits.float().square().sum().backward()
        for p in engine.params:
            gs = getattr(p, "grad_sample", None)
            if not isinstance(gs, torch.Tensor) or gs.shape[0] != 2 \
                    or not bool(torch.isfinite(gs).all()):
                raise InvalidSpecError("a trainable parameter got no per-example gradient "
                                       "under opacus")
    finally:
        engine.close()
        model.zero_grad(set_to_none=True)
