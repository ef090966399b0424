"""A page canvas that draws pseudo-text lines, rules, boxes and shading with numpy.

Text and graphics live on separate layers and are composed at the end, so a rule drawn
after a line never erases its ink: every pixel darker than :data:`TEXT_THRESHOLD` is text
ink and lies inside exactly the bounding box recorded for its line.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

TEXT_THRESHOLD = 64
"""Every pixel darker than this is text ink; graphics and paper are never this dark."""

_INK_MAX = 46        # text ink values: [0, _INK_MAX)
_GRAPHIC_MIN = 100   # rules, boxes, picture blocks: [_GRAPHIC_MIN, 171)
_PAPER_MIN = 222     # paper: [_PAPER_MIN, 256); shading sits between graphics and paper

Box = tuple[int, int, int, int]
"""A text line's bounding box ``(y0, x0, y1, x1)``, end-exclusive."""


@dataclass(frozen=True)
class Document:
    """One rendered page.

    Attributes:
        image: uint8 ``[S, S]`` grayscale page.
        mask: uint8 ``[S, S]``: 255 inside a text line's bounding box, 0 elsewhere.
        boxes: the tight bounding box of each rendered text line, in drawing order.
    """

    image: np.ndarray
    mask: np.ndarray
    boxes: tuple[Box, ...]


_Strip = tuple[np.ndarray, np.ndarray, np.ndarray]
_STRIP_VARIANTS = 16


