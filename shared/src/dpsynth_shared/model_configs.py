"""The allow-list of diffusers components a dpsynth model may contain, and their size limits.

A dpsynth model folder is a diffusers ``save_pretrained`` layout plus dpsynth's own files::

    vae/config.json                  AutoencoderKL
    unet/config.json                 UNet2DConditionModel | UNet2DModel
    denoisers/<key>/unet/config.json (per-label bundles: one denoiser per class)
    scheduler/scheduler_config.json  DDPMScheduler | DDIMScheduler | DPMSolverMultistepScheduler
    class_embedder/config.json       dpsynth's class-token table (not a diffusers class)

Every config is checked here before any library reads it: the class must be on the
allow-list, every key must be a constructor argument of that class (or diffusers' own
``_class_name`` / ``_diffusers_version`` / ``_name_or_path``), every value must have the
expected type and lie within the limits, block types must be diffusers built-in blocks that
dpsynth supports, and the estimated parameter count must stay under a bound. Anything that
points at custom or remote code (``auto_map``, ``trust_remote_code``, a ``_class_name`` given
as a ``[module, class]`` pair) is refused.

This module is pure Python (no torch, no diffusers): the api checks uploads with it and the
ML core checks ``preset: custom`` architectures with it before building a model.

Example::

    check_config("unet", {"_class_name": "UNet2DModel", "block_out_channels": [32, 64], ...})
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: The largest config file accepted (bytes).
MAX_CONFIG_BYTES = 64 * 1024

#: Keys diffusers itself writes into every config it saves.
DIFFUSERS_META_KEYS = ("_class_name", "_diffusers_version", "_name_or_path")

#: Keys that load code from outside diffusers; never accepted.
REMOTE_CODE_KEYS = ("auto_map", "trust_remote_code", "custom_pipeline", "_custom_pipeline",
                    "custom_revision", "_auto_class")

VAE_CLASSES = ("AutoencoderKL",)
UNET_CLASSES = ("UNet2DConditionModel", "UNet2DModel")
SCHEDULER_CLASSES = ("DDPMScheduler", "DDIMScheduler", "DPMSolverMultistepScheduler")
#: dpsynth's own class-token table: a config without ``_class_name``.
CLASS_EMBEDDER = "ClassEmbedder"

#: component -> the classes it may be.
COMPONENT_CLASSES: dict[str, tuple[str, ...]] = {
    "vae": VAE_CLASSES,
    "unet": UNET_CLASSES,
    "scheduler": SCHEDULER_CLASSES,
    "class_embedder": (CLASS_EMBEDDER,),
}

#: component -> the name of its config file inside its folder.
CONFIG_FILES: dict[str, str] = {
    "vae": "config.json",
    "unet": "config.json",
    "scheduler": "scheduler_config.json",
    "class_embedder": "config.json",
}

ACTIVATIONS = ("silu", "swish", "mish", "gelu", "relu")

UNET_COND_DOWN_BLOCKS = ("DownBlock2D", "CrossAttnDownBlock2D", "AttnDownBlock2D")
UNET_COND_UP_BLOCKS = ("UpBlock2D", "CrossAttnUpBlock2D", "AttnUpBlock2D")
UNET_COND_MID_BLOCKS = ("UNetMidBlock2DCrossAttn", "UNetMidBlock2D", None)
UNET_DOWN_BLOCKS = ("DownBlock2D", "AttnDownBlock2D")
UNET_UP_BLOCKS = ("UpBlock2D", "AttnUpBlock2D")
UNET_MID_BLOCKS = ("UNetMidBlock2D", None)
VAE_DOWN_BLOCKS = ("DownEncoderBlock2D", "AttnDownEncoderBlock2D")
VAE_UP_BLOCKS = ("UpDecoderBlock2D", "AttnUpDecoderBlock2D")

_VERSION = re.compile(r"^\d{1,3}\.\d{1,3}\.\d{1,3}([.\-+]?[A-Za-z0-9.]{0,16})?$")
_KEY_SEGMENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}$")


class ModelConfigError(ValueError):
    """A model config is refused; the message says which file, key and limit.

    Attributes:
        component: ``vae`` / ``unet`` / ``scheduler`` / ``class_embedder`` (or None).
        key: the offending config key, when one is to blame.
    """

    def __init__(self, message: str, *, component: str | None = None,
                 key: str | None = None) -> None:
        super().__init__(message)
        self.component = component
        self.key = key


@dataclass(frozen=True)
class ConfigLimits:
    """Size limits of a model's configs (the defaults are generous for a 30M-parameter
    ``base`` model and far below what would exhaust a worker)."""

    max_config_bytes: int = MAX_CONFIG_BYTES
    max_blocks: int = 6
    max_channels: int = 2048
    max_io_channels: int = 16
    max_image_channels: int = 4
    max_layers_per_block: int = 8
    max_transformer_layers: int = 10
    max_attention_heads: int = 64
    max_attention_head_dim: int = 512
    max_cross_attention_dim: int = 4096
    max_latent_size: int = 256
    max_image_size: int = 1024
    max_train_timesteps: int = 10_000
    max_classes: int = 10_000
    max_unet_parameters: int = 400_000_000
    max_vae_parameters: int = 150_000_000


DEFAULT_LIMITS = ConfigLimits()


# --- value validators ------------------------------------------------------------------

Check = Callable[[Any], str | None]  # None = fine, else what was expected


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _int(lo: int, hi: int) -> Check:
    def check(v: Any) -> str | None:
        return None if _is_int(v) and lo <= v <= hi else f"an integer in [{lo}, {hi}]"
    return check


def _float(lo: float, hi: float, *, allow_inf: bool = False) -> Check:
    def check(v: Any) -> str | None:
        ok = _is_num(v) and (math.isfinite(v) or (allow_inf and not math.isnan(v)))
        ok = ok and (lo <= v <= hi or (allow_inf and math.isinf(v)))
        return None if ok else f"a finite number in [{lo}, {hi}]"
    return check


def _bool(v: Any) -> str | None:
    return None if isinstance(v, bool) else "true or false"


def _choice(*values: Any) -> Check:
    def check(v: Any) -> str | None:
        ok = any(v is c or (type(v) is type(c) and v == c) for c in values)
        return None if ok else "one of " + ", ".join(json.dumps(c) for c in values)
    return check


def _text(max_len: int) -> Check:
    def check(v: Any) -> str | None:
        return None if isinstance(v, str) and len(v) <= max_len else \
            f"a string of at most {max_len} characters"
    return check


def _opt(inner: Check) -> Check:
    def check(v: Any) -> str | None:
        if v is None:
            return None
        why = inner(v)
        return None if why is None else f"null or {why}"
    return check


def _seq(item: Check, max_len: int, min_len: int = 1) -> Check:
    def check(v: Any) -> str | None:
        if not isinstance(v, list | tuple) or not min_len <= len(v) <= max_len:
            return f"a list of {min_len} to {max_len} items"
        for i, x in enumerate(v):
            why = item(x)
            if why is not None:
                return f"a list whose items are {why} (item {i} is {_show(x)})"
        return None
    return check


def _either(*checks: Check) -> Check:
    def check(v: Any) -> str | None:
        whys = [c(v) for c in checks]
        return None if any(w is None for w in whys) else " or ".join(w for w in whys if w)
    return check


def _show(v: Any) -> str:
    text = json.dumps(v, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _version(v: Any) -> str | None:
    return None if isinstance(v, str) and _VERSION.match(v) else "a version like \"0.30.0\""


# --- per-class key schemas -------------------------------------------------------------

def _meta() -> dict[str, Check]:
    return {"_class_name": _text(64), "_diffusers_version": _version,
            "_name_or_path": _text(1024)}


def _unet_common(lim: ConfigLimits) -> dict[str, Check]:
    blocks, ch = lim.max_blocks, lim.max_channels
    return {
        **_meta(),
        "sample_size": _opt(_either(_int(1, lim.max_latent_size),
                                    _seq(_int(1, lim.max_latent_size), 2, 2))),
        "in_channels": _int(1, lim.max_io_channels),
        "out_channels": _int(1, lim.max_io_channels),
        "center_input_sample": _bool,
        "flip_sin_to_cos": _bool,
        "freq_shift": _int(0, 16),
        "block_out_channels": _seq(_int(1, ch), blocks),
        "downsample_padding": _int(0, 2),
        "mid_block_scale_factor": _float(0, 16),
        "dropout": _float(0, 1),
        "act_fn": _choice(*ACTIVATIONS),
        "norm_eps": _float(1e-12, 1),
        "resnet_time_scale_shift": _choice("default", "scale_shift"),
        "class_embed_type": _choice(None, "timestep", "identity"),
        "num_class_embeds": _opt(_int(1, lim.max_classes + 1)),
        "time_embedding_dim": _opt(_int(1, 4 * ch)),
    }


def _unet_cond_schema(lim: ConfigLimits) -> dict[str, Check]:
    blocks, ch = lim.max_blocks, lim.max_channels
    cross = _int(1, lim.max_cross_attention_dim)
    heads = _int(1, lim.max_attention_heads)
    layers = _int(1, lim.max_layers_per_block)
    tlayers = _int(1, lim.max_transformer_layers)
    return {
        **_unet_common(lim),
        "down_block_types": _seq(_choice(*UNET_COND_DOWN_BLOCKS), blocks),
        "mid_block_type": _choice(*UNET_COND_MID_BLOCKS),
        "up_block_types": _seq(_choice(*UNET_COND_UP_BLOCKS), blocks),
        "only_cross_attention": _either(_bool, _seq(_bool, blocks)),
        "layers_per_block": _either(layers, _seq(layers, blocks)),
        "norm_num_groups": _opt(_int(1, ch)),
        "cross_attention_dim": _either(cross, _seq(cross, blocks)),
        "transformer_layers_per_block": _either(tlayers, _seq(tlayers, blocks)),
        "reverse_transformer_layers_per_block": _choice(None),
        "encoder_hid_dim": _opt(_int(1, lim.max_cross_attention_dim)),
        "encoder_hid_dim_type": _choice(None, "text_proj"),
        # UNet2DConditionModel reads attention_head_dim as the number of heads.
        "attention_head_dim": _either(heads, _seq(heads, blocks)),
        "num_attention_heads": _choice(None),
        "dual_cross_attention": _choice(False),
        "use_linear_projection": _bool,
        "addition_embed_type": _choice(None),
        "addition_time_embed_dim": _opt(_int(1, 4 * ch)),
        "upcast_attention": _bool,
        "resnet_skip_time_act": _bool,
        "resnet_out_scale_factor": _float(0, 16),
        "time_embedding_type": _choice("positional", "fourier"),
        "time_embedding_act_fn": _opt(_choice(*ACTIVATIONS)),
        "timestep_post_act": _opt(_choice(*ACTIVATIONS)),
        "time_cond_proj_dim": _opt(_int(1, 4 * ch)),
        "conv_in_kernel": _choice(1, 3, 5, 7),
        "conv_out_kernel": _choice(1, 3, 5, 7),
        "projection_class_embeddings_input_dim": _opt(_int(1, 4 * ch)),
        "attention_type": _choice("default"),
        "class_embeddings_concat": _bool,
        "mid_block_only_cross_attention": _opt(_bool),
        "cross_attention_norm": _choice(None),
        "addition_embed_type_num_heads": _int(1, lim.max_attention_heads),
    }


def _unet_schema(lim: ConfigLimits) -> dict[str, Check]:
    return {
        **_unet_common(lim),
        "time_embedding_type": _choice("positional", "fourier", "learned"),
        "down_block_types": _seq(_choice(*UNET_DOWN_BLOCKS), lim.max_blocks),
        "mid_block_type": _choice(*UNET_MID_BLOCKS),
        "up_block_types": _seq(_choice(*UNET_UP_BLOCKS), lim.max_blocks),
        "layers_per_block": _int(1, lim.max_layers_per_block),
        "downsample_type": _choice("conv", "resnet"),
        "upsample_type": _choice("conv", "resnet"),
        # UNet2DModel reads attention_head_dim as the size of one head.
        "attention_head_dim": _opt(_int(1, lim.max_attention_head_dim)),
        "norm_num_groups": _int(1, lim.max_channels),
        "attn_norm_num_groups": _opt(_int(1, lim.max_channels)),
        "add_attention": _bool,
        "num_train_timesteps": _opt(_int(1, lim.max_train_timesteps)),
    }


def _vae_schema(lim: ConfigLimits) -> dict[str, Check]:
    blocks, ch = lim.max_blocks, lim.max_channels
    return {
        **_meta(),
        "in_channels": _int(1, lim.max_image_channels),
        "out_channels": _int(1, lim.max_image_channels),
        "down_block_types": _seq(_choice(*VAE_DOWN_BLOCKS), blocks),
        "up_block_types": _seq(_choice(*VAE_UP_BLOCKS), blocks),
        "block_out_channels": _seq(_int(1, ch), blocks),
        "layers_per_block": _int(1, lim.max_layers_per_block),
        "act_fn": _choice(*ACTIVATIONS),
        "latent_channels": _int(1, lim.max_io_channels),
        "norm_num_groups": _int(1, ch),
        "sample_size": _either(_int(1, lim.max_image_size),
                               _seq(_int(1, lim.max_image_size), 2, 2)),
        "scaling_factor": _float(1e-6, 1e3),
        "shift_factor": _opt(_float(-1e3, 1e3)),
        "latents_mean": _opt(_seq(_float(-1e3, 1e3), lim.max_io_channels)),
        "latents_std": _opt(_seq(_float(1e-9, 1e3), lim.max_io_channels)),
        "force_upcast": _bool,
        "use_quant_conv": _bool,
        "use_post_quant_conv": _bool,
        "mid_block_add_attention": _bool,
    }


def _scheduler_schema(lim: ConfigLimits) -> dict[str, Check]:
    # One schema for the three schedulers: diffusers keeps the keys of a compatible
    # scheduler in the config ("hidden" keys) when one is made from another's config.
    return {
        **_meta(),
        "num_train_timesteps": _int(1, lim.max_train_timesteps),
        "beta_start": _float(0, 1),
        "beta_end": _float(0, 1),
        "beta_schedule": _choice("linear", "scaled_linear", "squaredcos_cap_v2", "sigmoid"),
        "trained_betas": _opt(_seq(_float(0, 1), lim.max_train_timesteps)),
        "variance_type": _opt(_choice("fixed_small", "fixed_small_log", "fixed_large",
                                      "fixed_large_log", "learned", "learned_range")),
        "clip_sample": _bool,
        "clip_sample_range": _float(0, 1e3),
        "set_alpha_to_one": _bool,
        "steps_offset": _int(0, 1000),
        "prediction_type": _choice("epsilon", "sample", "v_prediction"),
        "thresholding": _bool,
        "dynamic_thresholding_ratio": _float(0, 1),
        "sample_max_value": _float(0, 1e3),
        "timestep_spacing": _choice("linspace", "leading", "trailing"),
        "rescale_betas_zero_snr": _bool,
        "solver_order": _int(1, 3),
        "algorithm_type": _choice("dpmsolver", "dpmsolver++", "sde-dpmsolver",
                                  "sde-dpmsolver++"),
        "solver_type": _choice("midpoint", "heun"),
        "lower_order_final": _bool,
        "euler_at_final": _bool,
        "use_karras_sigmas": _bool,
        "use_exponential_sigmas": _bool,
        "use_beta_sigmas": _bool,
        "use_lu_lambdas": _bool,
        "use_flow_sigmas": _bool,
        "flow_shift": _float(0, 1e3),
        "final_sigmas_type": _choice("zero", "sigma_min"),
        "lambda_min_clipped": _float(-1e6, 1e6, allow_inf=True),
        "use_dynamic_shifting": _bool,
        "time_shift_type": _choice("exponential"),
    }


def _class_embedder_schema(lim: ConfigLimits) -> dict[str, Check]:
    return {"num_embeddings": _int(2, lim.max_classes + 1),
            "embedding_dim": _int(1, lim.max_cross_attention_dim),
            "null_class": _int(1, lim.max_classes)}


def allowed_keys(class_name: str, limits: ConfigLimits = DEFAULT_LIMITS) -> frozenset[str]:
    """The keys a config of ``class_name`` may carry.

    Raises:
        ModelConfigError: if the class is not on the allow-list.
    """
    return frozenset(_schema(class_name, limits, component=None))


def _schema(class_name: str, lim: ConfigLimits, *, component: str | None) -> dict[str, Check]:
    if class_name == "UNet2DConditionModel":
        return _unet_cond_schema(lim)
    if class_name == "UNet2DModel":
        return _unet_schema(lim)
    if class_name == "AutoencoderKL":
        return _vae_schema(lim)
    if class_name in SCHEDULER_CLASSES:
        return _scheduler_schema(lim)
    if class_name == CLASS_EMBEDDER:
        return _class_embedder_schema(lim)
    raise ModelConfigError(f"class {class_name!r} is not on the allow-list", component=component)


# --- public checks ---------------------------------------------------------------------

def parse_config(data: bytes, *, component: str,
                 limits: ConfigLimits = DEFAULT_LIMITS) -> dict[str, Any]:
    """Parse a config file strictly: size bound, UTF-8 JSON object, no duplicate keys, no NaN.

    ``Infinity`` / ``-Infinity`` are read (diffusers writes ``-Infinity`` for
    DPMSolverMultistepScheduler's ``lambda_min_clipped``); the schema decides where they fit.

    Raises:
        ModelConfigError: the file is too large or not a JSON object.
    """
    if len(data) > limits.max_config_bytes:
        raise ModelConfigError(f"the {component} config is {len(data)} bytes, over the limit "
                               f"of {limits.max_config_bytes} bytes", component=component)

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in items:
            if k in out:
                raise ModelConfigError(f"the {component} config repeats the key {k!r}",
                                       component=component, key=k)
            out[k] = v
        return out

    def constant(name: str) -> float:
        if name == "NaN":
            raise ModelConfigError(f"the {component} config contains NaN", component=component)
        return float(name.replace("Infinity", "inf"))

    try:
        value = json.loads(data.decode("utf-8"), object_pairs_hook=pairs,
                           parse_constant=constant)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ModelConfigError(f"the {component} config is not valid UTF-8 JSON",
                               component=component) from exc
    if not isinstance(value, dict):
        raise ModelConfigError(f"the {component} config must be a JSON object",
                               component=component)
    return value


def config_class(component: str, config: Mapping[str, Any], *,
                 class_name: str | None = None) -> str:
    """The class a config declares for ``component``, checked against the allow-list.

    Args:
        component: ``vae`` / ``unet`` / ``scheduler`` / ``class_embedder``.
        config: the parsed config.
        class_name: the class the caller expects (e.g. a custom architecture's
            ``unet_class``); required when the config has no ``_class_name``.

    Raises:
        ModelConfigError: unknown component, class outside the allow-list, or a mismatch.
    """
    if component not in COMPONENT_CLASSES:
        raise ModelConfigError(f"unknown model component {component!r} (expected one of "
                               f"{', '.join(COMPONENT_CLASSES)})", component=component)
    allowed = COMPONENT_CLASSES[component]
    if component == "class_embedder":
        if "_class_name" in config:
            raise ModelConfigError("the class_embedder config must not name a class",
                                   component=component, key="_class_name")
        return CLASS_EMBEDDER
    declared = config.get("_class_name")
    if declared is not None and not isinstance(declared, str):
        raise ModelConfigError(f"the {component} config's _class_name must be a class name, "
                               f"not {_show(declared)} (custom code is refused)",
                               component=component, key="_class_name")
    if declared is not None and class_name is not None and declared != class_name:
        raise ModelConfigError(f"the {component} config names {declared!r}, expected "
                               f"{class_name!r}", component=component, key="_class_name")
    name = declared if declared is not None else class_name
    if name is None:
        raise ModelConfigError(f"the {component} config has no _class_name",
                               component=component, key="_class_name")
    if name not in allowed:
        raise ModelConfigError(f"class {name!r} is not allowed for {component} (allowed: "
                               f"{', '.join(allowed)})", component=component, key="_class_name")
    return name


def check_config(component: str, config: Mapping[str, Any], *, class_name: str | None = None,
                 limits: ConfigLimits = DEFAULT_LIMITS) -> None:
    """Refuse a component config outside the allow-list or the limits.

    Args:
        component: ``vae``, ``unet``, ``scheduler`` or ``class_embedder``.
        config: the parsed config (a diffusers ``config.json``, or constructor keyword
            arguments of a custom architecture).
        class_name: the expected class when ``config`` has no ``_class_name``.
        limits: the size limits.

    Raises:
        ModelConfigError: with a message naming the component, the key and the limit.
    """
    if not isinstance(config, Mapping):
        raise ModelConfigError(f"the {component} config must be a JSON object",
                               component=component)
    for key in config:
        if not isinstance(key, str):
            raise ModelConfigError(f"the {component} config has a non-string key",
                                   component=component)
        if key in REMOTE_CODE_KEYS or key.startswith("auto_map"):
            raise ModelConfigError(f"the {component} config has {key!r}: custom or remote "
                                   "code is refused", component=component, key=key)
    name = config_class(component, config, class_name=class_name)
    schema = _schema(name, limits, component=component)
    unknown = sorted(k for k in config if k not in schema)
    if unknown:
        raise ModelConfigError(f"the {component} config ({name}) has unknown key(s) "
                               f"{', '.join(map(repr, unknown[:5]))}: only the constructor "
                               f"arguments of {name} are accepted", component=component,
                               key=unknown[0])
    for key, value in config.items():
        why = schema[key](value)
        if why is not None:
            raise ModelConfigError(f"the {component} config ({name}) has {key} = "
                                   f"{_show(value)}; expected {why}", component=component,
                                   key=key)
    _STRUCTURE[name](component, config, limits)


def component_of(path: str) -> str | None:
    """The component whose config file ``path`` is, in a model folder; None for other files.

    ``vae/config.json`` -> ``vae``; ``denoisers/3/unet/config.json`` -> ``unet``;
    ``scheduler/scheduler_config.json`` -> ``scheduler``.
    """
    parts = path.split("/")
    if len(parts) == 4 and parts[0] == "denoisers" and _KEY_SEGMENT.match(parts[1]):
        parts = parts[2:]
    if len(parts) != 2:
        return None
    folder, filename = parts
    if folder in CONFIG_FILES and CONFIG_FILES[folder] == filename:
        return folder
    return None


# --- structure checks (lengths, divisibility, heads, parameter estimate) ---------------

def _fail(component: str, msg: str, key: str | None = None) -> ModelConfigError:
    return ModelConfigError(f"the {component} config {msg}", component=component, key=key)


def _per_block(config: Mapping[str, Any], key: str, default: Any, n: int,
               component: str) -> list[Any]:
    value = config.get(key, default)
    if isinstance(value, list | tuple):
        if len(value) != n:
            raise _fail(component, f"has {len(value)} values for {key}, one per block "
                        f"({n}) expected", key)
        return list(value)
    return [value] * n


def _blocks(config: Mapping[str, Any], component: str, default_down: Sequence[str],
            default_up: Sequence[str], default_channels: Sequence[int]) -> tuple[
                list[str], list[str], list[int]]:
    down = list(config.get("down_block_types", default_down))
    up = list(config.get("up_block_types", default_up))
    channels = list(config.get("block_out_channels", default_channels))
    if not len(down) == len(up) == len(channels):
        raise _fail(component, f"has {len(down)} down blocks, {len(up)} up blocks and "
                    f"{len(channels)} block_out_channels; they must be equal",
                    "block_out_channels")
    return down, up, channels


def _check_groups(component: str, groups: int | None, channels: Sequence[int],
                  key: str = "norm_num_groups") -> None:
    if groups is None:
        return
    for c in channels:
        if c % groups:
            raise _fail(component, f"has {key} = {groups}, which does not divide the block "
                        f"width {c}", key)


def _check_sample(component: str, config: Mapping[str, Any]) -> None:
    size = config.get("sample_size")
    sizes = size if isinstance(size, list | tuple) else [size]
    if any(s is not None and s < 1 for s in sizes):
        raise _fail(component, "has a sample_size below 1", "sample_size")


def _check_parameters(component: str, name: str, count: int, bound: int) -> None:
    if count > bound:
        raise _fail(component, f"({name}) describes about {count:,} parameters, over the limit "
                    f"of {bound:,}", "block_out_channels")


def _structure_unet_cond(component: str, config: Mapping[str, Any], lim: ConfigLimits) -> None:
    d = _UNET_COND_DEFAULTS
    down, up, channels = _blocks(config, component, d["down_block_types"],
                                 d["up_block_types"], d["block_out_channels"])
    n = len(channels)
    heads = _per_block(config, "attention_head_dim", d["attention_head_dim"], n, component)
    _per_block(config, "cross_attention_dim", d["cross_attention_dim"], n, component)
    _per_block(config, "layers_per_block", d["layers_per_block"], n, component)
    _per_block(config, "transformer_layers_per_block", 1, n, component)
    _per_block(config, "only_cross_attention", False, n, component)
    groups = config.get("norm_num_groups", d["norm_num_groups"])
    _check_groups(component, groups, channels)
    attn = [d_ or u_ for d_, u_ in zip((k.startswith(("CrossAttn", "Attn")) for k in down),
                                        (k.startswith(("CrossAttn", "Attn")) for k in up[::-1]),
                                        strict=True)]
    for c, h, has_attention in zip(channels, heads, attn, strict=True):
        if has_attention and (c % h or c // h > lim.max_attention_head_dim):
            raise _fail(component, f"splits width {c} into {h} attention heads; the width must "
                        f"be a multiple of the head count with heads of at most "
                        f"{lim.max_attention_head_dim} channels", "attention_head_dim")
    if config.get("class_embed_type") == "identity":
        raise _fail(component, "uses class_embed_type 'identity', which needs class labels "
                    "already embedded; dpsynth does not support it", "class_embed_type")
    if config.get("encoder_hid_dim_type") == "text_proj" and config.get("encoder_hid_dim") is None:
        raise _fail(component, "sets encoder_hid_dim_type without encoder_hid_dim",
                    "encoder_hid_dim")
    _check_sample(component, config)
    _check_parameters(component, "UNet2DConditionModel", estimate_parameters(
        "UNet2DConditionModel", config), lim.max_unet_parameters)


def _structure_unet(component: str, config: Mapping[str, Any], lim: ConfigLimits) -> None:
    d = _UNET_DEFAULTS
    down, up, channels = _blocks(config, component, d["down_block_types"],
                                 d["up_block_types"], d["block_out_channels"])
    _check_groups(component, config.get("norm_num_groups", 32), channels)
    _check_groups(component, config.get("attn_norm_num_groups"), channels,
                  "attn_norm_num_groups")
    head_dim = config.get("attention_head_dim", 8)
    if head_dim is not None and any(b.startswith("Attn") for b in [*down, *up]):
        for c in channels:
            if c % head_dim or c // head_dim > lim.max_attention_heads:
                raise _fail(component, f"splits width {c} into heads of {head_dim} channels; "
                            f"the width must be a multiple of the head size with at most "
                            f"{lim.max_attention_heads} heads", "attention_head_dim")
    if config.get("time_embedding_type") == "learned" and not config.get("num_train_timesteps"):
        raise _fail(component, "uses a learned time embedding without num_train_timesteps",
                    "num_train_timesteps")
    if config.get("class_embed_type") == "identity":
        raise _fail(component, "uses class_embed_type 'identity', which needs class labels "
                    "already embedded; dpsynth does not support it", "class_embed_type")
    _check_sample(component, config)
    _check_parameters(component, "UNet2DModel", estimate_parameters("UNet2DModel", config),
                      lim.max_unet_parameters)


def _structure_vae(component: str, config: Mapping[str, Any], lim: ConfigLimits) -> None:
    _, _, channels = _blocks(config, component, ("DownEncoderBlock2D",),
                             ("UpDecoderBlock2D",), (64,))
    _check_groups(component, config.get("norm_num_groups", 32), channels)
    latent = config.get("latent_channels", 4)
    for key in ("latents_mean", "latents_std"):
        value = config.get(key)
        if value is not None and len(value) != latent:
            raise _fail(component, f"has {len(value)} values for {key}, one per latent "
                        f"channel ({latent}) expected", key)
    _check_sample(component, config)
    _check_parameters(component, "AutoencoderKL", estimate_parameters("AutoencoderKL", config),
                      lim.max_vae_parameters)


def _structure_scheduler(component: str, config: Mapping[str, Any], lim: ConfigLimits) -> None:
    start, end = config.get("beta_start", 1e-4), config.get("beta_end", 0.02)
    if not 0 < start < end < 1:
        raise _fail(component, f"has beta_start = {start} and beta_end = {end}; "
                    "0 < beta_start < beta_end < 1 is required", "beta_start")
    betas = config.get("trained_betas")
    steps = config.get("num_train_timesteps", 1000)
    if betas is not None and len(betas) != steps:
        raise _fail(component, f"has {len(betas)} trained_betas for {steps} "
                    "num_train_timesteps", "trained_betas")


def _structure_class_embedder(component: str, config: Mapping[str, Any],
                              lim: ConfigLimits) -> None:
    for key in ("num_embeddings", "embedding_dim", "null_class"):
        if key not in config:
            raise _fail(component, f"has no {key}", key)
    if config["null_class"] != config["num_embeddings"] - 1:
        raise _fail(component, "must have null_class = num_embeddings - 1 (the last row is "
                    "the guidance null class)", "null_class")


_STRUCTURE: dict[str, Callable[[str, Mapping[str, Any], ConfigLimits], None]] = {
    "UNet2DConditionModel": _structure_unet_cond,
    "UNet2DModel": _structure_unet,
    "AutoencoderKL": _structure_vae,
    "DDPMScheduler": _structure_scheduler,
    "DDIMScheduler": _structure_scheduler,
    "DPMSolverMultistepScheduler": _structure_scheduler,
    CLASS_EMBEDDER: _structure_class_embedder,
}


# --- parameter-count estimate (mirrors diffusers' module structure) --------------------

_UNET_COND_DEFAULTS: dict[str, Any] = {
    "down_block_types": ("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
    "up_block_types": ("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
    "block_out_channels": (320, 640, 1280, 1280), "layers_per_block": 2,
    "attention_head_dim": 8, "cross_attention_dim": 1280, "norm_num_groups": 32,
}
_UNET_DEFAULTS: dict[str, Any] = {
    "down_block_types": ("DownBlock2D",) + ("AttnDownBlock2D",) * 3,
    "up_block_types": ("AttnUpBlock2D",) * 3 + ("UpBlock2D",),
    "block_out_channels": (224, 448, 672, 896),
}


def _conv(cin: int, cout: int, k: int = 3) -> int:
    return cin * cout * k * k + cout


def _linear(cin: int, cout: int, bias: bool = True) -> int:
    return cin * cout + (cout if bias else 0)


def _resnet(cin: int, cout: int, temb: int | None, scale_shift: bool = False) -> int:
    n = 2 * cin + _conv(cin, cout) + 2 * cout + _conv(cout, cout)
    if temb:
        n += _linear(temb, 2 * cout if scale_shift else cout)
    if cin != cout:
        n += _conv(cin, cout, 1)
    return n


def _spatial_attention(c: int, heads: int, head_dim: int) -> int:
    inner = heads * head_dim
    return 2 * c + 3 * _linear(c, inner) + _linear(inner, c)


def _transformer(c: int, heads: int, layers: int, cross: int, only_cross: bool) -> int:
    inner = heads * (c // heads)
    n = 2 * c + _linear(c, inner) + _linear(inner, c)
    kv1 = cross if only_cross else inner
    per_layer = (2 * inner + inner * inner + 2 * kv1 * inner + _linear(inner, inner)
                 + 2 * inner + inner * inner + 2 * cross * inner + _linear(inner, inner)
                 + 2 * inner + _linear(inner, 8 * inner) + _linear(4 * inner, inner))
    return n + layers * per_layer


def _time_embedding(cfg: Mapping[str, Any], c0: int, *, cond: bool) -> tuple[int, int]:
    kind = cfg.get("time_embedding_type", "positional")
    temb = cfg.get("time_embedding_dim") or (2 if cond and kind == "fourier" else 4) * c0
    n = 0
    if kind == "fourier":
        if cond:
            n, t_in = temb // 2, temb
        else:
            n, t_in = c0, 2 * c0
    else:
        t_in = c0
        if kind == "learned":
            n = int(cfg.get("num_train_timesteps") or 0) * c0
    n += _linear(t_in, temb) + _linear(temb, temb)
    if cfg.get("time_cond_proj_dim"):
        n += _linear(int(cfg["time_cond_proj_dim"]), t_in, bias=False)
    class_type = cfg.get("class_embed_type")
    if class_type is None and cfg.get("num_class_embeds"):
        n += int(cfg["num_class_embeds"]) * temb
    elif class_type == "timestep":
        n += _linear(t_in, temb) + _linear(temb, temb)
    if cond and cfg.get("class_embeddings_concat"):
        temb *= 2
    return n, temb


def estimate_parameters(class_name: str, config: Mapping[str, Any]) -> int:
    """The parameter count a (checked) config describes, following diffusers' layers.

    Exact for the allow-listed block types with their default options; used to bound the
    size of a model before anything is built or loaded.
    """
    if class_name == "AutoencoderKL":
        return _vae_parameters(config)
    if class_name in UNET_CLASSES:
        return _unet_parameters(config, cond=class_name == "UNet2DConditionModel")
    if class_name == CLASS_EMBEDDER:
        return int(config.get("num_embeddings", 0)) * int(config.get("embedding_dim", 0))
    return 0


def _unet_parameters(cfg: Mapping[str, Any], *, cond: bool) -> int:
    d = _UNET_COND_DEFAULTS if cond else _UNET_DEFAULTS
    down = list(cfg.get("down_block_types", d["down_block_types"]))
    up = list(cfg.get("up_block_types", d["up_block_types"]))
    ch = [int(c) for c in cfg.get("block_out_channels", d["block_out_channels"])]
    n_blocks = len(ch)
    c0 = ch[0]
    in_ch = int(cfg.get("in_channels", 4 if cond else 3))
    out_ch = int(cfg.get("out_channels", 4 if cond else 3))
    k_in = int(cfg.get("conv_in_kernel", 3)) if cond else 3
    k_out = int(cfg.get("conv_out_kernel", 3)) if cond else 3
    ss = cfg.get("resnet_time_scale_shift", "default") == "scale_shift"
    n, temb = _time_embedding(cfg, c0, cond=cond)
    n += _conv(in_ch, c0, k_in)

    def as_list(key: str, default: Any) -> list[Any]:
        v = cfg.get(key, default)
        return list(v) if isinstance(v, list | tuple) else [v] * n_blocks

    layers = as_list("layers_per_block", d.get("layers_per_block", 2))
    if cond:
        heads = as_list("attention_head_dim", d["attention_head_dim"])
        cross = as_list("cross_attention_dim", d["cross_attention_dim"])
        tl = as_list("transformer_layers_per_block", 1)
        oc = as_list("only_cross_attention", False)
        if cfg.get("encoder_hid_dim") is not None:
            n += _linear(int(cfg["encoder_hid_dim"]), int(cross[0]))
    head_dim = cfg.get("attention_head_dim", 8) if not cond else None

    def attention(kind: str, c: int, i: int) -> int:
        if kind.startswith("CrossAttn"):
            return _transformer(c, int(heads[i]), int(tl[i]), int(cross[i]), bool(oc[i]))
        if kind.startswith("Attn"):
            hd = int(heads[i]) if cond else int(head_dim or c)
            return _spatial_attention(c, c // hd, hd)
        return 0

    def sampler(kind: str, kind_key: str, c: int) -> int:
        # UNet2DModel: only the attention blocks read downsample_type / upsample_type.
        if not cond and kind.startswith("Attn") and cfg.get(kind_key, "conv") == "resnet":
            return _resnet(c, c, temb, ss)
        return _conv(c, c)

    out = c0
    for i, kind in enumerate(down):
        cin, out = out, ch[i]
        for j in range(int(layers[i])):
            n += _resnet(cin if j == 0 else out, out, temb, ss) + attention(kind, out, i)
        if i < n_blocks - 1:
            n += sampler(kind, "downsample_type", out)
    mid = cfg.get("mid_block_type", "UNetMidBlock2DCrossAttn" if cond else "UNetMidBlock2D")
    cl = ch[-1]
    if mid == "UNetMidBlock2DCrossAttn":
        n += 2 * _resnet(cl, cl, temb, ss) + _transformer(cl, int(heads[-1]), int(tl[-1]),
                                                           int(cross[-1]), False)
    elif mid == "UNetMidBlock2D":
        if cond:  # UNet2DConditionModel builds it with num_layers=0 and no attention
            n += _resnet(cl, cl, temb, ss)
        else:
            n += 2 * _resnet(cl, cl, temb, ss)
            if cfg.get("add_attention", True):
                hd = int(head_dim or cl)
                n += _spatial_attention(cl, cl // hd, hd)
                if ss and cfg.get("attn_norm_num_groups") is None:
                    n -= 2 * cl  # diffusers drops the attention's group norm then
    rch = ch[::-1]
    rlayers = layers[::-1]
    out = rch[0]
    for i, kind in enumerate(up):
        prev, out = out, rch[i]
        cin = rch[min(i + 1, n_blocks - 1)]
        count = int(rlayers[i]) + 1
        bi = n_blocks - 1 - i
        for j in range(count):
            skip = cin if j == count - 1 else out
            res_in = prev if j == 0 else out
            n += _resnet(res_in + skip, out, temb, ss) + attention(kind, out, bi)
        if i < n_blocks - 1:
            n += sampler(kind, "upsample_type", out)
    n += 2 * c0 + _conv(c0, out_ch, k_out)
    return n


def _vae_parameters(cfg: Mapping[str, Any]) -> int:
    down = list(cfg.get("down_block_types", ("DownEncoderBlock2D",)))
    up = list(cfg.get("up_block_types", ("UpDecoderBlock2D",)))
    ch = [int(c) for c in cfg.get("block_out_channels", (64,))]
    layers = int(cfg.get("layers_per_block", 1))
    latent = int(cfg.get("latent_channels", 4))
    cin_img, cout_img = int(cfg.get("in_channels", 3)), int(cfg.get("out_channels", 3))
    mid_attn = bool(cfg.get("mid_block_add_attention", True))
    cl = ch[-1]

    def mid() -> int:
        return 2 * _resnet(cl, cl, None) + (_spatial_attention(cl, 1, cl) if mid_attn else 0)

    # encoder
    n = _conv(cin_img, ch[0])
    out = ch[0]
    for i, kind in enumerate(down):
        cin, out = out, ch[i]
        for j in range(layers):
            n += _resnet(cin if j == 0 else out, out, None)
            if kind.startswith("Attn"):
                n += _spatial_attention(out, 1, out)
        if i < len(ch) - 1:
            n += _conv(out, out)
    n += mid() + 2 * cl + _conv(cl, 2 * latent)
    # decoder
    n += _conv(latent, cl) + mid()
    rch = ch[::-1]
    out = rch[0]
    for i, kind in enumerate(up):
        prev, out = out, rch[i]
        for j in range(layers + 1):
            n += _resnet(prev if j == 0 else out, out, None)
            if kind.startswith("Attn"):
                n += _spatial_attention(out, 1, out)
        if i < len(ch) - 1:
            n += _conv(out, out)
    n += 2 * ch[0] + _conv(ch[0], cout_img)
    if cfg.get("use_quant_conv", True):
        n += _conv(2 * latent, 2 * latent, 1)
    if cfg.get("use_post_quant_conv", True):
        n += _conv(latent, latent, 1)
    return n


__all__ = [
    "COMPONENT_CLASSES",
    "CONFIG_FILES",
    "DEFAULT_LIMITS",
    "MAX_CONFIG_BYTES",
    "ConfigLimits",
    "ModelConfigError",
    "allowed_keys",
    "check_config",
    "component_of",
    "config_class",
    "estimate_parameters",
    "parse_config",
]
