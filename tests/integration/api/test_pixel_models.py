"""Pixel-space models round-trip through upload and download (issue 18, item 2), beside the
latent round trip of test_models.py: a real pixel model folder (no vae/, built with diffusers)
uploads, shows ``info.space == "pixel"``, downloads byte for byte and uploads again as the
same object; a pixel model made by a pretrain job keeps its space through a finetune and
downloads in its own layout; the layout refusals are 422 ``invalid_model`` problems."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dpsynth_shared.ids import new_model_id

from tests.integration.api.conftest import Api, auth
from tests.integration.api.test_models import (
    PROBLEM,
    put_tar,
    reader_key,
    stored,
    unzip,
    upload,
    upload_bytes,
)
from tests.unit.api import builders as b

VAE_FILES = ("vae/config.json", "vae/diffusion_pytorch_model.safetensors")


@pytest.fixture(scope="module")
def pixel_model(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The files of a real tiny pixel model folder (diffusers save_pretrained, no vae/)."""
    pytest.importorskip("diffusers")
    from tests.support.pixel_models import folder_files, pixel_model_dir

    return folder_files(pixel_model_dir(tmp_path_factory.mktemp("pixel-model"),
                                        class_names=["a", "b"], image_size=16))


def test_a_pixel_model_downloads_as_uploaded_and_uploads_again(
        api: Api, pixel_model: dict[str, bytes], tmp_path: Path) -> None:
    tenant_id, token = api.tenant()
    first = upload(api, token, pixel_model, name="pixel")
    assert first.status_code == 201, first.text
    body = first.json()
    assert body["info"]["space"] == "pixel" and body["info"]["image_size"] == 16
    assert body["info"]["unet_class"] == "UNet2DConditionModel"
    reader = reader_key(api, tenant_id)
    shown = api.client.get(f"/v1/models/{body['model_id']}", headers=auth(reader))
    assert shown.status_code == 200 and shown.json()["info"]["space"] == "pixel"
    r = api.client.get(f"/v1/models/{body['model_id']}/download", headers=auth(reader))
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/zip"
    files = unzip(r.content)
    assert files == pixel_model  # every file, byte for byte, and still no vae/
    assert not any(name.startswith("vae/") for name in files)
    again = upload_bytes(api, token, r.content)
    assert again.status_code == 201, again.text
    assert again.json()["sha256"] == body["sha256"]  # the very same stored object
    assert again.json()["info"]["space"] == "pixel"
    assert stored(api, again.json()["model_id"], tmp_path) == pixel_model


def test_a_latent_model_shows_its_space(api: Api) -> None:
    _, token = api.tenant()
    r = upload(api, token, b.model_folder())
    assert r.status_code == 201, r.text
    assert r.json()["info"]["space"] == "latent"  # its dpsynth_model.json does not say


def test_a_pixel_pretrain_keeps_its_space_through_finetune_and_download(
        api: Api, pixel_model: dict[str, bytes], tmp_path: Path) -> None:
    tenant_id, token = api.tenant()
    public = api.public_dataset(token, {"x": 3, "y": 3, "z": 3})
    job = api.client.post("/v1/jobs", headers=auth(token), json={
        "type": "pretrain", "dataset_id": public, "preset": "tiny", "space": "pixel",
        "image_size": 16})
    assert job.status_code == 201, job.text
    assert job.json()["spec"]["space"] == "pixel"
    job_id = job.json()["job_id"]
    claim = api.worker(f"{job_id}/claim", {"attempt": 1, "worker_id": "w"})
    assert claim.status_code == 200 and claim.json()["spec"]["space"] == "pixel"
    # the worker publishes a pixel model folder under the id it chose
    model_id = new_model_id()
    key = f"models/{model_id}/model.tar"
    published = {**pixel_model, "dpsynth_provenance.json": json.dumps(
        {"dp": False, "public_dataset_id": public}).encode()}
    put_tar(api, key, published, tmp_path)
    r = api.worker(f"{job_id}/artifacts", {
        "attempt": 1, "kind": "model", "object_key": key, "sha256": "d" * 64, "size": 10,
        "metadata": {"rng": "os", "model_id": model_id, "space": "pixel", "preset": "tiny"}})
    assert r.status_code == 201, r.text
    pretrained = str(r.json()["model_id"])
    reader = reader_key(api, tenant_id)
    info = api.client.get(f"/v1/models/{pretrained}", headers=auth(reader)).json()["info"]
    assert info["space"] == "pixel"
    down = api.client.get(f"/v1/models/{pretrained}/download", headers=auth(reader))
    assert down.status_code == 200, down.text
    assert unzip(down.content) == published
    assert upload_bytes(api, token, down.content).json()["info"]["space"] == "pixel"

    # a finetune's worker does not restate the space: the model keeps its base's
    private = api.private_dataset(token)
    finetune = api.finetune(token, private, pretrained)
    assert finetune.status_code == 201, finetune.text
    ft_id = finetune.json()["job_id"]
    assert api.worker(f"{ft_id}/claim", {"attempt": 1, "worker_id": "w"}).status_code == 200
    r = api.worker(f"{ft_id}/artifacts", {
        "attempt": 1, "kind": "model", "object_key": f"models/{ft_id}/m.tar",
        "sha256": "e" * 64, "size": 10, "metadata": {"rng": "os", "job_epsilon": 0.5}})
    assert r.status_code == 201, r.text
    tuned = api.client.get(f"/v1/models/{r.json()['model_id']}", headers=auth(reader)).json()
    assert tuned["info"]["space"] == "pixel" and tuned["dp"] is True


def test_the_pixel_layout_refusals_are_problems(api: Api,
                                                pixel_model: dict[str, bytes]) -> None:
    _, token = api.tenant()
    vae = {k: v for k, v in b.model_folder().items() if k in VAE_FILES}
    unet = json.loads(pixel_model["unet/config.json"])
    cases = {
        "a pixel model with a vae/": ({**pixel_model, **vae}, "has a vae/ folder"),
        "a latent model without a vae/": (
            {k: v for k, v in b.model_folder().items() if k not in VAE_FILES},
            "no vae/ folder"),
        "a pixel unet with other in_channels": (
            {**pixel_model, "unet/config.json": json.dumps(
                {**unet, "in_channels": 3}).encode()}, "has in_channels 3"),
    }
    for case, (members, match) in cases.items():
        r = upload(api, token, members)
        assert r.status_code == 422, (case, r.text)
        assert r.headers["content-type"] == PROBLEM, case
        problem = r.json()
        assert problem["code"] == "invalid_model" and problem["status"] == 422, case
        assert match in problem["detail"], (case, problem["detail"])
    assert api.client.get("/v1/models", headers=auth(token)).json()["items"] == []
