"""1-stable held-out splits at the api on real PostgreSQL (issue 13, item 1).

* an upload's held-out records are those whose keyed hash (the owner's write-only
  ``holdout_key``, or a key drawn by the platform) falls below the fraction; the key is never
  echoed or stored, the seed is gone from every view and refused on upload;
* ``GET /v1/datasets/{id}/holdout`` (owner scope) lists them by position in the upload and
  unkeyed content hash; other scopes get 403, other tenants 404, a dataset without its own
  held-out split 422 ``no_holdout``, a split made before issue 13 409;
* the same key holds out the same records in a later version of the dataset;
* splits made before issue 13 say so in their view (``seeded_permutation_v0``).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
from dpsynth_api.db import make_session_factory
from dpsynth_api.tables import Dataset, RecordHash
from dpsynth_shared.record_splits import in_first_part, record_hashes
from sqlalchemy import create_engine, update

from tests.integration.api.conftest import Api, auth
from tests.unit.api import builders as b

LABELS = ["x", "y", "z"]
KEY = "owner-holdout-key-0123456789abcdef"


def _images(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, 8, 8), dtype=np.uint8)


def _upload(api: Api, token: str, images: np.ndarray, **meta: Any) -> Any:
    body = {"name": "priv", "visibility": "private", "epsilon_limit": 10.0,
            "label_domain": LABELS, "declared_size": len(images), **meta}
    return api.upload(token, b.npz_bytes(images=images, labels=np.arange(len(images)) % 3),
                      body, filename="d.npz")


def _npz(api: Api, key: str) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(api.store._path(key).read_bytes()), allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}


def _scoped(api: Api, tenant: str, scopes: list[str]) -> str:
    r = api.client.post(f"/v1/tenants/{tenant}/keys", headers=auth(api.admin),
                        json={"scopes": scopes, "name": "scoped"})
    assert r.status_code == 201, r.text
    return str(r.json()["api_key"])


def _listing(api: Api, token: str, dataset_id: str) -> Any:
    return api.client.get(f"/v1/datasets/{dataset_id}/holdout", headers=auth(token))


def test_the_owner_lists_the_held_out_records_and_the_key_is_never_shown(api: Api) -> None:
    tenant, owner = api.tenant()
    images = _images(60)
    r = _upload(api, owner, images, holdout_fraction=0.25, holdout_key=KEY)
    assert r.status_code == 201, r.text
    assert KEY not in r.text
    ds = r.json()
    assert ds["holdout_rule"] == "keyed_hash_v1" and ds["holdout_key_source"] == "owner"
    assert "holdout_seed" not in ds and "holdout_key" not in ds
    hashes = record_hashes(images[..., None])
    held = in_first_part(KEY.encode(), hashes, 0.25)
    assert ds["holdout_size"] == int(held.sum()) and ds["true_size"] == int((~held).sum())
    # the listing: position in the upload and unkeyed content hash, in upload order
    listing = _listing(api, owner, ds["dataset_id"])
    assert listing.status_code == 200, listing.text
    items = listing.json()["items"]
    assert items == [{"index": int(i), "record_hash": hashes[i]} for i in np.flatnonzero(held)]
    # ... which are exactly the held-out npz's records; the object holds the others
    prefix = f"private/datasets/{ds['dataset_id']}"
    assert record_hashes(_npz(api, f"{prefix}/holdout.npz")["images"]) == [
        i["record_hash"] for i in items]
    assert np.array_equal(_npz(api, f"{prefix}/data.npz")["images"][..., 0], images[~held])
    # other scopes and tenants
    reader = _scoped(api, tenant, ["read", "submit"])
    assert _listing(api, reader, ds["dataset_id"]).status_code == 403
    seen = api.client.get(f"/v1/datasets/{ds['dataset_id']}", headers=auth(reader)).json()
    assert seen["holdout_rule"] == "keyed_hash_v1" and "holdout_seed" not in seen
    assert seen["holdout_size"] is None
    _, other = api.tenant("other")
    assert _listing(api, other, ds["dataset_id"]).status_code == 404
    # the key is stored nowhere: not on the dataset row, not in its record rows
    engine = create_engine(api.settings.database.url)
    try:
        with make_session_factory(engine)() as session:
            row = session.get(Dataset, ds["dataset_id"])
            assert row is not None
            assert KEY not in repr({c.name: getattr(row, c.name)
                                    for c in Dataset.__table__.columns})
    finally:
        engine.dispose()
    listed = api.client.get("/v1/datasets", headers=auth(owner)).text
    assert KEY not in listed and "holdout_seed" not in listed


def test_the_seed_is_refused_and_a_platform_key_is_drawn(api: Api) -> None:
    _, owner = api.tenant()
    r = _upload(api, owner, _images(30, 1), holdout_fraction=0.2, holdout_seed=42)
    assert r.status_code == 422 and r.json()["code"] == "invalid_dataset"
    assert "holdout_seed is no longer accepted" in r.json()["detail"]
    r = _upload(api, owner, _images(30, 1), holdout_fraction=0.3)
    assert r.status_code == 201, r.text
    assert r.json()["holdout_key_source"] == "platform"
    items = _listing(api, owner, r.json()["dataset_id"]).json()["items"]
    assert len(items) == r.json()["holdout_size"] > 0


def test_the_same_key_holds_out_the_same_records_in_a_later_version(api: Api) -> None:
    _, first = api.tenant("v1")
    _, second = api.tenant("v2")  # another tenant: the same records would overlap
    v1 = _images(80, 2)
    v2 = np.concatenate([v1[:40], _images(25, 3), v1[40:]])  # records added in the middle
    one = _upload(api, first, v1, holdout_fraction=0.3, holdout_key=KEY).json()
    two = _upload(api, second, v2, holdout_fraction=0.3, holdout_key=KEY).json()
    held_one = {i["record_hash"] for i in _listing(api, first, one["dataset_id"]).json()["items"]}
    held_two = {i["record_hash"] for i in _listing(api, second, two["dataset_id"])
                .json()["items"]}
    old = set(record_hashes(v1[..., None]))
    assert held_two & old == held_one  # no record of v1 changed side


def test_subjects_are_held_out_whole_and_listed_by_image(api: Api) -> None:
    _, owner = api.tenant()
    images = _images(60, 5)
    subjects = np.repeat(np.arange(30), 2)  # 30 subjects: a side is never empty (0.7^30)
    r = api.upload(owner, b.npz_bytes(images=images, labels=subjects % 3, subjects=subjects), {
        "name": "subj", "visibility": "private", "epsilon_limit": 5.0, "label_domain": LABELS,
        "privacy_unit": "subject", "declared_size": 30, "holdout_fraction": 0.3,
        "holdout_key": KEY}, filename="d.npz")
    assert r.status_code == 201, r.text
    ds = r.json()
    items = _listing(api, owner, ds["dataset_id"]).json()["items"]
    positions = {i["index"] for i in items}
    for subject in range(30):
        mine = set(np.flatnonzero(subjects == subject).tolist())
        assert mine <= positions or not mine & positions
    assert len(items) == ds["holdout_size"] == 2 * (30 - ds["subject_count"])


def test_datasets_without_their_own_split_and_old_splits_cannot_be_listed(api: Api) -> None:
    _, owner = api.tenant()
    plain = _upload(api, owner, _images(12, 7)).json()
    r = _listing(api, owner, plain["dataset_id"])
    assert r.status_code == 422 and r.json()["code"] == "no_holdout"
    ds = _upload(api, owner, _images(40, 8), holdout_fraction=0.25, holdout_key=KEY).json()
    child = api.client.post(f"/v1/datasets/{ds['dataset_id']}/derive", headers=auth(owner),
                            json={"name": "c", "kind": "subset", "classes": ["x"]}).json()
    assert _listing(api, owner, child["dataset_id"]).json()["code"] == "no_holdout"
    # a held-out split made before issue 13 (what migration 0008 leaves of one)
    engine = create_engine(api.settings.database.url)
    try:
        with make_session_factory(engine)() as session:
            session.execute(update(Dataset).where(Dataset.id == ds["dataset_id"]).values(
                holdout_rule="seeded_permutation_v0", holdout_key_source=None))
            session.execute(update(RecordHash).where(
                RecordHash.dataset_id == ds["dataset_id"]).values(
                position=None, held_out=None, label=None))
            session.commit()
    finally:
        engine.dispose()
    view = api.client.get(f"/v1/datasets/{ds['dataset_id']}", headers=auth(owner)).json()
    assert view["holdout_rule"] == "seeded_permutation_v0"
    r = _listing(api, owner, ds["dataset_id"])
    assert r.status_code == 409 and r.json()["holdout_rule"] == "seeded_permutation_v0"
    # a keyed split of such a dataset: its true size is bounded by the parent's, flagged
    split = api.client.post(f"/v1/datasets/{ds['dataset_id']}/derive", headers=auth(owner),
                            json={"name": "s", "kind": "split", "fraction": 0.5,
                                  "part": "train"})
    assert split.status_code == 201, split.text
    assert split.json()["derivation"]["true_size_is_upper_bound"] is True
    assert split.json()["true_size"] == ds["true_size"]


def test_an_old_derived_split_names_its_rule_and_shows_its_seed_to_owners_only(
        api: Api) -> None:
    tenant, owner = api.tenant()
    ds = _upload(api, owner, _images(20, 9)).json()
    child = api.client.post(f"/v1/datasets/{ds['dataset_id']}/derive", headers=auth(owner),
                            json={"name": "s", "kind": "split", "fraction": 0.5,
                                  "part": "train"}).json()
    legacy = {"kind": "split", "parent": ds["dataset_id"], "fraction": 0.5, "part": "train",
              "seed": 1234, "selection": {"indices_key": "private/x/indices.npy"}}
    engine = create_engine(api.settings.database.url)
    try:
        with make_session_factory(engine)() as session:
            session.execute(update(Dataset).where(Dataset.id == child["dataset_id"])
                            .values(derivation=legacy))
            session.commit()
    finally:
        engine.dispose()
    reader = _scoped(api, tenant, ["read"])
    seen = api.client.get(f"/v1/datasets/{child['dataset_id']}", headers=auth(reader)).json()
    assert seen["derivation"]["rule"] == "seeded_permutation_v0"
    assert "seed" not in seen["derivation"]
    mine = api.client.get(f"/v1/datasets/{child['dataset_id']}", headers=auth(owner)).json()
    assert mine["derivation"]["seed"] == 1234


def test_a_split_of_a_subset_counts_its_true_size_from_the_stored_hashes(api: Api) -> None:
    """The api never reads the data again: the child's true size and class counts come
    from the hashes, labels and sides stored at ingest, by the worker's rule."""
    _, owner = api.tenant()
    images = _images(90, 11)
    labels = np.arange(90) % 3
    ds = _upload(api, owner, images, holdout_fraction=0.2, holdout_key=KEY).json()
    subset = api.client.post(f"/v1/datasets/{ds['dataset_id']}/derive", headers=auth(owner),
                             json={"name": "xz", "kind": "subset", "classes": ["z", "x"]})
    assert subset.status_code == 201, subset.text
    split = api.client.post(f"/v1/datasets/{subset.json()['dataset_id']}/derive",
                            headers=auth(owner), json={"name": "s", "kind": "split",
                                                       "fraction": 0.6, "part": "holdout"})
    assert split.status_code == 201, split.text
    child = split.json()
    assert child["declared_size"] == subset.json()["declared_size"]
    engine = create_engine(api.settings.database.url)
    try:
        with make_session_factory(engine)() as session:
            row = session.get(Dataset, child["dataset_id"])
            assert row is not None and row.derivation is not None
            key = bytes.fromhex(row.derivation["selection"]["split"]["key"])
    finally:
        engine.dispose()
    hashes = record_hashes(images[..., None])
    trained = ~in_first_part(KEY.encode(), hashes, 0.2)
    kept = trained & np.isin(labels, [0, 2]) & ~in_first_part(key, hashes, 0.6)
    assert child["true_size"] == int(kept.sum())
    assert child["class_counts"] == {"x": int((kept & (labels == 0)).sum()),
                                     "z": int((kept & (labels == 2)).sum())}
    assert child["derivation"]["selection"] == {
        "classes": ["x", "z"], "split": {"rule": "keyed_hash_v1", "fraction": 0.6,
                                         "part": "holdout"}}


