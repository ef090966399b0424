"""An evaluation refuses a reference whose held-out records the corpus's model was trained on
(issue 15, item 8), through the api joined to the REAL ledger on real PostgreSQL.

* a linked upload (``on_overlap: link``) holding some of the reference's held-out records,
  fine-tuned on and sampled: the evaluation is refused (409
  ``holdout_trained_on``) in the dry run and at submission, naming the dataset, job and model
  and, for the owner, how many records; the ledger records no read;
* a derived subset of that upload without those records, or the reference's own training
  part: admitted, the privacy block says what was checked;
* a public base model pretrained on a public dataset holding a public reference's held-out
  records: refused for the model fine-tuned from it too (an ancestor); a caller without the
  owner scope is told which datasets, never how many records, and is not told anything
  about a PRIVATE training dataset (admitted, with the caveat for the report's headline).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from tests.integration.api.conftest import Api, auth
from tests.unit.api import builders as b

LABELS = ["x", "y", "z"]
KEY = "overlap-holdout-key-0123456789abc"


def _images(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 255, size=(n, 8, 8), dtype=np.uint8), np.arange(n) % 3


def _upload(api: Api, token: str, images: np.ndarray, labels: np.ndarray, *,
            private: bool = True, subjects: np.ndarray | None = None,
            **meta: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"name": "d", "visibility": "private" if private else "public"}
    if private:
        base.update(epsilon_limit=10.0, label_domain=LABELS, declared_size=len(images))
    else:
        base.update(label_domain=LABELS)
    if "holdout_fraction" in meta:
        base["holdout_key"] = KEY
    arrays = {"images": images, "labels": labels}
    if subjects is not None:  # one subject id per image
        arrays["subjects"] = subjects
    r = api.upload(token, b.npz_bytes(**arrays), {**base, **meta}, filename="d.npz")
    assert r.status_code == 201, r.text
    return dict(r.json())


def _held_positions(api: Api, token: str, dataset_id: str) -> list[int]:
    r = api.client.get(f"/v1/datasets/{dataset_id}/holdout", headers=auth(token))
    assert r.status_code == 200, r.text
    return [item["index"] for item in r.json()["items"]]


def _produce(api: Api, token: str, spec: dict[str, Any]) -> str:
    """Run a training job through the worker endpoints; its model's id."""
    r = api.client.post("/v1/jobs", headers=auth(token), json=spec)
    assert r.status_code == 201, r.text
    job_id = r.json()["job_id"]
    assert api.worker(f"{job_id}/claim", {"attempt": 1, "worker_id": "w"}).status_code == 200
    out = api.worker(f"{job_id}/artifacts", {
        "attempt": 1, "kind": "model", "object_key": f"models/{job_id}/model.tar",
        "sha256": "f" * 64, "size": 10, "metadata": {"job_epsilon": 0.5}})
    assert out.status_code == 201, out.text
    model_id = str(out.json()["model_id"])
    done = api.worker(f"{job_id}/transition", {"attempt": 1, "to_state": "succeeded",
                                               "result": {"model_id": model_id}})
    assert done.status_code == 200, done.text
    return model_id


def _finetune(api: Api, token: str, dataset_id: str, base: str) -> str:
    return _produce(api, token, {
        "type": "finetune", "dataset_id": dataset_id, "base_model_id": base,
        "privacy": {"target_epsilon": 1.0},
        "training": {"expected_batch_size": 2, "epochs": 1}})


def _corpus(api: Api, token: str, model_id: str) -> str:
    r = api.client.post("/v1/jobs", headers=auth(token), json={
        "type": "generate", "model_id": model_id, "samples_per_class": 1})
    assert r.status_code == 201, r.text
    job_id = r.json()["job_id"]
    assert api.worker(f"{job_id}/claim", {"attempt": 1, "worker_id": "w"}).status_code == 200
    key = f"corpora/{job_id}/corpus.zip"
    info = api.store.put_bytes(key, b.zip_bytes(b.image_folder({"x": 1})))
    art = api.worker(f"{job_id}/artifacts", {"attempt": 1, "kind": "corpus", "object_key": key,
                                             "sha256": info.sha256, "size": info.size})
    assert art.status_code == 201, art.text
    api.worker(f"{job_id}/transition", {"attempt": 1, "to_state": "succeeded"})
    return str(art.json()["artifact_id"])


def _evaluate(api: Api, token: str, corpus: str, dataset: str, *,
              dry_run: bool = False) -> Any:
    return api.client.post("/v1/jobs" + ("?dry_run=true" if dry_run else ""),
                           headers=auth(token), json={
                               "type": "evaluate", "corpus_artifact_id": corpus,
                               "dataset_id": dataset})


def _reader(api: Api, tenant: str) -> str:
    r = api.client.post(f"/v1/tenants/{tenant}/keys", headers=auth(api.admin),
                        json={"scopes": ["read", "submit"], "name": "no-owner"})
    assert r.status_code == 201, r.text
    return str(r.json()["api_key"])


