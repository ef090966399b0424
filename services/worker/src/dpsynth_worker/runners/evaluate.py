"""Evaluating a synthetic corpus against real reference data (docs/evaluation.md).

Inputs: the corpus zip of a generate job, the reference dataset's training records (its
selection applied) and held-out records, optionally a feature network trained on a PUBLIC
dataset with that dataset's validation records (to re-check the network's accuracy), and
the InceptionV3 weights configured on the worker when Inception FID is asked for.

On a PRIVATE reference the job reads private data outside any DP mechanism: it first
exchanges the claim's ``evaluation_id`` for a read grant at the ledger (a chained
``evaluation_read`` entry, no epsilon), its report is owner-only and labelled non-DP, its
job result carries only where the report is (never a metric), nothing computed from the
data is logged, and its failure messages withhold details (``_failure_message``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.evaluation import SELECTION_CAVEAT
from dpsynth_shared.job_specs import EvaluateSpec
from dpsynth_shared.job_states import JobState
from dpsynth_shared.worker_contract import CorpusRef, DatasetInfo

from dpsynth_worker.devices import first_device
from dpsynth_worker.ml_port import Images, Labels
from dpsynth_worker.reports import ClosestPair, ReportArrays, plain, render_html, render_json
from dpsynth_worker.runners.artifacts import download_folder, read_provenance, upload_and_register
from dpsynth_worker.runners.context import JobContext
from dpsynth_worker.runners.corpus_zip import read_corpus
from dpsynth_worker.runners.evaluate_dp import release_dp
from dpsynth_worker.runners.feature_net import load_public, require_public, validation_split
from dpsynth_worker.runners.outcome import Outcome, propose, stopped
from dpsynth_worker.runners.selection import apply_selection, fetch_dataset

if TYPE_CHECKING:
    from dpsynth_ml import EvaluationResult, ImageDataset

log = logging.getLogger(__name__)

#: Closest synthetic/training pairs drawn in the report, per memorisation space.
REPORT_PAIRS = 12
#: Images per class in the report's sample grids.
GRID_PER_CLASS = 10


class EvaluationInputError(DpsynthError):
    """An error about an evaluation's non-private inputs (spec, corpus, feature network,
    worker configuration): its detail names no private data, so the job shows it even when
    the reference is private."""


class _Stop(Exception):
    """Raised from the progress callback to leave the evaluation at a phase boundary."""


def report_key(job_id: str, name: str) -> str:
    """Where a report file lives: never under the private prefix (the api serves it to the
    owner when the reference is private)."""
    return f"reports/{job_id}/{name}"


def run_evaluate(ctx: JobContext) -> Outcome:
    """Fetch corpus, reference data and feature network; compute; render; upload; propose."""
    spec = EvaluateSpec.model_validate(ctx.claim.spec)
    reference = _check_claim(ctx, spec)
    private = reference.visibility != "public"
    inception = _inception_weights(ctx, spec)
    feature_dir, feature_check = _feature_network(ctx, spec)
    ctx.heartbeat.phase("downloading corpus")
    corpus_path = ctx.work_dir / "corpus.zip"
    ctx.store.get_file(_corpus(ctx).object_key, corpus_path)
    try:
        corpus = read_corpus(corpus_path, reference.class_names)
    except DpsynthError as exc:  # about the synthetic corpus only: its detail may be shown
        raise EvaluationInputError(exc.code, exc.detail, **exc.extensions) from exc
    corpus_path.unlink()
    train, holdout = _reference_data(ctx, reference, private=private)
    names = tuple(reference.class_names)
    # the ML core resizes every set to the feature network's input (else the reference's)
    synthetic = ctx.ml.image_dataset(corpus.images, corpus.labels, names)
    ctx.heartbeat.phase("evaluating")

    def progress(done: int, total: int) -> None:
        ctx.heartbeat.progress(done, total)
        if ctx.flags.any():
            raise _Stop

    try:
        result = ctx.ml.evaluate_corpus(
            synthetic, train, holdout, classifiers=list(spec.classifiers),
            feature_net_dir=feature_dir, feature_check=feature_check,
            min_feature_accuracy=spec.min_feature_accuracy, prdc_k=spec.prdc_k,
            max_images=spec.max_images, seed=spec.seed, inception_weights=inception,
            progress=progress, device=first_device(ctx.ml.devices))
    except _Stop:
        return stopped(ctx)
    if ctx.flags.any():
        return stopped(ctx)
    dp = release_dp(ctx, spec, result, holdout) if spec.dp is not None else None
    show_private = private and spec.include_private_images
    document = build_document(ctx, spec, reference, result.document, corpus.manifest)
    document["dp_evaluation"] = dp
    arrays = report_arrays(result, names, show_real=show_private or not private)
    return _publish(ctx, document, arrays, private=private, contains_private_images=show_private)


def _corpus(ctx: JobContext) -> CorpusRef:
    """The claim's corpus (checked by :func:`_check_claim`)."""
    assert ctx.claim.corpus is not None
    return ctx.claim.corpus


