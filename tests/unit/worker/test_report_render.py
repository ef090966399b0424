"""The evaluation report renderer: a valid JSON document and one self-contained HTML page."""

from __future__ import annotations

import base64
import io
import json
import re
from html.parser import HTMLParser
from typing import Any

import numpy as np
import pytest
from dpsynth_worker.reports import ClosestPair, ReportArrays, render_html, render_json
from PIL import Image
from pydantic import ValidationError

CLASSES = ["cat <b>", "dog & co", "bird"]
SYNTHETIC_VALUE, REAL_VALUE, TRAIN_VALUE = 200, 77, 33


def _document(*, visibility: str = "private", private_images: bool = True) -> dict[str, Any]:
    return {
        "report_version": 1, "job_id": "job_eval", "corpus_artifact_id": "art_corpus",
        "generate_job_id": "job_gen", "model_id": "mdl_1", "dataset_id": "ds_ref",
        "reference_visibility": visibility, "non_dp": visibility == "private",
        "contains_private_images": private_images and visibility == "private",
        "corpus_manifest": {"dp": True, "job_epsilon": 1.0, "delta": 1e-5,
                            "dataset_epsilon_spent": 2.5, "dataset_tight_epsilon": 1.7,
                            "dataset_tight_epsilon_label": "PLD", "accountant": "rdp",
                            "sampler": "ddim", "steps": 50, "guidance_scale": 2.0, "seed": 1,
                            "counts": dict.fromkeys(CLASSES, 6), "non_dp_evaluations": []},
        "sizes": {"synthetic": 18, "real_train": 30, "real_holdout": 12},
        "headline": {"tstr_accuracy": {"cnn": 0.61, "logreg": 0.55},
                     "real_accuracy": {"cnn": 0.9, "logreg": 0.8}, "fd_dpsynth": 12.5,
                     "fd_dpsynth_real_train": 1.25, "precision": 0.7, "recall": float("nan"),
                     "memorisation_flagged": 1,
                     "memorisation_fraction_closer_to_train": 0.6},
        "classifiers": [
            {"classifier": c, "train_on": on, "accuracy": acc, "train_size": 18,
             "test_size": 12, "chance": 1 / 3}
            for c, on, acc in [("cnn", "synthetic", 0.61), ("cnn", "real", 0.9),
                               ("logreg", "synthetic", 0.55), ("logreg", "real", 0.8)]],
        "feature_network": {"model_id": "mdl_feat", "architecture": "dpsynth-featnet-v1",
                            "sha256": "ab" * 32, "dataset_id": "ds_pub", "accuracy": 0.93,
                            "recorded_accuracy": 0.94, "validation_size": 40,
                            "threshold": 0.5, "passed": True},
        "per_class": {c: {"synthetic": 6, "tstr_recall_cnn": 0.5, "fd_dpsynth": 3.0}
                      for c in CLASSES},
        "memorisation": [{"space": "pixel", "synthetic": 18, "flagged": 1, "threshold": 0.5,
                          "exact_copies": 1, "fraction_closer_to_train": 0.6,
                          "median_ratio": 0.98}],
        "notes": ["note with <script>alert(1)</script> inside"],
        "settings": {"classifiers": ["cnn", "logreg"], "odd": "</pre><script>x</script>"},
    }


def _arrays(*, with_real: bool = True) -> ReportArrays:
    labels = np.repeat(np.arange(3), 6)
    synthetic = np.full((18, 8, 8, 1), SYNTHETIC_VALUE, dtype=np.uint8)
    real = np.full((12, 8, 8, 1), REAL_VALUE, dtype=np.uint8)
    train = np.full((30, 8, 8, 1), TRAIN_VALUE, dtype=np.uint8)
    pairs = [ClosestPair(synthetic_index=i, train_index=i, class_name=CLASSES[labels[i]],
                         space="pixel", d_train=0.1 * i, d_holdout=1.0, flagged=i == 0)
             for i in range(3)]
    return ReportArrays(class_names=CLASSES, synthetic_images=synthetic,
                        synthetic_labels=labels,
                        real_images=real if with_real else None,
                        real_labels=np.repeat(np.arange(3), 4) if with_real else None,
                        train_images=train if with_real else None, closest_pairs=pairs,
                        ratios={"pixel": np.linspace(0.0, 2.0, 18)}, samples_per_class=4)


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.urls: list[str] = []
        self.sections: list[str] = []
        self._in_h2 = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self._in_h2 = tag == "h2"
        for name, value in attrs:
            if name in ("src", "href", "xlink:href") and value:
                self.urls.append(value)

    def handle_endtag(self, tag: str) -> None:
        if tag == "h2":
            self._in_h2 = False

    def handle_data(self, data: str) -> None:
        if self._in_h2:
            self.sections.append(data.strip())


