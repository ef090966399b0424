"""One contract suite for every object-store adapter (local folder and real S3).

The S3 variant runs against the session's real SeaweedFS server (``s3_endpoint``), with
presigned URLs signed for a *differently spelled* public endpoint and fetched over HTTP.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest
from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.grants import GrantClaims, generate_signing_key, public_key_of, sign_grant
from dpsynth_shared.object_store import ObjectStore
from dpsynth_shared.settings import ObjectStoreSettings
from dpsynth_shared.stores import LocalDirStore, from_settings
from dpsynth_shared.stores.s3 import S3Store
from pydantic import SecretStr

SIGNING_KEY = generate_signing_key()
PUBLIC_KEY = public_key_of(SIGNING_KEY)


@dataclass
class StoreCase:
    kind: str
    store: ObjectStore
    public_host: str | None = None


# SeaweedFS gives each bucket its own volumes and has few free slots: one bucket per module.
BUCKET = f"contract-{uuid.uuid4().hex[:10]}"


@pytest.fixture()
def uid() -> str:
    """A fresh id so tests sharing the bucket never see each other's objects."""
    return uuid.uuid4().hex[:12]


@pytest.fixture(params=["local", "s3"])
def case(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreCase]:
    if request.param == "local":
        yield StoreCase("local", LocalDirStore(tmp_path / "objects", grant_public_key=PUBLIC_KEY))
        return
    endpoint: str = request.getfixturevalue("s3_endpoint")
    port = endpoint.rsplit(":", 1)[1]
    settings = ObjectStoreSettings(
        kind="s3", endpoint=endpoint, public_endpoint=f"localhost:{port}",
        access_key=SecretStr("contract-test"), secret_key=SecretStr("contract-test-secret"),
        bucket=BUCKET, presign_ttl_s=120,
    )
    yield StoreCase("s3", from_settings(settings, grant_public_key=PUBLIC_KEY),
                    public_host=f"localhost:{port}")


def _grant(dataset_id: str, *, expires_in: float = 60.0, key: str = SIGNING_KEY) -> str:
    claims = GrantClaims(
        grant_id=uuid.uuid4().hex, dataset_id=dataset_id, reservation_id="res_1",
        job_id="job_1", attempt=1, expires_at=time.time() + expires_in,
    )
    return sign_grant(claims, key)


def _private_key(dataset_id: str) -> str:
    return f"private/datasets/{dataset_id}/data.npz"


def _code(excinfo: pytest.ExceptionInfo[DpsynthError]) -> str:
    return str(excinfo.value.code)


def test_from_settings_picks_the_adapter(case: StoreCase) -> None:
    expected = LocalDirStore if case.kind == "local" else S3Store
    assert isinstance(case.store, expected)


def test_put_bytes_get_file_round_trip_with_sha256(
    case: StoreCase, uid: str, tmp_path: Path
) -> None:
    data = b"synthetic bytes \x00\x01" * 1000
    info = case.store.put_bytes(f"models/m1{uid}/model.tar", data)
    assert info.sha256 == hashlib.sha256(data).hexdigest()
    assert info.size == len(data)
    got = case.store.get_file(f"models/m1{uid}/model.tar", tmp_path / "out" / "model.tar")
    assert (tmp_path / "out" / "model.tar").read_bytes() == data
    assert got.sha256 == info.sha256
    stat = case.store.stat(f"models/m1{uid}/model.tar")
    assert stat is not None and (stat.size, stat.sha256) == (len(data), info.sha256)


