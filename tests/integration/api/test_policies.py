"""Budget policies at the api (issue 4, item 5): a limit only ever lowered and enforced at
the next admission, the per-tenant cap on any dataset's limit, the warning threshold.

The limit and warning tests run against the REAL ledger (fixture ``both`` of
test_ledger_export.py); the tenant cap lives in the api alone (the in-memory ledger).
"""

from __future__ import annotations

from tests.integration.api import test_ledger_export as export
from tests.integration.api.conftest import Api, auth
from tests.integration.api.test_ledger_export import Both, fresh_npz, private, release
from tests.unit.api import builders as b

both = export.both  # the api wired to the real ledger (a fixture)

# -- a limit is set at upload and only ever lowered --------------------------------------


def test_a_raise_is_refused_and_a_lowering_binds_the_next_admission(both: Both) -> None:
    api = both.api
    _, token = api.tenant()
    dataset = private(api, token, epsilon_limit=10.0)
    model = api.model(token)
    assert api.finetune(token, dataset, model, epsilon=2.0,
                        dry_run=True).json()["plan"]["admissible"] is True
    r = api.client.patch(f"/v1/datasets/{dataset}/budget", headers=auth(token),
                         json={"epsilon_limit": 12.0})
    assert r.status_code == 422 and r.json()["code"] == "policy_violation", r.text
    assert api.client.get(f"/v1/datasets/{dataset}/budget",
                          headers=auth(token)).json()["epsilon_limit"] == 10.0
    release(api, token, dataset, epsilon=1.0)  # charged at once
    spent = api.client.get(f"/v1/datasets/{dataset}/budget",
                           headers=auth(token)).json()["dataset_epsilon_spent"]
    # lower the limit to just above what is spent: the same job no longer fits
    r = api.client.patch(f"/v1/datasets/{dataset}/budget", headers=auth(token),
                         json={"epsilon_limit": round(spent + 0.05, 3)})
    assert r.status_code == 200, r.text
    view = r.json()
    assert view["epsilon_limit"] == round(spent + 0.05, 3)
    assert view["epsilon_limit_initial"] == 10.0
    assert view["dataset_epsilon_spent"] == spent
    assert api.client.get(f"/v1/datasets/{dataset}", headers=auth(token)).json()[
        "epsilon_limit"] == view["epsilon_limit"]  # the api's row follows
    r = api.finetune(token, dataset, model, epsilon=2.0)
    assert r.status_code == 409 and r.json()["code"] == "privacy_budget_exhausted", r.text
    # a limit below what is already spent is allowed: it only blocks new work
    r = api.client.patch(f"/v1/datasets/{dataset}/budget", headers=auth(token),
                         json={"epsilon_limit": spent / 2})
    assert r.status_code == 200, r.text
    assert r.json()["dataset_epsilon_remaining"] == 0.0 and r.json()["warning"] is True
    kinds = [e["kind"] for e in api.client.get(f"/v1/datasets/{dataset}/ledger",
                                               headers=auth(token)).json()["entries"]]
    assert kinds.count("limit_lowered") == 2
    report = api.client.get(f"/v1/datasets/{dataset}/ledger/verify",
                            headers=auth(token)).json()
    assert report["ok"] is True, report


def test_lowering_needs_the_owner_scope(both: Both) -> None:
    api = both.api
    tenant, token = api.tenant()
    dataset = private(api, token)
    r = api.client.post(f"/v1/tenants/{tenant}/keys", headers=auth(api.admin),
                        json={"scopes": ["read"]})
    reader = r.json()["api_key"]
    r = api.client.patch(f"/v1/datasets/{dataset}/budget", headers=auth(reader),
                         json={"epsilon_limit": 5.0})
    assert r.status_code == 403
    _, intruder = api.tenant("intruder")
    r = api.client.patch(f"/v1/datasets/{dataset}/budget", headers=auth(intruder),
                         json={"epsilon_limit": 5.0})
    assert r.status_code == 404
    r = api.client.patch(f"/v1/datasets/{dataset}/budget", headers=auth(token), json={})
    assert r.status_code == 400 and r.json()["code"] == "invalid_request"


# -- the warning threshold ----------------------------------------------------------------

