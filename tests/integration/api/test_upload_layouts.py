"""The accepted upload layouts through the real api on PostgreSQL (issue 15, items 3 and 5):
Hugging Face split folders with ``test/`` as the owner's held-out part (stored, listed and
hashed like a keyed-hash split, with no public fraction), ``metadata.csv`` and
``metadata.jsonl`` label files, tar archives, the accepted-formats problem of a wrong file
type, unknown classes named for public data and counted for private data, and the archive
safety rules on the new layouts."""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
from dpsynth_shared.record_splits import record_hashes
from dpsynth_shared.upload_formats import accepted_sentence
from PIL import Image

from tests.integration.api.conftest import Api, auth
from tests.unit.api import builders as b
from tests.unit.api.test_upload_layouts import png, split_folders

PRIVATE = {"name": "pets", "visibility": "private", "epsilon_limit": 8.0,
           "label_domain": ["cat", "dog"], "declared_size": 100}


def pixels(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im, dtype=np.uint8)[..., None]


def stored(api: Api, key: str) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(api.store._path(key).read_bytes()), allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}


def test_hf_test_folder_becomes_the_held_out_part(api: Api) -> None:
    _, owner = api.tenant()
    members = split_folders({"train": {"cat": 4, "dog": 3}, "test": {"cat": 2, "dog": 1}})
    r = api.upload(owner, b.zip_bytes(members), {**PRIVATE, "holdout_from": "test"})
    assert r.status_code == 201, r.text
    ds = r.json()
    assert ds["source_format"] == "zip" and ds["class_names"] == ["cat", "dog"]
    assert ds["holdout_rule"] == "folder_split_v1" and ds["holdout_key_source"] is None
    assert ds["holdout_fraction"] is None  # a fraction of the folders would be a count
    assert ds["true_size"] == 7 and ds["holdout_size"] == 3
    assert ds["class_counts"] == {"cat": 4, "dog": 3}  # the training part only
    names = list(members)
    hashes = record_hashes(np.stack([pixels(members[n]) for n in names]))
    held = [i for i, n in enumerate(names) if n.startswith("test/")]
    listing = api.client.get(f"/v1/datasets/{ds['dataset_id']}/holdout", headers=auth(owner))
    assert listing.status_code == 200, listing.text
    assert listing.json()["items"] == [{"index": i, "record_hash": hashes[i]} for i in held]
    prefix = f"private/datasets/{ds['dataset_id']}"
    assert record_hashes(stored(api, f"{prefix}/holdout.npz")["images"]) == [
        hashes[i] for i in held]
    assert record_hashes(stored(api, f"{prefix}/data.npz")["images"]) == [
        h for i, h in enumerate(hashes) if i not in held]


def test_train_and_test_without_holdout_from_are_refused(api: Api) -> None:
    _, owner = api.tenant()
    members = split_folders({"train": {"cat": 2, "dog": 2}, "test": {"cat": 1}})
    r = api.upload(owner, b.zip_bytes(members), PRIVATE)
    assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json"
    assert r.json()["code"] == "invalid_dataset" and "holdout_from 'test'" in r.json()["detail"]
    both = api.upload(owner, b.zip_bytes(members), {**PRIVATE, "holdout_from": "test",
                                                    "holdout_fraction": 0.2})
    assert both.status_code == 422 and "not both" in both.text  # detail or field errors


def test_metadata_csv_and_jsonl_uploads(api: Api) -> None:
    _, owner = api.tenant()
    csv_members = {"metadata.csv": b"file_name,label\nimages/a/1.png,cat\nimages/2.png,dog\n"
                                   b"images/3.png,dog\n",
                   "images/a/1.png": png(1), "images/2.png": png(2), "images/3.png": png(3)}
    r = api.upload(owner, b.zip_bytes(csv_members), {"name": "c", "visibility": "public"})
    assert r.status_code == 201, r.text
    assert r.json()["class_names"] == ["cat", "dog"] and r.json()["true_size"] == 3
    rows = [{"file_name": f"{i}.png", "species": "owl" if i % 2 else "bat"} for i in range(4)]
    jsonl = {"metadata.jsonl": "\n".join(json.dumps(x) for x in rows).encode(),
             **{f"{i}.png": png(10 + i) for i in range(4)}}
    r = api.upload(owner, b.tar_bytes(jsonl, gz=True), {
        "name": "j", "visibility": "public", "label_column": "species"}, filename="j.tar.gz")
    assert r.status_code == 201, r.text
    assert r.json()["class_names"] == ["bat", "owl"] and r.json()["source_format"] == "tar"


def test_a_wrong_file_type_is_answered_with_the_accepted_formats(api: Api) -> None:
    _, owner = api.tenant()
    r = api.upload(owner, png(1), {"name": "x", "visibility": "public"}, filename="scan.png")
    assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = r.json()
    assert body["code"] == "invalid_archive"
    assert body["detail"] == f"a .png file is not an accepted dataset upload; " \
                             f"{accepted_sentence()}"
    assert ".parquet" in body["accepted_formats"]


def test_unknown_classes_are_named_for_public_and_counted_for_private_uploads(
        api: Api) -> None:
    _, owner = api.tenant()
    folder = split_folders({"train": {"cat": 2, "dog": 2, "emu": 1, "ant": 1}})
    r = api.upload(owner, b.zip_bytes(folder), {"name": "p", "visibility": "public",
                                                "label_domain": ["cat", "dog"]})
    assert r.status_code == 422, r.text
    assert r.json()["unknown_labels"] == ["ant", "emu"]
    assert "'ant', 'emu'" in r.json()["detail"]
    r = api.upload(owner, b.zip_bytes(folder), PRIVATE)
    assert r.status_code == 422 and r.json()["unknown_label_count"] == 2
    assert "emu" not in r.text and "ant" not in r.text.replace("want", "")


def test_archive_safety_holds_on_the_new_layouts(api: Api) -> None:
    _, owner = api.tenant()
    escape = {**split_folders({"train": {"cat": 2}}), "test/../../etc/cat/x.png": png(9)}
    r = api.upload(owner, b.zip_bytes(escape), {"name": "e", "visibility": "public",
                                                "holdout_from": "test"})
    assert r.status_code == 422 and r.json()["code"] == "unsafe_archive"
    bomb = {"metadata.csv": b"file_name,label\nx.png,cat\n", "x.png": b.bomb_png()}
    r = api.upload(owner, b.zip_bytes(bomb), {"name": "b", "visibility": "public"})
    assert r.status_code == 422 and r.json()["code"] == "unsafe_archive"
    outside = {"train/metadata.csv": b"file_name,label\n../../x.png,cat\n",
               "train/a.png": png(1)}
    r = api.upload(owner, b.zip_bytes(outside), {"name": "o", "visibility": "public"})
    assert r.status_code == 422 and "outside the metadata file's folder" in r.json()["detail"]
