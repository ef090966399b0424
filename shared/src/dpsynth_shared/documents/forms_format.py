"""The ``dpsynth-kie/1`` document dataset format: checks, reading and writing.

One JSON object (UTF-8, optionally gzip-compressed as ``.json.gz``)::

    {"format": "dpsynth-kie/1",
     "label_names": ["O", "B-KEY", "I-KEY", "B-INVOICE_NUMBER", ...],
     "documents": [{"id": "form-000001", "subject": "owner-17", "class": "invoice",
                    "words": [...], "boxes": [[x0, y0, x1, y1], ...], "labels": [...]}]}

Boxes are integers in LayoutLMv3's normalised page coordinates 0..1000 (x to the right, y
down, ``x0 <= x1``, ``y0 <= y1``); ``labels[i]`` indexes ``label_names`` for ``words[i]``;
``label_names[0]`` is ``"O"`` and every other name is ``B-<NAME>`` or ``I-<NAME>``. See
docs/documents-kie.md.
"""

from __future__ import annotations

import gzip
import io
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FORMAT = "dpsynth-kie/1"
COORD_MAX = 1000
_NAME = re.compile(r"[BI]-[A-Za-z0-9_]{1,60}")
_DOC_KEYS = {"id", "subject", "class", "words", "boxes", "labels"}
_TOP_KEYS = {"format", "label_names", "documents"}


