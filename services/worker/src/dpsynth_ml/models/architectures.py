"""Model architectures (presets and custom diffusers configs) and the conditional denoiser.

The presets' fixed sizes live in :mod:`dpsynth_ml.models.presets`; this module plans a model
from a preset or a checked custom config and builds it.

The latent diffusion model follows DP-LDMs (Liu et al., TMLR 2024): a VAE maps images to a
small latent and a UNet denoises latents. Two UNet classes are supported:

* ``UNet2DConditionModel`` (the presets): the class label enters through cross-attention as a
  single learned token (``encoder_hidden_states`` of length 1, DP-LDMs conditioning); the
  token table is the separate ``class_embedder``.
* ``UNet2DModel``: the class embedding is *added to the timestep embedding* (DP-DocLDM's
  "Class Cond."), through diffusers' ``num_class_embeds``; the table is the UNet's own
  ``class_embedding`` and ``ModelBundle.class_embedder`` is that same module.

Classifier-free guidance (Ho & Salimans 2022) needs an extra "null" class: the last row of
either table. With layout conditioning (DP-DocLDM), the layout mask is encoded by the same
frozen VAE and concatenated channel-wise to the noisy latent, so the UNet has
``in_channels = 2 * latent_channels`` and ``out_channels = latent_channels``.

Pixel-space models (small images) have no VAE: the same UNets denoise the images in
[-1, 1] (:mod:`dpsynth_ml.models.pixel_plan` plans them, :mod:`dpsynth_ml.models.codec`
maps records to and from the space a model works in).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
from diffusers.models.autoencoders.autoencoder_kl import AutoencoderKL
from diffusers.models.unets.unet_2d import UNet2DModel
from diffusers.models.unets.unet_2d_condition import UNet2DConditionModel
from diffusers.schedulers.scheduling_ddpm import DDPMScheduler
from torch import nn

# the encoders moved to the codec (both spaces); re-exported for existing callers
from dpsynth_ml.models.codec import _ENCODE_CHUNK as _ENCODE_CHUNK
from dpsynth_ml.models.codec import encode_images as encode_images
from dpsynth_ml.models.codec import encode_layouts as encode_layouts

# the presets live in their own module; re-exported for existing callers
from dpsynth_ml.models.presets import PRESETS as PRESETS
from dpsynth_ml.models.presets import PresetConfig as PresetConfig
from dpsynth_ml.models.presets import _preset_unet_config as _preset_unet_config
from dpsynth_ml.models.presets import _preset_vae_config as _preset_vae_config
from dpsynth_ml.models.presets import build_unet as build_unet
from dpsynth_ml.models.presets import build_vae as build_vae
from dpsynth_ml.models.presets import preset_config as preset_config
from dpsynth_ml.models.presets import vae_downsample_factor as vae_downsample_factor
from dpsynth_ml.spec import Architecture, InvalidSpecError, Space, UnetClass

if TYPE_CHECKING:
    from diffusers.configuration_utils import FrozenDict

    from dpsynth_ml.spec import PretrainTraining

#: The diffusers UNet classes a dpsynth model may use.
UNET_CLASSES: dict[str, type[nn.Module]] = {
    "UNet2DConditionModel": UNet2DConditionModel,
    "UNet2DModel": UNet2DModel,
}

#: Custom-architecture keys the platform sets itself (sizes and the conditioning path).
PLATFORM_UNET_KEYS = frozenset({
    "sample_size", "in_channels", "out_channels", "num_class_embeds", "class_embed_type",
    "encoder_hid_dim", "encoder_hid_dim_type", "addition_embed_type",
    "addition_time_embed_dim", "projection_class_embeddings_input_dim",
    "class_embeddings_concat", "time_cond_proj_dim", "addition_embed_type_num_heads",
})
PLATFORM_VAE_KEYS = frozenset({
    "sample_size", "in_channels", "out_channels", "scaling_factor", "shift_factor",
    "latents_mean", "latents_std", "force_upcast",
})


def build_scheduler() -> DDPMScheduler:
    """Linear-beta DDPM schedule (Ho et al. 2020), epsilon prediction."""
    scheduler: DDPMScheduler = DDPMScheduler(
        num_train_timesteps=1000, beta_schedule="linear", beta_start=1e-4, beta_end=0.02,
        prediction_type="epsilon", clip_sample=False)
    return scheduler


def build_class_embedder(num_classes: int, dim: int) -> nn.Embedding:
    """Learned class embeddings; row ``num_classes`` is the null class for guidance."""
    embedder = nn.Embedding(num_classes + 1, dim)
    nn.init.normal_(embedder.weight, std=0.02)
    return embedder


# --- architectures: presets and custom configs -----------------------------------------

@dataclass(frozen=True)
class ModelPlan:
    """Everything needed to build a fresh model for a pretrain.

    Attributes:
        unet_class: the diffusers UNet class name.
        vae_config: ``AutoencoderKL`` keyword arguments (platform keys filled in); None for
            a pixel-space model, which has no autoencoder.
        unet_config: UNet keyword arguments (platform keys filled in, except
            ``num_class_embeds`` which :func:`build_bundle` sets from the class count).
        latent_channels: channels of one VAE latent.
        layout_channels: extra UNet input channels for the layout latent (0 = none).
        vae_epochs: autoencoder epochs (custom architectures: the spec's epochs; 0 in
            pixel space).
        vae_learning_rate: autoencoder learning rate.
        space: "latent" or "pixel" (then ``latent_channels`` is the image channels).
    """

    unet_class: UnetClass
    vae_config: Mapping[str, Any] | None
    unet_config: Mapping[str, Any]
    latent_channels: int
    layout_channels: int
    vae_epochs: int
    vae_learning_rate: float
    space: Space = "latent"


def plan_model(spec: PretrainTraining) -> ModelPlan:
    """The architecture a pretrain builds: a preset's sizes or a checked custom config.

    The platform owns the sizes that follow from the data (image size, channels), from the
    VAE (latent channels and size) and from layout conditioning (UNet input channels), and
    the conditioning path; a custom architecture naming any of them is refused.

    Raises:
        InvalidSpecError: unknown preset, platform-owned or unknown keys, values outside
            the allow-list's limits (``dpsynth_shared.model_configs``), or an image size
            the VAE cannot downsample evenly (in pixel space: the UNet).
    """
    if spec.space == "pixel":
        from dpsynth_ml.models.pixel_plan import plan_pixel_model  # it builds on this module

        return plan_pixel_model(spec)
    if spec.preset != "custom":
        cfg = preset_config(spec.preset)
        layout = cfg.latent_channels if spec.layout_conditioning else 0
        factor = vae_downsample_factor(cfg)
        _check_divisible(spec.image_size, factor)
        return ModelPlan(
            unet_class="UNet2DConditionModel",
            vae_config=_preset_vae_config(cfg, channels=spec.channels,
                                          image_size=spec.image_size),
            unet_config=_preset_unet_config(cfg, latent_size=spec.image_size // factor,
                                            layout_channels=layout),
            latent_channels=cfg.latent_channels, layout_channels=layout,
            vae_epochs=cfg.vae_epochs, vae_learning_rate=cfg.vae_learning_rate)
    if spec.architecture is None:
        raise InvalidSpecError("preset 'custom' needs an architecture")
    return _plan_custom(spec, spec.architecture)


def _plan_custom(spec: PretrainTraining, arch: Architecture) -> ModelPlan:
    from dpsynth_shared.model_configs import ModelConfigError, check_config

    if arch.unet_class not in UNET_CLASSES:
        raise InvalidSpecError(f"unet_class {arch.unet_class!r} is not allowed (allowed: "
                               f"{', '.join(UNET_CLASSES)})")
    for component, given, owned in (("unet", arch.unet, PLATFORM_UNET_KEYS),
                                    ("vae", arch.vae, PLATFORM_VAE_KEYS)):
        taken = sorted(k for k in given if k in owned)
        if taken:
            raise InvalidSpecError(f"the custom {component} config sets {taken}: these are set "
                                   "by the platform (sizes from the data and VAE, conditioning)")
    vae_config: dict[str, Any] = {**arch.vae, "in_channels": spec.channels,
                                  "out_channels": spec.channels,
                                  "sample_size": spec.image_size}
    latent = int(vae_config.get("latent_channels", 4))
    factor = 2 ** (len(vae_config.get("block_out_channels", (64,))) - 1)
    _check_divisible(spec.image_size, factor)
    layout = latent if spec.layout_conditioning else 0
    unet_config: dict[str, Any] = {**arch.unet, "sample_size": spec.image_size // factor,
                                   "in_channels": latent + layout, "out_channels": latent}
    try:
        check_config("vae", vae_config, class_name="AutoencoderKL")
    except ModelConfigError as exc:
        raise InvalidSpecError(str(exc)) from exc
    check_custom_unet(arch, unet_config, num_classes=spec.num_classes)
    return ModelPlan(unet_class=arch.unet_class, vae_config=vae_config,
                     unet_config=unet_config, latent_channels=latent, layout_channels=layout,
                     vae_epochs=spec.epochs, vae_learning_rate=1e-3)


def check_custom_unet(arch: Architecture, unet_config: Mapping[str, Any], *,
                      num_classes: int) -> None:
    """The checks a custom UNet config passes in either space, its sizes filled in: one
    class-token width, and diffusers' allow-list (``dpsynth_shared.model_configs``).

    Raises:
        InvalidSpecError: on a failed check.
    """
    from dpsynth_shared.model_configs import ModelConfigError, check_config

    if arch.unet_class == "UNet2DConditionModel" and not isinstance(
            unet_config.get("cross_attention_dim", 1280), int):
        raise InvalidSpecError("cross_attention_dim must be one number: the class token is "
                               "the same in every block")
    checked = dict(unet_config)
    if arch.unet_class == "UNet2DModel":
        checked["num_class_embeds"] = num_classes + 1
    try:
        check_config("unet", checked, class_name=arch.unet_class)
    except ModelConfigError as exc:
        raise InvalidSpecError(str(exc)) from exc


def _check_divisible(image_size: int, factor: int) -> None:
    if image_size % factor:
        raise InvalidSpecError(f"image_size {image_size} is not a multiple of the VAE's "
                               f"downsampling factor {factor}")


def build_bundle(plan: ModelPlan, *, num_classes: int) -> ModelBundle:
    """Fresh VAE (none in pixel space), UNet, class embedder (null class = last row) and
    scheduler."""
    vae = AutoencoderKL(**plan.vae_config) if plan.vae_config is not None else None
    if plan.unet_class == "UNet2DModel":
        unet2d: UNet2DModel = UNet2DModel(**plan.unet_config, num_class_embeds=num_classes + 1)
        bundle = ModelBundle(vae=vae, unet=unet2d, class_embedder=unet2d.class_embedding,
                             scheduler=build_scheduler())
        reset_class_embedder(bundle, num_classes)
        return bundle
    unet: UNet2DConditionModel = UNet2DConditionModel(**plan.unet_config)
    dim = int(unet.config["cross_attention_dim"])
    return ModelBundle(vae=vae, unet=unet, class_embedder=build_class_embedder(num_classes, dim),
                       scheduler=build_scheduler())


def unet_class_name(unet: nn.Module) -> UnetClass:
    """``UNet2DConditionModel`` or ``UNet2DModel``.

    Raises:
        InvalidSpecError: for any other module.
    """
    for name, cls in UNET_CLASSES.items():
        if type(unet) is cls:
            return name  # type: ignore[return-value]
    raise InvalidSpecError(f"unsupported UNet class {type(unet).__name__}")


def class_embedding_dim(unet: nn.Module) -> int:
    """Width of one class embedding: the cross-attention width or the time-embedding width."""
    if isinstance(unet, UNet2DModel):
        return int(unet.class_embedding.embedding_dim)
    return int(unet_config(unet)["cross_attention_dim"])


def unet_config(unet: nn.Module) -> FrozenDict:
    """The diffusers config (``unet.config``) of one of :data:`UNET_CLASSES`; ``nn.Module``
    types an unknown attribute as a tensor or a module, hence the cast."""
    return cast("FrozenDict", unet.config)


def reset_class_embedder(bundle: ModelBundle, num_classes: int) -> nn.Embedding:
    """Replace the class table by a fresh one of ``num_classes + 1`` rows (new labels).

    The null row (the unconditional token of classifier-free guidance, and the only label a
    per-label model sees) keeps the base model's pretrained null token: it was learnt on
    public data, and a random one would have to be relearnt under DP noise.

    For a ``UNet2DModel`` the table is the UNet's ``class_embedding`` (and its config's
    ``num_class_embeds``), so both are replaced together.
    """
    embedder = build_class_embedder(num_classes, class_embedding_dim(bundle.unet))
    old = bundle.class_embedder.weight
    if old.shape[1] == embedder.weight.shape[1]:
        with torch.no_grad():
            embedder.weight[num_classes].copy_(old[-1])
    if isinstance(bundle.unet, UNet2DModel):
        bundle.unet.class_embedding = embedder
        bundle.unet.register_to_config(num_class_embeds=num_classes + 1)
    bundle.class_embedder = embedder
    return embedder


class ConditionalDenoiser(nn.Module):
    """UNet + class embedder as one module, so opacus can hook both in one forward.

    One signature for both UNet classes: ``forward(latents, timesteps, labels, layout=None)``.
    With ``UNet2DConditionModel`` the label embedding is the cross-attention context of
    length 1 (DP-LDMs); with ``UNet2DModel`` the label goes through the UNet's own class
    embedding, added to the timestep embedding (DP-DocLDM). For a ``UNet2DModel`` the
    embedder is not registered twice: its parameter is ``unet.class_embedding.weight``.

    Args:
        unet: the denoiser.
        class_embedder: the class table; for ``UNet2DModel`` it must be
            ``unet.class_embedding`` itself.
    """

    def __init__(self, unet: nn.Module, class_embedder: nn.Embedding) -> None:
        super().__init__()
        self.unet = unet
        self.unet_class = unet_class_name(unet)
        if isinstance(unet, UNet2DModel):
            if unet.class_embedding is not class_embedder:
                raise InvalidSpecError("a UNet2DModel's class embedder is its class_embedding")
        else:
            self.class_embedder = class_embedder
        config = unet_config(unet)
        self.latent_channels = int(config["out_channels"])
        self.layout_channels = int(config["in_channels"]) - self.latent_channels

    def forward(self, latents: torch.Tensor, timesteps: torch.Tensor, labels: torch.Tensor,
                layout: torch.Tensor | None = None) -> torch.Tensor:
        """Predict the noise in ``latents`` at ``timesteps`` for class ``labels``.

        Args:
            latents: noisy latents [B, C, h, w].
            timesteps: integer timesteps [B].
            labels: class indices [B] (the null class for unconditional predictions).
            layout: encoded layout masks [B, C_layout, h, w], required exactly when the
                model is layout-conditioned; concatenated after the latent channels.

        Returns:
            The predicted noise [B, C, h, w].
        """
        if (layout is not None) != (self.layout_channels > 0):
            raise InvalidSpecError(
                "this model is layout-conditioned: a layout is required" if self.layout_channels
                else "this model has no layout conditioning: a layout is refused")
        x = latents if layout is None else torch.cat([latents, layout.to(latents.dtype)], dim=1)
        if self.unet_class == "UNet2DModel":
            out: Any = self.unet(x, timesteps, class_labels=labels, return_dict=False)
        else:
            context = self.class_embedder(labels).unsqueeze(1)
            out = self.unet(x, timesteps, encoder_hidden_states=context, return_dict=False)
        return out[0]  # type: ignore[no-any-return]


@dataclass
class ModelBundle:
    """All parts of a dpsynth model held in memory.

    ``unet`` is a ``UNet2DConditionModel`` or a ``UNet2DModel``; for the latter,
    ``class_embedder`` is the UNet's own ``class_embedding`` module. ``vae`` is None for a
    pixel-space model (``ModelInfo.space == "pixel"``).
    """

    vae: AutoencoderKL | None
    unet: Any
    class_embedder: nn.Embedding
    scheduler: DDPMScheduler

    @property
    def unet_class(self) -> UnetClass:
        """The UNet's diffusers class name."""
        return unet_class_name(self.unet)

    @property
    def layout_channels(self) -> int:
        """UNet input channels taken by the layout latent (0 without layout conditioning)."""
        return int(self.unet.config["in_channels"]) - int(self.unet.config["out_channels"])

    @property
    def space(self) -> Space:
        """"pixel" when the model has no autoencoder, else "latent"."""
        return "pixel" if self.vae is None else "latent"

    def parameter_count(self) -> int:
        """Scalars in VAE + UNet + class embedder (a shared embedder counted once)."""
        modules: list[nn.Module] = [self.unet, self.class_embedder]
        if self.vae is not None:
            modules.append(self.vae)
        seen = {id(p): p.numel() for m in modules for p in m.parameters()}
        return sum(seen.values())


def is_attention_parameter(name: str) -> bool:
    """True for parameters of a cross-attention UNet's transformer attention (attn1/attn2).

    Kept for callers that only have names; :mod:`dpsynth_ml.models.trainable` selects by module
    type and also covers ``UNet2DModel``'s self-attention.
    """
    parts = name.split(".")
    return "attn1" in parts or "attn2" in parts