def test_put_file_round_trip_and_overwrite(case: StoreCase, uid: str, tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(b"first version")
    first = case.store.put_file(f"checkpoints/j1{uid}/step-00000010.tar", src)
    src.write_bytes(b"second, longer version")
    second = case.store.put_file(f"checkpoints/j1{uid}/step-00000010.tar", src)
    assert first.sha256 != second.sha256
    assert second.sha256 == hashlib.sha256(b"second, longer version").hexdigest()
    stat = case.store.stat(f"checkpoints/j1{uid}/step-00000010.tar")
    assert stat is not None and stat.sha256 == second.sha256 and stat.size == 22


def test_stat_of_missing_key_is_none_and_get_is_not_found(
    case: StoreCase, uid: str, tmp_path: Path
) -> None:
    assert case.store.stat(f"models/nope{uid}/model.tar") is None
    with pytest.raises(DpsynthError) as excinfo:
        case.store.get_file(f"models/nope{uid}/model.tar", tmp_path / "x")
    assert _code(excinfo) == ErrorCode.NOT_FOUND
    assert not (tmp_path / "x").exists()


def test_iter_chunks_streams_in_chunks(case: StoreCase, uid: str) -> None:
    data = bytes(range(256)) * 40  # 10240 bytes
    case.store.put_bytes(f"public/datasets/d1{uid}/data.npz", data)
    chunks = list(case.store.iter_chunks(f"public/datasets/d1{uid}/data.npz", chunk_size=1024))
    assert b"".join(chunks) == data
    assert len(chunks) >= 10
    assert max(len(c) for c in chunks) <= 1024


def test_delete_removes_and_is_idempotent(case: StoreCase, uid: str) -> None:
    case.store.put_bytes(f"models/m2{uid}/model.tar", b"abc")
    case.store.delete(f"models/m2{uid}/model.tar")
    assert case.store.stat(f"models/m2{uid}/model.tar") is None
    case.store.delete(f"models/m2{uid}/model.tar")  # no error the second time
    assert case.store.stat(f"models/m2{uid}/model.tar") is None


def test_private_read_without_grant_is_refused(case: StoreCase, uid: str, tmp_path: Path) -> None:
    key = _private_key(f"ds_a{uid}")
    case.store.put_bytes(key, b"private pixels")
    with pytest.raises(DpsynthError) as excinfo:
        case.store.get_file(key, tmp_path / "x")
    assert _code(excinfo) == ErrorCode.GRANT_REQUIRED
    assert excinfo.value.status == 403
    with pytest.raises(DpsynthError) as excinfo:
        case.store.iter_chunks(key)
    assert _code(excinfo) == ErrorCode.GRANT_REQUIRED


@pytest.mark.parametrize("bad", ["forged", "expired", "other_dataset", "garbage"])
def test_private_read_with_bad_grant_is_refused(case: StoreCase, uid: str, tmp_path: Path,
                                                bad: str) -> None:
    key = _private_key(f"ds_b{uid}")
    case.store.put_bytes(key, b"private pixels")
    grant = {
        "forged": _grant(f"ds_b{uid}", key=generate_signing_key()),
        "expired": _grant(f"ds_b{uid}", expires_in=-1.0),
        "other_dataset": _grant("ds_other"),
        "garbage": "not-a-grant",
    }[bad]
    with pytest.raises(DpsynthError) as excinfo:
        case.store.get_file(key, tmp_path / "x", grant=grant)
    assert _code(excinfo) == ErrorCode.INVALID_GRANT
    with pytest.raises(DpsynthError) as excinfo:
        case.store.iter_chunks(key, grant=grant)
    assert _code(excinfo) == ErrorCode.INVALID_GRANT
    assert not (tmp_path / "x").exists()


def test_private_read_with_valid_grant(case: StoreCase, uid: str, tmp_path: Path) -> None:
    key = _private_key(f"ds_c{uid}")
    info = case.store.put_bytes(key, b"private pixels")
    grant = _grant(f"ds_c{uid}")
    got = case.store.get_file(key, tmp_path / "data.npz", grant=grant)
    assert got.sha256 == info.sha256
    assert (tmp_path / "data.npz").read_bytes() == b"private pixels"
    assert b"".join(case.store.iter_chunks(key, grant=grant)) == b"private pixels"


def test_store_without_public_key_refuses_every_grant(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    store.put_bytes(_private_key("ds_d"), b"x")
    with pytest.raises(DpsynthError) as excinfo:
        store.get_file(_private_key("ds_d"), tmp_path / "x", grant=_grant("ds_d"))
    assert _code(excinfo) == ErrorCode.INVALID_GRANT


@pytest.mark.parametrize("key", [_private_key("ds_e"), "models/m3/model.tar",
                                 "public/datasets/d2/data.npz", "owner/j1/private-stats-1.json"])
def test_presign_refused_outside_corpora(case: StoreCase, key: str) -> None:
    case.store.put_bytes(key, b"not presignable")
    with pytest.raises(DpsynthError) as excinfo:
        case.store.presign_get(key, ttl=timedelta(seconds=60))
    assert _code(excinfo) == ErrorCode.PRESIGN_REFUSED


def test_presign_corpus_and_fetch(case: StoreCase, uid: str) -> None:
    data = b"PK corpus bytes" * 100
    case.store.put_bytes(f"corpora/j9{uid}/corpus.zip", data, content_type="application/zip")
    url = case.store.presign_get(f"corpora/j9{uid}/corpus.zip", ttl=timedelta(hours=5))
    parsed = urlparse(url)
    if case.kind == "local":
        # An opaque token the api serves (issue 14, item 13): no file path, not even the key.
        local = case.store
        assert isinstance(local, LocalDirStore)
        assert url.startswith("/v1/presigned/") and not parsed.scheme
        assert str(local.root) not in url and "corpora" not in url
        token = url.rsplit("/", 1)[1]
        assert local.resolve_presigned(token) == f"corpora/j9{uid}/corpus.zip"
        for bad in (token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB"), "x"):
            with pytest.raises(DpsynthError) as excinfo:
                local.resolve_presigned(bad)
            assert _code(excinfo) == ErrorCode.NOT_FOUND
        return
    assert parsed.netloc == case.public_host
    # TTL is capped at settings.presign_ttl_s (120 s), whatever was asked.
    assert "X-Amz-Expires=120" in parsed.query
    response = httpx.get(url, timeout=10)
    assert response.status_code == 200
    assert response.content == data
    tampered = url.replace("corpus.zip", "corpus2.zip")
    assert httpx.get(tampered, timeout=10).status_code in {403, 404}


def test_presign_missing_corpus_is_not_found(case: StoreCase, uid: str) -> None:
    with pytest.raises(DpsynthError) as excinfo:
        case.store.presign_get(f"corpora/nope{uid}/corpus.zip", ttl=timedelta(seconds=60))
    assert _code(excinfo) == ErrorCode.NOT_FOUND


@pytest.mark.parametrize("key", ["", "/etc/passwd", "models/../private/datasets/x/data.npz",
                                 "models//m/model.tar", "models\\m\\model.tar", "models/m/",
                                 "./models/m", "models/.meta/x", ".."])
def test_bad_keys_are_refused(case: StoreCase, key: str, tmp_path: Path) -> None:
    for call in (lambda: case.store.put_bytes(key, b"x"),
                 lambda: case.store.get_file(key, tmp_path / "x"),
                 lambda: case.store.stat(key),
                 lambda: case.store.delete(key)):
        with pytest.raises(DpsynthError) as excinfo:
            call()
        assert _code(excinfo) == ErrorCode.INVALID_REQUEST


def test_local_write_leaves_no_temp_files(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path / "root")
    store.put_bytes("models/m4/model.tar", b"x" * 5000)
    names = sorted(p.name for p in (tmp_path / "root" / "models" / "m4").iterdir())
    assert names == ["model.tar"]
