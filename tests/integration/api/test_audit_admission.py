"""Admitting an ``audit`` job (issue 19): a white-box one-run audit of a finetune job's
DP-SGD on a PUBLIC stand-in dataset, and what its claim carries (in-memory ledger).

* an audit of one of the tenant's finetune jobs is accepted: no reservation, no ledger call,
  its result names the audited job and copies the claim it tests (σ, q, steps, batch, δ,
  job ε); a dry run shows the same without storing anything;
* refused: a private stand-in (422 ``visibility_mismatch``), a stand-in with another class
  count, an audited job that is not a whole-dataset DP-SGD finetune (422 ``invalid_spec``),
  another tenant's or an unknown job (404);
* the claim carries the audited job's reservation and public terms, never the object of
  the audited (private) dataset, and re-checks at claim time that the stand-in is public.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from dpsynth_api.jobs.audits import family_of
from dpsynth_api.tables import Dataset
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from tests.integration.api.conftest import Api, auth
from tests.unit.api import builders as b

CLAIMED = ("noise_multiplier", "sample_rate", "steps", "expected_batch_size", "delta",
           "job_epsilon")
SIZES = {"x": 5, "y": 4, "z": 6}  # the 12 records are 4 per class


def _post(api: Api, token: str, spec: dict[str, Any], *, dry: bool = False) -> Any:
    return api.client.post("/v1/jobs" + ("?dry_run=true" if dry else ""), json=spec,
                           headers=auth(token))


def _audit(api: Api, token: str, job_id: str, stand_in: str, *, dry: bool = False,
           **spec: Any) -> Any:
    return _post(api, token, {"type": "audit", "job_id": job_id,
                              "stand_in_dataset_id": stand_in, **spec}, dry=dry)


def _finetune(api: Api, token: str) -> tuple[str, str, str]:
    """A finetune job of the tenant: (job id, its private dataset, its base model)."""
    dataset = api.private_dataset(token)
    model = api.model(token)
    r = api.finetune(token, dataset, model)
    assert r.status_code == 201, r.text
    return str(r.json()["job_id"]), dataset, model


def _code(r: Any) -> tuple[int, str]:
    return r.status_code, r.json().get("code")


def test_an_audit_of_a_finetune_is_admitted_without_any_reservation(api: Api) -> None:
    _, token = api.tenant()
    job_id, private, model = _finetune(api, token)
    finetune = api.client.get(f"/v1/jobs/{job_id}", headers=auth(token)).json()
    stand_in = api.public_dataset(token, {"a": 3, "b": 3, "c": 3})
    reservations, sent = dict(api.ledger.reservations), list(api.sender.sent)
    # the dry run: the plan, nothing stored, reserved or sent
    plan = _audit(api, token, job_id, stand_in, dry=True)
    assert plan.status_code == 200, plan.text
    body = plan.json()
    assert body["dry_run"] is True and body["type"] == "audit"
    assert body["dataset_id"] == stand_in and body["model_id"] == model
    assert body["plan"]["epsilon_charged"] == 0.0
    assert body["plan"]["reads_private_data"] is False
    assert body["spec"]["mode"] == "white_box" and body["spec"]["canaries"] == 1000
    assert api.ledger.reservations == reservations and api.sender.sent == sent
    # the submission
    r = _audit(api, token, job_id, stand_in, canaries=200, seed=3)
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["type"] == "audit" and job["state"] == "queued"
    assert job["dataset_id"] == stand_in and job["model_id"] == model
    assert job["privacy"]["epsilon_charged"] == 0.0
    audit = job["result"]["audit"]
    assert audit["audited_job_id"] == job_id and audit["mode"] == "white_box"
    assert audit["claimed"] == {k: finetune["privacy"][k] for k in CLAIMED}
    assert audit["claimed"]["noise_multiplier"] is not None
    assert audit["claimed"]["steps"] == finetune["privacy"]["steps"] > 0
    assert api.ledger.reservations == reservations  # no reservation, nothing charged
    assert api.ledger.closed == []
    assert [s[0] for s in api.sender.sent[len(sent):]] == [job["job_id"]]
    # the reader's view keeps the api's block
    again = api.client.get(f"/v1/jobs/{job['job_id']}", headers=auth(token)).json()
    assert again["result"]["audit"] == audit
    # the claim: the audited job's settings and public terms, never its dataset's object
    claim = api.worker(f"{job['job_id']}/claim", {"attempt": 1, "worker_id": "w"})
    assert claim.status_code == 200, claim.text
    c = claim.json()
    target = c["audit_target"]
    assert target["job_id"] == job_id
    assert target["reservation_id"] == finetune["privacy"]["reservation_id"]
    assert target["reservation_id"] and c["reservation_id"] is None
    assert target["spec"] == finetune["spec"]
    assert target["dataset_id"] == private and target["class_names"] == ["x", "y", "z"]
    assert target["declared_size"] == 12 and target["privacy_unit"] == "image"
    assert "object_key" not in target
    assert f"private/datasets/{private}" not in claim.text
    assert c["dataset"]["dataset_id"] == stand_in and c["dataset"]["visibility"] == "public"
    assert c["base_model"]["model_id"] == model
    # the model an audit trains is the audit's: it registers no model (nor any artifact)
    model_out = api.worker(f"{job['job_id']}/artifacts", {
        "attempt": 1, "kind": "model", "object_key": f"models/{job['job_id']}/model.tar",
        "sha256": "f" * 64, "size": 10, "metadata": {}})
    assert _code(model_out) == (400, "invalid_request"), model_out.text
    # before it ends, the finetune's view says "not audited"
    shown = api.client.get(f"/v1/jobs/{job_id}", headers=auth(token)).json()["audit"]
    family = family_of(finetune["spec"])
    assert shown == {**shown, "status": "not_audited", "recipe_family": family,
                     "audit_job_id": None}
    # the worker's result is kept beside the api's block; it cannot replace the block
    result = {"verdict": "consistent", "epsilon_lower_bound": 0.3, "claimed_epsilon": 2.0,
              "max_certifiable_epsilon": 4.2,
              "key": {"recipe_family": family, "engine": "BookKeepingEngine",
                      "device": "cpu", "world_size": 1, "code_version": "0.1.0"}}
    done = api.worker(f"{job['job_id']}/transition", {
        "attempt": 1, "to_state": "succeeded",
        "result": {"audit_result": result, "audit": {"forged": True}}})
    assert done.status_code == 200, done.text
    final = api.client.get(f"/v1/jobs/{job['job_id']}", headers=auth(token)).json()
    assert final["result"]["audit"] == audit
    assert final["result"]["audit_result"] == result
    assert final["audit"] is None  # only a finetune's view shows its audit
    # the finetune's view now shows the audit: its verdict, date, engine and version
    shown = api.client.get(f"/v1/jobs/{job_id}", headers=auth(token)).json()["audit"]
    assert shown["status"] == "audited" and shown["audit_job_id"] == job["job_id"]
    assert shown["same_job"] is True and shown["verdict"] == "consistent"
    assert shown["engine"] == "BookKeepingEngine" and shown["code_version"] == "0.1.0"
    assert shown["epsilon_lower_bound"] == 0.3 and shown["finished_at"]
    # another finetune of the same recipe family shows it too, as another job's audit
    again = api.finetune(token, private, model)
    assert again.status_code == 201, again.text
    other = again.json()["job_id"]
    shown = api.client.get(f"/v1/jobs/{other}", headers=auth(token)).json()["audit"]
    assert shown["status"] == "audited" and shown["same_job"] is False
    assert shown["audited_job_id"] == job_id
    # ... and a list never computes it
    listed = api.client.get("/v1/jobs", headers=auth(token)).json()["items"]
    assert all(item["audit"] is None for item in listed)


def test_the_stand_in_must_be_public_with_as_many_classes(api: Api) -> None:
    _, token = api.tenant()
    job_id, private, _ = _finetune(api, token)
    two = api.public_dataset(token, {"a": 3, "b": 3})
    reservations = dict(api.ledger.reservations)
    for dry in (False, True):
        r = _audit(api, token, job_id, private, dry=dry)
        assert _code(r) == (422, "visibility_mismatch"), r.text
        assert "never read private data" in r.json()["detail"]
        r = _audit(api, token, job_id, two, dry=dry)
        assert _code(r) == (422, "invalid_spec"), r.text
        assert "has 2 classes" in r.json()["detail"] and "has 3" in r.json()["detail"]
    assert _code(_audit(api, token, job_id, "ds_" + "0" * 32)) == (404, "not_found")
    assert api.ledger.reservations == reservations


def test_a_black_box_audits_canaries_fit_in_half_the_audited_population(api: Api) -> None:
    _, token = api.tenant()
    job_id, _, _ = _finetune(api, token)
    privacy = api.client.get(f"/v1/jobs/{job_id}", headers=auth(token)).json()["privacy"]
    half = round(privacy["expected_batch_size"] / privacy["sample_rate"]) // 2
    stand_in = api.public_dataset(token, {"a": 3, "b": 3, "c": 3})
    assert half < 10  # N̂ = 12 here: no black-box audit fits, a white-box one does
    for dry in (False, True):
        r = _audit(api, token, job_id, stand_in, dry=dry, mode="black_box", canaries=10)
        assert _code(r) == (422, "invalid_spec"), r.text
        assert f"at most {half} canaries" in r.json()["detail"]
    assert _audit(api, token, job_id, stand_in, canaries=10).status_code == 201


def test_only_a_whole_dataset_dp_sgd_finetune_of_the_tenant_is_audited(api: Api) -> None:
    _, token = api.tenant()
    job_id, _, model = _finetune(api, token)
    stand_in = api.public_dataset(token, {"a": 3, "b": 3, "c": 3})
    generate = _post(api, token, {"type": "generate", "model_id": model,
                                  "samples_per_class": 1})
    assert generate.status_code == 201, generate.text
    r = _audit(api, token, generate.json()["job_id"], stand_in)
    assert _code(r) == (422, "invalid_spec") and "generate job" in r.json()["detail"]
    # an audit of an audit
    audit = _audit(api, token, job_id, stand_in)
    assert audit.status_code == 201, audit.text
    r = _audit(api, token, audit.json()["job_id"], stand_in)
    assert _code(r) == (422, "invalid_spec") and "audit job" in r.json()["detail"]
    # a finetune with a central-image release
    sized = api.upload(token, b.digits_npz(12, k=3, size=10), {
        "name": "sized", "visibility": "private", "epsilon_limit": 10.0,
        "label_domain": ["x", "y", "z"], "declared_size": 12, "class_sizes": SIZES},
        filename="d.npz")
    assert sized.status_code == 201, sized.text
    sized = sized.json()["dataset_id"]
    # a per-label finetune is admitted: its claim carries every class's run
    per_label = _post(api, token, {"type": "finetune", "dataset_id": sized,
                                   "base_model_id": model, "privacy": {"target_epsilon": 2.0},
                                   "training": {"per_label": True, "expected_batch_size": 4,
                                                "epochs": 1}})
    assert per_label.status_code == 201, per_label.text
    admitted = _audit(api, token, per_label.json()["job_id"], stand_in)
    assert admitted.status_code == 201, admitted.text
    claimed = admitted.json()["result"]["audit"]["claimed"]
    assert set(claimed["per_label"]) == {"x", "y", "z"}
    assert all(run["noise_multiplier"] > 0 for run in claimed["per_label"].values())
    # ... on the class asked for (one of its runs), by default its largest-epsilon one
    asked = _audit(api, token, per_label.json()["job_id"], stand_in, audited_class="y")
    assert asked.status_code == 201, asked.text
    r = _audit(api, token, per_label.json()["job_id"], stand_in, audited_class="w")
    assert _code(r) == (422, "invalid_spec") and r.json()["classes"] == ["x", "y", "z"]
    r = _audit(api, token, job_id, stand_in, audited_class="a")
    assert _code(r) == (422, "invalid_spec") and "whole-dataset" in r.json()["detail"]
    cases = {
        "its own Gaussian mechanism": {
            "expected_batch_size": 4, "epochs": 1,
            "central_images": {"target_epsilon": 0.5, "downsample": 2, "warmup_steps": 10}}}
    for why, training in cases.items():
        made = _post(api, token, {"type": "finetune", "dataset_id": sized,
                                  "base_model_id": model, "privacy": {"target_epsilon": 2.0},
                                  "training": training})
        assert made.status_code == 201, (why, made.text)
        for dry in (False, True):
            r = _audit(api, token, made.json()["job_id"], stand_in, dry=dry)
            assert _code(r) == (422, "invalid_spec"), (why, r.text)
            assert why in r.json()["detail"], r.text
    # another tenant's finetune and an unknown job: 404, as for any other id
    _, other = api.tenant("other")
    theirs, _, _ = _finetune(api, other)
    assert _code(_audit(api, token, theirs, stand_in)) == (404, "not_found")
    assert _code(_audit(api, token, "job_" + "0" * 32, stand_in)) == (404, "not_found")
    # ... and the other tenant cannot use this tenant's stand-in either
    assert _code(_audit(api, other, theirs, stand_in)) == (404, "not_found")


def test_the_claim_rechecks_that_the_stand_in_is_public(api: Api) -> None:
    _, token = api.tenant()
    job_id, _, _ = _finetune(api, token)
    stand_in = api.public_dataset(token, {"a": 3, "b": 3, "c": 3})
    audit = _audit(api, token, job_id, stand_in)
    assert audit.status_code == 201, audit.text
    engine = create_engine(api.settings.database.url)
    try:
        with Session(engine) as session:  # no endpoint makes a dataset private: edit the row
            row = session.get(Dataset, stand_in)
            assert row is not None
            row.visibility = "private"
            session.commit()
    finally:
        engine.dispose()
    claim = api.worker(f"{audit.json()['job_id']}/claim", {"attempt": 1, "worker_id": "w"})
    assert _code(claim) == (422, "visibility_mismatch"), claim.text


def _subject_finetune(api: Api, token: str, subjects: int) -> str:
    """A finetune of a private subject-level dataset of ``subjects`` subjects (two images
    each; declared size = the subject count): its job id."""
    images = np.random.default_rng(0).integers(0, 256, size=(2 * subjects, 8, 8),
                                               dtype=np.uint8)
    owner = np.repeat(np.arange(subjects), 2)
    r = api.upload(token, b.npz_bytes(images=images, labels=owner % 3, subjects=owner), {
        "name": "subj", "visibility": "private", "epsilon_limit": 10.0,
        "label_domain": ["x", "y", "z"], "privacy_unit": "subject",
        "declared_size": subjects}, filename="d.npz")
    assert r.status_code == 201, r.text
    made = _post(api, token, {"type": "finetune", "dataset_id": r.json()["dataset_id"],
                              "base_model_id": api.model(token),
                              "privacy": {"target_epsilon": 2.0},
                              "training": {"expected_batch_size": 4, "epochs": 1}})
    assert made.status_code == 201, made.text
    return str(made.json()["job_id"])


def test_a_subject_level_finetune_is_audited_with_its_unit(api: Api) -> None:
    _, token = api.tenant()
    job_id = _subject_finetune(api, token, 12)
    stand_in = api.public_dataset(token, {"a": 3, "b": 3, "c": 3})
    audit = _audit(api, token, job_id, stand_in)
    assert audit.status_code == 201, audit.text
    claim = api.worker(f"{audit.json()['job_id']}/claim", {"attempt": 1, "worker_id": "w"})
    assert claim.status_code == 200, claim.text
    target = claim.json()["audit_target"]
    # the worker gives the stand-in subjects of max_images_per_subject images each
    assert target["privacy_unit"] == "subject" and target["declared_size"] == 12
    assert target["spec"]["training"]["max_images_per_subject"] == 8


def test_a_black_box_audit_of_a_subject_level_finetune_has_canary_subjects(api: Api) -> None:
    """Each canary is a subject (the run's privacy unit): at most half of N̂ SUBJECTS."""
    _, token = api.tenant()
    job_id = _subject_finetune(api, token, 40)
    privacy = api.client.get(f"/v1/jobs/{job_id}", headers=auth(token)).json()["privacy"]
    half = round(privacy["expected_batch_size"] / privacy["sample_rate"]) // 2
    assert half == 20  # N̂ = 40 subjects
    stand_in = api.public_dataset(token, {"a": 3, "b": 3, "c": 3})
    plan = _audit(api, token, job_id, stand_in, dry=True, mode="black_box", canaries=half)
    assert plan.status_code == 200, plan.text
    assert plan.json()["spec"]["mode"] == "black_box"
    r = _audit(api, token, job_id, stand_in, mode="black_box", canaries=half)
    assert r.status_code == 201, r.text
    assert r.json()["result"]["audit"]["mode"] == "black_box"
    for dry in (False, True):
        r = _audit(api, token, job_id, stand_in, dry=dry, mode="black_box",
                   canaries=half + 1)
        assert _code(r) == (422, "invalid_spec"), r.text
        assert f"N̂ subjects: at most {half} canaries" in r.json()["detail"]
