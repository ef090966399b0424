"""Publishing a trained model folder: provenance stamp, hash, tar, upload, register."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dpsynth_shared.ids import new_model_id

from dpsynth_worker.runners.artifacts import (
    model_key,
    tar_folder,
    upload_and_register,
    write_provenance,
)

if TYPE_CHECKING:
    from dpsynth_worker.runners.context import JobContext


@dataclass(frozen=True)
class PublishedModel:
    model_id: str
    artifact_id: str
    model_hash: str


def publish_model(ctx: JobContext, model_dir: Path, *, provenance: Mapping[str, object],
                  metadata: Mapping[str, object]) -> PublishedModel:
    """Stamp, hash, tar and upload ``model_dir`` as ``models/{model_id}/model.tar``.

    The worker picks the model id (the key needs it before registration); the api's reply
    may name another one, which then wins.
    """
    ctx.heartbeat.phase("uploading model")
    write_provenance(model_dir, provenance)
    digest = ctx.ml.model_hash(model_dir)
    info = ctx.ml.read_model_info(model_dir)
    model_id = new_model_id()
    archive = tar_folder(model_dir, ctx.work_dir / "model.tar")
    meta: dict[str, object] = {"model_id": model_id, "model_hash": digest, "rng": info.rng,
                            "preset": info.preset, "class_names": list(info.class_names),
                            "image_size": info.image_size, "channels": info.channels,
                            # a layout generator says so (the api checks it for layouts)
                            "target": str(info.extra.get("target", "images")), **metadata}
    registered = upload_and_register(ctx, key=model_key(model_id), path=archive, kind="model",
                                     metadata=meta)
    archive.unlink()
    return PublishedModel(model_id=registered.model_id or model_id,
                          artifact_id=registered.artifact_id, model_hash=digest)
