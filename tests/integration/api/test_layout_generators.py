"""Layout generators (issue 3, item 5): a model trained with ``target: masks`` on a dataset's
layout masks, DP-finetuned and charged like any finetune, then named by
``layout_source.model_id`` so that its sampled masks condition generation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from dpsynth_api.models.conditioning import check_layout_generator
from dpsynth_api.tables import Dataset, Model
from dpsynth_shared.errors import DpsynthError

from tests.integration.api.conftest import Api, auth
from tests.integration.api.test_layouts import (
    _model,
    _private_documents,
    _public_documents,
    _run_and_register,
)
from tests.unit.api import builders as b


def _generate_with(api: Api, token: str, model: str, layout_model: str, *,
                   dry_run: bool = False) -> Any:
    spec = {"type": "generate", "model_id": model, "samples_per_class": 2,
            "layout_source": {"model_id": layout_model}}
    return api.client.post("/v1/jobs" + ("?dry_run=true" if dry_run else ""), json=spec,
                           headers=auth(token))


def _mask_finetune(api: Api, token: str, dataset: str, base: str, *, target: str = "masks",
                   dry_run: bool = False) -> Any:
    spec = {"type": "finetune", "dataset_id": dataset, "base_model_id": base,
            "privacy": {"target_epsilon": 1.0},
            "training": {"expected_batch_size": 2, "epochs": 2, "target": target}}
    return api.client.post("/v1/jobs" + ("?dry_run=true" if dry_run else ""), json=spec,
                           headers=auth(token))


def _uploaded_generator(api: Api, token: str, **info: Any) -> str:
    r = api.client.post("/v1/models", headers=auth(token), files={"file": (
        "m.zip", b.zip_bytes(b.model_folder(info={"extra": {"target": "masks"}, **info})),
        "application/zip")})
    assert r.status_code == 201, r.text
    assert r.json()["info"]["target"] == "masks"
    return str(r.json()["model_id"])


def test_a_dp_layout_generator_is_charged_like_a_finetune_and_conditions_generation(
        api: Api, tmp_path: Path) -> None:
    _, token = api.tenant()
    docs = _public_documents(api, token, tmp_path)
    # a public layout generator: pretrained on public masks
    r = api.client.post("/v1/jobs", headers=auth(token), json={
        "type": "pretrain", "dataset_id": docs, "preset": "tiny", "image_size": 16,
        "target": "masks"})
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["target"] == "masks"
    public_generator = _run_and_register(api, r.json()["job_id"], {"target": "masks"})
    info = api.client.get(f"/v1/models/{public_generator}", headers=auth(token)).json()["info"]
    assert info["target"] == "masks"

    # the DP layout generator: the same reservation as an image finetune, on the same dataset
    private = _private_documents(api, token, tmp_path)
    masks_plan = _mask_finetune(api, token, private, public_generator, dry_run=True).json()
    images_plan = _mask_finetune(api, token, private, public_generator, target="images",
                                 dry_run=True).json()
    assert masks_plan["plan"] == images_plan["plan"] and masks_plan["plan"]
    assert masks_plan["steps"] == images_plan["steps"]
    job = _mask_finetune(api, token, private, public_generator)
    assert job.status_code == 201, job.text
    job_id = job.json()["job_id"]
    (reservation,) = api.ledger.reservations.values()
    assert reservation.reservation.dataset_id == private  # charged to the private dataset's budget
    claim = api.worker(f"{job_id}/claim", {"attempt": 1, "worker_id": "w"}).json()
    assert claim["dataset"]["has_masks"] is True and claim["spec"]["training"]["target"] == (
        "masks")
    r = api.worker(f"{job_id}/artifacts", {
        "attempt": 1, "kind": "model", "object_key": f"models/{job_id}/m.tar",
        "sha256": "e" * 64, "size": 10,
        "metadata": {"rng": "os", "job_epsilon": 0.5, "target": "masks"}})
    assert r.status_code == 201, r.text
    dp_generator = r.json()["model_id"]
    shown = api.client.get(f"/v1/models/{dp_generator}", headers=auth(token)).json()
    assert shown["dp"] is True and shown["info"]["target"] == "masks"

    image_model = _model(api, token, layout=True)
    for generator, dp in ((public_generator, False), (dp_generator, True)):
        plan = _generate_with(api, token, image_model, generator, dry_run=True)
        assert plan.status_code == 200, plan.text
        assert plan.json()["spec"]["layout_source"] == {
            "dataset_id": None, "model_id": generator, "per_class": True}
        r = _generate_with(api, token, image_model, generator)
        assert r.status_code == 201, r.text
        record = r.json()["result"]["layout_source"]
        assert record["model_id"] == generator and record["dp"] is dp
        assert record["dataset_id"] == (private if dp else docs)
        assert record["job_epsilon"] == (0.5 if dp else None)
        claim = api.worker(f"{r.json()['job_id']}/claim",
                           {"attempt": 1, "worker_id": "w"}).json()
        assert claim["layout_dataset"] is None
        layout = claim["layout_model"]
        assert layout["model_id"] == generator and layout["dp"] is dp
        assert layout["dataset_id"] == (private if dp else docs)


def test_an_image_model_is_not_a_layout_generator(api: Api) -> None:
    _, token = api.tenant()
    r = _generate_with(api, token, _model(api, token, layout=True),
                       _model(api, token, layout=False))
    assert r.status_code == 422 and r.json()["code"] == "invalid_spec", r.text
    assert "not a layout generator" in r.json()["detail"]
    assert api.sender.sent == []


def test_a_test_rng_layout_generator_is_not_publishable(api: Api) -> None:
    _, token = api.tenant()
    r = _generate_with(api, token, _model(api, token, layout=True),
                       _uploaded_generator(api, token, rng="test"))
    assert r.status_code == 409 and r.json()["code"] == "not_publishable", r.text


def test_an_uploaded_layout_generator_needs_a_layout_conditioned_model(api: Api) -> None:
    _, token = api.tenant()
    generator = _uploaded_generator(api, token)
    assert _generate_with(api, token, _model(api, token, layout=True),
                          generator).status_code == 201
    r = _generate_with(api, token, _model(api, token, layout=False), generator)
    assert r.status_code == 422 and "no layout conditioning" in r.json()["detail"], r.text


def test_another_tenants_layout_generator_does_not_exist(api: Api) -> None:
    _, theirs = api.tenant("other")
    generator = _uploaded_generator(api, theirs)
    _, token = api.tenant()
    r = _generate_with(api, token, _model(api, token, layout=True), generator)
    assert r.status_code == 404 and r.json()["code"] == "not_found", r.text


def test_target_masks_needs_a_dataset_with_masks(api: Api) -> None:
    _, token = api.tenant()
    r = api.client.post("/v1/jobs", headers=auth(token), json={
        "type": "pretrain", "dataset_id": api.public_dataset(token), "target": "masks"})
    assert r.status_code == 422 and r.json()["code"] == "invalid_spec", r.text
    assert "carries none" in r.json()["detail"]
    r = _mask_finetune(api, token, api.private_dataset(token), api.model(token))
    assert r.status_code == 422 and r.json()["code"] == "invalid_spec", r.text
    assert "carries none" in r.json()["detail"]
    assert api.ledger.reservations == {} and api.sender.sent == []


def test_target_masks_refuses_a_layout_conditioned_base(api: Api, tmp_path: Path) -> None:
    _, token = api.tenant()
    private = _private_documents(api, token, tmp_path)
    r = _mask_finetune(api, token, private, _model(api, token, layout=True))
    assert r.status_code == 422 and "layout-conditioned" in r.json()["detail"], r.text
    assert api.ledger.reservations == {}


def test_a_model_trained_on_private_data_without_dp_is_refused() -> None:
    """No job makes one today (a finetune is always DP); the check stays."""
    private = Dataset(id="ds_p", visibility="private")
    public = Dataset(id="ds_q", visibility="public")
    leaky = Model(id="mdl_x", dp=False, dataset_id="ds_p", rng="os", info={"target": "masks"})
    with pytest.raises(DpsynthError) as refused:
        check_layout_generator(leaky, private)
    assert refused.value.code == "private_conditioning_refused"
    check_layout_generator(leaky, public)  # the same, pretrained on a public dataset
    check_layout_generator(Model(id="mdl_y", dp=True, dataset_id="ds_p", rng="os",
                                 info={"target": "masks"}), private)
