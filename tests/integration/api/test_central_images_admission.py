"""Admitting a finetune with a DP central-image warm-up (training.central_images): what the
api refuses before any budget is reserved, and what it accepts (in-memory ledger)."""

from __future__ import annotations

from typing import Any

from tests.integration.api.conftest import Api, auth
from tests.unit.api import builders as b

SIZES = {"x": 5, "y": 4, "z": 6}  # the 12 records are 4 per class
CENTRAL = {"target_epsilon": 0.5, "downsample": 2, "warmup_steps": 10}


def _private(api: Api, token: str, **meta: Any) -> Any:
    return api.upload(token, b.digits_npz(12, k=3), {
        "name": "priv", "visibility": "private", "epsilon_limit": 10.0,
        "label_domain": ["x", "y", "z"], "declared_size": 12, **meta}, filename="d.npz")


def _spec(dataset_id: str, model_id: str, **training: Any) -> dict[str, Any]:
    return {"type": "finetune", "dataset_id": dataset_id, "base_model_id": model_id,
            "privacy": {"target_epsilon": 2.0},
            "training": {"expected_batch_size": 4, "epochs": 1.0,
                         "central_images": CENTRAL, **training}}


def _post(api: Api, token: str, spec: dict[str, Any], *, dry: bool = False) -> Any:
    return api.client.post("/v1/jobs" + ("?dry_run=true" if dry else ""), json=spec,
                           headers=auth(token))


def test_central_images_need_public_class_sizes(api: Api) -> None:
    _, token = api.tenant()
    dataset = _private(api, token).json()["dataset_id"]
    model = api.model(token)
    for dry in (True, False):
        r = _post(api, token, _spec(dataset, model), dry=dry)
        assert r.status_code == 422 and r.json()["code"] == "invalid_spec", r.text
        assert "class_sizes" in r.json()["detail"] and "N̂_c" in r.json()["detail"]
    assert api.ledger.reservations == {} and api.sender.sent == []


def test_central_images_refuse_per_label_masks_and_bad_settings(api: Api) -> None:
    _, token = api.tenant()
    dataset = _private(api, token, class_sizes=SIZES).json()["dataset_id"]
    model = api.model(token)
    bad = {"per_label": {"per_label": True},
           "masks": {"target": "masks"},
           "unconditional": {"class_conditional": False},
           "queries without sampling": {"central_images": {**CENTRAL, "queries": 3}},
           "downsample not dividing": {"central_images": {**CENTRAL, "downsample": 3}},
           "no components": {"central_images": {**CENTRAL, "second_moments": True,
                                                "components": 0}}}
    for why, training in bad.items():
        r = _post(api, token, _spec(dataset, model, **training))
        assert r.status_code == 422, (why, r.text)
        assert r.json()["code"] in ("invalid_spec", "validation_error"), (why, r.text)
    assert api.ledger.reservations == {} and api.sender.sent == []


def test_a_central_images_finetune_is_admitted_with_class_sizes(api: Api) -> None:
    _, token = api.tenant()
    dataset = _private(api, token, class_sizes=SIZES).json()["dataset_id"]
    model = api.model(token)
    r = _post(api, token, _spec(dataset, model, central_images={
        **CENTRAL, "sample_rate": 0.5, "queries": 2}))
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["spec"]["training"]["central_images"]["queries"] == 2
    claim = api.worker(f"{job['job_id']}/claim", {"attempt": 1, "worker_id": "w"}).json()
    assert claim["dataset"]["class_sizes"] == SIZES


def test_the_dry_run_composes_the_release_with_its_plan(api: Api) -> None:
    """The release is its own ledger event, charged when the job starts; the reservation
    request carries its public terms (the base model's image shape, the spec's settings), so
    the plan's spent-after figure and ``admissible`` count both (the demo's dry run once
    showed 4.18 after and the job spent 5.59). The in-memory ledger adds epsilons; the real
    ledger's composition is tests/integration/ledger/test_ledger_central_images_plan.py."""
    _, token = api.tenant()
    dataset = _private(api, token, class_sizes=SIZES).json()["dataset_id"]
    model = api.model(token)
    r = _post(api, token, _spec(dataset, model), dry=True)
    assert r.status_code == 200, r.text
    plan = r.json()["plan"]
    assert plan["central_images"]["epsilon"] == 0.5 and plan["job_epsilon"] == 2.0
    assert plan["dataset_epsilon_spent_after"] == 2.5  # DP-SGD 2 + release 0.5
    (warning,) = [w for w in r.json()["warnings"] if "central_images" in w]
    assert "standalone epsilon of 0.5" in warning and "compose" in warning
    spec = _spec(dataset, model)
    del spec["training"]["central_images"]
    r = _post(api, token, spec, dry=True)
    assert r.status_code == 200 and not any("central_images" in w for w in r.json()["warnings"])
    assert "central_images" not in r.json()["plan"]
    assert r.json()["plan"]["dataset_epsilon_spent_after"] == 2.0
    assert api.ledger.reservations == {} and api.sender.sent == []


def test_a_job_whose_release_would_not_fit_is_refused(api: Api) -> None:
    """ε limit 10: DP-SGD at 2 fits alone, not beside a release at 9; nothing is stored."""
    _, token = api.tenant()
    dataset = _private(api, token, class_sizes=SIZES).json()["dataset_id"]
    model = api.model(token)
    spec = _spec(dataset, model, central_images={**CENTRAL, "target_epsilon": 9.0})
    assert _post(api, token, spec, dry=True).json()["plan"]["admissible"] is False
    r = _post(api, token, spec)
    assert r.status_code == 409 and r.json()["code"] == "privacy_budget_exhausted", r.text
    assert api.ledger.reservations == {} and api.sender.sent == []
    del spec["training"]["central_images"]
    assert _post(api, token, spec).status_code == 201


def test_an_initialise_only_pretrain_takes_class_names_and_no_dataset(api: Api) -> None:
    _, token = api.tenant()
    spec = {"type": "pretrain", "initialise_only": True, "class_names": ["x", "y", "z"],
            "space": "pixel", "preset": "tiny", "image_size": 16}
    r = api.client.post("/v1/jobs", json=spec, headers=auth(token))
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["dataset_id"] is None and job["spec"]["initialise_only"] is True
    bad = {"latent": {"space": "latent"}, "no classes": {"class_names": None},
           "a dataset too": {"dataset_id": "ds_x"}, "repeated": {"class_names": ["x", "x"]},
           "layout": {"layout_conditioning": True}}
    for why, change in bad.items():
        r = api.client.post("/v1/jobs", json={**spec, **change}, headers=auth(token))
        assert r.status_code == 422, (why, r.text)
    r = api.client.post("/v1/jobs", json={"type": "pretrain", "preset": "tiny"},
                        headers=auth(token))
    assert r.status_code == 422, r.text  # an ordinary pretrain still needs its dataset