@functools.lru_cache(maxsize=2048)
def _strip(size: int, h: int, bold: bool, variant: int) -> _Strip:
    """A long run of pseudo-words of height ``h``, cut into lines by :meth:`Page.line`.

    Words of pseudo-glyphs separated by spaces; each word's first column is ink at full
    height (a capital), so a line cut at a word start has a tight top-left corner. Strips
    are drawn from their own fixed seed and shared between pages (a page picks a variant
    and random cut points), which keeps 10,000 pages within seconds.

    Returns:
        ``(ink [h, L] bool, word starts usable as line starts, last[j] = the last ink
        column at or before j)``, read-only.
    """
    rng = np.random.default_rng([size, h, int(bold), variant])
    space = max(1, round(h * 0.8))
    lo, hi = max(2, 2 * h), max(3, 6 * h)
    k = (2 * size) // lo + 2
    runs = np.empty(2 * k, dtype=np.int64)
    runs[0::2], runs[1::2] = rng.integers(lo, hi + 1, size=k), space
    cols = np.repeat(np.tile(np.array([True, False]), k), runs)
    starts = np.concatenate([[0], np.cumsum(runs)[1::2][:-1]])
    top = np.zeros(cols.size, dtype=np.int64)
    if h >= 3 and not bold:  # letter gaps, x-height vs ascenders
        cols &= rng.random(cols.size) >= 0.2
        top = np.where(rng.random(cols.size) < 0.3, 0, h // 3)
    cols[starts], top[starts] = True, 0
    ink = (np.arange(h)[:, None] >= top[None, :]) & cols[None, :]
    last = np.maximum.accumulate(np.where(cols, np.arange(cols.size), -1))
    usable = starts[starts <= cols.size - size - 1]
    for a in (ink, usable, last):
        a.setflags(write=False)
    return ink, usable, last


class Page:
    """A square page with jittered margins, line height and tones, and a writing cursor.

    Attributes:
        size: side in pixels.
        h: body line height (pixels, at least 1).
        gap: vertical gap between body lines.
        x0, x1: left and right text margins (``x1`` exclusive).
        y: the writing cursor (top of the next line).
        y1: the bottom margin (exclusive): no text line crosses it.
    """

    def __init__(self, size: int, rng: np.random.Generator) -> None:
        self.size = size
        self.rng = rng
        self.paper = int(rng.integers(_PAPER_MIN, 256))
        self.ink = int(rng.integers(0, _INK_MAX))
        self.graphic = int(rng.integers(_GRAPHIC_MIN, 171))
        self.shade = self.paper - int(rng.integers(18, 40))
        self._img = np.full((size, size), self.paper, dtype=np.uint8)
        self._text = np.zeros((size, size), dtype=bool)
        self._mask = np.zeros((size, size), dtype=np.uint8)
        self._boxes: list[Box] = []
        self._strips: dict[tuple[int, bool], _Strip] = {}
        self.h = max(1, round(size / 40 * rng.uniform(0.85, 1.25)))
        self.gap = max(1, round(self.h * rng.uniform(0.5, 0.9)))
        self.x0 = round(size * rng.uniform(0.05, 0.12))
        self.x1 = size - round(size * rng.uniform(0.05, 0.12))
        self.y = round(size * rng.uniform(0.04, 0.10))
        self.y1 = size - round(size * rng.uniform(0.04, 0.09))

    # -- measures ---------------------------------------------------------------------------

    @property
    def width(self) -> int:
        """The text width between the margins."""
        return self.x1 - self.x0

    @property
    def pitch(self) -> int:
        """Body line height plus gap."""
        return self.h + self.gap

    def big(self, factor: float) -> int:
        """A heading's line height: ``factor`` x body, at least one pixel taller."""
        return max(self.h + 1, round(self.h * factor))

    def frac(self, lo: float, hi: float, of: int | None = None) -> int:
        """A random length between ``lo`` and ``hi`` of ``of`` (default: the text width)."""
        u = lo + (hi - lo) * self.rng.random()
        return max(1, round((self.width if of is None else of) * u))

    def fits(self, h: int | None = None, y: int | None = None) -> bool:
        """Whether a line of height ``h`` fits above the bottom margin at ``y``."""
        return (self.y if y is None else y) + (h or self.h) <= self.y1

    def skip(self, lines: float = 1.0) -> None:
        """Advance the cursor by ``lines`` body pitches."""
        self.y += max(1, round(self.pitch * lines))

    # -- text -------------------------------------------------------------------------------

    def _strip(self, h: int, bold: bool) -> _Strip:
        """This page's strip for a line style: one of a few shared variants, picked once."""
        key = (h, bold)
        if key not in self._strips:
            self._strips[key] = _strip(self.size, h, bold, self._pick(_STRIP_VARIANTS))
        return self._strips[key]

    def _pick(self, n: int) -> int:
        """A uniform integer in ``[0, n)`` (a scalar ``random()`` is cheaper than
        ``integers()``, which matters at ~20 lines per page)."""
        return min(n - 1, int(self.rng.random() * n))

    def line(self, x: int, y: int | None, w: int, *, h: int | None = None, bold: bool = False,
             bullet: bool = False, align: str = "left") -> int:
        """Draw a text line of at most ``w`` pixels and record its tight box.

        Args:
            x: left edge of the slot (``align='left'``), its right edge (``'right'``) or its
                centre (``'center'``).
            y: top of the line (default: the cursor; the cursor does not move).
            w: the line's length before ragged trimming.
            h: line height (default: body height).
            bold: no letter gaps, all glyphs full height.
            bullet: start with a full-height bullet and a gap.
            align: how the rendered ink sits relative to ``x``.

        Returns:
            The drawn width in pixels (0 when the line does not fit on the page).
        """
        y = self.y if y is None else y
        h = h or self.h
        if y < 0 or y + h > self.y1 or w < 1:
            return 0
        w = min(w, self.size)
        lead = 0
        if bullet:
            lead = max(1, round(h * 0.8)) + 2 * max(1, round(h * 0.8))
            if w <= lead:
                return 0
        ink, starts, last = self._strip(h, bold)
        off = int(starts[self._pick(starts.size)])
        wa = lead + int(last[off + w - lead - 1]) - off + 1
        left = x if align == "left" else x - wa if align == "right" else x - wa // 2
        left = min(max(0, left), self.size - 1 - lead)
        if left + wa > self.size:  # clipped at the page edge: keep the box tight
            wa = lead + int(last[off + self.size - left - lead - 1]) - off + 1
        if bullet:
            self._text[y:y + h, left:left + max(1, round(h * 0.8))] = True
        self._text[y:y + h, left + lead:left + wa] |= ink[:, off:off + wa - lead]
        self._mask[y:y + h, left:left + wa] = 255
        self._boxes.append((y, left, y + h, left + wa))
        return wa

    def paragraph(self, n: int, *, x: int | None = None, w: int | None = None,
                  indent: int = 0, last: tuple[float, float] = (0.3, 0.85)) -> int:
        """Write up to ``n`` ragged-right lines at the cursor, moving it; returns lines drawn."""
        x = self.x0 if x is None else x
        w = self.width if w is None else w
        drawn = 0
        for i in range(n):
            if not self.fits():
                break
            frac = self.rng.uniform(*last) if i == n - 1 else self.rng.uniform(0.88, 1.0)
            first = indent if i == 0 else 0
            self.line(x + first, None, max(1, round((w - first) * frac)))
            self.skip()
            drawn += 1
        return drawn

    # -- graphics ---------------------------------------------------------------------------

    def _paint(self, y: int, x: int, hh: int, ww: int, value: int) -> None:
        y0, x0 = max(0, y), max(0, x)
        y1, x1 = min(self.size, y + hh), min(self.size, x + ww)
        if y1 > y0 and x1 > x0:
            self._img[y0:y1, x0:x1] = value

    def hrule(self, y: int, x: int | None = None, w: int | None = None, t: int = 1) -> None:
        """A horizontal rule ``t`` pixels thick (default: across the text width)."""
        self._paint(y, self.x0 if x is None else x, t, self.width if w is None else w,
                    self.graphic)

    def vrule(self, x: int, y: int, hh: int, t: int = 1) -> None:
        """A vertical rule ``t`` pixels thick."""
        self._paint(y, x, hh, t, self.graphic)

    def rect(self, x: int, y: int, w: int, hh: int, t: int = 1) -> None:
        """The outline of a box (form fields, check boxes)."""
        self.hrule(y, x, w, t)
        self.hrule(y + hh - t, x, w, t)
        self.vrule(x, y, hh, t)
        self.vrule(x + w - t, y, hh, t)

    def fill(self, x: int, y: int, w: int, hh: int, *, dark: bool = False) -> None:
        """A shaded band (light) or a picture / logo block (``dark``)."""
        self._paint(y, x, hh, w, self.graphic if dark else self.shade)

    # -- result -----------------------------------------------------------------------------

    def render(self) -> Document:
        """Compose the layers: text ink over graphics over paper."""
        image = self._img.copy()
        image[self._text] = self.ink
        return Document(image=image, mask=self._mask.copy(), boxes=tuple(self._boxes))
