"""``dpsynth models show`` labels a composed job_epsilon (issue 13, item 8) and
``dpsynth datasets upload --on-duplicate`` reaches the metadata (item 4)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from dpsynth_cli.main import app
from dpsynth_cli.views import model_privacy_lines
from dpsynth_shared.ledger_contract import LINEAGE_LABEL
from typer.testing import CliRunner

from tests.unit.cli.fake_api import FakeApi

runner = CliRunner()
MODEL = {"model_id": "mdl_2", "dp": True, "job_ids": ["job_1", "job_2"], "job_epsilon": 1.2,
         "job_epsilon_label": LINEAGE_LABEL, "dataset_epsilon_spent": 2.6, "delta": 1e-6}


def test_models_show_labels_a_lineage_epsilon_beside_the_filter_figure(api: FakeApi) -> None:
    api.route("GET", "/v1/models/mdl_2", MODEL)
    result = runner.invoke(app, ["models", "show", "mdl_2", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["job_epsilon_label"] == LINEAGE_LABEL  # stdout: JSON
    assert "job epsilon: 1.2000  (PLD composition" in result.stderr
    assert "not a guarantee under adaptive use" in result.stderr
    assert "spent (RDP filter) when trained: 2.6000  (the guarantee" in result.stderr


def test_model_privacy_lines() -> None:
    rows = dict(model_privacy_lines(MODEL))
    assert rows["job epsilon"].endswith(f"({LINEAGE_LABEL})")
    alone = dict(model_privacy_lines({**MODEL, "job_ids": ["job_2"],
                                      "job_epsilon_label": None}))
    assert alone["job epsilon"] == "1.2000"
    assert model_privacy_lines({"dp": False, "job_epsilon": None}) == []


def test_upload_on_duplicate_reaches_the_metadata(api: FakeApi, tmp_path: Path) -> None:
    captured: dict[str, bytes] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        captured["body"] = request.content
        return httpx.Response(201, json={"dataset_id": "ds_2"})

    api.route("POST", "/v1/datasets", handler)
    data = tmp_path / "d.npz"
    data.write_bytes(b"x")
    base = ["datasets", "upload", str(data), "--name", "n", "--visibility", "public"]
    result = runner.invoke(app, [*base, "--on-duplicate", "deduplicate"])
    assert result.exit_code == 0, result.output
    assert b'"on_duplicate": "deduplicate"' in captured["body"]
    result = runner.invoke(app, base)
    assert result.exit_code == 0 and b"on_duplicate" not in captured["body"]
    result = runner.invoke(app, [*base, "--on-duplicate", "merge"])
    assert result.exit_code != 0 and "refuse or deduplicate" in result.output
