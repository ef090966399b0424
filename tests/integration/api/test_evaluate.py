"""Held-out records at upload, feature_net and evaluate jobs, evaluation reports and corpus
releases, through the api joined to the REAL ledger (issue 5).

* an upload's held-out records are a second npz beside its object, excluded from the
  object, its true size, class counts and N̂, each chosen by a keyed hash of itself (the
  same owner key holds out the same records; issue 13), hashed for overlap; subjects are
  never split;
* feature_net trains on public data only; its model is never a diffusion model;
* evaluate needs a corpus of the tenant, a reference with held-out records, the owner scope
  for a private reference (the ledger records the non-DP read before the job exists), a
  feature network as feature model; its result carries no metric;
* the report endpoints serve report.json / report.html with access checks and a strict CSP;
* every corpus download lists the non-DP evaluations on private data that preceded it.
"""

from __future__ import annotations

import io
import json
import zipfile
from typing import Any

import numpy as np
from dpsynth_api.datasets.overlap import record_hashes
from dpsynth_shared.record_splits import in_first_part

from tests.integration.api.conftest import Api, auth
from tests.unit.api import builders as b

LABELS = ["x", "y", "z"]
HOLDOUT_KEY = "evaluate-holdout-key-0123456789"


def _digits(n: int, *, seed: int = 0, k: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 255, size=(n, 8, 8), dtype=np.uint8)
    return images, np.arange(n) % k


def _private(api: Api, token: str, *, n: int = 30, seed: int = 0, **meta: Any) -> Any:
    images, labels = _digits(n, seed=seed)
    if "holdout_fraction" in meta:  # a fixed key: the same records held out every run
        meta.setdefault("holdout_key", HOLDOUT_KEY)
        meta = {k: v for k, v in meta.items() if v is not None}
    return api.upload(token, b.npz_bytes(images=images, labels=labels), {
        "name": "priv", "visibility": "private", "epsilon_limit": 10.0, "label_domain": LABELS,
        "declared_size": n, **meta}, filename="d.npz")


def _npz(api: Api, key: str) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(api.store._path(key).read_bytes()), allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}


def _row_hashes(images: np.ndarray) -> set[str]:
    return set(record_hashes(images if images.ndim == 4 else images[..., None]))


def _reader(api: Api, name: str = "acme") -> tuple[str, str, str]:
    """A tenant's owner token, a read+submit token (no owner scope) and the tenant id."""
    tenant, owner = api.tenant(name)
    r = api.client.post(f"/v1/tenants/{tenant}/keys", headers=auth(api.admin),
                        json={"scopes": ["read", "submit"], "name": "no-owner"})
    assert r.status_code == 201, r.text
    return owner, r.json()["api_key"], tenant


# -- held-out split at upload ----------------------------------------------------------------

def _held(n: int, fraction: float, *, seed: int = 0) -> np.ndarray:
    """Which of ``_digits(n, seed)`` the upload holds out under HOLDOUT_KEY."""
    images, _ = _digits(n, seed=seed)
    return in_first_part(HOLDOUT_KEY.encode(), record_hashes(images[..., None]), fraction)


