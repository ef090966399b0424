"""The accepted upload layouts (issue 15, item 5) without a database: Hugging Face split
folders (``test/`` as the owner's held-out part), ``metadata.csv`` / ``metadata.jsonl`` label
files, the accepted-formats sentence of a wrong file type, and unknown classes named (public
uploads) or counted (private ones)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from dpsynth_api.archives import ArchiveLimits
from dpsynth_api.datasets import holdout
from dpsynth_api.datasets.duplicates import resolve_duplicates
from dpsynth_api.datasets.ingest import Ingested, IngestLimits, LayoutOptions, ingest_upload
from dpsynth_api.datasets.schemas import DatasetMetadata
from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.upload_formats import (
    UPLOAD_FORMATS,
    accepted_sentence,
    format_of,
    suffix_of,
    unsupported_format,
)
from PIL import Image
from pydantic import ValidationError

from tests.unit.api import builders as b

LIMITS = IngestLimits(ArchiveLimits(max_uncompressed_bytes=5 * 1024 * 1024, max_members=1000),
                      max_image_pixels=1024 * 1024)


def png(code: int) -> bytes:
    """An 8x8 grayscale PNG whose pixels encode ``code`` (distinct codes: distinct records)."""
    pixels = np.zeros((8, 8), dtype=np.uint8)
    pixels.flat[:4] = np.frombuffer(code.to_bytes(4, "big"), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels, mode="L").save(buf, format="PNG")
    return buf.getvalue()


def split_folders(splits: dict[str, dict[str, int]], root: str = "") -> dict[str, bytes]:
    """``{root}{split}/{label}/{i}.png`` members, every image distinct."""
    members, code = {}, 0
    for split, classes in splits.items():
        for label, n in classes.items():
            for i in range(n):
                code += 1
                members[f"{root}{split}/{label}/{i}.png"] = png(code)
    return members


def ingest(tmp_path: Path, members: dict[str, bytes] | bytes, name: str = "u.zip", *,
           private: bool = False, domain: list[str] | None = None,
           holdout_from: str | None = None, label_column: str | None = None) -> Ingested:
    path = tmp_path / "upload"
    path.write_bytes(members if isinstance(members, bytes) else b.zip_bytes(members))
    return ingest_upload(path, name, private=private, label_domain=domain, limits=LIMITS,
                         layout=LayoutOptions(holdout_from=holdout_from,
                                              label_column=label_column))


def error(tmp_path: Path, members: dict[str, bytes] | bytes, name: str = "u.zip",
          **kw: object) -> DpsynthError:
    with pytest.raises(DpsynthError) as info:
        ingest(tmp_path, members, name, **kw)  # type: ignore[arg-type]
    return info.value


# -- Hugging Face split folders -----------------------------------------------------------

def test_train_and_test_folders_with_holdout_from_test_mark_the_test_images(
        tmp_path: Path) -> None:
    members = split_folders({"train": {"cat": 3, "dog": 2}, "test": {"cat": 1, "dog": 1}},
                            root="pets/")
    data = ingest(tmp_path, members, holdout_from="test")
    assert data.class_names == ["cat", "dog"] and data.size == 7
    assert data.held is not None
    assert data.held.tolist() == [False] * 5 + [True] * 2  # archive order
    assert data.labels.tolist() == [0, 0, 0, 1, 1, 0, 1]
    split = holdout.split_for_upload(data, DatasetMetadata(name="p", visibility="public",
                                                           holdout_from="test"),
                                     hashes=[], subjects=None)
    assert split is not None and split.rule == holdout.FOLDER_RULE
    assert split.key_source is None
    assert split.train.size == 5 and split.holdout.size == 2
    assert split.holdout.labels.tolist() == [0, 1] and split.holdout.held is None


def test_train_and_test_without_holdout_from_are_refused_naming_the_option(
        tmp_path: Path) -> None:
    members = split_folders({"train": {"cat": 2}, "test": {"cat": 1}})
    err = error(tmp_path, members)
    assert err.code == ErrorCode.INVALID_DATASET
    assert "holdout_from 'test'" in err.detail and "train/, test/" in err.detail
    assert err.extensions["split_folders"] == ["test", "train"]


def test_a_train_folder_alone_is_the_dataset(tmp_path: Path) -> None:
    data = ingest(tmp_path, split_folders({"train": {"cat": 2, "dog": 2}}))
    assert data.class_names == ["cat", "dog"] and data.size == 4 and data.held is None


def test_validation_is_held_out_and_train_is_trained_on(tmp_path: Path) -> None:
    members = split_folders({"train": {"a": 2}, "validation": {"a": 1, "b": 1}})
    data = ingest(tmp_path, members, holdout_from="validation")
    assert data.held is not None and data.held.tolist() == [False, False, True, True]


@pytest.mark.parametrize(("splits", "holdout_from", "words"), [
    ({"train": {"a": 2}}, "test", "no test/ folder"),
    ({"train": {"a": 2}, "validation": {"a": 1}, "test": {"a": 1}}, "validation",
     "would train on the test/ folder"),
])
def test_holdout_from_must_name_a_present_split_and_never_trains_on_test(
        tmp_path: Path, splits: dict[str, dict[str, int]], holdout_from: str,
        words: str) -> None:
    err = error(tmp_path, split_folders(splits), holdout_from=holdout_from)
    assert err.code == ErrorCode.INVALID_DATASET and words in err.detail


def test_holdout_from_needs_split_folders_and_an_image_folder(tmp_path: Path) -> None:
    err = error(tmp_path, b.image_folder({"a": 2, "b": 2}), holdout_from="test")
    assert "needs split folders" in err.detail and "holdout_fraction" in err.detail
    err = error(tmp_path, b.digits_npz(6, k=2), "d.npz", holdout_from="test")
    assert err.code == ErrorCode.INVALID_DATASET and "not to an .npz file" in err.detail


def test_split_files_outside_a_class_folder_are_counted(tmp_path: Path) -> None:
    members = {**split_folders({"train": {"a": 2}}), "test/loose.png": png(99)}
    err = error(tmp_path, members, holdout_from="test")
    assert "1 file(s) of the split folders" in err.detail
    assert "<split>/<class>/<image>" in err.detail


# -- metadata.csv / metadata.jsonl ---------------------------------------------------------

def test_metadata_csv_labels_nested_file_names_and_ignores_other_columns(
        tmp_path: Path) -> None:
    rows = "file_name,label,caption\nimg/x/1.png,cat,a cat\n./img/y/2.png,dog,a dog\n" \
           "img/3.png,cat,another\n"
    members = {"metadata.csv": rows.encode(), "img/x/1.png": png(1), "img/y/2.png": png(2),
               "img/3.png": png(3), ".DS_Store": b"junk", "README.md": b"# pets"}
    data = ingest(tmp_path, members)
    assert data.class_names == ["cat", "dog"]
    assert data.labels.tolist() == [0, 1, 0]


def test_metadata_jsonl_per_split_folder_with_a_named_label_column(tmp_path: Path) -> None:
    def jsonl(rows: list[dict[str, object]]) -> bytes:
        return "\n".join(json.dumps(r) for r in rows).encode()

    members = {
        "train/metadata.jsonl": jsonl([{"file_name": "a.png", "species": "owl"},
                                       {"file_name": "sub/b.png", "species": 3}]),
        "train/a.png": png(1), "train/sub/b.png": png(2),
        "test/metadata.jsonl": jsonl([{"file_name": "c.png", "species": "owl"}]),
        "test/c.png": png(3),
    }
    data = ingest(tmp_path, members, holdout_from="test", label_column="species")
    assert data.class_names == ["3", "owl"]
    assert data.labels.tolist() == [1, 0, 1] and data.held is not None
    assert data.held.tolist() == [False, False, True]
    err = error(tmp_path, members, holdout_from="test")  # the column is 'label' by default
    assert "lacks 'label'" in err.detail and "label_column" in err.detail


def test_a_bad_metadata_row_is_counted_and_named_by_line_for_public_data_only(
        tmp_path: Path) -> None:
    rows = b"file_name,label\n1.png,cat\n2.png,\n"
    members = {"metadata.csv": rows, "1.png": png(1), "2.png": png(2)}
    public = error(tmp_path, members)
    assert public.code == ErrorCode.INVALID_DATASET
    assert "1 row(s) lack a file_name or a label" in public.detail and "line 3" in public.detail
    private = error(tmp_path, members, private=True, domain=["cat"])
    assert "1 row(s)" in private.detail and "line" not in private.detail


def test_an_image_missing_from_metadata_and_a_row_without_image_are_counted(
        tmp_path: Path) -> None:
    members = {"metadata.csv": b"file_name,label\n1.png,cat\nghost.png,dog\n",
               "1.png": png(1), "secret-patient.png": png(2)}
    err = error(tmp_path, members, private=True, domain=["cat", "dog"])
    assert "1 image(s) have no row" in err.detail
    assert "1 row(s) name a file that is no image" in err.detail
    assert "secret" not in err.detail and "ghost" not in err.detail
    assert err.extensions["images_without_row"] == 1


def test_metadata_paths_cannot_leave_their_folder(tmp_path: Path) -> None:
    members = {"train/metadata.csv": b"file_name,label\n../x.png,cat\n/etc/passwd,cat\n",
               "train/a.png": png(1)}
    err = error(tmp_path, members)
    assert "2 row(s) name a path outside the metadata file's folder" in err.detail


def test_label_column_without_a_metadata_file_is_refused(tmp_path: Path) -> None:
    err = error(tmp_path, b.image_folder({"a": 2}), label_column="species")
    assert "label_column" in err.detail and "metadata.csv" in err.detail


# -- unknown classes -----------------------------------------------------------------------

def test_unknown_classes_are_named_sorted_for_a_public_upload(tmp_path: Path) -> None:
    classes = {name: 1 for name in ["zebra", "ant", "owl", "cat", "bee", "dog", "eel", "fox"]}
    err = error(tmp_path, b.image_folder(classes), domain=["cat", "dog"])
    assert err.code == ErrorCode.INVALID_DATASET
    assert "6 label value(s)" in err.detail and "label_domain" in err.detail
    assert "'ant', 'bee', 'eel', 'fox', 'owl' and 1 more" in err.detail
    assert err.extensions["unknown_labels"] == ["ant", "bee", "eel", "fox", "owl"]
    assert err.extensions["unknown_label_count"] == 6


def test_unknown_classes_of_a_private_upload_are_counted_not_named(tmp_path: Path) -> None:
    members = {"metadata.csv": b"file_name,label\n1.png,patient-smith\n2.png,cat\n",
               "1.png": png(1), "2.png": png(2)}
    err = error(tmp_path, members, private=True, domain=["cat"])
    assert "1 label value(s)" in err.detail and "smith" not in err.detail
    assert "unknown_labels" not in err.extensions and err.extensions["unknown_label_count"] == 1
    npz = b.npz_bytes(images=np.zeros((4, 8, 8), np.uint8), labels=np.asarray([0, 1, 7, 9]))
    public = error(tmp_path, npz, "d.npz", domain=["a", "b"])
    assert "the value(s) 7, 9" in public.detail
    private = error(tmp_path, npz, "d.npz", domain=["a", "b"], private=True)
    assert "2 label(s)" in private.detail and "7" not in private.detail


# -- declared split: duplicates and subjects -------------------------------------------------

def test_one_image_in_train_and_in_test_is_refused_even_when_deduplicating(
        tmp_path: Path) -> None:
    members = {"train/a/1.png": png(1), "train/a/2.png": png(2), "test/a/1.png": png(1)}
    data = ingest(tmp_path, members, private=True, domain=["a"], holdout_from="test")
    with pytest.raises(DpsynthError) as info:
        resolve_duplicates(data, on_duplicate="deduplicate", private=True)
    assert info.value.code == ErrorCode.DUPLICATE_RECORDS
    assert "split folder" in info.value.detail


def test_a_subject_on_both_sides_of_the_folders_is_refused() -> None:
    images = np.stack([np.full((2, 2, 1), i, np.uint8) for i in range(4)])
    data = Ingested(images, np.zeros(4, np.int64), ["a"], "zip",
                    subjects=np.asarray([0, 0, 1, 1]), held=np.asarray([False, True, True, True]))
    with pytest.raises(DpsynthError, match="1 subject"):
        holdout.declared_split(data)
    data.held = np.asarray([False, False, True, True])
    split = holdout.declared_split(data)
    assert split.unit_held.tolist() == [False, True] and split.holdout_units == 1


def test_holdout_from_and_holdout_fraction_are_exclusive() -> None:
    with pytest.raises(ValidationError, match="not both"):
        DatasetMetadata(name="x", visibility="public", holdout_from="test",
                        holdout_fraction=0.2)


# -- accepted formats ------------------------------------------------------------------------

def test_a_wrong_file_type_names_every_accepted_format(tmp_path: Path) -> None:
    err = error(tmp_path, png(1), "scan.png")
    assert err.code == ErrorCode.INVALID_ARCHIVE
    assert err.detail.startswith("a .png file is not an accepted dataset upload")
    assert err.detail.endswith(accepted_sentence())
    for fmt in UPLOAD_FORMATS:
        for suffix in fmt.suffixes:
            assert suffix in err.detail
    assert err.extensions["accepted_formats"][0] == ".zip"
    corrupt = error(tmp_path, b"PK\x03\x04 not really", "d.zip")
    assert corrupt.code == ErrorCode.INVALID_ARCHIVE
    assert "not a readable .zip file" in corrupt.detail


def test_suffixes_and_the_sentence() -> None:
    assert suffix_of("a/B.TAR.GZ") == ".tar.gz" and suffix_of("x.npz") == ".npz"
    assert suffix_of("noext") == "" and suffix_of(".zip") == ""  # a hidden file, no suffix
    assert format_of("d.parquet") is not None and format_of("d.csv") is None
    sentence = accepted_sentence()
    assert sentence.startswith("accepted: .zip (image folders: <label>/<image>, Hugging Face "
                               "train/<label>/<image>")
    assert "metadata.csv/metadata.jsonl" in sentence and ".parquet (" in sentence
    assert "folder" in accepted_sentence(folders=True).rsplit(";", 1)[1]
    weird = unsupported_format("x.\x1b[31m")
    assert "\x1b" not in weird.detail
