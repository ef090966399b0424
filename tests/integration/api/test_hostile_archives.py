"""Hostile archives, images and npz files are refused early and cheaply (issue 14, item 7).

A 1 MB ``.tar.gz`` used to take the api to 2.4 GB for 26 s: members were read whole, and
only the absolute inflated-size cap was checked. Each case here is an upload to the api (on
real PostgreSQL) answered with a 4xx RFC 9457 problem with a stable ``code`` within a few
seconds; the api is healthy after them. The bombs are real: their data does inflate to what
they declare (a 1 GiB deflate stream of zeros is built once and shared). The memory bound is
tested on the real reading code in a child process whose address space is capped below the
inflated size (``resource.setrlimit(RLIMIT_AS)``), with the api's default limits.
"""

from __future__ import annotations

import bz2
import functools
import gzip
import io
import json
import lzma
import os
import struct
import subprocess
import sys
import tarfile
import textwrap
import time
import zipfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dpsynth_shared.errors import PROBLEM_CONTENT_TYPE

from tests.integration.api.conftest import Api, auth
from tests.unit.api import builders as b

GIB, MIB = 1 << 30, 1 << 20
CASE_SECONDS = 20.0  # generous for 2 shared cores; a refusal takes well under a second


@functools.cache
def _zeros_deflate(n: int = GIB) -> tuple[bytes, int]:
    """A raw deflate stream of ``n`` zero bytes (about n/1000 bytes) and its CRC-32."""
    block, crc, out = bytes(MIB), 0, []
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    for _ in range(n // MIB):
        out.append(comp.compress(block))
        crc = zlib.crc32(block, crc)
    out.append(comp.flush())
    return b"".join(out), crc


def _deflate(data: bytes) -> bytes:
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    return comp.compress(data) + comp.flush()


def _zip(entries: list[tuple[str, bytes, int, int]], *, copies: int = 1,
         central_size: int | None = None) -> bytes:
    """A deflated zip written by hand: ``(name, deflated, crc, size)`` per member.

    ``copies`` central-directory entries point at each local member (an overlapping-entries
    bomb); ``central_size`` replaces the sizes the central directory declares (a lying
    header)."""
    local, central, count = io.BytesIO(), io.BytesIO(), 0
    for name, data, crc, size in entries:
        offset, raw = local.tell(), name.encode()
        local.write(struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, 8, 0, 0x21, crc,
                                len(data), size, len(raw), 0) + raw + data)
        for copy in range(copies):
            cname = raw if copies == 1 else f"{name}.{copy}".encode()
            declared = size if central_size is None else central_size
            central.write(struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 20, 20, 0, 8, 0,
                                      0x21, crc, len(data), declared, len(cname), 0, 0, 0, 0,
                                      0, offset) + cname)
            count += 1
    cd = central.getvalue()
    end = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, count, count, len(cd), local.tell(), 0)
    return local.getvalue() + cd + end


def _member(name: str, data: bytes) -> tuple[str, bytes, int, int]:
    return name, _deflate(data), zlib.crc32(data), len(data)


def _gzip_member_of_zeros() -> bytes:
    """One gzip member holding the shared 1 GiB of zeros (gzip members concatenate)."""
    data, crc = _zeros_deflate()
    return (b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff" + data
            + struct.pack("<II", crc, GIB & 0xFFFFFFFF))


def _targz_around_zeros(header: tarfile.TarInfo) -> bytes:
    """A tar.gz: ``header``, then 1 GiB of zeros as its data, then the end of archive."""
    return (gzip.compress(header.tobuf(tarfile.PAX_FORMAT)) + _gzip_member_of_zeros()
            + gzip.compress(bytes(1024)))


def _tar_compressed(size: int, compress: Callable[[bytes], bytes], name: str) -> bytes:
    """A tar of one member of ``size`` zeros, compressed whole (bz2, xz)."""
    info = tarfile.TarInfo(name)
    info.size = size
    head = info.tobuf(tarfile.GNU_FORMAT)
    return compress(head + bytes(size) + bytes(1024))


