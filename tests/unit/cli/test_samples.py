"""``dpsynth samples digits``: the README's sample data (issue 15, item 1)."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
from dpsynth_cli.main import app
from dpsynth_cli.samples import split_digits
from PIL import Image
from typer.testing import CliRunner


def test_two_disjoint_deterministic_image_folder_zips(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["samples", "digits", "--out", str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    assert "718 images" in result.output and "1079 images" in result.output
    CliRunner().invoke(app, ["samples", "digits", "--out", str(tmp_path / "b")])
    seen: dict[str, set[bytes]] = {}
    for part, n in (("public", 718), ("private", 1079)):
        a = (tmp_path / "a" / f"digits-{part}.zip").read_bytes()
        assert a == (tmp_path / "b" / f"digits-{part}.zip").read_bytes(), "deterministic"
        with zipfile.ZipFile(io.BytesIO(a)) as zf:
            names = zf.namelist()
            assert len(names) == n
            assert {name.split("/")[0] for name in names} == {str(i) for i in range(10)}
            image = Image.open(io.BytesIO(zf.read(names[0])))
            assert image.size == (8, 8) and image.mode == "L"
            seen[part] = {zf.read(name) + name.split("/")[1].encode() for name in names}
    assert not seen["public"] & seen["private"], "the parts share no record"


def test_the_split_is_the_demos() -> None:
    parts = split_digits()
    images, labels = parts["public"]
    assert images.shape == (718, 8, 8, 1) and images.dtype == np.uint8
    assert labels.shape == (718,) and set(labels.tolist()) == set(range(10))
    assert parts["private"][0].shape[0] == 1079
