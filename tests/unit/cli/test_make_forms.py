"""``dpsynth datasets make-forms``: public synthetic KIE forms written locally."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from dpsynth_cli.main import app
from dpsynth_shared.documents.forms import make_forms, read_kie_document_set
from typer.testing import CliRunner

runner = CliRunner()


def test_make_forms_writes_the_generators_document_set(tmp_path: Path) -> None:
    out = tmp_path / "forms.json.gz"
    result = runner.invoke(app, ["datasets", "make-forms", str(out), "--count", "12",
                                 "--seed", "3", "--subjects", "4"])
    assert result.exit_code == 0, result.output
    assert "12 public synthetic forms" in result.output
    with gzip.open(out, "rt", encoding="utf-8") as fh:
        written = json.load(fh)
    assert written == make_forms(12, seed=3, subjects=4)
    assert read_kie_document_set(out) == written  # valid, bounded read
    assert all(d["subject"].startswith("owner-") for d in written["documents"])


def test_plain_json_is_the_same_forms(tmp_path: Path) -> None:
    out = tmp_path / "forms.json"
    result = runner.invoke(app, ["datasets", "make-forms", str(out), "--count", "5"])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc == make_forms(5, seed=0) and doc["format"] == "dpsynth-kie/1"
    assert "subject" not in doc["documents"][0]


def test_bad_counts_are_refused_and_help_says_public(tmp_path: Path) -> None:
    bad = runner.invoke(app, ["datasets", "make-forms", str(tmp_path / "x.json"),
                              "--count", "0"])
    assert bad.exit_code != 0 and not (tmp_path / "x.json").exists()
    result = runner.invoke(app, ["datasets", "make-forms", "--help"])
    assert result.exit_code == 0 and "PUBLIC" in result.output
