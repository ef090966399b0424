"""Privacy–utility on Fashion-MNIST (issue 5): accuracy of classifiers trained on synthetic data.

For each public source (an in-distribution split of Fashion-MNIST's training set, and an
out-of-distribution one: scikit-learn's 8x8 handwritten digits, upscaled) the ML core is used
directly, as the worker would, without the REST platform:

1. **pretrain** a latent diffusion model on the public source (``dpsynth_ml.train``, kind
   ``pretrain``). It is trained ONCE per source (seed 0) and shared by every seed: at CPU scale
   a pretraining per seed does not fit in the budget, so the standard deviations below cover
   the DP fine-tune, the sampling and the classifier, not the pretraining (the same holds for
   the public pretraining of the DP-Adam baseline's CNN, step 7). It goes through the
   pretraining cache (``benchmarks/pretrain_cache.py``): a run with the same spec, data, ML
   core and library versions reuses the stored model, and the results record it per source
   (``pretrain_cache``: hit / miss / off, the key, the original pretraining time);
2. **ε = 0**: sample the pretrained model (no private data at all);
3. **ε = 1, 10**: DP fine-tune it on the private images (DP-SGD, Poisson rate
   ``q = B / N``, a fixed number of steps; the noise multiplier is the ledger's own calibration
   ``dpsynth_ledger.accounting.calibrate_noise_multiplier(ε, q, steps, δ)`` with the platform's
   default ``δ = min(1e-6, 1 / (10 N))``), then sample it;
4. **ε = ∞**: the same fine-tune without clipping or noise (``benchmarks.nonprivate_finetune``,
   benchmarks only), then sample it;
5. for every corpus, the downstream CNN of the evaluation library (``train_classifier``, fixed
   hyperparameters) is trained on the synthetic images and tested on the official Fashion-MNIST
   test set (TSTR), and the feature-space Fréchet distance ``fd_dpsynth`` is computed in a
   feature network trained on the PUBLIC in-distribution split only;
6. **real data**: the same CNN trained (non-privately) on the private images themselves;
7. **DP-Adam directly** (DP-DocLDM's baseline): the same CNN, pretrained on the public source
   (non-private), then trained with DP-Adam on the private images at the same ε and δ (the
   project's DP engine ``dpsynth_ml.dp.DpSgdEngine`` with Poisson sampling; σ from the same
   ledger calibration). Its ε = 0 row is the publicly pretrained classifier alone.

At CPU scale (``parallel_sources``) the work runs on two processes, one core and one torch
thread each: the in-distribution generator in this one; the digits generator, both DP-Adam
baselines and the real-data classifier in a spawned second one.

Nothing is chosen by looking at the test set or at the private data: every setting is in
:data:`SIZES`, fixed before the run (the generator's at CPU scale by a check on PUBLIC
validation images, see the notes). The published reference points (DPDM Tables 1/2,
DPImageBench) are printed beside the measured rows with the differences in setting.

Run from the repository root: ``.venv/bin/python -m benchmarks.fmnist_privacy_utility``
(``BENCH_SCALE=full`` for the paper-sized settings). Needs Debian's ``dataset-fashion-mnist``
(``apt-get install dataset-fashion-mnist``).
"""

from __future__ import annotations

import gzip
import math
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import bench_main, fmt

NAME = "fmnist_privacy_utility"
FMNIST_DIR = Path(os.environ.get("DPSYNTH_FMNIST_DIR", "/usr/share/datasets/fashion-mnist"))
CLASS_NAMES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
               "Sneaker", "Bag", "Ankle boot")