def test_holdout_at_upload_is_excluded_from_the_object_sizes_and_budget(
        real_ledger_api: Api) -> None:
    api = real_ledger_api
    owner, reader, _ = _reader(api)
    r = _private(api, owner, holdout_fraction=0.2)
    assert r.status_code == 201, r.text
    ds = r.json()
    mask = _held(30, 0.2)  # each record by its keyed hash: no quota, no stratification
    kept, out = int((~mask).sum()), int(mask.sum())
    assert 0 < out < 30
    assert ds["holdout_fraction"] == 0.2 and ds["holdout_rule"] == "keyed_hash_v1"
    assert "holdout_seed" not in ds and HOLDOUT_KEY not in r.text
    assert ds["true_size"] == kept and ds["holdout_size"] == out and ds["declared_size"] == 30
    _, labels = _digits(30)
    assert ds["class_counts"] == {c: int(((labels == i) & ~mask).sum())
                                  for i, c in enumerate(LABELS)}
    budget = api.ledger.get_budget(ds["dataset_id"])
    assert budget.declared_size == 30
    # the readers' view: fraction and rule, never the held-out size (a true count)
    seen = api.client.get(f"/v1/datasets/{ds['dataset_id']}", headers=auth(reader)).json()
    assert seen["holdout_fraction"] == 0.2 and seen["holdout_rule"] == "keyed_hash_v1"
    assert seen["holdout_size"] is None and seen["true_size"] is None
    assert "holdout_seed" not in seen
    # the training object excludes the held-out records; together they are the upload
    train = _npz(api, f"private/datasets/{ds['dataset_id']}/data.npz")
    held = _npz(api, f"private/datasets/{ds['dataset_id']}/holdout.npz")
    assert train["images"].shape[0] == kept and held["images"].shape[0] == out
    images, _ = _digits(30)
    assert _row_hashes(train["images"]) | _row_hashes(held["images"]) == _row_hashes(images)
    assert not _row_hashes(train["images"]) & _row_hashes(held["images"])
    # the same key holds out the same records (another tenant: the same records would
    # overlap)
    other, _, _ = _reader(api, "other")
    again = _private(api, other, holdout_fraction=0.2).json()
    held_again = _npz(api, f"private/datasets/{again['dataset_id']}/holdout.npz")
    assert _row_hashes(held_again["images"]) == _row_hashes(held["images"])
    # the held-out records are the budget's records: uploading them again overlaps
    back = api.upload(owner, b.npz_bytes(images=held["images"], labels=held["labels"]), {
        "name": "again", "visibility": "private", "epsilon_limit": 1.0,
        "label_domain": LABELS, "declared_size": out}, filename="d.npz")
    assert back.status_code == 409 and back.json()["code"] == "private_data_overlap"
    assert back.json()["overlapping_records"] == out


def test_declared_size_counts_training_units_and_the_key_source_is_recorded(
        real_ledger_api: Api) -> None:
    api = real_ledger_api
    owner, _, _ = _reader(api)
    kept = int((~_held(30, 0.5)).sum())
    small = _private(api, owner, holdout_fraction=0.5, declared_size=kept - 1)
    assert small.status_code == 422 and small.json()["code"] == "invalid_dataset"
    ok = _private(api, owner, holdout_fraction=0.5, declared_size=kept)
    assert ok.status_code == 201, ok.text
    assert ok.json()["declared_size"] == kept and ok.json()["true_size"] == kept
    assert ok.json()["holdout_key_source"] == "owner"
    drawn = _private(api, owner, n=60, seed=9, holdout_fraction=0.5, holdout_key=None)
    assert drawn.status_code == 201 and drawn.json()["holdout_key_source"] == "platform"
    assert _held(2, 0.5, seed=0).all()  # both records held out: none left to train on
    tiny = _private(api, owner, n=2, seed=0, holdout_fraction=0.5)
    assert tiny.status_code == 422 and "at least one" in tiny.json()["detail"]
    public = api.upload(owner, b.zip_bytes(b.image_folder({"a": 4, "b": 4})),
                        {"name": "pub", "visibility": "public", "holdout_fraction": 0.25,
                         "holdout_key": HOLDOUT_KEY})
    assert public.status_code == 201, public.text
    sizes = public.json()["true_size"], public.json()["holdout_size"]
    assert sum(sizes) == 8 and min(sizes) >= 1


def test_subjects_are_never_on_both_sides(real_ledger_api: Api) -> None:
    api = real_ledger_api
    owner, _, _ = _reader(api)
    images, _ = _digits(40, seed=5)
    subjects = np.repeat(np.arange(20), 2)
    labels = subjects % 3
    r = api.upload(owner, b.npz_bytes(images=images, labels=labels, subjects=subjects), {
        "name": "subj", "visibility": "private", "epsilon_limit": 5.0, "label_domain": LABELS,
        "privacy_unit": "subject", "holdout_fraction": 0.5, "declared_size": 20,
        "holdout_key": HOLDOUT_KEY}, filename="d.npz")
    assert r.status_code == 201, r.text
    ds = r.json()
    # a subject's side is a keyed hash of its keyed id hash (which names the tenant)
    assert ds["declared_size"] == 20 and 0 < ds["subject_count"] < 20
    assert ds["holdout_size"] == 2 * (20 - ds["subject_count"])
    train = _row_hashes(_npz(api, f"private/datasets/{ds['dataset_id']}/data.npz")["images"])
    held = _row_hashes(_npz(api, f"private/datasets/{ds['dataset_id']}/holdout.npz")["images"])
    for subject in range(20):
        mine = _row_hashes(images[subjects == subject])
        assert mine <= train or mine <= held


