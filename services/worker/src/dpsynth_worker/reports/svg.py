"""Inline SVG charts for the evaluation report, drawn by hand (no JavaScript, no library).

Each function returns one ``<svg>`` element as a string. Every text that reaches the markup
goes through :func:`html.escape`: class names come from users.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

import numpy as np

#: The report's palette: synthetic data, real data, chance / thresholds.
SYNTHETIC = "#3b6fb6"
REAL = "#8a8f98"
ACCENT = "#c0392b"
_FONT = 'font-family="system-ui, -apple-system, Segoe UI, sans-serif"'


def _svg(width: int, height: int, body: list[str], label: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(label)}" '
            f'{_FONT} font-size="12">' + "".join(body) + "</svg>")


def _text(x: float, y: float, text: str, *, anchor: str = "middle", size: int = 12,
          fill: str = "#333", extra: str = "") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-size="{size}" '
            f'fill="{fill}" {extra}>{escape(text)}</text>')


def _fmt(value: float) -> str:
    return "n/a" if not math.isfinite(value) else f"{value:.3f}"


def accuracy_bars(groups: Sequence[str], synthetic: Sequence[float | None],
                  real: Sequence[float | None], *, chance: float | None = None) -> str:
    """Grouped vertical bars on a 0..1 axis: per classifier, trained on synthetic vs real.

    Args:
        groups: the classifier names.
        synthetic: accuracy when trained on synthetic data (None: not computed).
        real: accuracy when trained on the real training data (None: not computed).
        chance: drawn as a dashed line (1 / classes).
    """
    left, top, plot_h, bar_w, gap = 48, 28, 200, 34, 36
    width = left + max(1, len(groups)) * (2 * bar_w + gap) + 20
    height = top + plot_h + 44
    body = [_text(left, 16, "accuracy on real held-out data", anchor="start", size=12,
                  fill="#555")]
    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        y = top + plot_h * (1 - tick)
        body.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - 10}" y2="{y:.1f}" '
                    'stroke="#e3e6ea" stroke-width="1"/>')
        body.append(_text(left - 6, y + 4, f"{tick:.2f}", anchor="end", size=10, fill="#777"))
    for i, name in enumerate(groups):
        x0 = left + gap / 2 + i * (2 * bar_w + gap)
        for j, (value, colour, who) in enumerate(((synthetic[i], SYNTHETIC, "synthetic"),
                                                  (real[i], REAL, "real"))):
            x = x0 + j * bar_w
            if value is None or not math.isfinite(value):
                body.append(_text(x + bar_w / 2 - 1, top + plot_h - 4, "n/a", size=10,
                                  fill="#999"))
                continue
            v = min(max(value, 0.0), 1.0)
            h = plot_h * v
            body.append(f'<rect x="{x:.1f}" y="{top + plot_h - h:.1f}" width="{bar_w - 2}" '
                        f'height="{h:.1f}" fill="{colour}" rx="2"><title>{escape(name)} '
                        f'trained on {who}: {_fmt(value)}</title></rect>')
            body.append(_text(x + bar_w / 2 - 1, top + plot_h - h - 4, f"{value:.2f}",
                              size=10, fill="#333"))
        body.append(_text(x0 + bar_w, top + plot_h + 16, name, size=12))
    if chance is not None:
        y = top + plot_h * (1 - chance)
        body.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - 10}" y2="{y:.1f}" '
                    f'stroke="{ACCENT}" stroke-dasharray="5,4" stroke-width="1.5"/>')
        body.append(_text(width - 12, y - 4, f"chance {chance:.2f}", anchor="end", size=10,
                          fill=ACCENT))
    legend_y = top + plot_h + 36
    body += [f'<rect x="{left}" y="{legend_y - 9}" width="10" height="10" fill="{SYNTHETIC}"/>',
             _text(left + 14, legend_y, "trained on synthetic", anchor="start", size=11),
             f'<rect x="{left + 150}" y="{legend_y - 9}" width="10" height="10" '
             f'fill="{REAL}"/>',
             _text(left + 164, legend_y, "trained on real", anchor="start", size=11)]
    return _svg(int(max(width, 330)), height, body, "classifier accuracy, synthetic vs real")


def horizontal_bars(labels: Sequence[str], values: Sequence[float], *, title: str,
                    maximum: float | None = None, colour: str = SYNTHETIC) -> str:
    """One horizontal bar per label (per-class figures); the axis runs 0..``maximum``."""
    finite = [v for v in values if math.isfinite(v)]
    top_value = maximum if maximum is not None else max(finite, default=1.0) or 1.0
    label_w, plot_w, row = 130, 270, 20
    width, height = label_w + plot_w + 70, 30 + row * len(labels) + 6
    body = [_text(0, 16, title, anchor="start", size=12, fill="#555")]
    for i, (label, value) in enumerate(zip(labels, values, strict=True)):
        y = 26 + i * row
        short = label if len(label) <= 22 else label[:21] + "…"
        body.append(_text(label_w - 8, y + 13, short, anchor="end", size=11))
        body.append(f'<rect x="{label_w}" y="{y + 3}" width="{plot_w}" height="{row - 6}" '
                    'fill="#f1f3f5" rx="2"/>')
        if not math.isfinite(value):
            body.append(_text(label_w + 6, y + 13, "n/a", anchor="start", size=10, fill="#999"))
            continue
        w = plot_w * min(max(value / top_value, 0.0), 1.0)
        body.append(f'<rect x="{label_w}" y="{y + 3}" width="{w:.1f}" height="{row - 6}" '
                    f'fill="{colour}" rx="2"><title>{escape(label)}: {_fmt(value)}</title>'
                    '</rect>')
        body.append(_text(label_w + plot_w + 6, y + 13, _fmt(value), anchor="start", size=10))
    return _svg(width, height, body, title)


def histogram(values: np.ndarray, *, threshold: float | None, title: str,
              bins: int = 30) -> str:
    """A histogram of ``values`` (the memorisation ratio d_train / d_holdout) with the
    threshold drawn as a vertical line; values are clipped to [0, max(2, threshold·1.5)]."""
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    upper = max(2.0, (threshold or 0.0) * 1.5)
    counts, edges = np.histogram(np.clip(values, 0.0, upper), bins=bins, range=(0.0, upper))
    left, top, plot_w, plot_h = 44, 26, 420, 170
    width, height = left + plot_w + 20, top + plot_h + 40
    peak = int(counts.max()) if counts.size and counts.max() > 0 else 1
    body = [_text(left, 16, title, anchor="start", size=12, fill="#555")]
    bar_w = plot_w / bins
    for i, count in enumerate(counts.tolist()):
        h = plot_h * count / peak
        x = left + i * bar_w
        colour = ACCENT if threshold is not None and edges[i + 1] <= threshold else SYNTHETIC
        body.append(f'<rect x="{x:.1f}" y="{top + plot_h - h:.1f}" width="{bar_w - 1:.1f}" '
                    f'height="{h:.1f}" fill="{colour}"><title>{edges[i]:.2f}–{edges[i + 1]:.2f}'
                    f': {count}</title></rect>')
    body.append(f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" '
                f'y2="{top + plot_h}" stroke="#999"/>')
    for tick in np.linspace(0.0, upper, 5):
        x = left + plot_w * tick / upper
        body.append(_text(x, top + plot_h + 14, f"{tick:.1f}", size=10, fill="#777"))
    body.append(_text(left - 6, top + 8, str(peak), anchor="end", size=10, fill="#777"))
    body.append(_text(left - 6, top + plot_h, "0", anchor="end", size=10, fill="#777"))
    body.append(_text(left + plot_w / 2, top + plot_h + 32,
                      "d(nearest training image) / d(nearest held-out image)", size=11))
    if threshold is not None:
        x = left + plot_w * min(threshold, upper) / upper
        body.append(f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{top + plot_h}" '
                    f'stroke="{ACCENT}" stroke-width="2" stroke-dasharray="4,3"/>')
        body.append(_text(x + 4, top + 6, f"threshold {threshold:.2f}", anchor="start",
                          size=10, fill=ACCENT))
    x1 = left + plot_w * 1.0 / upper
    body.append(f'<line x1="{x1:.1f}" y1="{top}" x2="{x1:.1f}" y2="{top + plot_h}" '
                'stroke="#555" stroke-width="1" stroke-dasharray="2,3"/>')
    return _svg(width, height, body, title)


def paired_bars(labels: Sequence[str], first: Sequence[float], second: Sequence[float], *,
                title: str, names: tuple[str, str] = ("trained on synthetic",
                                                       "trained on real")) -> str:
    """Two horizontal bars per label on a 0..1 axis (per-class recall of a classifier
    trained on synthetic data, beside the same classifier trained on real data)."""
    label_w, plot_w, row = 130, 270, 26
    width, height = label_w + plot_w + 70, 48 + row * len(labels)
    body = [_text(0, 16, title, anchor="start", size=12, fill="#555"),
            f'<rect x="{label_w}" y="24" width="10" height="10" fill="{SYNTHETIC}"/>',
            _text(label_w + 14, 33, names[0], anchor="start", size=11),
            f'<rect x="{label_w + 140}" y="24" width="10" height="10" fill="{REAL}"/>',
            _text(label_w + 154, 33, names[1], anchor="start", size=11)]
    for i, label in enumerate(labels):
        y = 42 + i * row
        short = label if len(label) <= 22 else label[:21] + "…"
        body.append(_text(label_w - 8, y + 15, short, anchor="end", size=11))
        for j, (value, colour) in enumerate(((first[i], SYNTHETIC), (second[i], REAL))):
            top = y + 3 + j * 10
            body.append(f'<rect x="{label_w}" y="{top}" width="{plot_w}" height="9" '
                        'fill="#f1f3f5"/>')
            if not math.isfinite(value):
                continue
            w = plot_w * min(max(value, 0.0), 1.0)
            body.append(f'<rect x="{label_w}" y="{top}" width="{w:.1f}" height="9" '
                        f'fill="{colour}"><title>{escape(label)}, {names[j]}: {_fmt(value)}'
                        "</title></rect>")
            body.append(_text(label_w + plot_w + 6, top + 8, _fmt(value), anchor="start",
                              size=9))
    return _svg(width, height, body, title)
