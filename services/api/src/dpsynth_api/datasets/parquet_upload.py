"""Parquet uploads: a table of encoded images and labels (Hugging Face ``datasets`` writes
its image datasets so), with a subject-id column for a subject upload."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from dpsynth_shared.errors import DpsynthError, ErrorCode

from dpsynth_api.datasets.ingested import (
    DecodedSize,
    Ingested,
    IngestLimits,
    decode_checked,
    invalid,
    label_indices,
    parse_subjects,
    stack_images,
)
from dpsynth_api.inflation import Inflation, bomb

PARQUET_IMAGE, PARQUET_LABEL = "image", "label"
"""The columns of a Parquet upload: ``image`` (encoded image bytes, or a struct with a
``bytes`` field as Hugging Face ``datasets`` writes it) and ``label`` (integer index into
the label domain, or class name); a subject upload adds its ``subject_column``."""


def is_parquet(path: Path) -> bool:
    with path.open("rb") as fh:
        return fh.read(4) == b"PAR1"


def read_parquet(path: Path, *, private: bool, label_domain: list[str] | None,
                  limits: IngestLimits, subject_column: str | None = None) -> Ingested:
    """A Parquet table of encoded images, labels and (subject unit) subject ids.

    The footer is checked before any data page is read: at most ``max_members`` rows and
    at most the upload's allowance (inflation.py) of uncompressed column data (a
    decompression bomb is refused unread). Images are decoded like an image folder's;
    errors name a row only for public uploads.

    Raises:
        DpsynthError: 422 ``invalid_archive`` (not Parquet), ``unsafe_archive`` (caps),
            ``invalid_image`` or ``invalid_dataset``.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
        footer = parquet.metadata
        names = list(parquet.schema_arrow.names)
    except (pa.ArrowException, OSError) as exc:
        raise DpsynthError(ErrorCode.INVALID_ARCHIVE, "the Parquet file is corrupt") from exc
    if footer.num_rows > limits.archive.max_members:
        raise DpsynthError(ErrorCode.UNSAFE_ARCHIVE, f"the Parquet file has more than "
                           f"{limits.archive.max_members} rows", limit=limits.archive.max_members)
    meter = Inflation(limits.archive, path.stat().st_size)
    if sum(footer.row_group(i).total_byte_size for i in range(footer.num_row_groups)) > meter.cap:
        raise bomb(limits.archive, meter.compressed_bytes, what="the Parquet file")
    missing = sorted({PARQUET_IMAGE, PARQUET_LABEL} - set(names))
    if missing:
        raise invalid(f"the Parquet file lacks the column(s) {missing}")
    if subject_column is not None and subject_column not in names:
        raise invalid(f"privacy_unit 'subject': the Parquet file lacks the subject-id column "
                       f"{subject_column!r} (set subject_column to its name)")
    if subject_column is None and "subjects" in names:
        raise invalid("the Parquet file has a 'subjects' column (subject ids: declare "
                       "privacy_unit 'subject')")
    columns = [PARQUET_IMAGE, PARQUET_LABEL, *([subject_column] if subject_column else [])]
    try:
        table = parquet.read(columns=columns)
    except (pa.ArrowException, OSError) as exc:
        raise DpsynthError(ErrorCode.INVALID_ARCHIVE, "the Parquet file is corrupt") from exc
    n = table.num_rows
    if n == 0:
        raise invalid("the Parquet file has no rows")
    decoded = DecodedSize(limits)
    images = [decoded.add(decode_checked(data, limits, where="a row" if private else f"row {i}",
                                  private=private))
              for i, data in enumerate(_parquet_image_bytes(table.column(PARQUET_IMAGE)))]
    labels = _parquet_values(table.column(PARQUET_LABEL), "label")
    ints, class_names = label_indices(labels, n, label_domain, private=private,
                                    max_classes=limits.max_classes)
    subjects, subject_ids = None, None
    if subject_column is not None:
        subjects, subject_ids = parse_subjects(
            _parquet_values(table.column(subject_column), "subject id"), n)
    return Ingested(stack_images(images, private=private), ints, class_names, "parquet",
                    subjects=subjects, subject_ids=subject_ids)


def _parquet_image_bytes(column: Any) -> list[bytes]:
    """The encoded bytes of each row's image (binary, or a struct's ``bytes`` field)."""
    import pyarrow as pa

    kind = column.type
    if pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0:
        column = pa.chunked_array([chunk.field("bytes") for chunk in column.chunks],
                                  type=kind.field("bytes").type)
        kind = column.type
    if not (pa.types.is_binary(kind) or pa.types.is_large_binary(kind)):
        raise invalid("the Parquet column 'image' must hold encoded image bytes (binary, "
                       "or a struct with a 'bytes' field)")
    if column.null_count:
        raise invalid(f"{column.null_count} row(s) have no image")
    return [bytes(v) for v in column.to_pylist()]


def _parquet_values(column: Any, what: str) -> np.ndarray:
    """An integer or string column as a numpy array; nulls refused by count."""
    import pyarrow as pa

    if column.null_count:
        raise invalid(f"{column.null_count} row(s) have no {what}")
    kind = column.type
    if pa.types.is_integer(kind):
        return np.asarray(column.to_numpy(), dtype=np.int64)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return np.asarray(column.to_pylist(), dtype=str)
    raise invalid(f"the Parquet {what} column must hold integers or strings")

