"""Bring your own model (issue 3 item 9): uploads are checked against the allow-list and
refused with a 4xx problem+json; every model downloads as the zip it would be uploaded as."""

from __future__ import annotations

import io
import json
import struct
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest
from dpsynth_shared.ids import new_model_id

from tests.integration.api.conftest import Api, auth
from tests.unit.api import builders as b

PROBLEM = "application/problem+json"


@pytest.fixture(scope="module")
def real_model(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The files of a real tiny model folder written by the ML core (diffusers
    save_pretrained + dpsynth_model.json)."""
    from tests.support.models import tiny_model_dir

    folder = tiny_model_dir(tmp_path_factory.mktemp("tiny-model"), class_names=["a", "b"],
                            image_size=16)
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def upload(api: Api, token: str, members: dict[str, bytes], name: str = "m") -> Any:
    return api.client.post("/v1/models", headers=auth(token), data={
        "metadata": json.dumps({"name": name})}, files={
        "file": ("m.zip", b.zip_bytes(members), "application/zip")})


def upload_bytes(api: Api, token: str, data: bytes) -> Any:
    return api.client.post("/v1/models", headers=auth(token),
                           files={"file": ("m.zip", data, "application/zip")})


def reader_key(api: Api, tenant_id: str) -> str:
    r = api.client.post(f"/v1/tenants/{tenant_id}/keys", json={"scopes": ["read"]},
                        headers=auth(api.admin))
    assert r.status_code == 201, r.text
    return str(r.json()["api_key"])


def unzip(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def stored(api: Api, model_id: str, tmp_path: Path) -> dict[str, bytes]:
    dest = tmp_path / f"{model_id}.tar"
    api.store.get_file(f"models/{model_id}/model.tar", dest)
    with tarfile.open(dest) as tf:
        return {m.name: tf.extractfile(m).read() for m in tf if m.isfile()}  # type: ignore[union-attr]


def put_tar(api: Api, key: str, members: dict[str, bytes], tmp_path: Path) -> None:
    path = tmp_path / "worker-model.tar"
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    api.store.put_file(key, path)


def test_a_real_model_downloads_as_uploaded_and_uploads_again(
        api: Api, real_model: dict[str, bytes], tmp_path: Path) -> None:
    tenant_id, token = api.tenant()
    first = upload(api, token, real_model, name="tiny")
    assert first.status_code == 201, first.text
    body = first.json()
    assert body["info"]["class_names"] == ["a", "b"]
    assert body["info"]["unet_class"] == "UNet2DConditionModel"
    r = api.client.get(f"/v1/models/{body['model_id']}/download",
                       headers=auth(reader_key(api, tenant_id)))
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/zip"
    assert f'filename="{body["model_id"]}.zip"' in r.headers["content-disposition"]
    assert unzip(r.content) == real_model  # every file, byte for byte
    again = upload_bytes(api, token, r.content)
    assert again.status_code == 201, again.text
    # the re-upload of a download stores the very same object
    assert again.json()["sha256"] == body["sha256"]
    assert stored(api, again.json()["model_id"], tmp_path) == real_model


def test_trained_models_download_by_post_processing_unless_rng_test(
        api: Api, real_model: dict[str, bytes], tmp_path: Path) -> None:
    tenant_id, token = api.tenant()
    _, stranger = api.tenant("other")
    private, base = api.private_dataset(token), api.model(token)

    def trained(rng: str) -> str:
        """A finetune on the private dataset whose worker publishes a real model folder."""
        job_id = api.finetune(token, private, base).json()["job_id"]
        assert api.worker(f"{job_id}/claim", {"attempt": 1, "worker_id": "w"}).status_code \
            == 200
        model_id = new_model_id()  # the worker names the model before uploading it
        key = f"models/{model_id}/model.tar"
        provenance = json.dumps({"dp": True, "dataset_id": private}).encode()
        info = json.loads(real_model["dpsynth_model.json"])
        put_tar(api, key, {**real_model, "dpsynth_model.json": json.dumps(
            {**info, "rng": rng, "training_kind": "finetune"}).encode(),
            "dpsynth_provenance.json": provenance}, tmp_path)
        r = api.worker(f"{job_id}/artifacts", {
            "attempt": 1, "kind": "model", "object_key": key, "sha256": "d" * 64, "size": 10,
            "metadata": {"job_epsilon": 0.9, "rng": rng, "model_id": model_id}})
        assert r.status_code == 201, r.text
        return str(r.json()["model_id"])

    dp_model, test_model = trained("os"), trained("test")
    reader = reader_key(api, tenant_id)
    meta = api.client.get(f"/v1/models/{dp_model}", headers=auth(reader)).json()
    assert meta["dp"] is True and meta["dataset_id"] == private

    r = api.client.get(f"/v1/models/{dp_model}/download", headers=auth(reader))
    assert r.status_code == 200, r.text
    files = unzip(r.content)
    assert "dpsynth_provenance.json" in files
    assert {k: v for k, v in files.items() if k not in (
        "dpsynth_provenance.json", "dpsynth_model.json")} == {
        k: v for k, v in real_model.items() if k != "dpsynth_model.json"}
    again = upload_bytes(api, token, r.content)
    assert again.status_code == 201, again.text
    assert again.json()["source"] == "upload" and again.json()["dp"] is False
    # the provenance of a training is the api's record, not a file an upload can carry
    assert "dpsynth_provenance.json" not in stored(api, again.json()["model_id"], tmp_path)

    refused = api.client.get(f"/v1/models/{test_model}/download", headers=auth(reader))
    assert refused.status_code == 409 and refused.headers["content-type"] == PROBLEM
    assert refused.json()["code"] == "not_publishable"

    for model_id in (dp_model, base, "mdl_missing"):
        other = api.client.get(f"/v1/models/{model_id}/download", headers=auth(stranger))
        assert other.status_code == 404 and other.json()["code"] == "not_found", model_id
    assert api.client.get(f"/v1/models/{dp_model}/download").status_code == 401


def test_an_uploaded_rng_test_model_is_not_downloadable(api: Api) -> None:
    _, token = api.tenant()
    r = upload(api, token, b.model_folder(info={"rng": "test"}))
    assert r.status_code == 201 and r.json()["publishable"] is False
    down = api.client.get(f"/v1/models/{r.json()['model_id']}/download", headers=auth(token))
    assert down.status_code == 409 and down.json()["code"] == "not_publishable"


def _padded(config: dict[str, Any], size: int) -> bytes:
    raw = json.dumps(config).encode()
    return raw[:-1] + b" " * (size - len(raw)) + b"}"


def _raw_safetensors(header: dict[str, Any], buffer: int) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + b"\0" * buffer


UNET = b.TINY_CONFIGS["unet/config.json"]
VAE = b.TINY_CONFIGS["vae/config.json"]
REFUSALS: dict[str, tuple[dict[str, bytes], str]] = {
    "pickle .bin weights": (b.model_folder(extra={
        "unet/diffusion_pytorch_model.bin": b"\x80\x04K\x01."}), "pickle-based weight files"),
    "a class outside the allow-list": (b.model_folder(configs={
        "unet/config.json": {**UNET, "_class_name": "ControlNetModel"}}),
        "'ControlNetModel' is not allowed for unet"),
    "an oversized config": (b.model_folder(extra={
        "unet/config.json": _padded(UNET, 65 * 1024)}), "over the limit of 65536 bytes"),
    "an unknown config key": (b.model_folder(configs={
        "vae/config.json": {**VAE, "my_option": True}}), "unknown key(s) 'my_option'"),
    "auto_map": (b.model_folder(configs={
        "unet/config.json": {**UNET, "auto_map": {"AutoModel": "modeling.UNet"}}}),
        "custom or remote code"),
    "a custom block type": (b.model_folder(configs={
        "unet/config.json": {**UNET, "down_block_types": ["MyDownBlock", "DownBlock2D"]}}),
        "down_block_types"),
    "a too-large architecture": (b.model_folder(configs={
        "unet/config.json": {**UNET, "block_out_channels": [2048, 2048],
                             "layers_per_block": 8, "norm_num_groups": 32}}),
        "parameters, over the limit"),
    "a .py file": (b.model_folder(extra={"unet/modeling_unet.py": b"import os\n"}),
                   "code files are refused"),
    "an unexpected file": (b.model_folder(extra={"text_encoder/config.json": b"{}"}),
                           "unexpected file"),
    "a corrupt safetensors header": (b.model_folder(extra={
        "vae/diffusion_pytorch_model.safetensors": struct.pack("<Q", 10**6) + b"{}"}),
        "vae/diffusion_pytorch_model.safetensors is not a valid safetensors file"),
    "overlapping tensors": (b.model_folder(extra={
        "unet/diffusion_pytorch_model.safetensors": _raw_safetensors({
            "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, 12)}), "overlaps"),
    "weights larger than the config": (b.model_folder(extra={
        "class_embedder/model.safetensors": b.safetensors_bytes({"weight": [3, 33]})}),
        "weights hold 99 values, more than the 96 parameters"),
    "no scheduler": ({k: v for k, v in b.model_folder().items() if "scheduler" not in k},
                     "no scheduler/"),
    "a weightless vae": ({k: v for k, v in b.model_folder().items()
                          if k != "vae/diffusion_pytorch_model.safetensors"},
                         "vae/ has no diffusion_pytorch_model.safetensors"),
    "an unknown format version": (b.model_folder(info={"format_version": 7}),
                                  "format_version 7"),
    "parts that do not fit": (b.model_folder(configs={"class_embedder/config.json": {
        "num_embeddings": 5, "embedding_dim": 32, "null_class": 4}}), "num_classes + 1 = 3"),
}


def test_every_refusal_is_a_4xx_problem(api: Api) -> None:
    _, token = api.tenant()
    assert upload(api, token, b.model_folder()).status_code == 201
    for case, (members, match) in REFUSALS.items():
        r = upload(api, token, members)
        assert r.status_code == 422, (case, r.text)
        assert r.headers["content-type"] == PROBLEM, case
        problem = r.json()
        assert problem["code"] == "invalid_model" and problem["status"] == 422, case
        assert match in problem["detail"], (case, problem["detail"])
    assert len(api.client.get("/v1/models", headers=auth(token)).json()["items"]) == 1
