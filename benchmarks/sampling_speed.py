"""Sampling speed and quality: DDPM, DDIM and DPM-Solver++ at several step counts.

One model is pretrained by this script (seeded) on the public in-distribution split of
Fashion-MNIST (the first ``public_records`` images of its training set, Debian's
``dataset-fashion-mnist`` IDX files; the rest of the training set plays no part here), or
reused from the pretraining cache (``benchmarks/pretrain_cache.py``) when the same spec, data
and ML core were pretrained before: the results' ``pretrain_cache`` says which (hit / miss /
off, the key, the original pretraining time), ``phases.pretrain_s`` is this run's time (on a
hit, finding and verifying the entry only). Every sampler then draws the same number of
images per class from that model through the ML core's real entry point
:func:`dpsynth_ml.sample` (same seed, guidance 1, default batch), and:

* **speed** is ``SampleResult.images_per_second``: denoising and VAE decoding only (model
  loading and PNG writing excluded), wall clock on this machine;
* **quality** is ``fd_dpsynth``: the Fréchet distance between the features of the generated
  images and of real held-out images (the Fashion-MNIST test set) under the dpsynth feature
  network (``dpsynth_ml.evaluation.train_feature_net``), trained here on the same public
  split. It is NOT Inception FID. With a few hundred images a Fréchet distance is biased
  upwards, so the same-size real-vs-real distance (two disjoint held-out sets) is reported
  as the floor: a sampler is only as good as its distance above that floor. The distance
  of real held-out images passed through the model's VAE alone (encode, decode) is reported
  too: every sample is decoded by that VAE, so no sampler of this model can do better.

Run from the repository root: ``.venv/bin/python -m benchmarks.sampling_speed``.
"""

from __future__ import annotations

import gzip
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import bench_main, device_label, fmt

NAME = "sampling_speed"
FMNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FMNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                  "Sneaker", "Bag", "Ankle boot")

SCALES: dict[str, dict[str, Any]] = {
    # 2 shared CPU cores, about 4 minutes, one torch thread: the "tiny" preset at 16x16
    # (8x8 latents), a short pretrain (2 epochs of 4,000 images), 10 images per class.
    # One UNet evaluation costs ~5-8 ms per image here, so 1,000-step DDPM (100 s per 10
    # images) only runs at full scale.
    "cpu": {"preset": "tiny", "image_size": 16, "public_records": 4000, "pretrain_epochs": 2,
            "pretrain_batch": 64, "pretrain_lr": 2e-3, "featnet_epochs": 3,
            "samples_per_class": 10,
            "configs": [("ddpm", 100), ("ddim", 10), ("ddim", 25), ("dpm_solver++", 5),
                        ("dpm_solver++", 10), ("dpm_solver++", 20)],
            "threads": 1},
    # GPU-sized: the "small" preset on 32x32 images, a 30,000-image public split, a longer
    # pretrain and 500 images per class (5,000 per configuration). Never run here.
    "full": {"preset": "small", "image_size": 32, "public_records": 30000,
             "pretrain_epochs": 30, "pretrain_batch": 128, "pretrain_lr": 1e-3,
             "featnet_epochs": 10, "samples_per_class": 500,
             "configs": [("ddpm", 1000), ("ddpm", 250), ("ddim", 10), ("ddim", 25),
                         ("ddim", 50), ("ddim", 100), ("ddim", 250), ("dpm_solver++", 5),
                         ("dpm_solver++", 10), ("dpm_solver++", 20), ("dpm_solver++", 50)],
             "threads": None},
}


def read_idx(path: Path) -> np.ndarray:
    """An IDX array (gzipped): magic 0x0000 0x08 <ndim>, big-endian uint32 dims, uint8 data."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError(f"{path} is not an unsigned-byte IDX file")
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims).copy()


def load_fmnist() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train images [60000, 28, 28, 1], labels, test images [10000, 28, 28, 1], labels)."""
    parts = [read_idx(FMNIST_DIR / f"{n}.gz") for n in (
        "train-images-idx3-ubyte", "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")]
    return (parts[0][..., None], parts[1].astype(np.int64), parts[2][..., None],
            parts[3].astype(np.int64))


