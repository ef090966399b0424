"""evaluate_corpus end to end on digits: a fresh corpus vs a corpus of copied training
images, the document's shape (dpsynth_shared.evaluation.EvaluationReport), the feature
network's check and the progress callback."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from dpsynth_ml.data import ImageDataset
from dpsynth_ml.evaluation import FeatureNet, FeatureNetworkRejected, evaluate_corpus
from dpsynth_ml.evaluation.featnet import WEIGHTS_FILE
from dpsynth_shared.evaluation import EvaluationReport
from safetensors.torch import save_file

from .conftest import CLASS_NAMES, Digits

pytestmark = pytest.mark.unit


def _ds(digits: Digits, sl: slice, names: tuple[str, ...] = CLASS_NAMES) -> ImageDataset:
    return ImageDataset(images=digits.images[sl], labels=digits.labels[sl], class_names=names)


def _report(document: dict[str, object]) -> EvaluationReport:
    """The document completed with the ids the runner adds."""
    doc = dict(document)
    if doc["feature_network"] is not None:
        doc["feature_network"] = dict(doc["feature_network"],  # type: ignore[call-overload]
                                      model_id="m", dataset_id="d")
    return EvaluationReport.model_validate(
        doc | {"job_id": "j", "corpus_artifact_id": "a", "generate_job_id": "g",
               "model_id": None, "dataset_id": "d", "reference_visibility": "private",
               "non_dp": True, "contains_private_images": True})


def test_fresh_corpus_vs_copied_corpus(digits: Digits, featnet_dir: Path) -> None:
    train, holdout = _ds(digits, slice(0, 500)), _ds(digits, slice(1200, 1500))
    check = (digits.images[960:1200], digits.labels[960:1200])
    calls: list[tuple[int, int]] = []
    fresh = evaluate_corpus(_ds(digits, slice(1500, 1797)), train, holdout,
                            classifiers=["cnn", "logreg"], feature_net_dir=featnet_dir,
                            feature_check=check, max_images=400, seed=0,
                            progress=lambda d, t: calls.append((d, t)))
    assert [d for d, _ in calls] == list(range(1, calls[-1][1] + 1))
    doc = fresh.document
    report = _report(doc)
    json.dumps(doc, allow_nan=False)
    h = report.headline
    assert report.sizes == {"synthetic": 297, "real_train": 400, "real_holdout": 300}
    assert h.fd_dpsynth is not None and h.fd_dpsynth_real_train is not None
    assert h.fd_dpsynth < 3 * h.fd_dpsynth_real_train + 1.0  # same distribution: near the floor
    assert h.precision is not None and h.precision > 0.7 and h.coverage is not None
    assert h.tstr_accuracy["cnn"] > 0.7 and h.real_accuracy["logreg"] > 0.7
    assert h.memorisation_flagged is not None and h.memorisation_flagged <= 6
    assert report.feature_network is not None and report.feature_network.passed
    assert {m.space for m in report.memorisation} == {"pixel", "features"}
    assert any("not the Inception FID" in n or "NOT the Inception FID" in n for n in report.notes)
    assert set(report.per_class) == set(CLASS_NAMES)
    assert "tstr_recall_cnn" in report.per_class["digit 3"]
    assert fresh.images["synthetic"].shape == (297, 8, 8, 1)
    assert len(doc["memorisation"][0]["closest_pairs"]) == 16  # type: ignore[index]

    # a "corpus" of copied training images (+ a few fresh ones) is flagged
    copies = ImageDataset(images=np.concatenate([digits.images[:100], digits.images[1500:1600]]),
                          labels=np.concatenate([digits.labels[:100], digits.labels[1500:1600]]),
                          class_names=CLASS_NAMES)
    copied = evaluate_corpus(copies, train, holdout, classifiers=["logreg"],
                             feature_net_dir=featnet_dir, feature_check=check, seed=0)
    copied_doc = _report(copied.document)
    pixel = copied_doc.memorisation[0]
    assert pixel.space == "pixel" and pixel.exact_copies >= 100 and pixel.flagged >= 100
    assert copied.memorisation["pixel"].flagged[:100].all()
    assert pixel.fraction_closer_to_train > fresh.document["memorisation"][0][  # type: ignore[index]
        "fraction_closer_to_train"]
    pairs = copied.document["memorisation"][0]["closest_pairs"]  # type: ignore[index]
    assert all(p["synthetic"] < 100 and p["d_train"] == 0.0 for p in pairs)


def test_random_feature_network_is_rejected(digits: Digits, featnet_dir: Path,
                                            tmp_path: Path) -> None:
    import shutil

    import torch

    rogue = tmp_path / "rogue"
    shutil.copytree(featnet_dir, rogue)
    torch.manual_seed(5)
    save_file(FeatureNet(channels=1, num_classes=10).state_dict(), str(rogue / WEIGHTS_FILE))
    info = json.loads((rogue / "feature_net.json").read_text())
    from dpsynth_ml.evaluation.featnet import file_sha256

    info["sha256"] = file_sha256(rogue / WEIGHTS_FILE)
    (rogue / "feature_net.json").write_text(json.dumps(info))
    with pytest.raises(FeatureNetworkRejected):
        evaluate_corpus(_ds(digits, slice(1500, 1600)), _ds(digits, slice(0, 100)),
                        _ds(digits, slice(1200, 1300)), classifiers=["logreg"],
                        feature_net_dir=rogue,
                        feature_check=(digits.images[960:1200], digits.labels[960:1200]))


def test_without_feature_network_and_subset_corpus(digits: Digits) -> None:
    names = ("digit 7", "digit 1")  # a corpus of two classes, in its own order
    sel = np.flatnonzero(np.isin(digits.labels[1500:], [1, 7])) + 1500
    corpus = ImageDataset(images=digits.images[sel],
                          labels=np.where(digits.labels[sel] == 7, 0, 1),
                          class_names=names)
    result = evaluate_corpus(corpus, _ds(digits, slice(0, 300)), _ds(digits, slice(1200, 1400)),
                             classifiers=["logreg"], max_images=50, seed=1)
    report = _report(result.document)
    assert report.feature_network is None and report.headline.fd_dpsynth is None
    assert report.sizes["synthetic"] == 50 and report.sizes["real_train"] == 50
    labels = result.labels["synthetic"]
    np.testing.assert_array_equal(labels, digits.labels[sel][result.indices["synthetic"]])
    assert report.per_class["digit 1"]["count_synthetic"] > 0
    assert report.per_class["digit 2"]["count_synthetic"] == 0


def test_unusable_inception_file_fails_before_any_work(digits: Digits, tmp_path: Path) -> None:
    from dpsynth_ml.evaluation import InceptionWeightsUnavailable

    bogus = tmp_path / "pt_inception-2015-12-05-6726825d.pth"
    bogus.write_bytes(b"not the weights")
    calls: list[tuple[int, int]] = []
    with pytest.raises(InceptionWeightsUnavailable) as caught:
        evaluate_corpus(_ds(digits, slice(1500, 1600)), _ds(digits, slice(0, 100)),
                        _ds(digits, slice(1200, 1300)), classifiers=["logreg"],
                        inception_weights=bogus, progress=lambda d, t: calls.append((d, t)))
    assert caught.value.code == "inception_weights_unavailable"
    assert calls == []
