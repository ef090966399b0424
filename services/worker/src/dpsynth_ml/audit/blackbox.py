"""A black-box one-run audit of a finetune: loss canaries scored on the RELEASED model.

The user-facing audit (issue 19, item 1): what an attacker who holds only the finished model
could tell. ``m`` canary records (images of uniform noise, far from any data, each with a
uniformly drawn label) are each put in the training set with probability 1/2 beside a
PUBLIC stand-in cut to N̂ - m records, so the training set never exceeds the audited N̂.
A subject-level run's privacy unit is the subject, so there each canary is a SUBJECT of
``max_images_per_subject`` noise images of one label, in or out as a whole, beside N̂ - m
stand-in subjects (N̂ counts subjects); its score is the mean of its images' scores
(:mod:`dpsynth_ml.audit.canary_sets`).
The finetune then runs exactly as :func:`dpsynth_ml.train` runs it
(``training.finetune.run_finetune``; per label: ``training.per_label.class_run``), and each
canary is scored on the model it writes: minus its mean denoising loss over ``draws``
(timestep, noise) draws, labelled and encoded as the training labelled and encoded it
(``setup._model_labels``, ``setup._encode``). The one-run bounds of
:mod:`dpsynth_ml.audit.one_run` and :mod:`dpsynth_ml.audit.gdp` then compare the scores
with the coin flips: they are valid for any score, so a weak score only makes the bound
loose, never wrong.

A black-box bound is far weaker than the white-box one (the canaries' signal passes through
the whole training and one final model), and with m canaries at 95 % it can never exceed
``max_certifiable``: it says "at least this much" and can rarely bite a claim of ε 4 or
more. The model trained here is never saved or returned (issue 19, item 4): it lives in a
temporary folder deleted on return. The run and the scoring are placed on ``device`` (one
rank), as a finetune placed there by ``train_on_device`` runs; a finetune of W ranks is
audited on W ranks (:func:`black_box_audit_rank`, started by
:func:`dpsynth_ml.audit.ranks.audit_on_ranks`), every rank training the same training set.

Layout models (DP-DocLDM) are covered: each canary image carries a random binary layout
mask of its own (:mod:`dpsynth_ml.audit.canary_sets`); a layout-conditioned model scores
the canary image given its mask, a layout generator (``target: masks``) scores the mask.

Not covered: the central-image release.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dpsynth_ml.audit.canary_sets import (
    TrainingSet,
    draw_canaries,
    record_training_set,
    subject_training_set,
)
from dpsynth_ml.audit.gdp import GdpAuditBound, audit_gdp
from dpsynth_ml.audit.one_run import AuditBound, audit
from dpsynth_ml.data import ImageDataset, load_dataset, training_view
from dpsynth_ml.dp.padding import public_size
from dpsynth_ml.models.architectures import ConditionalDenoiser
from dpsynth_ml.models.model_io import load_model
from dpsynth_ml.parallel.distributed import Placement
from dpsynth_ml.spec import (
    FinetuneTraining,
    InvalidSpecError,
    PerLabel,
    RecordLevel,
    SubjectLevel,
)
from dpsynth_ml.training.diffusion import per_sample_diffusion_loss
from dpsynth_ml.training.finetune import run_finetune, setup
from dpsynth_ml.training.hooks import NullHooks
from dpsynth_ml.training.per_label import class_run

SCORE_DRAWS = 16
"""(timestep, noise) draws per canary in its score (the same for every canary)."""

SCORE_BATCH = 256
"""Canary images per forward pass when scoring (a subject-level audit scores m × k images:
the memory stays that of one training micro-batch or so, whatever m and k are)."""


@dataclass(frozen=True)
class BlackBoxAudit:
    """A black-box audit's result.

    Attributes:
        bound: the one-run (eps, delta) lower bound and its counts.
        gdp: the f-DP one-run bound against the claim's GDP envelope (when given).
        steps, sample_rate: the audited run's logical steps and q.
        stand_in_records: the stand-in records (images) trained on beside the included
            canaries.
        included: how many canaries (records, or subjects) were in the training set.
        scores: [m] each canary's score (minus its mean denoising loss; a subject canary:
            the mean over its images; float64).
        stand_in_subjects: a subject-level run: the stand-in subjects trained on (None for
            a record-level one).
        images_per_canary: 1, or a subject canary's images (``max_images_per_subject``).
        device, world_size: where the run was placed (rank 0's device) and on how many
            ranks (set by :func:`dpsynth_ml.audit.ranks.audit_on_ranks`).
    """

    bound: AuditBound
    gdp: GdpAuditBound
    steps: int
    sample_rate: float
    stand_in_records: int
    included: int
    scores: np.ndarray
    stand_in_subjects: int | None = None
    images_per_canary: int = 1
    device: str = "cpu"
    world_size: int = 1


def black_box_audit_finetune(spec: FinetuneTraining, *, dataset_path: Path,
                             base_model_dir: Path, canaries: int, delta: float,
                             generator: torch.Generator, confidence: float = 0.95,
                             claimed_mu: float | None = None, tail_delta: float = 0.0,
                             audited_class: str | None = None, seeded_noise: bool = False,
                             draws: int = SCORE_DRAWS,
                             device: torch.device | str = "cpu") -> BlackBoxAudit:
    """Black-box one-run audit of ``spec``'s finetune on the stand-in at ``dataset_path``.

    Args:
        spec: the finetune's training spec (the ledger's sigma, q and steps).
        dataset_path: the PUBLIC stand-in (nothing here is charged).
        base_model_dir: the finetune's base model.
        canaries: m, at most half the audited N̂ (q's population: records, or subjects
            for a subject-level run, whose canaries are subjects).
        delta, confidence, claimed_mu, tail_delta: as for :func:`audit_finetune`.
        generator: the canaries, their inclusion, the stand-in's cut, the run's sampling
            and diffusion draws, and the scoring draws.
        audited_class: a per-label finetune's class whose run is audited.
        seeded_noise: TESTS ONLY: key the DP noise from ``generator``.
        draws: (timestep, noise) draws per canary score.
        device: where the run and the scoring are placed (one rank).

    Raises:
        InvalidSpecError: what this audit does not cover (see the module docstring), or
            more canaries than half of N̂.
    """
    result = black_box_audit_rank(
        spec, dataset_path=dataset_path, base_model_dir=base_model_dir, canaries=canaries,
        delta=delta, generator=generator, confidence=confidence, claimed_mu=claimed_mu,
        tail_delta=tail_delta, audited_class=audited_class, seeded_noise=seeded_noise,
        draws=draws, placement=Placement(device=torch.device(device)), set_seed=None)
    assert result is not None  # one rank: rank 0
    return result


def black_box_audit_rank(spec: FinetuneTraining, *, dataset_path: Path,
                         base_model_dir: Path, canaries: int, delta: float,
                         generator: torch.Generator, confidence: float,
                         claimed_mu: float | None, tail_delta: float,
                         audited_class: str | None, seeded_noise: bool, draws: int,
                         placement: Placement, set_seed: int | None) -> BlackBoxAudit | None:
    """:func:`black_box_audit_finetune` as one rank of a W-rank run
    (:func:`dpsynth_ml.audit.ranks.audit_on_ranks` starts the process group).

    Every rank builds the SAME training set (the canaries, their coin flips and the
    stand-in's cut come from ``set_seed``, which rank 0 drew and every rank was given;
    None: drawn here from ``generator``, one rank) and trains it as a W-rank finetune does
    (its own ``generator`` samples its shard). Rank 0 alone scores the canaries on the model
    it wrote and returns the audit; the other ranks return None.
    """
    data = load_dataset(dataset_path)
    if isinstance(spec.privacy, PerLabel):
        if audited_class is None:
            raise InvalidSpecError("a per-label finetune is audited one class's run at a "
                                   "time: name audited_class")
        spec, data = class_run(spec, data, audited_class)
    elif audited_class is not None:
        raise InvalidSpecError("audited_class is for per-label finetunes")
    _check_covered(spec)
    assert isinstance(spec.privacy, (RecordLevel, SubjectLevel))
    dp = spec.privacy.dp
    per_unit = (spec.privacy.max_images_per_subject
                if isinstance(spec.privacy, SubjectLevel) else 1)
    unit = "subjects" if isinstance(spec.privacy, SubjectLevel) else "records"
    population = public_size(sample_rate=dp.sample_rate,
                             expected_batch_size=dp.expected_batch_size)
    if not 1 <= canaries <= population // 2:
        raise InvalidSpecError(f"a black-box audit puts its canaries among the audited "
                               f"N̂ = {population} {unit}: at most {population // 2}")
    rng = np.random.default_rng(draw_set_seed(generator) if set_seed is None else set_seed)
    canary_set = draw_canaries(data, canaries, rng, audited_class, per_unit)
    # one fair coin per canary UNIT (record or subject): the claim is per unit
    included = rng.random(canaries) < 0.5
    training = _training_set(spec, data, canary_set, included, population, rng)
    with tempfile.TemporaryDirectory(prefix="dpsynth-bbaudit-") as work:
        result = run_finetune(spec, dataset_path=dataset_path, dataset=training.dataset,
                              out_dir=Path(work) / "run", hooks=NullHooks(),
                              base_model_dir=base_model_dir, resume_from=None,
                              generator=generator, rng="test" if seeded_noise else "os",
                              placement=placement)
        if not placement.is_main:
            return None
        per_image = _scores(result.model_dir, spec, canary_set, generator, draws,
                            placement.device)
    # a subject canary's images are consecutive rows: its score is their mean
    scores: np.ndarray = per_image.reshape(canaries, per_unit).mean(axis=1)
    return BlackBoxAudit(
        bound=audit(scores, included, confidence=confidence, delta=delta),
        gdp=audit_gdp(scores, included, confidence=confidence, delta=delta,
                      claimed_mu=claimed_mu, tail_delta=tail_delta),
        steps=result.steps_completed, sample_rate=dp.sample_rate,
        stand_in_records=training.stand_in_records, included=int(included.sum()),
        scores=scores, stand_in_subjects=training.stand_in_subjects,
        images_per_canary=per_unit)


def draw_set_seed(generator: torch.Generator) -> int:
    """The seed of a black-box audit's canaries, coin flips and stand-in cut."""
    return int(torch.randint(0, 2**62, (1,), generator=generator))


