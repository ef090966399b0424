"""Typed inputs and outputs of the ML core: specs, results, model info, errors.

Everything here is plain, frozen data so that the worker can build a spec from a job row,
hand it to :func:`dpsynth_ml.train`, and record the result without touching torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from dpsynth_ml.central_spec import CentralImages as CentralImages
from dpsynth_ml.errors import InvalidSpecError as InvalidSpecError
from dpsynth_ml.errors import MlError as MlError

Preset = Literal["tiny", "small", "base", "custom"]
TrainingKind = Literal["pretrain", "finetune"]
Trainable = Literal["full", "attention", "output_attention", "blocks", "lora"]
RngKind = Literal["os", "test"]
SamplerKind = Literal["ddpm", "ddim", "dpm_solver++"]
TrainingTarget = Literal["images", "masks"]
UnetClass = Literal["UNet2DConditionModel", "UNet2DModel"]
#: How training timesteps are drawn (:func:`dpsynth_ml.training.diffusion.draw_timesteps`).
TimestepDistribution = Literal["uniform", "edm_log_normal"]
#: Where the denoiser works: on VAE latents (large images) or directly on pixels (small ones).
Space = Literal["latent", "pixel"]

#: Largest image side a pixel-space model takes: beyond it the UNet's cost on raw pixels
#: (and its attention over them) is what the latent autoencoder exists to avoid.
MAX_PIXEL_IMAGE_SIZE = 64

#: Version of the on-disk model directory format (``dpsynth_model.json``).
MODEL_FORMAT_VERSION = 1


@dataclass(frozen=True)
class DpSpec:
    """Parameters of one DP-SGD job, exactly as the privacy ledger accounted them.

    Attributes:
        noise_multiplier: sigma > 0; the noise std on the clipped sum is sigma *
            max_grad_norm. No spec turns the noise off: a noiseless mechanism exists only
            as an object tests inject into the engine (``DpSgdEngine(_test_noise=...)``).
        sample_rate: Poisson rate q = expected_batch_size / N_hat, used verbatim by the sampler.
        expected_batch_size: public normaliser of every update (never the realised size).
        max_grad_norm: per-example clipping norm C.
        steps: total logical steps of the job.
        epsilon: the job's target epsilon and ``delta`` the dataset's delta (None: unknown,
            as in tests); they only size the fixed per-step work (``dp.padding``), never
            the mechanism.
    """

    noise_multiplier: float
    sample_rate: float
    expected_batch_size: int
    max_grad_norm: float
    steps: int
    epsilon: float | None = None
    delta: float | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier > 0):
            raise InvalidSpecError("noise_multiplier must be finite and > 0")
        if not (0.0 < self.sample_rate <= 1.0):
            raise InvalidSpecError("sample_rate must be in (0, 1]")
        if self.expected_batch_size < 1:
            raise InvalidSpecError("expected_batch_size must be >= 1")
        if not (math.isfinite(self.max_grad_norm) and self.max_grad_norm > 0):
            raise InvalidSpecError("max_grad_norm must be finite and > 0")
        if self.steps < 0:
            raise InvalidSpecError("steps must be >= 0")


@dataclass(frozen=True)
class Architecture:
    """A custom model: diffusers config dicts, checked against allow-lists by ``models``.

    Attributes:
        unet_class: "UNet2DConditionModel" (class token through cross-attention) or
            "UNet2DModel" (class embedding added to the timestep embedding, DP-DocLDM).
        unet: keyword arguments of the UNet class (sample_size and in/out channels are set
            by the platform from image size, VAE and layout conditioning).
        vae: keyword arguments of ``AutoencoderKL`` (in/out channels set by the platform).
    """

    unet_class: UnetClass = "UNet2DConditionModel"
    unet: Mapping[str, object] = field(default_factory=dict)
    vae: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class RecordLevel:
    """Record-level DP-SGD: Poisson sampling over images at ``dp.sample_rate``, one clipped
    contribution per image."""

    dp: DpSpec


@dataclass(frozen=True)
class SubjectLevel:
    """User-level DP-SGD over the dataset's ``subjects``: Poisson sampling over subjects at
    ``dp.sample_rate``, one clipped contribution per subject = the mean gradient of up to
    ``max_images_per_subject`` of its images, chosen uniformly each step; the DpSpec's
    ``expected_batch_size`` is then the expected number of SUBJECTS per step."""

    dp: DpSpec
    max_images_per_subject: int = 8

    def __post_init__(self) -> None:
        if self.max_images_per_subject < 1:
            raise InvalidSpecError("max_images_per_subject must be >= 1")


#: The privacy of one DP-SGD run over a whole dataset (or one class of it).
WholeDataset = RecordLevel | SubjectLevel


@dataclass(frozen=True)
class PerLabel:
    """One model per class, each trained on that class's records only, under its own
    privacy block (class name -> RecordLevel or SubjectLevel, all of one unit)."""

    per_class: Mapping[str, WholeDataset]

    def __post_init__(self) -> None:
        if not self.per_class:
            raise InvalidSpecError("a per-label finetune needs at least one class")
        units = {(type(p).__name__,
                  p.max_images_per_subject if isinstance(p, SubjectLevel) else 0)
                 for p in self.per_class.values()}
        if len(units) != 1:
            raise InvalidSpecError("every class of a per-label finetune has the same unit")


#: What a finetune's privacy is: exactly one of these (DP cannot be turned off by a spec).
Privacy = RecordLevel | SubjectLevel | PerLabel


@dataclass(frozen=True, kw_only=True)
class _TrainingBase:
    """Fields of every training; docs/ml-core.md gives each field's meaning.

    ``target``: "images", or "masks" to train a layout generator on the dataset's layout
    masks in place of its images (same labels, same DP machinery; the model's info records
    ``extra.target = "masks"``). ``timestep_distribution``: "uniform" over the scheduler's
    training steps (DDPM) or "edm_log_normal" (the noise level log-normal, p_mean -1.2,
    p_std 1.2: EDM, as DPDM and DP-FETA train on Fashion-MNIST).
    """

    image_size: int = 32
    channels: int = 1
    class_conditional: bool = True
    target: TrainingTarget = "images"
    num_classes: int = 10
    learning_rate: float = 3e-4
    label_dropout: float = 0.1
    timestep_distribution: TimestepDistribution = "uniform"

    def __post_init__(self) -> None:
        if self.timestep_distribution not in ("uniform", "edm_log_normal"):
            raise InvalidSpecError(f"unknown timestep_distribution "
                                   f"{self.timestep_distribution!r}")
        if self.target not in ("images", "masks"):
            raise InvalidSpecError(f"unknown target {self.target!r}")
        if self.image_size < 8 or self.image_size % 4 != 0:
            raise InvalidSpecError("image_size must be a multiple of 4 and >= 8")
        if self.channels not in (1, 3):
            raise InvalidSpecError("channels must be 1 or 3")
        if self.num_classes < 1:
            raise InvalidSpecError("num_classes must be >= 1")
        if not (0.0 <= self.label_dropout < 1.0):
            raise InvalidSpecError("label_dropout must be in [0, 1)")
        if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
            raise InvalidSpecError("learning_rate must be finite and > 0")


@dataclass(frozen=True, kw_only=True)
class PretrainTraining(_TrainingBase):
    """Pretrain VAE + UNet from scratch on public data (not private, no DpSpec).

    ``preset`` / ``architecture`` (given exactly when the preset is "custom") pick the
    model; with ``layout_conditioning`` the dataset's masks are encoded by the VAE and
    concatenated to the noisy latent. ``epochs`` of shuffled minibatches of ``batch_size``,
    seeded by ``seed`` (public data: the run may be replayed).

    ``space``: "latent" (VAE + latent UNet) or "pixel": no autoencoder, the UNet denoises
    the images themselves (mapped to [-1, 1]); for images of at most
    :data:`MAX_PIXEL_IMAGE_SIZE` pixels a side, where a VAE's reconstruction error costs more
    than it saves. A custom pixel architecture gives no ``vae`` config. Layout conditioning
    and layout generators work in either space (in pixel space the mask itself is the
    conditioning input). The space is carried by the model (``ModelInfo.space``) through
    finetunes and generation.
    """

    kind: ClassVar[TrainingKind] = "pretrain"

    preset: Preset = "tiny"
    architecture: Architecture | None = None
    layout_conditioning: bool = False
    epochs: int = 1
    batch_size: int = 64
    seed: int = 0
    space: Space = "latent"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.preset not in ("tiny", "small", "base", "custom"):
            raise InvalidSpecError(f"unknown preset {self.preset!r}")
        if (self.preset == "custom") != (self.architecture is not None):
            raise InvalidSpecError("an architecture is given exactly when preset is 'custom'")
        if self.space not in ("latent", "pixel"):
            raise InvalidSpecError(f"unknown space {self.space!r} (latent or pixel)")
        if self.space == "pixel" and self.image_size > MAX_PIXEL_IMAGE_SIZE:
            raise InvalidSpecError(f"a pixel-space model takes images of at most "
                                   f"{MAX_PIXEL_IMAGE_SIZE}x{MAX_PIXEL_IMAGE_SIZE} "
                                   f"(image_size {self.image_size}): use space 'latent'")
        if self.space == "pixel" and self.architecture is not None and self.architecture.vae:
            raise InvalidSpecError("a pixel-space model has no autoencoder: the custom "
                                   "architecture must not give a vae config")
        if self.target == "masks" and self.layout_conditioning:
            raise InvalidSpecError("a layout generator (target 'masks') is not "
                                   "layout-conditioned")
        if min(self.epochs, self.batch_size) < 1:
            raise InvalidSpecError("epochs and batch_size must be >= 1")


@dataclass(frozen=True, kw_only=True)
class FinetuneRecipe(_TrainingBase):
    """What a finetune trains and how, apart from its privacy.

    ``trainable``: "full", "attention" = every attn1/attn2, "output_attention" = attention
    of the UNet's up blocks, "blocks" = the UNet module-name prefixes in ``blocks``, "lora"
    = LoRA adapters of rank ``lora_rank`` on the attention projections via peft, merged
    into the weights on save. ``train_embedder`` (None = train the class embedder iff there
    is no class_map), ``noise_multiplicity`` (K draws of (timestep, noise) averaged per
    example before clipping), ``ema_decay``, ``warmup_steps``, physical micro-batches of
    ``max_physical_batch_size`` rows, ``class_map`` (private class index -> base class
    index), a checkpoint every ``checkpoint_every`` logical steps, and ``central_images``:
    an optional DP warm-up on released class means before DP-SGD (:class:`CentralImages`).
    """

    trainable: Trainable = "attention"
    blocks: tuple[str, ...] | None = None
    lora_rank: int = 4
    lora_alpha: float | None = None
    train_embedder: bool | None = None
    noise_multiplicity: int = 1
    ema_decay: float | None = None
    warmup_steps: int = 0
    max_physical_batch_size: int = 64
    class_map: Mapping[int, int] | None = None
    checkpoint_every: int = 10
    central_images: CentralImages | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.trainable not in ("full", "attention", "output_attention", "blocks", "lora"):
            raise InvalidSpecError(f"unknown trainable {self.trainable!r}")
        if (self.trainable == "blocks") != bool(self.blocks):
            raise InvalidSpecError("blocks are given exactly when trainable is 'blocks'")
        if not 1 <= self.lora_rank <= 256:
            raise InvalidSpecError("lora_rank must be in [1, 256]")
        if self.noise_multiplicity < 1:
            raise InvalidSpecError("noise_multiplicity must be >= 1")
        if self.ema_decay is not None and not 0.0 < self.ema_decay < 1.0:
            raise InvalidSpecError("ema_decay must be in (0, 1)")
        if self.warmup_steps < 0:
            raise InvalidSpecError("warmup_steps must be >= 0")
        if self.max_physical_batch_size < 1:
            raise InvalidSpecError("max_physical_batch_size must be >= 1")
        if self.checkpoint_every < 1:
            raise InvalidSpecError("checkpoint_every must be >= 1")
        if self.class_map is not None:
            bad = [m for m in self.class_map.values() if not 0 <= m < self.num_classes]
            if bad:
                raise InvalidSpecError(f"class_map targets outside [0, num_classes): {bad}")


@dataclass(frozen=True, kw_only=True)
class FinetuneTraining(FinetuneRecipe):
    """DP-finetune a pretrained model on private data under ``privacy`` (always DP-SGD)."""

    kind: ClassVar[TrainingKind] = "finetune"

    privacy: Privacy

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.privacy, (RecordLevel, SubjectLevel, PerLabel)):
            raise InvalidSpecError("a finetune's privacy is RecordLevel, SubjectLevel or "
                                   "PerLabel")
        if isinstance(self.privacy, PerLabel) and self.class_map is not None:
            raise InvalidSpecError("a per-label finetune takes no class_map")
        if isinstance(self.privacy, PerLabel) and self.target == "masks":
            raise InvalidSpecError("a layout generator (target 'masks') is not per-label")
        if self.central_images is not None and (isinstance(self.privacy, PerLabel)
                                                or self.target == "masks"):
            raise InvalidSpecError("central_images warms up one class-conditional image "
                                   "model: not with a per-label finetune or a layout "
                                   "generator")
        if self.central_images is not None and self.image_size % self.central_images.downsample:
            raise InvalidSpecError("central_images.downsample must divide image_size")


#: What :func:`dpsynth_ml.train` accepts: one variant per kind of training.
TrainingSpec = PretrainTraining | FinetuneTraining


@dataclass(frozen=True)
class TrainingResult:
    """Outcome of :func:`dpsynth_ml.train`.

    Attributes:
        steps_completed: logical steps done in total (including those before a resume).
        stopped_early: True when hooks vetoed or stopped before the planned end.
        model_dir: the written model directory.
        trainable_parameters: number of scalars the optimiser updated.
        total_parameters: number of scalars in VAE + UNet + class embedder.
        rng: "os" for OS-seeded randomness, "test" when a generator was injected.
        steps_by_partition: per-label runs: logical steps done per class name.
        device: the torch device the training ran on (rank 0's, e.g. "cuda:0"; "cpu" for
            a run on the CPU), so a benchmark never labels CPU work as GPU work.
        world_size: how many ranks trained the one model (its audits run on as many).
    """

    steps_completed: int
    stopped_early: bool
    model_dir: Path
    trainable_parameters: int
    total_parameters: int
    rng: RngKind
    steps_by_partition: Mapping[str, int] = field(default_factory=dict)
    device: str = "cpu"
    world_size: int = 1


@dataclass(frozen=True)
class SampleResult:
    """Outcome of :func:`dpsynth_ml.sample`.

    Attributes:
        out_dir: root of the written PNGs (``out_dir/<class_name>/<i>.png``).
        counts: number of images written per class name.
        seed: the generation seed (generation is post-processing, so it may be recorded).
        images_per_second: images written per second of sampling wall time.
        layouts: per class name, the indices of the layout masks used (in order).
        device: the torch device the model and the diffusion noise were on ("cpu", "cuda:0").
    """

    out_dir: Path
    counts: Mapping[str, int]
    seed: int
    images_per_second: float = 0.0
    layouts: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    device: str = "cpu"

    @property
    def total(self) -> int:
        """Number of images written over all classes."""
        return sum(self.counts.values())


@dataclass(frozen=True)
class ModelInfo:
    """Contents of ``dpsynth_model.json`` in a model directory.

    ``space`` is where the denoiser works ("latent", the default of files written before
    pixel-space models existed, or "pixel"). A pixel model has no VAE: its "latents" are
    the images in [-1, 1], so ``latent_channels == channels`` and ``vae_scaling_factor ==
    1.0``, which every consumer of these two fields then handles without a special case.
    """

    format_version: int
    preset: Preset
    image_size: int
    channels: int
    latent_channels: int
    vae_scaling_factor: float
    num_classes: int
    class_names: tuple[str, ...]
    null_class: int
    rng: RngKind
    training_kind: TrainingKind
    steps: int
    extra: Mapping[str, object] = field(default_factory=dict)
    space: Space = "latent"

    def __post_init__(self) -> None:
        if self.space not in ("latent", "pixel"):
            raise InvalidSpecError(f"unknown model space {self.space!r}")
        if self.space == "pixel" and (self.latent_channels != self.channels
                                      or self.vae_scaling_factor != 1.0):
            raise InvalidSpecError("a pixel-space model's latent channels are its image "
                                   "channels and its scaling factor is 1")
