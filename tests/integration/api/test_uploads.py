"""Dataset and model uploads: good inputs, every bad input (a clear 4xx problem), health."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dpsynth_api.datasets.units import default_delta

from tests.integration.api.conftest import Api, auth
from tests.unit.api import builders as b

PUBLIC = {"name": "pub", "visibility": "public"}
PRIVATE = {"name": "priv", "visibility": "private", "epsilon_limit": 8.0,
           "label_domain": ["a", "b"]}


def test_good_zip_is_stored_canonically(api: Api, tmp_path: Path) -> None:
    _, token = api.tenant()
    r = api.upload(token, b.zip_bytes(b.image_folder({"a": 3, "b": 2}, root="top/")), PUBLIC)
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["visibility"] == "public" and body["declared_size"] == 5
    assert body["class_names"] == ["a", "b"] and body["image_shape"] == [8, 8, 1]
    assert body["declared_public_by"] is not None and body["delta"] is None
    key = f"public/datasets/{body['dataset_id']}/data.npz"
    info = api.store.get_file(key, tmp_path / "fetched.npz")
    assert info.sha256 == body["sha256"]
    with np.load(tmp_path / "fetched.npz", allow_pickle=False) as npz:
        assert npz["images"].shape == (5, 8, 8, 1)
        assert npz["labels"].tolist().count(0) == 3
    assert api.ledger.budgets == {}  # public: no budget


def test_good_tar_gz(api: Api) -> None:
    _, token = api.tenant()
    data = b.tar_bytes(b.image_folder({"x": 2, "y": 2}, mode="RGB"), gz=True)
    r = api.upload(token, data, PUBLIC, filename="d.tar.gz")
    assert r.status_code == 201, r.text
    assert r.json()["image_shape"] == [8, 8, 3] and r.json()["source_format"] == "tar"


def test_private_npz_registers_its_budget_with_the_default_delta(api: Api) -> None:
    tenant_id, token = api.tenant()
    r = api.upload(token, b.digits_npz(12, k=2), {**PRIVATE, "declared_size": 20},
                   filename="d.npz")
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["delta"] == pytest.approx(min(1e-6, 1 / 200)) == default_delta(20)
    assert body["true_size"] == 12 and body["declared_size"] == 20
    assert body["declared_public_by"] is None
    budget = api.ledger.budgets[body["dataset_id"]]
    assert budget.delta == body["delta"] and budget.declared_size == 20
    assert budget.tenant_id == tenant_id and budget.partitions == ["a", "b"]
    assert budget.epsilon_limit == 8.0
    view = api.client.get(f"/v1/datasets/{body['dataset_id']}/budget", headers=auth(token))
    assert view.status_code == 200 and view.json()["warning"] is False
    assert api.store.stat(f"private/datasets/{body['dataset_id']}/data.npz") is not None


def test_small_dataset_default_delta_is_below_one_over_n(api: Api) -> None:
    _, token = api.tenant()
    r = api.upload(token, b.digits_npz(4, k=2), {**PRIVATE, "declared_size": 4},
                   filename="d.npz")
    assert r.status_code == 201
    assert r.json()["delta"] == pytest.approx(min(1e-6, 1 / 40))


def test_ledger_failure_creates_nothing(api: Api) -> None:
    _, token = api.tenant()
    api.ledger.fail_create = True
    r = api.upload(token, b.digits_npz(6, k=2), {**PRIVATE, "declared_size": 6},
                   filename="d.npz")
    assert r.status_code == 503 and r.json()["code"] == "ledger_unavailable"
    assert api.client.get("/v1/datasets", headers=auth(token)).json()["items"] == []
    assert not list(Path(api.settings.object_store.root).rglob("*.npz"))


BAD: list[tuple[str, bytes, dict[str, Any], str, int, str]] = [
    ("corrupt", b"PK\x03\x04 definitely not a zip", PUBLIC, "d.zip", 422, "invalid_archive"),
    ("dotdot", b.zip_bytes({"../x/a.png": b.png()}), PUBLIC, "d.zip", 422, "unsafe_archive"),
    ("absolute", b.tar_bytes({"/etc/a/x.png": b.png()}), PUBLIC, "d.tar", 422, "unsafe_archive"),
    ("symlink", b.tar_bytes(b.image_folder({"a": 1}), symlinks={"a/l.png": "/etc/passwd"}),
     PUBLIC, "d.tar", 422, "unsafe_archive"),
    ("non-image", b.zip_bytes({"a/readme.txt": b"hello"}), PUBLIC, "d.zip", 422, "invalid_image"),
    ("pickled npz", b.npz_bytes(images=np.zeros((2, 4, 4), np.uint8),
                                labels=np.array([object(), None], dtype=object)),
     PUBLIC, "d.npz", 422, "unsafe_npz"),
    ("png bomb", b.zip_bytes({"a/bomb.png": b.bomb_png()}), PUBLIC, "d.zip", 422,
     "unsafe_archive"),
    ("zip bomb", b.zip_bomb(20 * 1024 * 1024), PUBLIC, "d.zip", 422, "unsafe_archive"),
    ("mixed shapes", b.zip_bytes({"a/1.png": b.png(8, 8), "a/2.png": b.png(12, 8)}), PUBLIC,
     "d.zip", 422, "invalid_dataset"),
    ("declared < true", b.digits_npz(10, k=2), {**PRIVATE, "declared_size": 5}, "d.npz", 422,
     "invalid_dataset"),
    ("delta >= 1/N", b.digits_npz(10, k=2), {**PRIVATE, "declared_size": 10, "delta": 0.1},
     "d.npz", 422,
     "invalid_dataset"),
    ("no label_domain", b.digits_npz(10, k=2), {"name": "p", "visibility": "private",
                                                 "epsilon_limit": 1.0, "declared_size": 10},
     "d.npz", 422,
     "invalid_dataset"),
    ("no visibility", b.digits_npz(10, k=2), {"name": "p"}, "d.npz", 422, "invalid_dataset"),
]


@pytest.mark.parametrize(("case", "data", "meta", "filename", "status", "code"), BAD,
                         ids=[c[0] for c in BAD])
def test_bad_uploads_are_clear_problems(api: Api, case: str, data: bytes, meta: dict[str, Any],
                                        filename: str, status: int, code: str) -> None:
    _, token = api.tenant()
    r = api.upload(token, data, meta, filename=filename)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body = r.json()
    assert body["code"] == code and len(body["detail"]) > 10
    assert api.client.get("/healthz").json() == {"status": "ok"}
    good = api.upload(token, b.zip_bytes(b.image_folder({"a": 1})), PUBLIC)
    assert good.status_code == 201  # the app stays healthy


def test_private_upload_errors_do_not_name_records(api: Api) -> None:
    _, token = api.tenant()
    data = b.zip_bytes({"a/patient-0042.txt": b"x", "b/ok.png": b.png()})
    r = api.upload(token, data, PRIVATE)
    assert r.status_code == 422 and r.json()["code"] == "invalid_image"
    assert "patient" not in r.text


def test_huge_upload_is_413(make_api: Any) -> None:
    api = make_api(max_upload_bytes=10_000)
    _, token = api.tenant()
    data = b.zip_bytes({f"a/{i}.png": np.random.default_rng(i).bytes(3000) for i in range(500)})
    assert len(data) > 1_100_000
    r = api.upload(token, data, PUBLIC)
    assert r.status_code == 413 and r.json()["code"] == "payload_too_large"
    small_but_over = b.zip_bytes({f"a/{i}.png": b.png(40, 40, value=i) for i in range(80)})
    assert 10_000 < len(small_but_over) < 1_000_000
    r = api.upload(token, small_but_over, PUBLIC)
    assert r.status_code == 413 and r.json()["limit"] == 10_000
    chunked = api.client.post("/v1/datasets", content=iter([b"x" * 600_000] * 3), headers={
        **auth(token), "Content-Type": "multipart/form-data; boundary=zzz"})
    assert chunked.status_code == 413


def test_model_upload_and_refusals(api: Api) -> None:
    _, token = api.tenant()
    r = api.client.post("/v1/models", headers=auth(token),
                        files={"file": ("m.tar", b.tar_bytes(b.model_folder(root="m/")), "x")},
                        data={"metadata": '{"name": "base"}'})
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["name"] == "base" and body["dp"] is False and body["publishable"] is True
    import tarfile

    dest = Path(api.settings.object_store.root).parent / "m.tar"
    api.store.get_file(f"models/{body['model_id']}/model.tar", dest)
    with tarfile.open(dest) as tf:
        assert "dpsynth_model.json" in tf.getnames() and "unet/config.json" in tf.getnames()
    cases = {
        "pickle": b.model_folder(extra={"unet/model.bin": b"x"}),
        "ckpt": b.model_folder(extra={"model.ckpt": b"x"}),
        "no info": {k: v for k, v in b.model_folder().items() if "dpsynth" not in k},
        "no weights": {k: v for k, v in b.model_folder().items() if "safetensors" not in k},
    }
    for name, members in cases.items():
        r = api.client.post("/v1/models", headers=auth(token),
                            files={"file": ("m.zip", b.zip_bytes(members), "x")})
        assert r.status_code == 422, name
        assert r.json()["code"] == "invalid_model"
    test_rng = api.client.post("/v1/models", headers=auth(token), files={"file": (
        "m.zip", b.zip_bytes(b.model_folder(info={"rng": "test"})), "x")})
    assert test_rng.json()["rng"] == "test" and test_rng.json()["publishable"] is False


def test_dataset_list_is_paginated(api: Api) -> None:
    _, token = api.tenant()
    ids = {api.public_dataset(token, {"a": 1}) for _ in range(3)}
    first = api.client.get("/v1/datasets?limit=2", headers=auth(token)).json()
    assert len(first["items"]) == 2 and first["next_cursor"]
    second = api.client.get(f"/v1/datasets?limit=2&cursor={first['next_cursor']}",
                            headers=auth(token)).json()
    assert len(second["items"]) == 1 and second["next_cursor"] is None
    assert {d["dataset_id"] for d in first["items"] + second["items"]} == ids
