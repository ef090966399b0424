"""``dpsynth datasets upload`` checks before sending and zips a folder (issue 15, items 3, 5)."""

from __future__ import annotations

import io
import json
import zipfile
from email.parser import BytesParser
from email.policy import HTTP
from pathlib import Path

import httpx
from dpsynth_cli.main import app
from PIL import Image
from typer.testing import CliRunner

from tests.unit.cli.fake_api import FakeApi, dataset_body

runner = CliRunner()


def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("L", (4, 4), 7).save(buf, format="PNG")
    return buf.getvalue()


def _parts(request: httpx.Request) -> dict[str, bytes]:
    head = f"Content-Type: {request.headers['content-type']}\r\n\r\n".encode()
    message = BytesParser(policy=HTTP).parsebytes(head + request.content)
    return {str(p.get_param("name", header="content-disposition")): p.get_payload(decode=True)
            for p in message.iter_parts()}


def test_a_hugging_face_folder_is_zipped_and_sent_with_its_held_out_split(
        api: FakeApi, tmp_path: Path) -> None:
    for split, label, name in (("train", "cat", "1.png"), ("train", "dog", "2.png"),
                               ("test", "cat", "3.png"), ("test", "dog", "4.png")):
        (tmp_path / "pets" / split / label).mkdir(parents=True, exist_ok=True)
        (tmp_path / "pets" / split / label / name).write_bytes(_png())
    (tmp_path / "pets" / ".DS_Store").write_bytes(b"x")
    api.route("POST", "/v1/datasets", lambda r: httpx.Response(201, json=dataset_body("ds_7")))
    result = runner.invoke(app, ["datasets", "upload", str(tmp_path / "pets"), "--name", "pets",
                                 "--visibility", "public", "--label-domain", "cat,dog",
                                 "--holdout-from", "test", "-q"])
    assert result.exit_code == 0, result.output
    assert result.stdout == "ds_7\n"
    parts = _parts(api.requests[-1])
    assert json.loads(parts["metadata"])["holdout_from"] == "test"
    with zipfile.ZipFile(io.BytesIO(parts["file"])) as zf:
        assert sorted(zf.namelist()) == ["test/cat/3.png", "test/dog/4.png",
                                         "train/cat/1.png", "train/dog/2.png"]


def test_a_wrong_file_type_or_unknown_labels_are_refused_before_sending(
        api: FakeApi, tmp_path: Path) -> None:
    image = tmp_path / "scan.png"
    image.write_bytes(_png())
    result = runner.invoke(app, ["datasets", "upload", str(image), "--name", "x",
                                 "--visibility", "public"])
    assert result.exit_code == 2
    assert "accepted" in result.stderr and ".npz" in result.stderr and ".zip" in result.stderr
    (tmp_path / "f" / "bird").mkdir(parents=True)
    (tmp_path / "f" / "bird" / "1.png").write_bytes(_png())
    result = runner.invoke(app, ["datasets", "upload", str(tmp_path / "f"), "--name", "x",
                                 "--visibility", "public", "--label-domain", "cat,dog"])
    assert result.exit_code == 2 and "bird" in result.stderr
    assert not [r for r in api.requests if r.method == "POST"], "nothing was sent"
    result = runner.invoke(app, ["datasets", "upload", str(tmp_path / "f"), "--name", "x",
                                 "--visibility", "public", "--holdout-from", "test",
                                 "--holdout-fraction", "0.2"])
    assert result.exit_code == 2 and "--holdout-from" in result.output
