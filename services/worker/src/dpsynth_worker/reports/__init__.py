"""Rendering of evaluation reports: ``report.json`` (validated) and ``report.html``.

The HTML page is self-contained (inline CSS, ``data:`` PNGs, inline SVG, no JavaScript, no
external URL) so it can be served as an artifact and opened offline.
"""

from dpsynth_worker.reports.arrays import ClosestPair, ReportArrays
from dpsynth_worker.reports.html import render_html
from dpsynth_worker.reports.json_report import plain, render_json, validate

__all__ = ["ClosestPair", "ReportArrays", "plain", "render_html", "render_json", "validate"]