def test_deleting_a_dataset_deletes_its_holdout(real_ledger_api: Api) -> None:
    api = real_ledger_api
    owner, _, _ = _reader(api)
    ds = _private(api, owner, holdout_fraction=0.2).json()
    key = f"private/datasets/{ds['dataset_id']}/holdout.npz"
    assert api.store.stat(key) is not None
    r = api.client.delete(f"/v1/datasets/{ds['dataset_id']}", headers=auth(owner))
    assert r.status_code == 200, r.text
    assert api.store.stat(key) is None


# -- feature_net and evaluate submissions ---------------------------------------------------

def _public(api: Api, token: str, holdout: float | None = 0.25) -> str:
    meta: dict[str, Any] = {"name": "pub", "visibility": "public"}
    if holdout:
        meta["holdout_fraction"], meta["holdout_key"] = holdout, HOLDOUT_KEY
    r = api.upload(token, b.zip_bytes(b.image_folder({"x": 4, "y": 4, "z": 4})), meta)
    assert r.status_code == 201, r.text
    return str(r.json()["dataset_id"])


def _run(api: Api, job_id: str) -> dict[str, Any]:
    claim = api.worker(f"{job_id}/claim", {"attempt": 1, "worker_id": "w"})
    assert claim.status_code == 200, claim.text
    return dict(claim.json())


def _feature_net(api: Api, token: str, public: str) -> str:
    r = api.client.post("/v1/jobs", headers=auth(token), json={
        "type": "feature_net", "dataset_id": public, "image_size": 8, "epochs": 1})
    assert r.status_code == 201, r.text
    job_id = r.json()["job_id"]
    claim = _run(api, job_id)
    assert claim["dataset"]["holdout_object_key"].endswith("/holdout.npz")
    model = api.worker(f"{job_id}/artifacts", {
        "attempt": 1, "kind": "model", "object_key": f"models/{job_id}/model.tar",
        "sha256": "e" * 64, "size": 10, "metadata": {
            "model_kind": "feature_net", "dp": False, "public_dataset_id": public,
            "feature_net": {"architecture": "dpsynth-featnet-v1", "accuracy": 0.9}}})
    assert model.status_code == 201, model.text
    api.worker(f"{job_id}/transition", {"attempt": 1, "to_state": "succeeded",
                                        "result": {"model_id": model.json()["model_id"]}})
    return str(model.json()["model_id"])


def _corpus(api: Api, token: str, model_id: str) -> tuple[str, str, bytes]:
    """A generate job's corpus artifact (a real zip with a manifest) and its bytes."""
    r = api.client.post("/v1/jobs", headers=auth(token), json={
        "type": "generate", "model_id": model_id, "samples_per_class": 2})
    assert r.status_code == 201, r.text
    job_id = r.json()["job_id"]
    _run(api, job_id)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for i in range(3):
            zf.writestr(f"x/{i}.png", b.png(value=i))
        zf.writestr("manifest.json", json.dumps({"model_id": model_id, "dp": False,
                                                  "non_dp_evaluations": []}))
    data = buf.getvalue()
    key = f"corpora/{job_id}/corpus.zip"
    info = api.store.put_bytes(key, data)
    art = api.worker(f"{job_id}/artifacts", {"attempt": 1, "kind": "corpus", "object_key": key,
                                             "sha256": info.sha256, "size": info.size})
    assert art.status_code == 201, art.text
    api.worker(f"{job_id}/transition", {"attempt": 1, "to_state": "succeeded"})
    return str(art.json()["artifact_id"]), job_id, data


def _evaluate(api: Api, token: str, corpus: str, dataset: str, *, dry_run: bool = False,
              **spec: Any) -> Any:
    return api.client.post("/v1/jobs" + ("?dry_run=true" if dry_run else ""),
                           headers=auth(token), json={
                               "type": "evaluate", "corpus_artifact_id": corpus,
                               "dataset_id": dataset, **spec})


def test_feature_net_rules_and_its_model_is_no_diffusion_model(real_ledger_api: Api) -> None:
    api = real_ledger_api
    owner, _, _ = _reader(api)
    private = _private(api, owner, holdout_fraction=0.2).json()["dataset_id"]
    refused = api.client.post("/v1/jobs", headers=auth(owner), json={
        "type": "feature_net", "dataset_id": private})
    assert refused.status_code == 422 and refused.json()["code"] == "visibility_mismatch"
    feature = _feature_net(api, owner, _public(api, owner))
    model = api.client.get(f"/v1/models/{feature}", headers=auth(owner)).json()
    assert model["dp"] is False
    base = api.finetune(owner, private, feature)
    assert base.status_code == 422 and base.json()["code"] == "invalid_spec"
    sample = api.client.post("/v1/jobs", headers=auth(owner), json={
        "type": "generate", "model_id": feature, "samples_per_class": 1})
    assert sample.status_code == 422 and sample.json()["code"] == "invalid_spec"


