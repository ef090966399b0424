"""The ``dp_train`` job's spec (issue 20): train a downstream model directly on a private
dataset with DP-SGD / DP-Adam, charged to the dataset's budget like a finetune.

The DP settings follow the finetune's: the privacy block's ``target_epsilon`` and
``max_grad_norm``; ``expected_batch_size`` and ``epochs`` give the ledger's q = B / N̂ and
steps; the dataset's privacy unit decides record- or subject-level DP-SGD (docs/dp-train.md).
Defaults follow PrIeD-KIE's and De et al.'s guidance for DP-Adam (a large batch, few
epochs, a learning rate of 1e-3 to 3e-3, clip 1); they are fixed in advance, never chosen on
the private data.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from dpsynth_shared.spec_base import SpecBase
from dpsynth_shared.text import MAX_INT32, MIN_EPSILON

ClassifierArchitecture = Literal["cnn", "gn_resnet"]


class DpTrainPrivacy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    target_epsilon: float = Field(ge=MIN_EPSILON, le=100, description="This job's standalone "
                                  "epsilon (tight accountant) at the dataset's delta, at least "
                                  "1e-3.")
    max_grad_norm: float = Field(1.0, gt=0, le=1e4, description="C: each image's (or "
                                 "subject's) gradient is clipped to this L2 norm")


class DpTrainClassifier(BaseModel):
    """An image classifier trained directly with DP (``task: image_classification``)."""

    model_config = ConfigDict(extra="forbid")

    architecture: ClassifierArchitecture = Field(
        "cnn", description="cnn: the evaluation library's CNN (the same network an evaluate "
        "job trains on a synthetic corpus); gn_resnet: a small GroupNorm ResNet")
    image_size: int = Field(28, ge=8, le=256, description="the classifier's input side; the "
                            "dataset's images are resized to it")
    channels: Literal[1, 3] = 1
    optimizer: Literal["adam", "sgd"] = Field("adam", description="adam: DP-Adam; sgd: "
                                              "DP-SGD with momentum 0.9")
    learning_rate: float = Field(1e-3, gt=0, le=10)
    expected_batch_size: int = Field(1024, ge=1, le=MAX_INT32, description="mean Poisson "
                                     "batch (subjects for a subject-level dataset)")
    epochs: float = Field(10, gt=0, le=10_000)
    max_physical_batch_size: int = Field(256, ge=1, le=4096)
    checkpoint_every: int = Field(50, ge=1, le=MAX_INT32)
    max_images_per_subject: int = Field(
        8, ge=1, le=4096, description="subject-level datasets: each sampled subject "
        "contributes the mean gradient of up to this many of its images, clipped once")


class DpTrainSpec(SpecBase):
    """Direct DP training of a downstream model on a private dataset."""

    type: Literal["dp_train"] = "dp_train"
    task: Literal["image_classification"] = Field(
        "image_classification", description="what is trained (document KIE with LayoutLMv3 "
        "is not offered as a job yet: docs/kie.md)")
    dataset_id: str
    privacy: DpTrainPrivacy
    training: DpTrainClassifier = DpTrainClassifier()


__all__ = ["ClassifierArchitecture", "DpTrainClassifier", "DpTrainPrivacy", "DpTrainSpec"]