def test_a_linked_upload_trained_on_the_held_out_records_is_refused(
        real_ledger_api: Api) -> None:
    api = real_ledger_api
    _, owner = api.tenant()
    images, labels = _images(40, seed=1)
    reference = _upload(api, owner, images, labels, holdout_fraction=0.3)["dataset_id"]
    held = _held_positions(api, owner, reference)
    assert 0 < len(held) < 40
    trained = sorted(set(range(40)) - set(held))
    # a later upload sharing 2 held-out records (class x) and 3 training records (classes
    # y, z), plus 5 new ones
    held_x = [i for i in held if labels[i] == 0][:2]
    trained_yz = [i for i in trained if labels[i] != 0][:3]
    assert len(held_x) == 2 and len(trained_yz) == 3
    fresh, _ = _images(5, seed=2)
    shared = [*held_x, *trained_yz]
    linked_images = np.concatenate([images[shared], fresh])
    linked_labels = np.concatenate([labels[shared], np.arange(5) % 3])
    linked = _upload(api, owner, linked_images, linked_labels, on_overlap="link",
                     epsilon_limit=None)
    assert linked["derivation"]["kind"] == "link", linked
    base = api.model(owner)
    job_model = _finetune(api, owner, linked["dataset_id"], base)
    corpus = _corpus(api, owner, job_model)
    before = list(api.ledger.evaluations(reference))

    for dry_run in (True, False):
        refused = _evaluate(api, owner, corpus, reference, dry_run=dry_run)
        assert refused.status_code == 409, refused.text
        body = refused.json()
        assert body["code"] == "holdout_trained_on" and body["status"] == 409
        assert refused.headers["content-type"].startswith("application/problem+json")
        [overlap] = body["overlaps"]
        assert overlap["dataset_id"] == linked["dataset_id"]
        assert overlap["model_id"] == job_model and overlap["job_type"] == "finetune"
        assert overlap["records"] == 2 and overlap["subjects"] == 0
        assert "2 record(s)" in body["detail"] and linked["dataset_id"] in body["detail"]
    assert list(api.ledger.evaluations(reference)) == before  # no read was authorised

    # a subset of the linked upload without the held-out records' class: admitted
    clean = _subset_corpus(api, owner, linked["dataset_id"], ["y", "z"], base)
    ok = _evaluate(api, owner, clean, reference)
    assert ok.status_code == 201, ok.text
    assert ok.json()["privacy"]["holdout_overlap"]["status"] == "no_overlap"
    # a subset that keeps them: refused, naming the subset and the upload it selects from
    dirty = _subset_corpus(api, owner, linked["dataset_id"], ["x"], base)
    refused = _evaluate(api, owner, dirty, reference)
    assert refused.status_code == 409, refused.text
    [overlap] = refused.json()["overlaps"]
    assert overlap["records"] == 2 and overlap["dataset_id"] != linked["dataset_id"]
    assert overlap["upload_dataset_id"] == linked["dataset_id"]
    # the two parts of a keyed-hash split: exactly the records each part keeps are counted
    counted = 0
    for part in ("train", "holdout"):
        split = api.client.post(f"/v1/datasets/{linked['dataset_id']}/derive",
                                headers=auth(owner), json={"kind": "split", "fraction": 0.5,
                                                           "part": part, "name": part})
        assert split.status_code == 201, split.text
        corpus = _corpus(api, owner, _finetune(api, owner, split.json()["dataset_id"], base))
        r = _evaluate(api, owner, corpus, reference)
        assert r.status_code in (201, 409), r.text
        counted += r.json()["overlaps"][0]["records"] if r.status_code == 409 else 0
    assert counted == 2


def _subset_corpus(api: Api, token: str, dataset_id: str, classes: list[str],
                   base: str) -> str:
    """A corpus of a model fine-tuned on a class subset of ``dataset_id``."""
    subset = api.client.post(f"/v1/datasets/{dataset_id}/derive", headers=auth(token),
                             json={"kind": "subset", "classes": classes, "name": "s"})
    assert subset.status_code == 201, subset.text
    return _corpus(api, token, _finetune(api, token, subset.json()["dataset_id"], base))


def test_the_reference_s_own_training_part_is_admitted(real_ledger_api: Api) -> None:
    api = real_ledger_api
    _, owner = api.tenant()
    images, labels = _images(30, seed=3)
    reference = _upload(api, owner, images, labels, holdout_fraction=0.3)["dataset_id"]
    corpus = _corpus(api, owner, _finetune(api, owner, reference, api.model(owner)))
    plan = _evaluate(api, owner, corpus, reference, dry_run=True)
    assert plan.status_code == 200, plan.text
    check = plan.json()["plan"]["holdout_overlap"]
    assert check["status"] == "no_overlap" and check["caveat"] is None
    assert check["checked_datasets"] == [reference]
    assert len(check["models_of_unknown_training_data"]) == 1  # the uploaded base model
    job = _evaluate(api, owner, corpus, reference)
    assert job.status_code == 201, job.text
    assert job.json()["privacy"]["holdout_overlap"]["status"] == "no_overlap"


