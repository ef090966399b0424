"""The one binding of :class:`dpsynth_worker.ml_port.MlPort` to the ML core's face.

Each call imports :mod:`dpsynth_ml` when it runs, never before: a worker process imports
torch with its first ML call, not at start (celery, settings and the HTTP clients come up
without it). Only the face (``dpsynth_ml.__all__``) is used, so the core may rearrange its
modules freely; an import contract in ``.importlinter`` holds the worker to it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from dpsynth_worker.ml_port import Images, Labels, MlPort, Progress, Sampler

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


@dataclass(frozen=True)
class MlAdapter:
    """The real ML core behind the port, with this worker's two ML settings; each method is
    the :class:`MlPort` call of the same name, forwarded to the face's function."""

    #: pytorch-fid's InceptionV3 weights on this worker (DPSYNTH_WORKER_INCEPTION_WEIGHTS)
    inception_weights: Path | None = None
    #: DPSYNTH_WORKER_DEVICES; "cpu" trains in this process on the CPU through ``train``
    devices: str = "cpu"

    def train(self, spec: TrainingSpec, *, dataset_path: Path, out_dir: Path,
              hooks: TrainingHooks, base_model_dir: Path | None = None,
              resume_from: Path | None = None) -> TrainingResult:
        import dpsynth_ml

        return dpsynth_ml.train(spec, dataset_path=dataset_path, out_dir=out_dir, hooks=hooks,
                                base_model_dir=base_model_dir, resume_from=resume_from)

    def train_placed(self, setting: str, spec: TrainingSpec, *, dataset_path: Path,
                     out_dir: Path, hooks: TrainingHooks, base_model_dir: Path | None = None,
                     resume_from: Path | None = None) -> TrainingResult:
        import dpsynth_ml

        return dpsynth_ml.train_placed(setting, spec, dataset_path=dataset_path,
                                       out_dir=out_dir, hooks=hooks,
                                       base_model_dir=base_model_dir, resume_from=resume_from)

    def initial_model(self, spec: PretrainTraining, class_names: Sequence[str],
                      out_dir: Path) -> Path:
        import dpsynth_ml

        return dpsynth_ml.initial_model(spec, class_names, out_dir)

    def check_training(self, spec: TrainingSpec, base_model_dir: Path) -> None:
        import dpsynth_ml

        dpsynth_ml.check_training(spec, base_model_dir)

    def audit_finetune(self, spec: FinetuneTraining, *, dataset_path: Path,
                       base_model_dir: Path, canaries: int, delta: float, seed: int,
                       confidence: float, claimed_mu: float | None,
                       tail_delta: float, audited_class: str | None,
                       devices: str) -> WhiteBoxAudit:
        import dpsynth_ml

        result = _audit_placed("white_box", devices, spec, dataset_path, base_model_dir,
                               canaries, delta, seed, confidence, claimed_mu, tail_delta,
                               audited_class)
        assert isinstance(result, dpsynth_ml.WhiteBoxAudit)
        return result

    def black_box_audit_finetune(self, spec: FinetuneTraining, *, dataset_path: Path,
                                 base_model_dir: Path, canaries: int, delta: float,
                                 seed: int, confidence: float, claimed_mu: float | None,
                                 tail_delta: float,
                                 audited_class: str | None,
                                 devices: str) -> BlackBoxAudit:
        import dpsynth_ml

        result = _audit_placed("black_box", devices, spec, dataset_path, base_model_dir,
                               canaries, delta, seed, confidence, claimed_mu, tail_delta,
                               audited_class)
        assert isinstance(result, dpsynth_ml.BlackBoxAudit)
        return result

    def dp_train_classifier(self, spec: ClassifierTraining, *, dataset_path: Path,
                            out_dir: Path, hooks: TrainingHooks, resume_from: Path | None,
                            device: str) -> TrainingResult:
        import dpsynth_ml

        return dpsynth_ml.dp_train_classifier(spec, dataset_path=dataset_path, out_dir=out_dir,
                                              hooks=hooks, resume_from=resume_from,
                                              device=device)

    def read_model_info(self, model_dir: Path) -> ModelInfo:
        import dpsynth_ml

        return dpsynth_ml.read_model_info(model_dir)

    def model_hash(self, model_dir: Path) -> str:
        import dpsynth_ml

        return dpsynth_ml.model_hash(model_dir)

    def sample(self, model_dir: Path, *, samples_per_class: int, sampler: Sampler, steps: int,
               guidance_scale: float, seed: int, out_dir: Path, batch_size: int,
               layouts: LayoutSet | None, progress: Progress | None,
               device: str = "cpu") -> SampleResult:
        import dpsynth_ml

        return dpsynth_ml.sample(model_dir, samples_per_class=samples_per_class,
                                 sampler=sampler, steps=steps, guidance_scale=guidance_scale,
                                 seed=seed, out_dir=out_dir, batch_size=batch_size,
                                 layouts=layouts, progress=progress, device=device)

    def is_layout_generator(self, info: ModelInfo) -> bool:
        import dpsynth_ml

        return dpsynth_ml.is_layout_generator(info)

    def sample_layouts(self, model_dir: Path, *, counts: Mapping[str, int], seed: int,
                       sampler: Sampler, steps: int, guidance_scale: float, batch_size: int,
                       per_class: bool, progress: Progress | None,
                       device: str = "cpu") -> LayoutSet:
        import dpsynth_ml

        return dpsynth_ml.sample_layouts(model_dir, counts=counts, seed=seed, sampler=sampler,
                                         steps=steps, guidance_scale=guidance_scale,
                                         batch_size=batch_size, per_class=per_class,
                                         progress=progress, device=device)

    def load_layouts(self, path: Path, *, per_class: bool) -> LayoutSet:
        import dpsynth_ml

        return dpsynth_ml.load_layouts(path, per_class=per_class)

    def load_dataset(self, path: Path) -> ImageDataset:
        import dpsynth_ml

        return dpsynth_ml.load_dataset(path)

    def image_dataset(self, images: Images, labels: Labels,
                      class_names: tuple[str, ...]) -> ImageDataset:
        import dpsynth_ml

        return dpsynth_ml.ImageDataset(images=images, labels=labels, class_names=class_names)

    def train_feature_net(self, images: Images, labels: Labels, *, class_names: Sequence[str],
                          image_size: int, channels: int, epochs: int, batch_size: int,
                          learning_rate: float, seed: int, out_dir: Path,
                          val_images: Images | None, val_labels: Labels | None,
                          validation_fraction: float,
                          progress: Progress | None, device: str = "cpu") -> FeatureNetInfo:
        import dpsynth_ml

        return dpsynth_ml.train_feature_net(
            images, labels, class_names=class_names, image_size=image_size, channels=channels,
            epochs=epochs, batch_size=batch_size, learning_rate=learning_rate, seed=seed,
            out_dir=out_dir, val_images=val_images, val_labels=val_labels,
            validation_fraction=validation_fraction, progress=progress, device=device)

    def load_feature_net(self, directory: Path) -> tuple[FeatureNet, FeatureNetInfo]:
        import dpsynth_ml

        return dpsynth_ml.load_feature_net(directory)

    def check_feature_net(self, net: FeatureNet, info: FeatureNetInfo, images: Images,
                          labels: Labels, *, min_accuracy: float) -> float:
        import dpsynth_ml

        return dpsynth_ml.check_feature_net(net, info, images, labels,
                                            min_accuracy=min_accuracy)

    def evaluate_corpus(self, synthetic: ImageDataset, real_train: ImageDataset,
                        real_holdout: ImageDataset, *, classifiers: Sequence[str],
                        feature_net_dir: Path | None,
                        feature_check: tuple[Images, Labels] | None,
                        min_feature_accuracy: float, prdc_k: int, max_images: int, seed: int,
                        inception_weights: Path | None,
                        progress: Progress | None, device: str = "cpu") -> EvaluationResult:
        import dpsynth_ml

        return dpsynth_ml.evaluate_corpus(
            synthetic, real_train, real_holdout, classifiers=classifiers,
            feature_net_dir=feature_net_dir, feature_check=feature_check,
            min_feature_accuracy=min_feature_accuracy, prdc_k=prdc_k, max_images=max_images,
            seed=seed, inception_weights=inception_weights, progress=progress, device=device)

    def holdout_correct_counts(self, classifiers: Mapping[str, Classifier], images: Images,
                               labels: Labels) -> dict[str, int]:
        import dpsynth_ml

        return dpsynth_ml.holdout_correct_counts(classifiers, images, labels)

    def release_accuracies(self, counts: Sequence[int], *, sigma: float, holdout_size: int,
                           rng: NormalSource) -> list[dict[str, float]]:
        import dpsynth_ml

        return dpsynth_ml.release_accuracies(counts, sigma=sigma, holdout_size=holdout_size,
                                             rng=rng)


if TYPE_CHECKING:
    _BINDS_THE_PORT: MlPort = MlAdapter()  # the type checker holds the adapter to the port


def _audit_placed(mode: Literal["white_box", "black_box"], devices: str,
                  spec: FinetuneTraining, dataset_path: Path,
                  base_model_dir: Path, canaries: int, delta: float, seed: int,
                  confidence: float, claimed_mu: float | None, tail_delta: float,
                  audited_class: str | None) -> WhiteBoxAudit | BlackBoxAudit:
    """Both audit calls: ``dpsynth_ml.audit_placed`` with ``seed`` keying the generator."""
    import dpsynth_ml
    import torch

    return dpsynth_ml.audit_placed(
        mode, devices, spec, dataset_path=dataset_path, base_model_dir=base_model_dir,
        canaries=canaries, delta=delta, generator=torch.Generator().manual_seed(seed),
        confidence=confidence, claimed_mu=claimed_mu, tail_delta=tail_delta,
        audited_class=audited_class)