def test_evaluate_submission_rules(real_ledger_api: Api) -> None:
    api = real_ledger_api
    owner, submitter, _ = _reader(api)
    other, _, _ = _reader(api, "other")
    public = _public(api, owner)
    private = _private(api, owner, holdout_fraction=0.2).json()["dataset_id"]
    no_holdout = _private(api, owner, seed=9).json()["dataset_id"]
    diffusion = api.model(owner)
    feature = _feature_net(api, owner, public)
    corpus, _, _ = _corpus(api, owner, diffusion)
    other_corpus, _, _ = _corpus(api, other, api.model(other))
    other_feature = _feature_net(api, other, _public(api, other))

    def code(r: Any) -> tuple[int, str]:
        return r.status_code, r.json().get("code")

    assert code(_evaluate(api, owner, "art_" + "0" * 32, private)) == (404, "not_found")
    assert code(_evaluate(api, owner, other_corpus, private)) == (404, "not_found")
    [feature_job] = api.client.get("/v1/jobs?type=feature_net", headers=auth(owner)).json()[
        "items"]
    model_artifact = feature_job["artifacts"][0]["artifact_id"]
    assert code(_evaluate(api, owner, model_artifact, private)) == (404, "not_found")
    assert code(_evaluate(api, owner, corpus, no_holdout)) == (422, "no_holdout")
    assert code(_evaluate(api, submitter, corpus, private)) == (403, "forbidden")
    assert code(_evaluate(api, owner, corpus, private, feature_model_id=diffusion)) == (
        422, "invalid_spec")
    assert code(_evaluate(api, owner, corpus, private, feature_model_id=other_feature)) == (
        404, "not_found")
    assert code(_evaluate(api, owner, corpus, "ds_" + "0" * 32)) == (404, "not_found")
    # a public reference needs no owner scope and reads no private data
    pub = _evaluate(api, submitter, corpus, public, feature_model_id=feature)
    assert pub.status_code == 201, pub.text
    assert pub.json()["privacy"]["non_dp_read"] is False
    assert pub.json()["privacy"]["evaluation_id"] is None
    # the dry run: no epsilon, a non-DP read of private data, an owner-only report
    budget = private
    before = api.ledger.evaluations(budget)
    plan = _evaluate(api, owner, corpus, private, dry_run=True, feature_model_id=feature)
    assert plan.status_code == 200, plan.text
    block = plan.json()["plan"]
    assert block["epsilon_charged"] == 0.0 and block["non_dp_read"] is True
    assert block["report_access"] == "owner_only" and block["evaluation_id"] is None
    assert api.ledger.evaluations(budget) == before
    # the submission: the ledger records the read before the job exists
    job = _evaluate(api, owner, corpus, private, feature_model_id=feature)
    assert job.status_code == 201, job.text
    evaluation_id = job.json()["privacy"]["evaluation_id"]
    listed = api.ledger.evaluations(budget)
    assert [e.evaluation_id for e in listed] == [evaluation_id]
    assert listed[0].job_id == job.json()["job_id"] and listed[0].reference_dataset_id == private
    claim = _run(api, job.json()["job_id"])
    assert claim["evaluation_id"] == evaluation_id
    assert claim["corpus"]["artifact_id"] == corpus
    assert claim["corpus"]["object_key"].startswith("corpora/")
    assert claim["corpus"]["model_id"] == diffusion and claim["corpus"]["dp"] is False
    assert claim["feature_model"]["model_id"] == feature
    assert claim["feature_dataset"]["dataset_id"] == public
    assert claim["feature_dataset"]["holdout_size"] == 3
    assert claim["dataset"]["holdout_object_key"] == \
        f"private/datasets/{private}/holdout.npz"
    assert claim["dataset"]["holdout_size"] == int(_held(30, 0.2).sum())
    # a deleted reference is refused
    assert api.client.delete(f"/v1/datasets/{no_holdout}", headers=auth(owner)).status_code \
        == 200
    assert code(_evaluate(api, owner, corpus, no_holdout)) == (410, "dataset_deleted")


# -- reports ---------------------------------------------------------------------------------

