"""Errors name what the user can change (issue 15, item 3): per-field errors listed once and
cleaned, and a budget refusal that says the largest admissible target first — a figure the
real ledger then admits."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from dpsynth_cli import common
from dpsynth_cli.main import app
from dpsynth_client import Client
from typer.testing import CliRunner

from tests.integration.api.conftest import Api, auth
from tests.unit.api import builders as b

runner = CliRunner()
PRIVATE = {"name": "p", "visibility": "private", "epsilon_limit": 5, "declared_size": 12,
           "label_domain": ["x", "y", "z"]}


def _upload(api: Api, token: str, **meta: object) -> dict[str, Any]:
    r = api.upload(token, b.digits_npz(12, k=3), {**PRIVATE, **meta}, filename="d.npz")
    assert r.status_code == 422, r.text
    body: dict[str, Any] = r.json()
    return body


def test_metadata_errors_are_listed_once_by_field(api: Api) -> None:
    _, token = api.tenant()
    body = _upload(api, token, on_overlap="merge", holdout_fraction=0.9)
    assert body["code"] == "invalid_dataset"
    errors = body["errors"]
    assert [e["field"] for e in errors] == ["on_overlap", "holdout_fraction"]
    assert [e["loc"] for e in errors] == [["on_overlap"], ["holdout_fraction"]]
    assert errors[0]["msg"] == "Input should be 'refuse' or 'link'"
    detail = str(body["detail"])
    assert detail == "invalid metadata (2 field errors: on_overlap, holdout_fraction)"
    assert all(e["msg"] not in detail for e in errors)  # each message once, in errors


def test_validator_messages_lose_pydantics_prefix(api: Api) -> None:
    _, token = api.tenant()
    body = _upload(api, token, holdout_key="0123456789abcdef0123")
    (error,) = body["errors"]
    assert error["msg"] == "holdout_key is given only with holdout_fraction"
    assert error["field"] == ""
    assert "Value error" not in str(body) and "errors.pydantic.dev" not in str(body)
    # a message about the whole object has no field to name: the detail says it, once
    assert body["detail"] == "invalid metadata: holdout_key is given only with holdout_fraction"


def test_spec_errors_name_the_spec_key(api: Api) -> None:
    _, token = api.tenant()
    spec = {"type": "finetune", "dataset_id": "ds_x", "base_model_id": "m",
            "privacy": {"target_epsilon": -1},
            "training": {"expected_batch_size": 4, "epochs": 2, "bogus": 1}}
    r = api.client.post("/v1/jobs", json=spec, headers=auth(token))
    assert r.status_code == 422
    body = r.json()
    assert body["code"] == "invalid_spec" and body["title"] == "Invalid job spec"
    fields = {e["field"]: e["msg"] for e in body["errors"]}
    assert fields == {"privacy.target_epsilon": "Input should be greater than or equal to 0.001",
                      "training.bogus": "Extra inputs are not permitted"}
    assert body["detail"] == ("invalid job spec (2 field errors: privacy.target_epsilon, "
                              "training.bogus)")
    r = api.client.post("/v1/jobs", json={"type": "nope"}, headers=auth(token))
    (error,) = r.json()["errors"]
    assert error["field"] == "type" and "'finetune'" in error["msg"]


def _finetune(api: Api, token: str, dataset: str, model: str, epsilon: float
              ) -> dict[str, Any]:
    r = api.finetune(token, dataset, model, epsilon=epsilon, batch=4)
    body: dict[str, Any] = r.json()
    body["status_code"] = r.status_code
    return body


def test_over_limit_says_the_admissible_target_first_and_it_is_admitted(
        real_ledger_api: Api) -> None:
    api = real_ledger_api
    _, token = api.tenant()
    dataset = api.private_dataset(token, epsilon_limit=2.0)
    model = api.model(token)
    refused = _finetune(api, token, dataset, model, 8.0)
    assert refused["status_code"] == 409
    assert refused["code"] == "privacy_budget_exhausted"  # the stable code, kept
    assert refused["title"] == "Request exceeds the admissible privacy budget"
    assert refused["refusal"] == "exceeds_admissible"
    assert "exhausted" not in refused["detail"]
    m = re.match(r"this job would need ε 8; at most ([0-9.]+) is admissible on this dataset "
                 r"now \(lower privacy\.target_epsilon to ≤ \1\)", refused["detail"])
    assert m, refused["detail"]
    suggested = float(m.group(1))
    assert suggested == refused["suggested_target_epsilon"]
    assert 0 < suggested <= refused["max_admissible_target_epsilon"] < 8.0
    assert len(m.group(1).replace(".", "").lstrip("0")) <= 3  # rounded (down) for a reader
    assert refused["field"] == "privacy.target_epsilon"
    assert refused["dataset_epsilon_spent"] == 0.0
    # following the advice is admitted
    admitted = _finetune(api, token, dataset, model, suggested)
    assert admitted["status_code"] == 201, admitted
    # now the rest is held by that job's reservation: not "exhausted" either
    held = _finetune(api, token, dataset, model, 1.0)
    assert held["status_code"] == 409
    assert held["refusal"] in {"reserved", "exceeds_admissible"}
    assert held["title"] != "Privacy budget exhausted"
    assert held["code"] == "privacy_budget_exhausted"


# --- the same errors through the CLI, against the api and the real ledger ---------------


def _cli(api: Api, token: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point the CLI's client at the test api (over an httpx transport)."""
    def forward(request: httpx.Request) -> httpx.Response:
        r = api.client.request(request.method, str(request.url.copy_with(
            scheme="http", host="testserver", port=None)), content=request.read(),
            headers=dict(request.headers))
        return httpx.Response(r.status_code, headers=r.headers, content=r.content)

    monkeypatch.setattr(common.CliState, "client", lambda self: Client(
        "http://api.test", token, transport=httpx.MockTransport(forward)))


