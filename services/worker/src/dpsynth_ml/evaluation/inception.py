"""InceptionV3 of the FID variant, for Inception FID with the weights of pytorch-fid.

The FID of Heusel et al. (2017) is defined with the TensorFlow InceptionV3 graph of
2015-12-05; pytorch-fid (M. Seitzer) ported those weights to PyTorch as
``pt_inception-2015-12-05-6726825d.pth`` (95,628,359 bytes), a state dict of torchvision's
``Inception3(num_classes=1008, aux_logits=False)`` layout with the FID patches of the
TensorFlow graph. torchvision is not a dependency of the worker (PyPI's Linux wheels are
CUDA builds, whose C extension does not load with the CPU torch), so this module defines
the network itself, written for this project, with exactly the parameter names and shapes of that
state dict so that the file loads with ``torch.load(weights_only=True)`` and
``load_state_dict(strict=True)``.

Layout (parameter prefixes; every convolution is a ``BasicConv2d``: ``<name>.conv.weight``
without bias and ``<name>.bn.{weight,bias,running_mean,running_var,num_batches_tracked}``,
BatchNorm eps 1e-3, then ReLU)::

    Conv2d_1a_3x3 (3->32, 3x3, stride 2)   Conv2d_2a_3x3 (32->32, 3x3)
    Conv2d_2b_3x3 (32->64, 3x3, pad 1)     max-pool 3/2
    Conv2d_3b_1x1 (64->80, 1x1)            Conv2d_4a_3x3 (80->192, 3x3)    max-pool 3/2
    Mixed_5b/5c/5d  block A (in 192/256/288, pool features 32/64/64)  -> 256/288/288
    Mixed_6a        block B (288)                                     -> 768
    Mixed_6b/6c/6d/6e block C (768, 7x7 channels 128/160/160/192)      -> 768
    Mixed_7a        block D (768)                                     -> 1280
    Mixed_7b/7c     block E (1280 / 2048)                             -> 2048
    global average pool -> the 2048-d pool features;  fc (2048 -> 1008), loaded, unused

FID patches (as in the TensorFlow graph): the average-pool branches of blocks A, C and of
Mixed_7b exclude the zero padding from their averages; Mixed_7c max-pools (3x3, stride 1)
in its pool branch.

Inputs as pytorch-fid: RGB in [0, 1] (grayscale repeated), bilinearly resized to 299x299
(``align_corners=False``, no antialiasing), scaled to [-1, 1].

Checked (tests/unit/ml/evaluation/test_inception_reference.py, against pytorch-fid 0.3.0
and torchvision 0.28.0 run in a separate process): with one random state dict loaded into
both, pytorch-fid's network takes it with ``strict=True``, has the same names in the same
order with the same shapes, and its whole pipeline (PNG folders, its resize and scaling,
its ``calculate_frechet_distance``) gives the same pool features (to float32 rounding) and
the same FID as :func:`inception_features` and ``frechet_distance``. NOT checked: the real
weights file and pytorch-fid's reference values with it (the file cannot be fetched where
the tests run); :func:`load_inception` refuses any file whose sha256 is not the pinned one.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dpsynth_ml.evaluation.errors import InceptionWeightsUnavailable
from dpsynth_ml.evaluation.featnet import file_sha256
from dpsynth_ml.spec import InvalidSpecError

#: sha256 of pytorch-fid's ``pt_inception-2015-12-05-6726825d.pth`` (its name carries the
#: first 8 hex digits, torch.hub's convention); released at
#: https://github.com/mseitzer/pytorch-fid/releases/download/fid_weights/pt_inception-2015-12-05-6726825d.pth
INCEPTION_SHA256 = "6726825d0af5f729cebd5821db510b11b1cfad8faad88a03f1befd49fb9129b2"
INCEPTION_FILE = "pt_inception-2015-12-05-6726825d.pth"
INCEPTION_SIZE = 299
POOL_DIM = 2048

_Pair = int | tuple[int, int]


class BasicConv2d(nn.Module):
    """Convolution without bias, BatchNorm (eps 1e-3), ReLU."""

    def __init__(self, c_in: int, c_out: int, kernel: _Pair, stride: int = 1,
                 padding: _Pair = 0) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=padding, bias=False)
        self.bn = nn.BatchNorm2d(c_out, eps=0.001)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))


# A branch is a chain of convolution names; a pair as its last element means the chain forks
# into two convolutions whose outputs are concatenated (blocks E).
_Branch = Sequence[str | tuple[str, str]]


class _MixedBlock(nn.Module):
    """An Inception block given as a table of convolutions and the chains that use them.

    Outputs are the branches' outputs in order, then the pool branch, concatenated along
    channels (the order of torchvision's and pytorch-fid's blocks).
    """

    def __init__(self, convs: dict[str, tuple[int, int, _Pair, int, _Pair]],
                 branches: Sequence[_Branch], pool: str, pool_conv: str | None) -> None:
        super().__init__()
        for name, (c_in, c_out, kernel, stride, padding) in convs.items():
            self.add_module(name, BasicConv2d(c_in, c_out, kernel, stride, padding))
        self._branches = [list(b) for b in branches]
        self._pool, self._pool_conv = pool, pool_conv

    def _pool_branch(self, x: torch.Tensor) -> torch.Tensor:
        if self._pool == "avg_exclusive":  # TF: padded zeros do not count in the average
            y = F.avg_pool2d(x, kernel_size=3, stride=1, padding=1, count_include_pad=False)
        elif self._pool == "max_same":
            y = F.max_pool2d(x, kernel_size=3, stride=1, padding=1)
        else:  # "max_reduce": the grid-reduction blocks B and D
            y = F.max_pool2d(x, kernel_size=3, stride=2)
        return self.get_submodule(self._pool_conv)(y) if self._pool_conv else y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outputs = []
        for chain in self._branches:
            y = x
            for step in chain:
                if isinstance(step, tuple):
                    y = torch.cat([self.get_submodule(s)(y) for s in step], dim=1)
                else:
                    y = self.get_submodule(step)(y)
            outputs.append(y)
        outputs.append(self._pool_branch(x))
        return torch.cat(outputs, dim=1)


def _block_a(c_in: int, pool_features: int) -> _MixedBlock:
    return _MixedBlock(
        {"branch1x1": (c_in, 64, 1, 1, 0),
         "branch5x5_1": (c_in, 48, 1, 1, 0), "branch5x5_2": (48, 64, 5, 1, 2),
         "branch3x3dbl_1": (c_in, 64, 1, 1, 0), "branch3x3dbl_2": (64, 96, 3, 1, 1),
         "branch3x3dbl_3": (96, 96, 3, 1, 1),
         "branch_pool": (c_in, pool_features, 1, 1, 0)},
        [["branch1x1"], ["branch5x5_1", "branch5x5_2"],
         ["branch3x3dbl_1", "branch3x3dbl_2", "branch3x3dbl_3"]],
        "avg_exclusive", "branch_pool")


def _block_b(c_in: int) -> _MixedBlock:
    return _MixedBlock(
        {"branch3x3": (c_in, 384, 3, 2, 0),
         "branch3x3dbl_1": (c_in, 64, 1, 1, 0), "branch3x3dbl_2": (64, 96, 3, 1, 1),
         "branch3x3dbl_3": (96, 96, 3, 2, 0)},
        [["branch3x3"], ["branch3x3dbl_1", "branch3x3dbl_2", "branch3x3dbl_3"]],
        "max_reduce", None)


def _block_c(c_in: int, c7: int) -> _MixedBlock:
    row, col = ((1, 7), (0, 3)), ((7, 1), (3, 0))  # (kernel, padding) of the factorised 7x7
    return _MixedBlock(
        {"branch1x1": (c_in, 192, 1, 1, 0),
         "branch7x7_1": (c_in, c7, 1, 1, 0), "branch7x7_2": (c7, c7, row[0], 1, row[1]),
         "branch7x7_3": (c7, 192, col[0], 1, col[1]),
         "branch7x7dbl_1": (c_in, c7, 1, 1, 0),
         "branch7x7dbl_2": (c7, c7, col[0], 1, col[1]),
         "branch7x7dbl_3": (c7, c7, row[0], 1, row[1]),
         "branch7x7dbl_4": (c7, c7, col[0], 1, col[1]),
         "branch7x7dbl_5": (c7, 192, row[0], 1, row[1]),
         "branch_pool": (c_in, 192, 1, 1, 0)},
        [["branch1x1"], ["branch7x7_1", "branch7x7_2", "branch7x7_3"],
         ["branch7x7dbl_1", "branch7x7dbl_2", "branch7x7dbl_3", "branch7x7dbl_4",
          "branch7x7dbl_5"]],
        "avg_exclusive", "branch_pool")


def _block_d(c_in: int) -> _MixedBlock:
    return _MixedBlock(
        {"branch3x3_1": (c_in, 192, 1, 1, 0), "branch3x3_2": (192, 320, 3, 2, 0),
         "branch7x7x3_1": (c_in, 192, 1, 1, 0), "branch7x7x3_2": (192, 192, (1, 7), 1, (0, 3)),
         "branch7x7x3_3": (192, 192, (7, 1), 1, (3, 0)), "branch7x7x3_4": (192, 192, 3, 2, 0)},
        [["branch3x3_1", "branch3x3_2"],
         ["branch7x7x3_1", "branch7x7x3_2", "branch7x7x3_3", "branch7x7x3_4"]],
        "max_reduce", None)


def _block_e(c_in: int, pool: str) -> _MixedBlock:
    return _MixedBlock(
        {"branch1x1": (c_in, 320, 1, 1, 0),
         "branch3x3_1": (c_in, 384, 1, 1, 0), "branch3x3_2a": (384, 384, (1, 3), 1, (0, 1)),
         "branch3x3_2b": (384, 384, (3, 1), 1, (1, 0)),
         "branch3x3dbl_1": (c_in, 448, 1, 1, 0), "branch3x3dbl_2": (448, 384, 3, 1, 1),
         "branch3x3dbl_3a": (384, 384, (1, 3), 1, (0, 1)),
         "branch3x3dbl_3b": (384, 384, (3, 1), 1, (1, 0)),
         "branch_pool": (c_in, 192, 1, 1, 0)},
        [["branch1x1"], ["branch3x3_1", ("branch3x3_2a", "branch3x3_2b")],
         ["branch3x3dbl_1", "branch3x3dbl_2", ("branch3x3dbl_3a", "branch3x3dbl_3b")]],
        pool, "branch_pool")


class FIDInceptionV3(nn.Module):
    """The FID InceptionV3 (see the module docstring for the layout)."""

    def __init__(self) -> None:
        super().__init__()
        self.Conv2d_1a_3x3 = BasicConv2d(3, 32, 3, stride=2)
        self.Conv2d_2a_3x3 = BasicConv2d(32, 32, 3)
        self.Conv2d_2b_3x3 = BasicConv2d(32, 64, 3, padding=1)
        self.Conv2d_3b_1x1 = BasicConv2d(64, 80, 1)
        self.Conv2d_4a_3x3 = BasicConv2d(80, 192, 3)
        self.Mixed_5b = _block_a(192, 32)
        self.Mixed_5c = _block_a(256, 64)
        self.Mixed_5d = _block_a(288, 64)
        self.Mixed_6a = _block_b(288)
        self.Mixed_6b = _block_c(768, 128)
        self.Mixed_6c = _block_c(768, 160)
        self.Mixed_6d = _block_c(768, 160)
        self.Mixed_6e = _block_c(768, 192)
        self.Mixed_7a = _block_d(768)
        self.Mixed_7b = _block_e(1280, "avg_exclusive")
        self.Mixed_7c = _block_e(2048, "max_same")
        self.fc = nn.Linear(POOL_DIM, 1008)  # the 1008 TF classes; part of the file

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """RGB [N, 3, H, W] in [0, 1] -> [N, 2048] pool features (pytorch-fid's block 3)."""
        x = F.interpolate(x, size=(INCEPTION_SIZE, INCEPTION_SIZE), mode="bilinear",
                          align_corners=False)
        x = 2.0 * x - 1.0
        x = self.Conv2d_2b_3x3(self.Conv2d_2a_3x3(self.Conv2d_1a_3x3(x)))
        x = F.max_pool2d(x, kernel_size=3, stride=2)
        x = self.Conv2d_4a_3x3(self.Conv2d_3b_1x1(x))
        x = F.max_pool2d(x, kernel_size=3, stride=2)
        for block in (self.Mixed_5b, self.Mixed_5c, self.Mixed_5d, self.Mixed_6a,
                      self.Mixed_6b, self.Mixed_6c, self.Mixed_6d, self.Mixed_6e,
                      self.Mixed_7a, self.Mixed_7b, self.Mixed_7c):
            x = block(x)
        return x.mean(dim=(2, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)




def load_inception(path: Path, *, sha256: str = INCEPTION_SHA256) -> FIDInceptionV3:
    """Load pytorch-fid's weights file after checking its sha256 against the pinned value.

    Args:
        path: the weights file (``pt_inception-2015-12-05-6726825d.pth``).
        sha256: the expected digest; only tests pass another (for a file they wrote).

    Returns:
        The network in eval mode, without gradients.

    Raises:
        InceptionWeightsUnavailable: missing file, another file (sha256 mismatch) or a state
            dict that does not fit the definition.
    """
    path = Path(path)
    if not path.is_file():
        raise InceptionWeightsUnavailable(f"InceptionV3 weights file not found: {path}")
    if file_sha256(path) != sha256:
        raise InceptionWeightsUnavailable(
            f"{path.name} is not pytorch-fid's {INCEPTION_FILE} (sha256 mismatch)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        model = FIDInceptionV3()
        model.load_state_dict(state, strict=True)
    except Exception as exc:  # unpickling or shape errors: the file is unusable either way
        raise InceptionWeightsUnavailable(f"cannot load {path.name}: {exc}") from exc
    model.eval().requires_grad_(False)
    return model


def inception_features(model: FIDInceptionV3, images: np.ndarray, *,
                       batch_size: int = 50) -> np.ndarray:
    """2048-d pool features (float64 [N, 2048]) of uint8 [N, H, W, C] images, prepared as
    pytorch-fid prepares PNG files: RGB (gray repeated) in [0, 1], resized to 299 inside."""
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] not in (1, 3):
        raise InvalidSpecError("images must be uint8 [N, H, W, C] with C in (1, 3)")
    device = next(model.parameters()).device
    out: list[np.ndarray] = []
    model.eval()
    with torch.no_grad():
        for start in range(0, len(images), batch_size):
            x = torch.from_numpy(np.ascontiguousarray(images[start:start + batch_size]))
            x = x.permute(0, 3, 1, 2).float().div(255.0)
            if x.shape[1] == 1:
                x = x.repeat(1, 3, 1, 1)
            out.append(model.features(x.to(device)).double().cpu().numpy())
    return np.concatenate(out) if out else np.zeros((0, POOL_DIM))
