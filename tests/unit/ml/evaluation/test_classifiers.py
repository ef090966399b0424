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


def test_validation_selects_the_best_epoch_and_says_which(digits: Digits) -> None:
    """DPImageBench's protocol: the weights of the epoch best on a validation split (never
    the test set), the earliest on a tie; without a split, the last epoch (no selection)."""
    train_x, train_y = digits.images[:300], digits.labels[:300]
    val = (digits.images[300:500], digits.labels[300:500])
    plain = train_classifier("logreg", train_x, train_y, num_classes=10, seed=1)
    assert plain.selection is None
    chosen = train_classifier("logreg", train_x, train_y, num_classes=10, seed=1,
                              validation=val)
    sel = chosen.selection
    assert sel is not None and sel["validation_size"] == 200
    assert len(sel["history"]) == sel["epochs"] >= 2
    best = max(sel["history"])
    assert sel["validation_accuracy"] == best
    assert sel["epoch"] == sel["history"].index(best) + 1  # the earliest best epoch
    # the weights returned are that epoch's: their validation accuracy is the recorded one
    assert classifier_accuracy(chosen, *val) == pytest.approx(best)
    # the same training: when the last epoch is the best, the weights are the plain run's
    if sel["epoch"] == sel["epochs"]:
        for pa, pb in zip(plain.parameters(), chosen.parameters(), strict=True):
            assert torch.equal(pa, pb)
    with pytest.raises(InvalidSpecError):
        train_classifier("logreg", train_x, train_y, num_classes=10, seed=1,
                         validation=(digits.images[:0], digits.labels[:0]))
