"""Synthetic KIE forms (dpsynth-kie/1): deterministic, exact boxes, well-formed BIO labels,
the intended values, long documents; and the validator refuses every kind of bad input."""

from __future__ import annotations

import copy
import datetime as dt
import gzip
import json
from collections import defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dpsynth_shared.documents import forms_words as fw
from dpsynth_shared.documents.forms import (
    CORE_FIELDS,
    FIELDS,
    LABEL_NAMES,
    KieLimits,
    bio_problem,
    make_forms,
    read_kie_document_set,
    render_form,
    validate_kie_document_set,
    write_forms,
)


@pytest.fixture(scope="module")
def forms() -> dict[str, Any]:
    return make_forms(120, seed=5)


def _values(doc: dict[str, Any]) -> dict[str, list[str]]:
    """Each field's values (and the keys, under KEY), words joined by spaces."""
    out: dict[str, list[list[str]]] = defaultdict(list)
    for word, label in zip(doc["words"], doc["labels"], strict=True):
        name = LABEL_NAMES[label]
        if name.startswith("B-"):
            out[name[2:]].append([word])
        elif name.startswith("I-"):
            out[name[2:]][-1].append(word)
    return {k: [" ".join(v) for v in vs] for k, vs in out.items()}


def test_label_set_is_bio_over_key_and_the_fields() -> None:
    assert LABEL_NAMES[:3] == ("O", "B-KEY", "I-KEY")
    assert set(CORE_FIELDS) <= set(FIELDS)
    assert LABEL_NAMES[3:] == tuple(f"{p}-{f}" for f in FIELDS for p in "BI")


def test_deterministic_by_seed_and_independent_of_n(forms: dict[str, Any]) -> None:
    assert make_forms(120, seed=5) == forms
    assert make_forms(7, seed=5)["documents"] == forms["documents"][:7]
    assert make_forms(7, seed=6)["documents"] != forms["documents"][:7]


def test_every_word_has_a_box_in_range_and_a_label(forms: dict[str, Any]) -> None:
    validate_kie_document_set(forms)
    assert forms["format"] == "dpsynth-kie/1" and forms["label_names"] == list(LABEL_NAMES)
    ids = [d["id"] for d in forms["documents"]]
    assert len(set(ids)) == len(ids) == 120 and ids[0] == "form-000001"
    for doc in forms["documents"]:
        assert len(doc["words"]) == len(doc["boxes"]) == len(doc["labels"])
        assert all(w.strip() == w and w for w in doc["words"])
        boxes = np.array(doc["boxes"])
        assert boxes.min() >= 0 and boxes.max() <= 1000
        assert (boxes[:, 2] > boxes[:, 0]).all() and (boxes[:, 3] > boxes[:, 1]).all()
        x0, y0, x1, y1 = (boxes[:, k] for k in range(4))  # no two words overlap
        overlap = ((x0[:, None] < x1[None]) & (x0[None] < x1[:, None])
                   & (y0[:, None] < y1[None]) & (y0[None] < y1[:, None]))
        assert overlap.sum() == len(boxes), doc["id"]
        assert doc["class"] in ("invoice", "receipt", "bill")


def test_bio_is_well_formed(forms: dict[str, Any]) -> None:
    for doc in forms["documents"]:
        assert bio_problem(doc["labels"], LABEL_NAMES) is None, doc["id"]
    assert bio_problem([0, 2], LABEL_NAMES) == "word 1: I-KEY follows O"
    b_date, i_total = LABEL_NAMES.index("B-DATE"), LABEL_NAMES.index("I-TOTAL")
    assert "I-TOTAL follows B-DATE" in str(bio_problem([b_date, i_total], LABEL_NAMES))


def test_core_fields_once_each_with_their_keys_and_intended_values(
        forms: dict[str, Any]) -> None:
    seen: set[str] = set()
    for doc in forms["documents"]:
        values = _values(doc)
        for name in CORE_FIELDS:
            assert len(values.get(name, [])) == 1, (doc["id"], name)
        present = [f for f in FIELDS if f in values]
        seen |= set(present)
        assert len(values["KEY"]) == len(present), doc["id"]  # one key per field
        assert all(len(values[f]) == 1 for f in present)
        if "DUE_DATE" in values:  # dd/mm or mm/dd: one reading puts the due date later
            assert any(fw.parse_date(values["DUE_DATE"][0], day_first=first)
                       >= fw.parse_date(values["DATE"][0], day_first=first)
                       for first in (True, False))
        total = fw.parse_amount(values["TOTAL"][0])
        assert total > 0
        if "SUBTOTAL" in values and "TAX" in values:
            assert fw.parse_amount(values["SUBTOTAL"][0]) + fw.parse_amount(
                values["TAX"][0]) == total
        assert len(values["INVOICE_NUMBER"][0].split()) == 1
        assert values["VENDOR"][0][0].isupper()
        # keys come right before (left of or above) their value in reading order
        first = doc["labels"].index(LABEL_NAMES.index("B-TOTAL"))
        assert LABEL_NAMES[doc["labels"][first - 1]].endswith("-KEY")
    assert seen == set(FIELDS)


