"""The latest matching audit on a DP model's view and in an evaluate claim (issue 19,
item 2), against a real PostgreSQL (in-memory ledger).

* ``GET /v1/models/{id}`` of a model a finetune produced shows that finetune's latest audit
  (of it or of another finetune of its recipe family): "not_audited", then the audit once
  an audit job succeeded; an uploaded model shows none; the list shows the same per item,
  in two queries for the whole page;
* an evaluate claim's corpus carries the audit of the finetune behind the corpus's model
  as of the claim ("not_audited" before any, none for an uploaded model's corpus).
"""

from __future__ import annotations

import io
import zipfile
from typing import Any

from dpsynth_api.jobs.audits import family_of, model_audits
from dpsynth_api.tables import Job, Model
from dpsynth_shared import __version__
from sqlalchemy import create_engine, event, select
from sqlalchemy.orm import Session

from tests.integration.api.conftest import Api, auth
from tests.unit.api import builders as b

HOLDOUT_KEY = "audit-views-holdout-key-0123456789"


def _claim(api: Api, job_id: str) -> dict[str, Any]:
    r = api.worker(f"{job_id}/claim", {"attempt": 1, "worker_id": "w"})
    assert r.status_code == 200, r.text
    return dict(r.json())


def _dp_model(api: Api, token: str, dataset: str | None = None) -> tuple[str, dict[str, Any]]:
    """A DP model produced by a finetune the worker ran: (model id, the finetune's view)."""
    job = api.finetune(token, dataset or api.private_dataset(token), api.model(token))
    assert job.status_code == 201, job.text
    job_id = job.json()["job_id"]
    _claim(api, job_id)
    model = api.worker(f"{job_id}/artifacts", {
        "attempt": 1, "kind": "model", "object_key": f"models/{job_id}/model.tar",
        "sha256": "d" * 64, "size": 10, "metadata": {"job_epsilon": 0.9}})
    assert model.status_code == 201, model.text
    return str(model.json()["model_id"]), job.json()


def _audit_succeeds(api: Api, token: str, finetune: dict[str, Any], *, device: str = "cpu",
                    code_version: str = "0.1.0", world_size: int = 1) -> str:
    """An audit job of ``finetune`` that the worker ran to success: its id."""
    stand_in = api.public_dataset(token, {"a": 3, "b": 3, "c": 3})
    r = api.client.post("/v1/jobs", headers=auth(token), json={
        "type": "audit", "job_id": finetune["job_id"], "stand_in_dataset_id": stand_in,
        "canaries": 100})
    assert r.status_code == 201, r.text
    audit_id = str(r.json()["job_id"])
    _claim(api, audit_id)
    result = {"verdict": "consistent", "mode": "white_box", "epsilon_lower_bound": 0.3,
              "claimed_epsilon": 2.0, "max_certifiable_epsilon": 4.2,
              "key": {"recipe_family": family_of(finetune["spec"]),
                      "engine": "BookKeepingEngine", "device": device,
                      "world_size": world_size,
                      "code_version": code_version}}
    done = api.worker(f"{audit_id}/transition", {"attempt": 1, "to_state": "succeeded",
                                                 "result": {"audit_result": result}})
    assert done.status_code == 200, done.text
    return audit_id


def _model(api: Api, token: str, model_id: str) -> dict[str, Any]:
    r = api.client.get(f"/v1/models/{model_id}", headers=auth(token))
    assert r.status_code == 200, r.text
    return dict(r.json())


def _listed(api: Api, token: str) -> dict[str, Any]:
    r = api.client.get("/v1/models", headers=auth(token))
    assert r.status_code == 200, r.text
    return {item["model_id"]: item["audit"] for item in r.json()["items"]}