@dataclass(frozen=True)
class KieLimits:
    """Bounds :func:`validate_kie_document_set` enforces, so a hostile upload cannot exhaust
    memory or time (the defaults suit datasets of up to about 100,000 forms)."""

    max_documents: int = 100_000
    max_words_per_document: int = 8_192
    max_total_words: int = 5_000_000
    max_word_chars: int = 256
    max_id_chars: int = 256
    max_labels: int = 256
    max_bytes: int = 512 * 1024 * 1024
    """:func:`read_kie_document_set`: the most bytes read (after decompression)."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_labels(names: Any, limits: KieLimits) -> list[str]:
    if not isinstance(names, list) or not names:
        raise ValueError("label_names must be a non-empty list of strings")
    if len(names) > limits.max_labels:
        raise ValueError(f"label_names has {len(names)} names, more than the limit "
                         f"{limits.max_labels}")
    if names[0] != "O":
        raise ValueError(f"label_names[0] must be 'O', not {names[0]!r}")
    for k, name in enumerate(names[1:], start=1):
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(f"label_names[{k}] = {name!r} is not 'B-<NAME>' or 'I-<NAME>' "
                             "(letters, digits, _; at most 60)")
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ValueError(f"label_names has {dup!r} twice")
    return list(names)


def _check_text(where: str, value: Any, max_chars: int, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where} must be a non-empty string, not {value!r:.80}")
    if len(value) > max_chars:
        raise ValueError(f"{where} has {len(value)} characters, more than the limit "
                         f"{max_chars}")


def _check_document(k: int, doc: Any, n_labels: int, limits: KieLimits) -> int:
    where = f"documents[{k}]"
    if not isinstance(doc, dict):
        raise ValueError(f"{where} must be an object, not {type(doc).__name__}")
    unknown = sorted(set(doc) - _DOC_KEYS)
    if unknown:
        raise ValueError(f"{where} has unknown keys {unknown}; allowed: {sorted(_DOC_KEYS)}")
    _check_text(f"{where}.id", doc.get("id"), limits.max_id_chars)
    _check_text(f"{where}.subject", doc.get("subject"), limits.max_id_chars, optional=True)
    _check_text(f"{where}.class", doc.get("class"), limits.max_id_chars, optional=True)
    words, boxes, labels = doc.get("words"), doc.get("boxes"), doc.get("labels")
    for name, value in (("words", words), ("boxes", boxes), ("labels", labels)):
        if not isinstance(value, list):
            raise ValueError(f"{where}.{name} must be a list, not {type(value).__name__}")
    assert isinstance(words, list) and isinstance(boxes, list) and isinstance(labels, list)
    if not words:
        raise ValueError(f"{where} ({doc['id']}) has no words")
    if len(words) > limits.max_words_per_document:
        raise ValueError(f"{where} ({doc['id']}) has {len(words)} words, more than the limit "
                         f"{limits.max_words_per_document}")
    if not len(words) == len(boxes) == len(labels):
        raise ValueError(f"{where} ({doc['id']}): {len(words)} words, {len(boxes)} boxes and "
                         f"{len(labels)} labels; the three lengths must be equal")
    for i, (word, box, label) in enumerate(zip(words, boxes, labels, strict=True)):
        at = f"{where} ({doc['id']}) word {i}"
        if not isinstance(word, str) or not word.strip():
            raise ValueError(f"{at}: a word must be a non-empty string, not {word!r:.80}")
        if len(word) > limits.max_word_chars:
            raise ValueError(f"{at}: {len(word)} characters, more than the limit "
                             f"{limits.max_word_chars}")
        if not isinstance(box, list) or len(box) != 4 or not all(map(_is_int, box)):
            raise ValueError(f"{at}: box {box!r:.80} is not four integers [x0, y0, x1, y1]")
        if not all(0 <= c <= COORD_MAX for c in box):
            raise ValueError(f"{at}: box {box} is outside 0..{COORD_MAX}")
        if box[0] > box[2] or box[1] > box[3]:
            raise ValueError(f"{at}: box {box} is inverted (needs x0 <= x1 and y0 <= y1)")
        if not _is_int(label) or not 0 <= label < n_labels:
            raise ValueError(f"{at}: label {label!r:.40} is not an index into label_names "
                             f"(0..{n_labels - 1})")
    return len(words)


def validate_kie_document_set(doc: Any, limits: KieLimits | None = None) -> None:
    """Check that ``doc`` (the parsed JSON) is a ``dpsynth-kie/1`` document set.

    Raises:
        ValueError: naming the first problem: the format tag, the label names, a document's
            id (missing or duplicate), words (empty, too long), boxes (not four integers,
            outside 0..1000, inverted), labels (out of range), unequal lengths, or a size
            over ``limits`` (documents, words per document, words in all).
    """
    limits = limits or KieLimits()
    if not isinstance(doc, dict):
        raise ValueError(f"a KIE document set is a JSON object, not {type(doc).__name__}")
    if doc.get("format") != FORMAT:
        raise ValueError(f"format must be {FORMAT!r}, not {doc.get('format')!r:.80}")
    unknown = sorted(set(doc) - _TOP_KEYS)
    if unknown:
        raise ValueError(f"unknown top-level keys {unknown}; allowed: {sorted(_TOP_KEYS)}")
    names = _check_labels(doc.get("label_names"), limits)
    documents = doc.get("documents")
    if not isinstance(documents, list) or not documents:
        raise ValueError("documents must be a non-empty list")
    if len(documents) > limits.max_documents:
        raise ValueError(f"{len(documents)} documents, more than the limit "
                         f"{limits.max_documents}")
    seen: set[str] = set()
    total = 0
    for k, item in enumerate(documents):
        total += _check_document(k, item, len(names), limits)
        if item["id"] in seen:
            raise ValueError(f"documents[{k}]: id {item['id']!r} is used twice")
        seen.add(item["id"])
        if total > limits.max_total_words:
            raise ValueError(f"more than {limits.max_total_words} words in all (the limit)")


def bio_problem(labels: Sequence[int], label_names: Sequence[str]) -> str | None:
    """The first BIO violation in one document's labels (an ``I-X`` that follows neither
    ``B-X`` nor ``I-X``), or None when the tags are well formed."""
    previous = "O"
    for i, label in enumerate(labels):
        name = label_names[label]
        if name.startswith("I-") and previous[2:] != name[2:]:
            return f"word {i}: {name} follows {previous}"
        previous = name
    return None


def write_kie_document_set(path: str | Path, doc: Mapping[str, Any]) -> Path:
    """Write ``doc`` as UTF-8 JSON, gzip-compressed when ``path`` ends in ``.gz`` (with no
    name and a zero mtime in the header, so the same forms give the same bytes). Returns
    ``path``."""
    path = Path(path)
    data = json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    if path.suffix == ".gz":
        with path.open("wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb",
                                                            mtime=0) as fh:
            fh.write(data)
    else:
        path.write_bytes(data)
    return path


def read_kie_document_set(path: str | Path, limits: KieLimits | None = None) -> Any:
    """Read and check a ``.json`` or ``.json.gz`` document set, reading at most
    ``limits.max_bytes`` decompressed bytes (a gzip bomb is refused, not inflated).

    Raises:
        ValueError: for a file over the byte limit, bad gzip, bad JSON or a bad document set.
    """
    limits = limits or KieLimits()
    path = Path(path)
    with path.open("rb") as raw:
        magic = raw.read(2)
        raw.seek(0)
        try:
            stream: io.BufferedIOBase = (gzip.GzipFile(fileobj=raw) if magic == b"\x1f\x8b"
                                         else raw)
            data = stream.read(limits.max_bytes + 1)
        except (OSError, EOFError) as exc:
            raise ValueError(f"{path.name}: not a readable gzip file ({exc})") from None
    if len(data) > limits.max_bytes:
        raise ValueError(f"{path.name}: more than {limits.max_bytes} bytes of JSON (the limit)")
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path.name}: not UTF-8 JSON ({exc})") from None
    validate_kie_document_set(doc, limits)
    return doc
