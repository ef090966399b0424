"""The CLI's checks before an upload (issue 15, items 3 and 5): a file of no accepted format
is refused with the api's code and sentence before a byte is sent; a folder is zipped
deterministically without hidden files; unknown labels of a folder or zip are named on the
user's machine."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from dpsynth_cli.uploads import (
    UPLOAD_NAME,
    check_labels,
    folder_files,
    label_values,
    prepare_upload,
    prepared_upload,
    zip_folder,
)
from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.upload_formats import UNSUPPORTED_FORMAT_CODE, accepted_sentence


def tree(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


HF = {"train/cat/1.png": b"c1", "train/dog/2.png": b"d2", "test/cat/3.png": b"c3",
      ".DS_Store": b"x", "train/.hidden/4.png": b"h", "test/cat/.DS_Store": b"x",
      "__MACOSX/._1.png": b"m"}


@pytest.mark.parametrize("name", ["scan.png", "labels.csv", "data", "archive.7z"])
def test_an_unsupported_file_is_refused_with_the_api_sentence(tmp_path: Path,
                                                              name: str) -> None:
    path = tmp_path / name
    path.write_bytes(b"whatever")
    with pytest.raises(DpsynthError) as info:
        prepare_upload(path)
    assert info.value.code == UNSUPPORTED_FORMAT_CODE == ErrorCode.INVALID_ARCHIVE
    assert info.value.detail.endswith(accepted_sentence(folders=True))
    assert info.value.status == 422


@pytest.mark.parametrize("name", ["d.zip", "d.NPZ", "d.parquet", "d.tar.gz", "d.tgz"])
def test_an_accepted_file_is_sent_as_it_is(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_bytes(b"x")
    assert prepare_upload(path) == path


def test_a_missing_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DpsynthError) as info:
        prepare_upload(tmp_path / "nope.zip")
    assert info.value.code == ErrorCode.INVALID_REQUEST


def test_a_folder_is_zipped_sorted_without_hidden_files_and_removed_after(
        tmp_path: Path) -> None:
    folder = tree(tmp_path / "pets", HF)
    with prepared_upload(folder, workdir=tmp_path) as sent:
        assert sent.name == UPLOAD_NAME and sent.parent != folder
        with zipfile.ZipFile(sent) as zf:
            assert zf.namelist() == ["test/cat/3.png", "train/cat/1.png", "train/dog/2.png"]
            assert zf.read("train/dog/2.png") == b"d2"
            assert {i.date_time for i in zf.infolist()} == {(1980, 1, 1, 0, 0, 0)}
    assert not sent.exists() and not sent.parent.exists()
    assert folder.joinpath("train/cat/1.png").exists()  # the user's files untouched


def test_the_same_folder_gives_the_same_zip_bytes(tmp_path: Path) -> None:
    one = zip_folder(tree(tmp_path / "a", HF), tmp_path / "one.zip")
    two = zip_folder(tree(tmp_path / "b", dict(reversed(list(HF.items())))),
                     tmp_path / "two.zip")
    assert one.read_bytes() == two.read_bytes()


def test_an_empty_folder_is_refused(tmp_path: Path) -> None:
    folder = tree(tmp_path / "empty", {".DS_Store": b"x"})
    with pytest.raises(DpsynthError) as info:
        prepare_upload(folder, workdir=tmp_path)
    assert info.value.code == ErrorCode.INVALID_DATASET
    assert [p.name for p in tmp_path.iterdir()] == ["empty"]  # no zip left behind
    assert folder_files(folder) == []


def test_labels_of_each_layout(tmp_path: Path) -> None:
    assert label_values(tree(tmp_path / "hf", HF)) == {"cat", "dog"}
    assert label_values(tree(tmp_path / "cls", {"root/a/1.png": b"1",
                                                "root/b/2.png": b"2"})) == {"a", "b"}
    meta = tree(tmp_path / "meta", {
        "metadata.csv": b"file_name,label\nimg/1.png,owl\nimg/2.png,bat\n",
        "img/1.png": b"1", "img/2.png": b"2"})
    assert label_values(meta) == {"owl", "bat"}
    jsonl = tree(tmp_path / "jsonl", {
        "train/metadata.jsonl": json.dumps({"file_name": "1.png", "kind": 3}).encode(),
        "train/1.png": b"1"})
    assert label_values(jsonl, label_column="kind") == {"3"}
    zipped = zip_folder(meta, tmp_path / "meta.zip")
    assert label_values(zipped) == {"owl", "bat"}
    assert label_values(tmp_path / "x.npz") is None


def test_unknown_labels_are_named_before_uploading(tmp_path: Path) -> None:
    classes = ["zebra", "ant", "owl", "cat", "bee", "dog", "eel", "fox"]
    folder = tree(tmp_path / "f", {f"{c}/1.png": b"1" for c in classes})
    with pytest.raises(DpsynthError) as info:
        check_labels(folder, ["cat", "dog"])
    err = info.value
    assert err.code == ErrorCode.INVALID_DATASET
    assert "6 label value(s) of f are not in --label-domain" in err.detail
    assert "'ant', 'bee', 'eel', 'fox', 'owl' and 1 more" in err.detail
    assert err.extensions == {"unknown_labels": ["ant", "bee", "eel", "fox", "owl"],
                              "unknown_label_count": 6}
    check_labels(folder, classes)  # all known: nothing to say
    check_labels(folder, None)  # no domain (public upload): the api decides
