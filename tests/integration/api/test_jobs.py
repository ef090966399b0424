"""Job submission rules, dry runs, budgets, pagination, cancel, claims, heartbeats."""

from __future__ import annotations

import json
from typing import Any

from tests.integration.api.conftest import Api, auth
from tests.unit.api import builders as b

FORBIDDEN_KEYS = ("loss", "grad", "clip")


def _setup(api: Api) -> tuple[str, str, str, str]:
    _, token = api.tenant()
    return token, api.public_dataset(token), api.private_dataset(token), api.model(token)


def _keys(value: Any) -> set[str]:
    """Every key of a JSON document, except inside the user's own spec (which names
    hyper-parameters such as max_grad_norm, not statistics of data)."""
    if isinstance(value, dict):
        value = {k: v for k, v in value.items() if k != "spec"}
        return set(value) | {k for v in value.values() for k in _keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _keys(v)}
    return set()


def test_visibility_rules(api: Api) -> None:
    token, public, private, model = _setup(api)
    r = api.finetune(token, public, model)
    assert r.status_code == 422 and r.json()["code"] == "visibility_mismatch"
    assert "PRIVATE" in r.json()["detail"]
    r = api.client.post("/v1/jobs", json={"type": "pretrain", "dataset_id": private},
                        headers=auth(token))
    assert r.status_code == 422 and r.json()["code"] == "visibility_mismatch"
    assert "PUBLIC" in r.json()["detail"]
    r = api.client.post("/v1/jobs", json={"type": "pretrain", "dataset_id": public},
                        headers=auth(token))
    assert r.status_code == 201 and r.json()["state"] == "queued"
    assert api.sender.sent == [(r.json()["job_id"], 1)]


def test_invalid_specs(api: Api) -> None:
    token, _, private, model = _setup(api)
    r = api.finetune(token, private, model, epsilon=0)
    assert r.status_code == 422 and r.json()["code"] == "invalid_spec"
    assert any("target_epsilon" in e["loc"] for e in r.json()["errors"])
    r = api.finetune(token, private, model, batch=13)  # N̂ = 12
    assert r.status_code == 422 and r.json()["code"] == "invalid_spec"
    assert r.json()["declared_size"] == 12
    r = api.client.post("/v1/jobs", json={"type": "nope"}, headers=auth(token))
    assert r.status_code == 422 and r.json()["code"] == "invalid_spec"
    r = api.client.post("/v1/jobs", json={"type": "generate", "model_id": "mdl_missing"},
                        headers=auth(token))
    assert r.status_code == 404
    assert api.sender.sent == [] and api.ledger.reservations == {}


def test_finetune_reserves_before_inserting(api: Api) -> None:
    token, _, private, model = _setup(api)
    r = api.finetune(token, private, model, epsilon=3.0, batch=4)
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["privacy"]["job_epsilon"] == 3.0
    assert job["privacy"]["steps"] == 6  # ceil(2 epochs * 12 / 4)
    assert job["privacy"]["sample_rate"] == 4 / 12
    assert "not a guarantee" in job["privacy"]["dataset_tight_epsilon_label"]
    (reservation,) = api.ledger.reservations.values()
    assert reservation.reservation.job_id == job["job_id"]
    assert job["privacy"]["reservation_id"] == reservation.reservation.reservation_id
    assert job["progress"]["total"] == 6


def test_over_budget_is_409_with_the_ledgers_numbers(api: Api) -> None:
    token, _, private, model = _setup(api)
    assert api.finetune(token, private, model, epsilon=7.0).status_code == 201
    r = api.finetune(token, private, model, epsilon=5.0)
    assert r.status_code == 409
    body = r.json()
    assert body["code"] == "privacy_budget_exhausted"
    assert body["max_admissible_target_epsilon"] == 3.0
    assert body["dataset_epsilon_spent"] == 7.0
    jobs = api.client.get("/v1/jobs", headers=auth(token)).json()["items"]
    assert len(jobs) == 1  # nothing inserted for the refused one
    view = api.client.get(f"/v1/datasets/{private}/budget", headers=auth(token)).json()
    assert view["dataset_epsilon_spent"] == 7.0 and view["warning"] is False
    assert api.finetune(token, private, model, epsilon=1.5).status_code == 201
    view = api.client.get(f"/v1/datasets/{private}/budget", headers=auth(token)).json()
    assert view["warning"] is True  # 8.5 >= 0.8 * 10


