"""The project's FIDInceptionV3 against pytorch-fid's own code under identical weights.

One seeded random state dict is loaded into both networks: pytorch-fid 0.3.0's
``fid_inception_v3`` (torchvision 0.28.0's Inception3 with pytorch-fid's FID blocks, loaded
with ``strict=True``) and ours. On a known pair of image folders (8 smooth random PNGs of
64x64, 4 RGB and 4 grayscale, resized to 299x299 by the networks, and 8 RGB of 299x299)
pytorch-fid's whole pipeline (``calculate_fid_given_paths``: PIL ``convert('RGB')``,
``ToTensor``, its resize and scaling, its ``calculate_frechet_distance``) must give the pool
features and the FID that ``inception_features`` and ``frechet_distance`` give on the same
files.

What this does not check: the real weights file (``pt_inception-2015-12-05-6726825d.pth``
cannot be fetched here; load_inception pins its sha256), so pytorch-fid's published values
on real data are not reproduced. Random weights exercise every convolution, BatchNorm
(eps, running statistics), pooling (including count_include_pad and the max-pool of
Mixed_7c) and the channel order of every concatenation, which is what the definitions could
get wrong; the weights file itself fits only one layout, which this test pins.

Needs torchvision 0.28.0 and pytorch-fid 0.3.0 installed with ``--no-deps --target`` into
``<venv>/pytorch-fid-ref`` (or the folder named by DPSYNTH_PYTORCH_FID_REF); skipped when
they are absent. They run in a subprocess: see pytorch_fid_reference.py for why.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from dpsynth_ml.evaluation.inception import FIDInceptionV3, inception_features
from dpsynth_ml.evaluation.metrics import frechet_distance
from PIL import Image

pytestmark = pytest.mark.unit

REFERENCE_DIR = Path(os.environ.get("DPSYNTH_PYTORCH_FID_REF",
                                    Path(sys.prefix) / "pytorch-fid-ref"))
SCRIPT = Path(__file__).with_name("pytorch_fid_reference.py")


def _reference_installed() -> bool:
    return ((REFERENCE_DIR / "pytorch_fid" / "inception.py").is_file()
            and (REFERENCE_DIR / "torchvision" / "models" / "inception.py").is_file())


requires_reference = pytest.mark.skipif(
    not _reference_installed(),
    reason=f"pytorch-fid 0.3.0 and torchvision 0.28.0 are not installed in {REFERENCE_DIR} "
           "(pip install --no-deps --target <that folder> torchvision==0.28.0 "
           "pytorch-fid==0.3.0; the Makefile's venv step does it)")


def _random_state_dict(seed: int) -> dict[str, torch.Tensor]:
    """Weights that keep activations of order 1 through all 94 convolutions, so that every
    layer matters to the features: He-normal convolutions and BatchNorm statistics and
    affine parameters away from the identity (a definition that ignored any of them, or
    used another eps, would give other features)."""
    g = torch.Generator().manual_seed(seed)
    state = FIDInceptionV3().state_dict()
    for key, value in state.items():
        if key.endswith("conv.weight"):
            fan_in = value[0].numel()
            new = torch.randn(value.shape, generator=g) * (2.0 / fan_in) ** 0.5
        elif key.endswith("bn.weight"):
            new = 0.5 + torch.rand(value.shape, generator=g)
        elif key.endswith(("bn.bias", "bn.running_mean")):
            new = 0.2 * torch.randn(value.shape, generator=g)
        elif key.endswith("bn.running_var"):
            new = 0.5 + torch.rand(value.shape, generator=g)
        elif key.endswith("num_batches_tracked"):
            new = torch.tensor(1000, dtype=value.dtype)
        else:  # fc: loaded by both, unused by the pool features
            new = 0.01 * torch.randn(value.shape, generator=g)
        state[key] = new.to(value.dtype)
    return state


def _smooth_images(rng: np.random.Generator, n: int, size: int, offset: float) -> np.ndarray:
    """uint8 [n, size, size, 3]: random 6x6 colour grids upsampled bicubically, so that the
    images differ in content (white noise would average out to nearly equal features)."""
    out = np.empty((n, size, size, 3), np.uint8)
    for i in range(n):
        grid = np.clip(rng.normal(127.0 + offset, 60.0, (6, 6, 3)), 0, 255).astype(np.uint8)
        out[i] = np.asarray(Image.fromarray(grid).resize((size, size), Image.BICUBIC))
    return out


def _write_folder(folder: Path, images: Sequence[np.ndarray] | np.ndarray) -> None:
    folder.mkdir()
    for i, image in enumerate(images):
        Image.fromarray(image.squeeze(-1) if image.shape[-1] == 1 else image).save(
            folder / f"{i:02d}.png")


def _read_folder(folder: Path) -> list[np.ndarray]:
    """uint8 [H, W, C] per file in pytorch-fid's order, C = 1 for grayscale files."""
    return [np.atleast_3d(np.asarray(Image.open(p))) for p in sorted(folder.glob("*.png"))]