def _read_corpus(root: Path) -> np.ndarray:
    """The PNGs that :func:`dpsynth_ml.sample` wrote under ``root/<class>/<i>.png``."""
    from PIL import Image

    images = []
    for path in sorted(root.rglob("*.png")):
        with Image.open(path) as im:
            a = np.asarray(im.convert("L"), dtype=np.uint8)
        images.append(a[..., None])
    return np.stack(images)


def _vae_roundtrip(model_dir: Path, images: np.ndarray) -> np.ndarray:
    """Real images encoded and decoded by the model's VAE (no diffusion): the best any
    sampler of this model could do, since every sample is decoded by the same VAE."""
    import torch
    from dpsynth_ml.models.architectures import encode_images
    from dpsynth_ml.models.model_io import load_model

    bundle, info = load_model(model_dir)
    latents = encode_images(bundle.vae, images, image_size=info.image_size,
                            channels=info.channels, scaling_factor=info.vae_scaling_factor)
    with torch.no_grad():
        decoded = bundle.vae.decode(latents / info.vae_scaling_factor).sample.clamp(-1.0, 1.0)
    pixels = ((decoded + 1.0) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1)
    return np.ascontiguousarray(pixels.numpy())


def run(scale: str) -> dict[str, Any]:
    """Pretrain, train the feature network, sample with every configuration; see above."""
    import torch
    from dpsynth_ml import PretrainTraining, sample
    from dpsynth_ml.evaluation import (
        extract_features,
        frechet_distance,
        load_feature_net,
        resize_uint8,
        train_feature_net,
    )

    from benchmarks.pretrain_cache import cached_pretrain

    cfg = SCALES[scale]
    if cfg["threads"]:
        torch.set_num_threads(int(cfg["threads"]))
    size = int(cfg["image_size"])
    x_train, y_train, x_test, y_test = load_fmnist()
    public = slice(0, int(cfg["public_records"]))
    x_pub = resize_uint8(x_train[public], image_size=size, channels=1)
    y_pub = y_train[public]
    n = int(cfg["samples_per_class"]) * len(FMNIST_CLASSES)
    # two disjoint, class-balanced held-out sets of n real images (the test set)
    rng = np.random.default_rng(0)
    order = np.concatenate([rng.permutation(np.flatnonzero(y_test == c))[:2 * n // 10]
                            for c in range(10)])
    held_a = resize_uint8(x_test[order[0::2]], image_size=size, channels=1)
    held_b = resize_uint8(x_test[order[1::2]], image_size=size, channels=1)
    phases: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="sampling-speed-") as tmp:
        work = Path(tmp)
        data = work / "public.npz"  # the same arrays give the same bytes: the cache's key
        np.savez(data, images=x_pub, labels=y_pub, class_names=np.array(FMNIST_CLASSES))
        t0 = time.perf_counter()
        spec = PretrainTraining(preset=cfg["preset"], image_size=size,
                                epochs=int(cfg["pretrain_epochs"]),
                                batch_size=int(cfg["pretrain_batch"]),
                                learning_rate=float(cfg["pretrain_lr"]), seed=0)
        # public data only: reused when trained before; the model directory is only read
        # (the VAE round trip and the samplers load it; samples go to their own folders)
        pretrained = cached_pretrain(spec, data, label=f"{NAME}:{scale}",
                                     scratch_dir=work / "pretrain")
        model = pretrained.result
        phases["pretrain_s"] = round(time.perf_counter() - t0, 1)  # a hit: the reuse only
        t0 = time.perf_counter()
        net_info = train_feature_net(x_pub, y_pub, class_names=FMNIST_CLASSES,
                                     image_size=size, channels=1,
                                     epochs=int(cfg["featnet_epochs"]), batch_size=128,
                                     learning_rate=1e-3, seed=0, out_dir=work / "featnet")
        net, net_info = load_feature_net(work / "featnet")
        phases["feature_net_s"] = round(time.perf_counter() - t0, 1)
        feats_a = extract_features(net, net_info, held_a)
        floor = frechet_distance(feats_a, extract_features(net, net_info, held_b))
        vae_floor = frechet_distance(feats_a, extract_features(
            net, net_info, _vae_roundtrip(model.model_dir, held_b)))
        rows = []
        for sampler, steps in cfg["configs"]:
            out = work / f"{sampler}-{steps}"
            t0 = time.perf_counter()
            result = sample(model.model_dir, samples_per_class=int(cfg["samples_per_class"]),
                            sampler=sampler, steps=steps, guidance_scale=1.0, seed=0,
                            out_dir=out)
            wall = time.perf_counter() - t0
            images = _read_corpus(out)
            fd = frechet_distance(feats_a, extract_features(net, net_info, images))
            rows.append({"sampler": sampler, "steps": steps, "images": len(images),
                         "images_per_s": result.images_per_second,
                         "wall_s": round(wall, 2), "fd_dpsynth": fd,
                         "fd_over_floor": fd / floor if floor > 0 else None})
            print(f"[{NAME}] {sampler:13s} {steps:5d} steps: {result.images_per_second:8.1f} "
                  f"img/s  fd_dpsynth {fd:.2f} (floor {floor:.2f})", flush=True)
    return {
        "settings": {k: cfg[k] for k in ("preset", "image_size", "public_records",
                                         "pretrain_epochs", "featnet_epochs",
                                         "samples_per_class", "threads")}
        | {"data": "Fashion-MNIST: model and feature net trained on the first "
                   f"{cfg['public_records']} training images (public split), quality against "
                   "the test set", "guidance_scale": 1.0, "seed": 0,
           "samples": n, "feature_network": net_info.architecture},
        "phases": phases,
        "pretrain_cache": pretrained.record(),
        "feature_net_accuracy": net_info.accuracy,
        "pretrain_steps": model.steps_completed,
        "fd_real_vs_real": floor,
        "fd_vae_roundtrip": vae_floor,
        "rows": rows,
    }