def test_a_pretrained_ancestor_and_a_caller_without_the_owner_scope(
        real_ledger_api: Api) -> None:
    api = real_ledger_api
    tenant, owner = api.tenant()
    reader = _reader(api, tenant)
    images, labels = _images(40, seed=4)
    reference = _upload(api, owner, images, labels, private=False,
                        holdout_fraction=0.3)["dataset_id"]
    held = _held_positions(api, owner, reference)
    # a public dataset holding 3 of the public reference's held-out records
    extra, _ = _images(6, seed=5)
    public = _upload(api, owner, np.concatenate([images[held[:3]], extra]),
                     np.concatenate([labels[held[:3]], np.arange(6) % 3]), private=False)
    pretrained = _produce(api, owner, {"type": "pretrain", "dataset_id": public["dataset_id"],
                                       "image_size": 8, "epochs": 1})
    # a private dataset of other records, fine-tuned from the pretrained model
    own, own_labels = _images(20, seed=6)
    private = _upload(api, owner, own, own_labels)["dataset_id"]
    tuned = _finetune(api, owner, private, pretrained)
    corpus = _corpus(api, owner, tuned)
    for token, counted in ((owner, True), (reader, False)):
        refused = _evaluate(api, token, corpus, reference)
        assert refused.status_code == 409, refused.text
        body = refused.json()
        [overlap] = body["overlaps"]
        assert overlap["dataset_id"] == public["dataset_id"]
        assert overlap["model_id"] == pretrained and overlap["job_type"] == "pretrain"
        assert overlap["role"].startswith("a base model of")
        assert ("records" in overlap) is counted
        assert ("3 record(s)" in body["detail"]) is counted
        if not counted:
            assert "owner key is told how many" in body["detail"]
            assert not re.search(r"\b\d+ (record|subject)", body["detail"])

    # a private dataset holding public held-out records, fine-tuned from an uploaded model
    mixed = _upload(api, owner, np.concatenate([images[held[3:5]], extra[:2] // 2]),
                    np.concatenate([labels[held[3:5]], np.arange(2) % 3]))["dataset_id"]
    hidden = _corpus(api, owner, _finetune(api, owner, mixed, api.model(owner)))
    # the owner learns it; a caller without the owner scope learns nothing of the private
    # records: admitted, with the caveat leading the notes
    refused = _evaluate(api, owner, hidden, reference)
    assert refused.status_code == 409 and refused.json()["overlaps"][0]["records"] == 2
    admitted = _evaluate(api, reader, hidden, reference)
    assert admitted.status_code == 201, admitted.text
    privacy = admitted.json()["privacy"]
    check = privacy["holdout_overlap"]
    assert check["status"] == "unchecked" and check["checked_datasets"] == []
    assert check["unchecked"][0]["what"].startswith(f"dataset {mixed}")
    assert privacy["notes"][0] == check["caveat"]
    assert check["caveat"].startswith("held-out overlap not checked")
    # the dry run tells the same
    plan = _evaluate(api, reader, hidden, reference, dry_run=True)
    assert plan.status_code == 200 and plan.json()["plan"]["holdout_overlap"] == check


def test_new_images_of_a_held_out_subject_count_as_its_records(real_ledger_api: Api) -> None:
    api = real_ledger_api
    _, owner = api.tenant()
    images, _ = _images(40, seed=7)
    subjects = np.repeat(np.arange(20), 2)
    reference = _upload(api, owner, images, subjects % 3, subjects=subjects,
                        privacy_unit="subject", holdout_fraction=0.5, declared_size=20)
    held = _held_positions(api, owner, reference["dataset_id"])
    subject = int(subjects[held[0]])  # a held-out subject: both its images are held out
    # new images of that subject (and of a new one), linked through its keyed subject hash
    fresh, _ = _images(4, seed=8)
    linked = _upload(api, owner, fresh, np.array([subject % 3] * 2 + [0, 0]),
                     subjects=np.array([subject, subject, 99, 99]), privacy_unit="subject",
                     on_overlap="link", epsilon_limit=None, declared_size=2)
    assert linked["derivation"]["kind"] == "link", linked
    corpus = _corpus(api, owner, _finetune(api, owner, linked["dataset_id"], api.model(owner)))
    refused = _evaluate(api, owner, corpus, reference["dataset_id"])
    assert refused.status_code == 409, refused.text
    [overlap] = refused.json()["overlaps"]
    assert overlap["records"] == 0 and overlap["subjects"] == 1
    assert "1 subject(s)" in refused.json()["detail"]
