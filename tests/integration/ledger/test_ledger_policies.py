"""Budget policies at the ledger (issue 4, item 5), on real PostgreSQL.

A limit is only ever lowered (the RDP budget is the conversion of the new limit at the
FIXED order), the change is a chained entry that verify replays, the lowered limit binds the
next admission, the warning flag follows the fraction, and the recompute report lists every
charge next to today's code without writing anything.
"""

from __future__ import annotations

from typing import Any

from dpsynth_ledger.accounting import epsilon_to_rdp_budget
from dpsynth_ledger.settings import LedgerSettings
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from .conftest import new_budget

DATASET = "ds_policy"


def _reserve(client: TestClient, job: str, epsilon: float, *, dry_run: bool = False) -> Any:
    return client.post("/v1/reservations", json={
        "job_id": job, "dataset_id": DATASET, "target_epsilon": epsilon,
        "expected_batch_size": 600, "steps": 300, "dry_run": dry_run})


def _spend(client: TestClient, job: str, epsilon: float) -> None:
    """Reserve a job, read, lease all of its steps (charged) and close it."""
    r = _reserve(client, job, epsilon)
    assert r.status_code == 201, r.text
    rid = r.json()["reservation_id"]
    assert client.post(f"/v1/reservations/{rid}/read-grants",
                       json={"attempt": 1, "worker_id": "w"}).status_code == 201
    r = client.post(f"/v1/reservations/{rid}/leases",
                    json={"attempt": 1, "start_step": 0, "steps": 300})
    assert r.status_code == 201, r.text
    assert client.post(f"/v1/reservations/{rid}/close",
                       json={"outcome": "succeeded"}).status_code == 200


def test_view_carries_the_policy_fields(client: TestClient) -> None:
    view = new_budget(client, DATASET, epsilon_limit=8.0, partitions=["a", "b"])
    assert view["epsilon_limit_initial"] == 8.0
    assert view["warning_fraction"] == 0.8 and view["warning"] is False
    assert view["privacy_unit"] == "image" and view["partitions_disjoint"] is True
    assert view["partition_epsilon_spent"] == {"*": 0.0, "a": 0.0, "b": 0.0}


def test_a_raise_is_refused_and_a_lowering_is_chained_and_replayed(client: TestClient) -> None:
    created = new_budget(client, DATASET, epsilon_limit=8.0)
    r = client.post(f"/v1/budgets/{DATASET}/limit", json={"epsilon_limit": 9.0})
    assert r.status_code == 422 and r.json()["code"] == "policy_violation", r.text
    assert r.json()["epsilon_limit"] == 8.0
    r = client.post(f"/v1/budgets/{DATASET}/limit", json={})
    assert r.status_code == 400 and r.json()["code"] == "invalid_request"
    r = client.post(f"/v1/budgets/{DATASET}/limit", json={"epsilon_limit": 5.0})
    assert r.status_code == 200, r.text
    view = r.json()
    order = created["admission_order"]
    assert view["admission_order"] == order  # the order is never re-chosen
    assert view["epsilon_limit"] == 5.0 and view["epsilon_limit_initial"] == 8.0
    assert view["rdp_budget"] == epsilon_to_rdp_budget(5.0, order, 1e-6)
    assert view["rdp_budget"] < created["rdp_budget"]
    entries = client.get("/v1/entries", params={"dataset_id": DATASET}).json()
    last = entries[-1]
    assert last["kind"] == "limit_lowered"
    assert last["payload"]["epsilon_limit_before"] == 8.0
    assert last["payload"]["epsilon_limit"] == 5.0
    # equal to the current limit: nothing to lower, no entry
    r = client.post(f"/v1/budgets/{DATASET}/limit", json={"epsilon_limit": 5.0})
    assert r.status_code == 200
    assert len(client.get("/v1/entries", params={"dataset_id": DATASET}).json()) == len(entries)
    report = client.get(f"/v1/budgets/{DATASET}/verify").json()
    assert report["ok"] is True, report
    assert report["details"]["replayed_limit"] == 5.0
    assert report["entries"] == len(entries)


def test_the_lowered_limit_binds_the_next_admission(client: TestClient) -> None:
    new_budget(client, DATASET, epsilon_limit=8.0)
    assert _reserve(client, "job_dry", 3.0, dry_run=True).json()["admissible"] is True
    _spend(client, "job_1", 2.0)
    spent = client.get(f"/v1/budgets/{DATASET}").json()["dataset_epsilon_spent"]
    assert spent > 2.0
    # a limit below what is already spent is allowed: it only blocks new work
    r = client.post(f"/v1/budgets/{DATASET}/limit", json={"epsilon_limit": spent / 2})
    assert r.status_code == 200, r.text
    view = r.json()
    assert view["dataset_epsilon_spent"] == spent  # spent never changes
    assert view["dataset_epsilon_remaining"] == 0.0 and view["warning"] is True
    r = _reserve(client, "job_2", 0.1)
    assert r.status_code == 409 and r.json()["code"] == "privacy_budget_exhausted", r.text
    assert client.get(f"/v1/budgets/{DATASET}/verify").json()["ok"] is True


def test_warning_follows_the_fraction(client: TestClient) -> None:
    new_budget(client, DATASET, epsilon_limit=8.0)
    _spend(client, "job_1", 2.0)
    view = client.get(f"/v1/budgets/{DATASET}").json()
    fraction = view["dataset_epsilon_spent"] / view["epsilon_limit"]
    assert view["warning"] is False and fraction < 0.8
    r = client.post(f"/v1/budgets/{DATASET}/limit",
                    json={"warning_fraction": round(fraction, 6) + 1e-6})
    assert r.json()["warning"] is False
    r = client.post(f"/v1/budgets/{DATASET}/limit",
                    json={"warning_fraction": round(fraction, 6) - 1e-6})
    assert r.json()["warning"] is True and r.json()["warning_fraction"] < fraction
    kinds = [e["kind"] for e in client.get("/v1/entries",
                                           params={"dataset_id": DATASET}).json()]
    assert kinds[-2:] == ["warning_fraction_set", "warning_fraction_set"]


