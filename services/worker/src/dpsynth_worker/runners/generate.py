"""Sampling a synthetic corpus from a model (post-processing: costs no privacy budget).

The manifest names each privacy figure apart (docs/privacy.md): ``job_epsilon`` of the model,
and the dataset's filter figure, tight figure (with its label), delta and admission order
read from the ledger's budget view at generation time. It also records how the corpus was
sampled (sampler, steps, guidance, batch size, seed, images per second) and, for a
layout-conditioned model, where its layout masks came from.

Masks copied from a dataset come only from a PUBLIC one (``claim.layout_dataset``, resolved
by the api from ``GenerateSpec.layout_source``): a mask copied from a private record has unbounded
privacy loss, so no charge could cover it. The api refuses private sources at submission
and when building the claim; this runner refuses them again (defence in depth) with
``private_conditioning_refused`` and reads the masks without any read grant.

The other layout source is a layout generator (``claim.layout_model``, from
``layout_source.model_id``): a model trained with ``target: masks``, either pretrained on
public masks or DP-finetuned on a private dataset's masks and charged to that dataset's
budget like any finetune. Its masks are sampled here with the generation seed (on a stream
of their own), binarised, and condition sampling exactly as a dataset's masks do; sampling a
DP model is post-processing, so they cost nothing more. The manifest records the layout
model, its ``dp`` flag, its ``job_epsilon`` and the dataset it was trained on.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Container, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.evaluation import SELECTION_CAVEAT
from dpsynth_shared.job_specs import GenerateSpec
from dpsynth_shared.job_states import JobState
from dpsynth_shared.ledger_contract import LINEAGE_LABEL
from dpsynth_shared.object_store import PRIVATE_PREFIX
from dpsynth_shared.worker_contract import DatasetInfo, ModelRef

from dpsynth_worker.devices import first_device
from dpsynth_worker.runners.artifacts import (
    corpus_key,
    download_folder,
    read_provenance,
    upload_and_register,
    zip_folder,
)
from dpsynth_worker.runners.context import JobContext
from dpsynth_worker.runners.outcome import Outcome, propose, stopped
from dpsynth_worker.runners.selection import fetch_dataset

if TYPE_CHECKING:
    from dpsynth_ml import LayoutSet, ModelInfo

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
    try:
        layouts = _layouts(ctx, spec, model_dir)
    except _Stop:
        return stopped(ctx)
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
                               out_dir=corpus_dir, progress=progress,
                               device=first_device(ctx.ml.devices))
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


def _layouts(ctx: JobContext, spec: GenerateSpec,
             model_dir: Path) -> tuple[dict[str, object], LayoutSet] | None:
    """Where the layouts come from (for the manifest) and the masks (a ``LayoutSet``), or
    None without a layout source: a public dataset's masks or a layout generator's."""
    if ctx.claim.layout_model is not None or (
            spec.layout_source is not None and spec.layout_source.model_id is not None):
        return _generate_layouts(ctx, spec, model_dir)
    downloaded = _download_layouts(ctx, spec)
    if downloaded is None:
        return None
    dataset, layouts = downloaded
    return {"dataset_id": dataset.dataset_id, "visibility": dataset.visibility,
            "declared_public_by": dataset.declared_public_by}, layouts


def _generate_layouts(ctx: JobContext, spec: GenerateSpec,
                      model_dir: Path) -> tuple[dict[str, object], LayoutSet]:
    """Sample the masks the corpus needs from the claim's layout generator.

    Per class of the image model that the layout model also has (``per_class``), it draws
    ``samples_per_class`` masks of that class; classes it lacks draw from all generated
    masks. Without any shared class (or with ``per_class`` false) it draws the corpus's
    total spread evenly over the layout model's classes.

    Raises:
        DpsynthError: ``invalid_spec`` when spec and claim disagree about the layout model
            or it is not a layout generator; ``not_publishable`` for a test-rng layout
            model; ``invalid_model`` for a DP layout model without its provenance.
    """
    source, layout_ref = spec.layout_source, ctx.claim.layout_model
    if source is None or layout_ref is None or layout_ref.model_id != source.model_id:
        raise DpsynthError(ErrorCode.INVALID_SPEC, "the claim's layout model does not match "
                           "the spec's layout_source")
    ctx.heartbeat.phase("downloading layout model")
    layout_dir = download_folder(ctx, layout_ref.object_key, "layout-model")
    layout_info = ctx.ml.read_model_info(layout_dir)
    if not ctx.ml.is_layout_generator(layout_info):
        raise DpsynthError(ErrorCode.INVALID_SPEC, f"model {layout_ref.model_id} is not a "
                           "layout generator (it was not trained with target 'masks')",
                           model_id=layout_ref.model_id)
    if layout_info.rng == "test":
        raise DpsynthError(ErrorCode.NOT_PUBLISHABLE, f"layout model {layout_ref.model_id} "
                           "was trained with a test random generator (rng: test)",
                           model_id=layout_ref.model_id)
    job_epsilon, lineage = None, None
    if layout_ref.dp:
        provenance = read_provenance(layout_dir)
        if layout_ref.dataset_id is None or provenance.get("dataset_id") != layout_ref.dataset_id:
            raise DpsynthError(ErrorCode.INVALID_MODEL,
                               "the DP layout model's provenance is missing")
        job_epsilon = provenance.get("job_epsilon")
        lineage = lineage_label(provenance)
    counts = _layout_counts(spec, ctx.ml.read_model_info(model_dir), layout_info)
    ctx.heartbeat.phase("sampling layouts")

    def progress(done: int, total: int) -> None:
        ctx.heartbeat.progress(done, total)
        if ctx.flags.any():
            raise _Stop

    layouts = ctx.ml.sample_layouts(layout_dir, counts=counts, seed=spec.seed,
                                    sampler=spec.sampler, steps=spec.steps,
                                    guidance_scale=spec.guidance_scale,
                                    batch_size=spec.batch_size, per_class=source.per_class,
                                    progress=progress, device=first_device(ctx.ml.devices))
    return {"model_id": layout_ref.model_id, "dp": bool(layout_ref.dp),
            "job_epsilon": job_epsilon, "job_epsilon_label": lineage,
            "dataset_id": layout_ref.dataset_id,
            "rng": layout_info.rng, "masks_generated": len(layouts)}, layouts


def _drawable(info: ModelInfo) -> list[str]:
    """The class names a model draws (a per-label bundle: those with a denoiser)."""
    denoisers = info.extra.get("denoisers") if info.extra.get("per_label") else None
    if not denoisers or not isinstance(denoisers, Container):  # {class name: its folder}
        return list(info.class_names)
    return [n for n in info.class_names if n in denoisers]


def _layout_counts(spec: GenerateSpec, image_info: ModelInfo,
                   layout_info: ModelInfo) -> dict[str, int]:
    """Masks to generate per layout-model class name (see :func:`_generate_layouts`)."""
    image_classes, layout_classes = _drawable(image_info), _drawable(layout_info)
    per_class = spec.layout_source is not None and spec.layout_source.per_class
    shared = [n for n in image_classes if n in layout_classes] if per_class else []
    if shared:
        return dict.fromkeys(shared, spec.samples_per_class)
    total = spec.samples_per_class * len(image_classes)
    each = -(-total // len(layout_classes))
    return dict.fromkeys(layout_classes, each)


def _download_layouts(ctx: JobContext,
                      spec: GenerateSpec) -> tuple[DatasetInfo, LayoutSet] | None:
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
    ctx.heartbeat.phase("downloading layouts")
    path = ctx.work_dir / "layouts.npz"
    fetch_dataset(ctx, dataset, path)  # public data: no read grant (+ a derived selection)
    layouts = ctx.ml.load_layouts(path, per_class=source.per_class)
    path.unlink()
    return dataset, layouts


def _layout_record(spec: GenerateSpec, origin: Mapping[str, object],
                   used: Mapping[str, Sequence[int]]) -> dict[str, object]:
    """Where the corpus's layout masks came from (``origin``: the public dataset, or the
    layout generator), for its manifest."""
    indices = [i for picks in used.values() for i in picks]
    return {**origin,
            "per_class": spec.layout_source.per_class if spec.layout_source else None,
            "masks_used": len(indices), "distinct_masks_used": len(set(indices)),
            # image i of class c was conditioned on mask indices[c][i] of the dataset (of
            # a layout generator: of the masks it generated, in the order of generation)
            "indices": {name: list(picks) for name, picks in used.items()}}


def lineage_label(provenance: Mapping[str, Any]) -> str | None:
    """``LINEAGE_LABEL`` when a DP model's ``job_epsilon`` composes its DP ancestors' runs
    (more than one reservation in its provenance), else None (issue 13, item 8). The
    manifest's ``dataset_epsilon_spent``, read at generation time, is the guarantee beside it:
    the filter covers every charge of the budget up to then, the model's lineage included."""
    return LINEAGE_LABEL if len(provenance.get("reservation_ids") or []) > 1 else None