@functools.cache
def _npz_bomb() -> bytes:
    """An npz whose images array is 1 GiB of zeros, deflated (np.savez_compressed-like):
    the array header, flushed, then the shared deflate stream of zeros."""
    head = _npy_header((16384, 256, 256))
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    prefix = comp.compress(head) + comp.flush(zlib.Z_SYNC_FLUSH)
    zeros, _ = _zeros_deflate()
    crc, block = zlib.crc32(head), bytes(MIB)
    for _ in range(GIB // MIB):
        crc = zlib.crc32(block, crc)
    labels = io.BytesIO()
    np.save(labels, np.zeros(16384, dtype=np.int64))
    return _zip([("images.npy", prefix + zeros, crc, len(head) + GIB),
                 _member("labels.npy", labels.getvalue())])


def _png_folder_decoding_large(n: int) -> bytes:
    """``n`` 2048x2048 one-colour PNGs (a few KB each, 4 MiB each decoded)."""
    return b.zip_bytes({f"a/{i}.png": b.png(2048, 2048, value=i) for i in range(n)})


@functools.cache
def _model_with_bomb_weights() -> bytes:
    members = b.model_folder()
    weights = "unet/diffusion_pytorch_model.safetensors"
    zeros, crc = _zeros_deflate()
    entries = [_member(name, data) for name, data in members.items() if name != weights]
    return _zip([*entries, (weights, zeros, crc, GIB)])


def _pax(kind: bytes, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo("././@PaxHeader" if kind == tarfile.XHDTYPE else "././@LongLink")
    info.type, info.size = kind, size
    return info


def _big_member(size: int = GIB) -> tarfile.TarInfo:
    info = tarfile.TarInfo("a/zeros.png")
    info.size = size
    return info


DATASET, MODEL = "/v1/datasets", "/v1/models"
Case = tuple[str, str, Callable[[], bytes], str]  # endpoint, file name, payload, code
CASES: dict[str, Case] = {
    # decompression bombs whose data really inflates to 1 GiB
    "zip-bomb-1gib": (DATASET, "d.zip", lambda: _zip([("a/x.png", *_zeros_deflate(), GIB)]),
                      "unsafe_archive"),
    "targz-bomb-1gib": (DATASET, "d.tar.gz", lambda: _targz_around_zeros(_big_member()),
                        "unsafe_archive"),
    "tarbz2-bomb": (DATASET, "d.tar.bz2",
                    lambda: _tar_compressed(128 * MIB, bz2.compress, "a/x.png"),
                    "unsafe_archive"),
    "tarxz-bomb": (DATASET, "d.tar.xz", lambda: _tar_compressed(
        128 * MIB, lambda d: lzma.compress(d, preset=1), "a/x.png"), "unsafe_archive"),
    "npz-bomb-1gib": (DATASET, "d.npz", _npz_bomb, "unsafe_archive"),
    "model-weights-bomb-1gib": (MODEL, "m.zip", _model_with_bomb_weights, "unsafe_archive"),
    # under the absolute cap but past the compression-ratio limit
    "zip-ratio-48mib": (DATASET, "d.zip", lambda: _zip([_member("a/x.png", bytes(48 * MIB))]),
                        "unsafe_archive"),
    # headers that make tarfile read a whole declared size into memory
    "targz-pax-header-1gib": (DATASET, "d.tar.gz",
                              lambda: _targz_around_zeros(_pax(tarfile.XHDTYPE, GIB)),
                              "unsafe_archive"),
    "targz-gnu-longname-1gib": (DATASET, "d.tar.gz",
                                lambda: _targz_around_zeros(_pax(tarfile.GNUTYPE_LONGNAME, GIB)),
                                "unsafe_archive"),
    # headers that lie
    "zip-overlapping-entries": (DATASET, "d.zip", lambda: _zip(
        [_member("a/x.png", bytes(8 * MIB))], copies=64), "unsafe_archive"),
    "zip-central-size-claims-3gb": (DATASET, "d.zip", lambda: _zip(
        [_member("a/x.png", b.png())], central_size=3 * 10**9), "unsafe_archive"),
    "zip-central-size-understates": (DATASET, "d.zip", lambda: _zip(
        [_member("a/x.png", bytes(8 * MIB))], central_size=100), "invalid_archive"),
    "targz-truncated-member": (DATASET, "d.tar.gz", lambda: gzip.compress(
        _big_member(2 * MIB).tobuf() + bytes(MIB)), "invalid_archive"),
    "npy-header-claims-more-than-member": (DATASET, "d.npz", lambda: _zip([
        _member("images.npy", _npy_header((1 << 20, 64, 64)) + bytes(64)),
        _member("labels.npy", _npy_header((2,), "<i8") + bytes(16))]), "unsafe_npz"),
    # many members
    "zip-many-tiny-members": (DATASET, "d.zip", lambda: _zip(
        [_member(f"a/{i}.png", b"") for i in range(1001)]), "unsafe_archive"),
    "targz-many-tiny-members": (DATASET, "d.tar.gz", lambda: b.tar_bytes(
        {f"a/{i}.png": b"" for i in range(1001)}, gz=True), "unsafe_archive"),
    # images that decode far larger than they are
    "png-folder-decodes-past-cap": (DATASET, "d.zip", lambda: _png_folder_decoding_large(20),
                                    "unsafe_archive"),
    "png-bomb-in-targz": (DATASET, "d.tar.gz", lambda: b.tar_bytes(
        {"a/bomb.png": b.bomb_png(), **b.image_folder({"a": 2})}, gz=True), "unsafe_archive"),
    # nesting and names
    "nested-zip-bomb-as-member": (DATASET, "d.zip", lambda: b.zip_bytes({
        "a/inner.zip": _zip([("x.png", *_zeros_deflate(), GIB)]), **b.image_folder({"a": 2})}),
        "invalid_image"),
    "tar-windows-drive-name": (DATASET, "d.tar", lambda: b.tar_bytes({"C:/a/x.png": b.png()}),
                               "unsafe_archive"),
    "zip-backslash-dotdot-name": (DATASET, "d.zip", lambda: b.zip_bytes(
        {"a\\..\\..\\x.png": b.png()}), "unsafe_archive"),
    "targz-dotdot-name": (DATASET, "d.tar.gz", lambda: b.tar_bytes(
        {"a/../../x.png": b.png()}, gz=True), "unsafe_archive"),
}


def _npy_header(shape: tuple[int, ...], descr: str = "|u1") -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False,
                                               "shape": shape})
    return buf.getvalue()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, pg: Any) -> Iterator[dict[str, Any]]:
    """One api for the module, with tight limits: 64 MiB inflated at most, 100x at most
    past a 4 MiB floor, 8 MiB per member, 1,000 members, 4 Mpx images."""
    from dpsynth_api.app import create_app
    from dpsynth_api.fakes import FakeLedger, RecordingSender
    from dpsynth_api.migrate import upgrade_head
    from dpsynth_shared.stores.local import LocalDirStore
    from fastapi.testclient import TestClient

    from tests.integration.api.conftest import admin_token, make_settings

    tmp: Path = tmp_path_factory.mktemp("hostile-archives")
    url = pg.url(pg.create_database())
    settings = make_settings(url, tmp, max_uncompressed_bytes=64 * MIB,
                             max_member_bytes=8 * MIB, max_decompression_ratio=100.0,
                             ratio_floor_bytes=4 * MIB, max_archive_members=1000,
                             max_image_pixels=4 * MIB, spool_dir=str(tmp / "spool"))
    upgrade_head(settings)
    store = LocalDirStore(tmp / "objects")
    ledger, sender = FakeLedger(), RecordingSender()
    app = create_app(settings, store=store, ledger=ledger, task_sender=sender)
    with TestClient(app, raise_server_exceptions=False) as client:
        api = Api(client, settings, ledger, sender, store, admin_token(settings))
        _, token = api.tenant("hostile-archives")
        yield {"api": api, "token": token, "spool": tmp / "spool"}


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_archive_is_refused_early(world: dict[str, Any], case: str) -> None:
    endpoint, filename, build, code = CASES[case]
    payload = build()
    api: Api = world["api"]
    data = ({"metadata": json.dumps({"name": "hostile", "visibility": "public"})}
            if endpoint == DATASET else {})
    started = time.monotonic()
    r = api.client.post(endpoint, headers=auth(world["token"]), data=data,
                        files={"file": (filename, payload, "application/octet-stream")})
    elapsed = time.monotonic() - started
    assert 400 <= r.status_code < 500, (case, r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith(PROBLEM_CONTENT_TYPE), r.headers
    body = r.json()
    assert body["code"] == code, (case, body)
    assert elapsed < CASE_SECONDS, (case, elapsed)
    spool: Path = world["spool"]
    assert not spool.exists() or not any(spool.iterdir()), "a refused upload left its files"


def test_the_api_is_healthy_after_the_hostile_archives(world: dict[str, Any]) -> None:
    api: Api = world["api"]
    assert api.client.get("/healthz").status_code == 200
    r = api.upload(world["token"], b.zip_bytes(b.image_folder({"a": 3, "b": 3})),
                   {"name": "fine", "visibility": "public"})
    assert r.status_code == 201, r.text
    assert api.model(world["token"]).startswith("mdl_")


_CHILD = textwrap.dedent("""
    import dataclasses, json, resource, sys
    from pathlib import Path
    from dpsynth_api.datasets.ingest import IngestLimits, ingest_upload
    from dpsynth_api.models.validation import check_model_archive, repack
    from dpsynth_api.archives import ArchiveLimits, SafeArchive
    from dpsynth_api.settings import ApiSettings
    from dpsynth_shared.errors import DpsynthError

    fields = ApiSettings.model_fields  # the api's DEFAULT limits, not the tests' tight ones
    names = {"max_uncompressed_bytes": "max_uncompressed_bytes",
             "max_members": "max_archive_members", "max_member_bytes": "max_member_bytes",
             "max_ratio": "max_decompression_ratio", "ratio_floor_bytes": "ratio_floor_bytes"}
    known = {f.name for f in dataclasses.fields(ArchiveLimits)}
    limits = ArchiveLimits(**{k: fields[v].default for k, v in names.items() if k in known})
    def vm(key):
        for line in open("/proc/self/status"):
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    headroom = int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_AS, (vm("VmSize") + headroom,) * 2)
    before, codes = vm("VmHWM"), {}
    for path in sys.argv[2:]:
        p = Path(path)
        try:
            if p.name.startswith("model"):
                archive = SafeArchive(p, limits, private=False)
                repack(archive, check_model_archive(archive), p.with_suffix(".out"))
            else:
                ingest_upload(p, p.name, private=False, label_domain=None,
                              limits=IngestLimits(limits, fields["max_image_pixels"].default))
            codes[p.name] = "accepted"
        except DpsynthError as exc:
            codes[p.name] = str(exc.code)
        except MemoryError:
            codes[p.name] = "MemoryError"
    print(json.dumps({"codes": codes, "peak_growth": vm("VmHWM") - before}))
""")


def test_reading_a_bomb_stays_far_below_its_inflated_size(tmp_path: Path) -> None:
    """The api's default limits (2 GiB absolute) on bombs inflating to 1 GiB, and on a model
    whose 192 MiB of weights are within every limit: a child whose address space may grow
    by 384 MiB only refuses the bombs and streams the weights (refused at the end for not
    matching their config), with a peak RSS growth far below either size (the old reader
    held each member whole)."""
    weights = b.safetensors_bytes({"w": [48 * MIB]})  # 192 MiB of float32 zeros
    large = io.BytesIO()
    with zipfile.ZipFile(large, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, data in b.model_folder(extra={
                "unet/diffusion_pytorch_model.safetensors": weights}).items():
            zf.writestr(name, data)
    del weights
    bombs = {"d.tar.gz": _targz_around_zeros(_big_member()),
             "pax.tar.gz": _targz_around_zeros(_pax(tarfile.XHDTYPE, GIB)),
             "d.zip": _zip([("a/x.png", *_zeros_deflate(), GIB)]),
             "d.npz": _npz_bomb(), "model.zip": _model_with_bomb_weights()}
    paths = []
    for name, data in [*bombs.items(), ("model-large.zip", large.getvalue())]:
        (tmp_path / name).write_bytes(data)
        paths.append(str(tmp_path / name))
    del large
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", _CHILD, str(384 * MIB), *paths], env=env,
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["codes"] == {**dict.fromkeys(bombs, "unsafe_archive"),
                               "model-large.zip": "invalid_model"}, result
    assert result["peak_growth"] < 96 * MIB, result
