"""Content-addressed pretraining (issue 18, item 5): a pretrain identical to one of the
tenant's succeeded pretrains (same settings, same data CONTENT) answers 200 with that job and
runs nothing; other settings, other data, another tenant or ``reuse: false`` train."""

from __future__ import annotations

from typing import Any

from dpsynth_shared.ids import new_model_id

from tests.integration.api.conftest import Api, auth


def _pretrain(dataset_id: str, **extra: Any) -> dict[str, Any]:
    return {"type": "pretrain", "dataset_id": dataset_id, "preset": "tiny", "image_size": 16,
            "epochs": 2, **extra}


def _succeed(api: Api, job_id: str) -> str:
    """Run the job through the worker endpoints: claim, publish a model, succeed."""
    assert api.worker(f"{job_id}/claim", {"attempt": 1, "worker_id": "w"}).status_code == 200
    model_id = new_model_id()
    r = api.worker(f"{job_id}/artifacts", {
        "attempt": 1, "kind": "model", "object_key": f"models/{model_id}/model.tar",
        "sha256": "d" * 64, "size": 10, "metadata": {"rng": "os", "model_id": model_id}})
    assert r.status_code == 201, r.text
    published = str(r.json()["model_id"])
    done = api.worker(f"{job_id}/transition", {"attempt": 1, "to_state": "succeeded",
                                               "result": {"model_id": published}})
    assert done.status_code == 200, done.text
    return published


def test_an_identical_pretraining_is_reused(api: Api) -> None:
    _, token = api.tenant()
    public = api.public_dataset(token, {"a": 3, "b": 3})
    first = api.client.post("/v1/jobs", json=_pretrain(public, name="first"),
                            headers=auth(token))
    assert first.status_code == 201, first.text
    job_id = first.json()["job_id"]
    key = first.json()["result"]["reuse_key"]
    assert len(key) == 64
    # not succeeded yet: an identical submission trains (nothing to reuse)
    twin = api.client.post("/v1/jobs", json=_pretrain(public), headers=auth(token))
    assert twin.status_code == 201 and twin.json()["job_id"] != job_id
    model_id = _succeed(api, job_id)
    sent = len(api.sender.sent)

    again = api.client.post("/v1/jobs", json=_pretrain(public, name="again"),
                            headers=auth(token))
    assert again.status_code == 200, again.text
    body = again.json()
    assert body["job_id"] == job_id and body["state"] == "succeeded"
    assert body["result"]["model_id"] == model_id and body["result"]["reuse_key"] == key
    assert len(api.sender.sent) == sent  # nothing sent to a worker

    # the same content uploaded again as another dataset: the same address
    copy = api.public_dataset(token, {"a": 3, "b": 3})
    assert copy != public
    r = api.client.post("/v1/jobs", json=_pretrain(copy), headers=auth(token))
    assert r.status_code == 200 and r.json()["job_id"] == job_id, r.text

    for why, spec in {"reuse false": _pretrain(public, reuse=False),
                      "another seed": _pretrain(public, seed=1),
                      "more epochs": _pretrain(public, epochs=3),
                      "other data": _pretrain(api.public_dataset(token, {"a": 4, "b": 3}))
                      }.items():
        r = api.client.post("/v1/jobs", json=spec, headers=auth(token))
        assert r.status_code == 201 and r.json()["job_id"] != job_id, (why, r.text)

    # another tenant never sees this tenant's pretraining
    _, other = api.tenant()
    theirs = api.public_dataset(other, {"a": 3, "b": 3})
    r = api.client.post("/v1/jobs", json=_pretrain(theirs), headers=auth(other))
    assert r.status_code == 201 and r.json()["job_id"] != job_id


def test_an_initialise_only_pretrain_is_reused_too(api: Api) -> None:
    _, token = api.tenant()
    spec = {"type": "pretrain", "initialise_only": True, "class_names": ["x", "y"],
            "space": "pixel", "preset": "tiny", "image_size": 16}
    first = api.client.post("/v1/jobs", json=spec, headers=auth(token))
    assert first.status_code == 201, first.text
    _succeed(api, first.json()["job_id"])
    again = api.client.post("/v1/jobs", json=spec, headers=auth(token))
    assert again.status_code == 200 and again.json()["job_id"] == first.json()["job_id"]
