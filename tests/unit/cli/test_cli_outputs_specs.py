"""``jobs submit FILE --set KEY=VALUE``: dotted keys reach nested fields, values keep their
YAML type, a malformed pair is refused before any request (issue 15, item 1)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import typer
from dpsynth_cli.main import app
from dpsynth_cli.specs import apply_overrides, parse_override
from typer.testing import CliRunner

from tests.unit.cli.fake_api import FakeApi, job_body, use_fake_api

runner = CliRunner()
RECIPE = """name: digits-dp-finetune
type: finetune
dataset_id: ds_SET_WITH_--set_dataset_id
base_model_id: mdl_SET_WITH_--set_base_model_id
privacy:
  target_epsilon: 4.0
training:
  epochs: 5
"""


def test_dotted_keys_nest_and_values_keep_their_type() -> None:
    spec = {"type": "finetune", "privacy": {"target_epsilon": 4.0, "max_grad_norm": 1.0}}
    out = apply_overrides(spec, ["privacy.target_epsilon=2", "dataset_id=ds_1",
                                 "training.class_conditional=true", "training.lr=1e-4",
                                 "name=run 3", "seed=0", "note=", "dataset_id=ds_2"])
    assert out == {"type": "finetune", "dataset_id": "ds_2", "name": "run 3", "seed": 0,
                   "note": "", "privacy": {"target_epsilon": 2, "max_grad_norm": 1.0},
                   "training": {"class_conditional": True, "lr": 1e-4}}
    assert spec["privacy"]["target_epsilon"] == 4.0  # the file's spec is not changed
    assert parse_override("a=b=c") == (["a"], "b=c")


@pytest.mark.parametrize("pair", ["dataset_id", "=3", "privacy..target_epsilon=2", "x=[1, 2]",
                                  "x={a: 1}"])
def test_a_malformed_pair_is_refused(pair: str) -> None:
    with pytest.raises(typer.BadParameter):
        parse_override(pair)
    with pytest.raises(typer.BadParameter, match="not a mapping"):
        apply_overrides({"privacy": 2}, ["privacy.target_epsilon=2"])


@pytest.fixture()
def api(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    fake = use_fake_api(monkeypatch)
    fake.route("POST", "/v1/jobs", lambda r: httpx.Response(201, json=job_body(
        "job_1", "finetune", spec=json.loads(r.content))))
    return fake


def test_submit_sends_the_recipe_with_the_overrides(api: FakeApi, tmp_path: Path) -> None:
    recipe = tmp_path / "finetune.yaml"
    recipe.write_text(RECIPE)
    args = ["jobs", "submit", str(recipe), "--set", "dataset_id=ds_p", "--set",
            "base_model_id=mdl_b", "--set", "privacy.target_epsilon=2"]
    for extra in ([], ["--dry-run"]):
        result = runner.invoke(app, [*args, *extra, "--json"])
        assert result.exit_code == 0, result.output
        post = next(r for r in reversed(api.requests) if r.method == "POST")
        sent = json.loads(post.content)
        assert sent["dataset_id"] == "ds_p" and sent["base_model_id"] == "mdl_b"
        assert sent["privacy"] == {"target_epsilon": 2} and sent["training"] == {"epochs": 5}
    assert post.url.params.get("dry_run") == "true"
    sent_before = len(api.requests)
    result = runner.invoke(app, ["jobs", "submit", str(recipe), "--set", "dataset_id"])
    assert result.exit_code == 2 and "KEY=VALUE" in result.output
    assert len(api.requests) == sent_before
