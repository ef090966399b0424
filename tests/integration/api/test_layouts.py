"""Layout masks (DP-DocLDM): datasets that carry them, and generate jobs that take their
layouts only from PUBLIC masks; a private dataset's masks are refused with
``private_conditioning_refused`` before any job exists."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dpsynth_shared.documents import generate_documents, save_npz

from tests.integration.api.conftest import Api, auth
from tests.unit.api import builders as b

LAYOUT_EXTRA = {"unet_class": "UNet2DConditionModel", "layout_channels": 4}


def _documents(tmp_path: Path, classes: list[str]) -> bytes:
    images, masks, labels, names = generate_documents(3, size=16, seed=0, classes=classes)
    return save_npz(tmp_path / "docs.npz", images, masks, labels, names).read_bytes()


def _public_documents(api: Api, token: str, tmp_path: Path) -> str:
    r = api.upload(token, _documents(tmp_path, ["letter", "memo"]),
                   {"name": "documents", "visibility": "public"}, filename="docs.npz")
    assert r.status_code == 201, r.text
    assert r.json()["has_masks"] is True and r.json()["class_names"] == ["letter", "memo"]
    return str(r.json()["dataset_id"])


def _private_documents(api: Api, token: str, tmp_path: Path) -> str:
    r = api.upload(token, _documents(tmp_path, ["letter", "memo"]), {
        "name": "scans", "visibility": "private", "epsilon_limit": 10.0,
        "label_domain": ["letter", "memo"], "declared_size": 6}, filename="docs.npz")
    assert r.status_code == 201, r.text
    assert r.json()["has_masks"] is True
    return str(r.json()["dataset_id"])


def _model(api: Api, token: str, *, layout: bool) -> str:
    info = {"extra": LAYOUT_EXTRA} if layout else {}
    r = api.client.post("/v1/models", headers=auth(token), files={
        "file": ("m.zip", b.zip_bytes(b.model_folder(info=info)), "application/zip")})
    assert r.status_code == 201, r.text
    assert r.json()["info"].get("layout_channels") == (4 if layout else None)
    return str(r.json()["model_id"])


def _generate(api: Api, token: str, model: str, layout: str | None, *,
              dry_run: bool = False) -> Any:
    spec: dict[str, Any] = {"type": "generate", "model_id": model, "samples_per_class": 2}
    if layout is not None:
        spec["layout_source"] = {"dataset_id": layout}
    return api.client.post("/v1/jobs" + ("?dry_run=true" if dry_run else ""), json=spec,
                           headers=auth(token))


def test_datasets_say_whether_they_carry_masks_and_keep_them(api: Api, tmp_path: Path) -> None:
    _, token = api.tenant()
    docs = _public_documents(api, token, tmp_path)
    shown = api.client.get(f"/v1/datasets/{docs}", headers=auth(token)).json()
    assert shown["has_masks"] is True and shown["declared_public_by"]
    dest = tmp_path / "stored.npz"
    api.store.get_file(f"public/datasets/{docs}/data.npz", dest)
    with np.load(dest, allow_pickle=False) as npz:
        assert npz["masks"].shape == (6, 16, 16, 1) and npz["masks"].dtype == np.uint8
        assert npz["class_names"].tolist() == ["letter", "memo"]
    plain = api.public_dataset(token)
    assert api.client.get(f"/v1/datasets/{plain}",
                          headers=auth(token)).json()["has_masks"] is False


def test_an_npz_with_another_array_or_bad_masks_is_refused(api: Api) -> None:
    _, token = api.tenant()
    images = np.zeros((4, 8, 8), np.uint8)
    for arrays in ({"images": images, "labels": np.arange(4) % 2, "boxes": np.zeros(4)},
                   {"images": images, "labels": np.arange(4) % 2,
                    "masks": np.zeros((3, 8, 8), np.uint8)}):
        buf = io.BytesIO()
        np.savez(buf, **arrays)  # type: ignore[arg-type]
        r = api.upload(token, buf.getvalue(), {"name": "x", "visibility": "public"},
                       filename="x.npz")
        assert r.status_code == 422 and r.json()["code"] == "invalid_dataset", r.text


@pytest.mark.parametrize("dry_run", [False, True])
def test_layouts_from_a_private_dataset_are_refused(api: Api, tmp_path: Path,
                                                    dry_run: bool) -> None:
    _, token = api.tenant()
    private = _private_documents(api, token, tmp_path)
    r = _generate(api, token, _model(api, token, layout=True), private, dry_run=dry_run)
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["code"] == "private_conditioning_refused"
    assert "unbounded privacy loss" in body["detail"] and "no charge" in body["detail"]
    assert api.sender.sent == [] and api.ledger.reservations == {}
    # also when the model has no layout conditioning: the privacy refusal comes first
    r = _generate(api, token, _model(api, token, layout=False), private)
    assert r.json()["code"] == "private_conditioning_refused"
    jobs = api.client.get("/v1/jobs", headers=auth(token)).json()["items"]
    assert jobs == []


def test_a_layout_dataset_without_masks_is_invalid(api: Api) -> None:
    _, token = api.tenant()
    r = _generate(api, token, _model(api, token, layout=True), api.public_dataset(token))
    assert r.status_code == 422 and r.json()["code"] == "invalid_spec", r.text
    assert "no layout masks" in r.json()["detail"]


def test_a_layout_conditioned_model_needs_a_layout_source(api: Api) -> None:
    _, token = api.tenant()
    r = _generate(api, token, _model(api, token, layout=True), None)
    assert r.status_code == 422 and r.json()["code"] == "invalid_spec", r.text
    assert "layout_source" in r.json()["detail"]


def test_a_model_without_layout_conditioning_refuses_a_layout_source(api: Api,
                                                                     tmp_path: Path) -> None:
    _, token = api.tenant()
    docs = _public_documents(api, token, tmp_path)
    r = _generate(api, token, _model(api, token, layout=False), docs)
    assert r.status_code == 422 and r.json()["code"] == "invalid_spec", r.text
    assert "no layout conditioning" in r.json()["detail"]


def test_another_tenants_layout_dataset_does_not_exist(api: Api, tmp_path: Path) -> None:
    _, theirs = api.tenant("other")
    docs = _public_documents(api, theirs, tmp_path)
    _, token = api.tenant()
    r = _generate(api, token, _model(api, token, layout=True), docs)
    assert r.status_code == 404 and r.json()["code"] == "not_found", r.text


def test_public_layouts_are_recorded_and_reach_the_worker(api: Api, tmp_path: Path) -> None:
    _, token = api.tenant()
    docs = _public_documents(api, token, tmp_path)
    declared_by = api.client.get(f"/v1/datasets/{docs}",
                                 headers=auth(token)).json()["declared_public_by"]
    plan = _generate(api, token, _model(api, token, layout=True), docs, dry_run=True)
    assert plan.status_code == 200, plan.text
    assert plan.json()["spec"]["layout_source"] == {"dataset_id": docs, "model_id": None,
                                                    "per_class": True}
    r = _generate(api, token, _model(api, token, layout=True), docs)
    assert r.status_code == 201, r.text
    job = r.json()
    record = job["result"]["layout_source"]
    assert record["dataset_id"] == docs and record["visibility"] == "public"
    assert record["declared_public_by"] == declared_by and record["per_class"] is True
    claim = api.worker(f"{job['job_id']}/claim", {"attempt": 1, "worker_id": "w"})
    assert claim.status_code == 200, claim.text
    layout = claim.json()["layout_dataset"]
    assert layout["dataset_id"] == docs and layout["visibility"] == "public"
    assert layout["has_masks"] is True and layout["declared_public_by"] == declared_by
    assert layout["object_key"] == f"public/datasets/{docs}/data.npz"
    # a worker's result never replaces what the api recorded
    done = api.worker(f"{job['job_id']}/transition", {
        "attempt": 1, "to_state": "succeeded",
        "result": {"samples": 4, "layout_source": {"dataset_id": "forged"}}})
    assert done.status_code == 200, done.text
    shown = api.client.get(f"/v1/jobs/{job['job_id']}", headers=auth(token)).json()
    assert shown["result"]["layout_source"] == record and shown["result"]["samples"] == 4


def _run_and_register(api: Api, job_id: str, metadata: dict[str, Any]) -> str:
    assert api.worker(f"{job_id}/claim", {"attempt": 1, "worker_id": "w"}).status_code == 200
    r = api.worker(f"{job_id}/artifacts", {
        "attempt": 1, "kind": "model", "object_key": f"models/{job_id}/model.tar",
        "sha256": "d" * 64, "size": 10, "metadata": {"rng": "os", **metadata}})
    assert r.status_code == 201, r.text
    return str(r.json()["model_id"])


def test_layout_conditioning_follows_a_model_from_pretrain_to_finetune(
        api: Api, tmp_path: Path) -> None:
    _, token = api.tenant()
    docs = _public_documents(api, token, tmp_path)
    r = api.client.post("/v1/jobs", headers=auth(token), json={
        "type": "pretrain", "dataset_id": docs, "preset": "tiny", "image_size": 16,
        "layout_conditioning": True})
    assert r.status_code == 201, r.text
    pretrained = _run_and_register(api, r.json()["job_id"], {"layout_conditioning": True})
    info = api.client.get(f"/v1/models/{pretrained}", headers=auth(token)).json()["info"]
    assert info["layout_channels"] == 1
    assert _generate(api, token, pretrained, None).json()["code"] == "invalid_spec"
    # a private dataset with masks: its claim says so (the DP job reads them with the images)
    private = _private_documents(api, token, tmp_path)
    job = api.finetune(token, private, pretrained, batch=2)
    assert job.status_code == 201, job.text
    claim = api.worker(f"{job.json()['job_id']}/claim", {"attempt": 1, "worker_id": "w"})
    assert claim.json()["dataset"]["has_masks"] is True
    assert claim.json()["layout_dataset"] is None
    r = api.worker(f"{job.json()['job_id']}/artifacts", {
        "attempt": 1, "kind": "model", "object_key": f"models/{job.json()['job_id']}/m.tar",
        "sha256": "e" * 64, "size": 10, "metadata": {"rng": "os", "job_epsilon": 0.5}})
    finetuned = r.json()["model_id"]
    info = api.client.get(f"/v1/models/{finetuned}", headers=auth(token)).json()["info"]
    assert info["layout_channels"] == 1  # kept from the base model
    assert _generate(api, token, finetuned, private).json()["code"] == (
        "private_conditioning_refused")
    assert _generate(api, token, finetuned, docs).status_code == 201