def _report(job_id: str, corpus: str, generate_job: str, dataset: str) -> dict[str, Any]:
    return {"job_id": job_id, "corpus_artifact_id": corpus, "generate_job_id": generate_job,
            "model_id": None, "dataset_id": dataset, "reference_visibility": "private",
            "non_dp": True, "contains_private_images": True,
            "headline": {"tstr_accuracy": {"cnn": 0.61}, "real_accuracy": {"cnn": 0.9},
                         "fd_dpsynth": 12.5},
            "classifiers": [{"classifier": "cnn", "train_on": "synthetic", "accuracy": 0.61,
                             "train_size": 6, "test_size": 6, "chance": 1 / 3}]}


def _register_report(api: Api, job_id: str, document: dict[str, Any]) -> tuple[str, str]:
    ids = []
    for fmt, body in (("json", json.dumps(document).encode()),
                      ("html", b"<!doctype html><title>r</title><p>report</p>")):
        key = f"reports/{job_id}/report.{fmt}"
        info = api.store.put_bytes(key, body)
        r = api.worker(f"{job_id}/artifacts", {
            "attempt": 1, "kind": "report", "object_key": key, "sha256": info.sha256,
            "size": info.size, "owner_only": False, "non_dp": False,  # the api forces both
            "metadata": {"format": fmt, "contains_private_images": True,
                         "reference_visibility": "private"}})
        assert r.status_code == 201, r.text
        ids.append(str(r.json()["artifact_id"]))
    return ids[0], ids[1]


def test_report_endpoints(real_ledger_api: Api) -> None:
    api = real_ledger_api
    owner, reader, _ = _reader(api)
    other, _, _ = _reader(api, "other")
    private = _private(api, owner, holdout_fraction=0.2).json()["dataset_id"]
    corpus, generate_job, _ = _corpus(api, owner, api.model(owner))
    job_id = _evaluate(api, owner, corpus, private).json()["job_id"]
    url = f"/v1/jobs/{job_id}/report"
    queued = api.client.get(url, headers=auth(owner))
    assert queued.status_code == 409 and queued.json()["report_state"] == "not_ready"
    _run(api, job_id)
    json_id, html_id = _register_report(api, job_id,
                                        _report(job_id, corpus, generate_job, private))
    done = api.worker(f"{job_id}/transition", {"attempt": 1, "to_state": "succeeded", "result": {
        "report_artifact_id": json_id, "report_html_artifact_id": html_id, "non_dp": True,
        "contains_private_images": True, "tstr_accuracy": 0.61, "fd_dpsynth": 12.5,
        "job_epsilon": 1.0}})
    assert done.status_code == 200, done.text
    # the job's result carries no metric, for any reader
    job = api.client.get(f"/v1/jobs/{job_id}", headers=auth(reader)).json()
    assert job["result"] == {"report_artifact_id": json_id, "report_html_artifact_id": html_id,
                             "non_dp": True, "contains_private_images": True}
    assert job["artifacts"] == []  # owner-only reports are not listed to readers
    art = api.client.get(f"/v1/artifacts/{json_id}", headers=auth(owner)).json()
    assert art["owner_only"] is True and art["non_dp"] is True and art["kind"] == "report"
    # the owner reads the document and the page
    report = api.client.get(url, headers=auth(owner))
    assert report.status_code == 200, report.text
    assert report.json()["headline"]["tstr_accuracy"] == {"cnn": 0.61}
    assert report.json()["headline"]["fd_dpsynth"] == 12.5 and report.json()["non_dp"] is True
    page = api.client.get(url + "?format=html", headers=auth(owner))
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert "script" not in page.headers["content-security-policy"]
    assert page.headers["x-content-type-options"] == "nosniff"
    assert b"<p>report</p>" in page.content
    # without the owner scope: 403; another tenant: 404; not an evaluate job: 404
    for fmt in ("", "?format=html"):
        denied = api.client.get(url + fmt, headers=auth(reader))
        assert denied.status_code == 403 and denied.json()["code"] == "forbidden"
        assert api.client.get(url + fmt, headers=auth(other)).status_code == 404
    assert api.client.get(f"/v1/artifacts/{json_id}/download",
                          headers=auth(reader)).status_code == 403
    assert api.client.get(f"/v1/jobs/{generate_job}/report",
                          headers=auth(owner)).status_code == 404
    assert "/v1/jobs/{job_id}/report" in api.client.get("/openapi.json").json()["paths"]


