"""``dpsynth ledger accountants``: the accountant comparison of a planned job, as a table or
(``--json``) the api's body, against the in-process fake api."""

from __future__ import annotations

import json
from typing import Any

import httpx
from dpsynth_cli.main import app
from dpsynth_shared.accountant_report import AccountantComparison
from typer.testing import CliRunner

from tests.unit.cli.fake_api import FakeApi, problem

runner = CliRunner()
PATH = "/v1/accountant-comparisons"


def _row(name: str, sigma: float, bound: bool) -> dict[str, Any]:
    return {"accountant": name, "label": name, "noise_multiplier": sigma,
            "is_upper_bound": bound, "epsilon_by": {"rdp": 3.0, "gdp": 2.1, "pld": 2.5},
            "filter_epsilon": 131.0, "note": ""}


REPORT: dict[str, Any] = {
    "target_epsilon": 3.0, "delta": 1e-5, "sample_rate": 0.01, "steps": 1000,
    "rows": [_row("rdp", 0.8682, True), _row("gdp", 0.7413, False), _row("pld", 0.8137, True)],
    "ledger_calibrates_with": "pld", "ledger_noise_multiplier": 0.8137, "filter_order": 8,
    "epsilon_limit": 3.0, "ledger_charge_epsilon": 783.65,
    "admissible_on_fresh_budget": False, "explanation": ["The ledger gives the job PLD."]}


def test_the_fake_body_is_the_contract() -> None:
    AccountantComparison.model_validate(REPORT)


def test_the_table_names_each_sigma_and_the_ledgers(api: FakeApi) -> None:
    api.route("POST", PATH, REPORT)
    result = runner.invoke(app, ["ledger", "accountants", "--epsilon", "3", "--delta", "1e-5",
                                 "--sample-rate", "0.01", "--steps", "1000"])
    assert result.exit_code == 0, result.output
    sent = json.loads(api.requests[-1].content)
    assert sent == {"target_epsilon": 3.0, "delta": 1e-5, "sample_rate": 0.01, "steps": 1000}
    lines = result.output.splitlines()
    assert any(line.startswith("pld") and "0.8137" in line and "<- ledger" in line
               for line in lines)
    assert any(line.startswith("gdp") and "APPROXIMATION" in line for line in lines)
    assert "The ledger gives the job PLD." in result.output


def test_json_prints_the_body_and_the_limit_is_sent(api: FakeApi) -> None:
    api.route("POST", PATH, REPORT)
    result = runner.invoke(app, ["ledger", "accountants", "--epsilon", "3", "--delta", "1e-5",
                                 "--sample-rate", "0.01", "--steps", "1000",
                                 "--epsilon-limit", "8", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == REPORT
    assert json.loads(api.requests[-1].content)["epsilon_limit"] == 8.0


def test_a_problem_is_reported_with_its_code(api: FakeApi) -> None:
    api.route("POST", PATH, lambda _r: problem(422, "plan_too_large", "too many steps"))
    result = runner.invoke(app, ["ledger", "accountants", "--epsilon", "3", "--delta", "1e-5",
                                 "--sample-rate", "0.01", "--steps", "1000"])
    assert result.exit_code != 0
    assert "plan_too_large" in result.output or "too many steps" in result.output
    assert isinstance(api.requests[-1], httpx.Request)
