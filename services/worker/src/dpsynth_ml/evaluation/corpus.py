"""``evaluate_corpus``: every metric of an evaluate job on one synthetic corpus against real
training and real held-out data (docs/evaluation.md).

The library computes; the runner reads the data (with the ledger's grant for a private
reference), fills in identifiers (job, model and dataset ids) and writes the report. Nothing
here logs a metric: on a private reference every number is non-DP and goes only into the
owner-only report.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from dpsynth_ml.data import ImageDataset, images_to_tensor
from dpsynth_ml.evaluation.classifiers import (
    CLASSIFIER_SETTINGS,
    per_class_recall,
    predict,
    train_classifier,
)
from dpsynth_ml.evaluation.errors import FeatureNetworkRejected
from dpsynth_ml.evaluation.featnet import (
    FeatureNet,
    FeatureNetInfo,
    accuracy_threshold,
    extract_features,
    feature_net_accuracy,
    load_feature_net,
)
from dpsynth_ml.evaluation.metrics import (
    MEMORISATION_RATIO,
    MemorisationResult,
    frechet_distance,
    memorisation,
    prdc,
)
from dpsynth_ml.spec import InvalidSpecError

if TYPE_CHECKING:
    from dpsynth_ml.evaluation.inception import FIDInceptionV3

Progress = Callable[[int, int], None]
SETS = ("synthetic", "real_train", "real_holdout")


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


def _subsample(n: int, cap: int, rng: np.random.Generator) -> np.ndarray:
    if n <= cap:
        return np.arange(n, dtype=np.int64)
    return np.sort(rng.choice(n, size=cap, replace=False)).astype(np.int64)


def _majority_share(labels: np.ndarray, k: int) -> float:
    return float(np.bincount(labels, minlength=k).max() / len(labels)) if len(labels) else 0.0


def _closest_pairs(result: MemorisationResult) -> list[dict[str, Any]]:
    return [{"synthetic": int(i), "train": int(result.nearest_train[i]),
             "holdout": int(result.nearest_holdout[i]), "d_train": float(result.d_train[i]),
             "d_holdout": float(result.d_holdout[i]),
             "ratio": float(min(result.ratio[i], 1e300)), "flagged": bool(result.flagged[i])}
            for i in result.closest]


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
        feature_doc = _check_network(net, info, feature_check, min_feature_accuracy, notes)
        size, channels = info.image_size, info.channels
    else:
        size, channels = int(real_train.images.shape[1]), int(real_train.images.shape[-1])
        notes.append("no feature network: fd_dpsynth, precision/recall, density/coverage "
                     "and feature-space memorisation were not computed")
    run = _subsample_sets(synthetic, syn_labels, real_train, real_holdout,
                          class_names=class_names, max_images=max_images, seed=seed,
                          size=size, channels=channels, notes=notes, steps=steps)
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


class _Steps:
    """Counts finished phases and reports ``progress(done, total)`` after each."""

    def __init__(self, progress: Progress | None, total: int) -> None:
        self.progress, self.total, self.done = progress, total, 0

    def __call__(self) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, self.total)


@dataclass
class _Run:
    """What the phases of one evaluation share and fill in, in order: the evaluated sets
    (``result``), the report's sections and the notes."""

    result: EvaluationResult
    sizes: dict[str, int]
    rngs: list[np.random.Generator]
    notes: list[str]
    steps: _Steps
    per_class: dict[str, dict[str, float]]
    headline: dict[str, Any] = field(
        default_factory=lambda: {"tstr_accuracy": {}, "real_accuracy": {}})
    memorisation_docs: list[dict[str, Any]] = field(default_factory=list)
    scores: list[dict[str, Any]] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def class_names(self) -> tuple[str, ...]:
        return self.result.class_names


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


def _feature_metrics(run: _Run, net: FeatureNet, info: FeatureNetInfo, *, prdc_k: int,
                     device: str | torch.device) -> None:
    """Phase 2 (fidelity, in the feature network's space): features; Fréchet distances
    (overall, its real-data floor and per class); precision/recall/density/coverage;
    feature-space memorisation."""
    result = run.result
    net.to(device)
    for name in SETS:
        result.features[name] = extract_features(net, info, result.images[name])
    run.steps()
    f_syn, f_train, f_hold = (result.features[s] for s in SETS)
    _frechet_distances(run, f_syn, f_train, f_hold, info)
    _prdc(run, f_syn, f_hold, prdc_k)
    run.steps()
    mem_f = memorisation(f_syn, f_train, f_hold, space="features")
    result.memorisation["features"] = mem_f
    run.memorisation_docs.append(mem_f.summary() | {"closest_pairs": _closest_pairs(mem_f)})
    run.steps()


def _frechet_distances(run: _Run, f_syn: np.ndarray, f_train: np.ndarray,
                       f_hold: np.ndarray, info: FeatureNetInfo) -> None:
    """fd_dpsynth (synthetic vs held-out), its floor (real training vs held-out) and the
    per-class distances."""
    run.headline["fd_dpsynth"] = frechet_distance(f_syn, f_hold)
    # the floor: real training vs held-out, with the training side cut to the synthetic
    # set's size (the Fréchet distance's bias depends on the set sizes)
    floor_idx = _subsample(len(f_train), len(f_syn), run.rngs[3])
    run.headline["fd_dpsynth_real_train"] = frechet_distance(f_train[floor_idx], f_hold)
    run.settings["fd_floor_real_train_size"] = len(floor_idx)
    labels = run.result.labels
    for i, name in enumerate(run.class_names):
        a = f_syn[labels["synthetic"] == i]
        b = f_hold[labels["real_holdout"] == i]
        if len(a) >= 2 and len(b) >= 2:
            run.per_class[name]["fd_dpsynth"] = frechet_distance(a, b)
    run.notes.append(f"fd_dpsynth is the Fréchet distance in the 128-d feature space of the "
                     f"dpsynth feature network {info.architecture} (sha256 {info.sha256[:12]}…), "
                     "NOT the Inception FID: compare it only with values computed with the "
                     "same network and similar set sizes; fd_dpsynth_real_train is the floor "
                     "that sampling noise alone gives")


