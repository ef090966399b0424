"""The line-level structure of each document class, with random jitter.

Each layout writes on a :class:`~dpsynth_shared.documents.page.Page` from its top margin
down; counts, widths, indents and optional parts are drawn from the page's generator, so
classes overlap somewhat (a memo and an e-mail both have header fields and paragraphs), as
real documents do, while each keeps a recognisable skeleton.
"""

from __future__ import annotations

from collections.abc import Callable

from dpsynth_shared.documents.page import Page


def _paragraphs(p: Page, count: int, *, x: int | None = None, w: int | None = None,
                lines: tuple[int, int] = (2, 6), indent: bool = False) -> None:
    for _ in range(count):
        if not p.fits():
            return
        ind = p.frac(0.04, 0.08) if indent else 0
        p.paragraph(int(p.rng.integers(*lines)), x=x, w=w, indent=ind)
        p.skip(p.rng.uniform(0.4, 1.0))


def letter(p: Page) -> None:
    """Letterhead (logo + name), date, address block, salutation, paragraphs, signature."""
    r = p.rng
    logo = p.frac(0.08, 0.15, p.size)
    if r.random() < 0.5:
        p.fill(p.x0, p.y, logo, logo, dark=True)
        p.line(p.x0 + logo + p.gap * 2, p.y, p.frac(0.25, 0.45), h=p.big(1.5), bold=True)
        p.line(p.x0 + logo + p.gap * 2, p.y + p.big(1.5) + p.gap, p.frac(0.2, 0.35))
    else:
        mid = (p.x0 + p.x1) // 2
        p.fill(mid - logo // 2, p.y, logo, logo, dark=True)
        p.line(mid, p.y + logo + p.gap, p.frac(0.25, 0.45), h=p.big(1.5), bold=True,
               align="center")
        logo += p.big(1.5) + p.gap
    p.y += logo + p.gap
    if r.random() < 0.6:
        p.hrule(p.y)
        p.y += 1 + p.gap
    p.skip(0.5)
    if r.random() < 0.7:
        p.line(p.x1, None, p.frac(0.15, 0.25), align="right")
        p.skip(1.5)
    p.paragraph(int(r.integers(3, 5)), w=p.frac(0.3, 0.45), last=(0.5, 1.0))
    p.skip(0.8)
    p.line(p.x0, None, p.frac(0.12, 0.25))
    p.skip(1.5)
    _paragraphs(p, int(r.integers(2, 5)), lines=(2, 6), indent=r.random() < 0.4)
    p.line(p.x0, None, p.frac(0.12, 0.22))
    p.skip(2.5)
    p.line(p.x0, None, p.frac(0.18, 0.3))


def form(p: Page) -> None:
    """A centred title, then rows of labelled field boxes and check boxes."""
    r = p.rng
    p.line((p.x0 + p.x1) // 2, None, p.frac(0.35, 0.6), h=p.big(1.5), bold=True,
           align="center")
    p.y += p.big(1.5) + p.gap
    if r.random() < 0.7:
        p.hrule(p.y, t=max(1, p.h // 2))
    p.skip(1.0)
    pad = max(1, round(p.h * 0.6))
    box_h = p.h + 2 * pad + 2
    while p.fits(box_h):
        kind = r.choice(3, p=[0.55, 0.3, 0.15])
        if kind == 2:  # a row of check boxes with short labels
            x = p.x0
            for _ in range(int(r.integers(2, 5))):
                side = p.h + 2
                if x + side + p.frac(0.1, 0.2) > p.x1:
                    break
                p.rect(x, p.y, side, side)
                x += side + p.gap + p.line(x + side + p.gap, p.y + 1, p.frac(0.08, 0.18))
                x += p.frac(0.05, 0.1)
            p.y += p.h + 2 + 2 * p.gap
            continue
        halves = [(p.x0, p.width)] if kind == 0 else [
            (p.x0, p.width // 2 - p.gap), (p.x0 + p.width // 2 + p.gap, p.width // 2 - p.gap)]
        for x, w in halves:
            label = p.line(x, p.y + pad + 1, p.frac(0.12, 0.22))
            bx = x + label + p.gap * 2
            if p.x1 - bx > 3:
                p.rect(bx, p.y, x + w - bx, box_h)
                if r.random() < 0.5:  # filled-in value
                    p.line(bx + pad + 1, p.y + pad + 1, p.frac(0.3, 0.8, x + w - bx - 2 * pad))
        p.y += box_h + p.gap * 2


def invoice(p: Page) -> None:
    """Company block and a big 'INVOICE' heading, bill-to, item table, totals."""
    r = p.rng
    top = p.y
    p.line(p.x0, None, p.frac(0.25, 0.4), bold=True)
    p.skip()
    p.paragraph(int(r.integers(2, 4)), w=p.frac(0.25, 0.4), last=(0.6, 1.0))
    left_end = p.y
    p.y = top
    big = p.big(2.0)
    p.line(p.x1, None, p.frac(0.2, 0.32), h=big, bold=True, align="right")
    p.y += big + p.gap
    for _ in range(2):
        p.line(p.x1, None, p.frac(0.15, 0.25), align="right")
        p.skip()
    p.y = max(p.y, left_end) + p.pitch
    p.paragraph(int(r.integers(2, 4)), w=p.frac(0.25, 0.4), last=(0.6, 1.0))
    p.skip(0.7)
    desc = p.frac(0.4, 0.55)
    cols = [p.x0 + desc + i * (p.width - desc) // 3 for i in range(3)]
    col_w = (p.width - desc) // 3
    pad = max(1, p.h // 2)
    row_h = p.h + 2 * pad
    if p.fits(row_h):
        p.fill(p.x0, p.y, p.width, row_h)
        p.line(p.x0 + pad, p.y + pad, p.frac(0.12, 0.2), bold=True)
        for c in cols:
            p.line(c + col_w - pad, p.y + pad, p.frac(0.5, 0.8, col_w), bold=True,
                   align="right")
        p.y += row_h
    for _ in range(int(r.integers(3, 9))):
        if not p.fits(row_h + 3 * p.pitch):
            break
        p.line(p.x0 + pad, p.y + pad, p.frac(0.15, 0.4))
        for c in cols:
            p.line(c + col_w - pad, p.y + pad, p.frac(0.3, 0.7, col_w), align="right")
        p.y += row_h
        if r.random() < 0.6:
            p.hrule(p.y - 1)
    p.hrule(p.y, t=max(1, p.h // 2))
    p.skip(0.8)
    for i in range(int(r.integers(2, 4))):
        bold = i == 2 or r.random() < 0.2
        p.line(cols[1] + col_w - pad, None, p.frac(0.5, 0.9, col_w), bold=bold, align="right")
        p.line(p.x1 - pad, None, p.frac(0.4, 0.8, col_w), bold=bold, align="right")
        p.skip()


def memo(p: Page) -> None:
    """A big 'MEMORANDUM' heading, TO/FROM/DATE/RE fields, a thick rule, paragraphs."""
    r = p.rng
    big = p.big(2.0)
    if r.random() < 0.7:
        p.line(p.x0, None, p.frac(0.35, 0.55), h=big, bold=True)
    else:
        p.line((p.x0 + p.x1) // 2, None, p.frac(0.35, 0.55), h=big, bold=True, align="center")
    p.y += big + 2 * p.gap
    label = p.frac(0.08, 0.13)
    for _ in range(int(r.integers(3, 6))):
        p.line(p.x0, None, label, bold=True)
        p.line(p.x0 + label + 3 * p.gap, None, p.frac(0.2, 0.45))
        p.skip(1.2)
    p.hrule(p.y, t=max(1, p.h))
    p.y += max(1, p.h) + p.gap
    p.skip(0.5)
    _paragraphs(p, int(r.integers(2, 5)), lines=(2, 6))


def email(p: Page) -> None:
    """A shaded header band of short fields, a greeting, paragraphs, a quoted reply."""
    r = p.rng
    n = int(r.integers(3, 6))
    band = n * p.pitch + p.gap
    p.fill(0, p.y - p.gap, p.size, band + p.gap)
    label = p.frac(0.06, 0.1)
    for _ in range(n):
        p.line(p.x0, None, label)
        p.line(p.x0 + label + 2 * p.gap, None, p.frac(0.2, 0.5))
        p.skip()
    p.y += p.gap
    p.hrule(p.y)
    p.skip(0.8)
    p.line(p.x0, None, p.frac(0.1, 0.2))
    p.skip(1.4)
    _paragraphs(p, int(r.integers(1, 3)), lines=(1, 4))
    if p.fits() and r.random() < 0.8:  # the quoted message, behind a vertical bar
        start = p.y
        indent = p.frac(0.05, 0.09)
        _paragraphs(p, int(r.integers(1, 3)), x=p.x0 + indent, w=p.width - indent,
                    lines=(2, 5))
        p.vrule(p.x0 + indent // 3, start, max(1, p.y - start - p.gap), t=max(1, p.h // 2))
    for _ in range(2):
        p.line(p.x0, None, p.frac(0.1, 0.25))
        p.skip()


def resume(p: Page) -> None:
    """A centred name and contact line, then ruled sections of dated entries and bullets."""
    r = p.rng
    mid = (p.x0 + p.x1) // 2
    big = p.big(2.0)
    p.line(mid, None, p.frac(0.3, 0.5), h=big, bold=True, align="center")
    p.y += big + p.gap
    p.line(mid, None, p.frac(0.4, 0.7), align="center")
    p.skip(1.5)
    while p.fits(3 * p.pitch):
        p.line(p.x0, None, p.frac(0.15, 0.28), bold=True)
        p.y += p.h + max(1, p.gap // 2)
        p.hrule(p.y)
        p.y += 1 + p.gap
        for _ in range(int(r.integers(1, 3))):
            if not p.fits():
                break
            p.line(p.x0, None, p.frac(0.25, 0.45), bold=r.random() < 0.5)
            p.line(p.x1, None, p.frac(0.1, 0.16), align="right")
            p.skip()
            indent = p.frac(0.04, 0.08)
            for _ in range(int(r.integers(1, 4))):
                p.line(p.x0 + indent, None, p.frac(0.4, 0.85), bullet=True)
                p.skip()
        p.skip(0.7)


def report(p: Page) -> None:
    """A centred title and authors, an indented abstract, then two columns of text."""
    r = p.rng
    mid = (p.x0 + p.x1) // 2
    big = p.big(1.5)
    for _ in range(int(r.integers(1, 3))):
        p.line(mid, None, p.frac(0.5, 0.85), h=big, bold=True, align="center")
        p.y += big + p.gap
    p.skip(0.3)
    p.line(mid, None, p.frac(0.25, 0.45), align="center")
    p.skip(1.5)
    inset = p.frac(0.08, 0.14)
    p.paragraph(int(r.integers(3, 6)), x=p.x0 + inset, w=p.width - 2 * inset)
    p.skip(0.8)
    gutter = p.frac(0.05, 0.09)
    col_w = (p.width - gutter) // 2
    top = p.y
    for x in (p.x0, p.x0 + col_w + gutter):
        p.y = top
        while p.fits():
            if r.random() < 0.3:
                p.line(x, None, p.frac(0.3, 0.6, col_w), bold=True)
                p.skip()
            p.paragraph(int(r.integers(3, 8)), x=x, w=col_w, indent=p.frac(0.05, 0.1, col_w))
            p.skip(0.5)


def table(p: Page) -> None:
    """A title, then a ruled grid with a shaded header row and one short entry per cell."""
    r = p.rng
    p.line(p.x0, None, p.frac(0.3, 0.5), h=p.big(1.5), bold=True)
    p.y += p.big(1.5) + 2 * p.gap
    ncols = int(r.integers(3, 7))
    weights = r.uniform(0.6, 1.4, size=ncols)
    edges = [p.x0] + [p.x0 + round(p.width * float(c)) for c in
                      weights.cumsum() / weights.sum()]
    pad = max(1, p.h // 2)
    row_h = p.h + 2 * pad + 1
    room = (p.y1 - p.y - 2 * p.pitch) // row_h
    nrows = min(room, int(r.integers(5, 13)))
    if nrows < 2:
        return
    top = p.y
    p.fill(p.x0, top, p.width, row_h)
    for i in range(nrows):
        y = top + i * row_h
        p.hrule(y)
        for c in range(ncols):
            cell = edges[c + 1] - edges[c] - 2 * pad - 1
            if cell >= 1 and (i == 0 or r.random() < 0.85):
                p.line(edges[c] + pad + 1, y + pad + 1, p.frac(0.3, 0.9, cell), bold=i == 0)
    bottom = top + nrows * row_h
    p.hrule(bottom)
    for e in edges:
        p.vrule(min(e, p.x1 - 1), top, bottom - top + 1)
    p.y = bottom + 2 * p.gap
    p.paragraph(int(r.integers(1, 3)), w=p.frac(0.4, 0.8))


def news(p: Page) -> None:
    """A masthead with double rules, a headline, narrow ruled columns and a picture."""
    r = p.rng
    mid = (p.x0 + p.x1) // 2
    mast = p.big(2.5)
    p.line(mid, None, p.frac(0.6, 0.9), h=mast, bold=True, align="center")
    p.y += mast + p.gap
    p.hrule(p.y, t=max(1, p.h))
    p.y += max(1, p.h) + 1
    p.hrule(p.y)
    p.y += 1 + p.gap
    big = p.big(1.5)
    for _ in range(int(r.integers(1, 3))):
        p.line(p.x0, None, p.frac(0.7, 0.95), h=big, bold=True)
        p.y += big + p.gap
    p.skip(0.3)
    ncols = 3 if r.random() < 0.7 else 4
    gutter = max(2, p.frac(0.03, 0.05))
    col_w = (p.width - (ncols - 1) * gutter) // ncols
    top = p.y
    picture = int(r.integers(ncols))
    for c in range(ncols):
        x = p.x0 + c * (col_w + gutter)
        p.y = top
        if c == picture:
            ph = p.frac(0.2, 0.35, p.y1 - top)
            p.fill(x, p.y, col_w, ph, dark=True)
            p.y += ph + p.gap
        while p.fits():
            p.paragraph(int(r.integers(3, 9)), x=x, w=col_w, indent=max(1, col_w // 8),
                        last=(0.4, 0.9))
        if c:
            p.vrule(x - gutter // 2 - 1, top, p.y1 - top)


def presentation(p: Page) -> None:
    """A slide: a band with a big title, a few large bullets, a small footer."""
    r = p.rng
    big = p.big(2.5)
    band = big + 2 * p.gap
    if r.random() < 0.6:
        p.fill(0, p.y - p.gap, p.size, band + p.gap)
    else:
        p.fill(0, p.y - p.gap, max(1, p.x0 // 2), p.size, dark=True)
    p.line(p.x0, None, p.frac(0.4, 0.75), h=big, bold=True)
    p.y += band + p.pitch
    bh = p.big(1.5)
    footer = p.y1 - p.h
    for _ in range(int(r.integers(3, 6))):
        if not p.fits(bh, p.y + bh + p.pitch):
            break
        sub = r.random() < 0.25
        x = p.x0 + (p.frac(0.08, 0.12) if sub else p.frac(0.02, 0.05))
        p.line(x, None, p.frac(0.3, 0.75), h=p.h if sub else bh, bullet=True)
        p.y += (p.h if sub else bh) + 2 * p.pitch
    p.line(p.x0, footer, p.frac(0.1, 0.2))
    p.line(p.x1, footer, p.frac(0.03, 0.06), align="right")


LAYOUTS: dict[str, Callable[[Page], None]] = {
    "letter": letter, "form": form, "invoice": invoice, "memo": memo, "email": email,
    "resume": resume, "report": report, "table": table, "news": news,
    "presentation": presentation,
}
"""The document classes, in label order."""