def test_dry_run_stores_nothing(api: Api) -> None:
    token, _, private, model = _setup(api)
    r = api.finetune(token, private, model, epsilon=2.0, dry_run=True)
    assert r.status_code == 200, r.text
    plan = r.json()["plan"]
    assert r.json()["dry_run"] is True and r.json()["steps"] == 6
    assert plan["job_epsilon"] == 2.0 and plan["admissible"] is True
    assert plan["dataset_epsilon_spent_after"] == 2.0
    assert plan["max_admissible_target_epsilon"] == 10.0
    for key in ("noise_multiplier", "sample_rate", "steps", "dataset_tight_epsilon_after",
                "dataset_tight_epsilon_label"):
        assert key in plan
    too_much = api.finetune(token, private, model, epsilon=50.0, dry_run=True).json()
    assert too_much["plan"]["admissible"] is False
    assert api.client.get("/v1/jobs", headers=auth(token)).json()["items"] == []
    assert api.ledger.reservations == {} and api.sender.sent == []


def test_list_pagination_and_filters(api: Api) -> None:
    token, public, _private, model = _setup(api)
    ids = [api.client.post("/v1/jobs", json={"type": "generate", "model_id": model},
                           headers=auth(token)).json()["job_id"] for _ in range(3)]
    ids.append(api.client.post("/v1/jobs", json={"type": "pretrain", "dataset_id": public},
                               headers=auth(token)).json()["job_id"])
    seen: list[str] = []
    cursor = None
    for _ in range(5):
        url = "/v1/jobs?limit=3" + (f"&cursor={cursor}" if cursor else "")
        page = api.client.get(url, headers=auth(token)).json()
        seen += [j["job_id"] for j in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(ids))  # newest first, each once
    gen = api.client.get("/v1/jobs?type=generate", headers=auth(token)).json()["items"]
    assert {j["job_id"] for j in gen} == set(ids[:3])
    api.client.post(f"/v1/jobs/{ids[0]}/cancel", headers=auth(token))
    cancelled = api.client.get("/v1/jobs?state=cancelled", headers=auth(token)).json()["items"]
    assert [j["job_id"] for j in cancelled] == [ids[0]]
    bad = api.client.get("/v1/jobs?cursor=%%%", headers=auth(token))
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_request"


def test_cancel_of_a_queued_job_closes_the_reservation(api: Api) -> None:
    token, _, private, model = _setup(api)
    job = api.finetune(token, private, model, epsilon=4.0).json()
    r = api.client.post(f"/v1/jobs/{job['job_id']}/cancel", headers=auth(token))
    assert r.status_code == 200 and r.json()["state"] == "cancelled"
    assert api.ledger.closed == [(job["privacy"]["reservation_id"], "cancelled")]
    again = api.client.post(f"/v1/jobs/{job['job_id']}/cancel", headers=auth(token))
    assert again.status_code == 409 and again.json()["code"] == "invalid_transition"
    claim = api.worker(f"{job['job_id']}/claim", {"attempt": 1, "worker_id": "w"})
    assert claim.status_code == 409 and claim.json()["code"] == "claim_refused"


def test_cancel_of_a_running_job_asks_the_worker(api: Api) -> None:
    token, _, private, model = _setup(api)
    job_id = api.finetune(token, private, model).json()["job_id"]
    assert api.worker(f"{job_id}/claim", {"attempt": 1, "worker_id": "w"}).status_code == 200
    r = api.client.post(f"/v1/jobs/{job_id}/cancel", headers=auth(token))
    assert r.json()["state"] == "cancelling" and api.ledger.closed == []
    beat = api.worker(f"{job_id}/heartbeat", {"attempt": 1, "step": 2, "total": 6})
    assert beat.json() == {"cancel_requested": True, "state": "cancelling"}
    done = api.worker(f"{job_id}/transition", {"attempt": 1, "to_state": "cancelled"})
    assert done.status_code == 200 and done.json()["state"] == "cancelled"


