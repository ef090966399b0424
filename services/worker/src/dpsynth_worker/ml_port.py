"""The worker's port to the ML core: every ML call a runner makes, with its real signature.

Runners reach :mod:`dpsynth_ml` only through ``JobContext.ml``, an :class:`MlPort`; the one
adapter, :class:`dpsynth_worker.ml_adapter.MlAdapter`, binds it to the core's face
(``dpsynth_ml.__all__``) and imports torch on the first call only. Runner tests hand in a
fake that matches this protocol structurally.

The core's types (specs, hooks, results, datasets) are named here for the type checker only:
this module imports nothing of the core at run time, so importing the worker never imports
torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:
    from dpsynth_ml import (
        BlackBoxAudit,
        Classifier,
        ClassifierTraining,
        EvaluationResult,
        FeatureNet,
        FeatureNetInfo,
        FinetuneTraining,
        ImageDataset,
        LayoutSet,
        ModelInfo,
        PretrainTraining,
        SampleResult,
        TrainingHooks,
        TrainingResult,
        TrainingSpec,
        WhiteBoxAudit,
    )
    from dpsynth_shared.secure_noise import NormalSource

#: ``progress(done, total)``: called by long ML calls; it may raise to stop at a boundary.
Progress = Callable[[int, int], None]
#: The diffusion samplers (``GenerateSpec.sampler``).
Sampler = Literal["ddpm", "ddim", "dpm_solver++"]
#: Images, uint8 [N, H, W, C].
Images = NDArray[np.uint8]
#: Labels (or indices), integers [N].
Labels = NDArray[np.int64]


class MlPort(Protocol):
    """What a runner may ask of the ML core (docs/ml-core.md describes each call)."""

    @property
    def inception_weights(self) -> Path | None:
        """pytorch-fid's InceptionV3 weights on this worker (DPSYNTH_WORKER_INCEPTION_WEIGHTS);
        None: evaluate jobs asking for Inception FID fail with inception_weights_unavailable."""
        ...

    @property
    def devices(self) -> str:
        """DPSYNTH_WORKER_DEVICES; ``"cpu"`` trains in this process through :meth:`train`.
        Single-device calls take its first device (``dpsynth_worker.devices.first_device``)."""
        ...

    # --- training -------------------------------------------------------------------------

    def train(self, spec: TrainingSpec, *, dataset_path: Path, out_dir: Path,
              hooks: TrainingHooks, base_model_dir: Path | None = None,
              resume_from: Path | None = None) -> TrainingResult:
        """Pretrain or DP-finetune in this process, on the CPU."""
        ...

    def train_placed(self, setting: str, spec: TrainingSpec, *, dataset_path: Path,
                     out_dir: Path, hooks: TrainingHooks, base_model_dir: Path | None = None,
                     resume_from: Path | None = None) -> TrainingResult:
        """:meth:`train` on the devices of ``setting`` (rank 0 is this process)."""
        ...

    def initial_model(self, spec: PretrainTraining, class_names: Sequence[str],
                      out_dir: Path) -> Path:
        """Write a seeded, untrained pixel-space model (no data read); its folder."""
        ...

    def check_training(self, spec: TrainingSpec, base_model_dir: Path) -> None:
        """Refuse a finetune spec its base model cannot run, before any data is read."""
        ...

    def audit_finetune(self, spec: FinetuneTraining, *, dataset_path: Path,
                       base_model_dir: Path, canaries: int, delta: float, seed: int,
                       confidence: float, claimed_mu: float | None,
                       tail_delta: float, audited_class: str | None,
                       devices: str) -> WhiteBoxAudit:
        """White-box one-run audit of ``spec``'s DP-SGD on the PUBLIC stand-in at
        ``dataset_path`` (``dpsynth_ml.audit_placed``; ``seed`` keys rank 0's stand-in
        sampling and the canaries, the DP noise stays OS-keyed; ``audited_class``: a
        per-label finetune's class whose run is audited; ``devices``: the worker's DEVICES
        setting, placed as the finetune was, one rank per device for a whole-dataset one;
        the result says where it ran). The model it trains is the audit's and is not kept."""
        ...

    def black_box_audit_finetune(self, spec: FinetuneTraining, *, dataset_path: Path,
                                 base_model_dir: Path, canaries: int, delta: float,
                                 seed: int, confidence: float, claimed_mu: float | None,
                                 tail_delta: float,
                                 audited_class: str | None,
                                 devices: str) -> BlackBoxAudit:
        """Black-box one-run audit (``dpsynth_ml.black_box_audit_finetune``): noise-image
        canaries among the stand-in's records (a subject-level ``spec``: whole canary
        subjects among its subjects), scored on the finished model, which is not kept;
        placed as :meth:`audit_finetune` is."""
        ...

    def dp_train_classifier(self, spec: ClassifierTraining, *, dataset_path: Path,
                            out_dir: Path, hooks: TrainingHooks, resume_from: Path | None,
                            device: str) -> TrainingResult:
        """Direct DP training of a classifier on the private dataset at ``dataset_path``
        (``dpsynth_ml.dp_train_classifier``; the sampling and the noise are OS-keyed), on
        ``device``; its model folder is ``result.model_dir``."""
        ...

    # --- models ---------------------------------------------------------------------------

    def read_model_info(self, model_dir: Path) -> ModelInfo:
        """The ``dpsynth_model.json`` of a model folder."""
        ...

    def model_hash(self, model_dir: Path) -> str:
        """The sha256 over a model folder's files."""
        ...

    # --- sampling -------------------------------------------------------------------------

    def sample(self, model_dir: Path, *, samples_per_class: int, sampler: Sampler, steps: int,
               guidance_scale: float, seed: int, out_dir: Path, batch_size: int,
               layouts: LayoutSet | None, progress: Progress | None,
               device: str = "cpu") -> SampleResult:
        """Write ``samples_per_class`` PNGs per class under ``out_dir``; the model and the
        diffusion noise on ``device`` (:func:`dpsynth_worker.devices.first_device`)."""
        ...

    def is_layout_generator(self, info: ModelInfo) -> bool:
        """Whether a model was trained on layout masks (``target: masks``)."""
        ...

    def sample_layouts(self, model_dir: Path, *, counts: Mapping[str, int], seed: int,
                       sampler: Sampler, steps: int, guidance_scale: float, batch_size: int,
                       per_class: bool, progress: Progress | None,
                       device: str = "cpu") -> LayoutSet:
        """Draw binarised layout masks per class name from a layout generator."""
        ...

    def load_layouts(self, path: Path, *, per_class: bool) -> LayoutSet:
        """The layout masks of a canonical dataset file."""
        ...

    # --- datasets -------------------------------------------------------------------------

    def load_dataset(self, path: Path) -> ImageDataset:
        """Load and validate a canonical ``.npz`` dataset."""
        ...

    def image_dataset(self, images: Images, labels: Labels,
                      class_names: tuple[str, ...]) -> ImageDataset:
        """An in-memory dataset (a synthetic corpus read from its zip)."""
        ...

    # --- evaluation -----------------------------------------------------------------------

    def train_feature_net(self, images: Images, labels: Labels, *, class_names: Sequence[str],
                          image_size: int, channels: int, epochs: int, batch_size: int,
                          learning_rate: float, seed: int, out_dir: Path,
                          val_images: Images | None, val_labels: Labels | None,
                          validation_fraction: float,
                          progress: Progress | None, device: str = "cpu") -> FeatureNetInfo:
        """Train a feature network on PUBLIC records (on ``device``), write it to ``out_dir``."""
        ...

    def load_feature_net(self, directory: Path) -> tuple[FeatureNet, FeatureNetInfo]:
        """Load a feature network folder (its weights' sha256 checked)."""
        ...

    def check_feature_net(self, net: FeatureNet, info: FeatureNetInfo, images: Images,
                          labels: Labels, *, min_accuracy: float) -> float:
        """Re-measure the network's accuracy on public records; refuse it below threshold."""
        ...

    def evaluate_corpus(self, synthetic: ImageDataset, real_train: ImageDataset,
                        real_holdout: ImageDataset, *, classifiers: Sequence[str],
                        feature_net_dir: Path | None,
                        feature_check: tuple[Images, Labels] | None,
                        min_feature_accuracy: float, prdc_k: int, max_images: int, seed: int,
                        inception_weights: Path | None,
                        progress: Progress | None, device: str = "cpu") -> EvaluationResult:
        """Every metric of an evaluate job; the networks run on ``device``."""
        ...

    def holdout_correct_counts(self, classifiers: Mapping[str, Classifier], images: Images,
                               labels: Labels) -> dict[str, int]:
        """Per classifier, its correct answers over every held-out record (never released)."""
        ...

    def release_accuracies(self, counts: Sequence[int], *, sigma: float, holdout_size: int,
                           rng: NormalSource) -> list[dict[str, float]]:
        """The noised, normalised accuracies of a DP evaluation (after the ledger's charge)."""
        ...
