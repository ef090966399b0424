"""Upload bounds through the api on real PostgreSQL (issue 14, items 4, 5 and 16): one
label value cannot create a million classes, the dataset list does not grow with the
number of classes, tiny/narrow images and one-record private datasets are refused."""

from __future__ import annotations

import io
import zipfile

import numpy as np

from tests.integration.api.conftest import Api, auth
from tests.unit.api import builders as b


def _images(n: int, height: int = 8, width: int = 8) -> np.ndarray:
    return np.random.default_rng(n).integers(0, 256, size=(n, height, width), dtype=np.uint8)


def _problem(r: object, code: str) -> dict[str, object]:
    assert r.status_code == 422, r.text[:300]  # type: ignore[attr-defined]
    assert r.headers["content-type"].startswith("application/problem+json")  # type: ignore[attr-defined]
    body: dict[str, object] = r.json()  # type: ignore[attr-defined]
    assert body["code"] == code, body
    return body


def test_a_million_label_is_refused_and_the_list_has_no_per_class_detail(api: Api) -> None:
    _, token = api.tenant()
    million = api.upload(token, b.npz_bytes(images=_images(2), labels=np.array([0, 1_000_000])),
                         {"name": "m", "visibility": "public"}, filename="m.npz")
    _problem(million, "invalid_dataset")
    # the most classes allowed, with long names: the single view has them, the list not
    k = 9_000
    names = np.asarray([f"class-{i:05d}-" + "x" * 40 for i in range(k)])
    wide = api.upload(token, b.npz_bytes(images=_images(k // 1000), labels=np.arange(k // 1000),
                                         class_names=names),
                      {"name": "wide", "visibility": "public"}, filename="w.npz")
    assert wide.status_code == 201, wide.text
    dataset_id = wide.json()["dataset_id"]
    one = api.client.get(f"/v1/datasets/{dataset_id}", headers=auth(token))
    assert len(one.json()["class_names"]) == k and len(one.json()["class_counts"]) == k
    listed = api.client.get("/v1/datasets", headers=auth(token))
    assert listed.status_code == 200
    [item] = listed.json()["items"]
    assert item["dataset_id"] == dataset_id and item["num_classes"] == k
    assert not {"class_names", "class_counts", "class_sizes"} & set(item)
    assert len(listed.content) < 4096, len(listed.content)  # one row, whatever K is
    # the list's OpenAPI item schema says so too
    schema = api.client.get("/openapi.json").json()["components"]["schemas"]
    ref = schema["DatasetPage"]["properties"]["items"]["items"]["$ref"].rsplit("/", 1)[1]
    assert "class_names" not in schema[ref]["properties"]
    assert "num_classes" in schema[ref]["required"]
    assert "class_names" in schema["DatasetOut"]["properties"]


def test_a_subset_lists_without_its_classes(api: Api) -> None:
    _, token = api.tenant()
    parent = api.public_dataset(token, {"a": 2, "b": 2})
    child = api.client.post(f"/v1/datasets/{parent}/derive", headers=auth(token), json={
        "name": "sub", "kind": "subset", "classes": ["a"]})
    assert child.status_code == 201, child.text
    assert child.json()["derivation"]["classes"] == ["a"]
    listed = {d["dataset_id"]: d for d in api.client.get(
        "/v1/datasets", headers=auth(token)).json()["items"]}
    view = listed[child.json()["dataset_id"]]["derivation"]
    assert view["kind"] == "subset" and "classes" not in view
    assert "classes" not in (view.get("selection") or {})


def test_a_huge_npy_header_narrow_images_and_one_private_record_are_422(api: Api) -> None:
    _, token = api.tenant()
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "|u1", "fortran_order": False,
                                                  "shape": (9 << 40,)})
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("images.npy", header.getvalue())
        labels = io.BytesIO()
        np.save(labels, np.zeros(2, dtype=np.int64))
        zf.writestr("labels.npy", labels.getvalue())
    _problem(api.upload(token, buf.getvalue(), {"name": "h", "visibility": "public"},
                        filename="h.npz"), "unsafe_npz")
    narrow = b.zip_bytes(b.image_folder({"a": 2}, size=(1000, 1)))
    _problem(api.upload(token, narrow, {"name": "n", "visibility": "public"}), "invalid_dataset")
    one = api.upload(token, b.digits_npz(1, k=1), {
        "name": "p", "visibility": "private", "epsilon_limit": 1.0, "label_domain": ["x"],
        "declared_size": 1}, filename="d.npz")
    body = _problem(one, "invalid_dataset")
    assert "at least 2 images" in str(body["detail"])
    assert api.client.get("/v1/datasets", headers=auth(token)).json()["items"] == []
