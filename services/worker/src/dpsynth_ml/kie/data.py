"""The KIE document dataset (format ``dpsynth-kie/1``): loading and validation.

One JSON file (``.json`` or ``.json.gz``)::

    {"format": "dpsynth-kie/1", "label_names": ["O", "B-KEY", ...],
     "documents": [{"id": str, "subject": optional str, "class": optional str,
                    "words": [str], "boxes": [[x0, y0, x1, y1], ...],
                    "labels": [int, ...]}]}

Boxes are integers in 0..1000 (LayoutLMv3's normalised page coordinates) with x0 <= x1 and
y0 <= y1; each word has one box and one label (an index into ``label_names``).

The privacy unit is the document, or the declared owner when documents carry ``subject``
(then every document must carry it): :attr:`KieDataset.subjects` holds each document's dense
unit index. Error messages name the document by its position, never by its content.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dpsynth_ml.errors import InvalidSpecError

FORMAT = "dpsynth-kie/1"
MAX_FILE_BYTES = 512 * 1024 * 1024
MAX_DOCUMENTS = 200_000
MAX_WORDS_PER_DOCUMENT = 10_000
MAX_WORD_CHARS = 256
MAX_LABELS = 256
MAX_NAME_CHARS = 256
MAX_COORD = 1000
_DOC_KEYS = frozenset({"id", "subject", "class", "words", "boxes", "labels"})
_TOP_KEYS = frozenset({"format", "label_names", "documents"})

Box = tuple[int, int, int, int]


@dataclass(frozen=True)
class KieDocument:
    """One document: its words, one box and one label index per word."""

    id: str
    words: tuple[str, ...]
    boxes: tuple[Box, ...]
    labels: tuple[int, ...]
    subject: str | None = None
    doc_class: str | None = None


@dataclass(frozen=True)
class KieDataset:
    """A validated KIE dataset.

    Attributes:
        label_names: the label vocabulary (index = label id).
        documents: the documents, in file order.
        subjects: [len(documents)] int64, each document's dense privacy-unit index: its own
            position, or its declared owner's index (owners numbered by first appearance).
        num_subjects: how many privacy units there are (N, to compare with the public N̂).
    """

    label_names: tuple[str, ...]
    documents: tuple[KieDocument, ...]
    subjects: np.ndarray
    num_subjects: int

    @property
    def privacy_unit(self) -> str:
        """``"subject"`` when documents declare their owner, else ``"document"``."""
        return "subject" if self.documents and self.documents[0].subject is not None \
            else "document"


def load_kie_dataset(path: str | Path) -> KieDataset:
    """Read and validate a ``dpsynth-kie/1`` file (``.json`` or ``.json.gz``).

    Raises:
        InvalidSpecError: the file is too large, not JSON, or not a valid dataset.
    """
    path = Path(path)
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rb") as handle:
                raw = handle.read(MAX_FILE_BYTES + 1)
        else:
            with path.open("rb") as handle:
                raw = handle.read(MAX_FILE_BYTES + 1)
    except (OSError, EOFError) as exc:
        raise InvalidSpecError(f"cannot read the KIE dataset file: {type(exc).__name__}") \
            from exc
    if len(raw) > MAX_FILE_BYTES:
        raise InvalidSpecError(f"the KIE dataset is larger than {MAX_FILE_BYTES} bytes "
                               "(uncompressed)")
    try:
        obj = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidSpecError(f"the KIE dataset is not valid JSON (at byte "
                               f"{getattr(exc, 'pos', getattr(exc, 'start', '?'))})") from exc
    return parse_kie_dataset(obj)


def parse_kie_dataset(obj: object) -> KieDataset:
    """Validate an already-decoded ``dpsynth-kie/1`` object.

    Raises:
        InvalidSpecError: with a message naming the first offending field.
    """
    if not isinstance(obj, Mapping):
        raise InvalidSpecError("the KIE dataset must be a JSON object")
    extra = set(obj) - _TOP_KEYS
    if extra:
        raise InvalidSpecError(f"unknown top-level keys: {sorted(map(str, extra))[:5]}")
    if obj.get("format") != FORMAT:
        raise InvalidSpecError(f"format must be {FORMAT!r}")
    label_names = _label_names(obj.get("label_names"))
    docs = obj.get("documents")
    if not isinstance(docs, list) or not docs:
        raise InvalidSpecError("documents must be a non-empty list")
    if len(docs) > MAX_DOCUMENTS:
        raise InvalidSpecError(f"at most {MAX_DOCUMENTS} documents are allowed")
    documents = tuple(_document(d, i, len(label_names)) for i, d in enumerate(docs))
    ids = [d.id for d in documents]
    if len(set(ids)) != len(ids):
        raise InvalidSpecError("document ids must be unique")
    declared = [d.subject is not None for d in documents]
    if any(declared) and not all(declared):
        raise InvalidSpecError("subject must be given on every document or on none "
                               f"(document {declared.index(False)} has none)")
    subjects, count = _subject_indices(documents, all(declared))
    return KieDataset(label_names, documents, subjects, count)


def _subject_indices(documents: Sequence[KieDocument],
                     declared: bool) -> tuple[np.ndarray, int]:
    if not declared:
        return np.arange(len(documents), dtype=np.int64), len(documents)
    owners: dict[str, int] = {}
    out = np.empty(len(documents), dtype=np.int64)
    for i, d in enumerate(documents):
        assert d.subject is not None
        out[i] = owners.setdefault(d.subject, len(owners))
    return out, len(owners)


def _label_names(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise InvalidSpecError("label_names must be a non-empty list of strings")
    if len(value) > MAX_LABELS:
        raise InvalidSpecError(f"at most {MAX_LABELS} label_names are allowed")
    for i, name in enumerate(value):
        if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS:
            raise InvalidSpecError(f"label_names[{i}] must be a string of 1..{MAX_NAME_CHARS} "
                                   "characters")
    if len(set(value)) != len(value):
        raise InvalidSpecError("label_names must be unique")
    return tuple(value)


def _optional_name(doc: Mapping[str, object], key: str, index: int) -> str | None:
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_NAME_CHARS:
        raise InvalidSpecError(f"documents[{index}].{key} must be a string of "
                               f"1..{MAX_NAME_CHARS} characters")
    return value


def _document(doc: object, index: int, num_labels: int) -> KieDocument:
    where = f"documents[{index}]"
    if not isinstance(doc, Mapping):
        raise InvalidSpecError(f"{where} must be an object")
    extra = set(doc) - _DOC_KEYS
    if extra:
        raise InvalidSpecError(f"{where} has unknown keys: {sorted(map(str, extra))[:5]}")
    doc_id = _optional_name(doc, "id", index)
    if doc_id is None:
        raise InvalidSpecError(f"{where}.id is required")
    words, boxes, labels = doc.get("words"), doc.get("boxes"), doc.get("labels")
    if not isinstance(words, list) or not words:
        raise InvalidSpecError(f"{where}.words must be a non-empty list")
    if len(words) > MAX_WORDS_PER_DOCUMENT:
        raise InvalidSpecError(f"{where} has more than {MAX_WORDS_PER_DOCUMENT} words")
    if not isinstance(boxes, list) or len(boxes) != len(words):
        raise InvalidSpecError(f"{where}.boxes must be a list with one box per word")
    if not isinstance(labels, list) or len(labels) != len(words):
        raise InvalidSpecError(f"{where}.labels must be a list with one label per word")
    for j, word in enumerate(words):
        if not isinstance(word, str) or not word or len(word) > MAX_WORD_CHARS:
            raise InvalidSpecError(f"{where}.words[{j}] must be a string of "
                                   f"1..{MAX_WORD_CHARS} characters")
    for j, label in enumerate(labels):
        if isinstance(label, bool) or not isinstance(label, int) \
                or not 0 <= label < num_labels:
            raise InvalidSpecError(f"{where}.labels[{j}] must be an integer in "
                                   f"[0, {num_labels})")
    return KieDocument(id=doc_id, words=tuple(words),
                       boxes=tuple(_box(b, f"{where}.boxes[{j}]") for j, b in enumerate(boxes)),
                       labels=tuple(labels), subject=_optional_name(doc, "subject", index),
                       doc_class=_optional_name(doc, "class", index))


def _box(value: object, where: str) -> Box:
    if not isinstance(value, list) or len(value) != 4 or any(
            isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_COORD
            for v in value):
        raise InvalidSpecError(f"{where} must be 4 integers in 0..{MAX_COORD}")
    x0, y0, x1, y1 = value
    if x0 > x1 or y0 > y1:
        raise InvalidSpecError(f"{where} must have x0 <= x1 and y0 <= y1")
    return (x0, y0, x1, y1)
