"""Subject datasets at ingest: subject ids parsed (npz array, image-folder subjects.csv),
remapped to dense indices, refused when missing; the unit's N̂, delta, class sizes and label
disjointness (datasets/units.py). No error names a subject id or a file of the upload."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dpsynth_api.archives import ArchiveLimits
from dpsynth_api.datasets import units
from dpsynth_api.datasets.ingest import Ingested, IngestLimits, ingest_upload, write_canonical
from dpsynth_api.datasets.schemas import DatasetMetadata
from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.ledger_contract import PrivacyUnit

from tests.unit.api import builders as b

LIMITS = IngestLimits(ArchiveLimits(max_uncompressed_bytes=5 * 1024 * 1024, max_members=1000),
                      max_image_pixels=1024 * 1024)
# Raw ids and file names that must never appear in an error.
SECRET_IDS = ["patient-7731", "patient-0042", "zz-secret"]


def _ingest(tmp_path: Path, data: bytes, name: str = "upload.zip", *,
            column: str | None = "subjects", domain: list[str] | None = None) -> Ingested:
    path = tmp_path / "upload"
    path.write_bytes(data)
    return ingest_upload(path, name, private=True, label_domain=domain, limits=LIMITS,
                         subject_column=column)


def _refused(tmp_path: Path, data: bytes, name: str = "upload.zip", *,
             secrets: list[str] | tuple[str, ...] = (), **kw: object) -> DpsynthError:
    with pytest.raises(DpsynthError) as info:
        _ingest(tmp_path, data, name, **kw)  # type: ignore[arg-type]
    _assert_names_nothing(info.value, [*SECRET_IDS, *secrets])
    return info.value


def _assert_names_nothing(exc: DpsynthError, secrets: list[str]) -> None:
    text = json.dumps(exc.to_problem().model_dump(mode="json")) + str(exc)
    for secret in secrets:
        assert secret not in text, f"the error names {secret!r}: {text}"


def _meta(**fields: object) -> DatasetMetadata:
    base: dict[str, object] = dict(name="s", visibility="private", epsilon_limit=4.0,
                                   label_domain=["a", "b"], privacy_unit="subject")
    base.update(fields)
    return DatasetMetadata.model_validate(base)


def _npz(subjects: np.ndarray, labels: list[int], *, key: str = "subjects") -> bytes:
    images = np.zeros((len(labels), 8, 8), dtype=np.uint8)
    return b.npz_bytes(images=images, labels=np.asarray(labels, dtype=np.int64),
                       **{key: subjects})


# -- npz ----------------------------------------------------------------------------------

def test_npz_string_ids_are_remapped_to_dense_indices(tmp_path: Path) -> None:
    raw = np.array(["patient-7731", "patient-0042", "patient-7731", "zz-secret"])
    data = _ingest(tmp_path, _npz(raw, [0, 1, 0, 1]), "u.npz", domain=["a", "b"])
    assert data.subjects is not None and data.subjects.dtype == np.int64
    assert sorted(set(data.subjects.tolist())) == [0, 1, 2]
    assert data.subjects[0] == data.subjects[2] != data.subjects[1]
    assert data.subject_count == 3 and data.unit_count == 3 and data.size == 4
    assert data.class_counts() == {"a": 1, "b": 2}  # subjects per class, not images
    out = write_canonical(data, tmp_path / "c.npz")
    with np.load(out, allow_pickle=False) as npz:
        assert npz["subjects"].tolist() == data.subjects.tolist()
        everything = b"".join(np.asarray(npz[k]).tobytes() for k in npz.files)
    assert not any(s.encode() in everything or s.encode("utf-32-le") in everything
                   for s in SECRET_IDS)  # the raw ids never reach the canonical file


def test_npz_integer_ids_in_a_named_column(tmp_path: Path) -> None:
    raw = np.array([905, 17, 905, 905, 3])
    data = _ingest(tmp_path, _npz(raw, [0, 0, 1, 0, 1], key="patient"), "u.npz",
                   column="patient", domain=["a", "b"])
    assert data.subjects is not None
    assert data.subjects.tolist() == [2, 1, 2, 2, 0]
    assert data.class_counts() == {"a": 2, "b": 2}


def test_npz_subject_errors_name_no_id(tmp_path: Path) -> None:
    missing = _refused(tmp_path, _npz(np.array(["patient-7731"] * 2), [0, 1], key="other"),
                       "u.npz", column="patient")
    assert missing.code == ErrorCode.INVALID_DATASET and "patient" in missing.detail
    empty = _refused(tmp_path, _npz(np.array(["patient-7731", " "]), [0, 1]), "u.npz")
    assert "1 image(s) have an empty subject id" in empty.detail
    short = _refused(tmp_path, _npz(np.array(["zz-secret"]), [0, 1]), "u.npz")
    assert "length 2" in short.detail
    floats = _refused(tmp_path, _npz(np.array([1.5, 2.5]), [0, 1]), "u.npz")
    assert "integers or strings" in floats.detail
    clash = _refused(tmp_path, _npz(np.array([1, 2]), [0, 1]), "u.npz", column="labels")
    assert "other than" in clash.detail


def test_an_image_unit_npz_with_subject_ids_is_refused_with_a_hint(tmp_path: Path) -> None:
    err = _refused(tmp_path, _npz(np.array(["patient-0042"] * 2), [0, 1]), "u.npz",
                   column=None)
    assert "declare privacy_unit 'subject'" in err.detail


# -- Parquet ------------------------------------------------------------------------------

def _parquet(subjects: list[Any] | None, labels: list[Any], *, column: str = "subjects",
             struct_images: bool = False) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    encoded = [b.png(value=10 * i) for i in range(len(labels))]
    image: Any = ([{"bytes": e, "path": f"secret-{i}.png"} for i, e in enumerate(encoded)]
                  if struct_images else encoded)
    columns: dict[str, Any] = {"image": image, "label": labels}
    if subjects is not None:
        columns[column] = subjects
    sink = io.BytesIO()
    pq.write_table(pa.table(columns), sink)
    return sink.getvalue()


def test_parquet_subject_column_is_parsed_and_remapped(tmp_path: Path) -> None:
    data = _ingest(tmp_path, _parquet(["patient-7731", "zz-secret", "patient-7731"],
                                      ["b", "a", "b"], struct_images=True), "u.parquet",
                   domain=["a", "b"])
    assert data.source_format == "parquet" and data.images.shape == (3, 8, 8, 1)
    assert data.labels.tolist() == [1, 0, 1]
    assert data.subjects is not None and data.subject_count == 2
    assert data.subjects[0] == data.subjects[2] != data.subjects[1]
    named = _ingest(tmp_path, _parquet([4, 4, 9], [0, 1, 1], column="patient"), "u.parquet",
                    column="patient", domain=["a", "b"])
    assert named.subjects is not None and named.subjects.tolist() == [0, 0, 1]
    assert not units.partitions_disjoint(named.labels, named.subjects)


def test_parquet_is_recognised_by_its_magic_and_image_unit_works(tmp_path: Path) -> None:
    data = _ingest(tmp_path, _parquet(None, [0, 1]), "upload", column=None, domain=["a", "b"])
    assert data.subjects is None and data.class_counts() == {"a": 1, "b": 1}


def test_parquet_subject_errors_name_no_id(tmp_path: Path) -> None:
    missing = _refused(tmp_path, _parquet(["patient-7731", "zz-secret"], [0, 1], column="who"),
                       "u.parquet", column="patient")
    assert "lacks the subject-id column 'patient'" in missing.detail
    nulls = _refused(tmp_path, _parquet(["patient-7731", None], [0, 1]), "u.parquet")
    assert "1 row(s) have no subject id" in nulls.detail
    hint = _refused(tmp_path, _parquet(["patient-7731", "x"], [0, 1]), "u.parquet",
                    column=None)
    assert "declare privacy_unit 'subject'" in hint.detail
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(pa.table({"image": [{"bytes": b"junk", "path": "secret-0.png"}],
                             "label": [0], "subjects": ["zz-secret"]}), sink)
    bad_image = _refused(tmp_path, sink.getvalue(), "u.parquet", secrets=["secret-0"])
    assert bad_image.code == ErrorCode.INVALID_IMAGE
    corrupt = _refused(tmp_path, b"PAR1 not really parquet PAR1", "u.parquet")
    assert corrupt.code == ErrorCode.INVALID_ARCHIVE


def test_parquet_row_and_size_caps_are_checked_before_reading(tmp_path: Path) -> None:
    small = IngestLimits(ArchiveLimits(max_uncompressed_bytes=10**7, max_members=2),
                         max_image_pixels=1024 * 1024)
    path = tmp_path / "u.parquet"
    path.write_bytes(_parquet(["a", "b", "c"], [0, 1, 1]))
    with pytest.raises(DpsynthError) as info:
        ingest_upload(path, "u.parquet", private=True, label_domain=["a", "b"], limits=small,
                      subject_column="subjects")
    assert info.value.code == ErrorCode.UNSAFE_ARCHIVE


# -- image folders ------------------------------------------------------------------------

def _folder(rows: dict[str, str], *, root: str = "", extra_csv: str = "") -> bytes:
    members = b.image_folder({"a": 2, "b": 2}, root=root)
    lines = "\n".join(f"{path},{subject}" for path, subject in rows.items())
    members[f"{root}subjects.csv"] = f"path,subject\n{lines}\n{extra_csv}".encode()
    return b.zip_bytes(members)


FOLDER_ROWS = {"a/0.png": "patient-7731", "a/1.png": "patient-7731",
               "b/0.png": "patient-0042", "b/1.png": "zz-secret"}


@pytest.mark.parametrize("root", ["", "data/"])
def test_folder_subjects_csv_at_the_root(tmp_path: Path, root: str) -> None:
    data = _ingest(tmp_path, _folder(FOLDER_ROWS, root=root), domain=["a", "b"])
    assert data.size == 4 and data.subject_count == 3
    assert data.subjects is not None
    by_path = dict(zip(["a/0.png", "a/1.png", "b/0.png", "b/1.png"],
                       data.subjects.tolist(), strict=True))
    assert by_path["a/0.png"] == by_path["a/1.png"]
    assert len({by_path["a/0.png"], by_path["b/0.png"], by_path["b/1.png"]}) == 3
    assert units.partitions_disjoint(data.labels, data.subjects)


def test_folder_paths_may_name_the_archive_member(tmp_path: Path) -> None:
    rows = {f"data/{p}": s for p, s in FOLDER_ROWS.items()}
    data = _ingest(tmp_path, _folder(rows, root="data/"), domain=["a", "b"])
    assert data.subject_count == 3


def test_folder_image_without_subject_is_refused_by_count(tmp_path: Path) -> None:
    rows = dict(FOLDER_ROWS)
    del rows["b/1.png"]
    err = _refused(tmp_path, _folder(rows), secrets=["b/1.png", "1.png"], domain=["a", "b"])
    assert "1 image(s) have no line in subjects.csv" in err.detail


def test_folder_csv_listing_an_unknown_path_is_refused_by_count(tmp_path: Path) -> None:
    err = _refused(tmp_path, _folder(FOLDER_ROWS, extra_csv="a/secret-name.png,zz-secret\n"),
                   secrets=["secret-name"], domain=["a", "b"])
    assert "lists 1 path(s)" in err.detail


def test_folder_csv_errors(tmp_path: Path) -> None:
    twice = _refused(tmp_path, _folder(FOLDER_ROWS, extra_csv="a/0.png,patient-0042\n"),
                     domain=["a", "b"])
    assert "listed twice" in twice.detail
    blank = _refused(tmp_path, _folder(FOLDER_ROWS, extra_csv="a/0.png,\n"), domain=["a", "b"])
    assert "lack a path or a subject" in blank.detail
    members = b.image_folder({"a": 1})
    members["subjects.csv"] = b"file,who\na/0.png,patient-7731\n"
    header = _refused(tmp_path, b.zip_bytes(members))
    assert "'path' and 'subject'" in header.detail
    none = _refused(tmp_path, b.zip_bytes(b.image_folder({"a": 1})))
    assert "needs a subjects.csv" in none.detail


def test_a_subject_in_two_classes_makes_partitions_overlap(tmp_path: Path) -> None:
    rows = dict(FOLDER_ROWS, **{"b/0.png": "patient-7731"})  # 7731 in a and b
    data = _ingest(tmp_path, _folder(rows), domain=["a", "b"])
    assert data.subjects is not None
    assert not units.partitions_disjoint(data.labels, data.subjects)
    assert data.class_counts() == {"a": 1, "b": 2}
    terms = units.resolve_units(_meta(declared_size=3), data)
    assert terms.partitions_disjoint is False
    assert terms.budget_fields() == {"privacy_unit": PrivacyUnit.SUBJECT,
                                     "partitions_disjoint": False}


# -- units: N̂, delta, class sizes in subjects --------------------------------------------

def _subject_data(tmp_path: Path) -> Ingested:
    # 6 images, 3 subjects: s0 (3 images, a), s1 (2 images, b), s2 (1 image, b)
    raw = np.array(["x", "x", "x", "y", "y", "z"])
    return _ingest(tmp_path, _npz(raw, [0, 0, 0, 1, 1, 1]), "u.npz", domain=["a", "b"])


def _units_error(meta: DatasetMetadata, data: Ingested) -> DpsynthError:
    with pytest.raises(DpsynthError) as info:
        units.resolve_units(meta, data)
    assert info.value.code == ErrorCode.INVALID_DATASET
    return info.value


def test_declared_size_and_delta_count_subjects(tmp_path: Path) -> None:
    data = _subject_data(tmp_path)
    terms = units.resolve_units(_meta(declared_size=3, partitions_disjoint=True), data)
    assert (terms.privacy_unit, terms.unit_count, terms.subject_count) == (
        PrivacyUnit.SUBJECT, 3, 3)
    assert terms.declared_size == 3  # N̂ counts subjects, not images
    assert terms.delta == units.default_delta(3)
    assert terms.partitions_disjoint is True
    assert terms.row_fields() == {"privacy_unit": "subject", "subject_count": 3,
                                  "partitions_disjoint": True,
                                  "declared_size_source": "declared"}
    assert units.resolve_units(_meta(declared_size=5), data).declared_size == 5
    assert "number of subjects" in _units_error(_meta(declared_size=2), data).detail
    # delta < 1/N̂ with N̂ = 3 subjects (not 6 images)
    wide = _units_error(_meta(declared_size=3, delta=0.34), data)
    assert "1/N̂" in wide.detail and "subjects" in wide.detail
    assert units.resolve_units(_meta(declared_size=3, delta=0.3), data).delta == 0.3


def test_class_sizes_count_subjects(tmp_path: Path) -> None:
    data = _subject_data(tmp_path)
    # a: 1 subject (3 images); b: 2 subjects (3 images)
    ok = units.resolve_units(_meta(declared_size=3, class_sizes={"a": 1, "b": 2}), data)
    assert ok.declared_size == 3
    err = _units_error(_meta(declared_size=3, class_sizes={"a": 1, "b": 1}), data)
    assert err.extensions["classes"] == ["b"] and "subjects" in err.detail
    big = _units_error(_meta(declared_size=3, class_sizes={"a": 4, "b": 2}), data)
    assert big.extensions["classes"] == ["a"]


def test_metadata_unit_and_column_must_agree() -> None:
    assert units.subject_column_for(_meta()) == "subjects"
    assert units.subject_column_for(_meta(subject_column="patient")) == "patient"
    assert units.subject_column_for(_meta(privacy_unit="image")) is None
    with pytest.raises(DpsynthError, match="only with privacy_unit 'subject'"):
        units.subject_column_for(_meta(privacy_unit="image", subject_column="patient"))
    public = DatasetMetadata(name="p", visibility="public", privacy_unit=PrivacyUnit.SUBJECT)
    with pytest.raises(DpsynthError, match="private datasets only"):
        units.subject_column_for(public)


def test_image_unit_terms_are_unchanged(tmp_path: Path) -> None:
    data = _ingest(tmp_path, b.zip_bytes(b.image_folder({"a": 3, "b": 1})), column=None,
                   domain=["a", "b"])
    terms = units.resolve_units(_meta(privacy_unit="image", declared_size=4), data)
    assert (terms.privacy_unit, terms.declared_size, terms.subject_count,
            terms.partitions_disjoint) == (PrivacyUnit.IMAGE, 4, None, True)
    with pytest.raises(DpsynthError, match="needs a subject id"):
        units.resolve_units(_meta(declared_size=4), data)