def _check_claim(ctx: JobContext, spec: EvaluateSpec) -> DatasetInfo:
    claim = ctx.claim
    if claim.corpus is None or claim.dataset is None:
        raise EvaluationInputError(ErrorCode.INVALID_SPEC, "an evaluate claim needs a corpus "
                                   "and a reference dataset")
    if claim.corpus.artifact_id != spec.corpus_artifact_id \
            or claim.dataset.dataset_id != spec.dataset_id:
        raise EvaluationInputError(ErrorCode.INVALID_SPEC, "the claim's corpus or reference "
                                   "dataset is not the spec's")
    if not claim.dataset.holdout_object_key:
        raise EvaluationInputError(ErrorCode.NO_HOLDOUT, f"dataset {spec.dataset_id} has no "
                                   "held-out records (holdout_fraction or holdout_from at "
                                   "upload)",
                                   dataset_id=spec.dataset_id)
    if claim.dataset.visibility != "public" and claim.evaluation_id is None:
        raise EvaluationInputError(ErrorCode.INVALID_SPEC, "an evaluation on a private "
                                   "reference needs the ledger's evaluation authorisation")
    return claim.dataset


def _inception_weights(ctx: JobContext, spec: EvaluateSpec) -> Path | None:
    """The configured weights file when Inception FID is asked for (checked before any data
    is read; its sha256 is checked by the ML core when loaded)."""
    if not spec.inception:
        return None
    path = ctx.ml.inception_weights
    if path is None or not Path(path).is_file():
        raise EvaluationInputError(ErrorCode.INCEPTION_UNAVAILABLE, "Inception FID needs "
                                   "pytorch-fid's InceptionV3 weights file on the worker "
                                   "(DPSYNTH_WORKER_INCEPTION_WEIGHTS); this worker has none")
    return Path(path)


def _feature_network(ctx: JobContext,
                     spec: EvaluateSpec) -> tuple[Path | None, tuple[Images, Labels] | None]:
    """The feature network's folder and its PUBLIC validation records, or (None, None).

    The validation records are the public dataset's held-out records when it has them, else
    the seeded split recorded in the network's provenance (``validation``): the records
    the network never trained on.
    """
    if spec.feature_model_id is None:
        return None, None
    ref = ctx.claim.feature_model
    if ref is None or ref.model_id != spec.feature_model_id:
        raise EvaluationInputError(ErrorCode.INVALID_SPEC, "the claim's feature network is "
                                   "not the spec's")
    dataset = require_public(ctx.claim.feature_dataset, "feature network's dataset")
    ctx.heartbeat.phase("downloading feature network")
    folder = download_folder(ctx, ref.object_key, "feature-net")
    data, holdout = load_public(ctx, dataset, "feature-data")
    if holdout is not None:
        check = (holdout.images, holdout.labels)
    else:
        validation = read_provenance(folder).get("validation") or {}
        if validation.get("source") != "split":
            raise EvaluationInputError(ErrorCode.FEATURE_NETWORK_REJECTED, "the feature "
                                       "network's validation records cannot be rebuilt (its "
                                       "provenance does not record them)",
                                       model_id=ref.model_id)
        val_idx, _ = validation_split(len(data.labels), seed=int(validation["seed"]),
                                      fraction=float(validation["fraction"]))
        check = (data.images[val_idx], data.labels[val_idx])
    _precheck(ctx, folder, check, spec, tuple(data.class_names), ref.model_id)
    return folder, check


