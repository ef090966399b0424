"""Gaussian noise for the platform's one-shot releases, from the OS CSPRNG (issue 13, item 7).

DP-SGD's noise comes from ``dpsynth_ml.dp.noise`` (a ChaCha20 keystream on the parameters'
device under a fresh OS key). The one-shot Gaussian releases — the DP count of a dataset's
size and the class-size histogram (api), the DP evaluations' accuracies (worker) — draw a
handful of values and must not import torch (the api never does), so they use the same
construction with the operating system's CSPRNG (:mod:`secrets`) as the bit source:

* each uniform takes 53 fresh random bits ``k`` and is ``(k + 1) · 2^-53`` in (0, 1] (never 0);
* Box–Muller in float64 turns pairs of uniforms into pairs of standard Gaussians;
* each released value is the sum of four such Gaussians times ``σ / 2`` (opacus' secure-mode
  mitigation against floating-point attacks, Holohan & Braghin 2021), which is N(0, σ²).

No generator state exists to be seeded, restored or replayed: every value is fresh OS
entropy. Tests inject a seeded ``numpy.random.Generator`` through the functions' ``rng``
parameter instead, a path no spec, API or setting reaches.
"""

from __future__ import annotations

import math
import secrets

import numpy as np

_BITS = 53
_SCALE = 2.0 ** -_BITS
_SUMMANDS = 4
"""Gaussians summed per released value (opacus 1.6 ``_generate_noise``: 2n draws, n = 2)."""


def _uniform() -> float:
    """A uniform in (0, 1] from 53 OS-random bits (never 0, so ``log`` is finite)."""
    return (secrets.randbits(_BITS) + 1) * _SCALE


def _standard_pair() -> tuple[float, float]:
    """Two independent N(0, 1) values by Box–Muller, in float64."""
    radius = math.sqrt(-2.0 * math.log(_uniform()))
    angle = 2.0 * math.pi * _uniform()
    return radius * math.cos(angle), radius * math.sin(angle)


class SecureNormal:
    """N(loc, scale²) draws from the OS CSPRNG, with the sum-of-four mitigation.

    It has the shape of ``numpy.random.Generator.normal`` so a test can pass a seeded numpy
    generator wherever production code uses this class.
    """

    def normal(self, loc: float = 0.0, scale: float = 1.0,
               size: int | None = None) -> np.ndarray:
        """``size`` values (a 0-d array for ``None``) of N(loc, scale²), float64.

        Raises:
            ValueError: a negative ``scale`` or ``size``.
        """
        if scale < 0:
            raise ValueError("scale must be >= 0")
        count = 1 if size is None else int(size)
        if count < 0:
            raise ValueError("size must be >= 0")
        out = np.empty(count, dtype=np.float64)
        for i in range(count):
            total = 0.0
            for _ in range(_SUMMANDS // 2):
                a, b = _standard_pair()
                total += a + b
            out[i] = loc + scale * total / math.sqrt(_SUMMANDS)
        return out.reshape(()) if size is None else out


NormalSource = np.random.Generator | SecureNormal
"""Where a release's Gaussian noise comes from: :class:`SecureNormal` in production, a seeded
numpy generator in tests."""
