"""``dpsynth datasets make-documents``: public synthetic documents written locally."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from dpsynth_cli.main import app
from dpsynth_shared.documents import generate_documents
from typer.testing import CliRunner

runner = CliRunner()


def test_make_documents_writes_the_canonical_file(tmp_path: Path) -> None:
    out = tmp_path / "docs.npz"
    result = runner.invoke(app, ["datasets", "make-documents", str(out), "--per-class", "3",
                                 "--size", "32", "--seed", "4", "--classes", "invoice,email"])
    assert result.exit_code == 0, result.output
    assert "6 public synthetic documents" in result.output
    images, masks, labels, names = generate_documents(3, size=32, seed=4,
                                                      classes=["invoice", "email"])
    with np.load(out, allow_pickle=False) as npz:
        assert npz["class_names"].tolist() == names == ["invoice", "email"]
        np.testing.assert_array_equal(npz["images"], images)
        np.testing.assert_array_equal(npz["masks"], masks)
        np.testing.assert_array_equal(npz["labels"], labels)


def test_make_documents_defaults_to_every_class_and_refuses_unknown_ones(
        tmp_path: Path) -> None:
    out = tmp_path / "all.npz"
    result = runner.invoke(app, ["datasets", "make-documents", str(out), "--per-class", "1",
                                 "--size", "16"])
    assert result.exit_code == 0, result.output
    with np.load(out, allow_pickle=False) as npz:
        assert len(npz["class_names"]) >= 8 and npz["images"].shape[1:] == (16, 16, 1)
    bad = runner.invoke(app, ["datasets", "make-documents", str(tmp_path / "x.npz"),
                              "--classes", "poem"])
    assert bad.exit_code != 0 and "poem" in bad.output
    assert not (tmp_path / "x.npz").exists()


def test_help_says_the_documents_are_public() -> None:
    result = runner.invoke(app, ["datasets", "--help"])
    assert "public synthetic documents" in result.output
    result = runner.invoke(app, ["datasets", "make-documents", "--help"])
    assert "PUBLIC" in result.output and "public pretraining" in result.output