def test_migration_0008_marks_existing_held_out_splits_as_the_old_rule(
        database_url: str, tmp_path: Path) -> None:
    from alembic import command
    from dpsynth_api.migrate import alembic_config
    from sqlalchemy import text

    from tests.integration.api.conftest import make_settings

    cfg = alembic_config(make_settings(database_url, tmp_path))
    command.upgrade(cfg, "0007")
    engine = create_engine(database_url)
    try:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO api.tenants (id, name, is_admin, created_at) "
                              "VALUES ('ten_m', 'm', false, now())"))
            for ident, fraction in (("ds_old", 0.2), ("ds_none", None)):
                conn.execute(text(
                    "INSERT INTO api.datasets (id, tenant_id, name, visibility, object_key, "
                    "source_format, true_size, declared_size, class_names, class_counts, "
                    "image_shape, uploaded_by, sha256, size_bytes, created_at, "
                    "holdout_fraction, holdout_seed) VALUES (:id, 'ten_m', 'd', 'public', "
                    "'k', 'npz', 1, 1, '[]', '{}', '[]', 'key', '', 0, now(), :f, :seed)"),
                    {"id": ident, "f": fraction, "seed": 42 if fraction else None})
            conn.execute(text("INSERT INTO api.record_hashes (tenant_id, record_hash, "
                              "dataset_id, visibility, created_at) VALUES ('ten_m', 'h', "
                              "'ds_old', 'public', now())"))
        command.upgrade(cfg, "0008")
        with engine.connect() as conn:
            rules = dict(conn.execute(text("SELECT id, holdout_rule FROM api.datasets")).all())
            row = conn.execute(text("SELECT position, held_out, label FROM "
                                    "api.record_hashes")).one()
        assert rules == {"ds_old": "seeded_permutation_v0", "ds_none": None}
        assert tuple(row) == (None, None, None)  # unknown: the old sides were not stored
        command.downgrade(cfg, "0007")
        command.upgrade(cfg, "head")
    finally:
        engine.dispose()
