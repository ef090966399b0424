"""``evaluate_corpus``: every metric of an evaluate job on one synthetic corpus against real
training and real held-out data (docs/evaluation.md).

The library computes; the runner reads the data (with the ledger's grant for a private
reference), fills in identifiers (job, model and dataset ids) and writes the report. Nothing
here logs a metric: on a private reference every number is non-DP and goes only into the
owner-only report.

This module checks the inputs, runs phase 1 (subsample and resize) and assembles the report;
the run state and the metric phases are in :mod:`dpsynth_ml.evaluation.corpus_phases`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpsynth_ml.data import ImageDataset, images_to_tensor
from dpsynth_ml.evaluation.classifiers import CLASSIFIER_SETTINGS

# the run state and the metric phases live in their own module (SETS and Progress re-exported)
from dpsynth_ml.evaluation.corpus_phases import SETS as SETS
from dpsynth_ml.evaluation.corpus_phases import Progress as Progress
from dpsynth_ml.evaluation.corpus_phases import (
    _classifier_scores,
    _feature_metrics,
    _inception_fid,
    _pixel_memorisation,
    _Run,
    _Steps,
    _subsample,
)
from dpsynth_ml.evaluation.errors import FeatureNetworkRejected
from dpsynth_ml.evaluation.featnet import (
    FeatureNet,
    FeatureNetInfo,
    accuracy_threshold,
    feature_net_accuracy,
    load_feature_net,
)
from dpsynth_ml.evaluation.metrics import MEMORISATION_RATIO, MemorisationResult
from dpsynth_ml.spec import InvalidSpecError


@dataclass
class EvaluationResult:
    """What an evaluation computed.

    Attributes:
        document: the metric part of ``dpsynth_shared.evaluation.EvaluationReport``: keys
            ``headline``, ``classifiers``, ``feature_network`` (None without a feature
            network; the runner adds ``model_id`` and ``dataset_id``), ``per_class``,
            ``memorisation``, ``notes``, ``settings``, ``sizes``. JSON-ready (no NaN).
        class_names: the reference's label domain (labels below index it).
        images: per set ("synthetic", "real_train", "real_holdout") the evaluated images,
            uint8 [N, S, S, C] after the ``max_images`` subsample and the resize to the common
            size (the feature network's input, else the real training images' size).
        labels: per set, int64 [N] labels (synthetic labels mapped into ``class_names``).
        indices: per set, int64 [N] indices of the evaluated images in the input dataset.
        features: per set, float64 [N, D] feature-network features ({} without a network).
        memorisation: per space ("pixel", "features") the per-sample result; its
            ``closest`` indexes ``images["synthetic"]``, ``nearest_train`` indexes
            ``images["real_train"]`` and ``nearest_holdout`` ``images["real_holdout"]``.
        predictions: per "<kind>/<train_on>" the predicted labels of ``images["real_holdout"]``.
    """

    document: dict[str, Any]
    class_names: tuple[str, ...]
    images: dict[str, np.ndarray] = field(default_factory=dict)
    labels: dict[str, np.ndarray] = field(default_factory=dict)
    indices: dict[str, np.ndarray] = field(default_factory=dict)
    features: dict[str, np.ndarray] = field(default_factory=dict)
    memorisation: dict[str, MemorisationResult] = field(default_factory=dict)
    predictions: dict[str, np.ndarray] = field(default_factory=dict)
    classifiers: dict[str, Any] = field(default_factory=dict)
    """per kind, the classifier trained on the SYNTHETIC images alone (a DP evaluation counts
    its correct answers on every held-out record: :mod:`dpsynth_ml.evaluation.dp`)."""
    device: str = "cpu"
    """the torch device the networks ran on (feature network, classifiers, InceptionV3);
    the Fréchet distances, PRDC and memorisation are computed on the host."""


def resize_uint8(images: np.ndarray, *, image_size: int, channels: int) -> np.ndarray:
    """uint8 [N, H, W, C] -> uint8 [N, image_size, image_size, channels] with the same
    resize/colour conversion as training (``images_to_tensor``); unchanged when it fits."""
    if images.shape[1:] == (image_size, image_size, channels):
        return images
    x = images_to_tensor(images, image_size=image_size, channels=channels)
    x = ((x + 1.0) * 127.5).round().clamp(0, 255).to(torch.uint8)
    return np.ascontiguousarray(x.permute(0, 2, 3, 1).numpy())


def _synthetic_labels(synthetic: ImageDataset, class_names: Sequence[str]) -> np.ndarray:
    """Map the corpus's labels into the reference's domain (a corpus may cover a subset)."""
    if tuple(synthetic.class_names) == tuple(class_names):
        return synthetic.labels.astype(np.int64)
    position = {name: i for i, name in enumerate(class_names)}
    missing = [n for n in synthetic.class_names if n not in position]
    if missing:
        raise InvalidSpecError(f"corpus classes not in the reference dataset: {missing[:5]}")
    table = np.array([position[n] for n in synthetic.class_names], dtype=np.int64)
    return table[synthetic.labels.astype(np.int64)]


def evaluate_corpus(synthetic: ImageDataset, real_train: ImageDataset,
                    real_holdout: ImageDataset, *, classifiers: Sequence[str],
                    feature_net_dir: Path | None = None,
                    feature_check: tuple[np.ndarray, np.ndarray] | None = None,
                    min_feature_accuracy: float = 0.5, prdc_k: int = 5,
                    max_images: int = 5000, seed: int = 0,
                    inception_weights: Path | None = None,
                    progress: Progress | None = None,
                    device: str | torch.device = "cpu") -> EvaluationResult:
    """Compute every metric of an evaluation.

    Phases (``progress(done, total)`` after each): subsample and resize
    (:func:`_subsample_sets`); feature network check and features, Fréchet distances,
    precision/recall/density/coverage and feature-space memorisation
    (:func:`_feature_metrics`); pixel-space memorisation (:func:`_pixel_memorisation`); each
    classifier trained on synthetic and on real training data, tested on real held-out data
    (:func:`_classifier_scores`); Inception FID when weights are given
    (:func:`_inception_fid`). Per-class figures are filled in by each phase.

    Args:
        synthetic: the corpus (its class names must all be in the reference's domain).
        real_train, real_holdout: the reference's training and held-out records (same
            ``class_names``).
        classifiers: kinds from ``CLASSIFIER_SETTINGS`` (e.g. ["cnn", "logreg"]).
        feature_net_dir: a feature network folder; without one, fd_dpsynth, prdc and
            feature-space memorisation are not computed.
        feature_check: the network's PUBLIC validation data (images, labels indexing its
            class names): its accuracy is re-measured and must reach
            ``max(min_feature_accuracy, 2 / K)``. Without it the recorded accuracy is used
            (and a note says so).
        min_feature_accuracy: see above.
        prdc_k: k of the k-NN manifolds.
        max_images: per set, a seeded subsample above this.
        seed: seeds the subsamples and the classifiers.
        inception_weights: pytorch-fid's InceptionV3 weights file, for Inception FID.
        progress: phase callback.
        device: where networks run ("cpu" by default: deterministic; a GPU for large sets).

    Raises:
        InvalidSpecError: mismatched domains, too few images, unknown classifier.
        FeatureNetworkRejected: the feature network fails its check or its sha256.
        InceptionWeightsUnavailable: inception_weights missing or not the pinned file.
    """
    class_names, syn_labels = _check_inputs(synthetic, real_train, real_holdout,
                                            classifiers=classifiers, max_images=max_images)
    steps = _Steps(progress, 2 + 2 * len(classifiers)
                   + (3 if feature_net_dir is not None else 0)
                   + (1 if inception_weights is not None else 0))
    model_i = None
    if inception_weights is not None:  # fail before any work when the file is not usable
        from dpsynth_ml.evaluation.inception import load_inception

        model_i = load_inception(Path(inception_weights)).to(device)
    notes: list[str] = []
    net = info = None
    feature_doc: dict[str, Any] | None = None
    if feature_net_dir is not None:
        net, info = load_feature_net(feature_net_dir)
        if tuple(info.class_names) and len(info.class_names) < 2:
            raise FeatureNetworkRejected("feature network with fewer than 2 classes")
        net.to(device)  # the check, then the features, run where the classifiers do
        feature_doc = _check_network(net, info, feature_check, min_feature_accuracy, notes)
        size, channels = info.image_size, info.channels
    else:
        size, channels = int(real_train.images.shape[1]), int(real_train.images.shape[-1])
        notes.append("no feature network: fd_dpsynth, precision/recall, density/coverage "
                     "and feature-space memorisation were not computed")
    run = _subsample_sets(synthetic, syn_labels, real_train, real_holdout,
                          class_names=class_names, max_images=max_images, seed=seed,
                          size=size, channels=channels, notes=notes, steps=steps)
    run.result.device = str(torch.device(device))
    run.settings.update({
        "classifiers": {k: dict(CLASSIFIER_SETTINGS[k]) for k in classifiers},
        "prdc_k": prdc_k, "max_images": max_images, "seed": seed,
        "image_size": size, "channels": channels,
        "memorisation_threshold": MEMORISATION_RATIO,
        "min_feature_accuracy": min_feature_accuracy,
    })
    if net is not None and info is not None:
        _feature_metrics(run, net, info, prdc_k=prdc_k, device=device)
    _pixel_memorisation(run)
    _classifier_scores(run, classifiers, seed=seed, device=device)
    _inception_fid(run, model_i, size=size)
    run.result.document = {
        "headline": run.headline, "classifiers": run.scores, "feature_network": feature_doc,
        "per_class": run.per_class, "memorisation": run.memorisation_docs,
        "notes": run.notes, "settings": run.settings, "sizes": run.sizes,
    }
    return run.result


def _check_inputs(synthetic: ImageDataset, real_train: ImageDataset,
                  real_holdout: ImageDataset, *, classifiers: Sequence[str],
                  max_images: int) -> tuple[tuple[str, ...], np.ndarray]:
    """The reference's class names and the corpus's labels in them, once every input is
    known to fit (same domains, known classifiers, at least 2 uint8 images per set)."""
    class_names = tuple(real_train.class_names)
    if tuple(real_holdout.class_names) != class_names:
        raise InvalidSpecError("real training and held-out data must share class_names")
    unknown = [k for k in classifiers if k not in CLASSIFIER_SETTINGS]
    if unknown or not classifiers:
        raise InvalidSpecError(f"unknown classifiers: {unknown}")
    if max_images < 2:
        raise InvalidSpecError("max_images must be >= 2")
    syn_labels = _synthetic_labels(synthetic, class_names)
    for name, ds in (("synthetic", synthetic), ("real_train", real_train),
                     ("real_holdout", real_holdout)):
        if len(ds) < 2:
            raise InvalidSpecError(f"{name} needs at least 2 images")
        if ds.images.dtype != np.uint8 or ds.images.ndim != 4:
            raise InvalidSpecError(f"{name} images must be uint8 [N, H, W, C]")
    return class_names, syn_labels


def _subsample_sets(synthetic: ImageDataset, syn_labels: np.ndarray, real_train: ImageDataset,
                    real_holdout: ImageDataset, *, class_names: tuple[str, ...],
                    max_images: int, seed: int, size: int, channels: int, notes: list[str],
                    steps: _Steps) -> _Run:
    """Phase 1: subsample (seeded, per set) and resize to the common input."""
    rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4)]
    inputs = {"synthetic": (synthetic.images, syn_labels),
              "real_train": (real_train.images, real_train.labels.astype(np.int64)),
              "real_holdout": (real_holdout.images, real_holdout.labels.astype(np.int64))}
    result = EvaluationResult(document={}, class_names=class_names)
    for (name, (imgs, labels)), rng in zip(inputs.items(), rngs, strict=False):
        idx = _subsample(len(imgs), max_images, rng)
        result.indices[name] = idx
        result.images[name] = resize_uint8(imgs[idx], image_size=size, channels=channels)
        result.labels[name] = labels[idx]
    sizes = {name: len(result.labels[name]) for name in SETS}
    for name in SETS:
        if len(inputs[name][0]) > max_images:
            notes.append(f"{name}: a seeded subsample of {max_images} of "
                         f"{len(inputs[name][0])} images was evaluated")
    steps()
    per_class = {name: {f"count_{s}": float((result.labels[s] == i).sum()) for s in SETS}
                 for i, name in enumerate(class_names)}
    return _Run(result=result, sizes=sizes, rngs=rngs, notes=notes, steps=steps,
                per_class=per_class)


def _check_network(net: FeatureNet, info: FeatureNetInfo,
                   feature_check: tuple[np.ndarray, np.ndarray] | None,
                   min_accuracy: float, notes: list[str]) -> dict[str, Any]:
    """Re-measure (or, without check data, take the recorded) accuracy; raise below the
    threshold; return the ``feature_network`` entry (less model_id and dataset_id)."""
    threshold = accuracy_threshold(info.num_classes, min_accuracy)
    if feature_check is not None:
        images, labels = feature_check
        accuracy = feature_net_accuracy(net, info, images, labels)
        validation_size = len(labels)
    else:
        accuracy, validation_size = info.accuracy, info.validation_size
        notes.append("the feature network's accuracy was not re-measured (no validation "
                     "data given): its recorded accuracy was used")
    if accuracy < threshold:
        raise FeatureNetworkRejected(
            f"feature network accuracy {accuracy:.3f} on {validation_size} public validation "
            f"records is below the threshold {threshold:.3f}", accuracy=accuracy,
            threshold=threshold)
    return {"architecture": info.architecture, "sha256": info.sha256, "accuracy": accuracy,
            "recorded_accuracy": info.accuracy, "validation_size": int(validation_size),
            "threshold": threshold, "passed": True, "remeasured": feature_check is not None,
            "image_size": info.image_size, "channels": info.channels,
            "feature_dim": info.feature_dim, "class_names": list(info.class_names)}
