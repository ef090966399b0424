"""Sampling a synthetic corpus from a model (post-processing: costs no privacy budget).

The manifest names each privacy figure apart (DESIGN §3): ``job_epsilon`` of the model,
and the dataset's filter figure, tight figure (with its label), delta and admission order
read from the ledger's budget view at generation time.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.job_specs import GenerateSpec
from dpsynth_shared.job_states import JobState
from dpsynth_shared.worker_contract import ModelRef

from dpsynth_worker.runners.artifacts import (
    corpus_key,
    download_folder,
    read_provenance,
    upload_and_register,
    zip_folder,
)
from dpsynth_worker.runners.context import JobContext
from dpsynth_worker.runners.outcome import Outcome, propose, stopped

log = logging.getLogger(__name__)

MANIFEST_VERSION = 1


class _Stop(Exception):
    """Raised from the progress callback to leave the sampler at a batch boundary."""


def run_generate(ctx: JobContext) -> Outcome:
    """Download the model, sample, zip images + manifest, upload, register, propose."""
    spec = GenerateSpec.model_validate(ctx.claim.spec)
    ref = ctx.claim.base_model
    if ref is None:
        raise DpsynthError(ErrorCode.INVALID_SPEC, "a generate claim needs the model")
    ctx.heartbeat.phase("downloading model")
    model_dir = download_folder(ctx, ref.object_key, "model")
    privacy = _privacy_figures(ctx, ref, model_dir)
    corpus_dir = ctx.work_dir / "corpus"
    ctx.heartbeat.phase("sampling")

    def progress(done: int, total: int) -> None:
        ctx.heartbeat.progress(done, total)
        if ctx.flags.any():
            raise _Stop

    try:
        result = ctx.ml.sample(model_dir, samples_per_class=spec.samples_per_class,
                               sampler=spec.sampler, steps=spec.steps,
                               guidance_scale=spec.guidance_scale, seed=spec.seed,
                               out_dir=corpus_dir, progress=progress)
    except _Stop:
        return stopped(ctx)
    manifest = build_manifest(ctx, spec, ref, model_dir, privacy, dict(result.counts))
    (corpus_dir / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    ctx.heartbeat.phase("uploading corpus")
    archive = zip_folder(corpus_dir, ctx.work_dir / "corpus.zip")
    registered = upload_and_register(
        ctx, key=corpus_key(ctx.job_id), path=archive, kind="corpus",
        content_type="application/zip",
        metadata={k: manifest[k] for k in ("model_id", "model_hash", "dp", "job_epsilon",
                                            "delta", "counts", "rng")})
    propose(ctx, JobState.SUCCEEDED, result={"artifact_id": registered.artifact_id,
                                              "images": sum(result.counts.values())})
    return Outcome.SUCCEEDED


def _privacy_figures(ctx: JobContext, ref: ModelRef, model_dir: Path) -> dict[str, Any]:
    """Epsilon figures for the manifest: null for a non-DP model."""
    none: dict[str, Any] = {"dp": False, "dataset_id": None, "job_epsilon": None,
                            "dataset_epsilon_spent": None, "dataset_tight_epsilon": None,
                            "dataset_tight_epsilon_label": None, "delta": None,
                            "admission_order": None, "accountant": None, "job_ids": []}
    if not ref.dp:
        return none
    provenance = read_provenance(model_dir)
    if ref.dataset_id is None or provenance.get("dataset_id") != ref.dataset_id:
        raise DpsynthError(ErrorCode.INVALID_MODEL, "the DP model's provenance is missing")
    view = ctx.ledger.budget_view(ref.dataset_id)
    return {**none, "dp": True, "dataset_id": ref.dataset_id,
            "job_epsilon": provenance.get("job_epsilon"),
            "dataset_epsilon_spent": view.dataset_epsilon_spent,
            "dataset_tight_epsilon": view.dataset_tight_epsilon,
            "dataset_tight_epsilon_label": view.dataset_tight_epsilon_label,
            "delta": view.delta, "admission_order": view.admission_order,
            "accountant": view.accountant, "job_ids": list(provenance.get("job_ids", []))}


def build_manifest(ctx: JobContext, spec: GenerateSpec, ref: ModelRef, model_dir: Path,
                   privacy: dict[str, Any], counts: dict[str, int]) -> dict[str, Any]:
    """The corpus manifest (DESIGN §5): provenance, privacy figures, sampler, counts."""
    info = ctx.ml.read_model_info(model_dir)
    job_ids = [*(privacy.pop("job_ids") or ref.job_ids), ctx.job_id]
    return {"manifest_version": MANIFEST_VERSION, "job_ids": job_ids,
            "generate_job_id": ctx.job_id, "model_id": ref.model_id,
            "model_hash": ctx.ml.model_hash(model_dir), "rng": info.rng, **privacy,
            "sampler": spec.sampler, "steps": spec.steps,
            "guidance_scale": spec.guidance_scale, "seed": spec.seed,
            "samples_per_class": spec.samples_per_class, "counts": counts,
            "non_dp_evaluations": []}