def test_the_cli_says_flags_and_the_admitted_target(real_ledger_api: Api, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    api = real_ledger_api
    _, token = api.tenant()
    _cli(api, token, monkeypatch)
    data = tmp_path / "d.npz"
    data.write_bytes(b.digits_npz(12, k=3))
    upload = ["datasets", "upload", str(data), "--name", "p", "--visibility", "private",
              "--epsilon-limit", "2", "--declared-size", "12", "--label-domain", "x,y,z"]
    result = runner.invoke(app, [*upload, "--holdout-fraction", "0.9"])
    assert result.exit_code == 2
    assert "  --holdout-fraction: Input should be less than or equal to 0.5" in result.output
    assert result.output.count("less than or equal to 0.5") == 1
    dataset = api.private_dataset(token, epsilon_limit=2.0)  # the same records, uploaded
    result = runner.invoke(app, upload)
    assert result.exit_code == 2
    assert "private_data_overlap" in result.output
    assert "--on-overlap link" in result.output and "on_overlap" not in result.output
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({
        "type": "finetune", "dataset_id": dataset, "base_model_id": api.model(token),
        "privacy": {"target_epsilon": 8.0},
        "training": {"expected_batch_size": 4, "epochs": 2}}))
    result = runner.invoke(app, ["jobs", "submit", str(spec)])
    assert result.exit_code == 2
    m = re.search(r"\[409\] privacy_budget_exhausted: this job would need ε 8; at most "
                  r"([0-9.]+) is admissible on this dataset now \(lower "
                  rf"privacy\.target_epsilon in {re.escape(str(spec))} to ≤ \1\)",
                  result.output)
    assert m, result.output
    follow = re.search(r"to follow it: (--set) (privacy\.target_epsilon=[0-9.]+)",
                       result.output)
    assert follow and follow.group(2) == f"privacy.target_epsilon={m.group(1)}"
    result = runner.invoke(app, ["jobs", "submit", str(spec), *follow.groups()])
    assert result.exit_code == 0, result.output  # the advice, followed, is admitted
    assert len(api.sender.sent) == 1


def test_a_release_over_the_limit_names_the_flag_and_an_admitted_epsilon(
        real_ledger_api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    api = real_ledger_api
    _, token = api.tenant()
    _cli(api, token, monkeypatch)
    dataset = api.private_dataset(token, epsilon_limit=2.0)
    release = ["datasets", "release-class-sizes", dataset, "--epsilon"]
    result = runner.invoke(app, [*release, "50"])
    assert result.exit_code == 2
    m = re.search(r"this class-size histogram would need ε 50; at most ([0-9.]+) is "
                  r"admissible on this dataset now \(lower --epsilon to ≤ \1\)", result.output)
    assert m, result.output
    assert "exhausted" not in result.output.replace("privacy_budget_exhausted", "")
    assert f"  to follow it: --epsilon {m.group(1)}" in result.output
    result = runner.invoke(app, [*release, m.group(1)])
    assert result.exit_code == 0, result.output  # the advice, followed, is admitted


def test_a_size_count_over_the_limit_says_what_to_change_and_that_nothing_was_spent(
        api: Api) -> None:
    _, token = api.tenant()
    meta = {k: v for k, v in PRIVATE.items() if k != "declared_size"}
    r = api.upload(token, b.digits_npz(12, k=3), {**meta, "epsilon_limit": 0.5,
                                                  "size_epsilon": 2.0}, filename="d.npz")
    assert r.status_code == 409, r.text
    body = r.json()
    assert body["code"] == "privacy_budget_exhausted"
    assert body["refusal"] == "exceeds_admissible" and body["field"] == "size_epsilon"
    assert body["title"] != "Privacy budget exhausted"
    assert "lower size_epsilon" in body["detail"] and "nothing was spent" in body["detail"]
