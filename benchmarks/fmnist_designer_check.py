"""The designer-slice checks behind the ``cpu`` settings of ``benchmarks.fmnist_no_public``.

Every number in ``benchmarks/notes/fmnist_no_public.md`` ("Current settings") and in the
``[here]`` rows of ``docs/training-settings.md`` was measured on the DESIGNER'S SLICE: 2,000
Fashion-MNIST training images disjoint from the 10,000 private images and from the test set
(``fmnist_no_public.split_indices``). Nothing here reads the test set. Two checks:

* ``release``: what the central-image release alone holds. The release of the 10,000
  private images (the product's ``release_central_images``, ledger calibration of the noise
  at the given standalone ε, δ = 1e-5), then 500 draws per class straight from it
  (``sample_released``: the repeated mean without second moments, the released Gaussian
  with them), the evaluation CNN trained on those 5,000 images, its accuracy on the slice.
  About 20 s per cell on one core.
* ``warmup``: the product path of a ``fmnist_no_public`` cell (release, warm-up, optionally
  DP-SGD; ``fmnist_no_public._finetune``), then 100 images per class sampled with the
  ``cpu`` scale's sampler and the CNN's accuracy on the slice. 7–13 minutes per cell on one
  core (3,000 warm-up steps).

* ``class_table``: the class-table fault the three-block table found. The in-distribution
  public model of ``benchmarks.fmnist_table`` (its cached pretraining), a near-noiseless DP
  finetune (σ 0.01, 64 steps at q 0.128, clip 1e-3, lr 1e-4) on the first 1,000 images of
  the slice, 30 images per class sampled before and after, the CNN trained on each corpus and
  tested on the other 1,000 images of the slice. ``--fresh-table`` renames the classes, which
  makes the finetune start a fresh class table: what every finetune without a class_map did
  before the fix. About 3 minutes (plus the pretraining once, if not cached).

Run, e.g.::

    .venv/bin/python -m benchmarks.fmnist_designer_check release --epsilon 10 --components 16
    .venv/bin/python -m benchmarks.fmnist_designer_check release --epsilon 10 --means-only
    .venv/bin/python -m benchmarks.fmnist_designer_check warmup --epsilon 10 --warmup-steps 3000
    .venv/bin/python -m benchmarks.fmnist_designer_check warmup --epsilon 10 --dp-steps 6 \\
        --dp-learning-rate 1e-4
    .venv/bin/python -m benchmarks.fmnist_designer_check class_table [--fresh-table]

Each prints one JSON line (the settings and the slice accuracy). The results vary by a few
points with the seed (one seed, one corpus per cell).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np


def _slice(cfg: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    from benchmarks import fmnist_no_public as bench
    from benchmarks.fmnist_privacy_utility import load_fmnist

    x_train, y_train, _, _ = load_fmnist()
    _, designer = bench.split_indices(cfg, len(x_train))
    return x_train[designer][..., None], y_train[designer]


def release_check(cfg: dict[str, Any], *, epsilon: float, seed: int) -> dict[str, Any]:
    """Train the CNN on 5,000 draws straight from the release; accuracy on the slice."""
    import torch
    from dpsynth_ml.data import ImageDataset
    from dpsynth_ml.evaluation import classifier_accuracy, train_classifier
    from dpsynth_ml.training.hooks import NullHooks
    from dpsynth_ml.warmup.release import release_central_images, sample_released

    from benchmarks import fmnist_no_public as bench
    from benchmarks.fmnist_privacy_utility import CLASS_NAMES

    data = bench._data(cfg)
    images, labels = data["private"]
    dataset = ImageDataset(images=images, labels=labels.astype(np.int64),
                           class_names=tuple(CLASS_NAMES))
    _, noise_std = bench.release_event(epsilon, cfg)
    spec = bench._central(cfg, noise_std)
    release = release_central_images(dataset, spec, class_index=list(range(10)),
                                     normal_source=np.random.default_rng(seed),
                                     hooks=NullHooks(), image_size=28, channels=1)
    index = torch.arange(10).repeat_interleave(500)
    draws = sample_released(release, index, torch.Generator().manual_seed(seed),
                            image_size=28)
    pixels = (draws.permute(0, 2, 3, 1) * 255).round().to(torch.uint8).numpy()
    model = train_classifier("cnn", pixels, index.numpy(), num_classes=10, seed=seed)
    return {"accuracy": classifier_accuracy(model, *_slice(cfg)), "corpus": len(pixels),
            "noise_std": noise_std, "pixel_mean": float(pixels.mean())}


def warmup_check(cfg: dict[str, Any], *, epsilon: float, seed: int) -> dict[str, Any]:
    """Release + warm-up (+ DP-SGD) as a ``fmnist_no_public`` cell; accuracy on the slice."""
    from benchmarks import fmnist_no_public as bench
    from benchmarks.fmnist_privacy_utility import CLASS_NAMES, save_npz

    with tempfile.TemporaryDirectory(prefix="designer-") as tmp:
        work = Path(tmp)
        data = bench._data(cfg)
        save_npz(work / "private.npz", data["private"][0], data["private"][1], CLASS_NAMES)
        base = bench._base_model(cfg, work / "base", seed)
        split = bench.split_epsilon(epsilon, cfg, dp_steps=cfg["dp_steps"])
        sigma = split["dp_sgd"]["event"]["noise_multiplier"] if split["dp_sgd"] else 1.0
        started = time.perf_counter()
        model, _ = bench._finetune(cfg, base, work / "private.npz", work / "ft",
                                   noise_std=split["release"]["noise_std"], sigma=sigma,
                                   steps=cfg["dp_steps"])
        train_s = time.perf_counter() - started
        out = bench._corpus_accuracy(cfg, model, work / "corpus", 100, seed, _slice(cfg))
    return {**out, "train_s": round(train_s, 1), "split": split}


def class_table_check(cfg: dict[str, Any], *, fresh_table: bool, seed: int,
                      ) -> dict[str, Any]:
    """A long, near-noiseless DP finetune of the in-distribution public model on half the
    slice; the CNN's accuracy (on the other half) of corpora sampled before and after."""
    from dpsynth_ml import read_model_info, train
    from dpsynth_ml.spec import DpSpec, FinetuneTraining, RecordLevel

    from benchmarks import fmnist_no_public as bench
    from benchmarks import fmnist_table
    from benchmarks.fmnist_privacy_utility import CLASS_NAMES, save_npz

    x, y = _slice(cfg)
    held_out = (x[1000:], y[1000:])
    names = tuple(f"class {i}" for i in range(10)) if fresh_table else CLASS_NAMES
    table_cfg = {**fmnist_table.settings("cpu"), "torch_threads": 1}
    with tempfile.TemporaryDirectory(prefix="designer-") as tmp:
        work = Path(tmp)
        base = Path(fmnist_table.pretrain_public(table_cfg, "in_dist", tmp)["model_dir"])
        dataset = save_npz(work / "half.npz", x[:1000], y[:1000], names)
        dp = DpSpec(noise_multiplier=0.01, sample_rate=0.128, expected_batch_size=128,
                    max_grad_norm=1e-3, steps=64)
        spec = FinetuneTraining(image_size=28, channels=1, trainable="full",
                                privacy=RecordLevel(dp), learning_rate=1e-4,
                                max_physical_batch_size=250, checkpoint_every=64)
        tuned = train(spec, dataset_path=dataset, out_dir=work / "ft",
                      base_model_dir=base).model_dir
        cfg = {**cfg, "selection": None}
        before = bench._corpus_accuracy(cfg, base, work / "c0", 30, seed, held_out)
        after = bench._corpus_accuracy(cfg, tuned, work / "c1", 30, seed, held_out)
        return {"accuracy": after["accuracy"], "public_model_accuracy": before["accuracy"],
                "class_table": read_model_info(tuned).extra.get("class_table"),
                "fresh_table_forced": fresh_table}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import torch

    from benchmarks import fmnist_no_public as bench

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("check", choices=["release", "warmup", "class_table"])
    parser.add_argument("--epsilon", type=float, default=10.0,
                        help="total ε at δ = 1e-5 (with --dp-steps 0: all on the release)")
    parser.add_argument("--means-only", action="store_true", help="no second moments")
    parser.add_argument("--components", type=int, default=None)
    parser.add_argument("--augment", action="store_true")
    parser.add_argument("--warmup-steps", type=int, default=None)
    parser.add_argument("--warmup-ema-decay", type=float, default=None,
                        help="0 for none (default: the product's)")
    parser.add_argument("--dp-steps", type=int, default=0)
    parser.add_argument("--dp-learning-rate", type=float, default=None)
    parser.add_argument("--release-fraction", type=float, default=None)
    parser.add_argument("--fresh-table", action="store_true",
                        help="class_table: rename the classes (a fresh class table)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    cfg = dict(bench.SIZES["cpu"])
    cfg.update({"second_moments": not args.means_only, "augment": args.augment,
                "dp_steps": args.dp_steps})
    for key in ("components", "warmup_steps", "dp_learning_rate", "release_fraction"):
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    if args.warmup_ema_decay is not None:
        cfg["warmup_ema_decay"] = args.warmup_ema_decay or None
    if args.check == "class_table":
        result = class_table_check(cfg, fresh_table=args.fresh_table, seed=args.seed)
    else:
        check = release_check if args.check == "release" else warmup_check
        result = check(cfg, epsilon=args.epsilon, seed=args.seed)
    settings = {k: cfg[k] for k in ("second_moments", "components", "augment", "warmup_steps",
                                    "dp_steps", "dp_learning_rate", "release_fraction",
                                    "sampler", "sampler_steps") if k in cfg}
    line = {"check": args.check, "epsilon": args.epsilon, "seed": args.seed,
            "settings": settings, "designer_accuracy": result.pop("accuracy"),
            **{k: v for k, v in result.items() if k != "split"}}
    print(json.dumps(line), flush=True)
    return line


if __name__ == "__main__":
    main()