def _corpus(api: Api, token: str, model_id: str) -> str:
    """A generate job's corpus artifact (a real zip) of ``model_id``."""
    r = api.client.post("/v1/jobs", headers=auth(token), json={
        "type": "generate", "model_id": model_id, "samples_per_class": 1})
    assert r.status_code == 201, r.text
    job_id = r.json()["job_id"]
    _claim(api, job_id)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("x/0.png", b.png(value=1))
        zf.writestr("manifest.json", "{}")
    key = f"corpora/{job_id}/corpus.zip"
    info = api.store.put_bytes(key, buf.getvalue())
    art = api.worker(f"{job_id}/artifacts", {"attempt": 1, "kind": "corpus", "object_key": key,
                                             "sha256": info.sha256, "size": info.size})
    assert art.status_code == 201, art.text
    api.worker(f"{job_id}/transition", {"attempt": 1, "to_state": "succeeded"})
    return str(art.json()["artifact_id"])


def _evaluate_claim(api: Api, token: str, corpus: str, reference: str) -> dict[str, Any]:
    r = api.client.post("/v1/jobs", headers=auth(token), json={
        "type": "evaluate", "corpus_artifact_id": corpus, "dataset_id": reference})
    assert r.status_code == 201, r.text
    return _claim(api, r.json()["job_id"])


def _reference(api: Api, token: str) -> str:
    """A public reference dataset with held-out records (what evaluate reads)."""
    r = api.upload(token, b.zip_bytes(b.image_folder({"x": 4, "y": 4, "z": 4})), {
        "name": "ref", "visibility": "public", "holdout_fraction": 0.25,
        "holdout_key": HOLDOUT_KEY})
    assert r.status_code == 201, r.text
    return str(r.json()["dataset_id"])


def test_a_dp_models_view_shows_its_finetunes_audit(api: Api) -> None:
    _, token = api.tenant()
    model_id, finetune = _dp_model(api, token)
    uploaded = api.model(token)
    family = family_of(finetune["spec"])
    shown = _model(api, token, model_id)
    assert shown["produced_by_job_id"] == finetune["job_id"] and shown["dp"] is True
    assert shown["audit"] == {**shown["audit"], "status": "not_audited",
                              "recipe_family": family, "audit_job_id": None}
    assert _model(api, token, uploaded)["audit"] is None  # no finetune, no DP claim
    listed = _listed(api, token)
    assert listed[model_id]["status"] == "not_audited" and listed[uploaded] is None
    audit_id = _audit_succeeds(api, token, finetune)
    audit = _model(api, token, model_id)["audit"]
    assert audit["status"] == "audited" and audit["audit_job_id"] == audit_id
    assert audit["same_job"] is True and audit["audited_job_id"] == finetune["job_id"]
    assert audit["verdict"] == "consistent" and audit["mode"] == "white_box"
    assert audit["epsilon_lower_bound"] == 0.3 and audit["claimed_epsilon"] == 2.0
    assert audit["max_certifiable_epsilon"] == 4.2 and audit["engine"] == "BookKeepingEngine"
    assert audit["device"] == "cpu" and audit["code_version"] == "0.1.0"
    assert audit["finished_at"]
    # the finetune's own view and the model's agree
    job_view = api.client.get(f"/v1/jobs/{finetune['job_id']}", headers=auth(token)).json()
    assert job_view["audit"] == audit
    assert _listed(api, token)[model_id] == audit
    # another tenant's audit of the same family never shows here
    _, other = api.tenant("other")
    other_model, _ = _dp_model(api, other)
    assert _model(api, other, other_model)["audit"]["status"] == "not_audited"


def test_an_audit_of_the_finetunes_own_key_is_preferred_and_a_mismatch_is_said(
        api: Api) -> None:
    """Audits are keyed by device kind and code version too: a finetune that ran on a GPU
    shows the newest GPU audit of this code version even when a CPU audit is newer; with
    none of its key, the newest of its family, marked ``key_matches: false``."""
    _, token = api.tenant()
    model_id, finetune = _dp_model(api, token)
    engine = create_engine(api.settings.database.url)
    try:
        with Session(engine) as session:
            job = session.get(Job, finetune["job_id"])
            assert job is not None
            job.result = {**(job.result or {}), "device": "cuda"}
            session.commit()
    finally:
        engine.dispose()
    on_cpu = _audit_succeeds(api, token, finetune, code_version=__version__)
    audit = _model(api, token, model_id)["audit"]
    assert audit["audit_job_id"] == on_cpu and audit["key_matches"] is False
    assert audit["finetune_device"] == "cuda" and audit["device"] == "cpu"
    on_gpu = _audit_succeeds(api, token, finetune, device="cuda", code_version=__version__)
    _audit_succeeds(api, token, finetune, code_version=__version__)  # newer, but on a CPU
    _audit_succeeds(api, token, finetune, device="cuda", code_version="0.0.1")  # old code
    for shown in (_model(api, token, model_id)["audit"],
                  api.client.get(f"/v1/jobs/{finetune['job_id']}",
                                 headers=auth(token)).json()["audit"]):
        assert shown["audit_job_id"] == on_gpu and shown["key_matches"] is True


