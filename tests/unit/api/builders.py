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


def safetensors_bytes(tensors: dict[str, list[int]], *, dtype: str = "F32",
                      metadata: dict[str, str] | None = None) -> bytes:
    """A valid safetensors file of zero-filled tensors with these shapes."""
    import json
    import math

    size = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I64": 8}[dtype]
    header: dict[str, object] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name, shape in tensors.items():
        n = math.prod(shape) * size
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + b"\0" * offset


#: Configs of a tiny model as diffusers saves them (the ML core's ``tiny`` preset at 8x8).
TINY_CONFIGS: dict[str, dict[str, object]] = {
    "vae/config.json": {
        "_class_name": "AutoencoderKL", "_diffusers_version": "0.42.1", "in_channels": 1,
        "out_channels": 1, "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D"],
        "up_block_types": ["UpDecoderBlock2D", "UpDecoderBlock2D"],
        "block_out_channels": [16, 32], "layers_per_block": 1, "act_fn": "silu",
        "latent_channels": 4, "norm_num_groups": 8, "sample_size": 8, "scaling_factor": 1.0,
        "mid_block_add_attention": False},
    "unet/config.json": {
        "_class_name": "UNet2DConditionModel", "_diffusers_version": "0.42.1",
        "sample_size": 4, "in_channels": 4, "out_channels": 4, "layers_per_block": 1,
        "block_out_channels": [32, 64],
        "down_block_types": ["CrossAttnDownBlock2D", "DownBlock2D"],
        "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D"],
        "mid_block_type": "UNetMidBlock2DCrossAttn", "cross_attention_dim": 32,
        "attention_head_dim": 8, "norm_num_groups": 8},
    "scheduler/scheduler_config.json": {
        "_class_name": "DDPMScheduler", "_diffusers_version": "0.42.1",
        "num_train_timesteps": 1000, "beta_schedule": "linear", "beta_start": 0.0001,
        "beta_end": 0.02, "prediction_type": "epsilon", "clip_sample": False},
    "class_embedder/config.json": {"num_embeddings": 3, "embedding_dim": 32, "null_class": 2},
}


def model_info(**overrides: object) -> dict[str, object]:
    """A valid ``dpsynth_model.json`` for :func:`model_folder` (classes a, b)."""
    info: dict[str, object] = {
        "format_version": 1, "preset": "tiny", "image_size": 8, "channels": 1,
        "latent_channels": 4, "vae_scaling_factor": 1.0, "num_classes": 2,
        "class_names": ["a", "b"], "null_class": 2, "rng": "os", "training_kind": "pretrain",
        "steps": 1, "extra": {"unet_class": "UNet2DConditionModel"}}
    info.update(overrides)
    return info


def model_folder(*, extra: dict[str, bytes] | None = None, root: str = "",
                 info: dict[str, object] | None = None,
                 configs: dict[str, dict[str, object]] | None = None) -> dict[str, bytes]:
    """Members of a small valid model folder: real tiny configs, valid safetensors headers
    (the weights are zeros and only a few tensors: nothing here loads them).

    Args:
        extra: more members (or replacements), by path without ``root``.
        root: a top directory the folder is archived under.
        info: overrides of :func:`model_info`'s fields.
        configs: replacements of :data:`TINY_CONFIGS` entries, by path.
    """
    import json

    members = {path: json.dumps(config, indent=2).encode()
               for path, config in {**TINY_CONFIGS, **(configs or {})}.items()}
    members["unet/diffusion_pytorch_model.safetensors"] = safetensors_bytes(
        {"conv_in.weight": [32, 4, 3, 3], "conv_in.bias": [32]}, metadata={"format": "pt"})
    members["vae/diffusion_pytorch_model.safetensors"] = safetensors_bytes(
        {"encoder.conv_in.weight": [16, 1, 3, 3], "encoder.conv_in.bias": [16]})
    members["class_embedder/model.safetensors"] = safetensors_bytes({"weight": [3, 32]})
    members["dpsynth_model.json"] = json.dumps(model_info(**(info or {}))).encode()
    members.update(extra or {})
    return {f"{root}{path}": data for path, data in members.items()}
