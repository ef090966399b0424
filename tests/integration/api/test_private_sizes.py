"""Issue 13, items 2 and 3 over HTTP: a private upload states N̂ (declared, or a charged DP
count on the real ledger), the stored file's size and hash are owner-only, and
``partitions_disjoint`` is declared and checked at upload.

On the code before the change: an upload without ``declared_size`` was accepted with N̂ = the
true count, ``size_epsilon`` did not exist, every reader saw ``sha256``/``size_bytes``, and a
subject dataset's disjointness was computed from the data (never refused).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tests.integration.api.conftest import Api, auth
from tests.unit.api import builders as b

PRIVATE = {"name": "priv", "visibility": "private", "epsilon_limit": 8.0,
           "label_domain": ["x", "y", "z"]}


def _reader(api: Api, tenant_id: str) -> str:
    r = api.client.post(f"/v1/tenants/{tenant_id}/keys", json={"scopes": ["read", "submit"]},
                        headers=auth(api.admin))
    assert r.status_code == 201, r.text
    return str(r.json()["api_key"])


def test_an_undeclared_private_size_is_refused_the_same_for_n_and_n_plus_1(api: Api) -> None:
    _, token = api.tenant()
    details = []
    for n in (12, 13):
        r = api.upload(token, b.digits_npz(n, k=3), PRIVATE, filename="d.npz")
        assert r.status_code == 422 and r.json()["code"] == "invalid_dataset", r.text
        details.append(r.json()["detail"])
    assert details[0] == details[1] and "size_epsilon" in details[0]
    assert api.ledger.budgets == {}
    # replace-one: the count is public under that relation, so it may be the default
    r = api.upload(token, b.digits_npz(12, k=3), {**PRIVATE, "neighbouring": "replace_one"},
                   filename="d.npz")
    assert r.status_code == 201, r.text
    assert (r.json()["declared_size"], r.json()["declared_size_source"]) == (12, "true_count")


def test_a_dp_count_is_charged_first_on_the_real_ledger(real_ledger_api: Api) -> None:
    api = real_ledger_api
    tenant_id, token = api.tenant()
    r = api.upload(token, b.digits_npz(40, k=3), {**PRIVATE, "size_epsilon": 0.5},
                   filename="d.npz")
    assert r.status_code == 201, r.text
    body = r.json()
    release = body["size_release"]
    assert body["declared_size_source"] == "dp_count" and body["delta"] == 1e-6
    assert body["declared_size"] >= 40 and release["margin_z"] == 6.0
    assert release["failure_probability"] < 1e-9 and release["sigma"] > 1
    entries = api.client.get(f"/v1/datasets/{body['dataset_id']}/ledger",
                             headers=auth(token)).json()["entries"]
    assert [e["kind"] for e in entries] == ["budget_created", "histogram_released"]
    charged = entries[1]["payload"]
    assert charged["statistic"] == "dataset_size"
    assert charged["release_id"] == release["release_id"]
    assert charged["event"]["sigma"] == release["sigma"]
    budget = api.client.get(f"/v1/datasets/{body['dataset_id']}/budget",
                            headers=auth(token)).json()
    assert budget["dataset_epsilon_spent"] > 0 and budget["declared_size"] == body[
        "declared_size"]
    # a reader sees N̂ and how it was made, never the true count or the stored file
    seen = api.client.get(f"/v1/datasets/{body['dataset_id']}",
                          headers=auth(_reader(api, tenant_id))).json()
    assert seen["declared_size"] == body["declared_size"] and seen["size_release"] == release
    assert seen["true_size"] is None and seen["sha256"] is None and seen["size_bytes"] is None


def test_the_stored_files_size_and_hash_are_owner_only(api: Api) -> None:
    tenant_id, token = api.tenant()
    dataset = api.private_dataset(token, n=12)
    reader = _reader(api, tenant_id)
    owner_view = api.client.get(f"/v1/datasets/{dataset}", headers=auth(token)).json()
    assert owner_view["sha256"] and owner_view["size_bytes"] > 0
    views: list[dict[str, Any]] = [
        api.client.get(f"/v1/datasets/{dataset}", headers=auth(reader)).json(),
        *api.client.get("/v1/datasets", headers=auth(reader)).json()["items"]]
    child = api.client.post(f"/v1/datasets/{dataset}/derive", headers=auth(reader), json={
        "name": "sub", "kind": "subset", "classes": ["x", "y"]})
    assert child.status_code == 201, child.text
    views.append(child.json())  # derived datasets copy both: hidden there too
    for view in views:
        assert view["sha256"] is None and view["size_bytes"] is None, view
    public = api.public_dataset(token)
    assert api.client.get(f"/v1/datasets/{public}", headers=auth(reader)).json()["sha256"]


def _subjects(subjects: list[int], labels: list[int], start: int) -> bytes:
    images = np.repeat(np.arange(start * 10, start * 10 + len(labels), dtype=np.uint8),
                       64).reshape(-1, 8, 8)  # one distinct flat image per record
    return b.npz_bytes(images=images,
                       labels=np.asarray(labels, dtype=np.int64),
                       subjects=np.asarray(subjects, dtype=np.int64))


def test_partitions_disjoint_is_declared_and_checked(api: Api) -> None:
    _, token = api.tenant()
    meta = {**PRIVATE, "label_domain": ["a", "b"], "privacy_unit": "subject",
            "declared_size": 10}
    disjoint = _subjects([0, 0, 1, 2], [0, 0, 1, 1], 0)
    r = api.upload(token, disjoint, meta, filename="s.npz")
    assert r.status_code == 201, r.text
    assert r.json()["partitions_disjoint"] is False  # the safe default, not computed
    assert api.ledger.budgets[r.json()["dataset_id"]].partitions_disjoint is False
    r = api.upload(token, _subjects([5, 5, 6, 7], [0, 0, 1, 1], 1),
                   {**meta, "partitions_disjoint": True}, filename="s.npz")
    assert r.status_code == 201 and r.json()["partitions_disjoint"] is True, r.text
    r = api.upload(token, _subjects([8, 8, 9, 10], [0, 1, 1, 1], 2),
                   {**meta, "partitions_disjoint": True}, filename="s.npz")
    assert r.status_code == 422 and r.json()["code"] == "invalid_dataset", r.text
    assert "partitions_disjoint is declared true" in r.json()["detail"]
