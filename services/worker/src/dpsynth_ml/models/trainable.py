"""What a DP finetune trains: parameter selection by mode, and LoRA adapters (peft).

Modes (``FinetuneRecipe.trainable``), all over the UNet of the model:

* ``full``: every UNet parameter.
* ``attention``: every diffusers ``Attention`` module: self- and cross-attention
  (``attn1``/``attn2`` of a ``UNet2DConditionModel``'s transformer blocks, the ``attentions``
  of a ``UNet2DModel``), i.e. their Q/K/V/out projections and norms (DP-LDMs).
* ``output_attention``: the ``Attention`` modules under ``up_blocks`` only: the output-side
  attention that DP-LDMs found best.
* ``blocks``: the parameters under the UNet module-name prefixes of ``spec.blocks`` (e.g.
  ``up_blocks.1.attentions``, ``mid_block``, ``conv_out``); a prefix matches a module or
  parameter name exactly or at a ``.`` boundary.
* ``lora``: LoRA adapters (peft) of rank ``lora_rank`` and scale ``lora_alpha / lora_rank``
  (alpha defaults to the rank) on the ``to_q``, ``to_k``, ``to_v`` and ``to_out.0``
  projections of every ``Attention`` module; only the adapters' A and B matrices train
  (DP-LoRA, DP-LDMs §5.4). The released model has the adapters merged into the weights.

The class embedder trains along when ``train_embedder`` is True, or, when it is None, iff
there is no ``class_map`` (new labels must be learnt). It is never selected by a mode: for a
``UNet2DModel`` its table ``unet.class_embedding`` is left to ``train_embedder`` as well.

Names are those of :class:`dpsynth_ml.models.architectures.ConditionalDenoiser` (``unet.…`` and
``class_embedder.weight``), which is what the optimizer state and ``trainer_state.json``
record. :func:`trainable_parameter_names` is pure: it reads module names and shapes only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch
from diffusers.models.attention_processor import Attention
from torch import nn

from dpsynth_ml.spec import InvalidSpecError, Trainable

if TYPE_CHECKING:
    from diffusers.configuration_utils import ConfigMixin

    from dpsynth_ml.models.architectures import ModelBundle
    from dpsynth_ml.spec import FinetuneRecipe

#: Projections of an Attention module that get LoRA adapters.
LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0")
#: peft's name of the one adapter dpsynth uses.
ADAPTER = "default"


class _LoadResult(Protocol):
    """What peft's ``set_peft_model_state_dict`` returns (torch's ``_IncompatibleKeys``)."""

    missing_keys: list[str]
    unexpected_keys: list[str]


class _DeltaWeight(Protocol):
    """A concrete peft LoRA layer: its update (alpha / r) B A for one adapter."""

    def get_delta_weight(self, adapter: str) -> torch.Tensor: ...


_UNET = "unet."
_EMBEDDER = "class_embedder.weight"
_UNET2D_EMBEDDER = "class_embedding.weight"


def attention_module_names(unet: nn.Module) -> list[str]:
    """Names (UNet-local) of every diffusers ``Attention`` module, in module order."""
    return [name for name, module in unet.named_modules() if isinstance(module, Attention)]


def block_prefixes(unet: nn.Module, *, max_depth: int = 3) -> list[str]:
    """Module names up to ``max_depth`` dots: the prefixes worth listing to a user.

    Any module or parameter name is a valid prefix; this is the short list shown when an
    unknown prefix is refused.
    """
    names = [n for n, _ in unet.named_modules() if n and n.count(".") < max_depth]
    return [n for n in names if not _is_lora_name(n)]


def embedder_parameter_name(unet: nn.Module) -> str:
    """The class table's parameter name in a ConditionalDenoiser over ``unet``."""
    from diffusers.models.unets.unet_2d import UNet2DModel

    return _UNET + _UNET2D_EMBEDDER if isinstance(unet, UNet2DModel) else _EMBEDDER


def trains_embedder(spec: FinetuneRecipe) -> bool:
    """``train_embedder`` if given, else True iff there is no class_map (new labels)."""
    if spec.train_embedder is not None:
        return spec.train_embedder
    return spec.class_map is None