def _precheck(ctx: JobContext, folder: Path, check: tuple[Images, Labels], spec: EvaluateSpec,
              class_names: tuple[str, ...], model_id: str) -> None:
    """Refuse a feature network that fails its accuracy check on its public validation
    records BEFORE any private data is read (the metrics re-check it and record the figure):
    a rejected evaluation then leaves no non-DP read in the ledger."""
    net, info = ctx.ml.load_feature_net(folder)
    if tuple(info.class_names) != class_names:
        raise EvaluationInputError(ErrorCode.FEATURE_NETWORK_REJECTED, "the feature network's "
                                   "classes are not those of the dataset it was trained on",
                                   model_id=model_id)
    ctx.ml.check_feature_net(net, info, check[0], check[1],
                             min_accuracy=spec.min_feature_accuracy)


def _reference_data(ctx: JobContext, dataset: DatasetInfo, *,
                    private: bool) -> tuple[ImageDataset, ImageDataset]:
    """The reference's training records (selection applied) and held-out records; a private
    reference is read with the evaluation's read grant (the ledger records the read)."""
    holdout_key = dataset.holdout_object_key
    assert holdout_key, "checked by _check_claim"
    grant = None
    if private:
        evaluation_id = ctx.claim.evaluation_id
        assert evaluation_id is not None, "checked by _check_claim"
        grant = ctx.ledger.evaluation_grant(evaluation_id, attempt=ctx.attempt,
                                            worker_id=ctx.worker_id).token
    ctx.heartbeat.phase("downloading reference data")
    train_path, holdout_path = ctx.work_dir / "reference.npz", ctx.work_dir / "holdout.npz"
    fetch_dataset(ctx, dataset, train_path, grant=grant)
    ctx.store.get_file(holdout_key, holdout_path, grant=grant)
    classes = (dataset.selection or {}).get("classes")
    if classes:  # a class subset: its held-out records are those of its classes
        with np.load(holdout_path, allow_pickle=False) as npz:
            domain = [str(c) for c in npz["class_names"].tolist()]
        if domain != list(dataset.class_names):
            whole = holdout_path.with_name("holdout-parent.npz")
            holdout_path.rename(whole)
            apply_selection(whole, holdout_path, classes=[str(c) for c in classes],
                            indices=None)
            whole.unlink()
    train, holdout = ctx.ml.load_dataset(train_path), ctx.ml.load_dataset(holdout_path)
    if tuple(train.class_names) != tuple(dataset.class_names) \
            or tuple(holdout.class_names) != tuple(dataset.class_names):
        raise DpsynthError(ErrorCode.INVALID_DATASET, "the reference data's classes are not "
                           "the dataset's")
    if train.images.shape[1:] != holdout.images.shape[1:]:
        raise DpsynthError(ErrorCode.INVALID_DATASET, "the reference's training and held-out "
                           "images differ in shape")
    return train, holdout


_MANIFEST_DROP = ("indices",)


