"""Downstream classifiers: chance accuracy on random labels, real accuracy on real labels,
determinism, per-class recall."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from dpsynth_ml.evaluation import (
    CLASSIFIER_SETTINGS,
    classifier_accuracy,
    per_class_recall,
    train_classifier,
)
from dpsynth_ml.spec import InvalidSpecError

from .conftest import Digits

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("kind", ["cnn", "logreg"])
def test_random_labels_give_chance_accuracy(kind: str, digits: Digits) -> None:
    rng = np.random.default_rng(0)
    train_x = digits.images[:600]
    random_y = rng.integers(0, 10, size=600)
    model = train_classifier(kind, train_x, random_y, num_classes=10, seed=0)
    # 1197 test images: the std of a chance accuracy is about 0.009
    accuracy = classifier_accuracy(model, digits.images[600:], digits.labels[600:])
    assert abs(accuracy - 0.1) < 0.05


@pytest.mark.parametrize("kind", ["cnn", "logreg", "mlp"])
def test_real_labels_beat_chance(kind: str, digits: Digits) -> None:
    model = train_classifier(kind, digits.images[:600], digits.labels[:600], num_classes=10,
                             seed=0)
    assert classifier_accuracy(model, digits.images[600:], digits.labels[600:]) > 0.8
    recall = per_class_recall(model, digits.images[600:], digits.labels[600:])
    assert recall.shape == (10,) and np.all(recall > 0.4)


def test_deterministic_and_leaves_global_rng_alone(digits: Digits) -> None:
    torch.manual_seed(7)
    before = torch.rand(1)
    torch.manual_seed(7)
    a = train_classifier("mlp", digits.images[:100], digits.labels[:100], num_classes=10, seed=3)
    assert torch.rand(1) == before
    b = train_classifier("mlp", digits.images[:100], digits.labels[:100], num_classes=10, seed=3)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)


def test_settings_are_fixed_and_bad_input_is_refused(digits: Digits) -> None:
    assert set(CLASSIFIER_SETTINGS) == {"cnn", "logreg", "mlp"}
    for settings in CLASSIFIER_SETTINGS.values():
        assert {"learning_rate", "batch_size", "epochs"} <= set(settings)
    with pytest.raises(InvalidSpecError):
        train_classifier("svm", digits.images[:10], digits.labels[:10], num_classes=10, seed=0)
    with pytest.raises(InvalidSpecError):
        train_classifier("cnn", digits.images[:10], digits.labels[:10] + 10, num_classes=10,
                         seed=0)
    model = train_classifier("logreg", digits.images[:20], digits.labels[:20], num_classes=10,
                             seed=0)
    recall = per_class_recall(model, digits.images[:5], digits.labels[:5])
    assert np.isnan(recall).sum() == 10 - len(set(digits.labels[:5].tolist()))