def trainable_parameter_names(unet: nn.Module, *, trainable: Trainable,
                              blocks: Sequence[str] | None = None,
                              train_embedder: bool = False) -> list[str]:
    """The parameters a finetune of ``unet`` trains, in ConditionalDenoiser naming.

    Pure: it reads names only and changes nothing. For ``lora`` it returns the names the
    adapters have once :func:`add_lora` injected them (or already have, when injected).

    Args:
        unet: a ``UNet2DConditionModel`` or ``UNet2DModel`` (with or without adapters).
        trainable: the mode.
        blocks: module-name prefixes, with ``trainable="blocks"`` only.
        train_embedder: whether the class table trains along.

    Returns:
        Parameter names in ``named_parameters`` order (the embedder last when separate).

    Raises:
        InvalidSpecError: an unknown mode, missing or unknown block prefixes (the message
            lists the valid ones), or a selection with nothing to train.
    """
    embedder = embedder_parameter_name(unet)
    local = [n for n, _ in unet.named_parameters()]
    base = [n for n in local if not _is_lora_name(n)]
    if trainable == "lora":
        chosen = _lora_parameter_names(unet)
    elif trainable == "full":
        chosen = base
    elif trainable in ("attention", "output_attention"):
        modules = attention_module_names(unet)
        if trainable == "output_attention":
            modules = [m for m in modules if m.startswith("up_blocks.")]
        if not modules:
            raise InvalidSpecError(f"trainable {trainable!r}: this UNet has no such attention")
        chosen = [n for n in base if any(_under(n, m) for m in modules)]
    elif trainable == "blocks":
        chosen = [n for n in base if any(_under(n, p) for p in _check_blocks(unet, blocks))]
    else:
        raise InvalidSpecError(f"unknown trainable {trainable!r}")
    selected = {_UNET + n for n in chosen} - {embedder}
    if train_embedder:
        selected.add(embedder)
    # Module order (lora names may not exist yet); a separate class_embedder comes last.
    order = [_UNET + n for n in (chosen if trainable == "lora" else local)]
    if embedder.startswith(_UNET) and embedder not in order:
        order.append(embedder)
    names = [n for n in order if n in selected]
    names += [n for n in sorted(selected) if not n.startswith(_UNET)]
    if not names:
        raise InvalidSpecError("the selection has no parameter to train")
    return names


def _check_blocks(unet: nn.Module, blocks: Sequence[str] | None) -> list[str]:
    if not blocks:
        raise InvalidSpecError("trainable 'blocks' needs at least one block prefix")
    valid = {n for n, _ in unet.named_modules() if n and not _is_lora_name(n)}
    valid |= {_plain(n) for n, _ in unet.named_parameters() if not _is_lora_name(n)}
    unknown = [b for b in blocks if b not in valid]
    if unknown:
        raise InvalidSpecError(
            f"unknown UNet block prefix(es) {unknown}; valid prefixes are module names such "
            f"as: {', '.join(block_prefixes(unet))}")
    return list(blocks)


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _is_lora_name(name: str) -> bool:
    return any(part in ("lora_A", "lora_B", "lora_dropout", "lora_embedding_A",
                        "lora_embedding_B", "lora_magnitude_vector")
               for part in name.split("."))


def _plain(name: str) -> str:
    """A parameter name as the plain (adapter-free) UNet has it."""
    return name.replace(".base_layer.", ".")


def _lora_parameter_names(unet: nn.Module) -> list[str]:
    """UNet-local names of the LoRA A/B weights (present or to be injected)."""
    present = [n for n, _ in unet.named_parameters() if _is_lora_name(n)]
    if present:
        return present
    names = []
    for target in lora_target_names(unet):
        names += [f"{target}.lora_A.{ADAPTER}.weight", f"{target}.lora_B.{ADAPTER}.weight"]
    return names


# --- LoRA ------------------------------------------------------------------------------

def lora_target_names(unet: nn.Module) -> list[str]:
    """Full names of the projections that get adapters: LORA_TARGETS of every Attention."""
    modules = dict(unet.named_modules())
    targets = []
    for attention in attention_module_names(unet):
        targets += [f"{attention}.{t}" for t in LORA_TARGETS if f"{attention}.{t}" in modules]
    if not targets:
        raise InvalidSpecError("trainable 'lora': this UNet has no attention projections")
    return targets


def has_lora(unet: nn.Module) -> bool:
    """True when peft LoRA layers are injected in ``unet``."""
    return any(_is_lora_name(n) for n, _ in unet.named_parameters())


def add_lora(unet: nn.Module, *, rank: int, alpha: float,
             targets: Sequence[str] | None = None) -> nn.Module:
    """Inject LoRA adapters in place (peft ``inject_adapter_in_model``), dropout 0.

    B starts at zero, so the adapted UNet computes exactly what it did before. A's
    initialisation (Kaiming-uniform, peft's default) draws from torch's global generator;
    it does not depend on data.

    Args:
        unet: the UNet.
        rank: LoRA rank r.
        alpha: LoRA alpha; the update is (alpha / r) * B A.
        targets: projection names (default: :func:`lora_target_names`).

    Returns:
        ``unet`` (the same object, now with adapters).
    """
    from peft import LoraConfig, inject_adapter_in_model

    if has_lora(unet):
        raise InvalidSpecError("the UNet already has LoRA adapters")
    names = list(targets) if targets is not None else lora_target_names(unet)
    allowed = set(lora_target_names(unet))
    if not names or not set(names) <= allowed:
        raise InvalidSpecError("LoRA targets must be attention projections of the UNet")
    # peft annotates lora_alpha as int but scales by it as a number (alpha may be fractional)
    config = LoraConfig(r=rank, lora_alpha=alpha,  # type: ignore[arg-type]
                        lora_dropout=0.0, target_modules=names, bias="none",
                        init_lora_weights=True)
    inject_adapter_in_model(config, unet, adapter_name=ADAPTER)
    return unet


