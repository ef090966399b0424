"""A white-box audit of a ``dp_train`` job's DP-SGD, through its own code (issue 20: every
new DP mechanism is audited at birth; issue 19's one-run method).

:func:`audit_dp_train` builds the run exactly as :func:`dpsynth_ml.dp_train.dp_train_classifier`
does (``dp_train.run._prepare``: the classifier, its optimiser, the sampler over images or
subjects, the fixed padded rows, the engine with the ledger's sigma, C and B) on a PUBLIC
stand-in dataset sized like the private one, and runs its steps: each step's stand-in
batch is the job's own first half (``dp_train.run.accumulate_step``), then the gradient
canaries of :mod:`dpsynth_ml.audit.whitebox` join the same sum through opacus' clipping,
the engine noises it once, the auditor reads it, and the job's optimiser applies it.

The classifier trained here is never saved or returned: its folder is a temporary one.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from dpsynth_ml.audit.whitebox import (
    DEFAULT_CANARY_NORM,
    DiracCanaries,
    WhiteBoxAudit,
    white_box_audit,
)
from dpsynth_ml.dp.noise import NoiseSource
from dpsynth_ml.dp_train.run import _prepare, accumulate_step
from dpsynth_ml.dp_train.spec import ClassifierTraining


def audit_dp_train(spec: ClassifierTraining, *, dataset_path: Path, canaries: int,
                   delta: float, generator: torch.Generator, confidence: float = 0.95,
                   canary_norm: float = DEFAULT_CANARY_NORM,
                   claimed_mu: float | None = None, tail_delta: float = 0.0,
                   seeded_noise: bool = False, device: torch.device | str = "cpu",
                   _test_noise: NoiseSource | None = None) -> WhiteBoxAudit:
    """White-box one-run audit of ``spec``'s DP-SGD on the stand-in at ``dataset_path``.

    Args:
        spec: the job's spec, with the ledger's sigma, q, B, C and steps.
        dataset_path: the PUBLIC stand-in (never a private dataset: nothing is charged).
        canaries: m, at most the classifier's number of parameters.
        delta, confidence, claimed_mu, tail_delta, canary_norm: as for
            :func:`dpsynth_ml.audit_finetune`.
        generator: the stand-in's sampling, the canaries and their sampling.
        seeded_noise: TESTS ONLY: key the DP noise from ``generator``.
        device: where the run is placed.
        _test_noise: TESTS ONLY: a (deliberately broken) noise source in place of
            ChaCha20; no spec or setting reaches it.
    """
    dp = spec.privacy.dp
    with tempfile.TemporaryDirectory(prefix="dpsynth-dptrain-audit-") as work:
        run = _prepare(spec, dataset_path=dataset_path, out_dir=Path(work),
                       generator=generator, rng="test" if seeded_noise else "os",
                       init_model_dir=None, resume_from=None, device=torch.device(device),
                       _test_noise=_test_noise)
        try:
            values = sum(p.numel() for p in run.engine.params)
            drawn = DiracCanaries.draw(values, canaries, generator, norm=canary_norm)
            return white_box_audit(
                run.engine, drawn, steps=dp.steps, sample_rate=dp.sample_rate,
                expected_batch_size=dp.expected_batch_size, generator=generator,
                delta=delta, confidence=confidence, claimed_mu=claimed_mu,
                tail_delta=tail_delta, records_step=lambda: _records(run),
                finish_step=run.engine.apply_update)
        finally:
            run.engine.close()


def _records(run: object) -> None:
    accumulate_step(run)  # type: ignore[arg-type]
