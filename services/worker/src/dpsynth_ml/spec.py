"""Typed inputs and outputs of the ML core: specs, results, model info, errors.

Everything here is plain, frozen data so that the worker can build a spec from a job row,
hand it to :func:`dpsynth_ml.train`, and record the result without touching torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Preset = Literal["tiny", "small"]
TrainingKind = Literal["pretrain", "finetune"]
Trainable = Literal["full", "attention"]
RngKind = Literal["os", "test"]
SamplerKind = Literal["ddpm", "ddim"]

#: Version of the on-disk model directory format (``dpsynth_model.json``).
MODEL_FORMAT_VERSION = 1


class MlError(Exception):
    """Base class of ML-core errors; ``code`` is a stable string the services map."""

    code: str = "ml_error"


class InvalidSpecError(MlError, ValueError):
    """The spec, dataset or model directory cannot be used as asked."""

    code = "invalid_spec"


@dataclass(frozen=True)
class DpSpec:
    """Parameters of one DP-SGD job, exactly as the privacy ledger accounted them.

    Attributes:
        noise_multiplier: sigma; the noise std on the clipped sum is sigma * max_grad_norm.
        sample_rate: Poisson rate q = expected_batch_size / N_hat, used verbatim by the sampler.
        expected_batch_size: public normaliser of every update (never the realised size).
        max_grad_norm: per-example clipping norm C.
        steps: total logical steps of the job.
    """

    noise_multiplier: float
    sample_rate: float
    expected_batch_size: int
    max_grad_norm: float
    steps: int

    def __post_init__(self) -> None:
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier >= 0):
            raise InvalidSpecError("noise_multiplier must be finite and >= 0")
        if not (0.0 < self.sample_rate <= 1.0):
            raise InvalidSpecError("sample_rate must be in (0, 1]")
        if self.expected_batch_size < 1:
            raise InvalidSpecError("expected_batch_size must be >= 1")
        if not (math.isfinite(self.max_grad_norm) and self.max_grad_norm > 0):
            raise InvalidSpecError("max_grad_norm must be finite and > 0")
        if self.steps < 0:
            raise InvalidSpecError("steps must be >= 0")


@dataclass(frozen=True)
class TrainingSpec:
    """What to train; see the package docstring for the meaning of each field."""

    kind: TrainingKind
    preset: Preset = "tiny"
    image_size: int = 32
    channels: int = 1
    class_conditional: bool = True
    num_classes: int = 10
    trainable: Trainable = "attention"
    learning_rate: float = 3e-4
    epochs: int = 1
    batch_size: int = 64
    label_dropout: float = 0.1
    max_physical_batch_size: int = 64
    class_map: Mapping[int, int] | None = None
    checkpoint_every: int = 10
    seed: int = 0
    dp: DpSpec | None = None

    def __post_init__(self) -> None:
        if self.kind == "finetune" and self.dp is None:
            raise InvalidSpecError("a finetune needs a DpSpec")
        if self.kind == "pretrain" and self.dp is not None:
            raise InvalidSpecError("a pretrain must not carry a DpSpec (it is not private)")
        if self.preset not in ("tiny", "small"):
            raise InvalidSpecError(f"unknown preset {self.preset!r}")
        if self.trainable not in ("full", "attention"):
            raise InvalidSpecError(f"unknown trainable {self.trainable!r}")
        if self.image_size < 8 or self.image_size % 4 != 0:
            raise InvalidSpecError("image_size must be a multiple of 4 and >= 8")
        if self.channels not in (1, 3):
            raise InvalidSpecError("channels must be 1 or 3")
        if self.num_classes < 1:
            raise InvalidSpecError("num_classes must be >= 1")
        if not (0.0 <= self.label_dropout < 1.0):
            raise InvalidSpecError("label_dropout must be in [0, 1)")
        if min(self.epochs, self.batch_size, self.max_physical_batch_size) < 1:
            raise InvalidSpecError("epochs, batch_size and max_physical_batch_size must be >= 1")
        if self.checkpoint_every < 1:
            raise InvalidSpecError("checkpoint_every must be >= 1")
        if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
            raise InvalidSpecError("learning_rate must be finite and > 0")
        if self.class_map is not None:
            bad = [m for m in self.class_map.values() if not 0 <= m < self.num_classes]
            if bad:
                raise InvalidSpecError(f"class_map targets outside [0, num_classes): {bad}")


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
    """

    steps_completed: int
    stopped_early: bool
    model_dir: Path
    trainable_parameters: int
    total_parameters: int
    rng: RngKind


@dataclass(frozen=True)
class SampleResult:
    """Outcome of :func:`dpsynth_ml.sample`.

    Attributes:
        out_dir: root of the written PNGs (``out_dir/<class_name>/<i>.png``).
        counts: number of images written per class name.
        seed: the generation seed (generation is post-processing, so it may be recorded).
    """

    out_dir: Path
    counts: Mapping[str, int]
    seed: int

    @property
    def total(self) -> int:
        """Number of images written over all classes."""
        return sum(self.counts.values())


@dataclass(frozen=True)
class ModelInfo:
    """Contents of ``dpsynth_model.json`` in a model directory."""

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
