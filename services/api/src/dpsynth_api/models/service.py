"""Model use cases: upload a diffusers folder, read models with their lineage, download."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from dpsynth_shared.errors import DpsynthError, ErrorCode, NotFound
from dpsynth_shared.ids import new_model_id
from dpsynth_shared.object_store import PRIVATE_PREFIX
from pydantic import ValidationError
from sqlalchemy.orm import Session

from dpsynth_api.archives import SafeArchive
from dpsynth_api.jobs.audits import model_audits
from dpsynth_api.models import repository as repo
from dpsynth_api.models.conditioning import layout_channels, model_target
from dpsynth_api.models.download import tar_to_zip
from dpsynth_api.models.info_file import model_space
from dpsynth_api.models.schemas import ModelMetadata, ModelOut, model_out
from dpsynth_api.models.validation import check_model_archive, repack
from dpsynth_api.ports import ObjectStore
from dpsynth_api.settings import ApiSettings
from dpsynth_api.tables import Dataset, Model
from dpsynth_api.tenants.security import Principal
from dpsynth_api.uploads import spool, staging


def model_object_key(model_id: str) -> str:
    """Where a model's tar lives in the store."""
    return f"models/{model_id}/model.tar"


def _metadata(raw: str | None) -> ModelMetadata | None:
    if raw is None:
        return None
    try:
        return ModelMetadata.model_validate_json(raw)
    except ValidationError as exc:
        raise DpsynthError(ErrorCode.INVALID_MODEL, f"invalid metadata: {exc.errors()[0]['msg']}",
                           errors=[{"loc": list(e["loc"]), "msg": e["msg"]}
                                   for e in exc.errors()]) from exc


def upload_model(session: Session, *, principal: Principal, store: ObjectStore,
                 settings: ApiSettings, metadata: str | None, upload: BinaryIO) -> Model:
    """Validate a model archive, store it as ``models/{id}/model.tar`` and record it."""
    meta = _metadata(metadata)
    model_id = new_model_id()
    key = model_object_key(model_id)
    # staged under the spool dir and held until the commit (uploads.py, issue 14, item 9)
    with staging(settings.spool_dir, "model") as tmp:
        raw = Path(tmp) / "upload"
        spool(upload, raw, max_bytes=settings.max_upload_bytes)
        archive = SafeArchive(raw, settings.archive_limits, private=False)
        root = check_model_archive(archive)
        info = repack(archive, root, Path(tmp) / "model.tar").info
        stored = tmp.journal(store).put_file(key, Path(tmp) / "model.tar",
                                             content_type="application/x-tar")
        rng = info.get("rng")
        model = Model(id=model_id, tenant_id=principal.tenant_id,
                      name=meta.name if meta else f"model {model_id}", object_key=key,
                      source="upload", dataset_id=None, job_ids=[], dp=False,
                      rng=str(rng) if rng is not None else None, info=_public_info(info),
                      sha256=stored.sha256, size_bytes=stored.size)
        try:
            repo.add(session, model)
            session.commit()
        except BaseException:
            session.rollback()
            store.delete(key)
            raise
    return model


def _public_info(info: dict[str, object]) -> dict[str, object]:
    keep = ("format_version", "preset", "image_size", "channels", "num_classes", "class_names",
            "training_kind", "steps")
    public = {k: info[k] for k in keep if k in info}
    public["space"] = model_space(info)  # "latent" when dpsynth_model.json does not say
    extra = info.get("extra")
    if isinstance(extra, dict) and isinstance(extra.get("unet_class"), str):
        public["unet_class"] = extra["unet_class"]
    channels = layout_channels(info)  # dpsynth_model.json's extra.layout_channels
    if channels:
        public["layout_channels"] = channels
    if model_target(info) == "masks":
        public["target"] = "masks"  # dpsynth_model.json's extra.target: a layout generator
    return public


def get_model(session: Session, *, principal: Principal, model_id: str) -> Model:
    """The tenant's model or 404."""
    model = repo.get_for_tenant(session, tenant_id=principal.tenant_id, model_id=model_id)
    if model is None:
        raise NotFound("model", model_id)
    return model


def list_models(session: Session, *, principal: Principal, limit: int,
                cursor: str | None) -> list[Model]:
    """One page of the tenant's models (``limit + 1`` rows)."""
    return repo.list_for_tenant(session, tenant_id=principal.tenant_id, limit=limit,
                                cursor=cursor)


def model_views(session: Session, models: list[Model]) -> list[ModelOut]:
    """The views of ``models``, each DP model with its producing finetune's latest audit
    (issue 19, item 2): two queries for the whole list, not one per model."""
    audits = model_audits(session, models)
    return [model_out(model, audits.get(model.id)) for model in models]


def open_download(session: Session, *, principal: Principal, store: ObjectStore,
                  model_id: str) -> Iterator[bytes]:
    """The tenant's model as the zip it would be uploaded as, streamed.

    A model trained with DP-SGD on private data is releasable by post-processing; a model
    trained with an injected test generator carries no DP guarantee and is never released
    (409 ``not_publishable``), and neither is anything trained on private data without DP.

    Raises:
        DpsynthError: 404 ``not_found`` (another tenant's id too), 409 ``not_publishable``,
            403 ``forbidden``.
    """
    model = get_model(session, principal=principal, model_id=model_id)
    if model.rng == "test":
        raise DpsynthError(ErrorCode.NOT_PUBLISHABLE, "this model was trained with an injected "
                           "test generator (rng: test): it carries no DP guarantee and cannot "
                           "be downloaded", rng="test")
    dataset = session.get(Dataset, model.dataset_id) if model.dataset_id else None
    if model.object_key.startswith(PRIVATE_PREFIX) or (
            dataset is not None and dataset.visibility == "private" and not model.dp):
        raise DpsynthError(ErrorCode.FORBIDDEN, "this model was trained on private data "
                           "without differential privacy and cannot be downloaded")
    if store.stat(model.object_key) is None:
        raise NotFound("model object", model_id)
    return tar_to_zip(store.iter_chunks(model.object_key))
