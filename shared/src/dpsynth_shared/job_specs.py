"""Versioned job specs: a pydantic discriminated union validated at submission.

Jobs carry no delta: the dataset's delta applies (docs/privacy.md). ``expected_batch_size`` is the
mean of the Poisson batch; the ledger turns it into q = expected_batch_size / N̂.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dpsynth_shared.audit_specs import AuditSpec as AuditSpec
from dpsynth_shared.central_images import CentralImagesSpec
from dpsynth_shared.dp_train_specs import DpTrainSpec as DpTrainSpec
from dpsynth_shared.evaluate_specs import ClassifierKind as ClassifierKind
from dpsynth_shared.evaluate_specs import DpEvaluationSpec as DpEvaluationSpec
from dpsynth_shared.evaluate_specs import EvaluateSpec as EvaluateSpec
from dpsynth_shared.evaluate_specs import FeatureNetSpec as FeatureNetSpec
from dpsynth_shared.spec_base import SPEC_VERSION as SPEC_VERSION
from dpsynth_shared.spec_base import SpecBase as _Spec
from dpsynth_shared.text import MAX_INT32, MIN_EPSILON, Name

UnetClass = Literal["UNet2DConditionModel", "UNet2DModel"]


class Architecture(BaseModel):
    """A fully custom model instead of a preset: diffusers config dicts, checked by the
    worker against an allow-list of keys and size limits (no custom or remote code)."""

    model_config = ConfigDict(extra="forbid")

    unet_class: UnetClass = "UNet2DConditionModel"
    unet: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of "
                                 "the diffusers UNet class (sample_size/in/out channels are "
                                 "set by the platform)")
    vae: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of "
                                "diffusers AutoencoderKL (in/out channels set by the platform)")


#: What a training job learns to generate: the dataset's images, or its layout masks
#: (a layout generator: masks taken as grayscale images, with the same labels).
TrainingTarget = Literal["images", "masks"]

#: Where a model's denoiser works: on the autoencoder's latents, or on the pixels themselves.
DenoiserSpace = Literal["latent", "pixel"]

#: The largest image side a pixel-space denoiser takes (a UNet on pixels grows with the image;
#: latent models are for larger images).
MAX_PIXEL_IMAGE_SIZE = 64

_SPACE_DOC = ("latent: the presets' autoencoder (diffusers AutoencoderKL) and a UNet on its "
              "latents (any image_size); pixel: no autoencoder, the UNet denoises the images "
              f"themselves (image_size at most {MAX_PIXEL_IMAGE_SIZE}, i.e. up to "
              f"{MAX_PIXEL_IMAGE_SIZE}x{MAX_PIXEL_IMAGE_SIZE}); finetunes and generation "
              "keep the base model's space")

_TARGET_DOC = ("images, or masks: train on the dataset's layout masks as if they were the "
               "images (same labels, grayscale), i.e. a class-conditional generator of "
               "layout masks usable as GenerateSpec.layout_source.model_id (the dataset must "
               "carry masks)")


_TIMESTEPS_DOC = ("how training timesteps are drawn: uniform over the scheduler's steps "
                  "(DDPM), or edm_log_normal: the noise level log-normal with p_mean -1.2, "
                  "p_std 1.2 (EDM; DPDM and DP-FETA train Fashion-MNIST so), nearest step")


class PretrainSpec(_Spec):
    """Non-private pretraining on a public dataset: of the autoencoder and the latent
    denoiser (space 'latent'), or of a denoiser on the pixels alone (space 'pixel', images up
    to 64x64)."""

    type: Literal["pretrain"] = "pretrain"
    dataset_id: str | None = Field(None, description="the PUBLIC dataset to train on; "
                                   "required unless initialise_only")
    initialise_only: bool = Field(
        False, description="train nothing: write a seeded, untrained pixel-space model for "
        "class_names, the base of a finetune with no public data at all (warmed up on the "
        "private data's DP central images, training.central_images; DP-FETA). Needs space "
        "'pixel' and class_names, and takes no dataset")
    class_names: list[Name] | None = Field(
        None, min_length=1, max_length=1000, description="with initialise_only: the classes "
        "of the model (the private dataset's declared label domain)")
    preset: Literal["tiny", "small", "base", "custom"] = "small"
    architecture: Architecture | None = Field(
        None, description="required with preset 'custom', forbidden otherwise (with space "
        "'pixel' its vae must be empty)")
    space: DenoiserSpace = Field("latent", description=_SPACE_DOC)
    image_size: int = Field(32, ge=8, le=256, description="side of the square images the "
                            f"model makes (a multiple of 4; at most {MAX_PIXEL_IMAGE_SIZE} "
                            "with space 'pixel')")
    channels: Literal[1, 3] = 1
    class_conditional: bool = True
    layout_conditioning: bool = Field(
        False, description="DP-DocLDM: the dataset's layout masks, encoded by the same "
        "autoencoder (space 'pixel': as pixels), are concatenated to the denoiser's noisy "
        "input (the dataset must carry masks)")
    target: TrainingTarget = Field("images", description=_TARGET_DOC)
    epochs: int = Field(10, ge=1, le=10_000)
    batch_size: int = Field(64, ge=1, le=4096)
    learning_rate: float = Field(1e-3, gt=0, le=1)
    label_dropout: float = Field(0.1, ge=0, lt=1)
    timestep_distribution: Literal["uniform", "edm_log_normal"] = Field(
        "uniform", description=_TIMESTEPS_DOC)
    seed: int = Field(0, ge=0, le=MAX_INT32)
    reuse: bool = Field(
        True, description="content-addressed reuse: when this tenant already has a "
        "SUCCEEDED pretrain of the same settings on the same data (the dataset's content "
        "hash and selection, not its id), whose model still exists, the submission answers "
        "200 with that job instead of training again; false always trains")

    @model_validator(mode="after")
    def _size(self) -> PretrainSpec:
        if self.initialise_only:
            if self.dataset_id is not None or not self.class_names:
                raise ValueError("initialise_only takes class_names and no dataset_id")
            if len(set(self.class_names)) != len(self.class_names):
                raise ValueError("class_names must be distinct")
            if self.space != "pixel" or self.layout_conditioning or self.target != "images":
                raise ValueError("initialise_only writes a pixel-space image model without "
                                 "layout conditioning (a latent model's autoencoder must be "
                                 "pretrained on public data)")
        elif self.dataset_id is None or self.class_names is not None:
            raise ValueError("a pretrain trains on a dataset_id (class_names only with "
                             "initialise_only)")
        if self.image_size % 4:
            raise ValueError("image_size must be a multiple of 4")
        if (self.preset == "custom") != (self.architecture is not None):
            raise ValueError("an architecture is given exactly when preset is 'custom'")
        if self.space == "pixel" and self.image_size > MAX_PIXEL_IMAGE_SIZE:
            raise ValueError(f"space 'pixel' takes image_size at most {MAX_PIXEL_IMAGE_SIZE} "
                             "(a UNet on pixels); use space 'latent' for larger images")
        if self.space == "pixel" and self.architecture is not None and self.architecture.vae:
            raise ValueError("space 'pixel' has no autoencoder: architecture.vae must be empty")
        if self.target == "masks" and (self.layout_conditioning or self.channels != 1):
            raise ValueError("a layout generator (target 'masks') is grayscale (channels 1) "
                             "and not layout-conditioned itself")
        return self


class PrivacySpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    target_epsilon: float = Field(ge=MIN_EPSILON, le=100, description="This job's standalone "
                                  "epsilon (tight accountant) at the dataset's delta, at least "
                                  "1e-3.")
    max_grad_norm: float = Field(1.0, gt=0, le=1e4)


Trainable = Literal["full", "attention", "output_attention", "blocks", "lora"]


class DpPromise(BaseModel):
    """Phase 1 of DP-Promise (Wang et al., USENIX Security 2024); see
    docs/privacy/dp-promise.md for why the platform does not offer it yet."""

    model_config = ConfigDict(extra="forbid")

    phase1_epochs: int = Field(1, ge=1, le=1000, description="whole epochs: each re-noising "
                               "of a record is one more Gaussian release")
    phase1_min_timestep: int = Field(900, ge=0, le=999, description="phase 1 trains only "
                                     "on timesteps t >= this (high forward-noise regime)")
    latent_clip: float = Field(gt=0, description="L2 bound R every latent is clipped to (no "
                               "default: it must fit the autoencoder's latent norms)")


class FinetuneTraining(BaseModel):
    model_config = ConfigDict(extra="forbid")

    algorithm: Literal["dp_sgd", "dp_promise"] = Field(
        "dp_sgd", description="dp_sgd (DP-LDMs / DPDM); dp_promise is refused, see "
        "docs/privacy/dp-promise.md")
    dp_promise: DpPromise | None = None
    trainable: Trainable = Field(
        "attention", description="full UNet; attention (all self- and cross-attention, "
        "DP-LDMs); output_attention (attention of the up blocks only); blocks (the UNet "
        "module-name prefixes in `blocks`); lora (LoRA adapters on the attention "
        "projections, DP-LoRA)")
    blocks: list[str] | None = Field(
        None, min_length=1, max_length=256,
        description="with trainable 'blocks': UNet module-name prefixes, e.g. "
        "'up_blocks.1.attentions'")
    lora_rank: int = Field(4, ge=1, le=256)
    lora_alpha: float | None = Field(None, gt=0, le=4096, description="default: lora_rank")
    train_embedder: bool | None = Field(
        None, description="train the class embedder too; default: only when there is no "
        "class_map (new labels must be learnt)")
    noise_multiplicity: int = Field(
        1, ge=1, le=256, description="K (DPDM): each sampled example's loss is averaged "
        "over K (timestep, noise) draws before its one gradient is clipped")
    per_label: bool = Field(
        False, description="DP-DocLDM: one model per declared class, each DP-trained on its "
        "class only (needs public class sizes declared at upload)")
    target: TrainingTarget = Field(
        "images", description=_TARGET_DOC + "; the masks are private data of the dataset: "
        "the job is an ordinary DP finetune, charged to the dataset's budget")
    expected_batch_size: int = Field(256, ge=1, le=MAX_INT32, description="mean Poisson "
                                     "batch; per class with per_label (capped at the class's "
                                     "declared size)")
    epochs: float = Field(5, gt=0, le=10_000)
    learning_rate: float = Field(3e-4, gt=0, le=1)
    warmup_steps: int = Field(0, ge=0, le=1_000_000, description="linear learning-rate "
                              "warm-up over this many logical steps")
    ema_decay: float | None = Field(None, gt=0, lt=1, description="keep an exponential "
                                    "moving average of the trained weights; the released "
                                    "model is the average")
    class_conditional: bool = True
    label_dropout: float = Field(0.1, ge=0, lt=1)
    timestep_distribution: Literal["uniform", "edm_log_normal"] = Field(
        "uniform", description=_TIMESTEPS_DOC)
    max_physical_batch_size: int = Field(64, ge=1, le=4096)
    class_map: dict[str, str] | None = Field(
        None,
        description="Private class name -> base model class name. Without it the class "
        "embedding is re-initialised and trained under DP.",
    )
    checkpoint_every: int = Field(10, ge=1, le=MAX_INT32)
    central_images: CentralImagesSpec | None = Field(
        None, description="DP-FETA warm-up that needs no public data: release the per-class "
        "means of the private images once through the Gaussian mechanism (charged to the "
        "budget as its own event, under the same filter), warm the whole denoiser up on them, "
        "then DP-SGD (docs/privacy.md, 'Central images'). Needs public class sizes declared "
        "at upload; not with per_label or target 'masks'")
    max_images_per_subject: int = Field(
        8, ge=1, le=4096, description="datasets whose privacy unit is 'subject' (user-level "
        "DP-SGD): each sampled subject contributes the mean gradient of up to this many of "
        "its images, chosen uniformly each step, clipped once; it bounds compute, not privacy "
        "(a subject's sensitivity is the clip norm whatever its image count)")

    @model_validator(mode="after")
    def _consistent(self) -> FinetuneTraining:
        if (self.trainable == "blocks") != (self.blocks is not None):
            raise ValueError("`blocks` is given exactly when trainable is 'blocks'")
        if (self.algorithm == "dp_promise") != (self.dp_promise is not None):
            raise ValueError("`dp_promise` is given exactly when algorithm is 'dp_promise'")
        if self.per_label and self.class_map is not None:
            raise ValueError("per_label trains one unconditional model per class; a "
                             "class_map does not apply")
        if self.central_images is not None and (self.per_label or self.target == "masks"
                                                or not self.class_conditional):
            raise ValueError("central_images warms up one class-conditional image model: "
                             "not with per_label, target 'masks' or class_conditional false")
        if self.per_label and self.target == "masks":
            raise ValueError("a layout generator (target 'masks') is one class-conditional "
                             "model: per_label does not apply")
        return self


class FinetuneSpec(_Spec):
    """DP fine-tuning of a pretrained model on a private dataset."""

    type: Literal["finetune"] = "finetune"
    dataset_id: str
    base_model_id: str
    privacy: PrivacySpec
    training: FinetuneTraining = FinetuneTraining()


class LayoutSource(BaseModel):
    """Where the layout masks of a layout-conditioned generation come from: exactly one of
    ``dataset_id`` (a PUBLIC dataset with masks) or ``model_id`` (a layout generator).

    Masks copied from a private dataset are refused: a mask copied from a private record has
    unbounded privacy loss, so no charge could cover it (``private_conditioning_refused``).
    A layout generator (a model trained with ``target: masks``) was either pretrained on
    public masks or DP-finetuned on a private dataset's masks, charged to that dataset's
    budget; sampling masks from it is post-processing and costs nothing more.
    """

    model_config = ConfigDict(extra="forbid")

    dataset_id: str | None = Field(None, description="a PUBLIC dataset carrying layout masks "
                                   "(public document layouts, or masks the uploader declared "
                                   "public)")
    model_id: str | None = Field(None, description="a layout-generator model (trained with "
                                 "target 'masks'; public-pretrained, or DP-trained)")
    per_class: bool = Field(True, description="draw each class's layouts from that class's "
                            "masks when the layout source has the class")

    @model_validator(mode="after")
    def _one_source(self) -> LayoutSource:
        if (self.dataset_id is None) == (self.model_id is None):
            raise ValueError("give exactly one of dataset_id / model_id")
        return self


class GenerateSpec(_Spec):
    """Sampling a synthetic corpus from a model. Costs no privacy budget."""

    type: Literal["generate"] = "generate"
    model_id: str
    samples_per_class: int = Field(100, ge=1, le=100_000)
    sampler: Literal["ddpm", "ddim", "dpm_solver++"] = "ddim"
    steps: int = Field(50, ge=1, le=1000)
    guidance_scale: float = Field(2.0, ge=0, le=50)
    batch_size: int = Field(64, ge=1, le=4096)
    layout_source: LayoutSource | None = Field(
        None, description="required by layout-conditioned models")
    seed: int = Field(0, ge=0, le=MAX_INT32)


JobSpec = Annotated[PretrainSpec | FinetuneSpec | GenerateSpec | FeatureNetSpec | EvaluateSpec
                    | AuditSpec | DpTrainSpec, Field(discriminator="type")]


def steps_for(*, epochs: float, expected_batch_size: int, declared_size: int) -> int:
    """Logical steps of a DP job: ceil(epochs · N̂ / expected_batch_size), at least 1."""
    import math

    return max(1, math.ceil(epochs * declared_size / expected_batch_size - 1e-9))


def public_holdout_size(*, declared_size: int, holdout_fraction: float) -> int:
    """N̂_h, the PUBLIC held-out size that normalises a DP evaluation's counts.

    N̂ is the declared (public) size of the TRAINING part and f the public fraction of units
    held out, so the held-out part is about N̂·f/(1 − f) units: N̂_h = max(1, round(that)).
    It is a function of public values only (never the true held-out count, which is private
    under add/remove); when it is off, a released accuracy is scaled by N_h/N̂_h, but its
    privacy is unchanged (the sensitivity is 1/N̂_h per number whatever N_h).
    """
    if not 0 < holdout_fraction < 1:
        raise ValueError("holdout_fraction must be in (0, 1)")
    return max(1, round(declared_size * holdout_fraction / (1 - holdout_fraction)))
