"""Sampling a synthetic corpus from a model (post-processing: costs no privacy budget).

The manifest names each privacy figure apart (DESIGN §3): ``job_epsilon`` of the model,
and the dataset's filter figure, tight figure (with its label), delta and admission order
read from the ledger's budget view at generation time. It also records how the corpus was
sampled (sampler, steps, guidance, batch size, seed, images per second) and, for a
layout-conditioned model, where its layout masks came from.

Layout masks come only from a PUBLIC dataset (``claim.layout_dataset``, resolved by the api
from ``GenerateSpec.layout_source``): a mask copied from a private record has unbounded
privacy loss, so no charge could cover it. The api refuses private sources at submission
and when building the claim; this runner refuses them again (defence in depth) with
``private_conditioning_refused`` and reads the masks without any read grant.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.job_specs import GenerateSpec
from dpsynth_shared.job_states import JobState
from dpsynth_shared.object_store import PRIVATE_PREFIX
from dpsynth_shared.worker_contract import DatasetInfo, ModelRef

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

#: How the corpus was sampled: in the manifest and in the job's result.
SAMPLING_KEYS = ("sampler", "steps", "guidance_scale", "batch_size", "seed",
                 "images_per_second")


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
    layouts = _download_layouts(ctx, spec)
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
                               batch_size=spec.batch_size,
                               layouts=None if layouts is None else layouts[1],
                               out_dir=corpus_dir, progress=progress)
    except _Stop:
        return stopped(ctx)
    manifest = build_manifest(ctx, spec, ref, model_dir, privacy, dict(result.counts),
                              images_per_second=result.images_per_second,
                              layout=None if layouts is None
                              else _layout_record(spec, layouts[0], result.layouts))
    (corpus_dir / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    ctx.heartbeat.phase("uploading corpus")
    archive = zip_folder(corpus_dir, ctx.work_dir / "corpus.zip")
    registered = upload_and_register(
        ctx, key=corpus_key(ctx.job_id), path=archive, kind="corpus",
        content_type="application/zip",
        metadata={k: manifest[k] for k in ("model_id", "model_hash", "dp", "job_epsilon",
                                            "delta", "counts", "rng")})
    propose(ctx, JobState.SUCCEEDED, result={"artifact_id": registered.artifact_id,
                                              "images": sum(result.counts.values()),
                                              **{k: manifest[k] for k in SAMPLING_KEYS}})
    return Outcome.SUCCEEDED


def _download_layouts(ctx: JobContext, spec: GenerateSpec) -> tuple[DatasetInfo, Any] | None:
    """The public layout dataset of the claim and its masks (a ``LayoutSet``), or None.

    Raises:
        DpsynthError: ``private_conditioning_refused`` for a dataset that is not public (or
            whose object sits under the private prefix); ``invalid_spec`` when the spec and
            the claim disagree about the layout source.
    """
    source, dataset = spec.layout_source, ctx.claim.layout_dataset
    if source is None and dataset is None:
        return None
    if source is None or dataset is None or dataset.dataset_id != source.dataset_id:
        raise DpsynthError(ErrorCode.INVALID_SPEC, "the claim's layout dataset does not match "
                           "the spec's layout_source")
    if dataset.visibility != "public" or dataset.object_key.startswith(PRIVATE_PREFIX):
        raise DpsynthError(ErrorCode.PRIVATE_CONDITIONING_REFUSED,
                           f"dataset {dataset.dataset_id} is not public: a layout mask copied "
                           "from a private record has unbounded privacy loss, so no charge "
                           "could cover it", dataset_id=dataset.dataset_id)
    from dpsynth_ml.generate import load_layouts

    ctx.heartbeat.phase("downloading layouts")
    path = ctx.work_dir / "layouts.npz"
    ctx.store.get_file(dataset.object_key, path)  # public data: no read grant
    layouts = load_layouts(path, per_class=source.per_class)
    path.unlink()
    return dataset, layouts


def _layout_record(spec: GenerateSpec, dataset: DatasetInfo,
                   used: Mapping[str, Sequence[int]]) -> dict[str, Any]:
    """Where the corpus's layout masks came from, for its manifest."""
    indices = [i for picks in used.values() for i in picks]
    return {"dataset_id": dataset.dataset_id, "visibility": dataset.visibility,
            "declared_public_by": dataset.declared_public_by,
            "per_class": spec.layout_source.per_class if spec.layout_source else None,
            "masks_used": len(indices), "distinct_masks_used": len(set(indices)),
            # image i of class c was conditioned on mask indices[c][i] of the dataset
            "indices": {name: list(picks) for name, picks in used.items()}}


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
                   privacy: dict[str, Any], counts: dict[str, int], *,
                   images_per_second: float = 0.0,
                   layout: dict[str, Any] | None = None) -> dict[str, Any]:
    """The corpus manifest (DESIGN §5): provenance, privacy figures, sampling, counts.

    ``guidance_applied`` is False for a per-label bundle: each class comes from its own
    one-class denoiser, where classifier-free guidance does not apply.
    """
    info = ctx.ml.read_model_info(model_dir)
    job_ids = [*(privacy.pop("job_ids") or ref.job_ids), ctx.job_id]
    per_label = bool(info.extra.get("per_label", False))
    return {"manifest_version": MANIFEST_VERSION, "job_ids": job_ids,
            "generate_job_id": ctx.job_id, "model_id": ref.model_id,
            "model_hash": ctx.ml.model_hash(model_dir), "rng": info.rng, **privacy,
            "sampler": spec.sampler, "steps": spec.steps,
            "guidance_scale": spec.guidance_scale, "guidance_applied": not per_label,
            "per_label": per_label, "batch_size": spec.batch_size, "seed": spec.seed,
            "images_per_second": images_per_second,
            "samples_per_class": spec.samples_per_class, "counts": counts,
            "layout_source": layout, "non_dp_evaluations": []}