def _manifest_figures(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The corpus manifest for the report, without the per-image layout indices."""
    out = dict(manifest)
    layout = out.get("layout_source")
    if isinstance(layout, Mapping):
        out["layout_source"] = {k: v for k, v in layout.items() if k not in _MANIFEST_DROP}
    return plain(out)  # type: ignore[no-any-return]


def build_document(ctx: JobContext, spec: EvaluateSpec, reference: DatasetInfo,
                   metrics: Mapping[str, Any], manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The ``report.json`` document: identity, labels and the ML core's metrics."""
    corpus = ctx.claim.corpus
    assert corpus is not None
    private = reference.visibility != "public"
    document: dict[str, Any] = dict(metrics)
    network = document.get("feature_network")
    if isinstance(network, Mapping) and ctx.claim.feature_model is not None:
        network = dict(network)
        network.setdefault("model_id", ctx.claim.feature_model.model_id)
        if ctx.claim.feature_dataset is not None:
            network.setdefault("dataset_id", ctx.claim.feature_dataset.dataset_id)
        document["feature_network"] = network
    notes = list(document.get("notes") or [])
    if private:
        notes.append("computed from private data outside any DP mechanism: owner only, not "
                     "covered by the corpus's privacy guarantee")
        document["selection_caveat"] = SELECTION_CAVEAT
    caveat = (ctx.claim.holdout_overlap or {}).get("caveat")
    if caveat:  # the api could not verify the held-out part was never trained on
        document["holdout_caveat"] = str(caveat)
        notes.insert(0, str(caveat))
    settings = dict(document.get("settings") or {})
    settings["spec"] = spec.model_dump(mode="json")
    document.update(
        report_version=1, job_id=ctx.job_id, corpus_artifact_id=corpus.artifact_id,
        generate_job_id=corpus.job_id, model_id=corpus.model_id,
        dataset_id=reference.dataset_id, reference_visibility=reference.visibility,
        non_dp=private, contains_private_images=private and spec.include_private_images,
        corpus_manifest=_manifest_figures(manifest), notes=notes, settings=settings,
        # the api's view of the producing finetune's audit, as of the claim (issue 19)
        audit=corpus.audit.model_dump(mode="json") if corpus.audit is not None else None)
    return document


def report_arrays(result: EvaluationResult, class_names: tuple[str, ...], *, show_real: bool
                  ) -> ReportArrays:
    """What the page draws, from the ML core's ``EvaluationResult`` (images after its
    subsample and resize); real images only when ``show_real``."""
    images, labels = result.images, result.labels
    pairs: list[ClosestPair] = []
    ratios: dict[str, np.ndarray] = {}
    for space, mem in (result.memorisation or {}).items():
        ratios[space] = np.asarray(mem.ratio)
        for i in np.asarray(mem.closest)[:REPORT_PAIRS].tolist():
            pairs.append(ClosestPair(
                synthetic_index=int(i), train_index=int(mem.nearest_train[i]) if show_real
                else None, class_name=class_names[int(labels["synthetic"][i])],
                space=str(space), d_train=float(mem.d_train[i]),
                d_holdout=float(mem.d_holdout[i]), flagged=bool(mem.flagged[i])))
    return ReportArrays(
        class_names=class_names, synthetic_images=images["synthetic"],
        synthetic_labels=labels["synthetic"],
        real_images=images["real_holdout"] if show_real else None,
        real_labels=labels["real_holdout"] if show_real else None,
        train_images=images["real_train"] if show_real else None, closest_pairs=pairs,
        ratios=ratios, samples_per_class=GRID_PER_CLASS)


def _publish(ctx: JobContext, document: dict[str, Any], arrays: ReportArrays, *,
             private: bool, contains_private_images: bool) -> Outcome:
    """Render, upload and register both report files; propose ``succeeded`` with ONLY where
    the report is and how it is labelled (job results are visible without the owner scope)."""
    ctx.heartbeat.phase("writing report")
    meta = {"contains_private_images": contains_private_images,
            "reference_visibility": document["reference_visibility"]}
    json_path, html_path = ctx.work_dir / "report.json", ctx.work_dir / "report.html"
    json_path.write_bytes(render_json(document))
    html_path.write_text(render_html(document, arrays), encoding="utf-8")
    registered = {}
    for fmt, path, content_type in (("json", json_path, "application/json"),
                                    ("html", html_path, "text/html; charset=utf-8")):
        registered[fmt] = upload_and_register(
            ctx, key=report_key(ctx.job_id, path.name), path=path, kind="report",
            content_type=content_type, metadata={"format": fmt, **meta},
            owner_only=private, non_dp=private)
    result: dict[str, object] = {
        "report_artifact_id": registered["json"].artifact_id,
        "report_html_artifact_id": registered["html"].artifact_id,
        "non_dp": private, "contains_private_images": contains_private_images}
    if document.get("dp_evaluation") is not None:  # DP numbers: the job's readers see them
        result["dp_evaluation"] = document["dp_evaluation"]
    propose(ctx, JobState.SUCCEEDED, result=result)
    log.info("evaluation report written", extra={"non_dp": private})
    return Outcome.SUCCEEDED