def test_a_share_is_long_and_lengths_respect_words_range(forms: dict[str, Any]) -> None:
    lengths = np.array([len(d["words"]) for d in forms["documents"]])
    assert 0.3 <= (lengths > 128).mean() <= 0.8
    assert lengths.max() <= 400 and (lengths >= 150).sum() >= 20
    short = make_forms(20, seed=1, words_range=(40, 60))["documents"]
    assert max(len(d["words"]) for d in short) <= 60
    for bad in [(10, 60), (60, 40), (40, 5000)]:
        with pytest.raises(ValueError, match="words_range"):
            make_forms(2, seed=0, words_range=bad)


def test_layouts_and_formats_vary(forms: dict[str, Any]) -> None:
    firsts = {LABEL_NAMES[next(lab for lab in d["labels"] if lab > 2)]
              for d in forms["documents"]}
    assert len(firsts) >= 3  # field order varies
    xs = [d["boxes"][d["labels"].index(LABEL_NAMES.index("B-DATE"))][0]
          for d in forms["documents"]]
    assert max(xs) - min(xs) > 300  # the date sits in different places
    dates = {_values(d)["DATE"][0].count(" ") for d in forms["documents"]}
    totals = {_values(d)["TOTAL"][0][0] for d in forms["documents"]}
    assert dates == {0, 2} and len(totals) >= 3


def test_date_and_amount_formats_round_trip() -> None:
    day = dt.date(2023, 3, 9)
    for style in ("iso", "dmy_slash", "dmy_dot", "d_month_y", "month_d_y", "d_mon_y",
                  "mon_d_y"):
        assert fw.parse_date(fw.format_date(day, style)) == day, style
    for style in fw.AMOUNT_STYLES:
        assert fw.parse_amount(fw.format_amount(123456789, style)) == Decimal("1234567.89")
    with pytest.raises(ValueError):
        fw.parse_date("yesterday")
    with pytest.raises(ValueError):
        fw.parse_amount("12.3")


