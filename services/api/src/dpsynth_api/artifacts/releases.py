"""Corpus releases: the corpus zip as downloaded, its manifest listing the non-DP
evaluations on private data that preceded the download (issue 5, item 4).

The worker writes a corpus's ``manifest.json`` when it samples the corpus; evaluations come
later. So every download of a corpus (streamed or presigned) serves a RELEASE: the stored
zip with ``manifest.json`` replaced by one whose ``non_dp_evaluations`` lists every evaluate
job on PRIVATE data that

* evaluated this corpus, or
* read data of a budget the corpus's model was DP-trained on (its own, or a DP ancestor's),

and that a worker had claimed before the download (``started_at`` set: from its claim on the
job may read the private records through its ledger grant, so it is listed whatever its
outcome: running, succeeded, failed or cancelled; a queued job that never ran has read
nothing yet and is listed by the first download after it starts). Evaluations on public
references read no private data and are not listed. Reports are never bundled.

Each distinct list is written once, as ``corpora/<generate job>/release-<sha256 of the list,
32 hex>.zip`` beside the corpus, and then streamed or presigned like the corpus; with no
such evaluation the stored corpus itself is served. The rewrite streams entry by entry
through temporary files: memory stays bounded whatever the corpus's size.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpsynth_shared.errors import DpsynthError, ErrorCode, NotFound
from dpsynth_shared.evaluation import SELECTION_CAVEAT
from dpsynth_shared.object_store import ObjectInfo
from sqlalchemy import select
from sqlalchemy.orm import Session

from dpsynth_api.db import utcnow
from dpsynth_api.ports import ObjectStore
from dpsynth_api.tables import Artifact, Dataset, Job, Model

MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 16 * 1024 * 1024
_CHUNK = 1 << 20
_MAX_LINEAGE = 1000


@dataclass(frozen=True)
class Release:
    """What a download of a corpus serves: the object, and the evaluations it lists
    (``evaluations``: the non-DP ones; ``dp_evaluations``: the DP ones, inside the
    guarantee)."""

    key: str
    info: ObjectInfo
    evaluations: list[dict[str, Any]]
    dp_evaluations: list[dict[str, Any]] = field(default_factory=list)


def model_budgets(session: Session, model_id: str | None) -> set[str]:
    """The budgets a model's DP training charged: its own and its DP ancestors' (the base
    models of the jobs that produced it, followed to the root)."""
    budgets: set[str] = set()
    seen: set[str] = set()
    current = model_id
    while current and current not in seen and len(seen) < _MAX_LINEAGE:
        seen.add(current)
        model = session.get(Model, current)
        if model is None:
            break
        if model.dp and model.dataset_id:
            dataset = session.get(Dataset, model.dataset_id)
            if dataset is not None and dataset.visibility == "private":
                budgets.add(dataset.budget_id or dataset.id)
        producer = session.get(Job, model.produced_by_job_id) if model.produced_by_job_id \
            else None
        current = producer.model_id if producer is not None else None
    return budgets


def computed(spec: dict[str, Any]) -> list[str]:
    """What an evaluate job computes from its spec (names as in the report document)."""
    out = ["tstr_accuracy", "real_accuracy", "memorisation_pixel"]
    if spec.get("feature_model_id"):
        out += ["fd_dpsynth", "fd_dpsynth_real_train", "precision", "recall", "density",
                "coverage", "memorisation_features"]
    if spec.get("inception"):
        out.append("inception_fid")
    return out


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def non_dp_evaluations(session: Session, artifact: Artifact) -> list[dict[str, Any]]:
    """The non-DP evaluations on private data a release of this corpus lists, oldest first.

    See the module docstring for which ones; the list is built from the api's job rows.
    """
    producer = session.get(Job, artifact.job_id)
    budgets = model_budgets(session, producer.model_id if producer is not None else None)
    now = utcnow()
    jobs = session.scalars(select(Job).where(
        Job.tenant_id == artifact.tenant_id, Job.type == "evaluate",
        Job.started_at.is_not(None), Job.created_at <= now).order_by(Job.created_at, Job.id))
    out: list[dict[str, Any]] = []
    for job in jobs:
        privacy = job.privacy or {}
        if not privacy.get("non_dp_read"):
            continue
        spec = job.spec or {}
        on_corpus = spec.get("corpus_artifact_id") == artifact.id
        budget = privacy.get("budget_id")
        if not on_corpus and budget not in budgets:
            continue
        out.append({
            "job_id": job.id, "state": job.state,
            "reference_dataset_id": job.dataset_id, "budget_id": budget,
            "corpus_artifact_id": spec.get("corpus_artifact_id"),
            "evaluation_id": privacy.get("evaluation_id"),
            "created_at": _iso(job.created_at), "started_at": _iso(job.started_at),
            "finished_at": _iso(job.finished_at),
            "computed": computed(spec),
            "classifiers": list(spec.get("classifiers") or []),
            "feature_model_id": spec.get("feature_model_id"),
            "private_images_in_report": bool(spec.get("include_private_images", True)),
            "non_dp": True, "report_owner_only": True,
            "relation": "this corpus" if on_corpus else "same budget",
        })
    return out


def dp_evaluations(session: Session, artifact: Artifact) -> list[dict[str, Any]]:
    """The DP evaluations a release of this corpus lists, oldest first: every SUCCEEDED
    evaluate job with ``dp`` that evaluated this corpus or a corpus of a budget its model was
    DP-trained on. Their numbers were released with DP and charged to the budget's held-out
    partition: a choice made by them is inside the guarantee (issue 13, item 6)."""
    producer = session.get(Job, artifact.job_id)
    budgets = model_budgets(session, producer.model_id if producer is not None else None)
    jobs = session.scalars(select(Job).where(
        Job.tenant_id == artifact.tenant_id, Job.type == "evaluate",
        Job.state == "succeeded").order_by(Job.created_at, Job.id))
    out: list[dict[str, Any]] = []
    for job in jobs:
        dp = (job.result or {}).get("dp_evaluation")
        if not isinstance(dp, dict):
            continue
        spec = job.spec or {}
        on_corpus = spec.get("corpus_artifact_id") == artifact.id
        if not on_corpus and dp.get("budget_id") not in budgets:
            continue
        out.append({
            "job_id": job.id, "reference_dataset_id": job.dataset_id,
            "budget_id": dp.get("budget_id"),
            "corpus_artifact_id": spec.get("corpus_artifact_id"),
            "released": dp.get("metrics"), "epsilon": dp.get("epsilon"),
            "delta": dp.get("delta"), "sigma": dp.get("sigma"),
            "sensitivity": dp.get("sensitivity"), "holdout_size": dp.get("holdout_size"),
            "partition": dp.get("partition"), "release_id": dp.get("release_id"),
            "finished_at": _iso(job.finished_at), "dp": True, "inside_guarantee": True,
            "relation": "this corpus" if on_corpus else "same budget",
        })
    return out


def release_key(artifact: Artifact, evaluations: list[dict[str, Any]],
                dp: list[dict[str, Any]] | None = None) -> str:
    """The release object's key for these lists (the corpus's own key when both are
    empty)."""
    if not evaluations and not dp:
        return artifact.object_key
    # v2: the manifest also states selection_caveat and lists dp_evaluations (issue 13,
    # item 6), so a release written before them is never served again
    listed = {"v": 2, "non_dp": evaluations, "dp": list(dp or [])}
    canonical = json.dumps(listed, sort_keys=True, separators=(",", ":")).encode()
    digest = hashlib.sha256(canonical).hexdigest()[:32]
    return f"corpora/{artifact.job_id}/release-{digest}.zip"


def rewrite_manifest(source: Path, dest: Path, evaluations: list[dict[str, Any]],
                     dp: list[dict[str, Any]] | None = None) -> None:
    """Copy a corpus zip entry by entry, replacing ``manifest.json``'s
    ``non_dp_evaluations`` and ``dp_evaluations`` and stating ``selection_caveat`` (a
    manifest is added when the corpus has none).

    Entries keep their names, dates, attributes and compression; data is copied in 1 MiB
    blocks, so memory does not grow with the corpus.
    """
    with zipfile.ZipFile(source) as zin, zipfile.ZipFile(dest, "w", allowZip64=True) as zout:
        found = False
        for entry in zin.infolist():
            out = zipfile.ZipInfo(entry.filename, date_time=entry.date_time)
            out.compress_type, out.external_attr = entry.compress_type, entry.external_attr
            if entry.filename == MANIFEST:
                if entry.file_size > MAX_MANIFEST_BYTES:
                    raise DpsynthError(ErrorCode.INTERNAL, "the corpus manifest is too large")
                manifest = json.loads(zin.read(entry))
                if not isinstance(manifest, dict):
                    raise DpsynthError(ErrorCode.INTERNAL, "the corpus manifest is not an "
                                       "object")
                manifest.update(_listing(evaluations, dp))
                zout.writestr(out, json.dumps(manifest, indent=2, sort_keys=True))
                found = True
            elif entry.is_dir():
                zout.writestr(out, b"")
            else:
                out.file_size = entry.file_size
                with zin.open(entry) as src, zout.open(out, "w") as dst:
                    shutil.copyfileobj(src, dst, _CHUNK)
        if not found:
            zout.writestr(MANIFEST, json.dumps(_listing(evaluations, dp), indent=2,
                                               sort_keys=True))


def _listing(evaluations: list[dict[str, Any]],
             dp: list[dict[str, Any]] | None) -> dict[str, Any]:
    """What a release's manifest says about evaluations and selection."""
    return {"non_dp_evaluations": evaluations, "dp_evaluations": list(dp or []),
            "selection_caveat": SELECTION_CAVEAT}


def release_of(session: Session, store: ObjectStore, artifact: Artifact) -> Release:
    """The release a download of this corpus serves now (written on first use).

    Raises:
        NotFound: the corpus object is gone.
    """
    evaluations = non_dp_evaluations(session, artifact)
    dp = dp_evaluations(session, artifact)
    key = release_key(artifact, evaluations, dp)
    info = store.stat(key)
    if info is not None:
        return Release(key, info, evaluations, dp)
    if key == artifact.object_key:
        raise NotFound("artifact object", artifact.id)
    with tempfile.TemporaryDirectory(prefix="dpsynth-release-") as tmp:
        source, dest = Path(tmp) / "corpus.zip", Path(tmp) / "release.zip"
        if store.stat(artifact.object_key) is None:
            raise NotFound("artifact object", artifact.id)
        with source.open("wb") as fh:
            for chunk in store.iter_chunks(artifact.object_key):
                fh.write(chunk)
        rewrite_manifest(source, dest, evaluations, dp)
        info = store.put_file(key, dest, content_type="application/zip")
    return Release(key, info, evaluations, dp)
