"""A private dataset's ledger history through the api (issue 4, item 4): export as JSON and
CSV, the dataset-filtered verify report and the recompute report.

The api runs on its database and the REAL ledger app on another, joined over HTTP through
``HttpLedger`` (as in test_per_label.py), so the exported entries are the ledger's own signed,
hash-chained entries.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dpsynth_cli.ledger import verify_export
from dpsynth_shared.dp_events import chain_hash
from dpsynth_shared.grants import key_id_of, verify_message
from dpsynth_shared.ledger_contract import signed_message
from fastapi.testclient import TestClient

from tests.integration.api.conftest import Api, api_with_real_ledger, auth
from tests.integration.ledger.conftest import AUTH as LEDGER_AUTH
from tests.unit.api import builders as b


@dataclass
class Both:
    """The api (wired to the real ledger) and a direct client of that ledger."""

    api: Api
    ledger: TestClient


@pytest.fixture()
def both(migrated_url: str, pg: Any, tmp_path: Path) -> Iterator[Both]:
    """The api on its database, the real ledger app on another, joined over HTTP."""
    with api_with_real_ledger(migrated_url, pg, tmp_path) as (api, ledger_client):
        yield Both(api, ledger_client)


_SEEDS = itertools.count(1)


def fresh_npz(n: int = 12, k: int = 3) -> bytes:
    """``n`` random 8x8 images (a new seed each call: no record overlaps another upload's)."""
    rng = np.random.default_rng(next(_SEEDS))
    images = rng.integers(0, 255, size=(n, 8, 8), dtype=np.uint8)
    return b.npz_bytes(images=images, labels=np.arange(n) % k)


def private(api: Api, token: str, *, epsilon_limit: float = 10.0, **meta: Any) -> str:
    r = api.upload(token, fresh_npz(), {
        "name": "priv", "visibility": "private", "epsilon_limit": epsilon_limit,
        "label_domain": ["x", "y", "z"], "declared_size": 12, **meta}, filename="d.npz")
    assert r.status_code == 201, r.text
    return str(r.json()["dataset_id"])


def release(api: Api, token: str, dataset: str, epsilon: float = 1.0) -> dict[str, Any]:
    """Release the class sizes: a Gaussian histogram charged to the budget at once."""
    r = api.client.post(f"/v1/datasets/{dataset}/class-sizes/release", headers=auth(token),
                        json={"target_epsilon": epsilon})
    assert r.status_code == 200, r.text
    return dict(r.json())


def _history(both: Both) -> tuple[str, str]:
    """A tenant's dataset with a charged release, its class sizes and a reserved job."""
    api = both.api
    _, token = api.tenant()
    dataset = private(api, token)
    release(api, token, dataset)
    model = api.model(token)
    r = api.finetune(token, dataset, model, epsilon=1.0, batch=4)
    assert r.status_code == 201, r.text
    return token, dataset


def test_export_json_is_the_ledgers_signed_entries(both: Both) -> None:
    token, dataset = _history(both)
    other = private(both.api, token)  # the chain is global: another budget's entries between
    release(both.api, token, other)
    r = both.api.client.get(f"/v1/datasets/{dataset}/ledger", headers=auth(token))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["dataset_id"] == body["budget_id"] == dataset
    ledger_entries = both.ledger.get("/v1/entries", params={"dataset_id": dataset},
                                     headers=LEDGER_AUTH).json()
    assert body["entries"] == ledger_entries
    assert [e["kind"] for e in body["entries"]] == [
        "budget_created", "histogram_released", "class_sizes_set", "reservation_accepted"]
    assert key_id_of(body["public_key"]) == body["key_id"]
    for e in body["entries"]:
        assert e["dataset_id"] == dataset and e["key_id"] == body["key_id"]
        content = {k: e[k] for k in ("seq", "dataset_id", "kind", "payload")}
        assert chain_hash(e["prev_hash"], content) == e["hash"]
        assert verify_message(signed_message(e["seq"], e["hash"]), e["signature"],
                              body["public_key"])
    seqs = [e["seq"] for e in body["entries"]]
    assert seqs == sorted(seqs)
    # the CLI's independent verifier accepts the real export, and names an edited entry
    assert verify_export(body, key_id=body["key_id"]) == ([], 4)
    body["entries"][1]["payload"]["rdp_delta"]["*"] = 0.0
    problems, _ = verify_export(body)
    assert problems == [f"entry {seqs[1]}: hash mismatch (content altered)"]


@pytest.mark.parametrize("how", ["query", "accept"])
def test_export_csv_has_one_row_per_entry(both: Both, how: str) -> None:
    token, dataset = _history(both)
    entries = both.api.client.get(f"/v1/datasets/{dataset}/ledger",
                                  headers=auth(token)).json()["entries"]
    if how == "query":
        r = both.api.client.get(f"/v1/datasets/{dataset}/ledger?format=csv",
                                headers=auth(token))
    else:
        r = both.api.client.get(f"/v1/datasets/{dataset}/ledger",
                                headers={**auth(token), "Accept": "text/csv"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert [int(row["seq"]) for row in rows] == [e["seq"] for e in entries]
    for row, e in zip(rows, entries, strict=True):
        assert row["kind"] == e["kind"] and row["hash"] == e["hash"]
        assert row["prev_hash"] == e["prev_hash"] and row["signature"] == e["signature"]
        payload = json.loads(row["payload"])
        assert payload == e["payload"]
        # the CSV alone is enough to recompute the entry's hash
        assert chain_hash(row["prev_hash"], {"seq": int(row["seq"]), "dataset_id":
                                             row["dataset_id"], "kind": row["kind"],
                                             "payload": payload}) == row["hash"]
    charged = next(row for row in rows if row["kind"] == "histogram_released")
    assert set(json.loads(charged["rdp_charges"])) == {"*", "x", "y", "z"}
    assert float(charged["dataset_epsilon_spent_after"]) > 0
    job = next(row for row in rows if row["kind"] == "reservation_accepted")
    assert job["job_id"].startswith("job") and job["reservation_id"]


def test_other_tenants_get_404_and_public_datasets_have_no_ledger(both: Both) -> None:
    api = both.api
    _, dataset = _history(both)
    _, intruder = api.tenant("intruder")
    for path in ("ledger", "ledger?format=csv", "ledger/verify", "ledger/recompute"):
        r = api.client.get(f"/v1/datasets/{dataset}/{path}", headers=auth(intruder))
        assert r.status_code == 404, (path, r.text)
        assert dataset not in json.dumps(r.json().get("entries", []))
    _, token = api.tenant("pub")
    public = api.public_dataset(token)
    r = api.client.get(f"/v1/datasets/{public}/ledger", headers=auth(token))
    assert r.status_code == 422 and r.json()["code"] == "visibility_mismatch"


def test_verify_and_recompute_reports(both: Both) -> None:
    token, dataset = _history(both)
    r = both.api.client.get(f"/v1/datasets/{dataset}/ledger/verify", headers=auth(token))
    assert r.status_code == 200, r.text
    report = r.json()
    assert report["ok"] is True, report
    assert report["entries"] == 4 and report["details"]["figures_checked"] >= 2
    budget = both.api.client.get(f"/v1/datasets/{dataset}/budget", headers=auth(token)).json()
    assert report["details"]["replayed_spent"] == budget["dataset_epsilon_spent"]
    r = both.api.client.get(f"/v1/datasets/{dataset}/ledger/recompute", headers=auth(token))
    assert r.status_code == 200, r.text
    rec = r.json()
    (charge,) = rec["charges"]
    assert charge["kind"] == "histogram_released" and charge["differs"] is False
    assert rec["differences"] == []
    assert rec["recomputed"]["dataset_epsilon_spent"] == budget["dataset_epsilon_spent"]
    assert rec["recorded"]["dataset_epsilon_spent"] == budget["dataset_epsilon_spent"]
    assert rec["admission_order"] == budget["admission_order"]


def test_a_derived_dataset_exports_its_parents_budget_and_deletion_keeps_it(both: Both) -> None:
    api = both.api
    token, parent = _history(both)
    r = api.client.post(f"/v1/datasets/{parent}/derive", headers=auth(token),
                        json={"name": "xy", "kind": "subset", "classes": ["x", "y"]})
    assert r.status_code == 201, r.text
    child = r.json()["dataset_id"]
    body = api.client.get(f"/v1/datasets/{child}/ledger", headers=auth(token)).json()
    assert body["dataset_id"] == child and body["budget_id"] == parent
    assert [e["dataset_id"] for e in body["entries"]] == [parent] * 4
    r = api.client.patch(f"/v1/datasets/{child}/budget", headers=auth(token),
                         json={"epsilon_limit": 9.0})  # the shared budget is lowered
    assert r.status_code == 200 and r.json()["dataset_id"] == parent, r.text
    assert api.client.get(f"/v1/datasets/{parent}", headers=auth(token)).json()[
        "epsilon_limit"] == 9.0
    r = api.client.delete(f"/v1/datasets/{child}", headers=auth(token))
    assert r.status_code == 200, r.text
    after = api.client.get(f"/v1/datasets/{child}/ledger", headers=auth(token))
    assert after.status_code == 200  # the history outlives the data
    assert [e["kind"] for e in after.json()["entries"]][-1] == "limit_lowered"
    assert api.client.get(f"/v1/datasets/{child}/ledger/verify",
                          headers=auth(token)).json()["ok"] is True