#: Every setting of both scales, fixed in advance (never tuned on the test set or private data).
SIZES: dict[str, dict[str, Any]] = {
    "cpu": {
        # data (images are downsampled from 28x28 with an antialiased bilinear resize)
        "image_size": 16,
        "private_size": 2000,          # private Fashion-MNIST training images
        "public_size": 8000,           # in-distribution public split (disjoint from private)
        "ood_public_size": 1797,       # all of sklearn's digits
        "generator_public_size": 3000,  # of the public split, for the generator's pretraining:
                                        # the small preset trains its VAE 8 epochs, so fewer
                                        # images leave more of the time to UNet steps
        "test_size": 10000,            # official test set, all of it (accuracy)
        "seeds": 3,
        # generator
        "preset": "small",             # 4x VAE downsampling: 4x4 latents, cheap UNet steps
        "pretrain_epochs": 20,         # in-distribution: 20 x 47 = 940 UNet steps
        "ood_pretrain_epochs": 20,     # digits: 20 x 29 = 580 UNet steps (the cheaper source)
        "pretrain_batch_size": 64,
        "pretrain_learning_rate": 3e-4,
        "trainable": "attention",      # the platform's default finetune mode (DP-LDMs)
        "finetune_steps": 10,
        "finetune_batch_size": 256,    # expected batch size B; q = B / N
        "finetune_learning_rate": 1e-3,
        "max_grad_norm": 1.0,
        "samples_per_class": 20,
        "sampler": "ddim",
        "sampler_steps": 10,           # as good as 25 on public validation images (notes)
        "guidance_scale": 1.0,         # better than 2 or 3 on public validation images (notes)
        # classifiers and metrics
        "classifier": "cnn",
        "featnet_epochs": 5,
        "fd_reference_size": 1000,     # real test images the synthetic sets are compared with
        "dpadam_epochs": 2,            # DP-Adam epochs over the private set (steps = E / q)
        "dpadam_batch_size": 256,
        "dpadam_learning_rate": 1e-3,
        "torch_threads": 1,            # 2 threads on 2 shared cores ran 6x slower (measured)
        "parallel_sources": True,      # the two public sources in two processes, 1 core each
    },
    "full": {
        "image_size": 32,              # 28x28 resized to 32x32 (the small preset needs 4 | 32/4)
        "private_size": 50000,         # the 60k training set minus the public split
        "public_size": 10000,
        "ood_public_size": 1797,
        "generator_public_size": 10000,
        "test_size": 10000,
        "seeds": 3,
        "preset": "small",
        "pretrain_epochs": 50,
        "ood_pretrain_epochs": 200,
        "pretrain_batch_size": 128,
        "pretrain_learning_rate": 3e-4,
        "trainable": "attention",
        "finetune_steps": 2000,
        "finetune_batch_size": 2048,
        "finetune_learning_rate": 3e-4,
        "max_grad_norm": 1.0,
        "samples_per_class": 1000,
        "sampler": "ddim",
        "sampler_steps": 50,
        "guidance_scale": 1.0,
        "classifier": "cnn",
        "featnet_epochs": 20,
        "fd_reference_size": 10000,
        "dpadam_epochs": 40,
        "dpadam_batch_size": 2048,
        "dpadam_learning_rate": 1e-3,
        "torch_threads": None,         # torch's default
        "parallel_sources": False,
    },
}

EPSILONS = (1.0, 10.0)

#: Published reference points (shared/reference/fmnist-anchors.md). Accuracy in %, FID on
#: Inception features (not comparable with fd_dpsynth).
PUBLISHED: list[dict[str, Any]] = [
    {"source": "DPDM Table 1 (Acc-tuned sampler), CNN", "epsilon": 0.2, "accuracy": 72.3,
     "fid": 128.0},
    {"source": "DPDM Table 1 (Acc-tuned sampler), CNN", "epsilon": 1.0, "accuracy": 79.4,
     "fid": 51.4},
    {"source": "DPDM Table 1 (Acc-tuned sampler), CNN", "epsilon": 10.0, "accuracy": 86.2,
     "fid": 19.1},
    {"source": "DPDM Table 1 (FID-tuned sampler), CNN", "epsilon": 1.0, "accuracy": 73.6,
     "fid": 37.8},
    {"source": "DPDM Table 1 (FID-tuned sampler), CNN", "epsilon": 10.0, "accuracy": 84.9,
     "fid": 18.6},
    {"source": "DPDM Table 2: same CNN trained with DP-SGD on real data", "epsilon": 1.0,
     "accuracy": 70.5, "fid": None},
    {"source": "DPDM Table 2: same CNN trained with DP-SGD on real data", "epsilon": 10.0,
     "accuracy": 77.1, "fid": None},
    {"source": "DPImageBench: DPDM re-run", "epsilon": 1.0, "accuracy": 76.4, "fid": 28.8},
    {"source": "DPImageBench: DPDM re-run", "epsilon": 10.0, "accuracy": 85.6, "fid": 17.1},
    {"source": "DPImageBench: PrivImage (ImageNet-pretrained)", "epsilon": 1.0,
     "accuracy": 79.9, "fid": 12.1},
    {"source": "DPImageBench: PrivImage (ImageNet-pretrained)", "epsilon": 10.0,
     "accuracy": 87.1, "fid": 5.3},
    {"source": "DPImageBench: DP-LDM (SD)", "epsilon": 10.0, "accuracy": 82.0, "fid": 20.1},
]

PUBLISHED_SETTING = (
    "DPDM: 28x28 pixel-space DDPM++ (~1.75M parameters) trained from scratch (no public data) "
    "on all 60,000 training images, 300 epochs at batch 4096 with 32 noise draws per image, "
    "δ = 1e-5; FID on Inception features; its CNN (3 conv layers) is trained 50 epochs on "
    "60,000 synthetic images with the epoch selected on a synthetic validation folder. "
    "DPImageBench: ~3.8M-parameter diffusion models, ResNet-type classifiers selected on "
    "DP-noised validation accuracy, some methods ImageNet-pretrained, δ = 1e-5."
)


# --------------------------------------------------------------------------- data


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (optionally gzipped): magic 0x0000 <dtype 0x08> <ndim>, big-endian dims.

    Only unsigned bytes (type 0x08) occur in Fashion-MNIST, so only they are accepted.
    """
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    if data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file")
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    array = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if array.size != math.prod(dims):
        raise ValueError(f"{path}: {array.size} values for dims {dims}")
    return array.reshape(dims).copy()  # writable (torch.from_numpy warns on read-only)


def load_fmnist() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The official train/test split as uint8 [N, 28, 28] images and int64 labels."""
    names = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
             "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
    paths = []
    for name in names:
        candidates = [FMNIST_DIR / f"{name}.gz", FMNIST_DIR / name]
        found = next((p for p in candidates if p.exists()), None)
        if found is None:
            raise SystemExit(f"Fashion-MNIST not found in {FMNIST_DIR}: install Debian's "
                             "dataset-fashion-mnist (apt-get install dataset-fashion-mnist) "
                             "or set DPSYNTH_FMNIST_DIR")
        paths.append(found)
    x_train, y_train, x_test, y_test = (read_idx(p) for p in paths)
    return x_train, y_train.astype(np.int64), x_test, y_test.astype(np.int64)