def table_markdown(results: dict[str, Any]) -> str:
    """The docs table: one row per (sampler, steps), with the real-vs-real floor."""
    res = results.get("results", results)
    machine = results.get("machine", {})
    s = res["settings"]
    cached = res.get("pretrain_cache", {})  # results before the cache: none
    hit = cached.get("cache") == "hit"
    reused = (f" (reused from the pretraining cache, `benchmarks/pretrain_cache.py`: trained "
              f"once in {cached['pretrain_s']:.0f} s, key `{cached['key'][:12]}…`)"
              if hit else "")
    lines = [
        f"Preset `{s['preset']}` at {s['image_size']}x{s['image_size']}, pretrained "
        f"{'' if hit else 'in the run '}on {s['public_records']:,} public Fashion-MNIST "
        f"images{reused}; {s['samples']} images per configuration; "
        f"{device_label(machine) if machine else 'CPU'}. `fd_dpsynth` is the "
        f"Fréchet distance in the dpsynth feature network's space (held-out accuracy "
        f"{fmt(res['feature_net_accuracy'])}), not Inception FID. **Real-vs-real floor at "
        f"the same size: {fmt(res['fd_real_vs_real'])}**; real images passed through the "
        f"model's VAE only (the best any sampler of this model can reach): "
        f"{fmt(res.get('fd_vae_roundtrip'))}.",
        "",
        "| sampler | steps | images/s | fd_dpsynth | fd / floor |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in res["rows"]:
        lines.append(f"| {r['sampler']} | {r['steps']} | {fmt(r['images_per_s'])} | "
                     f"{fmt(r['fd_dpsynth'])} | {fmt(r['fd_over_floor'], 2)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    bench_main(NAME, run)
