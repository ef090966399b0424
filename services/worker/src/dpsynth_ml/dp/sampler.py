"""Poisson subsampling, the sampling scheme DP-SGD accounting assumes (Abadi et al. 2016).

Each record joins a logical batch independently with probability exactly ``sample_rate``;
the realised batch size is Binomial(N, q), may be 0, and is never capped (a cap or shuffling
would break the subsampled-Gaussian analysis; see jax_privacy docs/batch_selection.md).
With ``public_size`` (N̂ >= N) a sampler draws N̂ uniforms every step and uses the first N,
so the draw's cost does not depend on the true count (the trainer pads the batch itself to a
fixed number of rows: ``dp.padding``).
:class:`SubjectPoissonSampler` is the same scheme over subjects (user-level DP-SGD).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


class PoissonSampler:
    """Draws Poisson-subsampled index sets with a caller-owned generator.

    Attributes:
        num_records: N, the number of records sampled from.
        sample_rate: q, exactly as accounted by the ledger.
        draws: number of batches drawn so far (one per logical step).
    """

    def __init__(self, num_records: int, sample_rate: float, generator: torch.Generator, *,
                 public_size: int | None = None) -> None:
        if num_records < 0:
            raise ValueError("num_records must be >= 0")
        if not 0.0 < sample_rate <= 1.0:
            raise ValueError("sample_rate must be in (0, 1]")
        self.num_records = num_records
        self.sample_rate = sample_rate
        self.draws = 0
        self._generator = generator
        self._uniforms = max(num_records, public_size or 0)

    def sample(self) -> torch.Tensor:
        """Return the indices (int64, ascending) of the next logical batch; may be empty."""
        # float64 uniforms: a float32 draw compared with q would round q to float32 and
        # realise an inclusion probability that differs from the accounted q.
        uniforms = torch.rand(self._uniforms, generator=self._generator,
                              dtype=torch.float64)[:self.num_records]
        mask = uniforms < self.sample_rate
        self.draws += 1
        return mask.nonzero(as_tuple=False).flatten().to(torch.long)


@dataclass(frozen=True)
class SubjectBatch:
    """One logical batch of user-level DP-SGD.

    Attributes:
        indices: image indices [n], grouped by subject (each subject's images contiguous).
        groups: [n] the ordinal (0..g-1) of each image's subject within this batch.
        counts: [g] how many images each sampled subject contributes (all >= 1).
        subjects: [g] the dense subject indices that were sampled and have images here.
    """

    indices: torch.Tensor
    groups: torch.Tensor
    counts: torch.Tensor
    subjects: torch.Tensor

    @property
    def num_subjects(self) -> int:
        return int(self.subjects.numel())


class SubjectPoissonSampler:
    """Poisson sampling over SUBJECTS (user-level DP-SGD), with a per-subject image cap.

    Each subject joins a logical batch independently with probability exactly
    ``sample_rate`` (q = expected_batch_size / N̂, N̂ counting subjects); the number of
    sampled subjects is Binomial(S, q), may be 0 and is never capped. Of each sampled
    subject, ``min(n_s, max_images_per_subject)`` of its n_s images are chosen uniformly
    without replacement (fresh each step); the engine averages their per-example gradients
    into the subject's ONE contribution, clipped once to C. The cap bounds compute and
    memory per subject; it does not change the sensitivity, which is C whatever n_s is.

    A subject without images here (e.g. a per-label run's subject whose images are all in
    other classes) may be drawn but never contributes: it is left out of the batch.

    Attributes:
        num_records: S, the number of subjects sampled from (dense indices 0..S-1).
        sample_rate: q, exactly as accounted by the ledger.
        max_images_per_subject: m, the per-subject image cap.
        draws: number of batches drawn so far (one per logical step).
    """

    def __init__(self, subjects: np.ndarray | torch.Tensor, num_subjects: int,
                 sample_rate: float, generator: torch.Generator, *,
                 max_images_per_subject: int, public_size: int | None = None) -> None:
        subjects = torch.as_tensor(np.asarray(subjects), dtype=torch.long).flatten()
        if num_subjects < 0 or (subjects.numel() and (
                int(subjects.min()) < 0 or int(subjects.max()) >= num_subjects)):
            raise ValueError("subjects must be dense indices in [0, num_subjects)")
        if not 0.0 < sample_rate <= 1.0:
            raise ValueError("sample_rate must be in (0, 1]")
        if max_images_per_subject < 1:
            raise ValueError("max_images_per_subject must be >= 1")
        self.num_records = num_subjects
        self.sample_rate = sample_rate
        self.max_images_per_subject = max_images_per_subject
        self.draws = 0
        self._generator = generator
        self._uniforms = max(num_subjects, public_size or 0)
        # CSR layout: the images of subject s are _order[_starts[s]:_starts[s] + _sizes[s]].
        self._order = torch.argsort(subjects, stable=True)
        self._sizes = torch.bincount(subjects, minlength=num_subjects)
        self._starts = torch.cumsum(self._sizes, 0) - self._sizes

    def sample(self) -> SubjectBatch:
        """Draw the next logical batch of subjects and their (capped) images."""
        uniforms = torch.rand(self._uniforms, generator=self._generator,
                              dtype=torch.float64)[:self.num_records]
        drawn = (uniforms < self.sample_rate).nonzero(as_tuple=False).flatten()
        self.draws += 1
        parts: list[torch.Tensor] = []
        kept: list[int] = []
        for s in drawn.tolist():
            n = int(self._sizes[s])
            if n == 0:
                continue  # no image of this subject here: it contributes nothing
            own = self._order[int(self._starts[s]):int(self._starts[s]) + n]
            if n > self.max_images_per_subject:
                pick = torch.randperm(n, generator=self._generator)[:self.max_images_per_subject]
                own = own[torch.sort(pick).values]
            parts.append(own)
            kept.append(s)
        if not parts:
            empty = torch.zeros(0, dtype=torch.long)
            return SubjectBatch(empty, empty, empty, empty)
        counts = torch.tensor([p.numel() for p in parts], dtype=torch.long)
        groups = torch.repeat_interleave(torch.arange(len(parts)), counts)
        return SubjectBatch(torch.cat(parts), groups, counts,
                            torch.tensor(kept, dtype=torch.long))