def _pixel_values(html: str) -> set[int]:
    values: set[int] = set()
    for b64 in re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", html):
        image = np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))))
        values |= {int(v) for v in np.unique(image)}
    return values


def test_json_is_validated_strict_and_keeps_the_document() -> None:
    data = json.loads(render_json(_document()))
    assert data["headline"]["fd_dpsynth"] == 12.5
    assert data["headline"]["recall"] is None  # NaN is not JSON: null
    assert data["feature_network"]["architecture"] == "dpsynth-featnet-v1"
    assert data["memorisation"][0]["flagged"] == 1
    bad = _document()
    bad["reference_visibility"] = "secret"
    with pytest.raises(ValidationError):
        render_json(bad)


def test_html_is_one_self_contained_page_with_every_section() -> None:
    html = render_html(_document(), _arrays())
    parser = _Collector()
    parser.feed(html)
    assert "script" not in parser.tags and "<script" not in html.lower()
    assert "link" not in parser.tags and "iframe" not in parser.tags
    assert all(url.startswith("data:image/png;base64,") for url in parser.urls)
    assert not re.search(r"(?:https?:)?//(?!www\.w3\.org/2000/svg)", html)
    assert parser.tags.count("svg") >= 3  # classifiers, per class, memorisation histogram
    for heading in ("Headline metrics", "Downstream classifiers", "Per class",
                    "Memorisation", "Samples per class", "Closest synthetic / training pairs",
                    "Notes", "Settings"):
        assert any(s.startswith(heading) for s in parser.sections), heading
    assert "FD (dpsynth-featnet-v1 features, not Inception FID)" in html
    assert "NON-DP — owner only — contains private images" in html
    assert "threshold 0.50" in html
    assert "docs/epsilons.md" in html  # which epsilon is the guarantee (issue 15, item 4)


def test_html_escapes_every_user_text() -> None:
    html = render_html(_document(), _arrays())
    assert "<b>" not in html and "cat &lt;b&gt;" in html
    assert "dog &amp; co" in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "</pre><script>" not in html


def test_private_images_are_shown_only_when_allowed() -> None:
    shown = _pixel_values(render_html(_document(), _arrays()))
    assert {SYNTHETIC_VALUE, REAL_VALUE, TRAIN_VALUE} <= shown
    # include_private_images false: arrays still carrying real images must not leak them
    html = render_html(_document(private_images=False), _arrays())
    values = _pixel_values(html)
    assert SYNTHETIC_VALUE in values
    assert REAL_VALUE not in values and TRAIN_VALUE not in values
    assert "contains private images" not in html
    assert "NON-DP — owner only" in html and "training image not shown" in html


def test_public_reference_shows_real_images_without_the_non_dp_banner() -> None:
    html = render_html(_document(visibility="public"), _arrays())
    assert REAL_VALUE in _pixel_values(html)
    assert "NON-DP" not in html and "Public reference data" in html


def test_numbers_only_page_without_arrays_and_missing_metrics() -> None:
    doc = _document(visibility="public")
    doc.update(feature_network=None, memorisation=[], per_class={}, classifiers=[])
    doc["headline"] = {"tstr_accuracy": {"cnn": 0.5}, "real_accuracy": {}}
    html = render_html(doc, None)
    assert "No feature network was given" in html
    assert html.count("not computed") >= 5
    assert "data:image" not in html
    assert ">nan<" not in html.lower() and ">inf<" not in html.lower()


def test_a_held_out_caveat_leads_the_page_before_the_headline() -> None:
    caveat = ("the held-out records were not checked against what uploaded model mdl_x was "
              "trained on")
    html = render_html({**_document(), "holdout_caveat": caveat}, _arrays())
    assert "HELD-OUT NOT VERIFIED" in html and caveat in html
    assert html.index("HELD-OUT NOT VERIFIED") < html.index("Headline metrics")
    assert "HELD-OUT NOT VERIFIED" not in render_html(_document(), _arrays())
    assert json.loads(render_json({**_document(), "holdout_caveat": caveat}))[
        "holdout_caveat"] == caveat
