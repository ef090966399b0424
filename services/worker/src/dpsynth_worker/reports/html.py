"""The evaluation report as ONE self-contained HTML page.

No JavaScript and no external URL: inline CSS, images as ``data:`` PNGs, charts as inline
SVG. Every text from the document (class names, ids, notes) is HTML-escaped. Real images are
drawn only when the reference is public or the document says it contains private images
(``contains_private_images``): a private reference evaluated with
``include_private_images: false`` never shows a real image, whatever ``arrays`` carries.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from html import escape
from typing import Any

import numpy as np

from dpsynth_worker.reports.arrays import ClosestPair, ReportArrays
from dpsynth_worker.reports.dp_section import (
    EPSILON_NOTE,
    audit_block,
    dp_section,
    holdout_section,
    selection_section,
)
from dpsynth_worker.reports.images import montage, png_data_uri
from dpsynth_worker.reports.style import CSS
from dpsynth_worker.reports.svg import accuracy_bars, histogram, horizontal_bars, paired_bars

#: Pixel width of one displayed grid tile / pair image (the PNGs stay at native size).
_TILE_PX = 56
_GRID_COLUMNS = 5
_MAX_PAIRS = 16
_PAIR_PX = 84


def _num(value: object, digits: int = 4) -> str:
    if value is None:
        return '<span class="na">not computed</span>'
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return '<span class="na">n/a</span>'
        return f"{value:.{digits}g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.2e}"
    return escape(str(value))


def _get(mapping: Mapping[str, Any] | None, key: str) -> Any:
    return None if mapping is None else mapping.get(key)


def render_html(document: Mapping[str, Any], arrays: ReportArrays | None = None) -> str:
    """Render the report page.

    Args:
        document: the report document (the keys of
            :class:`dpsynth_shared.evaluation.EvaluationReport`).
        arrays: what the page draws besides the numbers (samples, closest pairs, per-image
            memorisation ratios); None draws the numbers only.

    Returns:
        The page (UTF-8 text).
    """
    show_real = (document.get("reference_visibility") == "public"
                 or bool(document.get("contains_private_images")))
    parts = [_header(document), holdout_section(document), dp_section(document),
             selection_section(document),
             _headline(document), _classifiers(document),
             _feature_network(document), _per_class(document), _memorisation(document, arrays)]
    if arrays is not None:
        parts += [_samples(document, arrays, show_real=show_real),
                  _pairs(document, arrays, show_real=show_real)]
    parts += [_notes(document), _settings(document)]
    title = f"Evaluation report — {document.get('corpus_artifact_id', '')}"
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{escape(title)}</title><style>{CSS}</style></head><body><main>"
            + "".join(p for p in parts if p)
            + f"<footer>dpsynth evaluation report v{escape(str(document.get('report_version')))}"
            f" · job <span class=\"mono\">{escape(str(document.get('job_id', '')))}</span>"
            "</footer></main></body></html>\n")


def _cards(items: Iterable[tuple[str, Any]]) -> str:
    return '<div class="cards">' + "".join(
        f'<div class="card"><div class="k">{escape(k)}</div><div class="v">{_num(v)}</div>'
        "</div>" for k, v in items) + "</div>"


def _header(doc: Mapping[str, Any]) -> str:
    private = doc.get("reference_visibility") == "private"
    if doc.get("non_dp") or private:
        what = ("contains private images" if doc.get("contains_private_images")
                else "computed from private data (no private images shown)")
        banner = (f'<div class="banner nondp">NON-DP — owner only — {escape(what)}<small>'
                  "These figures were computed from the private reference data outside any "
                  "differential-privacy mechanism. They are not covered by the corpus's privacy "
                  "guarantee: do not share this report beyond the data's owner.</small></div>")
    else:
        banner = ('<div class="banner public">Public reference data: this report reveals '
                  "nothing private.</div>")
    manifest: Mapping[str, Any] = doc.get("corpus_manifest") or {}
    ids = (f'corpus <span class="mono">{escape(str(doc.get("corpus_artifact_id")))}</span> · '
           f'generate job <span class="mono">{escape(str(doc.get("generate_job_id")))}</span>'
           f' · model <span class="mono">{escape(str(doc.get("model_id")))}</span> · '
           f'reference dataset <span class="mono">{escape(str(doc.get("dataset_id")))}</span> '
           f"({escape(str(doc.get('reference_visibility')))})")
    tight = manifest.get("dataset_tight_epsilon")
    tight_label = manifest.get("dataset_tight_epsilon_label")
    counts = manifest.get("counts") or {}
    job_label = manifest.get("job_epsilon_label")  # a composed lineage (issue 13, item 8)
    privacy = [("DP model", manifest.get("dp")),
               (f"job ε{f' ({job_label})' if job_label else ''}", manifest.get("job_epsilon")),
               ("δ", manifest.get("delta")),
               ("dataset ε spent (filter)", manifest.get("dataset_epsilon_spent")),
               (f"dataset ε, tight{f' ({tight_label})' if tight_label else ''}", tight),
               ("accountant", manifest.get("accountant")),
               ("sampler", manifest.get("sampler")), ("sampling steps", manifest.get("steps")),
               ("guidance", manifest.get("guidance_scale")), ("seed", manifest.get("seed")),
               ("images in corpus", sum(int(v) for v in counts.values()) if counts else None),
               ("earlier non-DP evaluations",
                len(manifest.get("non_dp_evaluations") or []) if manifest else None)]
    sizes: Mapping[str, Any] = doc.get("sizes") or {}
    size_cards = [(f"{k.replace('_', ' ')} images", v) for k, v in sizes.items()]
    return (f'<header class="top"><h1>Synthetic corpus evaluation</h1><div class="sub">{ids}'
            f"</div>{banner}<h3>Privacy of the corpus (from its manifest)</h3>"
            f"{_cards(privacy)}{EPSILON_NOTE}{audit_block(doc)}"
            f"<h3>Images compared</h3>{_cards(size_cards)}</header>")


def _headline(doc: Mapping[str, Any]) -> str:
    head: Mapping[str, Any] = doc.get("headline") or {}
    net = doc.get("feature_network") or {}
    arch = net.get("architecture") or "dpsynth feature network"
    rows: list[tuple[str, Any, str]] = []
    tstr: Mapping[str, Any] = head.get("tstr_accuracy") or {}
    real: Mapping[str, Any] = head.get("real_accuracy") or {}
    for name in dict.fromkeys([*tstr, *real]):
        rows.append((f"TSTR accuracy ({name})", tstr.get(name), "trained on synthetic, "
                     "tested on real held-out data"))
        rows.append((f"real-data accuracy ({name})", real.get(name), "the same classifier "
                     "trained on the real training data"))
    rows += [
        (f"FD ({arch} features, not Inception FID)", head.get("fd_dpsynth"),
         "Fréchet distance, synthetic vs real held-out, lower is better"),
        (f"FD floor ({arch} features): real train vs held-out",
         head.get("fd_dpsynth_real_train"), "what sampling noise alone gives"),
        ("Inception FID (pytorch-fid InceptionV3)", head.get("inception_fid"),
         "only with the pinned weights on the worker"),
        ("precision (k-NN manifold)", head.get("precision"), "synthetic images that look real"),
        ("recall (k-NN manifold)", head.get("recall"), "real images the corpus covers"),
        ("density", head.get("density"), "≈1 when synthetic images sit like real ones"),
        ("coverage", head.get("coverage"), "real neighbourhoods holding a synthetic image"),
        ("memorisation: flagged images", head.get("memorisation_flagged"),
         "much closer to a training image than to any held-out one, or exact copies"),
        ("memorisation: share closer to training", head.get("memorisation_fraction_closer_to"
                                                             "_train"),
         "≈ 0.5·(1 + training share) when nothing is memorised"),
    ]
    body = "".join(f'<tr class="headline"><td>{escape(name)}</td><td class="num">{_num(v)}'
                   f'</td><td class="sub">{escape(why)}</td></tr>' for name, v, why in rows)
    return ("<section><h2>Headline metrics</h2><table><thead><tr><th>metric</th>"
            f"<th>value</th><th>meaning</th></tr></thead><tbody>{body}</tbody></table>"
            "</section>")


def _classifiers(doc: Mapping[str, Any]) -> str:
    scores: Sequence[Mapping[str, Any]] = doc.get("classifiers") or []
    if not scores:
        return ""
    names = list(dict.fromkeys(str(s.get("classifier")) for s in scores))

    def acc(name: str, on: str) -> float | None:
        for s in scores:
            if s.get("classifier") == name and s.get("train_on") == on:
                return float(s["accuracy"]) if s.get("accuracy") is not None else None
        return None

    chance = next((float(s["chance"]) for s in scores if s.get("chance") is not None), None)
    chart = accuracy_bars(names, [acc(n, "synthetic") for n in names],
                          [acc(n, "real") for n in names], chance=chance)
    rows = "".join(
        f"<tr><td>{escape(str(s.get('classifier')))}</td><td>{escape(str(s.get('train_on')))}"
        f'</td><td class="num">{_num(s.get("accuracy"))}</td><td class="num">'
        f'{_num(s.get("train_size"))}</td><td class="num">{_num(s.get("test_size"))}</td>'
        f'<td class="num">{_num(s.get("chance"))}</td></tr>' for s in scores)
    return ("<section><h2>Downstream classifiers (train on synthetic, test on real)</h2>"
            '<p class="sub">Hyperparameters are fixed in the code and never tuned on the '
            f'test data.</p><div class="charts">{chart}<table style="flex:1;min-width:380px">'
            "<thead><tr><th>classifier</th><th>trained on</th><th>accuracy</th>"
            "<th>train size</th><th>test size</th><th>chance</th></tr></thead>"
            f"<tbody>{rows}</tbody></table></div></section>")


def _feature_network(doc: Mapping[str, Any]) -> str:
    net = doc.get("feature_network")
    if not net:
        return ("<section><h2>Feature network</h2><p class=\"sub\">No feature network was "
                "given: the Fréchet distance, precision/recall, density/coverage and the "
                "feature-space memorisation check were not computed.</p></section>")
    passed = net.get("passed")
    tag = ('<span class="tag ok">accuracy check passed</span>' if passed
           else '<span class="tag bad">accuracy check failed</span>')
    return (f"<section><h2>Feature network {tag}</h2>" + _cards([
        ("model", net.get("model_id")), ("architecture", net.get("architecture")),
        ("trained on public dataset", net.get("dataset_id")),
        ("accuracy (re-measured)", net.get("accuracy")),
        ("accuracy (recorded)", net.get("recorded_accuracy")),
        ("threshold", net.get("threshold")), ("validation images", net.get("validation_size"))])
        + f'<p class="sub">weights sha256 <span class="mono">{escape(str(net.get("sha256")))}'
        "</span></p></section>")


def _per_class(doc: Mapping[str, Any]) -> str:
    per_class: Mapping[str, Mapping[str, Any]] = doc.get("per_class") or {}
    if not per_class:
        return ""
    keys = list(dict.fromkeys(k for row in per_class.values() for k in row))
    labels = list(per_class)

    def column(key: str) -> list[float]:
        return [_float(per_class[c].get(key)) for c in labels]

    charts = []
    for key in keys:  # per classifier: recall trained on synthetic beside trained on real
        if key.startswith("tstr_recall_"):
            kind = key.removeprefix("tstr_recall_")
            charts.append(paired_bars(labels, column(key), column(f"real_recall_{kind}"),
                                      title=f"per-class recall on real held-out data ({kind})"))
    for key in keys:
        values = column(key)
        if key.startswith(("tstr_", "real_")) or not any(math.isfinite(v) for v in values):
            continue
        bounded = any(word in key for word in ("recall", "accuracy", "precision", "coverage"))
        if bounded or key.startswith("fd"):
            charts.append(horizontal_bars(labels, values, title=key.replace("_", " "),
                                          maximum=1.0 if bounded else None))
    head = "".join(f"<th>{escape(k.replace('_', ' '))}</th>" for k in keys)
    rows = "".join(f"<tr><td>{escape(c)}</td>" + "".join(
        f'<td class="num">{_num(per_class[c].get(k))}</td>' for k in keys) + "</tr>"
        for c in labels)
    return (f'<section><h2>Per class</h2><div class="charts">{"".join(charts)}</div>'
            f"<table><thead><tr><th>class</th>{head}</tr></thead><tbody>{rows}</tbody>"
            "</table></section>")


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _memorisation(doc: Mapping[str, Any], arrays: ReportArrays | None) -> str:
    checks: Sequence[Mapping[str, Any]] = doc.get("memorisation") or []
    if not checks:
        return ""
    rows = "".join(
        f"<tr><td>{escape(str(m.get('space')))}</td><td class=\"num\">{_num(m.get('synthetic'))}"
        f'</td><td class="num">{_num(m.get("flagged"))}</td><td class="num">'
        f'{_num(m.get("exact_copies"))}</td><td class="num">{_num(m.get("threshold"))}</td>'
        f'<td class="num">{_num(m.get("fraction_closer_to_train"))}</td><td class="num">'
        f'{_num(m.get("median_ratio"))}</td></tr>' for m in checks)
    charts = []
    ratios = arrays.ratios if arrays is not None else {}
    for m in checks:
        space = str(m.get("space"))
        if space in ratios and np.asarray(ratios[space]).size:
            charts.append(histogram(np.asarray(ratios[space]), threshold=_opt(m.get("threshold")),
                                    title=f"memorisation ratio ({space} space)"))
    return ("<section><h2>Memorisation</h2><p class=\"sub\">For each synthetic image, the "
            "distance to its nearest training image divided by the distance to its nearest "
            "held-out image. Generalising models give ratios around 1; copies of training "
            "images fall far left of the threshold.</p><table><thead><tr><th>space</th>"
            "<th>synthetic</th><th>flagged</th><th>exact copies</th><th>threshold</th>"
            "<th>share closer to training</th><th>median ratio</th></tr></thead>"
            f'<tbody>{rows}</tbody></table><div class="charts">{"".join(charts)}</div>'
            "</section>")


def _opt(value: Any) -> float | None:
    return None if value is None else float(value)


def _grid(images: np.ndarray, caption: str, *, columns: int) -> str:
    tile = montage(images, columns=columns)
    width = int(tile.shape[1] * _TILE_PX / max(1, images.shape[2] + 2))
    return (f'<figure><img class="px" src="{png_data_uri(tile)}" width="{width}" '
            f'alt="{escape(caption)}"><figcaption>{escape(caption)}</figcaption></figure>')


def _samples(doc: Mapping[str, Any], arrays: ReportArrays, *, show_real: bool) -> str:
    blocks = []
    n = arrays.samples_per_class
    for idx, name in enumerate(arrays.class_names):
        synthetic = arrays.synthetic_images[np.asarray(arrays.synthetic_labels) == idx][:n]
        figs = []
        if len(synthetic):
            figs.append(_grid(synthetic, f"synthetic · {len(synthetic)} shown",
                              columns=_GRID_COLUMNS))
        else:
            figs.append('<p class="na">no synthetic image of this class</p>')
        if show_real and arrays.real_images is not None and arrays.real_labels is not None:
            real = arrays.real_images[np.asarray(arrays.real_labels) == idx][:n]
            if len(real):
                figs.append(_grid(real, f"real held-out · {len(real)} shown",
                                  columns=_GRID_COLUMNS))
        blocks.append(f"<div><h3>{escape(name)}</h3>{''.join(figs)}</div>")
    note = ("" if show_real else '<p class="sub">Real images are not shown '
            "(include_private_images is false).</p>")
    return (f'<section><h2>Samples per class</h2>{note}<div class="grid">{"".join(blocks)}'
            "</div></section>")


def _pair(pair: ClosestPair, arrays: ReportArrays, *, show_real: bool) -> str:
    synthetic = png_data_uri(arrays.synthetic_images[pair.synthetic_index])
    img = (f'<img class="px" src="{{}}" width="{_PAIR_PX}" height="{_PAIR_PX}" alt="{{}}">')
    right = ('<div class="withheld">training image not shown</div>')
    if show_real and arrays.train_images is not None and pair.train_index is not None:
        right = img.format(png_data_uri(arrays.train_images[pair.train_index]),
                           "nearest training image")
    ratio = pair.d_train / pair.d_holdout if pair.d_holdout > 0 else math.inf
    flagged = pair.flagged
    return (f'<div class="pair{" flag" if flagged else ""}"><div class="imgs">'
            f"<div>{img.format(synthetic, 'synthetic image')}<br>synthetic</div>"
            f"<div>{right}<br>training</div></div><div class=\"sub\">"
            f"{escape(pair.class_name)} · {escape(pair.space)}<br>d<sub>train</sub> "
            f"{_num(pair.d_train)} · d<sub>held-out</sub> {_num(pair.d_holdout)}<br>ratio "
            f"{_num(ratio)}{' · <strong>flagged</strong>' if flagged else ''}</div></div>")


def _pairs(doc: Mapping[str, Any], arrays: ReportArrays, *, show_real: bool) -> str:
    if not arrays.closest_pairs:
        return ""
    shown: list[ClosestPair] = []
    seen: set[tuple[int, int | None]] = set()
    # pixel-space pairs first (what a person sees as a copy), then feature-space ones
    for pair in sorted(arrays.closest_pairs, key=lambda p: p.space != "pixel"):
        if (pair.synthetic_index, pair.train_index) not in seen and len(shown) < _MAX_PAIRS:
            seen.add((pair.synthetic_index, pair.train_index))
            shown.append(pair)
    pairs = "".join(_pair(p, arrays, show_real=show_real) for p in shown)
    return ("<section><h2>Closest synthetic / training pairs</h2><p class=\"sub\">The "
            "synthetic images nearest to a training image, each beside that image, with the "
            f'distances to the nearest training and held-out images.</p><div class="pairs">'
            f"{pairs}</div></section>")


def _notes(doc: Mapping[str, Any]) -> str:
    notes: Sequence[Any] = doc.get("notes") or []
    if not notes:
        return ""
    items = "".join(f"<li>{escape(str(n))}</li>" for n in notes)
    return f'<section><h2>Notes</h2><ul class="notes">{items}</ul></section>'


def _settings(doc: Mapping[str, Any]) -> str:
    settings = doc.get("settings") or {}
    text = json.dumps(settings, indent=2, sort_keys=True, default=str)
    return ("<section><h2>Settings</h2><details><summary>the job's spec and the fixed "
            f"classifier hyperparameters</summary><pre>{escape(text)}</pre></details>"
            "</section>")