def test_recompute_lists_every_charge_and_writes_nothing(client: TestClient) -> None:
    new_budget(client, DATASET, epsilon_limit=8.0)
    _spend(client, "job_1", 1.0)
    _spend(client, "job_2", 1.0)
    before = client.get("/v1/entries", params={"dataset_id": DATASET}).json()
    report = client.get(f"/v1/budgets/{DATASET}/recompute").json()
    assert [c["kind"] for c in report["charges"]] == ["lease_granted", "lease_granted"]
    for charge in report["charges"]:
        assert charge["differs"] is False
        assert charge["recorded_rdp"] == {"*": charge["recomputed_rdp"]}
    assert report["differences"] == []
    view = client.get(f"/v1/budgets/{DATASET}").json()
    assert report["recorded"]["dataset_epsilon_spent"] == view["dataset_epsilon_spent"]
    assert report["recomputed"]["dataset_epsilon_spent"] == view["dataset_epsilon_spent"]
    assert report["recomputed"]["dataset_tight_epsilon"] == view["dataset_tight_epsilon"]
    assert client.get("/v1/entries", params={"dataset_id": DATASET}).json() == before


def test_recompute_and_verify_name_an_altered_charge(client: TestClient,
                                                     settings: LedgerSettings) -> None:
    """An entry whose recorded charge differs from what the event costs (here: edited in
    the database, as a stand-in for an accountant upgrade) is listed, and nothing changes."""
    new_budget(client, DATASET, epsilon_limit=8.0)
    _spend(client, "job_1", 1.0)
    lease = next(e for e in client.get("/v1/entries", params={"dataset_id": DATASET}).json()
                 if e["kind"] == "lease_granted")
    engine = create_engine(settings.database.url)
    try:
        with engine.begin() as conn:
            conn.execute(text("ALTER TABLE ledger.entries DISABLE TRIGGER ALL"))
            conn.execute(text("UPDATE ledger.entries SET payload = jsonb_set(payload, "
                              "'{rdp_delta,*}', to_jsonb(0.001)) WHERE seq = :s"),
                         {"s": lease["seq"]})
            conn.execute(text("ALTER TABLE ledger.entries ENABLE TRIGGER ALL"))
    finally:
        engine.dispose()
    view_before = client.get(f"/v1/budgets/{DATASET}").json()
    report = client.get(f"/v1/budgets/{DATASET}/recompute").json()
    (charge,) = report["charges"]
    assert charge["seq"] == lease["seq"] and charge["differs"] is True
    assert charge["recorded_rdp"] == {"*": 0.001}
    assert any(d.startswith(f"entry {lease['seq']} ") for d in report["differences"])
    assert client.get(f"/v1/budgets/{DATASET}").json()["dataset_epsilon_spent"] == \
        view_before["dataset_epsilon_spent"]
    verify = client.get(f"/v1/budgets/{DATASET}/verify").json()
    assert verify["ok"] is False
    assert any(p.startswith(f"entry {lease['seq']}:") for p in verify["problems"])


def test_verify_of_one_dataset_ignores_another_datasets_problem(
        client: TestClient, settings: LedgerSettings) -> None:
    new_budget(client, DATASET, epsilon_limit=8.0)
    new_budget(client, "ds_other", epsilon_limit=8.0)
    other = client.get("/v1/entries", params={"dataset_id": "ds_other"}).json()[0]
    engine = create_engine(settings.database.url)
    try:
        with engine.begin() as conn:
            conn.execute(text("ALTER TABLE ledger.entries DISABLE TRIGGER ALL"))
            conn.execute(text("UPDATE ledger.entries SET payload = jsonb_set(payload, "
                              "'{tenant_id}', to_jsonb('x'::text)) WHERE seq = :s"),
                         {"s": other["seq"]})
            conn.execute(text("ALTER TABLE ledger.entries ENABLE TRIGGER ALL"))
    finally:
        engine.dispose()
    assert client.get("/v1/chain/verify").json()["ok"] is False
    mine = client.get(f"/v1/budgets/{DATASET}/verify").json()
    assert mine["ok"] is True, mine
    assert mine["details"]["problems_elsewhere"] >= 1
    theirs = client.get("/v1/budgets/ds_other/verify").json()
    assert theirs["ok"] is False
    assert client.get("/v1/budgets/ds_none/verify").status_code == 404


def test_recompute_uses_the_datasets_relation(client: TestClient) -> None:
    """On a replace-one dataset each DP-SGD charge entered through group privacy; the
    recompute charges it the same way (no difference) and its tight figure is the view's."""
    r = client.post("/v1/budgets", json={
        "dataset_id": DATASET, "tenant_id": "ten_test", "epsilon_limit": 8.0, "delta": 1e-6,
        "declared_size": 60_000, "neighbouring": "replace_one"})
    assert r.status_code == 201, r.text
    _spend(client, "job_1", 1.0)
    report = client.get(f"/v1/budgets/{DATASET}/recompute").json()
    (charge,) = report["charges"]
    assert charge["differs"] is False and report["differences"] == []
    view = client.get(f"/v1/budgets/{DATASET}").json()
    assert report["recomputed"]["dataset_tight_epsilon"] == view["dataset_tight_epsilon"]
    assert client.get(f"/v1/budgets/{DATASET}/verify").json()["ok"] is True