def test_an_audit_on_the_finetunes_ranks_is_preferred(api: Api) -> None:
    """A finetune that trained on two GPUs shows an audit run on two ranks (the
    distributed mechanism it ran) over a newer one-rank audit; with only one-rank audits it
    shows the newest, marked ``key_matches: false`` with both rank counts."""
    _, token = api.tenant()
    model_id, finetune = _dp_model(api, token)
    # the worker's own transition: the device kind and ranks pass the result allow-list
    done = api.worker(f"{finetune['job_id']}/transition", {
        "attempt": 1, "to_state": "succeeded",
        "result": {"model_id": model_id, "device": "cuda", "world_size": 2}})
    assert done.status_code == 200, done.text
    stored = api.client.get(f"/v1/jobs/{finetune['job_id']}", headers=auth(token)).json()
    assert (stored["result"]["device"], stored["result"]["world_size"]) == ("cuda", 2)
    one_rank = _audit_succeeds(api, token, finetune, device="cuda", code_version=__version__)
    audit = _model(api, token, model_id)["audit"]
    assert audit["audit_job_id"] == one_rank and audit["key_matches"] is False
    assert (audit["world_size"], audit["finetune_world_size"]) == (1, 2)
    two = _audit_succeeds(api, token, finetune, device="cuda", code_version=__version__,
                          world_size=2)
    _audit_succeeds(api, token, finetune, device="cuda", code_version=__version__)  # newer
    shown = api.client.get(f"/v1/jobs/{finetune['job_id']}", headers=auth(token)).json()
    assert shown["audit"]["audit_job_id"] == two and shown["audit"]["key_matches"] is True
    assert _model(api, token, model_id)["audit"]["world_size"] == 2


def test_a_page_of_models_costs_two_queries_for_its_audits(api: Api) -> None:
    _, token = api.tenant()
    private = api.private_dataset(token)
    made = [_dp_model(api, token, private)[0] for _ in range(3)]
    engine = create_engine(api.settings.database.url)
    statements: list[str] = []
    try:
        with Session(engine) as session:
            models = list(session.scalars(select(Model).where(Model.id.in_(made))))
            event.listen(engine, "before_cursor_execute",
                         lambda *args: statements.append(str(args[2])))
            audits = model_audits(session, models)
    finally:
        engine.dispose()
    assert sorted(audits) == sorted(made)
    assert {a.status for a in audits.values()} == {"not_audited"}
    assert len(statements) == 2, statements


def test_the_evaluate_claim_carries_the_audit_as_of_the_claim(api: Api) -> None:
    _, token = api.tenant()
    model_id, finetune = _dp_model(api, token)
    reference = _reference(api, token)
    corpus = _corpus(api, token, model_id)
    before = _evaluate_claim(api, token, corpus, reference)["corpus"]
    assert before["model_id"] == model_id and before["dp"] is True
    assert before["audit"]["status"] == "not_audited"
    assert before["audit"]["recipe_family"] == family_of(finetune["spec"])
    audit_id = _audit_succeeds(api, token, finetune)
    after = _evaluate_claim(api, token, corpus, reference)["corpus"]["audit"]
    assert after["status"] == "audited" and after["audit_job_id"] == audit_id
    assert after["verdict"] == "consistent" and after["code_version"] == "0.1.0"
    assert after == _model(api, token, model_id)["audit"]
    # a corpus of an uploaded (non-DP) model: nothing to audit
    plain = _evaluate_claim(api, token, _corpus(api, token, api.model(token)), reference)
    assert plain["corpus"]["dp"] is False and plain["corpus"]["audit"] is None