def _training_set(spec: FinetuneTraining, data: ImageDataset, canary_set: ImageDataset,
                  included: np.ndarray, population: int,
                  rng: np.random.Generator) -> TrainingSet:
    if isinstance(spec.privacy, SubjectLevel):
        return subject_training_set(data, canary_set, included, population=population,
                                    per_unit=spec.privacy.max_images_per_subject, rng=rng)
    return record_training_set(data, canary_set, included, population=population, rng=rng)


def _check_covered(spec: FinetuneTraining) -> None:
    if spec.central_images is not None:
        raise InvalidSpecError("the audit covers DP-SGD only: audit the spec without "
                               "central_images (the release is its own Gaussian mechanism)")


@torch.no_grad()
def _scores(model_dir: Path, spec: FinetuneTraining, canary_set: ImageDataset,
            generator: torch.Generator, draws: int, device: torch.device) -> np.ndarray:
    """Minus each canary image's mean denoising loss under the released model: of its
    image given its layout mask (a layout-conditioned model), of its mask (a layout
    generator), or of its image."""
    bundle, info = load_model(model_dir)
    canary_set = training_view(canary_set, spec.target)
    latents = setup._encode(bundle, canary_set, info).to(device)
    layouts = setup._encode_masks(bundle, canary_set, info)
    layouts = layouts.to(device) if layouts is not None else None
    labels = setup._model_labels(canary_set, spec).to(device)
    denoiser = ConditionalDenoiser(bundle.unet, bundle.class_embedder).eval().to(device)
    total = torch.zeros(len(canary_set), dtype=torch.float64)
    for _ in range(draws):
        for start in range(0, len(canary_set), SCORE_BATCH):
            rows = slice(start, start + SCORE_BATCH)
            total[rows] += per_sample_diffusion_loss(
                denoiser, bundle.scheduler, latents[rows], labels[rows], generator,
                layout=None if layouts is None else layouts[rows],
                timesteps=spec.timestep_distribution).double().cpu()
    scores: np.ndarray = (-total / draws).numpy()
    return scores
