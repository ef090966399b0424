"""The dpsynth feature network (``dpsynth-featnet-v1``): a small CNN classifier trained
non-privately on a PUBLIC dataset whose 128-d penultimate layer is the feature space of the
Fréchet distance ``fd_dpsynth``, of precision/recall/density/coverage and of the
feature-space memorisation check.

Why our own network and not Inception: InceptionV3 needs 299x299 RGB inputs and weights
that cannot be fetched here, and it was trained on ImageNet, far from 28x28 grayscale
documents or clothes. A small network trained on public data of the same domain gives a
feature space that is cheap on a CPU and meaningful for the domain, at the price of numbers
that are comparable only between evaluations using the same network (same sha256). Its
accuracy on public validation data is recorded at training and re-measured by every
evaluation: a network that does not classify its own domain (e.g. random weights) gives a
meaningless feature space and is rejected (:func:`check_feature_net`).

Files written by :func:`train_feature_net` in ``out_dir``::

    feature_net.safetensors   the state dict (weights and BatchNorm statistics)
    feature_net.json          FeatureNetInfo (its ``sha256`` is the weights file's)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from dpsynth_ml.data import images_to_tensor
from dpsynth_ml.evaluation.errors import FeatureNetworkRejected
from dpsynth_ml.spec import InvalidSpecError

FEATURE_ARCHITECTURE = "dpsynth-featnet-v1"
WEIGHTS_FILE = "feature_net.safetensors"
INFO_FILE = "feature_net.json"
FEATURE_DIM = 128
_WIDTHS = (32, 64, 128)

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class FeatureNetInfo:
    """What identifies a trained feature network (``feature_net.json``).

    Attributes:
        architecture: always ``FEATURE_ARCHITECTURE``.
        sha256: hex sha256 of ``feature_net.safetensors``.
        accuracy: accuracy on the validation records at the end of training.
        validation_size: number of validation records (never trained on).
        class_names: the label domain, in index order (the network's K outputs).
        image_size: inputs are resized to image_size x image_size.
        channels: 1 (gray) or 3 (RGB); inputs are converted to it.
        feature_dim: dimension of the feature space (128).
        epochs: training epochs.
        seed: seed of initialisation, split and shuffling.
        train_size: number of training records.
        batch_size: training batch size.
        learning_rate: Adam learning rate.
    """

    architecture: str
    sha256: str
    accuracy: float
    validation_size: int
    class_names: tuple[str, ...]
    image_size: int
    channels: int
    feature_dim: int
    epochs: int
    seed: int
    train_size: int = 0
    batch_size: int = 0
    learning_rate: float = 0.0

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (class_names as a list)."""
        out = dataclasses.asdict(self)
        out["class_names"] = list(self.class_names)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FeatureNetInfo:
        """Inverse of :meth:`to_dict`; unknown keys are ignored (forward compatibility).

        Raises:
            InvalidSpecError: a required key is missing or malformed.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        try:
            kwargs = {k: v for k, v in data.items() if k in names}
            kwargs["class_names"] = tuple(str(n) for n in data["class_names"])
            info = cls(**kwargs)
        except (KeyError, TypeError) as exc:
            raise InvalidSpecError(f"malformed feature network info: {exc}") from exc
        if info.channels not in (1, 3) or info.image_size < 8 or info.image_size % 4:
            raise InvalidSpecError("feature network info: bad channels or image_size")
        return info


class FeatureNet(nn.Module):
    """Three conv blocks (3x3 conv, BatchNorm, ReLU; 32, 64, 128 channels; 2x2 max-pool
    after the first two), a global average pool, a 128-d linear embedding (the feature
    space) and a linear classifier on its ReLU.

    The features are the embedding's pre-activation: dense and roughly Gaussian, which suits
    the Fréchet distance's Gaussian fit better than sparse post-ReLU units (fewer dead,
    constant dimensions, hence fewer rank-deficient covariances).
    """

    def __init__(self, *, channels: int, num_classes: int, feature_dim: int = FEATURE_DIM
                 ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c_in = channels
        for i, width in enumerate(_WIDTHS):
            layers += [nn.Conv2d(c_in, width, 3, padding=1, bias=False), nn.BatchNorm2d(width),
                       nn.ReLU(inplace=True)]
            if i < len(_WIDTHS) - 1:
                layers.append(nn.MaxPool2d(2))
            c_in = width
        self.body = nn.Sequential(*layers)
        self.embed = nn.Linear(_WIDTHS[-1], feature_dim)
        self.head = nn.Linear(feature_dim, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """[N, C, S, S] in [-1, 1] -> [N, feature_dim] embedding (pre-activation)."""
        h = self.body(x).mean(dim=(2, 3))
        return self.embed(h)  # type: ignore[no-any-return]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.features(x)))  # type: ignore[no-any-return]


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes, read in 1 MiB chunks (weights files are hashed whole)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _check_labelled(images: np.ndarray, labels: np.ndarray, num_classes: int) -> None:
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] not in (1, 3):
        raise InvalidSpecError("images must be uint8 [N, H, W, C] with C in (1, 3)")
    if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
        raise InvalidSpecError("labels must be [N] and match images")
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise InvalidSpecError("labels must index class_names")


def train_feature_net(images: np.ndarray, labels: np.ndarray, *, class_names: Sequence[str],
                      image_size: int, channels: int, epochs: int, batch_size: int,
                      learning_rate: float, seed: int, out_dir: Path,
                      val_images: np.ndarray | None = None,
                      val_labels: np.ndarray | None = None,
                      validation_fraction: float = 0.2,
                      progress: Progress | None = None,
                      device: str | torch.device = "cpu") -> FeatureNetInfo:
    """Train a feature network on PUBLIC labelled images (no DP: never call it on private
    data) and write it to ``out_dir``.

    Deterministic given ``seed`` (initialisation, validation split and shuffling all derive
    from it; CPU kernels are deterministic).

    Args:
        images: uint8 [N, H, W, C] public images.
        labels: int [N], indices into ``class_names``.
        class_names: the label domain.
        image_size: input size of the network (multiple of 4, >= 8).
        channels: 1 or 3.
        epochs, batch_size, learning_rate: Adam training settings.
        seed: the seed.
        out_dir: where ``feature_net.safetensors`` and ``feature_net.json`` are written.
        val_images, val_labels: validation records (e.g. the dataset's held-out split); when
            absent, a seeded ``validation_fraction`` of ``images`` is held out instead.
        validation_fraction: share held out when no validation records are given.
        progress: ``progress(epochs_done, epochs)`` after each epoch.
        device: where to train ("cpu" by default; on a GPU the result is not bit-for-bit
            reproducible). The weights are saved from the CPU.

    Returns:
        The network's info (also in ``feature_net.json``).

    Raises:
        InvalidSpecError: bad arrays or settings, or too few records to validate.
    """
    labels = np.asarray(labels).astype(np.int64)
    k = len(class_names)
    if k < 2:
        raise InvalidSpecError("a feature network needs at least 2 classes")
    if channels not in (1, 3) or image_size < 8 or image_size % 4:
        raise InvalidSpecError("image_size must be a multiple of 4 (>= 8), channels 1 or 3")
    if epochs < 1 or batch_size < 1 or not learning_rate > 0:
        raise InvalidSpecError("epochs, batch_size and learning_rate must be positive")
    _check_labelled(images, labels, k)
    rng = np.random.default_rng(seed)
    if val_images is None or val_labels is None:
        if not 0.0 < validation_fraction < 1.0:
            raise InvalidSpecError("validation_fraction must be in (0, 1)")
        order = rng.permutation(len(images))
        n_val = round(validation_fraction * len(images))
        val_idx, train_idx = np.sort(order[:n_val]), np.sort(order[n_val:])
        val_images, val_labels = images[val_idx], labels[val_idx]
        images, labels = images[train_idx], labels[train_idx]
    val_labels = np.asarray(val_labels).astype(np.int64)
    _check_labelled(val_images, val_labels, k)
    if len(images) < 2 or len(val_images) < 1:
        raise InvalidSpecError("too few records to train and validate a feature network")

    x = images_to_tensor(images, image_size=image_size, channels=channels)
    y = torch.from_numpy(labels)
    generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # module initialisation draws from the global generator
        net = FeatureNet(channels=channels, num_classes=k)
    net.to(device)
    optimiser = torch.optim.Adam(net.parameters(), lr=learning_rate)
    loss_fn = nn.CrossEntropyLoss()
    n = x.shape[0]
    for epoch in range(epochs):
        net.train()
        perm = torch.randperm(n, generator=generator)
        for start in range(0, n, batch_size):
            idx = perm[start:start + batch_size]
            if idx.numel() < 2 and n >= 2:
                continue  # BatchNorm needs two samples; a lone last sample is skipped
            optimiser.zero_grad(set_to_none=True)
            loss = loss_fn(net(x[idx].to(device)), y[idx].to(device))
            loss.backward()
            optimiser.step()
        if progress is not None:
            progress(epoch + 1, epochs)
    _recalibrate_batchnorm(net, x, batch_size)

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = out_dir / WEIGHTS_FILE
    net.cpu()
    save_file({name: t.detach().contiguous() for name, t in net.state_dict().items()},
              str(weights))
    draft = FeatureNetInfo(architecture=FEATURE_ARCHITECTURE, sha256="", accuracy=0.0,
                           validation_size=len(val_images), class_names=tuple(class_names),
                           image_size=image_size, channels=channels, feature_dim=FEATURE_DIM,
                           epochs=epochs, seed=seed, train_size=int(n), batch_size=batch_size,
                           learning_rate=float(learning_rate))
    accuracy = feature_net_accuracy(net, draft, val_images, val_labels)
    info = dataclasses.replace(draft, sha256=file_sha256(weights), accuracy=accuracy)
    (out_dir / INFO_FILE).write_text(json.dumps(info.to_dict(), indent=2, sort_keys=True))
    return info


def _recalibrate_batchnorm(net: FeatureNet, x: torch.Tensor, batch_size: int) -> None:
    """Replace BatchNorm's running statistics by the exact statistics of the final weights on
    the training images (cumulative average over one pass, no gradients).

    The running averages (momentum 0.1) trail the weights: after a few dozen steps they
    still describe early weights, and the network in eval mode can fall to chance accuracy
    while it classifies well in train mode (measured: 0.08 against 0.69 after 24 steps).
    """
    norms = [m for m in net.modules() if isinstance(m, nn.BatchNorm2d)]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # cumulative moving average: equal weight to every batch
    net.train()
    with torch.no_grad():
        for start in range(0, x.shape[0], batch_size):
            net.features(x[start:start + batch_size].to(next(net.parameters()).device))
    for m in norms:
        m.momentum = 0.1
    net.eval()


def load_feature_net(directory: Path) -> tuple[FeatureNet, FeatureNetInfo]:
    """Load a feature network folder and verify that its weights hash to the recorded sha256.

    Returns:
        The network in eval mode and its info.

    Raises:
        InvalidSpecError: missing or malformed files.
        FeatureNetworkRejected: not a ``dpsynth-featnet-v1`` network, or weights that do not
            hash to the recorded sha256 (tampered or corrupted).
    """
    directory = Path(directory)
    weights, info_path = directory / WEIGHTS_FILE, directory / INFO_FILE
    if not weights.is_file() or not info_path.is_file():
        raise InvalidSpecError(f"not a feature network folder: {directory}")
    try:
        info = FeatureNetInfo.from_dict(json.loads(info_path.read_text()))
    except json.JSONDecodeError as exc:
        raise InvalidSpecError(f"malformed {INFO_FILE}: {exc}") from exc
    if info.architecture != FEATURE_ARCHITECTURE:
        raise FeatureNetworkRejected(f"unknown feature architecture {info.architecture!r}")
    digest = file_sha256(weights)
    if digest != info.sha256:
        raise FeatureNetworkRejected("feature network weights do not match their sha256")
    net = FeatureNet(channels=info.channels, num_classes=info.num_classes,
                     feature_dim=info.feature_dim)
    try:
        net.load_state_dict(load_file(str(weights)), strict=True)
    except RuntimeError as exc:
        raise FeatureNetworkRejected(f"feature network weights do not fit: {exc}") from exc
    net.eval()
    return net, info


def _batches(net: FeatureNet, info: FeatureNetInfo, images: np.ndarray, batch_size: int,
             fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    outs: list[torch.Tensor] = []
    device = next(net.parameters()).device
    net.eval()
    with torch.no_grad():
        for start in range(0, len(images), batch_size):
            x = images_to_tensor(images[start:start + batch_size], image_size=info.image_size,
                                 channels=info.channels)
            outs.append(fn(x.to(device)).cpu())
    if not outs:
        return torch.zeros(0, info.feature_dim)
    return torch.cat(outs)


def extract_features(net: FeatureNet, info: FeatureNetInfo, images: np.ndarray, *,
                     batch_size: int = 256) -> np.ndarray:
    """Features of uint8 [N, H, W, C] images (resized/converted to the network's input),
    as float64 [N, feature_dim]."""
    if images.dtype != np.uint8 or images.ndim != 4:
        raise InvalidSpecError("images must be uint8 [N, H, W, C]")
    return _batches(net, info, images, batch_size, net.features).double().numpy()


def feature_net_accuracy(net: FeatureNet, info: FeatureNetInfo, images: np.ndarray,
                         labels: np.ndarray, *, batch_size: int = 256) -> float:
    """Top-1 accuracy of the network's own classifier head on labelled images."""
    labels = np.asarray(labels).astype(np.int64)
    _check_labelled(images, labels, info.num_classes)
    if len(images) == 0:
        raise InvalidSpecError("no records to measure the feature network's accuracy on")
    logits = _batches(net, info, images, batch_size, net)
    return float((logits.argmax(dim=1).numpy() == labels).mean())


def accuracy_threshold(num_classes: int, min_accuracy: float) -> float:
    """The accuracy a network must reach: ``max(min_accuracy, 2 / K)`` (twice chance, so a
    network with few classes cannot pass by guessing)."""
    return max(float(min_accuracy), 2.0 / num_classes)


def check_feature_net(net: FeatureNet, info: FeatureNetInfo, images: np.ndarray,
                      labels: np.ndarray, *, min_accuracy: float) -> float:
    """Re-measure the network's accuracy on public validation data and refuse a network that
    does not classify its domain.

    Returns:
        The measured accuracy.

    Raises:
        FeatureNetworkRejected: accuracy below ``max(min_accuracy, 2 / K)``.
    """
    accuracy = feature_net_accuracy(net, info, images, labels)
    threshold = accuracy_threshold(info.num_classes, min_accuracy)
    if accuracy < threshold:
        raise FeatureNetworkRejected(
            f"feature network accuracy {accuracy:.3f} on {len(labels)} public validation "
            f"records is below the threshold {threshold:.3f}", accuracy=accuracy,
            threshold=threshold)
    return accuracy
