"""The model upload's content checks on their own: safetensors headers, the layout of a
model folder, dpsynth_model.json, and the download's tar -> zip re-packing."""

from __future__ import annotations

import io
import json
import struct
import tarfile
import zipfile
from typing import Any

import pytest
from dpsynth_api.models.download import tar_to_zip
from dpsynth_api.models.validation import check_safetensors, classify, parse_info
from dpsynth_shared.errors import DpsynthError

from tests.unit.api import builders as b


def raw_safetensors(header: dict[str, Any], buffer: int, *, length: int | None = None) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + b"\0" * buffer


def refused_weights(data: bytes, match: str, max_elements: int = 10**9) -> None:
    with pytest.raises(DpsynthError, match=match) as info:
        check_safetensors(data, name="unet/diffusion_pytorch_model.safetensors",
                          max_elements=max_elements)
    assert info.value.code == "invalid_model" and info.value.status == 422
    assert info.value.extensions["file"] == "unet/diffusion_pytorch_model.safetensors"


def t(dtype: str, shape: list[int], begin: int, end: int) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def test_valid_safetensors_pass_and_count_their_values() -> None:
    data = b.safetensors_bytes({"a": [2, 3], "b": [4]}, metadata={"format": "pt"})
    assert check_safetensors(data, name="w", max_elements=10) == 10
    # what the safetensors library writes is accepted too
    numpy = pytest.importorskip("numpy")
    from safetensors.numpy import save

    written = save({"x": numpy.zeros((3, 5), numpy.float16), "y": numpy.ones(2, numpy.float32)})
    assert check_safetensors(written, name="w", max_elements=100) == 17


@pytest.mark.parametrize("data,match", [
    (b"\x10\0\0", "shorter than its 8-byte header length"),
    (struct.pack("<Q", 1 << 40) + b"{}", "over the limit"),
    (struct.pack("<Q", 100) + b"{}", "runs past the end"),
    (struct.pack("<Q", 4) + b"\x80abc", "not a JSON object"),
    (struct.pack("<Q", 4) + b"{abc", "not valid UTF-8 JSON"),
    (raw_safetensors({"w": t("I64", [2], 0, 16)}, 16), "dtype 'I64'"),
    (raw_safetensors({"w": t("F32", [-1], 0, 0)}, 0), "invalid shape"),
    (raw_safetensors({"w": {"dtype": "F32", "shape": [1]}}, 4), "exactly dtype, shape"),
    (raw_safetensors({"w": t("F32", [2], 0, 8)}, 4), "outside the 4-byte buffer"),
    (raw_safetensors({"w": t("F32", [2], 0, 4)}, 4), "need 8"),
    (raw_safetensors({"a": t("F32", [2], 0, 8), "b": t("F32", [2], 4, 12)}, 12), "overlaps"),
    (raw_safetensors({"a": t("F32", [1], 0, 4), "b": t("F32", [1], 8, 12)}, 12), "gap"),
    (raw_safetensors({"a": t("F32", [1], 0, 4)}, 12), "cover 4 of the 12"),
    (raw_safetensors({"__metadata__": {"format": 1}}, 0), "__metadata__"),
])
def test_corrupt_safetensors_headers_are_refused(data: bytes, match: str) -> None:
    refused_weights(data, match)


def test_the_number_of_values_is_bounded() -> None:
    refused_weights(b.safetensors_bytes({"a": [10, 10]}), "over the limit of 99",
                    max_elements=99)


def test_the_model_layout() -> None:
    assert classify("dpsynth_model.json").kind == "info"  # type: ignore[union-attr]
    unet = classify("denoisers/cat/unet/config.json")
    assert unet is not None and (unet.kind, unet.component, unet.prefix) == (
        "config", "unet", "denoisers/cat/")
    weights = classify("class_embedder/model.safetensors")
    assert weights is not None and weights.kind == "weights"
    for other in ("unet/model.safetensors", "denoisers/cat/vae/config.json",
                  "text_encoder/config.json", "unet/config.json.bak", "README.md",
                  "unet/diffusion_pytorch_model.fp16.safetensors", "modeling_unet.py",
                  "denoisers/../unet/config.json"):
        assert classify(other) is None, other


def test_model_info_schema() -> None:
    good = b.model_info()
    assert parse_info(json.dumps(good).encode()) == good
    cases = [
        (b.model_info(format_version=2), "format_version 2"),
        ({k: v for k, v in good.items() if k != "latent_channels"}, "latent_channels"),
        (b.model_info(surprise=1), "surprise"),
        (b.model_info(num_classes=3, null_class=3), "num_classes is 3"),
        (b.model_info(class_names=["a", "a"], num_classes=2), "distinct"),
        (b.model_info(null_class=0), "null_class"),
        (b.model_info(rng="custom"), "rng"),
        (b.model_info(image_size="8"), "image_size"),
    ]
    for info, match in cases:
        with pytest.raises(DpsynthError, match=match):
            parse_info(json.dumps(info).encode())
    with pytest.raises(DpsynthError, match="not valid JSON"):
        parse_info(b"{")


def test_tar_to_zip_keeps_every_file_byte_for_byte() -> None:
    members = {**b.model_folder(), "dpsynth_provenance.json": b'{"dp": true}',
               "unet/diffusion_pytorch_model.safetensors": bytes(range(256)) * 5000}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        folder = tarfile.TarInfo("unet")
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)  # a directory entry: skipped
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    chunks = list(tar_to_zip(raw[i:i + 1000] for i in range(0, len(raw), 1000)))
    assert len(chunks) > 1  # streamed, not built whole
    with zipfile.ZipFile(io.BytesIO(b"".join(chunks))) as zf:
        assert zf.testzip() is None
        assert {n: zf.read(n) for n in zf.namelist()} == members
        weights = zf.getinfo("unet/diffusion_pytorch_model.safetensors")
        assert weights.compress_type == zipfile.ZIP_STORED
    again = b"".join(tar_to_zip([raw]))
    assert again == b"".join(chunks)  # the same model always streams the same bytes


def test_the_info_schema_follows_the_ml_core() -> None:
    """The api cannot import the ML core: its copy of ModelInfo's fields must not drift."""
    import dataclasses

    from dpsynth_api.models.validation import MODEL_FORMAT_VERSION, ModelInfoFile

    spec = pytest.importorskip("dpsynth_ml.spec")
    assert set(ModelInfoFile.model_fields) == {f.name for f in dataclasses.fields(spec.ModelInfo)}
    assert spec.MODEL_FORMAT_VERSION == MODEL_FORMAT_VERSION