@requires_reference
def test_same_layout_features_and_fid_as_pytorch_fid(tmp_path: Path) -> None:
    state = _random_state_dict(seed=5)
    torch.save(state, tmp_path / "state.pt")
    rng = np.random.default_rng(5)
    small = _smooth_images(rng, 8, 64, offset=0.0)
    # half of the small set grayscale: pytorch-fid's PIL convert('RGB') repeats the channel,
    # inception_features repeats it itself
    gray = [np.asarray(Image.fromarray(im).convert("L"))[..., None] for im in small[4:]]
    large = _smooth_images(rng, 8, 299, offset=25.0)
    _write_folder(tmp_path / "a", [*small[:4], *gray])
    _write_folder(tmp_path / "b", large)

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REFERENCE_DIR), *filter(None, [os.environ.get("PYTHONPATH")])])}
    run = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "state.pt"), str(tmp_path / "a"),
         str(tmp_path / "b"), str(tmp_path / "ref.npz")],
        env=env, capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-4000:]
    ref = np.load(tmp_path / "ref.npz")

    # Layout: pytorch-fid's network (which took `state` with strict=True) and ours have the
    # same state-dict names, in the same order, with the same shapes.
    ours = FIDInceptionV3()
    ours.load_state_dict(state, strict=True)
    ours.eval()
    assert list(ref["keys"]) == list(ours.state_dict())
    assert list(ref["shapes"]) == [str(tuple(v.shape)) for v in ours.state_dict().values()]

    # Features: the same files (PNG, lossless) through our pipeline, the grayscale ones as
    # 1-channel arrays.
    files_a = _read_folder(tmp_path / "a")
    assert [f.shape[-1] for f in files_a] == [3] * 4 + [1] * 4
    feats_a = np.concatenate([inception_features(ours, np.stack(files_a[:4])),
                              inception_features(ours, np.stack(files_a[4:]))])
    feats_b = inception_features(ours, np.stack(_read_folder(tmp_path / "b")))
    for mine, theirs in ((feats_a, ref["features_a"]), (feats_b, ref["features_b"])):
        assert theirs.shape == mine.shape == (8, 2048)
        # features of order 1 that differ between images: the comparison is not vacuous
        assert 0.1 < float(np.abs(theirs).mean()) < 100.0
        assert float(theirs.std(axis=0).mean()) > 0.01 * float(np.abs(theirs).mean())
        # the same float32 operations: equal up to rounding (measured: 2e-5 at most, where
        # a BatchNorm eps of 1e-5 instead of 1e-3 moves features by 0.4 and the average
        # pool of Mixed_7c instead of its max pool by 8)
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-4)

    # FID: pytorch-fid's (scipy sqrtm of the covariance product, on its features) and ours
    # (eigendecompositions, on our features). With 8 images per set the covariances have
    # rank 7, where sqrtm is least accurate (measured: 1e-7 relative), hence rel=1e-4.
    fid_ref = float(ref["fid"])
    assert fid_ref > 1.0
    assert frechet_distance(feats_a, feats_b) == pytest.approx(fid_ref, rel=1e-4)
