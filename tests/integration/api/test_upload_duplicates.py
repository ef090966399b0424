"""Copies of one record inside one upload (issue 13, item 4), at the api on real PostgreSQL.

Before the fix, six images with five distinct contents were accepted as six records (201),
so the repeated record was protected only at group size 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from dpsynth_api.db import make_session_factory
from dpsynth_api.tables import Dataset, RecordHash
from sqlalchemy import create_engine, func, select

from tests.integration.api.conftest import Api
from tests.unit.api import builders as b

DOMAIN = ["x", "y", "z"]


def _six_with_a_copy() -> np.ndarray:
    """Six images, five distinct: image 4 repeats image 1 (both of class y)."""
    images = np.random.default_rng(41).integers(0, 256, size=(5, 8, 8), dtype=np.uint8)
    return np.concatenate([images[:4], images[1:2], images[4:]])


def _private(api: Api, token: str, data: bytes, filename: str = "d.npz", **meta: Any) -> Any:
    return api.upload(token, data, {"name": "priv", "visibility": "private",
                                    "epsilon_limit": 10.0, "label_domain": DOMAIN,
                                    "declared_size": 50, **meta}, filename=filename)


def _rows(api: Api) -> tuple[int, int]:
    """(dataset rows, record-hash rows) in the api's database."""
    engine = create_engine(api.settings.database.url)
    try:
        with make_session_factory(engine)() as session:
            return (int(session.scalar(select(func.count()).select_from(Dataset)) or 0),
                    int(session.scalar(select(func.count()).select_from(RecordHash)) or 0))
    finally:
        engine.dispose()


def test_a_private_upload_with_a_copy_is_refused_and_nothing_is_kept(api: Api) -> None:
    _, token = api.tenant()
    data = b.npz_bytes(images=_six_with_a_copy(), labels=np.asarray([0, 1, 2, 0, 1, 2]))
    r = _private(api, token, data)
    assert r.status_code == 422, r.text
    problem = r.json()
    assert r.headers["content-type"].startswith("application/problem+json")
    assert problem["code"] == "duplicate_records"
    assert (problem["duplicate_records"], problem["disagreeing_records"]) == (1, 0)
    for leak in ("index", "record 4", "row 4", "sha256"):
        assert leak not in problem["detail"], leak
    assert api.ledger.budgets == {} and _rows(api) == (0, 0)
    assert not list(Path(api.settings.object_store.root).rglob("*.npz"))


def test_deduplicate_keeps_the_first_copy(api: Api) -> None:
    _, token = api.tenant()
    images = _six_with_a_copy()
    data = b.npz_bytes(images=images, labels=np.asarray([0, 1, 2, 0, 1, 2]))
    r = _private(api, token, data, on_duplicate="deduplicate")
    assert r.status_code == 201, r.text
    body = r.json()
    assert _rows(api) == (1, 5)  # five records, five hashes
    stored = Path(api.settings.object_store.root) / "private" / "datasets" / \
        body["dataset_id"] / "data.npz"  # read past the store: its reads need a grant
    with np.load(stored, allow_pickle=False) as npz:
        assert npz["images"].shape == (5, 8, 8, 1)
        assert np.array_equal(npz["images"][..., 0], images[[0, 1, 2, 3, 5]])
        assert npz["labels"].tolist() == [0, 1, 2, 0, 2]
    # the dropped copy is still the budget's record: re-uploading it overlaps
    # (with one new record: a private upload holds at least two, issue 14 item 16)
    fresh = np.full((1, *images.shape[1:]), 251, dtype=np.uint8)
    again = _private(api, token, b.npz_bytes(images=np.concatenate([images[4:5], fresh]),
                                             labels=np.asarray([1, 0])))
    assert again.status_code == 409 and again.json()["code"] == "private_data_overlap"
    assert again.json()["overlapping_records"] == 1


def test_a_copy_under_another_label_is_refused_even_when_deduplicating(api: Api) -> None:
    _, token = api.tenant()
    data = b.npz_bytes(images=_six_with_a_copy(), labels=np.asarray([0, 1, 2, 0, 2, 2]))
    r = _private(api, token, data, on_duplicate="deduplicate")
    assert r.status_code == 422 and r.json()["code"] == "duplicate_records", r.text
    assert r.json()["disagreeing_records"] == 1


