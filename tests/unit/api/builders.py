"""Builders of upload payloads for the api tests: images, archives, npz files, bombs."""

from __future__ import annotations

import io
import struct
import tarfile
import zipfile
import zlib

import numpy as np
from PIL import Image


def png(width: int = 8, height: int = 8, *, mode: str = "L", value: int = 0) -> bytes:
    """A small PNG of one colour."""
    color: int | tuple[int, int, int] = value if mode == "L" else (value, value, value)
    buf = io.BytesIO()
    Image.new(mode, (width, height), color).save(buf, format="PNG")
    return buf.getvalue()


def bomb_png(width: int = 100_000, height: int = 100_000) -> bytes:
    """A tiny PNG whose header declares ``width x height`` pixels (IHDR patched, CRC fixed)."""
    data = bytearray(png(1, 1))
    # IHDR chunk: 8-byte signature, 4-byte length, b"IHDR", then width, height.
    start = 8 + 4
    assert data[start:start + 4] == b"IHDR"
    data[start + 4:start + 12] = struct.pack(">II", width, height)
    crc = zlib.crc32(bytes(data[start:start + 4 + 13])) & 0xFFFFFFFF
    data[start + 4 + 13:start + 4 + 13 + 4] = struct.pack(">I", crc)
    return bytes(data)


def image_folder(classes: dict[str, int], *, size: tuple[int, int] = (8, 8),
                 mode: str = "L", root: str = "") -> dict[str, bytes]:
    """Members of an image-folder archive: ``{root}{class}/{i}.png``."""
    return {f"{root}{name}/{i}.png": png(*size, mode=mode, value=(17 * i) % 256)
            for name, n in classes.items() for i in range(n)}


def zip_bytes(members: dict[str, bytes], *, symlinks: dict[str, str] | None = None) -> bytes:
    """A deflated zip of ``members`` (and unix symlink entries)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
        for name, target in (symlinks or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (0o120777 << 16)
            zf.writestr(info, target)
    return buf.getvalue()


def tar_bytes(members: dict[str, bytes], *, gz: bool = False,
              symlinks: dict[str, str] | None = None, hardlinks: dict[str, str] | None = None,
              devices: list[str] | None = None) -> bytes:
    """A tar (optionally gzipped) of ``members`` plus links and devices."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if gz else "w") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        for name, target in (symlinks or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tf.addfile(info)
        for name, target in (hardlinks or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.LNKTYPE, target
            tf.addfile(info)
        for name in devices or []:
            info = tarfile.TarInfo(name)
            info.type = tarfile.CHRTYPE
            tf.addfile(info)
    return buf.getvalue()


def npz_bytes(**arrays: np.ndarray) -> bytes:
    """An ``.npz`` of ``arrays`` (object arrays get pickled by numpy)."""
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    return buf.getvalue()


def digits_npz(n: int = 12, *, k: int = 3, size: int = 8, string_labels: bool = False) -> bytes:
    """``n`` grayscale images [N,H,W] with labels 0..k-1 (or their names)."""
    rng = np.random.default_rng(0)
    images = rng.integers(0, 255, size=(n, size, size), dtype=np.uint8)
    labels = np.arange(n) % k
    if string_labels:
        return npz_bytes(images=images, labels=np.asarray([f"c{i}" for i in labels]))
    return npz_bytes(images=images, labels=labels)


def zip_bomb(inflated_bytes: int = 20 * 1024 * 1024) -> bytes:
    """A zip whose one member inflates from a few KiB to ``inflated_bytes``."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        zf.writestr("cls/zeros.png", b"\0" * inflated_bytes)
    return buf.getvalue()


def model_folder(*, extra: dict[str, bytes] | None = None, root: str = "",
                 info: dict[str, object] | None = None) -> dict[str, bytes]:
    """Members of a minimal diffusers-style model folder (fake safetensors bytes)."""
    import json

    members = {
        f"{root}unet/config.json": b'{"_class_name": "UNet2DConditionModel"}',
        f"{root}unet/diffusion_pytorch_model.safetensors": b"\x08\0\0\0\0\0\0\0{}      ",
        f"{root}vae/config.json": b'{"_class_name": "AutoencoderKL"}',
        f"{root}vae/diffusion_pytorch_model.safetensors": b"\x08\0\0\0\0\0\0\0{}      ",
        f"{root}dpsynth_model.json": json.dumps(info or {"rng": "os", "image_size": 8,
                                                         "class_names": ["a", "b"]}).encode(),
    }
    members.update(extra or {})
    return members
