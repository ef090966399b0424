"""Versioned job specs: a pydantic discriminated union validated at submission.

Jobs carry no delta: the dataset's delta applies (DESIGN §3). ``expected_batch_size`` is the
mean of the Poisson batch; the ledger turns it into q = expected_batch_size / N̂.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

SPEC_VERSION = 1


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    spec_version: Literal[1] = 1


class PretrainSpec(_Spec):
    """Non-private pretraining of the autoencoder and the denoiser on a public dataset."""

    type: Literal["pretrain"] = "pretrain"
    dataset_id: str
    preset: Literal["tiny", "small"] = "small"
    image_size: int = Field(32, ge=8, le=256)
    channels: Literal[1, 3] = 1
    class_conditional: bool = True
    epochs: int = Field(10, ge=1, le=10_000)
    batch_size: int = Field(64, ge=1, le=4096)
    learning_rate: float = Field(1e-3, gt=0, le=1)
    label_dropout: float = Field(0.1, ge=0, lt=1)
    seed: int = 0

    @model_validator(mode="after")
    def _size(self) -> PretrainSpec:
        if self.image_size % 4:
            raise ValueError("image_size must be a multiple of 4")
        return self


class PrivacySpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    target_epsilon: float = Field(gt=0, le=100, description="This job's standalone epsilon "
                                  "(tight accountant) at the dataset's delta.")
    max_grad_norm: float = Field(1.0, gt=0, le=1e4)


class FinetuneTraining(BaseModel):
    model_config = ConfigDict(extra="forbid")

    trainable: Literal["full", "attention"] = "attention"
    expected_batch_size: int = Field(256, ge=1)
    epochs: float = Field(5, gt=0, le=10_000)
    learning_rate: float = Field(3e-4, gt=0, le=1)
    class_conditional: bool = True
    label_dropout: float = Field(0.1, ge=0, lt=1)
    max_physical_batch_size: int = Field(64, ge=1, le=4096)
    class_map: dict[str, str] | None = Field(
        None,
        description="Private class name -> base model class name. Without it the class "
        "embedding is re-initialised and trained under DP.",
    )
    checkpoint_every: int = Field(10, ge=1)


class FinetuneSpec(_Spec):
    """DP fine-tuning of a pretrained model on a private dataset."""

    type: Literal["finetune"] = "finetune"
    dataset_id: str
    base_model_id: str
    privacy: PrivacySpec
    training: FinetuneTraining = FinetuneTraining()


class GenerateSpec(_Spec):
    """Sampling a synthetic corpus from a model. Costs no privacy budget."""

    type: Literal["generate"] = "generate"
    model_id: str
    samples_per_class: int = Field(100, ge=1, le=100_000)
    sampler: Literal["ddpm", "ddim"] = "ddim"
    steps: int = Field(50, ge=1, le=1000)
    guidance_scale: float = Field(2.0, ge=0, le=50)
    seed: int = 0


JobSpec = Annotated[PretrainSpec | FinetuneSpec | GenerateSpec, Field(discriminator="type")]
JobType = Literal["pretrain", "finetune", "generate"]


def steps_for(*, epochs: float, expected_batch_size: int, declared_size: int) -> int:
    """Logical steps of a DP job: ceil(epochs · N̂ / expected_batch_size), at least 1."""
    import math

    return max(1, math.ceil(epochs * declared_size / expected_batch_size - 1e-9))
