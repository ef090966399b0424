"""The run state of :func:`dpsynth_ml.evaluation.corpus.evaluate_corpus` and its metric phases.

Phase 1 (subsample and resize, in :mod:`dpsynth_ml.evaluation.corpus`) builds a :class:`_Run`;
the phases here each fill in their part of it (report sections, per-class figures, notes)
and report progress: 2, fidelity in the feature network's space (Fréchet distances,
precision/recall/density/coverage, feature-space memorisation); 3, pixel-space
memorisation; 4, classifiers trained on synthetic and on real data, tested on real held-out
data (TSTR); 5, Inception FID (optional).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from dpsynth_ml.evaluation.classifiers import per_class_recall, predict, train_classifier
from dpsynth_ml.evaluation.featnet import FeatureNet, FeatureNetInfo, extract_features
from dpsynth_ml.evaluation.metrics import (
    MEMORISATION_RATIO,
    MemorisationResult,
    frechet_distance,
    memorisation,
    prdc,
)

if TYPE_CHECKING:
    from dpsynth_ml.evaluation.corpus import EvaluationResult
    from dpsynth_ml.evaluation.inception import FIDInceptionV3

Progress = Callable[[int, int], None]
SETS = ("synthetic", "real_train", "real_holdout")


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
