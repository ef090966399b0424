"""Downstream classifiers of the evaluate job: train on synthetic (or real training) images,
test on real held-out images (TSTR, train-on-synthetic / test-on-real).

Hyperparameters are fixed here, in advance, for every evaluation (``CLASSIFIER_SETTINGS``,
documented in docs/evaluation.md): a fixed number of epochs, no early stopping, no model
selection, nothing chosen by looking at the test data. ``min_steps`` only lengthens training
on very small sets (it depends on the training set's size alone), so that a few hundred
synthetic images still get a trained classifier.

Every classifier is deterministic given its seed (initialisation and shuffling derive from
it; CPU kernels are deterministic).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from dpsynth_ml.data import images_to_tensor
from dpsynth_ml.spec import InvalidSpecError

ClassifierKind = Literal["cnn", "logreg", "mlp"]

#: The fixed hyperparameters of each downstream classifier (never tuned per evaluation).
CLASSIFIER_SETTINGS: dict[str, dict[str, Any]] = {
    "cnn": {
        "description": "conv3x3(32)-ReLU-maxpool2 / conv3x3(64)-ReLU-maxpool2 / "
                       "linear(128)-ReLU-dropout(0.25) / linear(K): a small CNN in the "
                       "spirit of the downstream CNNs of the DP image-generation papers",
        "optimizer": "adam", "learning_rate": 1e-3, "weight_decay": 0.0,
        "batch_size": 64, "epochs": 10, "min_steps": 200,
    },
    "logreg": {
        "description": "multinomial logistic regression on the pixels in [-1, 1] "
                       "(one linear layer, softmax cross-entropy, L2 via weight decay)",
        "optimizer": "adam", "learning_rate": 1e-3, "weight_decay": 1e-4,
        "batch_size": 64, "epochs": 20, "min_steps": 200,
    },
    "mlp": {
        "description": "MLP on the pixels: linear(512)-ReLU-dropout(0.25)-linear(K)",
        "optimizer": "adam", "learning_rate": 1e-3, "weight_decay": 0.0,
        "batch_size": 64, "epochs": 10, "min_steps": 200,
    },
}


class Classifier(nn.Module):
    """A downstream classifier with the input format it was trained on.

    Attributes:
        kind: "cnn", "logreg" or "mlp".
        image_size, channels: inputs are resized/converted to this (as in training).
        num_classes: K.
        selection: how ``train_classifier`` chose its weights on a validation split (the
            epoch and the accuracies), or None (the last epoch, no validation split).
    """

    selection: dict[str, Any] | None

    def __init__(self, kind: str, *, image_size: int, channels: int, num_classes: int) -> None:
        super().__init__()
        self.selection = None
        self.kind, self.image_size = kind, image_size
        self.channels, self.num_classes = channels, num_classes
        pixels = channels * image_size * image_size
        if kind == "cnn":
            if image_size < 4:
                raise InvalidSpecError("the CNN classifier needs images of at least 4x4")
            side = image_size // 4
            self.net: nn.Module = nn.Sequential(
                nn.Conv2d(channels, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                nn.Flatten(), nn.Linear(64 * side * side, 128), nn.ReLU(), nn.Dropout(0.25),
                nn.Linear(128, num_classes))
        elif kind == "logreg":
            self.net = nn.Sequential(nn.Flatten(), nn.Linear(pixels, num_classes))
        elif kind == "mlp":
            self.net = nn.Sequential(nn.Flatten(), nn.Linear(pixels, 512), nn.ReLU(),
                                     nn.Dropout(0.25), nn.Linear(512, num_classes))
        else:
            raise InvalidSpecError(f"unknown classifier {kind!r}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)  # type: ignore[no-any-return]

    def to_input(self, images: np.ndarray) -> torch.Tensor:
        """uint8 [N, H, W, C] -> the float tensor this classifier takes."""
        return images_to_tensor(images, image_size=self.image_size, channels=self.channels)


def _check(images: np.ndarray, labels: np.ndarray, num_classes: int) -> np.ndarray:
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] not in (1, 3):
        raise InvalidSpecError("images must be uint8 [N, H, W, C] with C in (1, 3)")
    labels = np.asarray(labels).astype(np.int64)
    if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
        raise InvalidSpecError("labels must be [N] and match images")
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise InvalidSpecError("labels must be in [0, num_classes)")
    return labels


def train_classifier(kind: str, images: np.ndarray, labels: np.ndarray, *, num_classes: int,
                     seed: int, device: str | torch.device = "cpu",
                     validation: tuple[np.ndarray, np.ndarray] | None = None) -> Classifier:
    """Train a downstream classifier with its fixed settings (``CLASSIFIER_SETTINGS``).

    Args:
        kind: "cnn", "logreg" or "mlp".
        images: uint8 [N, H, W, C]; the classifier keeps H (square images) and C as its
            input format.
        labels: int [N] in [0, num_classes).
        num_classes: K (classes absent from the training set are still outputs).
        seed: seeds initialisation and shuffling.
        device: where to train ("cpu" by default; deterministic there, not necessarily on a
            GPU). The returned classifier stays there, so :func:`predict` (and everything
            built on it: accuracies, recalls, the DP evaluation's counts) runs there too.
        validation: optional labelled images to select the epoch on (DPImageBench's
            protocol, docs/evaluation.md "Model selection"): after every epoch the accuracy on
            them is measured and the weights of the best epoch (the earliest on a tie) are
            returned; ``model.selection`` records the epoch chosen and every epoch's
            validation accuracy. They must never be the test images: a SYNTHETIC split of
            the training corpus is post-processing and free; a split of private images must
            be charged like any DP evaluation. Without it the last epoch is returned and
            ``model.selection`` is None.

    Returns:
        The trained classifier, in eval mode.

    Raises:
        InvalidSpecError: an unknown kind, bad arrays or an empty training set.
    """
    if kind not in CLASSIFIER_SETTINGS:
        raise InvalidSpecError(f"unknown classifier {kind!r}")
    if num_classes < 2:
        raise InvalidSpecError("a classifier needs at least 2 classes")
    labels = _check(images, labels, num_classes)
    if len(images) == 0:
        raise InvalidSpecError("no training images for the classifier")
    settings = CLASSIFIER_SETTINGS[kind]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # initialisation and dropout draw from the global generator
        model = Classifier(kind, image_size=int(images.shape[1]), channels=int(images.shape[-1]),
                           num_classes=num_classes)
        x, y = model.to_input(images), torch.from_numpy(labels)
        generator = torch.Generator().manual_seed(seed)
        optimiser = torch.optim.Adam(model.parameters(), lr=settings["learning_rate"],
                                     weight_decay=settings["weight_decay"])
        model.to(device)
        batch = int(settings["batch_size"])
        n = x.shape[0]
        steps_per_epoch = math.ceil(n / batch)
        epochs = max(int(settings["epochs"]), math.ceil(settings["min_steps"] / steps_per_epoch))
        loss_fn = nn.CrossEntropyLoss()
        if validation is not None:
            val_labels = _check(validation[0], validation[1], num_classes)
            if len(val_labels) == 0:
                raise InvalidSpecError("an empty validation split selects nothing")
        history: list[float] = []
        best: tuple[float, int, dict[str, torch.Tensor]] | None = None
        model.train()
        for epoch in range(epochs):
            perm = torch.randperm(n, generator=generator)
            for start in range(0, n, batch):
                idx = perm[start:start + batch]
                optimiser.zero_grad(set_to_none=True)
                loss_fn(model(x[idx].to(device)), y[idx].to(device)).backward()
                optimiser.step()
            if validation is not None:
                accuracy = float((predict(model, validation[0]) == val_labels).mean())
                model.train()
                history.append(accuracy)
                if best is None or accuracy > best[0]:
                    best = (accuracy, epoch + 1, {k: v.detach().clone()
                                                  for k, v in model.state_dict().items()})
    if best is not None:
        model.load_state_dict(best[2])
    model.eval()
    if best is not None and validation is not None:
        model.selection = {"protocol": "best epoch on a validation split", "epoch": best[1],
                           "epochs": epochs, "validation_accuracy": best[0],
                           "validation_size": len(validation[0]), "history": history}
    return model


def predict(model: Classifier, images: np.ndarray, *, batch_size: int = 512) -> np.ndarray:
    """Predicted labels (int64 [N]) of uint8 [N, H, W, C] images."""
    if images.dtype != np.uint8 or images.ndim != 4:
        raise InvalidSpecError("images must be uint8 [N, H, W, C]")
    model.eval()
    out: list[np.ndarray] = []
    with torch.no_grad():
        for start in range(0, len(images), batch_size):
            x = model.to_input(images[start:start + batch_size])
            logits = model(x.to(next(model.parameters()).device))
            out.append(logits.argmax(dim=1).cpu().numpy())
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def classifier_accuracy(model: Classifier, images: np.ndarray, labels: np.ndarray) -> float:
    """Top-1 accuracy on labelled images.

    Raises:
        InvalidSpecError: bad arrays or no images.
    """
    labels = _check(images, labels, model.num_classes)
    if len(labels) == 0:
        raise InvalidSpecError("no test images for the classifier")
    return float((predict(model, images) == labels).mean())


def per_class_recall(model: Classifier, images: np.ndarray, labels: np.ndarray
                     ) -> np.ndarray:
    """Recall of each class (float64 [K]; NaN for a class without test images)."""
    labels = _check(images, labels, model.num_classes)
    predicted = predict(model, images)
    recall = np.full(model.num_classes, np.nan)
    for k in range(model.num_classes):
        mask = labels == k
        if mask.any():
            recall[k] = float((predicted[mask] == k).mean())
    return recall
