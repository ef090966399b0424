"""``dpsynth datasets release-class-sizes`` against the in-process fake api."""

from __future__ import annotations

import json

import httpx
import pytest
from dpsynth_cli.main import app
from typer.testing import CliRunner

from tests.unit.cli.fake_api import FakeApi, problem

runner = CliRunner()


@pytest.mark.parametrize("dry", [True, False])
def test_release_class_sizes_sends_epsilon_and_dry_run(api: FakeApi, dry: bool) -> None:
    api.route("POST", "/v1/datasets/ds_1/class-sizes/release", lambda r: httpx.Response(
        200, json={"sent": json.loads(r.content), "sigma": 4.2}))
    args = ["datasets", "release-class-sizes", "ds_1", "--epsilon", "0.1", "--json"]
    result = runner.invoke(app, args + (["--dry-run"] if dry else []))
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert body["sent"] == {"target_epsilon": 0.1, "dry_run": dry} and body["sigma"] == 4.2


def test_a_refused_release_exits_2_with_the_code(api: FakeApi) -> None:
    api.route("POST", "/v1/datasets/ds_1/class-sizes/release", lambda r: problem(
        409, "privacy_budget_exhausted", "the filter refuses", max_admissible_target_epsilon=0.3))
    result = runner.invoke(app, ["datasets", "release-class-sizes", "ds_1", "--epsilon", "5"])
    assert result.exit_code == 2
    assert "privacy_budget_exhausted" in result.output