def test_claim_fencing_and_stale_heartbeats(api: Api) -> None:
    token, _, private, model = _setup(api)
    job_id = api.finetune(token, private, model).json()["job_id"]
    wrong = api.worker(f"{job_id}/claim", {"attempt": 2, "worker_id": "w"})
    assert wrong.status_code == 409 and wrong.json()["code"] == "claim_refused"
    claim = api.worker(f"{job_id}/claim", {"attempt": 1, "worker_id": "w"})
    assert claim.status_code == 200, claim.text
    body = claim.json()
    assert body["type"] == "finetune" and body["attempt"] == 1
    assert body["dataset"]["object_key"] == f"private/datasets/{private}/data.npz"
    assert body["dataset"]["declared_size"] == 12 and body["dataset"]["class_names"] == [
        "x", "y", "z"]
    assert body["base_model"]["model_id"] == model and body["reservation_id"]
    assert body["resume_checkpoint_key"] is None and body["lease_ttl_s"] == 60
    double = api.worker(f"{job_id}/claim", {"attempt": 1, "worker_id": "w2"})
    assert double.status_code == 409 and double.json()["code"] == "claim_refused"
    stale = api.worker(f"{job_id}/heartbeat", {"attempt": 2, "step": 1, "total": 6})
    assert stale.status_code == 409 and stale.json()["code"] == "stale_attempt"
    ok = api.worker(f"{job_id}/heartbeat", {"attempt": 1, "step": 3, "total": 6,
                                            "epsilon_so_far": 0.5, "eta_s": 12.0})
    assert ok.json() == {"cancel_requested": False, "state": "running"}
    job = api.client.get(f"/v1/jobs/{job_id}", headers=auth(token)).json()
    assert job["progress"] == {"step": 3, "total": 6, "epsilon_so_far": 0.5, "eta_s": 12.0,
                               "message": None}
    bad = api.worker(f"{job_id}/transition", {"attempt": 1, "to_state": "queued"})
    assert bad.status_code == 409 and bad.json()["code"] == "invalid_transition"


def test_full_finetune_lifecycle_and_lineage(api: Api) -> None:
    token, _, private, model = _setup(api)
    job_id = api.finetune(token, private, model, epsilon=2.0).json()["job_id"]
    api.worker(f"{job_id}/claim", {"attempt": 1, "worker_id": "w"})
    ckpt = api.worker(f"{job_id}/artifacts", {
        "attempt": 1, "kind": "checkpoint", "object_key": f"checkpoints/{job_id}/step-00000004.tar",
        "sha256": "a" * 64, "size": 10, "checkpoint_step": 4})
    assert ckpt.status_code == 201
    stats = api.worker(f"{job_id}/artifacts", {
        "attempt": 1, "kind": "private_stats", "object_key": f"owner/{job_id}/private-stats-1.json",
        "sha256": "b" * 64, "size": 10, "metadata": {"loss_mean": 0.3}})
    assert stats.status_code == 201
    leak = api.worker(f"{job_id}/artifacts", {
        "attempt": 1, "kind": "corpus", "object_key": f"corpora/{job_id}/corpus.zip",
        "sha256": "c" * 64, "size": 10, "metadata": {"grad_norm": 1.0}})
    assert leak.status_code == 400
    produced = api.worker(f"{job_id}/artifacts", {
        "attempt": 1, "kind": "model", "object_key": f"models/{job_id}/model.tar",
        "sha256": "d" * 64, "size": 10, "metadata": {"job_epsilon": 1.9, "rng": "test"}})
    assert produced.status_code == 201 and produced.json()["model_id"]
    done = api.worker(f"{job_id}/transition", {"attempt": 1, "to_state": "succeeded",
                                               "result": {"job_epsilon": 1.9, "loss": 0.1}})
    assert done.json()["state"] == "succeeded"
    retry = api.worker(f"{job_id}/transition", {"attempt": 1, "to_state": "succeeded"})
    assert retry.status_code == 200  # idempotent
    new_model = api.client.get(f"/v1/models/{produced.json()['model_id']}",
                               headers=auth(token)).json()
    assert new_model["dp"] is True and new_model["job_ids"] == [job_id]
    assert new_model["dataset_id"] == private and new_model["job_epsilon"] == 1.9
    assert new_model["publishable"] is False and new_model["delta"] is not None
    job = api.client.get(f"/v1/jobs/{job_id}", headers=auth(token)).json()
    assert job["result"] == {"job_epsilon": 1.9}
    assert {a["kind"] for a in job["artifacts"]} == {"checkpoint", "private_stats", "model"}
    assert {k for k in _keys(job) if any(f in k for f in FORBIDDEN_KEYS)} == set()
    art = api.client.get(f"/v1/artifacts/{stats.json()['artifact_id']}", headers=auth(token))
    assert art.json()["owner_only"] is True and art.json()["non_dp"] is True
    # A model trained with the test-injected generator can never be published.
    gen = api.client.post("/v1/jobs", headers=auth(token), json={
        "type": "generate", "model_id": produced.json()["model_id"], "samples_per_class": 2})
    assert gen.status_code == 409 and gen.json()["code"] == "not_publishable"


