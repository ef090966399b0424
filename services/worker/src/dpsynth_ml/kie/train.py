"""DP-Adam for LayoutLMv3 KIE with the DOCUMENT (or its owner) as the privacy unit.

Each logical step:

1. :class:`~dpsynth_ml.dp.SubjectPoissonSampler` draws each unit (document, or declared owner)
   independently with probability exactly q; all its chunks come with it (up to an optional
   cap, chosen uniformly; by default every chunk).
2. The chunks run in micro-batches of at most ``max_physical_batch_size`` sequences; a unit
   cut by a micro-batch boundary carries its partial contribution to the next one.
3. :meth:`~dpsynth_ml.dp.DpSgdEngine.accumulate_subject_draws` folds the per-chunk gradients
   into ONE contribution per unit and clips it once to C.
4. :meth:`~dpsynth_ml.dp.DpSgdEngine.privatize` adds N(0, sigma^2 C^2 I) once and divides by
   the expected number of units; torch Adam applies the result (DP-Adam).

Weights (sum vs mean): a chunk's loss is the SUM of its labelled tokens' cross-entropies and
its weight is 1 / (labelled tokens of its unit in this batch), so a unit's contribution is the
gradient of its mean token loss: the same whatever the chunking, and a long document counts
as one document, not as k. The bound is C per unit either way (the weights only scale a unit's
own rows before its one clip); the weights depend on the unit's own data only.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from dpsynth_ml.dp import DpSgdEngine, SubjectBatch, SubjectPoissonSampler
from dpsynth_ml.dp.noise import NoiseSource
from dpsynth_ml.errors import InvalidSpecError
from dpsynth_ml.kie.model import KieModel, save_kie_model, special_ids
from dpsynth_ml.kie.tokenize import IGNORE, EncodedChunks
from dpsynth_ml.training.hooks import NullHooks, TrainingHooks


@dataclass(frozen=True)
class KieDpSettings:
    """DP-Adam settings of a KIE run (q, B and sigma come from the ledger's plan).

    Attributes:
        steps: logical steps T.
        sample_rate: q = expected_batch_size / N̂, N̂ counting units (documents/owners).
        expected_batch_size: the public normaliser of each update (units per step).
        noise_multiplier: sigma.
        max_grad_norm: C, per unit.
        learning_rate, betas, eps: torch Adam's.
        max_physical_batch_size: sequences per micro-batch (memory only).
        max_chunks_per_unit: cap on a sampled unit's chunks (compute only; None = all).
        public_size: N̂ >= N, so the draw's cost does not depend on N.
        lease_size: steps asked of ``hooks.acquire_steps`` at a time.
    """

    steps: int
    sample_rate: float
    expected_batch_size: int
    noise_multiplier: float
    max_grad_norm: float
    learning_rate: float = 5e-4
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    max_physical_batch_size: int = 16
    max_chunks_per_unit: int | None = None
    public_size: int | None = None
    lease_size: int = 10

    def __post_init__(self) -> None:
        if self.steps < 0 or self.expected_batch_size < 1 or self.lease_size < 1 \
                or self.max_physical_batch_size < 1:
            raise ValueError("steps >= 0; expected_batch_size, lease_size and "
                             "max_physical_batch_size >= 1")
        if not 0.0 < self.sample_rate <= 1.0:
            raise ValueError("sample_rate must be in (0, 1]")
        for name in ("noise_multiplier", "max_grad_norm", "learning_rate"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be finite and > 0")
        if self.max_chunks_per_unit is not None and self.max_chunks_per_unit < 1:
            raise ValueError("max_chunks_per_unit must be >= 1")


@dataclass(frozen=True)
class KieTrainResult:
    """What a run did: steps taken, whether it stopped early, the frozen parameters and
    where the model was saved (None when not asked)."""

    steps: int
    stopped: bool
    frozen: tuple[str, ...]
    output_dir: Path | None


def make_sampler(chunks: EncodedChunks, settings: KieDpSettings,
                 generator: torch.Generator) -> SubjectPoissonSampler:
    """Poisson over units at rate q: a unit's chunks are sampled together."""
    cap = settings.max_chunks_per_unit or max(1, int(chunks.chunks_per_subject().max()))
    return SubjectPoissonSampler(chunks.subject, chunks.num_subjects, settings.sample_rate,
                                 generator, max_images_per_subject=cap,
                                 public_size=settings.public_size)


def make_engine(kie: KieModel, settings: KieDpSettings, *,
                _test_noise: NoiseSource | None = None) -> DpSgdEngine:
    """DP-Adam: torch Adam over the trainable parameters inside a :class:`DpSgdEngine`.

    ``_test_noise`` is TESTS ONLY (see :class:`DpSgdEngine`)."""
    params = [p for p in kie.model.parameters() if p.requires_grad]
    adam = torch.optim.Adam(params, lr=settings.learning_rate, betas=settings.betas,
                            eps=settings.eps)
    return DpSgdEngine(kie.model, adam, noise_multiplier=settings.noise_multiplier,
                       max_grad_norm=settings.max_grad_norm,
                       expected_batch_size=settings.expected_batch_size,
                       _test_noise=_test_noise)


def accumulate_units(engine: DpSgdEngine, chunks: EncodedChunks, batch: SubjectBatch,
                     max_physical_batch_size: int) -> dict[str, float]:
    """Clip each sampled unit's contribution once and add it to the engine's sum (nothing
    is noised or applied). Returns owner-only, non-DP statistics."""
    indices, groups = batch.indices, batch.groups
    n, units = int(indices.numel()), batch.num_subjects
    if n == 0:
        return {"batch_size": 0.0, "chunks": 0.0, "fraction_clipped": 0.0}
    device = next(iter(engine.params)).device
    labels = chunks.labels[indices]
    tokens = (labels != IGNORE).sum(1).to(torch.float64)
    unit_tokens = torch.zeros(units, dtype=torch.float64).index_add_(0, groups, tokens)
    weights = 1.0 / unit_tokens.clamp_min(1.0)[groups]
    loss_sum, clipped = 0.0, 0
    for start in range(0, n, max_physical_batch_size):
        end = min(start + max_physical_batch_size, n)
        sel = indices[start:end]
        ids, bbox = chunks.input_ids[sel].to(device), chunks.bbox[sel].to(device)
        mask, target = chunks.attention_mask[sel].to(device), labels[start:end].to(device)

        def draw(ids: torch.Tensor = ids, bbox: torch.Tensor = bbox, mask: torch.Tensor = mask,
                 target: torch.Tensor = target) -> torch.Tensor:
            logits = engine.module(input_ids=ids, bbox=bbox, attention_mask=mask).logits
            per_token = F.cross_entropy(logits.float().transpose(1, 2), target,
                                        ignore_index=IGNORE, reduction="none")
            return per_token.sum(1)

        carry_in = start > 0 and bool(groups[start] == groups[start - 1])
        carry_out = end < n and bool(groups[end] == groups[end - 1])
        part, losses = engine.accumulate_subject_draws(
            draw, 1, groups[start:end] - groups[start], weights[start:end],
            carry_in=carry_in, carry_out=carry_out)
        clipped += part
        loss_sum += float((losses.cpu().double() * weights[start:end]).sum())
    return {"batch_size": float(units), "chunks": float(n), "loss": loss_sum / units,
            "fraction_clipped": clipped / units}


def train_kie_dp(kie: KieModel, chunks: EncodedChunks, settings: KieDpSettings,
                 hooks: TrainingHooks | None = None, *, generator: torch.Generator,
                 output_dir: str | Path | None = None,
                 _test_noise: NoiseSource | None = None) -> KieTrainResult:
    """Train ``kie`` with DP-Adam over units (module docstring); save it to ``output_dir``.

    Steps are leased ``lease_size`` at a time through ``hooks.acquire_steps`` before they
    run (the budget is charged there); ``should_stop`` is checked before every step and
    ``on_progress`` reports each one. The statistics passed to ``on_private_stats`` are
    owner-only and never logged here. ``generator`` drives the Poisson sampling (not the
    noise, which is ChaCha20 keyed from the OS). ``_test_noise``: TESTS ONLY.
    """
    hooks = hooks or NullHooks()
    pad, _, _ = special_ids(kie.config)
    if int(chunks.input_ids.shape[1]) + pad + 1 > kie.config.max_position_embeddings:
        raise InvalidSpecError("max_seq_len + pad_token_id + 1 must be <= the model's "
                               "max_position_embeddings")
    kie.model.train()
    sampler = make_sampler(chunks, settings, generator)
    engine = make_engine(kie, settings, _test_noise=_test_noise)
    step, stopped = 0, False
    try:
        while step < settings.steps and not stopped:
            if hooks.should_stop():
                stopped = True
                break
            wanted = min(settings.lease_size, settings.steps - step)
            granted = max(0, min(int(hooks.acquire_steps(step, wanted)), wanted))
            if granted == 0:
                stopped = True
                break
            for i in range(granted):
                if i > 0 and hooks.should_stop():
                    stopped = True
                    break
                stats = accumulate_units(engine, chunks, sampler.sample(),
                                         settings.max_physical_batch_size)
                engine.privatize()
                engine.apply_update()
                hooks.on_private_stats(stats)
                step += 1
                hooks.on_progress(step, settings.steps)
    finally:
        engine.close()
    saved = None
    if output_dir is not None:
        saved = save_kie_model(kie, output_dir, {
            "max_seq_len": int(chunks.input_ids.shape[1]), "steps": step,
            "stopped_early": stopped, "privacy_unit": "document_or_owner",
            "dp": {**asdict(settings), "optimizer": "adam", "clipping": "per unit, once"}})
    return KieTrainResult(step, stopped, kie.frozen, saved)