def resize(images: np.ndarray, size: int) -> np.ndarray:
    """uint8 [N, H, W] -> uint8 [N, size, size, 1] (antialiased bilinear, as the ML core)."""
    import torch
    import torch.nn.functional as F

    x = torch.from_numpy(np.ascontiguousarray(images)).float()[:, None]
    if x.shape[-1] != size:
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False,
                          antialias=x.shape[-1] > size)
    return x.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()


def load_digits_public(size: int) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """scikit-learn's 1,797 8x8 handwritten digits (0..16 gray levels) as uint8 images."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.round(digits.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
    return resize(images, size), digits.target.astype(np.int64), tuple(str(d) for d in range(10))


def save_npz(path: Path, images: np.ndarray, labels: np.ndarray,
             class_names: tuple[str, ...]) -> Path:
    """Write a canonical dataset file of the ML core."""
    np.savez(path, images=images, labels=labels.astype(np.int64),
             class_names=np.array(class_names))
    return path


def read_corpus(out_dir: Path, model_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """The PNGs ``sample`` wrote, as uint8 [N, H, W, 1] images and their class indices."""
    from dpsynth_ml import read_model_info
    from dpsynth_ml.sampling.generate import _class_dirs
    from PIL import Image

    info = read_model_info(model_dir)
    images, labels = [], []
    for cls, name in enumerate(_class_dirs(info)):
        files = sorted((out_dir / name).glob("*.png"), key=lambda p: int(p.stem))
        for f in files:
            a = np.asarray(Image.open(f))
            images.append(a[..., None] if a.ndim == 2 else a[..., :1])
            labels.append(cls)
    return np.stack(images).astype(np.uint8), np.array(labels, dtype=np.int64)


# --------------------------------------------------------------------------- pieces


def default_delta(n: int) -> float:
    """The platform's default δ of a dataset of declared size N (docs/privacy.md)."""
    return min(1e-6, 1.0 / (10 * n))


def calibrated_sigma(epsilon: float, sample_rate: float, steps: int, delta: float) -> float:
    """σ from the ledger's own calibration (PLD, the smallest σ whose ε does not exceed ε)."""
    from dpsynth_ledger.accounting import calibrate_noise_multiplier, dp_sgd_epsilon

    sigma = calibrate_noise_multiplier(epsilon, sample_rate, steps, delta)
    achieved = dp_sgd_epsilon(sigma, sample_rate, steps, delta)
    if achieved > epsilon * (1 + 1e-9):
        raise RuntimeError(f"calibration overshoots: ε({sigma}) = {achieved} > {epsilon}")
    return float(sigma)


def nonprivate_supported() -> bool:
    """Whether the benchmark-only non-private finetune is at hand (it lives in
    ``benchmarks.nonprivate_finetune``, outside the ML core)."""
    try:
        from benchmarks.nonprivate_finetune import train_nonprivate
    except ImportError:
        return False
    return callable(train_nonprivate)


def cnn_accuracy(images: np.ndarray, labels: np.ndarray, test: tuple[np.ndarray, np.ndarray],
                 cfg: dict[str, Any], seed: int) -> float:
    """Train the fixed downstream classifier and return its accuracy on the real test set."""
    from dpsynth_ml.evaluation import classifier_accuracy, train_classifier

    model = train_classifier(cfg["classifier"], images, labels, num_classes=10, seed=seed)
    return classifier_accuracy(model, *test)


class FeatureSpace:
    """fd_dpsynth: the Fréchet distance in a feature network trained on the PUBLIC split."""

    def __init__(self, public_images: np.ndarray, public_labels: np.ndarray,
                 reference: np.ndarray, floor_images: np.ndarray | None, cfg: dict[str, Any],
                 work: Path, *, train: bool = True) -> None:
        """Train the network into ``work/featnet`` (``train=False``: load the one there)."""
        from dpsynth_ml.evaluation import extract_features, load_feature_net, train_feature_net

        if train:
            train_feature_net(public_images, public_labels, class_names=CLASS_NAMES,
                              image_size=cfg["image_size"], channels=1,
                              epochs=cfg["featnet_epochs"], batch_size=64,
                              learning_rate=1e-3, seed=0, out_dir=work / "featnet")
        self.net, self.info = load_feature_net(work / "featnet")
        self.extract = extract_features
        self.reference = extract_features(self.net, self.info, reference)
        self.public_accuracy = float(self.info.accuracy)
        self.sha256 = self.info.sha256
        #: real test images (disjoint from the reference), as many as a synthetic corpus
        self.floor = self.distance(floor_images) if floor_images is not None else None

    def distance(self, images: np.ndarray) -> float:
        """fd_dpsynth between ``images`` and the real reference set."""
        from dpsynth_ml.evaluation import frechet_distance

        return float(frechet_distance(self.extract(self.net, self.info, images), self.reference))