def test_the_warning_flag_flips_at_the_fraction(both: Both) -> None:
    api = both.api
    _, token = api.tenant()
    dataset = private(api, token, epsilon_limit=10.0)
    view = api.client.get(f"/v1/datasets/{dataset}/budget", headers=auth(token)).json()
    assert view["warning"] is False and view["warning_fraction"] == 0.8
    release(api, token, dataset, epsilon=1.0)
    view = api.client.get(f"/v1/datasets/{dataset}/budget", headers=auth(token)).json()
    fraction = view["dataset_epsilon_spent"] / view["epsilon_limit"]
    assert 0 < fraction < 0.8 and view["warning"] is False
    above, below = fraction * 1.01, fraction * 0.99
    r = api.client.patch(f"/v1/datasets/{dataset}/budget", headers=auth(token),
                         json={"warning_fraction": above})
    assert r.status_code == 200 and r.json()["warning"] is False
    r = api.client.patch(f"/v1/datasets/{dataset}/budget", headers=auth(token),
                         json={"warning_fraction": below})
    assert r.json()["warning"] is True and r.json()["warning_fraction"] == below
    got = api.client.get(f"/v1/datasets/{dataset}", headers=auth(token)).json()
    assert got["warning_fraction"] == below
    # back at the default fraction, lowering the limit makes spent cross 80% of it
    api.client.patch(f"/v1/datasets/{dataset}/budget", headers=auth(token),
                     json={"warning_fraction": 0.8})
    spent = view["dataset_epsilon_spent"]
    r = api.client.patch(f"/v1/datasets/{dataset}/budget", headers=auth(token),
                         json={"epsilon_limit": spent / 0.8 * 1.01})
    assert r.json()["warning"] is False
    r = api.client.patch(f"/v1/datasets/{dataset}/budget", headers=auth(token),
                         json={"epsilon_limit": spent / 0.8 * 0.99})
    assert r.json()["warning"] is True


def test_the_upload_fraction_is_the_budgets(both: Both) -> None:
    api = both.api
    _, token = api.tenant()
    dataset = private(api, token, warning_fraction=0.5)
    view = api.client.get(f"/v1/datasets/{dataset}/budget", headers=auth(token)).json()
    assert view["warning_fraction"] == 0.5


# -- the tenant cap -----------------------------------------------------------------------

def _upload(api: Api, token: str, limit: float) -> int:
    r = api.upload(token, fresh_npz(), {"name": "p", "visibility": "private",
                                        "epsilon_limit": limit, "declared_size": 12,
                                        "label_domain": ["x", "y", "z"]}, filename="d.npz")
    return int(r.status_code)


def test_a_tenant_cap_refuses_larger_uploads_and_lists_datasets_above(api: Api) -> None:
    tenant, token = api.tenant()
    assert _upload(api, token, 9.0) == 201
    assert _upload(api, token, 3.0) == 201
    r = api.client.put(f"/v1/admin/tenants/{tenant}/policy", headers=auth(token),
                       json={"max_dataset_epsilon_limit": 4.0})
    assert r.status_code == 403  # admins only
    r = api.client.put(f"/v1/admin/tenants/{tenant}/policy", headers=auth(api.admin),
                       json={"max_dataset_epsilon_limit": 4.0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["max_dataset_epsilon_limit"] == 4.0
    assert [d["epsilon_limit"] for d in body["datasets_above_cap"]] == [9.0]
    r = api.upload(token, fresh_npz(), {"name": "p", "visibility": "private",
                                        "epsilon_limit": 4.5, "declared_size": 12,
                                        "label_domain": ["x", "y", "z"]}, filename="d.npz")
    assert r.status_code == 422 and r.json()["code"] == "policy_violation", r.text
    assert r.json()["max_dataset_epsilon_limit"] == 4.0
    assert _upload(api, token, 4.0) == 201
    # public uploads have no budget: no cap applies
    r = api.upload(token, b.zip_bytes(b.image_folder({"a": 2, "b": 2})),
                   {"name": "pub", "visibility": "public"})
    assert r.status_code == 201, r.text
    # another tenant is not capped
    _, other = api.tenant("other")
    assert _upload(api, other, 9.0) == 201
    # null clears the cap
    r = api.client.put(f"/v1/admin/tenants/{tenant}/policy", headers=auth(api.admin),
                       json={"max_dataset_epsilon_limit": None})
    assert r.status_code == 200 and r.json()["datasets_above_cap"] == []
    assert _upload(api, token, 9.0) == 201
    r = api.client.put("/v1/admin/tenants/ten_nope/policy", headers=auth(api.admin),
                       json={"max_dataset_epsilon_limit": 1.0})
    assert r.status_code == 404