def _privacy_figures(ctx: JobContext, ref: ModelRef, model_dir: Path) -> dict[str, Any]:
    """Epsilon figures for the manifest: null for a non-DP model."""
    none: dict[str, Any] = {"dp": False, "dataset_id": None, "job_epsilon": None,
                            "job_epsilon_label": None, "dataset_epsilon_spent": None,
                            "dataset_tight_epsilon": None,
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
            "job_epsilon_label": lineage_label(provenance),
            "dataset_epsilon_spent": view.dataset_epsilon_spent,
            "dataset_tight_epsilon": view.dataset_tight_epsilon,
            "dataset_tight_epsilon_label": view.dataset_tight_epsilon_label,
            "delta": view.delta, "admission_order": view.admission_order,
            "accountant": view.accountant, "job_ids": list(provenance.get("job_ids", []))}


def build_manifest(ctx: JobContext, spec: GenerateSpec, ref: ModelRef, model_dir: Path,
                   privacy: dict[str, Any], counts: dict[str, int], *,
                   images_per_second: float = 0.0,
                   layout: Mapping[str, object] | None = None) -> dict[str, object]:
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
            "layout_source": layout, "non_dp_evaluations": [], "dp_evaluations": [],
            # issue 13, item 6: a download rewrites both lists; the caveat stands either way
            "selection_caveat": SELECTION_CAVEAT}