def dp_adam_classifier(init: Any, images: np.ndarray, labels: np.ndarray, *, epsilon: float,
                       delta: float, cfg: dict[str, Any], seed: int,
                       device: str = "cpu") -> tuple[Any, dict]:
    """DP-Adam on the private images from a (public) initial classifier; DP-DocLDM's baseline.

    Poisson sampling at q = B / N, per-example clipping to C, one Gaussian draw per step,
    divided by B (``DpSgdEngine``); σ from the ledger's calibration for (ε, q, steps, δ).
    On ``device`` (the images are copied there once; the sampler and the noise source's key
    stay on the host, the noise is drawn on the device: ``DpSgdEngine``); physical batches of
    ``cfg["dpadam_physical_batch"]`` (default 512) examples. The model stays on ``device``.
    """
    import copy

    import torch
    from dpsynth_ml.dp import DpSgdEngine, PoissonSampler
    from torch import nn

    n = len(images)
    batch = cfg["dpadam_batch_size"]
    q = batch / n
    steps = max(1, round(cfg["dpadam_epochs"] / q))
    sigma = calibrated_sigma(epsilon, q, steps, delta)
    model = copy.deepcopy(init).to(device).train()
    x, y = model.to_input(images).to(device), torch.from_numpy(labels).to(device)
    physical = int(cfg.get("dpadam_physical_batch", 512))
    generator = torch.Generator().manual_seed(10_000 + seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg["dpadam_learning_rate"])
    engine = DpSgdEngine(model, optimizer, noise_multiplier=sigma,
                         max_grad_norm=cfg["max_grad_norm"], expected_batch_size=batch,
                         generator=generator)
    sampler = PoissonSampler(n, q, generator)
    loss_fn = nn.CrossEntropyLoss(reduction="none")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # dropout
        for _ in range(steps):
            idx = sampler.sample().to(device)
            for start in range(0, int(idx.numel()), physical):
                chunk = idx[start:start + physical]
                engine.accumulate(loss_fn(engine.module(x[chunk]), y[chunk]))
            engine.privatize()
            engine.apply_update()
    engine.close()
    model.eval()
    return model, {"noise_multiplier": sigma, "sample_rate": q, "steps": steps}


def public_classifier(images: np.ndarray, labels: np.ndarray, cfg: dict[str, Any], *,
                      seed: int) -> Any:
    """The downstream CNN trained non-privately on the public source (the baselines' start)."""
    from dpsynth_ml.evaluation import train_classifier

    return train_classifier(cfg["classifier"], images, labels, num_classes=10, seed=seed)


