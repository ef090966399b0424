"""Poisson subsampling, the sampling scheme DP-SGD accounting assumes (Abadi et al. 2016).

Each record joins a logical batch independently with probability exactly ``sample_rate``;
the realised batch size is Binomial(N, q), may be 0, and is never capped (a cap or shuffling
would break the subsampled-Gaussian analysis; see jax_privacy docs/batch_selection.md).
"""

from __future__ import annotations

import torch


class PoissonSampler:
    """Draws Poisson-subsampled index sets with a caller-owned generator.

    Attributes:
        num_records: N, the number of records sampled from.
        sample_rate: q, exactly as accounted by the ledger.
        draws: number of batches drawn so far (one per logical step).
    """

    def __init__(self, num_records: int, sample_rate: float, generator: torch.Generator) -> None:
        if num_records < 0:
            raise ValueError("num_records must be >= 0")
        if not 0.0 < sample_rate <= 1.0:
            raise ValueError("sample_rate must be in (0, 1]")
        self.num_records = num_records
        self.sample_rate = sample_rate
        self.draws = 0
        self._generator = generator

    def sample(self) -> torch.Tensor:
        """Return the indices (int64, ascending) of the next logical batch; may be empty."""
        # float64 uniforms: a float32 draw compared with q would round q to float32 and
        # realise an inclusion probability that differs from the accounted q.
        uniforms = torch.rand(self.num_records, generator=self._generator, dtype=torch.float64)
        mask = uniforms < self.sample_rate
        self.draws += 1
        return mask.nonzero(as_tuple=False).flatten().to(torch.long)
