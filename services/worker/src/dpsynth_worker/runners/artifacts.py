"""Moving folders through the object store: tars, downloads, uploads and registration.

Model folders and checkpoints travel as uncompressed tars whose members sit at the root
(``docs/architecture.md``, "Object keys"); corpora as a zip of an image folder + manifest.
"""

from __future__ import annotations

import json
import tarfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.worker_contract import RegisterArtifact, RegisteredArtifact

if TYPE_CHECKING:
    from dpsynth_worker.runners.context import JobContext

#: Written by the worker into every model folder it publishes, before hashing: what the
#: model is (DP or not, on which dataset, through which reservations, at which epsilon).
PROVENANCE_FILE = "dpsynth_provenance.json"

#: What a registered artifact is (``RegisterArtifact.kind``).
ArtifactKind = Literal["model", "checkpoint", "corpus", "private_stats", "report"]


def model_key(model_id: str) -> str:
    return f"models/{model_id}/model.tar"


def checkpoint_key(job_id: str, step: int) -> str:
    return f"checkpoints/{job_id}/step-{step:08d}.tar"


def corpus_key(job_id: str) -> str:
    return f"corpora/{job_id}/corpus.zip"


def private_stats_key(job_id: str, attempt: int) -> str:
    return f"owner/{job_id}/private-stats-{attempt}.json"


def tar_folder(folder: Path, dest: Path) -> Path:
    """Write ``folder``'s contents (members at the root, sorted) to an uncompressed tar."""
    with tarfile.open(dest, "w") as tar:
        for path in sorted(folder.rglob("*")):
            tar.add(path, arcname=path.relative_to(folder).as_posix(), recursive=False)
    return dest


def untar_folder(archive: Path, dest: Path) -> Path:
    """Extract a model/checkpoint tar into ``dest``, refusing links and escaping paths."""
    dest.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(archive, "r:") as tar:
            tar.extractall(dest, filter="data")
    except (tarfile.TarError, OSError) as exc:
        raise DpsynthError(ErrorCode.INVALID_MODEL, "model archive cannot be extracted") from exc
    return dest


def zip_folder(folder: Path, dest: Path) -> Path:
    """Zip ``folder``'s files (PNGs are already compressed: stored, not deflated)."""
    with zipfile.ZipFile(dest, "w", compression=zipfile.ZIP_STORED) as zf:
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            zf.write(path, arcname=path.relative_to(folder).as_posix())
    return dest


def download_folder(ctx: JobContext, key: str, name: str) -> Path:
    """Download a tar from the store and extract it under the attempt's work dir."""
    archive = ctx.work_dir / f"{name}.tar"
    ctx.store.get_file(key, archive)
    folder = untar_folder(archive, ctx.work_dir / name)
    archive.unlink()
    return folder


def upload_and_register(ctx: JobContext, *, key: str, path: Path, kind: ArtifactKind,
                        metadata: Mapping[str, object], content_type: str = "application/x-tar",
                        owner_only: bool = False, non_dp: bool = False,
                        checkpoint_step: int | None = None) -> RegisteredArtifact:
    """Upload a local file to ``key`` and register it as an artifact of the job."""
    info = ctx.store.put_file(key, path, content_type=content_type)
    artifact = RegisterArtifact(attempt=ctx.attempt, kind=kind,
                                object_key=key, sha256=info.sha256, size=info.size,
                                owner_only=owner_only, non_dp=non_dp, metadata=dict(metadata),
                                checkpoint_step=checkpoint_step)
    return ctx.api.register_artifact(ctx.job_id, artifact)


def write_provenance(model_dir: Path, provenance: Mapping[str, object]) -> None:
    """Stamp a model folder with its provenance (before it is hashed and tarred)."""
    (model_dir / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2, sort_keys=True))


def read_provenance(model_dir: Path) -> dict[str, Any]:
    """The provenance a worker stamped into a model folder ({} for uploaded models)."""
    path = model_dir / PROVENANCE_FILE
    if not path.is_file():
        return {}
    data: dict[str, Any] = json.loads(path.read_text())
    return data