def test_job_records_and_metrics_never_carry_private_statistics(api: Api) -> None:
    token, _, private, model = _setup(api)
    job_id = api.finetune(token, private, model).json()["job_id"]
    api.worker(f"{job_id}/claim", {"attempt": 1, "worker_id": "w"})
    api.worker(f"{job_id}/heartbeat", {"attempt": 1, "step": 1, "total": 6})
    api.worker(f"{job_id}/transition", {"attempt": 1, "to_state": "failed",
                                        "error_code": "diverged",
                                        "result": {"loss": 9.0, "grad_norm": 3.0,
                                                   "clip_fraction": 0.5, "steps_done": 1}})
    job = api.client.get(f"/v1/jobs/{job_id}", headers=auth(token)).json()
    listing = api.client.get("/v1/jobs", headers=auth(token)).json()
    for document in (job, listing):
        bad = {k for k in _keys(document) if any(f in k.lower() for f in FORBIDDEN_KEYS)}
        assert bad == set()
        assert "9.0" not in json.dumps(document["result"] if "result" in document else {})
    assert job["error"] == {"code": "diverged", "message": None}
    assert job["result"] == {"steps_done": 1}
    metrics = api.client.get("/metrics").text
    assert 'dpsynth_api_jobs{state="failed"} 1.0' in metrics
    assert 'route="/v1/jobs/{job_id}"' in metrics and job_id not in metrics
    for word in FORBIDDEN_KEYS:
        assert word not in metrics.lower()


def test_a_job_carries_the_name_its_spec_gives_it(api: Api) -> None:
    token, public, _, _ = _setup(api)
    r = api.client.post("/v1/jobs", json={"type": "pretrain", "dataset_id": public,
                                          "name": "first pretrain"}, headers=auth(token))
    assert r.status_code == 201 and r.json()["name"] == "first pretrain"
    job_id = r.json()["job_id"]
    assert api.client.get(f"/v1/jobs/{job_id}", headers=auth(token)).json()["name"] == \
        "first pretrain"
    listed = api.client.get("/v1/jobs", headers=auth(token)).json()["items"]
    assert [j["name"] for j in listed if j["job_id"] == job_id] == ["first pretrain"]
    r = api.client.post("/v1/jobs", json={"type": "pretrain", "dataset_id": public},
                        headers=auth(token))
    assert r.json()["name"] is None
    r = api.client.post("/v1/jobs", json={"type": "pretrain", "dataset_id": public,
                                          "name": "two\nlines"}, headers=auth(token))
    assert r.status_code == 422 and r.json()["code"] == "invalid_spec"


def test_the_dry_run_warns_when_a_finetune_would_relearn_the_base_models_classes(
        api: Api) -> None:
    _, token = api.tenant()
    model = api.model(token)  # pretrained on classes "a" and "b"
    r = api.upload(token, b.digits_npz(12, k=2, size=10), {  # other images than below
        "name": "ab", "visibility": "private", "epsilon_limit": 10.0, "declared_size": 12,
        "label_domain": ["a", "b"]}, filename="d.npz")
    assert r.status_code == 201, r.text
    same = r.json()["dataset_id"]
    (warning,) = api.finetune(token, same, model, dry_run=True).json()["warnings"]
    assert "training.class_map" in warning and '"a": "a"' in warning
    other = api.private_dataset(token)  # classes x, y, z: a new table is what is meant
    assert api.finetune(token, other, model, dry_run=True).json()["warnings"] == []
    spec = {"type": "finetune", "dataset_id": same, "base_model_id": model,
            "privacy": {"target_epsilon": 1.0},
            "training": {"expected_batch_size": 4, "epochs": 2,
                         "class_map": {"a": "a", "b": "b"}}}
    kept = api.client.post("/v1/jobs?dry_run=true", json=spec, headers=auth(token))
    assert kept.status_code == 200, kept.text
    assert kept.json()["warnings"] == []