def test_reports_only_from_evaluate_jobs_and_under_their_prefix(real_ledger_api: Api) -> None:
    api = real_ledger_api
    owner, _, _ = _reader(api)
    r = api.client.post("/v1/jobs", headers=auth(owner), json={
        "type": "generate", "model_id": api.model(owner), "samples_per_class": 1})
    job_id = r.json()["job_id"]
    _run(api, job_id)
    refused = api.worker(f"{job_id}/artifacts", {
        "attempt": 1, "kind": "report", "object_key": f"reports/{job_id}/report.json",
        "sha256": "a" * 64, "size": 1})
    assert refused.status_code == 400


# -- corpus releases -------------------------------------------------------------------------

def _manifest(data: bytes) -> dict[str, Any]:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return dict(json.loads(zf.read("manifest.json")))


def _dp_model(api: Api, token: str, dataset: str) -> str:
    """A DP model of the dataset's budget (a finetune the worker ran)."""
    job = api.finetune(token, dataset, api.model(token), epsilon=1.0)
    assert job.status_code == 201, job.text
    job_id = job.json()["job_id"]
    _run(api, job_id)
    model = api.worker(f"{job_id}/artifacts", {
        "attempt": 1, "kind": "model", "object_key": f"models/{job_id}/model.tar",
        "sha256": "d" * 64, "size": 10, "metadata": {"job_epsilon": 0.9}})
    assert model.status_code == 201, model.text
    return str(model.json()["model_id"])


def test_corpus_releases_list_the_non_dp_evaluations_that_preceded_them(
        real_ledger_api: Api) -> None:
    api = real_ledger_api
    owner, reader, _ = _reader(api)
    private = _private(api, owner, holdout_fraction=0.2).json()["dataset_id"]
    public = _public(api, owner)
    corpus, corpus_job, data = _corpus(api, owner, _dp_model(api, owner, private))
    untouched, _, _ = _corpus(api, owner, api.model(owner))
    download = f"/v1/artifacts/{corpus}/download"
    # before any evaluation: the stored corpus, as generated
    first = api.client.get(download, headers=auth(reader))
    assert first.status_code == 200 and first.content == data
    assert first.headers["x-dpsynth-non-dp-evaluations"] == "0"
    # a public-reference evaluation reads no private data; a queued one has read nothing
    _run(api, _evaluate(api, owner, corpus, public).json()["job_id"])
    queued = _evaluate(api, owner, untouched, private).json()["job_id"]
    assert api.client.get(download, headers=auth(reader)).content == data
    # a started evaluation of ANOTHER corpus on data of this corpus's budget is listed
    _run(api, queued)
    listed = api.client.get(download, headers=auth(reader))
    assert listed.status_code == 200 and listed.headers["x-dpsynth-non-dp-evaluations"] == "1"
    manifest = _manifest(listed.content)
    assert manifest["model_id"] and manifest["dp"] is False  # the rest is kept
    [entry] = manifest["non_dp_evaluations"]
    assert entry["job_id"] == queued and entry["reference_dataset_id"] == private
    assert entry["corpus_artifact_id"] == untouched and entry["relation"] == "same budget"
    assert entry["state"] == "running" and entry["finished_at"] is None
    assert entry["evaluation_id"].startswith("evl_") and "tstr_accuracy" in entry["computed"]
    with zipfile.ZipFile(io.BytesIO(listed.content)) as zf:  # images kept, no report
        assert sorted(zf.namelist()) == ["manifest.json", "x/0.png", "x/1.png", "x/2.png"]
        assert zf.read("x/1.png") == b.png(value=1)
    # the release is stored once per list, and presigned like the corpus
    releases = sorted(p.name for p in api.store._path(f"corpora/{corpus_job}").iterdir())
    assert releases[0] == "corpus.zip" and len(releases) == 2
    again = api.client.get(download, headers=auth(reader))
    assert again.content == listed.content
    assert len(list(api.store._path(f"corpora/{corpus_job}").iterdir())) == 2
    presigned = api.client.get(download + "?presign=true", headers=auth(reader)).json()
    assert presigned["non_dp_evaluations"] == 1
    assert api.client.get(presigned["url"]).content == listed.content  # the release
    assert presigned["sha256"] == listed.headers["x-dpsynth-release-sha256"]
    # the stored corpus itself is unchanged
    assert api.store._path(f"corpora/{corpus_job}/corpus.zip").read_bytes() == data
    # an evaluation of the untouched (non-DP model) corpus lists only those on it
    other = api.client.get(f"/v1/artifacts/{untouched}/download", headers=auth(reader))
    [own] = _manifest(other.content)["non_dp_evaluations"]
    assert own["job_id"] == queued and own["relation"] == "this corpus"