def _prdc(run: _Run, f_syn: np.ndarray, f_hold: np.ndarray, prdc_k: int) -> None:
    """Precision/recall/density/coverage on equal-sized synthetic and held-out sets."""
    n_prdc = min(len(f_syn), len(f_hold))
    if n_prdc > prdc_k:
        p_syn = f_syn[_subsample(len(f_syn), n_prdc, run.rngs[3])]
        p_hold = f_hold[_subsample(len(f_hold), n_prdc, run.rngs[3])]
        run.headline.update(prdc(p_hold, p_syn, k=prdc_k))
        run.settings["prdc_size"] = n_prdc
    else:
        run.notes.append(f"precision/recall/density/coverage not computed: fewer than "
                         f"k + 1 = {prdc_k + 1} images in a set")


def _pixel_memorisation(run: _Run) -> None:
    """Phase 3: memorisation in pixel space (listed first in the report)."""
    images, sizes = run.result.images, run.sizes
    mem_p = memorisation(images["synthetic"], images["real_train"], images["real_holdout"],
                         space="pixel")
    run.result.memorisation["pixel"] = mem_p
    run.memorisation_docs.insert(0, mem_p.summary() | {"closest_pairs": _closest_pairs(mem_p)})
    run.headline["memorisation_flagged"] = int(mem_p.flagged.sum())
    run.headline["memorisation_fraction_closer_to_train"] = run.memorisation_docs[0][
        "fraction_closer_to_train"]
    share = sizes["real_train"] / (sizes["real_train"] + sizes["real_holdout"])
    run.notes.append(f"memorisation: with nothing memorised about {share:.2f} of the synthetic "
                     "images are closer to a training image than to a held-out one (the "
                     "training share of the reference images); flagged images are exact "
                     f"copies or {MEMORISATION_RATIO:.3f} times closer to a training image "
                     "than to any held-out image")
    run.steps()


def _classifier_scores(run: _Run, classifiers: Sequence[str], *, seed: int,
                       device: str | torch.device) -> None:
    """Phase 4 (TSTR): each classifier trained on synthetic and on real training data,
    tested on the real held-out data; accuracies and per-class recalls."""
    result = run.result
    test_x, test_y = result.images["real_holdout"], result.labels["real_holdout"]
    k_classes = len(run.class_names)
    chance = _majority_share(test_y, k_classes)
    for kind in classifiers:
        for train_on, source in (("synthetic", "synthetic"), ("real", "real_train")):
            model = train_classifier(kind, result.images[source], result.labels[source],
                                     num_classes=k_classes, seed=seed, device=device)
            predicted = predict(model, test_x)
            result.predictions[f"{kind}/{train_on}"] = predicted
            if train_on == "synthetic":
                result.classifiers[kind] = model
            accuracy = float((predicted == test_y).mean())
            run.scores.append({"classifier": kind, "train_on": train_on,
                               "accuracy": accuracy, "train_size": run.sizes[source],
                               "test_size": run.sizes["real_holdout"], "chance": chance})
            key = "tstr_accuracy" if train_on == "synthetic" else "real_accuracy"
            run.headline[key][kind] = accuracy
            recall = per_class_recall(model, test_x, test_y)
            prefix = "tstr" if train_on == "synthetic" else "real"
            for i, name in enumerate(run.class_names):
                if not np.isnan(recall[i]):
                    run.per_class[name][f"{prefix}_recall_{kind}"] = float(recall[i])
            run.steps()
    run.notes.append("classifier accuracies are on the real held-out records; chance is the "
                     "share of the largest class among them; hyperparameters are fixed in "
                     "advance (settings.classifiers), never tuned on the test data")


def _inception_fid(run: _Run, model_i: FIDInceptionV3 | None, *, size: int) -> None:
    """Phase 5 (optional): Inception FID, synthetic vs real held-out."""
    if model_i is None:
        run.notes.append("Inception FID not computed (no InceptionV3 weights file given)")
        return
    from dpsynth_ml.evaluation.inception import inception_features

    a = inception_features(model_i, run.result.images["synthetic"])
    b = inception_features(model_i, run.result.images["real_holdout"])
    run.headline["inception_fid"] = frechet_distance(a, b)
    run.notes.append(f"inception_fid: pytorch-fid InceptionV3 pool features of the evaluated "
                     f"images ({size}x{size} upsampled to 299x299), synthetic vs real "
                     "held-out; FID is biased upwards on small sets. The project's "
                     "InceptionV3 definition is checked against pytorch-fid 0.3.0's code "
                     "under identical (random) weights: same state-dict layout, same pool "
                     "features and same FID on a known pair of image sets. Not checked: "
                     "pytorch-fid's reference values with the real weights file, which "
                     "cannot be fetched where the tests run (the file's sha256 is pinned)")
    run.steps()


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