def test_one_image_under_two_subjects_is_refused(api: Api) -> None:
    _, token = api.tenant()
    members = {"x/0.png": b.png(value=3), "x/1.png": b.png(value=9),
               "y/2.png": b.png(value=3), "y/3.png": b.png(value=27),
               "subjects.csv": b"path,subject\nx/0.png,p-501\nx/1.png,p-501\n"
                               b"y/2.png,p-502\ny/3.png,p-503\n"}
    r = _private(api, token, b.zip_bytes(members), "d.zip", privacy_unit="subject",
                 label_domain=["x", "y"], on_duplicate="deduplicate")
    assert r.status_code == 422 and r.json()["code"] == "duplicate_records", r.text
    assert "subject" in r.json()["detail"]
    assert "p-50" not in r.text and ".png" not in r.text
    # the same image twice for ONE subject (same class) is one record of it: deduplicated
    members["y/2.png"] = b.png(value=81)
    members["x/4.png"] = b.png(value=3)
    members["subjects.csv"] += b"x/4.png,p-501\n"
    r = _private(api, token, b.zip_bytes(members), "d.zip", privacy_unit="subject",
                 label_domain=["x", "y"], on_duplicate="deduplicate")
    assert r.status_code == 201, r.text
    assert _rows(api) == (1, 4 + 3)  # four images and three subjects hashed


def test_a_public_upload_keeps_its_copies_unless_asked(api: Api) -> None:
    _, token = api.tenant()
    data = b.npz_bytes(images=_six_with_a_copy(), labels=np.asarray([0, 1, 2, 0, 1, 2]))
    meta = {"name": "pub", "visibility": "public"}
    r = api.upload(token, data, meta, filename="d.npz")
    assert r.status_code == 201, r.text
    assert r.json()["declared_size"] == 6
    r = api.upload(token, data, {**meta, "on_duplicate": "deduplicate"}, filename="d.npz")
    assert r.status_code == 201 and r.json()["declared_size"] == 5, r.text
    r = api.upload(token, data, {**meta, "on_duplicate": "refuse"}, filename="d.npz")
    assert r.status_code == 422 and r.json()["code"] == "duplicate_records"


def test_copies_are_dropped_before_the_held_out_split(api: Api) -> None:
    """One copy can never sit on both sides: the split sees each record once."""
    _, token = api.tenant()
    images = np.random.default_rng(43).integers(0, 256, size=(30, 8, 8), dtype=np.uint8)
    copies = np.concatenate([images, images[:10]])  # 40 records, 30 distinct
    data = b.npz_bytes(images=copies, labels=np.arange(40) % 3)
    r = _private(api, token, data, on_duplicate="deduplicate", holdout_fraction=0.5)
    assert r.status_code == 201, r.text
    assert _rows(api) == (1, 30)
    folder = Path(api.settings.object_store.root) / "private" / "datasets" / \
        r.json()["dataset_id"]
    stored: list[bytes] = []
    for path in sorted(folder.rglob("*.npz")):
        with np.load(path, allow_pickle=False) as npz:
            stored += [row.tobytes() for row in npz["images"]]
    assert len(stored) == 30 and len(set(stored)) == 30  # train + held out: each record once


def test_the_private_minimum_counts_the_records_kept_after_deduplication(api: Api) -> None:
    """Two copies of one image deduplicate to ONE record: below the private minimum of 2."""
    _, token = api.tenant()
    image = np.random.default_rng(7).integers(0, 256, size=(1, 8, 8), dtype=np.uint8)
    data = b.npz_bytes(images=np.concatenate([image, image]), labels=np.asarray([1, 1]))
    r = _private(api, token, data, on_duplicate="deduplicate")
    assert r.status_code == 422, r.text
    assert r.json()["code"] == "invalid_dataset"
    assert "at least 2" in r.json()["detail"]
    assert api.ledger.budgets == {} and _rows(api) == (0, 0)
