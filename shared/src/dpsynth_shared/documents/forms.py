"""PUBLIC synthetic forms with key information: words, exact word boxes and BIO labels.

Invoices, receipts and bills drawn from a seeded generator (no record of anyone), in the
``dpsynth-kie/1`` format (:mod:`.forms_format`, docs/documents-kie.md), for end-to-end tests
of key-information extraction (LayoutLMv3 token classification) and the demo.

Each form has the four core fields (invoice number, date, vendor, total), each after its
printed key, and some of due date, customer, subtotal and tax; around them, text labelled
``O``: a title, addresses, look-alike fields (order number, terms), an item table whose
header says "Total" and whose lines carry amounts, small print with dates and the words
"invoice number". Layouts vary (one or two columns, key left of or above its value, field
order, where the vendor block sits, title alignment), and so do date and amount formats, so
a model needs both the words and the boxes. Lengths are drawn log-uniformly in
``words_range`` (default 40..400 words: about half exceed 128).

Example::

    doc = make_forms(200, seed=0)          # {"format": "dpsynth-kie/1", ...}
    write_forms("forms.json.gz", 200, seed=0)
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dpsynth_shared.documents import forms_words as fw
from dpsynth_shared.documents.forms_format import (
    COORD_MAX,
    FORMAT,
    KieLimits,
    bio_problem,
    read_kie_document_set,
    validate_kie_document_set,
    write_kie_document_set,
)
from dpsynth_shared.documents.page import Page

FIELDS = ("INVOICE_NUMBER", "DATE", "DUE_DATE", "VENDOR", "CUSTOMER", "SUBTOTAL", "TAX",
          "TOTAL")
"""The labelled fields; each value is tagged ``B-<FIELD>`` then ``I-<FIELD>``."""
CORE_FIELDS = ("INVOICE_NUMBER", "DATE", "VENDOR", "TOTAL")
"""Fields every form has (with their keys)."""
LABEL_NAMES: tuple[str, ...] = ("O", "B-KEY", "I-KEY",
                                *(f"{p}-{f}" for f in FIELDS for p in "BI"))
FORM_CLASSES = ("invoice", "receipt", "bill")
MIN_WORDS, MAX_WORDS = 40, 4000
"""Bounds of ``words_range``: every form needs ~25 words; 4000 keeps pages legible."""

__all__ = ["CORE_FIELDS", "FIELDS", "FORMAT", "FORM_CLASSES", "LABEL_NAMES", "KieLimits",
           "bio_problem", "make_forms", "read_kie_document_set", "render_form",
           "validate_kie_document_set", "write_forms", "write_kie_document_set"]

_KEYS: dict[str, tuple[str, ...]] = {
    "invoice": ("Invoice No.", "Invoice #", "Invoice Number", "Inv. No.", "No."),
    "receipt": ("Receipt No.", "Receipt #", "Receipt Number", "Transaction No."),
    "bill": ("Bill No.", "Bill Number", "Reference", "Account Ref."),
    "DATE": ("Date", "Invoice Date", "Issued", "Date of issue", "Issue date"),
    "DUE_DATE": ("Due Date", "Payment due", "Due", "Pay by"),
    "VENDOR": ("From", "Vendor", "Seller", "Supplier", "Issued by", "Sold by"),
    "CUSTOMER": ("Bill To", "Customer", "Billed to", "Client", "Sold to"),
    "SUBTOTAL": ("Subtotal", "Net amount", "Sub-total", "Net"),
    "TAX": ("Tax", "VAT {r}%", "Sales tax ({r}%)", "GST"),
    "TOTAL": ("Total", "Total due", "Amount due", "Grand total", "Balance due", "TOTAL"),
}
_TITLES = {"invoice": ("INVOICE", "Invoice", "Tax Invoice"), "receipt": ("RECEIPT", "Receipt",
           "Sales Receipt"), "bill": ("BILL", "Statement", "Bill")}
_OPTIONAL = {  # probability of DUE_DATE, CUSTOMER, SUBTOTAL, TAX per class
    "invoice": (0.8, 0.9, 0.7, 0.7), "receipt": (0.1, 0.3, 0.5, 0.6),
    "bill": (0.9, 0.8, 0.4, 0.4)}
_DISTRACTORS = (("Order No.", "PO-{n}"), ("Terms", "Net {d}"), ("Page", "1 of 1"),
                ("Customer ID", "C{n}"), ("Delivery date", "{date}"))


@dataclass
class _Pair:
    key: str
    value: str
    tag: str                 # the value's field, or "O" (a look-alike: key and value are O)
    extra: list[str] = field(default_factory=list)  # lines under the value, labelled O


@dataclass
class _Form:
    cls: str
    title: str
    vendor: _Pair
    fields: list[_Pair]
    customer: _Pair | None
    items: list[tuple[str, int, int]]   # description, quantity, unit price in cents
    totals: list[_Pair]                 # amounts filled in once the items are final
    notes: list[str]
    style: tuple[str, str, str, str]
    head: tuple[str, str, str, str]     # the item table's column heads

    def words(self) -> int:
        amount = len(fw.format_amount(0, self.style).split())
        pairs = [self.vendor, *self.fields, *([self.customer] if self.customer else [])]
        n = len(self.title.split()) + sum(len(f"{p.key} {p.value}".split()) + sum(
            len(e.split()) for e in p.extra) for p in pairs)
        n += sum(len(p.key.split()) + amount for p in self.totals)
        if self.items:
            n += len(" ".join(self.head).split()) + sum(
                len(d.split()) + 1 + 2 * amount for d, _, _ in self.items)
        return n + sum(len(s.split()) for s in self.notes)


def _content(rng: np.random.Generator, cls: str, target: int, cap: int) -> _Form:
    """What one form says (before layout), grown to about ``target`` words, at most
    ``cap``."""
    when, dates = fw.random_date(rng), fw.date_style(rng)
    style = fw.amount_style(rng)
    colon = ":" if rng.random() < 0.7 else ""

    def key(name: str) -> str:
        return fw.pick(rng, _KEYS[name]).format(r=rate) + colon

    rate = int(rng.choice([5, 7, 8, 10, 19, 20]))
    vendor = _Pair(key("VENDOR"), fw.company(rng), "VENDOR", fw.address(rng))
    if rng.random() < 0.5:
        vendor.extra.append(fw.email(rng))
    p_due, p_customer, p_sub, p_tax = _OPTIONAL[cls]
    fields = [_Pair(fw.pick(rng, _KEYS[cls]) + colon, fw.doc_number(rng), "INVOICE_NUMBER"),
              _Pair(key("DATE"), fw.format_date(when, dates), "DATE")]
    if rng.random() < p_due:
        due = when + dt.timedelta(days=int(rng.choice([7, 14, 30, 60])))
        fields.append(_Pair(key("DUE_DATE"), fw.format_date(due, dates), "DUE_DATE"))
    for k in rng.permutation(len(_DISTRACTORS))[:int(rng.integers(0, 3))]:
        name, value = _DISTRACTORS[int(k)]
        later = fw.format_date(when + dt.timedelta(days=int(rng.integers(1, 20))), dates)
        fields.append(_Pair(name + colon, value.format(n=int(rng.integers(1000, 99999)),
                                                       d=int(rng.choice([14, 30])),
                                                       date=later), "O"))
    customer = None
    if rng.random() < p_customer:
        name = fw.company(rng) if rng.random() < 0.6 else fw.person(rng)
        customer = _Pair(key("CUSTOMER"), name, "CUSTOMER", fw.address(rng))
    totals = [_Pair(key(f), "", f) for f, p in (("SUBTOTAL", p_sub), ("TAX", p_tax))
              if rng.random() < p]
    totals.append(_Pair(key("TOTAL"), "", "TOTAL"))
    head = ("Description", "Qty", fw.pick(rng, ("Unit price", "Price")),
            fw.pick(rng, ("Amount", "Total")))
    form = _Form(cls, fw.pick(rng, _TITLES[cls]), vendor, fields, customer, [], totals, [],
                 style, head)

    def item() -> tuple[str, int, int]:
        return fw.item_name(rng), int(rng.integers(1, 13)), int(rng.integers(100, 50000))

    form.items = [item() for _ in range(int(rng.integers(1, 4)))]
    while form.words() < target:
        grow = form.items if rng.random() < 0.75 else form.notes
        grow.append(item() if grow is form.items else  # type: ignore[arg-type]
                    fw.note(rng, fw.format_date(fw.random_date(rng), dates)))
        if form.words() > cap:
            grow.pop()
            break
    for shrink in (form.notes, form.items, form.fields, vendor.extra,
                   customer.extra if customer else [], form.totals):
        keep = {"items": 1, "fields": 2, "totals": 1}.get(
            "items" if shrink is form.items else "fields" if shrink is form.fields
            else "totals" if shrink is form.totals else "", 0)
        while form.words() > cap and len(shrink) > keep:
            shrink.pop(-2 if shrink is form.totals else -1)  # the total stays last
    return form


@dataclass
class _Grid:
    """Words on a character grid: ``cols`` columns, rows from 0 down (row 0: the title)."""

    cols: int
    placed: list[tuple[int, int, str, str, bool]] = field(default_factory=list)

    def put(self, row: int, col: int, text: str, tag: str, limit: int | None = None
            ) -> int:
        """Write ``text`` from ``(row, col)``, wrapping back to ``col`` before ``limit``;
        returns the last row written."""
        limit = self.cols if limit is None else limit
        c = col
        for i, word in enumerate(text.split()):
            if c > col and c + len(word) > limit:
                row, c = row + 1, col
            self.placed.append((row, c, word, tag, i == 0))
            c += len(word) + 1
        return row


def _pairs(g: _Grid, row: int, c0: int, c1: int, pairs: Sequence[_Pair], above: bool,
           aligned: bool) -> int:
    """Key/value pairs in columns ``c0..c1``: stacked ``key value`` rows, or cells with the
    key above its value; returns the next free row."""
    kw = max((len(p.key) for p in pairs), default=0) + 1
    col = c0
    bottom = row
    for p in pairs:
        ktag = "KEY" if p.tag != "O" else "O"
        if not above:
            vcol = c0 + (kw if aligned else len(p.key) + 1)
            g.put(row, c0, p.key, ktag)
            r = g.put(row, vcol, p.value, p.tag, c1)
            for line in p.extra:
                r = g.put(r + 1, vcol, line, "O", c1)
            row = r + 1 + (1 if p.extra else 0)
            continue
        width = min(c1 - c0, max(len(s) for s in [p.key, p.value, *p.extra]) + 3)
        if col > c0 and col + width > c1:
            row, col = bottom, c0
        g.put(row, col, p.key, ktag, col + width)
        r = g.put(row + 1, col, p.value, p.tag, col + width)
        for line in p.extra:
            r = g.put(r + 1, col, line, "O", col + width)
        bottom, col = max(bottom, r + 2), col + width
    return bottom if above else row


def _layout(rng: np.random.Generator, form: _Form) -> _Grid:
    g = _Grid(cols=int(rng.integers(76, 101)))
    above, aligned = rng.random() < 0.35, rng.random() < 0.6
    two_col, swap = rng.random() < 0.6, rng.random() < 0.3
    vendor_last = rng.random() < 0.15
    fields = [form.fields[int(k)] for k in rng.permutation(len(form.fields))]
    g.put(0, 0, form.title, "O")  # row 0 is drawn large (see _boxes)
    half = g.cols // 2
    left, right = (0, half - 1), (half + 1, g.cols)
    top: list[list[_Pair]] = [[] if vendor_last else [form.vendor], fields]
    if swap:
        top.reverse()
    row = 2
    if two_col:
        row = max(_pairs(g, row, *left, top[0], above, aligned),
                  _pairs(g, row, *right, top[1], above, aligned)) + 1
    else:
        for block in top:
            row = _pairs(g, row, *left if rng.random() < 0.5 else (0, g.cols), block, above,
                         aligned) + 1
    if form.customer:
        span = left if rng.random() < 0.7 else right
        row = _pairs(g, row, *span, [form.customer], above, aligned) + 1
    c = g.cols
    for k, head in enumerate(form.head):
        right_edge = (0, c - 30, c - 15, c)[k]
        g.put(row, max(0, right_edge - len(head)) if k else 0, head, "O")
    subtotal = 0
    for desc, qty, unit in form.items:
        amount = fw.format_amount(qty * unit, form.style)
        subtotal += qty * unit
        row += 1
        last = g.put(row, 0, desc, "O", c - 36)
        for text, edge in ((str(qty), c - 30), (fw.format_amount(unit, form.style), c - 15),
                           (amount, c)):
            g.put(row, edge - len(text), text, "O")
        row = last
    rate = next((int("".join(ch for ch in p.key if ch.isdigit()) or 10)
                 for p in form.totals if p.tag == "TAX"), 0)
    tax = subtotal * rate // 100
    amounts = {"SUBTOTAL": subtotal, "TAX": tax, "TOTAL": subtotal + tax}
    row += 2
    t0 = 0 if rng.random() < 0.2 else c - 40
    for p in form.totals:
        value = fw.format_amount(amounts[p.tag], form.style)
        g.put(row, t0, p.key, "KEY")
        g.put(row, c - len(value), value, p.tag)
        row += 1
    row += 1
    for sentence in form.notes:
        row = g.put(row, 0, sentence, "O") + 1
    if vendor_last:
        _pairs(g, row + 1, 0, g.cols, [form.vendor], above, aligned)
    return g


def _boxes(rng: np.random.Generator, g: _Grid, title_align: str
           ) -> list[tuple[str, list[int], str, bool]]:
    """Grid places to 0..1000 boxes: the page's margins, pitch and character width; the
    title row is 1.6x taller and wider."""
    rows = max(r for r, *_ in g.placed) + 1
    mx, my = int(rng.integers(25, 70)), int(rng.integers(20, 60))
    cw = (COORD_MAX - 2 * mx) / g.cols
    pitch = min(float(rng.uniform(18, 30)), (COORD_MAX - 2 * my) / (rows + 0.6))
    h = max(2.0, pitch * float(rng.uniform(0.55, 0.75)))
    title = [p for p in g.placed if p[0] == 0]
    tw = (max(c + len(w) for _, c, w, *_ in title) if title else 0) * cw * 1.6
    tx = {"left": mx, "center": (COORD_MAX - tw) / 2, "right": COORD_MAX - mx - tw}[title_align]
    out = []
    for row, col, word, tag, begin in g.placed:
        shrink = float(rng.uniform(0.85, 1.0))
        if row == 0:
            x0, y0 = tx + col * cw * 1.6, float(my)
            x1, y1 = x0 + len(word) * cw * 1.6 * shrink, y0 + h * 1.6
        else:
            x0, y0 = mx + col * cw, my + (row + 0.6) * pitch
            x1, y1 = x0 + len(word) * cw * shrink, y0 + h
        box = [min(COORD_MAX, max(0, round(v))) for v in (x0, y0, x1, y1)]
        out.append((word, box, tag, begin))
    return out


def _one(rng: np.random.Generator, cls: str, words_range: tuple[int, int]) -> dict[str, Any]:
    lo, hi = words_range
    target = round(math.exp(rng.uniform(math.log(lo), math.log(hi))))
    form = _content(rng, cls, target, hi)
    placed = _boxes(rng, _layout(rng, form), fw.pick(rng, ("left", "center", "right")))
    index = {name: k for k, name in enumerate(LABEL_NAMES)}
    labels = [0 if tag == "O" else index[("B-" if begin else "I-") + tag]
              for _, _, tag, begin in placed]
    return {"class": cls, "words": [w for w, *_ in placed], "boxes": [b for _, b, *_ in placed],
            "labels": labels}


def make_forms(n: int, *, seed: int = 0, classes: Sequence[str] = FORM_CLASSES,
               words_range: tuple[int, int] = (40, 400), subjects: int | None = None
               ) -> dict[str, Any]:
    """``n`` synthetic forms as a ``dpsynth-kie/1`` document set (a JSON-ready dict).

    Form ``i`` is drawn from ``default_rng([seed, i])``: the same seed gives the same forms
    whatever ``n``.

    Args:
        n: how many forms (1..100,000).
        seed: the generator seed (non-negative).
        classes: some of :data:`FORM_CLASSES`; each form's class is drawn uniformly.
        words_range: ``(lo, hi)``: a form's length is drawn log-uniformly in it (and never
            exceeds ``hi``); ``MIN_WORDS <= lo <= hi <= MAX_WORDS``.
        subjects: when given, each form gets ``"subject": "owner-<k>"``, ``k`` drawn
            uniformly below ``subjects`` (several forms per owner, for user-level DP).

    Raises:
        ValueError: for a bad count, seed, class list, words_range or subjects.
    """
    if not 1 <= n <= KieLimits().max_documents:
        raise ValueError(f"n must be in 1..{KieLimits().max_documents}, not {n}")
    if seed < 0:
        raise ValueError("seed must be non-negative")
    names = list(classes)
    bad = [c for c in names if c not in FORM_CLASSES]
    if not names or bad or len(set(names)) != len(names):
        raise ValueError(f"classes must be distinct names from {list(FORM_CLASSES)}, not "
                         f"{names}")
    lo, hi = words_range
    if not MIN_WORDS <= lo <= hi <= MAX_WORDS:
        raise ValueError(f"words_range must satisfy {MIN_WORDS} <= lo <= hi <= {MAX_WORDS}, "
                         f"not {words_range}")
    if subjects is not None and subjects < 1:
        raise ValueError("subjects must be at least 1")
    documents = []
    for i in range(n):
        rng = np.random.default_rng([seed, i])
        cls = names[int(rng.integers(len(names)))]
        doc: dict[str, Any] = {"id": f"form-{i + 1:06d}"}
        if subjects is not None:
            doc["subject"] = f"owner-{int(rng.integers(subjects))}"
        doc.update(_one(rng, cls, (lo, hi)))
        documents.append(doc)
    return {"format": FORMAT, "label_names": list(LABEL_NAMES), "documents": documents}


def write_forms(path: str | Path, n: int, **kwargs: Any) -> Path:
    """:func:`make_forms` written to ``path`` (``.json``, or gzip for ``.json.gz``)."""
    return write_kie_document_set(path, make_forms(n, **kwargs))


def render_form(document: dict[str, Any], *, size: int = 256, seed: int = 0,
                label_names: Sequence[str] = LABEL_NAMES) -> np.ndarray:
    """A uint8 ``[size, size]`` page image of one form: each word drawn as pseudo-text in
    its box with the :class:`~.page.Page` canvas (keys bold). For demos and visual checks;
    the text is not legible."""
    page = Page(size, np.random.default_rng([seed, len(document["words"])]))
    page.y1 = size
    scale = size / (COORD_MAX + 1)
    for box, label in zip(document["boxes"], document["labels"], strict=True):
        x0, y0, x1, y1 = (round(v * scale) for v in box)
        page.line(x0, y0, max(1, x1 - x0), h=max(1, y1 - y0),
                  bold=label_names[label].endswith("-KEY"))
    return page.render().image