def lora_config(unet: nn.Module) -> dict[str, Any]:
    """rank, alpha and target names of the injected adapters (for saving)."""
    from peft.tuners.lora import LoraLayer

    layers = {n: m for n, m in unet.named_modules() if isinstance(m, LoraLayer)}
    if not layers:
        raise InvalidSpecError("the UNet has no LoRA adapters")
    first = next(iter(layers.values()))
    return {"rank": int(first.r[ADAPTER]), "alpha": float(first.lora_alpha[ADAPTER]),
            "targets": sorted(layers)}


def lora_state_dict(unet: nn.Module) -> dict[str, torch.Tensor]:
    """The adapter weights (peft ``get_peft_model_state_dict``), detached on CPU."""
    from peft.utils import get_peft_model_state_dict

    state = get_peft_model_state_dict(unet, adapter_name=ADAPTER)
    return {k: v.detach().cpu().contiguous() for k, v in state.items()}


def load_lora_state_dict(unet: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Load adapter weights saved by :func:`lora_state_dict` into injected adapters.

    Raises:
        InvalidSpecError: if a saved weight has no adapter or an adapter has no weight.
    """
    from peft.utils import set_peft_model_state_dict

    # peft annotates the result as a bare namedtuple: it is torch's _IncompatibleKeys
    result = cast("_LoadResult",
                  set_peft_model_state_dict(unet, dict(state), adapter_name=ADAPTER))
    missing = [k for k in result.missing_keys if _is_lora_name(k)]
    if result.unexpected_keys or missing:
        raise InvalidSpecError("LoRA weights do not match the adapters "
                               f"(unexpected {list(result.unexpected_keys)[:3]}, "
                               f"missing {missing[:3]})")


@torch.no_grad()
def plain_unet(unet: nn.Module, *, merge: bool) -> nn.Module:
    """An adapter-free copy of ``unet`` of the same diffusers class and config.

    Args:
        unet: a UNet, with or without LoRA adapters.
        merge: True: each adapted weight becomes W + (alpha / r) B A (the released model);
            False: the base weights W, bit-identical to those the adapters were added to.

    Returns:
        ``unet`` itself when it has no adapters, else a new module (on ``unet``'s device).
    """
    from peft.tuners.lora import LoraLayer

    from dpsynth_ml.models.architectures import unet_config

    if not has_lora(unet):
        return unet
    deltas = {}
    if merge:
        # every concrete LoraLayer (peft's Linear, Conv2d, ...) has get_delta_weight
        deltas = {f"{name}.weight": cast("_DeltaWeight", module).get_delta_weight(ADAPTER)
                  for name, module in unet.named_modules() if isinstance(module, LoraLayer)}
    state = {}
    for key, value in unet.state_dict().items():
        if _is_lora_name(key):
            continue
        plain = _plain(key)
        tensor = value.detach().clone()
        if plain in deltas:
            tensor += deltas[plain].to(tensor.dtype)
        state[plain] = tensor
    device = next(unet.parameters()).device
    with torch.random.fork_rng(devices=[]):  # the throwaway init must not move torch's RNG
        unet_class = cast("type[ConfigMixin]", type(unet))  # a diffusers UNet class
        fresh = cast("nn.Module", unet_class.from_config(unet_config(unet)))
    fresh.load_state_dict(state, strict=True)
    return fresh.to(device)


# --- applying a selection --------------------------------------------------------------

def apply_trainable(bundle: ModelBundle, spec: FinetuneRecipe) -> list[str]:
    """Make exactly the spec's parameters trainable (injecting LoRA when asked).

    VAE parameters (if the model has a VAE) are always frozen. With ``lora``, adapters are
    injected unless the UNet already has them (a resumed checkpoint), and their rank/alpha
    must then match the spec.

    Returns:
        The trainable names (ConditionalDenoiser naming), in module order.
    """
    if bundle.vae is not None:
        bundle.vae.requires_grad_(False)
    if spec.trainable == "lora":
        alpha = float(spec.lora_alpha) if spec.lora_alpha is not None else float(spec.lora_rank)
        if has_lora(bundle.unet):
            saved = lora_config(bundle.unet)
            if (saved["rank"], saved["alpha"]) != (spec.lora_rank, alpha):
                raise InvalidSpecError("the checkpoint's LoRA rank/alpha differ from the spec's")
        else:
            add_lora(bundle.unet, rank=spec.lora_rank, alpha=alpha)
    elif has_lora(bundle.unet):
        raise InvalidSpecError("the model carries LoRA adapters but trainable is not 'lora'")
    names = trainable_parameter_names(bundle.unet, trainable=spec.trainable,
                                      blocks=spec.blocks, train_embedder=trains_embedder(spec))
    wanted = set(names)
    for name, param in bundle.unet.named_parameters():
        param.requires_grad_(_UNET + name in wanted)
    if embedder_parameter_name(bundle.unet) == _EMBEDDER:
        bundle.class_embedder.requires_grad_(_EMBEDDER in wanted)
    return names
