"""Which budget a dataset charges, in its budget view (issue 15, item 9).

The dashboard groups datasets that share a budget under the budget's owner; the budget view
says which budget it is (``budget_id``) and which of the tenant's datasets charge it
(``budget_dataset_ids``: the owner first, then derived and linked ones, deleted ones
included). The api on real PostgreSQL with the REAL ledger app over HTTP.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tests.integration.api.conftest import Api, auth
from tests.unit.api import builders as b

DOMAIN = ["x", "y", "z"]


def _images(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, 8, 8), dtype=np.uint8)


def _private(api: Api, token: str, images: np.ndarray, **meta: Any) -> dict[str, Any]:
    body = {"name": "priv", "visibility": "private", "epsilon_limit": 10.0,
            "label_domain": DOMAIN, "declared_size": len(images), **meta}
    r = api.upload(token, b.npz_bytes(images=images, labels=np.arange(len(images)) % 3),
                   {k: v for k, v in body.items() if v is not None}, filename="d.npz")
    assert r.status_code == 201, r.text
    return dict(r.json())


def _budget(api: Api, token: str, dataset_id: str) -> dict[str, Any]:
    r = api.client.get(f"/v1/datasets/{dataset_id}/budget", headers=auth(token))
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_a_budget_view_names_its_owner_and_every_dataset_that_shares_it(
        real_ledger_api: Api) -> None:
    api = real_ledger_api
    _, owner_key = api.tenant("groups")
    images = _images(21, 24)
    owner = _private(api, owner_key, images, name="ward 7")["dataset_id"]
    alone = _private(api, owner_key, _images(22, 12), name="alone")["dataset_id"]
    r = api.client.post(f"/v1/datasets/{owner}/derive", headers=auth(owner_key),
                        json={"name": "ward 7: x and y", "kind": "subset",
                              "classes": ["x", "y"]})
    assert r.status_code == 201, r.text
    subset = r.json()["dataset_id"]
    linked = _private(api, owner_key, np.concatenate([images[:6], _images(23, 10)]),
                      name="ward 7 again", on_overlap="link",
                      epsilon_limit=None)["dataset_id"]
    r = api.client.delete(f"/v1/datasets/{subset}", headers=auth(owner_key))
    assert r.status_code == 200, r.text

    # every member of the group shows the same budget, its owner and its members
    group = [owner, subset, linked]
    views = [_budget(api, owner_key, d) for d in group]
    for view in views:
        assert view["budget_id"] == owner == view["dataset_id"]
        assert view["budget_dataset_ids"] == group  # owner first; the deleted one stays
    figures = ("epsilon_limit", "dataset_epsilon_spent", "dataset_epsilon_reserved",
               "dataset_epsilon_remaining")
    assert len({tuple(v[f] for f in figures) for v in views}) == 1

    # a budget of its own: itself only
    solo = _budget(api, owner_key, alone)
    assert solo["budget_id"] == alone and solo["budget_dataset_ids"] == [alone]

    # the dataset list gives the same grouping (what a reader key sees)
    _, reader = api.tenant("readers-of-groups")  # another tenant sees none of it
    r = api.client.get(f"/v1/datasets/{owner}/budget", headers=auth(reader))
    assert r.status_code == 404, r.text
    r = api.client.get("/v1/datasets", headers=auth(owner_key))
    by_id = {d["dataset_id"]: d for d in r.json()["items"]}
    assert {d: by_id[d]["budget_id"] for d in group} == dict.fromkeys(group, owner)
    assert by_id[subset]["deleted_at"] is not None

    # the owner's limit lowered through a member: the view still names the group
    r = api.client.patch(f"/v1/datasets/{linked}/budget", headers=auth(owner_key),
                         json={"epsilon_limit": 8.0})
    assert r.status_code == 200, r.text
    assert r.json()["budget_id"] == owner and r.json()["budget_dataset_ids"] == group
    assert _budget(api, owner_key, owner)["epsilon_limit"] == 8.0


def test_the_openapi_budget_view_documents_the_group_fields(real_ledger_api: Api) -> None:
    schema = real_ledger_api.client.get("/openapi.json").json()
    props = schema["components"]["schemas"]["BudgetOut"]["properties"]
    assert props["budget_id"]["type"] == "string"
    assert props["budget_dataset_ids"]["items"]["type"] == "string"
    assert "budget_id" in schema["components"]["schemas"]["BudgetOut"]["required"]