def public_start(public_cnn: Any, *, reset_head: bool, seed: int) -> Any:
    """A copy of the public CNN to start one seed's DP-Adam run from.

    For the out-of-distribution source the labels mean something else (digits), so its last
    layer is re-initialised (seeded) before DP training; its features are what carries over.
    """
    import copy

    import torch

    model = copy.deepcopy(public_cnn)
    if reset_head:
        last = [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            last.reset_parameters()
    return model


# --------------------------------------------------------------------------- the run


def _mean_std(values: list[float]) -> dict[str, Any]:
    return {"mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "values": values}


class _Clock:
    """Wall and CPU seconds per phase (the 2 cores are shared: CPU time is the steadier one)."""

    def __init__(self, prefix: str = "") -> None:
        self.phases: dict[str, dict[str, float]] = {}
        self.prefix = prefix

    def run(self, label: str, fn: Callable[[], Any]) -> Any:
        w, c = time.perf_counter(), time.process_time()
        out = fn()
        slot = self.phases.setdefault(label, {"wall_s": 0.0, "cpu_s": 0.0, "calls": 0})
        slot["wall_s"] += time.perf_counter() - w
        slot["cpu_s"] += time.process_time() - c
        slot["calls"] += 1
        print(f"  {self.prefix}[{label}] {time.perf_counter() - w:.1f} s", flush=True)
        return out


def _prepare(cfg: dict[str, Any], work_root: Path, *, write: bool) -> dict[str, Any]:
    """The data of one run: a seeded split of the 60k training set (public / private / unused),
    the test set, the digits; ``write`` saves the ML core's dataset files under ``work_root``
    (the parent does; a source's process re-derives the same arrays and reuses the files)."""
    size = cfg["image_size"]
    x_train, y_train, x_test, y_test = load_fmnist()
    perm = np.random.default_rng(20261121).permutation(len(x_train))
    pub_idx = perm[:cfg["public_size"]]
    priv_idx = perm[cfg["public_size"]:cfg["public_size"] + cfg["private_size"]]
    public_x, public_y = resize(x_train[pub_idx], size), y_train[pub_idx]
    private_x, private_y = resize(x_train[priv_idx], size), y_train[priv_idx]
    test_x, test_y = resize(x_test[:cfg["test_size"]], size), y_test[:cfg["test_size"]]
    digits_x, digits_y, digit_names = load_digits_public(size)
    digits_x, digits_y = digits_x[:cfg["ood_public_size"]], digits_y[:cfg["ood_public_size"]]
    n_gen = min(cfg["generator_public_size"], len(public_x))
    data_dir = work_root / "data"
    paths = {"private": data_dir / "private.npz", "in_distribution": data_dir / "public_fmnist.npz",
             "out_of_distribution": data_dir / "public_digits.npz"}
    if write:
        data_dir.mkdir(parents=True, exist_ok=True)
        save_npz(paths["private"], private_x, private_y, CLASS_NAMES)
        save_npz(paths["in_distribution"], public_x[:n_gen], public_y[:n_gen], CLASS_NAMES)
        save_npz(paths["out_of_distribution"], digits_x, digits_y, digit_names)
    sources = {
        "in_distribution": {
            "label": "in-distribution public split (Fashion-MNIST train, disjoint from private)",
            "path": paths["in_distribution"], "generator_size": n_gen,
            "epochs": cfg["pretrain_epochs"],
            "images": public_x, "labels": public_y, "same_labels": True},
        "out_of_distribution": {
            "label": "out-of-distribution public source (sklearn digits, upscaled)",
            "path": paths["out_of_distribution"], "generator_size": len(digits_x),
            "epochs": cfg["ood_pretrain_epochs"],
            "images": digits_x, "labels": digits_y, "same_labels": False},
    }
    n_private = len(private_x)
    q = cfg["finetune_batch_size"] / n_private
    delta = default_delta(n_private)
    return {"public": (public_x, public_y), "private": (private_x, private_y),
            "private_path": paths["private"], "test": (test_x, test_y), "sources": sources,
            "n_private": n_private, "delta": delta, "q": q,
            "sigmas": {eps: calibrated_sigma(eps, q, cfg["finetune_steps"], delta)
                       for eps in EPSILONS},
            "reference": test_x[:cfg["fd_reference_size"]],
            "floor": test_x[cfg["fd_reference_size"]:
                            cfg["fd_reference_size"] + 10 * cfg["samples_per_class"]]}


def _set_threads(cfg: dict[str, Any]) -> None:
    import torch

    if cfg.get("torch_threads"):
        torch.set_num_threads(cfg["torch_threads"])


def _second_process(cfg: dict[str, Any], work_root: str) -> tuple[dict[str, Any], dict, float]:
    """The second core's share (``parallel_sources``): the out-of-distribution source's
    generator rows, both DP-Adam baselines and the real-data classifier, while the parent
    pretrains and evaluates the in-distribution generator. Re-derives the same data and
    loads the parent's feature network (trained before this process starts)."""
    _set_threads(cfg)
    clock = _Clock(prefix="process 2: ")
    c_start = time.process_time()
    data = _prepare(cfg, Path(work_root), write=False)
    fs = FeatureSpace(*data["public"], data["reference"], None, cfg, Path(work_root),
                      train=False)
    out: dict[str, Any] = {"sources": {"out_of_distribution": _run_source(
        cfg, "out_of_distribution", data, fs, clock, Path(work_root))}}
    out["baselines"] = {key: _run_baselines(cfg, key, data, clock) for key in data["sources"]}
    out["real"] = _real_data(cfg, data, clock)
    return out, clock.phases, time.process_time() - c_start


def _run_source(cfg: dict[str, Any], key: str, data: dict[str, Any], fs: FeatureSpace,
                clock: _Clock, work_root: Path) -> dict[str, Any]:
    """Pretrain on one public source, then every row of that source (all seeds)."""
    from dpsynth_ml import DpSpec, FinetuneTraining, PretrainTraining, RecordLevel, sample, train

    from benchmarks.nonprivate_finetune import NonprivateFinetune, train_nonprivate
    from benchmarks.pretrain_cache import cached_pretrain

    src = data["sources"][key]
    size = cfg["image_size"]
    test = data["test"]
    n_private, q, sigmas = data["n_private"], data["q"], data["sigmas"]
    steps = cfg["finetune_steps"]
    seeds = list(range(cfg["seeds"]))
    has_nonprivate = nonprivate_supported()
    print(f"== source {key}", flush=True)
    # public data only: reused from the pretraining cache when the same spec, data and ML
    # core were pretrained before (benchmarks/pretrain_cache.py)
    cached = clock.run("pretrain", lambda: cached_pretrain(
        PretrainTraining(preset=cfg["preset"], image_size=size, channels=1,
                         num_classes=10, epochs=src["epochs"],
                         batch_size=cfg["pretrain_batch_size"],
                         learning_rate=cfg["pretrain_learning_rate"], seed=0),
        src["path"], label=f"{NAME}:{key}", scratch_dir=work_root / key / "pretrain"))
    pre = cached.result
    # the in-distribution split has the private label domain: keep the pretrained class
    # table (identity class map); the digits' labels mean something else: a fresh table.
    class_map = {i: i for i in range(10)} if src["same_labels"] else None
    rows: dict[str, dict[str, list[float]]] = {}

    def corpus_row(label: str, model_dir: Path, seed: int) -> None:
        out = work_root / key / f"samples-{label}-{seed}"
        clock.run("sample", lambda: sample(
            model_dir, samples_per_class=cfg["samples_per_class"], sampler=cfg["sampler"],
            steps=cfg["sampler_steps"], guidance_scale=cfg["guidance_scale"],
            seed=seed, out_dir=out, batch_size=200))
        images, labels = read_corpus(out, model_dir)
        acc = clock.run("classifier", lambda: cnn_accuracy(images, labels, test, cfg, seed))
        fd = clock.run("fd", lambda: fs.distance(images))
        row = rows.setdefault(label, {"accuracy": [], "fd_dpsynth": []})
        row["accuracy"].append(acc)
        row["fd_dpsynth"].append(fd)

    def finetune(seed: int, dp: Any, nonprivate: bool, out: Path) -> Path:
        # the same number of steps as the DP runs, over whole epochs of the private set
        epochs = max(1, round(steps * q))
        common: dict[str, Any] = dict(
            image_size=size, channels=1, num_classes=10, trainable=cfg["trainable"],
            class_map=class_map, learning_rate=cfg["finetune_learning_rate"],
            max_physical_batch_size=256, checkpoint_every=10**6)
        if nonprivate:
            return train_nonprivate(
                NonprivateFinetune(**common, seed=seed, epochs=epochs,
                                   batch_size=math.ceil(n_private * epochs / steps)),
                dataset_path=data["private_path"], out_dir=out,
                base_model_dir=pre.model_dir).model_dir
        return train(FinetuneTraining(**common, privacy=RecordLevel(dp)),
                     dataset_path=data["private_path"], out_dir=out,
                     base_model_dir=pre.model_dir).model_dir

    for seed in seeds:
        print(f"-- {key} seed {seed}", flush=True)
        corpus_row("eps_0", pre.model_dir, seed)
        for eps in EPSILONS:
            dp = DpSpec(noise_multiplier=sigmas[eps], sample_rate=q,
                        expected_batch_size=cfg["finetune_batch_size"],
                        max_grad_norm=cfg["max_grad_norm"], steps=steps)
            out = work_root / key / f"ft-{eps:g}-{seed}"
            model_dir = clock.run("dp_finetune", lambda dp=dp, seed=seed, out=out:
                                  finetune(seed, dp, False, out))
            corpus_row(f"eps_{eps:g}", model_dir, seed)
        if has_nonprivate:
            out = work_root / key / f"ft-inf-{seed}"
            model_dir = clock.run("nonprivate_finetune", lambda seed=seed, out=out:
                                  finetune(seed, None, True, out))
            corpus_row("eps_inf", model_dir, seed)

    result = {
        "label": src["label"],
        "public_size": len(src["images"]),
        "generator_public_size": src["generator_size"],
        "pretrain_epochs": src["epochs"],
        "pretrain_unet_steps": src["epochs"] * math.ceil(src["generator_size"]
                                                         / cfg["pretrain_batch_size"]),
        "pretrain_steps": pre.steps_completed,
        "pretrain_parameters": pre.total_parameters,
        "pretrain_cache": cached.record(),
        "rows": {k: {m: _mean_std(v) for m, v in r.items()} for k, r in rows.items()},
    }
    if not has_nonprivate:
        result["rows"]["eps_inf"] = {"not_measured": True}
    return result


def _run_baselines(cfg: dict[str, Any], key: str, data: dict[str, Any],
                   clock: _Clock) -> dict[str, Any]:
    """DP-Adam directly on the private images, after public pretraining of the same CNN.

    The public CNN is trained ONCE per source (seed 0), like the generator's pretraining;
    each seed starts from a copy (with a freshly seeded last layer for the digits).
    """
    from dpsynth_ml.evaluation import classifier_accuracy

    src = data["sources"][key]
    test = data["test"]
    private_x, private_y = data["private"]
    seeds = list(range(cfg["seeds"]))
    baseline: dict[str, list[float]] = {"eps_0": []}
    dp_meta: dict[str, Any] = {}
    public_cnn = clock.run("classifier", lambda: public_classifier(
        src["images"], src["labels"], cfg, seed=0))
    for seed in seeds:
        init = public_start(public_cnn, reset_head=not src["same_labels"], seed=seed)
        baseline["eps_0"].append(classifier_accuracy(init, *test))
        for eps in EPSILONS:
            model, meta = clock.run("dp_adam", lambda init=init, eps=eps, seed=seed:
                                    dp_adam_classifier(init, private_x, private_y,
                                                       epsilon=eps, delta=data["delta"],
                                                       cfg=cfg, seed=seed))
            dp_meta[f"eps_{eps:g}"] = meta
            baseline.setdefault(f"eps_{eps:g}", []).append(classifier_accuracy(model, *test))
    return {"dp_adam": {k: _mean_std(v) for k, v in baseline.items()},
            "dp_adam_settings": dp_meta}


def _real_data(cfg: dict[str, Any], data: dict[str, Any], clock: _Clock) -> list[float]:
    """The CNN trained non-privately on the private images (the ceiling), one per seed."""
    private_x, private_y = data["private"]
    return [clock.run("classifier",
                      lambda s=s: cnn_accuracy(private_x, private_y, data["test"], cfg, s))
            for s in range(cfg["seeds"])]


def run(scale: str) -> dict[str, Any]:
    """Run the benchmark at ``scale`` and return its results (see the module docstring)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    cfg = SIZES[scale]
    _set_threads(cfg)
    clock = _Clock()
    t_start, c_start = time.perf_counter(), time.process_time()
    work_root = Path(tempfile.mkdtemp(prefix="bench-fmnist-"))
    try:
        data = _prepare(cfg, work_root, write=True)
        test = data["test"]
        # ---- feature space for fd_dpsynth (public in-distribution split only)
        fs = clock.run("feature_net", lambda: FeatureSpace(
            *data["public"], data["reference"], data["floor"], cfg, work_root))
        # ---- the generator rows of both public sources, both DP-Adam baselines and the
        # real-data classifier: on two processes (one core each) or one after the other
        results_sources: dict[str, Any] = {}
        child_phases: dict[str, dict[str, float]] = {}
        child_cpu = 0.0
        if cfg.get("parallel_sources"):
            # by its importable name (under ``-m`` this module is __main__), spawned: no fork
            # of a process that already ran torch
            from benchmarks.fmnist_privacy_utility import _second_process as target

            ctx = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
                second = pool.submit(target, cfg, str(work_root))
                results_sources["in_distribution"] = _run_source(
                    cfg, "in_distribution", data, fs, clock, work_root)
                other, child_phases, child_cpu = second.result()
            results_sources.update(other["sources"])
            baselines, real = other["baselines"], other["real"]
        else:
            for key in data["sources"]:
                results_sources[key] = _run_source(cfg, key, data, fs, clock, work_root)
            baselines = {key: _run_baselines(cfg, key, data, clock) for key in data["sources"]}
            real = _real_data(cfg, data, clock)
        for key, base in baselines.items():
            results_sources[key].update(base)
        phases = {k: dict(v) for k, v in clock.phases.items()}
        for k, v in child_phases.items():
            slot = phases.setdefault(k, {"wall_s": 0.0, "cpu_s": 0.0, "calls": 0})
            for m in ("wall_s", "cpu_s", "calls"):
                slot[m] += v[m]
        n_synthetic = 10 * cfg["samples_per_class"]
        return {
            "settings": {**cfg, "delta": data["delta"], "private_size": data["n_private"],
                         "synthetic_per_corpus": n_synthetic, "test_size": len(test[0]),
                         "finetune_sample_rate": data["q"],
                         "finetune_noise_multipliers": {f"{e:g}": s
                                                        for e, s in data["sigmas"].items()},
                         "pretraining": "one pretraining per public source (seed 0), shared by "
                                        "all seeds",
                         "dp_randomness": "DP fine-tunes draw their Poisson batches and noise "
                                          "from OS entropy (not replayable by design); seeds fix "
                                          "sampling, classifier initialisation and shuffling",
                         "nonprivate_finetune_available": nonprivate_supported()},
            "feature_net": {"public_accuracy": fs.public_accuracy, "sha256": fs.sha256,
                            "fd_real_floor": fs.floor,
                            "fd_reference": f"{len(data['reference'])} real test images",
                            "fd_floor_note": f"fd_dpsynth of {len(data['floor'])} other real "
                                             "test images against the same reference: the "
                                             "value a perfect generator would get at this "
                                             "sample size"},
            "real_data": {"accuracy": _mean_std(real),
                          "note": "the CNN trained non-privately on the private images"},
            "sources": results_sources,
            "published": PUBLISHED,
            "published_setting": PUBLISHED_SETTING,
            "phases": {k: {m: round(v, 1) for m, v in p.items()} for k, p in phases.items()},
            "phases_note": ("summed over both processes (one core each: the in-distribution "
                            "generator in one; the digits generator, the DP-Adam baselines "
                            "and the real-data classifier in the other), so they add up to "
                            "more than the wall time" if cfg.get("parallel_sources")
                            else "one process"),
            "total_wall_s": round(time.perf_counter() - t_start, 1),
            "total_cpu_s": round(time.process_time() - c_start + child_cpu, 1),
        }
    finally:
        shutil.rmtree(work_root, ignore_errors=True)


# --------------------------------------------------------------------------- docs


def _pct(stat: dict[str, Any] | None) -> str:
    if not stat or "mean" not in stat:
        return "not measured"
    return f"{100 * stat['mean']:.1f} ± {100 * stat['std']:.1f}"


def _fd(stat: dict[str, Any] | None) -> str:
    if not stat or "mean" not in stat:
        return "not measured"
    return f"{fmt(stat['mean'])} ± {fmt(stat['std'], 2)}"


def _millions(results: dict[str, Any]) -> str:
    counts = [src.get("pretrain_parameters") for src in results["sources"].values()]
    counts = [c for c in counts if c]
    return f"{max(counts) / 1e6:.2f}M-parameter" if counts else "small"


def _pretraining(results: dict[str, Any]) -> str:
    parts = []
    for src in results["sources"].values():
        if "pretrain_unet_steps" in src:
            parts.append(f"{src['generator_public_size']:,} images × {src['pretrain_epochs']} "
                         f"epochs = {src['pretrain_unet_steps']:,} UNet steps")
        else:  # results of the first version (tiny preset)
            parts.append(f"{src['pretrain_steps']:,} VAE + UNet steps")
    return "; ".join(parts)


def _pretrain_reuse(results: dict[str, Any]) -> str:
    """Says which pretrainings came from the pretraining cache (results before it: none)."""
    reused = [(src["label"].split(" (")[0], src["pretrain_cache"])
              for src in results["sources"].values()
              if src.get("pretrain_cache", {}).get("cache") == "hit"]
    if not reused:
        return ""
    parts = ", ".join(f"{label}: trained once in {c['pretrain_s']:.0f} s, key "
                      f"`{c['key'][:12]}…`" for label, c in reused)
    return (f" (reused from the pretraining cache, `benchmarks/pretrain_cache.py`; {parts}; "
            "that time is not in this run's total)")


def table_markdown(results: dict[str, Any]) -> str:
    """The tables of docs/benchmarks.md: measured rows, then the published reference points."""
    s = results["settings"]
    n_seeds = s["seeds"]
    lines = [
        f"Measured at `{s['image_size']}x{s['image_size']}`, {s['private_size']:,} private "
        f"images, δ = {s['delta']:g}, {s['finetune_steps']} DP steps at q = "
        f"{s['finetune_sample_rate']:.3f} (`{s['trainable']}` layers of the `{s['preset']}` "
        f"preset), {s['synthetic_per_corpus']} synthetic images per corpus "
        f"({s['sampler']}, {s['sampler_steps']} steps), CNN accuracy on "
        f"{s['test_size']:,} real test images; mean ± std over {n_seeds} seeds. "
        f"{s['pretraining'].capitalize()}.",
        "",
        "| Public source | ε | CNN accuracy, synthetic (%) | fd_dpsynth | "
        "DP-Adam CNN directly (%) |",
        "|---|---|---|---|---|",
    ]
    eps_labels = [("eps_0", "0 (public only)"), ("eps_1", "1"), ("eps_10", "10"),
                  ("eps_inf", "∞ (non-private fine-tune)")]
    for src in results["sources"].values():
        for key, label in eps_labels:
            row = src["rows"].get(key, {})
            base = src["dp_adam"].get(key) if key != "eps_inf" else None
            lines.append(f"| {src['label']} | {label} | {_pct(row.get('accuracy'))} | "
                         f"{_fd(row.get('fd_dpsynth'))} | "
                         f"{_pct(base) if key != 'eps_inf' else '—'} |")
    fn = results["feature_net"]
    lines += [
        f"| real private images (no DP) | — | {_pct(results['real_data']['accuracy'])} "
        f"(trained on real data) | {fmt(fn['fd_real_floor'])} (real test images) | — |",
        "",
        f"fd_dpsynth: Fréchet distance in the dpsynth feature network trained on the public "
        f"in-distribution split only (accuracy on its public validation split "
        f"{100 * fn['public_accuracy']:.1f} %, sha256 `{fn['sha256'][:12]}…`) against "
        f"{fn['fd_reference']}; not Inception FID. The real-data row's fd_dpsynth is the floor "
        f"at this sample size. DP-Adam's ε = 0 row is the CNN trained on the public source "
        f"alone (for the digits: chance, its labels mean something else).",
        "",
        "Published reference points (Fashion-MNIST, δ = 1e-5, 28x28, 60,000 images; "
        "`shared/reference/fmnist-anchors.md`):",
        "",
        "| Source | ε | CNN accuracy (%) | FID (Inception) |",
        "|---|---|---|---|",
    ]
    for p in results["published"]:
        fid = "—" if p["fid"] is None else f"{p['fid']:g}"
        lines.append(f"| {p['source']} | {p['epsilon']:g} | {p['accuracy']:g} | {fid} |")
    lines += ["", f"Differences in setting. The papers: {PUBLISHED_SETTING} This run: "
                  f"{s['image_size']}x{s['image_size']} images, a "
                  f"{_millions(results)} latent diffusion model (`{s['preset']}` preset) "
                  f"pretrained on each public source ({_pretraining(results)}), "
                  f"{s['private_size']:,} private images, {s['finetune_steps']} DP steps at "
                  f"expected batch {s['finetune_batch_size']} (`{s['trainable']}` layers "
                  f"only), {s['synthetic_per_corpus']} synthetic images per corpus, "
                  f"δ = {s['delta']:g}, the evaluation library's 2-conv CNN with fixed "
                  f"settings, fd_dpsynth in a feature network trained on the public split "
                  f"(not Inception FID)."]
    ph = results.get("phases", {})
    if ph:
        parts = ", ".join(f"{k} {v['wall_s']:.0f} s"
                          + (_pretrain_reuse(results) if k == "pretrain" else "")
                          for k, v in ph.items())
        lines += ["", f"Wall time by phase: {parts}; total {results['total_wall_s']:.0f} s "
                      f"wall, {results['total_cpu_s']:.0f} s CPU."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    bench_main(NAME, run)