def test_subjects_classes_and_argument_checks() -> None:
    doc = make_forms(30, seed=2, subjects=3, classes=["receipt"])
    assert {d["subject"] for d in doc["documents"]} <= {"owner-0", "owner-1", "owner-2"}
    assert {d["class"] for d in doc["documents"]} == {"receipt"}
    for kwargs in [{"classes": ["poem"]}, {"classes": []}, {"subjects": 0}, {"seed": -1}]:
        with pytest.raises(ValueError):
            make_forms(2, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n must be"):
        make_forms(0)


def test_write_and_read_json_and_gzip(tmp_path: Path) -> None:
    a = write_forms(tmp_path / "f.json.gz", 4, seed=1)
    b = write_forms(tmp_path / "f.json", 4, seed=1)
    assert a.read_bytes()[:2] == b"\x1f\x8b"
    assert gzip.decompress(a.read_bytes()) == b.read_bytes()
    assert read_kie_document_set(a) == read_kie_document_set(b) == make_forms(4, seed=1)
    assert write_forms(tmp_path / "g.json.gz", 4, seed=1).read_bytes() == a.read_bytes()


def test_reading_is_bounded(tmp_path: Path) -> None:
    path = write_forms(tmp_path / "f.json.gz", 3, seed=1)
    with pytest.raises(ValueError, match="more than 100 bytes"):
        read_kie_document_set(path, KieLimits(max_bytes=100))
    (tmp_path / "bad.json").write_bytes(b"{not json")
    with pytest.raises(ValueError, match="not UTF-8 JSON"):
        read_kie_document_set(tmp_path / "bad.json")
    (tmp_path / "bad.json.gz").write_bytes(b"\x1f\x8bnot gzip at all")
    with pytest.raises(ValueError, match="gzip"):
        read_kie_document_set(tmp_path / "bad.json.gz")


def _small() -> dict[str, Any]:
    return make_forms(3, seed=9, words_range=(40, 60))


def _set(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    target = doc
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return doc


_DELETE = object()
_BAD = [
    (("format",), "dpsynth-kie/2", "format must be 'dpsynth-kie/1'"),
    (("extra",), 1, "unknown top-level keys"),
    (("label_names",), [], "label_names must be a non-empty list"),
    (("label_names", 0), "B-O", "label_names\\[0\\] must be 'O'"),
    (("label_names", 1), "KEY", "label_names\\[1\\] = 'KEY' is not"),
    (("label_names", 2), "B-KEY", "label_names has 'B-KEY' twice"),
    (("documents",), [], "documents must be a non-empty list"),
    (("documents", 1), "x", "documents\\[1\\] must be an object"),
    (("documents", 1, "pages"), 2, "documents\\[1\\] has unknown keys \\['pages'\\]"),
    (("documents", 1, "id"), "form-000001", "documents\\[1\\]: id 'form-000001' is used twice"),
    (("documents", 1, "id"), _DELETE, "documents\\[1\\].id must be a non-empty string"),
    (("documents", 1, "id"), "x" * 300, "documents\\[1\\].id has 300 characters"),
    (("documents", 1, "subject"), "", "documents\\[1\\].subject must be a non-empty"),
    (("documents", 1, "class"), 3, "documents\\[1\\].class must be a non-empty"),
    (("documents", 1, "words"), [], "has no words"),
    (("documents", 1, "words"), "abc", "documents\\[1\\].words must be a list"),
    (("documents", 1, "labels"), _DELETE, "documents\\[1\\].labels must be a list"),
    (("documents", 1, "words", 4), " ", "word 4: a word must be a non-empty string"),
    (("documents", 1, "words", 4), 7, "word 4: a word must be a non-empty string"),
    (("documents", 1, "words", 4), "w" * 300, "word 4: 300 characters, more than the limit"),
    (("documents", 1, "boxes", 4), [1, 2, 3], "word 4: box \\[1, 2, 3\\] is not four"),
    (("documents", 1, "boxes", 4), [1, 2, 3.5, 4], "is not four integers"),
    (("documents", 1, "boxes", 4), [1, 2, True, 4], "is not four integers"),
    (("documents", 1, "boxes", 4), [0, 0, 1001, 5], "box \\[0, 0, 1001, 5\\] is outside"),
    (("documents", 1, "boxes", 4), [-1, 0, 10, 5], "is outside 0..1000"),
    (("documents", 1, "boxes", 4), [50, 0, 10, 5], "box \\[50, 0, 10, 5\\] is inverted"),
    (("documents", 1, "boxes", 4), [0, 9, 10, 5], "is inverted"),
    (("documents", 1, "labels", 4), 19, "word 4: label 19 is not an index into label_names "
                                        "\\(0..18\\)"),
    (("documents", 1, "labels", 4), -1, "label -1 is not an index"),
    (("documents", 1, "labels", 4), "O", "label 'O' is not an index"),
]


@pytest.mark.parametrize(("path", "value", "message"), _BAD)
def test_validator_rejects_bad_input_with_a_precise_message(
        path: tuple[Any, ...], value: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate_kie_document_set(_set(_small(), path, value))


def test_validator_rejects_unequal_lengths_and_non_objects() -> None:
    doc = _small()
    doc["documents"][2]["labels"].pop()
    with pytest.raises(ValueError, match="three lengths must be equal"):
        validate_kie_document_set(doc)
    with pytest.raises(ValueError, match="JSON object, not list"):
        validate_kie_document_set([])


def test_size_bounds_hold() -> None:
    doc = _small()
    most = max(len(d["words"]) for d in doc["documents"])
    total = sum(len(d["words"]) for d in doc["documents"])
    validate_kie_document_set(doc, KieLimits(max_documents=3, max_words_per_document=most,
                                             max_total_words=total))
    with pytest.raises(ValueError, match="3 documents, more than the limit 2"):
        validate_kie_document_set(doc, KieLimits(max_documents=2))
    with pytest.raises(ValueError, match=f"more than the limit {most - 1}"):
        validate_kie_document_set(doc, KieLimits(max_words_per_document=most - 1))
    with pytest.raises(ValueError, match=f"more than {total - 1} words in all"):
        validate_kie_document_set(doc, KieLimits(max_total_words=total - 1))
    with pytest.raises(ValueError, match="more than the limit 5"):
        validate_kie_document_set(doc, KieLimits(max_labels=5))
    assert KieLimits().max_documents == 100_000 and KieLimits().max_word_chars == 256
    json.dumps(doc)  # the generator's output is plain JSON


def test_render_form_draws_each_word_in_its_box(forms: dict[str, Any]) -> None:
    doc = forms["documents"][0]
    image = render_form(doc, size=128)
    assert image.shape == (128, 128) and image.dtype == np.uint8
    dark = image < 64
    inside = np.zeros_like(dark)
    for x0, y0, x1, y1 in doc["boxes"]:
        inside[round(y0 * 128 / 1001):round(y1 * 128 / 1001) + 1,
               round(x0 * 128 / 1001):round(x1 * 128 / 1001) + 1] = True
    assert dark.any() and not (dark & ~inside).any()
