"""Issue 3's training options at submission: validated, visible in dry_run, and refused
where the platform cannot account for them (before any budget is reserved)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.api.conftest import Api, auth

DP_PROMISE = {"algorithm": "dp_promise",
              "dp_promise": {"phase1_epochs": 1, "phase1_min_timestep": 900,
                             "latent_clip": 1.0}}


def _submit(api: Api, token: str, dataset: str, model: str, training: dict[str, Any], *,
            dry_run: bool = False) -> Any:
    spec = {"type": "finetune", "dataset_id": dataset, "base_model_id": model,
            "privacy": {"target_epsilon": 2.0},
            "training": {"expected_batch_size": 4, "epochs": 1, **training}}
    return api.client.post("/v1/jobs" + ("?dry_run=true" if dry_run else ""), json=spec,
                           headers=auth(token))


def test_dp_promise_is_refused_on_add_remove_datasets(api: Api) -> None:
    _, token = api.tenant()
    dataset, model = api.private_dataset(token), api.model(token)
    for dry_run in (True, False):
        r = _submit(api, token, dataset, model, DP_PROMISE, dry_run=dry_run)
        assert r.status_code == 422, r.text
        body = r.json()
        assert body["code"] == "unsupported_neighbouring"
        assert "replace-one" in body["detail"] and "dp-promise.md" in body["detail"]
    assert api.ledger.reservations == {} and api.sender.sent == []


def test_dp_promise_is_not_offered_on_replace_one_datasets(api: Api) -> None:
    _, token = api.tenant()
    dataset = api.private_dataset(token, neighbouring="replace_one")
    r = _submit(api, token, dataset, api.model(token), DP_PROMISE)
    assert r.status_code == 422 and r.json()["code"] == "method_not_offered", r.text
    assert "group privacy" in r.json()["detail"]
    assert api.ledger.reservations == {}


@pytest.mark.parametrize("training", [
    {"trainable": "blocks"},                                  # blocks missing
    {"trainable": "attention", "blocks": ["up_blocks.1"]},    # blocks without 'blocks'
    {"noise_multiplicity": 0},
    {"lora_rank": 0},
    {"ema_decay": 1.0},
    {"algorithm": "dp_promise"},                              # phase-1 fields missing
    {"per_label": True, "class_map": {"x": "x"}},
])
def test_impossible_training_options_are_422(api: Api, training: dict[str, Any]) -> None:
    _, token = api.tenant()
    r = _submit(api, token, api.private_dataset(token), api.model(token), training)
    assert r.status_code == 422 and r.json()["code"] == "invalid_spec", r.text
    assert api.ledger.reservations == {}


def test_dry_run_shows_every_option_with_its_default(api: Api) -> None:
    _, token = api.tenant()
    r = _submit(api, token, api.private_dataset(token), api.model(token),
                {"trainable": "lora", "lora_rank": 8, "noise_multiplicity": 4,
                 "warmup_steps": 5, "ema_decay": 0.99}, dry_run=True)
    assert r.status_code == 200, r.text
    training = r.json()["spec"]["training"]
    assert training["trainable"] == "lora" and training["lora_rank"] == 8
    assert training["noise_multiplicity"] == 4 and training["ema_decay"] == 0.99
    assert training["lora_alpha"] is None and training["per_label"] is False
    assert training["algorithm"] == "dp_sgd" and training["max_physical_batch_size"] == 64
    assert r.json()["plan"]["noise_multiplier"] > 0
