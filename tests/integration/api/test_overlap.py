"""The budget belongs to the records (issue 4, item 1), at the api on real PostgreSQL.

Re-uploads of a tenant's private records are refused (``private_data_overlap``) or linked to
their budget; private records cannot be re-declared public (``public_private_overlap``);
deletion removes the data but keeps the budget, its ledger and the record hashes; derived
datasets (subsets, splits) are selections charged to the parent's budget with q = b / N̂_child.
Most tests use the in-memory ledger; the budget-sharing ones use the REAL ledger app on its
own database over HTTP.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from dpsynth_api.db import make_session_factory
from dpsynth_api.tables import RecordHash
from PIL import Image
from sqlalchemy import create_engine, func, select

from tests.integration.api.conftest import Api, auth
from tests.unit.api import builders as b

DOMAIN = ["x", "y", "z"]


def _images(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, 8, 8), dtype=np.uint8)


def _npz(images: np.ndarray, k: int = 3) -> bytes:
    return b.npz_bytes(images=images, labels=np.arange(len(images)) % k)


def _private(api: Api, token: str, images: np.ndarray, **meta: Any) -> Any:
    body = {"name": "priv", "visibility": "private", "epsilon_limit": 10.0,
            "label_domain": DOMAIN, "declared_size": len(images), **meta}
    return api.upload(token, _npz(images), {k: v for k, v in body.items() if v is not None},
                      filename="d.npz")


def _hash_rows(api: Api, dataset_id: str) -> int:
    engine = create_engine(api.settings.database.url)
    try:
        with make_session_factory(engine)() as session:
            return int(session.scalar(select(func.count()).select_from(RecordHash).where(
                RecordHash.dataset_id == dataset_id)) or 0)
    finally:
        engine.dispose()


def test_every_record_is_hashed_in_the_upload_transaction(api: Api) -> None:
    _, token = api.tenant()
    r = _private(api, token, _images(1, 12))
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["budget_id"] == body["dataset_id"] and body["derivation"] is None
    assert _hash_rows(api, body["dataset_id"]) == 12
    public = api.public_dataset(token)
    assert _hash_rows(api, public) == 6
    api.ledger.fail_create = True  # the ledger refuses: no row, no hash, no object
    r = _private(api, token, _images(2, 12))
    assert r.status_code == 503
    engine = create_engine(api.settings.database.url)
    with make_session_factory(engine)() as session:
        assert session.scalar(select(func.count()).select_from(RecordHash)) == 18
    engine.dispose()


def test_reuploading_private_records_is_refused(api: Api) -> None:
    _, token = api.tenant()
    images = _images(3, 12)
    first = _private(api, token, images).json()["dataset_id"]
    again = _private(api, token, images)
    assert again.status_code == 409, again.text
    problem = again.json()
    assert problem["code"] == "private_data_overlap"
    assert problem["datasets"] == [first] and problem["overlapping_records"] == 12
    # a subset of it, mixed with new records: only the shared ones are counted
    mixed = np.concatenate([images[:5], _images(4, 7)])
    r = _private(api, token, mixed)
    assert r.status_code == 409
    assert r.json()["code"] == "private_data_overlap"
    assert r.json()["overlapping_records"] == 5
    assert "index" not in r.text and "record 0" not in r.text


def test_private_images_cannot_be_redeclared_public(api: Api) -> None:
    _, token = api.tenant()
    images = _images(5, 12)
    first = _private(api, token, images).json()["dataset_id"]
    r = api.upload(token, _npz(images[:4]), {"name": "leak", "visibility": "public"},
                   filename="d.npz")
    assert r.status_code == 409, r.text
    assert r.json()["code"] == "public_private_overlap"
    assert r.json()["datasets"] == [first] and r.json()["overlapping_records"] == 4


def test_a_private_upload_of_public_records_is_accepted(api: Api) -> None:
    _, token = api.tenant()
    images = _images(6, 12)
    r = api.upload(token, _npz(images), {"name": "pub", "visibility": "public"},
                   filename="d.npz")
    assert r.status_code == 201
    assert _private(api, token, images).status_code == 201


def test_overlap_is_checked_within_the_tenant_only(api: Api) -> None:
    _, alice = api.tenant("alice")
    _, bob = api.tenant("bob")
    images = _images(7, 12)
    assert _private(api, alice, images).status_code == 201
    r = _private(api, bob, images)  # bob learns nothing about alice's data
    assert r.status_code == 201, r.text
    assert r.json()["budget_id"] == r.json()["dataset_id"]


def _png_folder(images: np.ndarray) -> bytes:
    members = {}
    for i, image in enumerate(images):
        buf = io.BytesIO()
        Image.fromarray(image, mode="L").save(buf, format="PNG")
        members[f"data/{DOMAIN[i % 3]}/{i}.png"] = buf.getvalue()
    return b.zip_bytes(members)


def test_a_png_folder_and_an_npz_of_the_same_images_overlap(api: Api) -> None:
    _, token = api.tenant()
    images = _images(8, 9)
    r = api.upload(token, _png_folder(images), {
        "name": "folder", "visibility": "private", "epsilon_limit": 5.0,
        "label_domain": DOMAIN, "declared_size": 9})
    assert r.status_code == 201, r.text
    folder = r.json()["dataset_id"]
    r = _private(api, token, images[::-1].copy())
    assert r.status_code == 409
    assert r.json()["datasets"] == [folder] and r.json()["overlapping_records"] == 9


def test_link_mode_charges_the_existing_budget(api: Api) -> None:
    _, token = api.tenant()
    images = _images(9, 12)
    parent = _private(api, token, images, delta=1e-3).json()
    more = np.concatenate([images[:6], _images(10, 10)])
    r = _private(api, token, more, on_overlap="link", epsilon_limit=None,
                 label_domain=DOMAIN)
    assert r.status_code == 201, r.text
    linked = r.json()
    assert linked["budget_id"] == parent["dataset_id"]
    assert linked["parent_id"] == parent["dataset_id"]
    assert linked["derivation"] == {"kind": "link", "parent": parent["dataset_id"],
                                    "overlapping_records": 6}
    assert linked["delta"] == parent["delta"] == 1e-3
    assert linked["epsilon_limit"] == parent["epsilon_limit"]
    assert linked["declared_size"] == 16
    assert set(api.ledger.budgets) == {parent["dataset_id"]}  # no new ledger budget
    # its object sits under the budget's prefix (the budget's read grant covers it)
    key = f"private/datasets/{parent['dataset_id']}/linked/{linked['dataset_id']}/data.npz"
    assert api.store.stat(key) is not None
    budget = api.client.get(f"/v1/datasets/{linked['dataset_id']}/budget",
                            headers=auth(token)).json()
    assert budget["dataset_id"] == parent["dataset_id"]
    # a job on it charges the parent's budget, sampled at q = b / N̂_linked
    model = api.model(token)
    r = api.finetune(token, linked["dataset_id"], model, batch=4)
    assert r.status_code == 201, r.text
    (entry,) = api.ledger.reservations.values()
    assert entry.reservation.dataset_id == parent["dataset_id"]
    assert entry.reservation.plan is not None
    assert entry.reservation.plan.event.sample_rate == 4 / 16
    # the linked dataset's own records now belong to the budget too
    r = _private(api, token, _images(10, 10))
    assert r.status_code == 409
    assert r.json()["datasets"] == sorted([linked["dataset_id"]])


def test_link_refusals(api: Api) -> None:
    _, token = api.tenant()
    a, c = _images(11, 12), _images(12, 12)
    _private(api, token, a)
    _private(api, token, c)
    both = np.concatenate([a[:3], c[:3]])
    r = _private(api, token, both, on_overlap="link")
    assert r.status_code == 409 and r.json()["link_refused"] == "several_budgets"
    r = api.upload(token, _npz(a[:3]), {"name": "l", "visibility": "private",
                                        "on_overlap": "link", "label_domain": ["x", "y", "w"],
                                        "declared_size": 3},
                   filename="d.npz")
    assert r.status_code == 409 and r.json()["link_refused"] == "label_domain"
    # nothing to link to: a private dataset then needs its own limit
    r = _private(api, token, _images(13, 12), on_overlap="link", epsilon_limit=None)
    assert r.status_code == 422 and r.json()["code"] == "invalid_dataset"


def test_link_refused_when_delta_is_not_below_one_over_the_new_size(api: Api) -> None:
    _, token = api.tenant()
    images = _images(14, 12)
    _private(api, token, images, delta=0.05)  # < 1/12
    r = _private(api, token, np.concatenate([images, _images(15, 20)]), on_overlap="link")
    assert r.status_code == 409 and r.json()["link_refused"] == "delta"


def test_deleting_keeps_the_budget_the_entries_and_the_hashes(api: Api) -> None:
    _, token = api.tenant()
    images = _images(16, 12)
    ds = _private(api, token, images).json()["dataset_id"]
    model = api.model(token)
    job = api.finetune(token, ds, model).json()
    r = api.client.delete(f"/v1/datasets/{ds}", headers=auth(token))
    assert r.status_code == 409 and r.json()["code"] == "conflict"  # a job is queued
    assert r.json()["job_ids"] == [job["job_id"]]
    r = api.client.post(f"/v1/jobs/{job['job_id']}/cancel", headers=auth(token))
    assert r.status_code in (200, 202), r.text
    r = api.client.delete(f"/v1/datasets/{ds}", headers=auth(token))
    assert r.status_code == 200, r.text
    assert r.json()["deleted_at"] is not None
    assert api.store.stat(f"private/datasets/{ds}/data.npz") is None
    shown = api.client.get(f"/v1/datasets/{ds}", headers=auth(token)).json()
    assert shown["deleted_at"] is not None and shown["budget_id"] == ds
    budget = api.client.get(f"/v1/datasets/{ds}/budget", headers=auth(token))
    assert budget.status_code == 200 and budget.json()["dataset_id"] == ds
    assert _hash_rows(api, ds) == 12
    r = api.finetune(token, ds, model)
    assert r.status_code == 410 and r.json()["code"] == "dataset_deleted"
    r = _private(api, token, images)  # no fresh budget for the same records
    assert r.status_code == 409 and r.json()["code"] == "private_data_overlap"
    assert r.json()["datasets"] == [ds]
    r = _private(api, token, images, on_overlap="link")
    assert r.status_code == 201 and r.json()["budget_id"] == ds  # the old, charged budget
    assert api.client.delete(f"/v1/datasets/{ds}", headers=auth(token)).status_code == 200


def test_delete_needs_the_owner_scope(api: Api) -> None:
    tenant, token = api.tenant()
    ds = _private(api, token, _images(17, 12)).json()["dataset_id"]
    r = api.client.post(f"/v1/tenants/{tenant}/keys", headers=auth(api.admin),
                        json={"scopes": ["read", "submit"]})
    assert r.status_code == 201, r.text
    submitter = r.json()["api_key"]
    assert api.client.delete(f"/v1/datasets/{ds}", headers=auth(submitter)).status_code == 403
    _, other = api.tenant("other")
    assert api.client.delete(f"/v1/datasets/{ds}", headers=auth(other)).status_code == 404


def _derive(api: Api, token: str, dataset_id: str, **body: Any) -> Any:
    return api.client.post(f"/v1/datasets/{dataset_id}/derive", headers=auth(token),
                           json={"name": "child", **body})


def test_a_class_subset_is_a_selection_charged_to_the_parent(api: Api) -> None:
    _, token = api.tenant()
    parent = _private(api, token, _images(18, 12),
                      class_sizes={"x": 5, "y": 6, "z": 7}).json()
    r = _derive(api, token, parent["dataset_id"], kind="subset", classes=["z", "x"])
    assert r.status_code == 201, r.text
    child = r.json()
    assert child["class_names"] == ["x", "z"]  # the parent's order
    assert child["budget_id"] == parent["dataset_id"] and child["parent_id"] == parent["dataset_id"]
    assert child["true_size"] == 8 and child["declared_size"] == 5 + 7
    assert child["class_sizes"] == {"x": 5, "z": 7}
    assert child["derivation"]["selection"] == {"classes": ["x", "z"]}
    assert child["delta"] == parent["delta"]
    model = api.model(token)
    r = api.finetune(token, child["dataset_id"], model, batch=3)
    assert r.status_code == 201, r.text
    (entry,) = api.ledger.reservations.values()
    assert entry.reservation.dataset_id == parent["dataset_id"]
    assert entry.reservation.plan is not None
    assert entry.reservation.plan.event.sample_rate == 3 / 12
    claim = api.worker(f"{r.json()['job_id']}/claim", {"attempt": 1, "worker_id": "w"}).json()
    assert claim["dataset"]["object_key"] == parent_key(parent)
    assert claim["dataset"]["selection"] == {"classes": ["x", "z"]}
    assert claim["dataset"]["budget_id"] == parent["dataset_id"]
    assert claim["dataset"]["class_names"] == ["x", "z"]
    per_label = {"type": "finetune", "dataset_id": child["dataset_id"], "base_model_id": model,
                 "privacy": {"target_epsilon": 1.0},
                 "training": {"expected_batch_size": 2, "epochs": 1, "per_label": True}}
    r = api.client.post("/v1/jobs", json=per_label, headers=auth(token))
    assert r.status_code == 422 and r.json()["code"] == "invalid_spec"


def parent_key(parent: dict[str, Any]) -> str:
    return f"private/datasets/{parent['dataset_id']}/data.npz"


def _derivation_row(api: Api, dataset_id: str) -> dict[str, Any]:
    """The stored derivation (with the split's key, which no view shows)."""
    from dpsynth_api.tables import Dataset

    engine = create_engine(api.settings.database.url)
    try:
        with make_session_factory(engine)() as session:
            row = session.get(Dataset, dataset_id)
            assert row is not None and row.derivation is not None
            return dict(row.derivation)
    finally:
        engine.dispose()


def test_a_split_is_a_keyed_hash_selection_of_complementary_parts(api: Api) -> None:
    """Issue 13, item 1: each record's side is a keyed hash of its content (no indices, no
    permutation of the parent); the default N̂ of either part is the parent's N̂ (a
    keyed-hash part may keep every record); the true sizes come from the stored hashes."""
    from dpsynth_shared.record_splits import in_first_part, record_hashes

    _, token = api.tenant()
    images = _images(19, 20)
    parent = _private(api, token, images, declared_size=30).json()
    train = _derive(api, token, parent["dataset_id"], kind="split", fraction=0.75,
                    part="train")
    assert train.status_code == 201, train.text
    train = train.json()
    holdout = _derive(api, token, parent["dataset_id"], kind="split", fraction=0.75,
                      part="holdout").json()
    for child in (train, holdout):
        assert child["derivation"]["rule"] == "keyed_hash_v1"
        assert "seed" not in child["derivation"]
        assert child["derivation"]["selection"]["split"] == {
            "rule": "keyed_hash_v1", "fraction": 0.75, "part": child["derivation"]["part"]}
        assert child["declared_size"] == 30  # the parent's N̂, not ceil(0.75·30)
    stored = [_derivation_row(api, c["dataset_id"])["selection"]["split"]
              for c in (train, holdout)]
    assert stored[0]["key"] == stored[1]["key"] and len(stored[0]["key"]) == 64
    first = in_first_part(bytes.fromhex(stored[0]["key"]), record_hashes(images[..., None]),
                          0.75)
    assert train["true_size"] == int(first.sum()) and holdout["true_size"] == int(
        (~first).sum())
    counts = np.bincount((np.arange(20) % 3)[first], minlength=3).tolist()
    assert train["class_counts"] == dict(zip(DOMAIN, counts, strict=True))
    r = _derive(api, token, train["dataset_id"], kind="split", fraction=0.5, part="train")
    assert r.status_code == 400  # a split of a split: derive from the parent instead
    r = _derive(api, token, parent["dataset_id"], kind="split", fraction=0.05, part="holdout",
                declared_size=3)
    assert r.status_code == 400 and "true count" in r.json()["detail"]
    # deleting a split deletes nothing of the parent's data
    assert api.client.delete(f"/v1/datasets/{holdout['dataset_id']}",
                             headers=auth(token)).status_code == 200
    assert api.store.stat(parent_key(parent)) is not None
    # deleting the parent deletes the data every derived dataset reads
    assert api.client.delete(f"/v1/datasets/{parent['dataset_id']}",
                             headers=auth(token)).status_code == 200
    shown = api.client.get(f"/v1/datasets/{train['dataset_id']}", headers=auth(token)).json()
    assert shown["deleted_at"] is not None
    r = _derive(api, token, parent["dataset_id"], kind="subset", classes=["x"])
    assert r.status_code == 410


def test_public_datasets_derive_without_a_budget(api: Api) -> None:
    _, token = api.tenant()
    public = api.public_dataset(token, {"a": 3, "b": 4})
    r = _derive(api, token, public, kind="subset", classes=["b"])
    assert r.status_code == 201, r.text
    child = r.json()
    assert child["visibility"] == "public" and child["budget_id"] is None
    assert child["declared_size"] == 7 and child["true_size"] == 4
    split = _derive(api, token, public, kind="split", fraction=0.5, part="train").json()
    assert split["derivation"]["selection"]["split"]["rule"] == "keyed_hash_v1"
    assert split["declared_size"] == 7 and 0 <= split["true_size"] <= 7



def test_a_split_job_is_planned_at_q_b_over_its_size_against_the_parent_budget(
        real_ledger_api: Api) -> None:
    api = real_ledger_api
    _, token = api.tenant()
    parent = _private(api, token, _images(20, 40), declared_size=100, delta=1e-4).json()
    child = _derive(api, token, parent["dataset_id"], kind="split", fraction=0.25,
                    part="train", declared_size=25).json()  # the owner's N̂_child
    assert child["declared_size"] == 25
    model = api.model(token)
    r = api.finetune(token, child["dataset_id"], model, batch=5, epsilon=2.0, dry_run=True)
    assert r.status_code == 200, r.text
    plan = r.json()["plan"]
    assert plan["sample_rate"] == 5 / 25  # q = b / N̂_child, not b / N̂_parent
    assert plan["steps"] == math.ceil(2 * 25 / 5)
    assert plan["admissible"] is True
    r = api.finetune(token, child["dataset_id"], model, batch=5, epsilon=2.0)
    assert r.status_code == 201, r.text
    parent_budget = api.client.get(f"/v1/datasets/{parent['dataset_id']}/budget",
                                   headers=auth(token)).json()
    assert parent_budget["rdp_reserved"] > 0  # the child's job holds the PARENT's budget
    child_budget = api.client.get(f"/v1/datasets/{child['dataset_id']}/budget",
                                  headers=auth(token)).json()
    assert child_budget == parent_budget


def test_a_linked_dataset_shares_the_real_budget(real_ledger_api: Api) -> None:
    api = real_ledger_api
    _, token = api.tenant()
    images = _images(21, 30)
    parent = _private(api, token, images, delta=1e-4).json()
    linked = _private(api, token, np.concatenate([images[:10], _images(22, 30)]),
                      on_overlap="link", epsilon_limit=None).json()
    assert linked["budget_id"] == parent["dataset_id"]
    model = api.model(token)
    r = api.finetune(token, linked["dataset_id"], model, batch=5, epsilon=1.0)
    assert r.status_code == 201, r.text
    assert r.json()["privacy"]["sample_rate"] == 5 / 40
    view = api.client.get(f"/v1/datasets/{linked['dataset_id']}/budget",
                          headers=auth(token)).json()
    assert view["dataset_id"] == parent["dataset_id"] and view["rdp_reserved"] > 0
    assert view == api.client.get(f"/v1/datasets/{parent['dataset_id']}/budget",
                                  headers=auth(token)).json()


def test_the_cli_uploads_with_link_derives_and_deletes(api: Api, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from dpsynth_cli import common
    from dpsynth_cli.main import app
    from dpsynth_client import Client
    from typer.testing import CliRunner

    _, token = api.tenant()

    def forward(request: httpx.Request) -> httpx.Response:
        r = api.client.request(request.method, str(request.url.copy_with(
            scheme="http", host="testserver")), content=request.read(),
            headers=dict(request.headers))
        return httpx.Response(r.status_code, headers=r.headers, content=r.content)

    monkeypatch.setattr(common.CliState, "client", lambda self: Client(
        "http://api.test", token, transport=httpx.MockTransport(forward)))
    runner = CliRunner()
    images = _images(23, 12)
    path = tmp_path / "d.npz"
    path.write_bytes(_npz(images))
    upload = ["datasets", "upload", str(path), "--name", "p", "--visibility", "private",
              "--epsilon-limit", "4", "--label-domain", "x,y,z", "--declared-size", "100",
              "--json"]
    first = runner.invoke(app, upload)
    assert first.exit_code == 0, first.output
    parent = json.loads(first.output)["dataset_id"]
    again = runner.invoke(app, upload)
    assert again.exit_code != 0 and "private_data_overlap" in again.output
    linked = runner.invoke(app, [*upload, "--on-overlap", "link"])
    assert linked.exit_code == 0, linked.output
    assert json.loads(linked.output)["budget_id"] == parent
    split = runner.invoke(app, ["datasets", "derive", parent, "--name", "train",
                                "--split", "0.5", "--part", "train", "--json"])
    assert split.exit_code == 0, split.output
    assert json.loads(split.output)["derivation"]["kind"] == "split"
    subset = runner.invoke(app, ["datasets", "derive", parent, "--name", "xz",
                                 "--classes", "x,z", "--json"])
    assert json.loads(subset.output)["class_names"] == ["x", "z"]
    deleted = runner.invoke(app, ["datasets", "delete", parent, "--yes", "--json"])
    assert deleted.exit_code == 0, deleted.output
    assert json.loads(deleted.output)["deleted_at"] is not None


def test_dp_ancestors_on_the_same_budget_compose(api: Api) -> None:
    """A model DP-trained on the parent, finetuned on its split: the child model's lineage
    (job_ids) and the claim's base model name the shared budget."""
    _, token = api.tenant()
    parent = _private(api, token, _images(24, 20)).json()["dataset_id"]
    child = _derive(api, token, parent, kind="split", fraction=0.5, part="train").json()
    model = api.model(token)
    first = api.finetune(token, parent, model, batch=2).json()["job_id"]
    api.worker(f"{first}/claim", {"attempt": 1, "worker_id": "w"})
    produced = api.worker(f"{first}/artifacts", {
        "attempt": 1, "kind": "model", "object_key": f"models/{first}/model.tar",
        "sha256": "d" * 64, "size": 10, "metadata": {"job_epsilon": 0.9}})
    base = produced.json()["model_id"]
    api.worker(f"{first}/transition", {"attempt": 1, "to_state": "succeeded"})
    second = api.finetune(token, child["dataset_id"], base, batch=2)
    assert second.status_code == 201, second.text
    second_id = second.json()["job_id"]
    claim = api.worker(f"{second_id}/claim", {"attempt": 1, "worker_id": "w"}).json()
    assert claim["base_model"]["budget_id"] == parent == claim["dataset"]["budget_id"]
    out = api.worker(f"{second_id}/artifacts", {
        "attempt": 1, "kind": "model", "object_key": f"models/{second_id}/model.tar",
        "sha256": "e" * 64, "size": 10, "metadata": {"job_epsilon": 1.2}})
    lineage = api.client.get(f"/v1/models/{out.json()['model_id']}", headers=auth(token)).json()
    assert lineage["job_ids"] == [first, second_id]
    assert lineage["dataset_id"] == child["dataset_id"]


def test_class_sizes_are_released_on_the_budget_owner_only(api: Api) -> None:
    _, token = api.tenant()
    parent = _private(api, token, _images(25, 12)).json()["dataset_id"]
    child = _derive(api, token, parent, kind="subset", classes=["x"]).json()["dataset_id"]
    r = api.client.post(f"/v1/datasets/{child}/class-sizes/release", headers=auth(token),
                        json={"target_epsilon": 1.0})
    assert r.status_code == 400 and r.json()["budget_id"] == parent


def test_the_ledger_plans_q_over_the_population_and_guards_its_delta(
        real_ledger_api: Api) -> None:
    from dpsynth_shared.errors import DpsynthError
    from dpsynth_shared.ledger_contract import LabelShape, ReserveRequest

    api = real_ledger_api
    _, token = api.tenant()
    budget = _private(api, token, _images(26, 40), declared_size=100, delta=1e-3).json()
    shape = {"job_id": "job_plan", "dataset_id": budget["dataset_id"], "target_epsilon": 1.0}
    plan = api.ledger.plan(ReserveRequest(**shape, expected_batch_size=4, steps=10,
                                          population_size=40))
    assert plan.event.sample_rate == 4 / 40 and plan.dataset_id == budget["dataset_id"]
    assert api.ledger.plan(ReserveRequest(**shape, expected_batch_size=4,
                                          steps=10)).event.sample_rate == 4 / 100
    with pytest.raises(DpsynthError) as info:  # delta 1e-3 is not below 1/1000
        api.ledger.plan(ReserveRequest(**shape, expected_batch_size=4, steps=10,
                                       population_size=1000))
    assert str(info.value.code) == "invalid_request"
    with pytest.raises(DpsynthError):
        api.ledger.plan(ReserveRequest(**shape, population_size=40, per_label={
            "x": LabelShape(expected_batch_size=2, steps=2)}))


def test_a_size_below_the_public_bound_needs_the_owner_scope(api: Api) -> None:
    """Checking a declared size below the public default against the true count would let
    a submit-scoped key learn class counts from refusals."""
    tenant, owner = api.tenant()
    parent = _private(api, owner, _images(27, 12)).json()["dataset_id"]
    r = api.client.post(f"/v1/tenants/{tenant}/keys", headers=auth(api.admin),
                        json={"scopes": ["read", "submit"]})
    submitter = r.json()["api_key"]
    r = _derive(api, submitter, parent, kind="subset", classes=["x"], declared_size=5)
    assert r.status_code == 403 and r.json()["code"] == "forbidden"
    r = _derive(api, submitter, parent, kind="subset", classes=["x"])
    assert r.status_code == 201 and r.json()["declared_size"] == 12  # the public bound
    assert r.json()["true_size"] is None  # owner-only
    r = _derive(api, owner, parent, kind="subset", classes=["x"], declared_size=4)
    assert r.status_code == 201 and r.json()["true_size"] == 4


def test_deletion_keeps_the_real_ledger_and_a_reupload_charges_the_old_budget(
        real_ledger_api: Api) -> None:
    api = real_ledger_api
    _, token = api.tenant()
    images = _images(28, 30)
    ds = _private(api, token, images, delta=1e-4).json()["dataset_id"]
    model = api.model(token)
    job = api.finetune(token, ds, model, batch=5, epsilon=1.0).json()["job_id"]
    assert api.client.post(f"/v1/jobs/{job}/cancel", headers=auth(token)).status_code in (
        200, 202)
    before = api.client.get(f"/v1/datasets/{ds}/ledger", headers=auth(token)).json()
    assert api.client.delete(f"/v1/datasets/{ds}", headers=auth(token)).status_code == 200
    after = api.client.get(f"/v1/datasets/{ds}/ledger", headers=auth(token))
    assert after.status_code == 200 and after.json()["entries"] == before["entries"]
    kinds = [e["kind"] for e in before["entries"]]
    assert kinds[0] == "budget_created" and "reservation_closed" in kinds
    assert api.client.get(f"/v1/datasets/{ds}/budget", headers=auth(token)).status_code == 200
    r = _private(api, token, images)
    assert r.status_code == 409 and r.json()["datasets"] == [ds]
    linked = _private(api, token, images, on_overlap="link", epsilon_limit=None).json()
    assert linked["budget_id"] == ds
    r = api.finetune(token, linked["dataset_id"], model, batch=5, epsilon=1.0)
    assert r.status_code == 201, r.text
    entries = api.client.get(f"/v1/datasets/{linked['dataset_id']}/ledger",
                             headers=auth(token)).json()["entries"]
    accepted = [e for e in entries if e["kind"] == "reservation_accepted"]
    assert accepted[-1]["payload"]["job_id"] == r.json()["job_id"]
    assert accepted[-1]["payload"]["population_size"] == 30  # q = b / N̂ of the linked data
    assert all(e["dataset_id"] == ds for e in entries)


# --- subjects across uploads (issue 4, items 1+2): the record of a subject dataset is the
# subject, so new images of a stored subject overlap like a re-uploaded image.

SUBJECT_IDS = ["p-4711", "p-4712", "p-4713", "p-4714"]


def _subject_npz(images: np.ndarray, subjects: list[Any] | np.ndarray) -> bytes:
    return b.npz_bytes(images=images, labels=np.arange(len(images)) % 3,
                       subjects=np.asarray(subjects))


def _subject_upload(api: Api, token: str, images: np.ndarray, subjects: list[Any] | np.ndarray,
                    **meta: Any) -> Any:
    body = {"name": "subj", "visibility": "private", "epsilon_limit": 10.0,
            "label_domain": DOMAIN, "privacy_unit": "subject",
            "declared_size": len({str(s) for s in subjects}), **meta}
    return api.upload(token, _subject_npz(images, subjects),
                      {k: v for k, v in body.items() if v is not None}, filename="d.npz")


def _names_no_subject(text: str, ids: list[Any]) -> None:
    for subject in ids:
        assert str(subject) not in text, subject


def test_new_images_of_a_stored_subject_are_refused(api: Api) -> None:
    _, token = api.tenant()
    first = _subject_upload(api, token, _images(40, 8), SUBJECT_IDS * 2)
    assert first.status_code == 201, first.text
    ds = first.json()["dataset_id"]
    # one pixel hash per image and one keyed hash per subject
    assert _hash_rows(api, ds) == 8 + 4
    # different images; two of the four subjects are stored already
    again = _subject_upload(api, token, _images(41, 6),
                            ["p-4711", "p-4712", "q-1", "q-1", "q-2", "q-3"])
    assert again.status_code == 409, again.text
    problem = again.json()
    assert problem["code"] == "private_data_overlap"
    assert problem["datasets"] == [ds]
    assert problem["overlapping_records"] == 0 and problem["overlapping_subjects"] == 2
    assert "subject(s)" in problem["detail"]
    _names_no_subject(again.text, [*SUBJECT_IDS, "q-1", "q-2", "q-3"])
    # wholly new subjects and images: accepted
    fresh = _subject_upload(api, token, _images(42, 4), ["q-1", "q-2", "q-3", "q-3"])
    assert fresh.status_code == 201, fresh.text
    _names_no_subject(first.text + fresh.text, [*SUBJECT_IDS, "q-1", "q-2", "q-3"])


def test_stored_subject_hashes_are_keyed_and_hold_no_id(api: Api) -> None:
    import hashlib
    import hmac

    from tests.integration.api.conftest import RECORD_HASH_KEY

    tenant, token = api.tenant()
    r = _subject_upload(api, token, _images(43, 4), [7, 8, 7, 8])
    assert r.status_code == 201, r.text
    engine = create_engine(api.settings.database.url)
    try:
        with make_session_factory(engine)() as session:
            stored = set(session.scalars(select(RecordHash.record_hash).where(
                RecordHash.dataset_id == r.json()["dataset_id"])))
    finally:
        engine.dispose()
    keyed = {hmac.new(RECORD_HASH_KEY.encode(), f"dpsynth-subject-v1|{tenant}|{s}".encode(),
                      hashlib.sha256).hexdigest() for s in ("7", "8")}
    assert keyed <= stored and len(stored) == 4 + 2
    plain = {hashlib.sha256(s.encode()).hexdigest() for s in ("7", "8")}
    assert not plain & stored


def test_integer_and_string_subject_ids_are_the_same_subject(api: Api) -> None:
    _, token = api.tenant()
    first = _subject_upload(api, token, _images(44, 4),
                            np.asarray([101, 102, 101, 103], dtype=np.int64))
    assert first.status_code == 201, first.text
    r = _subject_upload(api, token, _images(45, 4), ["102", " 103 ", "zz-9", "zz-9"])
    assert r.status_code == 409, r.text
    assert r.json()["overlapping_subjects"] == 2
    assert r.json()["datasets"] == [first.json()["dataset_id"]]
    # and the other way round, through another tenant's own string upload
    _, other = api.tenant("other")
    assert _subject_upload(api, other, _images(46, 2), ["5", "6"]).status_code == 201
    r = _subject_upload(api, other, _images(47, 2), np.asarray([6, 9], dtype=np.uint16))
    assert r.status_code == 409 and r.json()["overlapping_subjects"] == 1
    _names_no_subject(r.text, ["zz-9"])


def test_a_deleted_subject_dataset_still_blocks_its_subjects(api: Api) -> None:
    _, token = api.tenant()
    ds = _subject_upload(api, token, _images(48, 4), SUBJECT_IDS).json()["dataset_id"]
    assert api.client.delete(f"/v1/datasets/{ds}", headers=auth(token)).status_code == 200
    # a second, new subject: a private upload holds at least two units (issue 14 item 16)
    r = _subject_upload(api, token, _images(49, 2), ["p-4714", "p-new-0001"])
    assert r.status_code == 409, r.text
    assert r.json()["datasets"] == [ds] and r.json()["overlapping_subjects"] == 1
    _names_no_subject(r.text, SUBJECT_IDS)


def test_a_new_upload_of_stored_subjects_links_to_their_budget(api: Api) -> None:
    _, token = api.tenant()
    parent = _subject_upload(api, token, _images(50, 4), SUBJECT_IDS, delta=1e-3).json()
    r = _subject_upload(api, token, _images(51, 6),
                        ["p-4711", "p-4711", "p-4712", "n-1", "n-2", "n-2"],
                        on_overlap="link", epsilon_limit=None)
    assert r.status_code == 201, r.text
    linked = r.json()
    assert linked["budget_id"] == parent["dataset_id"]
    assert linked["derivation"] == {"kind": "link", "parent": parent["dataset_id"],
                                    "overlapping_records": 0, "overlapping_subjects": 2}
    assert linked["declared_size"] == 4 and linked["privacy_unit"] == "subject"
    assert set(api.ledger.budgets) == {parent["dataset_id"]}  # no new ledger budget
    # the linked upload's new subjects now belong to the budget too
    r = _subject_upload(api, token, _images(52, 2), ["n-2", "n-3"])
    assert r.status_code == 409 and r.json()["datasets"] == [linked["dataset_id"]]
    _names_no_subject(r.text, ["n-1", "n-2", "n-3", *SUBJECT_IDS])
    # an image-unit upload cannot be linked to the subject budget (units differ)
    r = _private(api, token, _images(50, 4), on_overlap="link", epsilon_limit=None)
    assert r.status_code == 409 and r.json()["link_refused"] == "privacy_unit"


def test_image_datasets_are_unaffected_by_subject_hashes(api: Api) -> None:
    _, token = api.tenant()
    assert _subject_upload(api, token, _images(53, 4), SUBJECT_IDS).status_code == 201
    r = _private(api, token, _images(54, 12))  # new images: no subject to match
    assert r.status_code == 201, r.text
    problem = _private(api, token, _images(54, 12)).json()  # the image rule as before
    assert problem["code"] == "private_data_overlap" and "overlapping_subjects" not in problem
    assert "subject" not in problem["detail"]
    # a public upload of new images is not compared with subjects either
    r = api.upload(token, _npz(_images(55, 6)), {"name": "pub", "visibility": "public"},
                   filename="d.npz")
    assert r.status_code == 201, r.text


def test_subject_ids_match_within_the_tenant_only(api: Api) -> None:
    _, alice = api.tenant("alice")
    _, bob = api.tenant("bob")
    assert _subject_upload(api, alice, _images(56, 4), SUBJECT_IDS).status_code == 201
    r = _subject_upload(api, bob, _images(57, 4), SUBJECT_IDS)  # bob's p-4711 is not alice's
    assert r.status_code == 201, r.text
