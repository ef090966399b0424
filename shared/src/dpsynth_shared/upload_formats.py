"""The one list of the dataset upload formats the platform accepts (issue 15, items 3 and 5).

The api names them when it cannot read an upload, the CLI checks a file against them before
sending a byte, and README.md / docs/datasets.md describe the same list, so the three never
drift. The format of an upload is decided by its content at the api (a zip is a zip whatever
its name); the suffix is what the CLI can check before uploading, and what the api's message
names.

Image-folder archives (zip, or tar plain or compressed) hold one of three layouts, detected
from the member names (``dpsynth_api.datasets.folders``):

* ``<label>/<image>`` (one folder per class, optionally under one top folder);
* Hugging Face ``imagefolder`` splits: ``train/<label>/<image>``, ``test/<label>/<image>``,
  ``validation/<label>/<image>``; the upload option ``holdout_from`` (CLI
  ``--holdout-from test``) makes one split the held-out part;
* images with a ``metadata.csv`` or ``metadata.jsonl`` (Hugging Face: a ``file_name``
  column, relative to the metadata file's folder, and a label column, ``label`` unless the
  upload's ``label_column`` names another), optionally inside the split folders.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpsynth_shared.errors import DpsynthError, ErrorCode

__all__ = ["UNSUPPORTED_FORMAT_CODE", "UPLOAD_FORMATS", "UploadFormat", "accepted_sentence",
           "format_of", "suffix_of", "unsupported_format"]

IMAGE_FOLDER_LAYOUTS = ("image folders: <label>/<image>, Hugging Face train/<label>/<image> "
                        "(+ test/<label>/… as the held-out part), or images with "
                        "metadata.csv/metadata.jsonl (file_name, label)")


@dataclass(frozen=True)
class UploadFormat:
    """One accepted kind of upload file.

    Attributes:
        suffixes: the file-name endings of the kind, lower case, the first one preferred.
        layout: what the file holds, as a short noun (``image folders``, ``arrays``, ``table``).
        description: one line: the layout(s) inside the file.
    """

    suffixes: tuple[str, ...]
    layout: str
    description: str


UPLOAD_FORMATS: tuple[UploadFormat, ...] = (
    UploadFormat((".zip",), "image folders", IMAGE_FOLDER_LAYOUTS),
    UploadFormat((".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz"), "image folders",
                 "the same layouts as .zip"),
    UploadFormat((".npz",), "arrays", "arrays images uint8 [N,H,W(,C)] and labels [N], "
                 "optionally class_names [K]"),
    UploadFormat((".parquet",), "table", "columns image (encoded bytes) and label"),
)
"""Every accepted upload format, in the order the accepted-formats sentence names them."""

UNSUPPORTED_FORMAT_CODE = ErrorCode.INVALID_ARCHIVE
"""The code of an upload that is no accepted format (the api's and the CLI's)."""

_MAX_SHOWN_SUFFIX = 12


def suffix_of(filename: str) -> str:
    """The file's format suffix, lower case: ``.tar.gz`` for ``a.TAR.GZ``, ``""`` for none.

    Only the last path component counts (``a.zip/b`` has no suffix).
    """
    base = filename.replace("\\", "/").rsplit("/", 1)[-1].lower()
    for fmt in UPLOAD_FORMATS:
        for suffix in fmt.suffixes:
            if base.endswith(suffix) and len(base) > len(suffix):
                return suffix
    dot = base.rfind(".")
    return base[dot:] if 0 < dot < len(base) - 1 else ""


def format_of(filename: str) -> UploadFormat | None:
    """The accepted format a file name's suffix selects, or None."""
    suffix = suffix_of(filename)
    return next((f for f in UPLOAD_FORMATS if suffix in f.suffixes), None)


def accepted_sentence(*, folders: bool = False) -> str:
    """The human sentence naming every accepted format, e.g. ``accepted: .zip (image
    folders: <label>/<image>, …), …, .parquet (columns image (encoded bytes) and label)``.

    Args:
        folders: add that a folder is accepted too (the CLI zips it before uploading).
    """
    parts = [f"{'/'.join(f.suffixes)} ({f.description})" for f in UPLOAD_FORMATS]
    text = "accepted: " + ", ".join(parts)
    if folders:
        text += "; or a folder in one of the image-folder layouts (zipped before uploading)"
    return text


def unsupported_format(filename: str | None, *, readable_suffix: bool = False,
                       folders: bool = False) -> DpsynthError:
    """The refusal of a file that is no accepted upload: 422 ``invalid_archive`` whose
    detail names every accepted format and whose ``accepted_formats`` lists their suffixes.

    Args:
        filename: the client's file name (only its suffix is named, and only a short
            printable one: the name itself may be private).
        readable_suffix: the suffix is an accepted one but the content is not that format
            (a truncated or corrupt file).
        folders: the CLI's wording (a folder is accepted too).
    """
    suffix = suffix_of(filename or "")
    shown = suffix if suffix and len(suffix) <= _MAX_SHOWN_SUFFIX and (
        suffix[1:].replace(".", "").isalnum() and suffix.isascii()) else ""
    if readable_suffix and shown:
        what = (f"the file is not a readable {shown} file (truncated or corrupt, or another "
                "format under that name)")
    elif shown:
        what = f"a {shown} file is not an accepted dataset upload"
    else:
        what = "the file is not an accepted dataset upload (its format was not recognised)"
    return DpsynthError(UNSUPPORTED_FORMAT_CODE, f"{what}; {accepted_sentence(folders=folders)}",
                        accepted_formats=[s for f in UPLOAD_FORMATS for s in f.suffixes])
