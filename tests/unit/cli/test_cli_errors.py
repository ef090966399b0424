"""The CLI's errors name what its user typed (issue 15, item 3): flags, not api fields; a
spec key and its file; each field error once; "not configured" without an HTTP status."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from dpsynth_cli import common, resources
from dpsynth_cli.flags import ALIASES, UPLOAD_FLAGS, Vocabulary
from dpsynth_cli.main import app
from typer.main import get_command
from typer.testing import CliRunner

from tests.unit.cli.fake_api import FakeApi, problem

runner = CliRunner()

# problem bodies as the api answers them (tests/integration/api/test_error_wording.py)
BAD_METADATA = {
    "detail": "invalid metadata (2 field errors: on_overlap, holdout_fraction)",
    "errors": [{"loc": ["on_overlap"], "field": "on_overlap",
                "msg": "Input should be 'refuse' or 'link'"},
               {"loc": ["holdout_fraction"], "field": "holdout_fraction",
                "msg": "Input should be less than or equal to 0.5"}]}
OVER_LIMIT = {
    "detail": "this job would need ε 8; at most 1.75 is admissible on this dataset now (lower "
              "privacy.target_epsilon to ≤ 1.75). The dataset's privacy filter refuses it "
              "(limit ε 2, spent 0, reserved by running jobs 0)",
    "refusal": "exceeds_admissible", "field": "privacy.target_epsilon",
    "target_epsilon": 8.0, "max_admissible_target_epsilon": 1.7599, "epsilon_limit": 2.0,
    "suggested_target_epsilon": 1.75, "rdp_after": 35.3, "rdp_budget": 1.05,
    "admission_order": 12}


def _answer(api: FakeApi, method: str, path: str, status: int, code: str,
            body: dict[str, Any]) -> None:
    api.route(method, path, lambda r: problem(status, code, **body))


def _upload(tmp_path: Path, *extra: str) -> Any:
    data = tmp_path / "d.npz"
    data.write_bytes(b"npz")
    return runner.invoke(app, ["datasets", "upload", str(data), "--name", "n",
                               "--visibility", "private", "--epsilon-limit", "2",
                               "--declared-size", "12", *extra])


def test_upload_field_errors_name_the_flags_each_once(api: FakeApi, tmp_path: Path) -> None:
    _answer(api, "POST", "/v1/datasets", 422, "invalid_dataset", BAD_METADATA)
    result = _upload(tmp_path, "--holdout-fraction", "0.9")
    assert result.exit_code == 2
    out = result.output
    assert "[422] invalid_dataset: invalid metadata (2 field errors: --on-overlap, " \
           "--holdout-fraction)" in out
    assert out.count("Input should be less than or equal to 0.5") == 1
    assert "  --holdout-fraction: Input should be less than or equal to 0.5" in out
    assert "  --on-overlap: Input should be 'refuse' or 'link'" in out
    assert "holdout_fraction" not in out and "on_overlap" not in out
    assert "\n  errors:" not in out and "'loc'" not in out  # no raw list after the lines


def test_overlap_refusal_says_on_overlap_link(api: FakeApi, tmp_path: Path) -> None:
    _answer(api, "POST", "/v1/datasets", 409, "private_data_overlap", {
        "detail": "3 record(s) of this upload are already in your private dataset(s) "
                  "(deleted ones included), whose budget they belong to; upload with "
                  "on_overlap 'link' to charge that budget", "datasets": ["ds_1"]})
    result = _upload(tmp_path)
    assert result.exit_code == 2
    assert "private_data_overlap" in result.output  # the code stays visible
    assert "upload with --on-overlap link to charge that budget" in result.output
    assert "  datasets: ['ds_1']" in result.output


def test_label_domain_and_validator_messages(api: FakeApi, tmp_path: Path) -> None:
    _answer(api, "POST", "/v1/datasets", 422, "invalid_dataset", {
        "detail": "invalid metadata (1 field error: label_domain.1): holdout_key is given "
                  "only with holdout_fraction",
        "errors": [{"loc": ["label_domain", 1], "field": "label_domain.1",
                    "msg": "names must be distinct"},
                   {"loc": [], "field": "",
                    "msg": "holdout_key is given only with holdout_fraction"}]})
    result = _upload(tmp_path, "--label-domain", "a,a")
    out = result.output
    assert "  --label-domain (value 2): names must be distinct" in out
    assert "(1 field error: --label-domain (value 2)): --holdout-key is given only with " \
           "--holdout-fraction" in out
    assert out.count("is given only with") == 1


def test_a_flag_of_another_command_names_that_command(api: FakeApi) -> None:
    _answer(api, "POST", "/v1/jobs", 422, "no_holdout", {
        "detail": "dataset ds_1 has no held-out records: upload the reference data with "
                  "holdout_fraction (derived datasets have no held-out part of their own)"})
    result = runner.invoke(app, ["evaluate", "art_1", "--dataset", "ds_1"])
    assert result.exit_code == 2
    assert "with --holdout-fraction (of `dpsynth datasets upload`)" in result.output


def test_spec_errors_name_the_key_and_the_file(api: FakeApi, tmp_path: Path) -> None:
    _answer(api, "POST", "/v1/jobs", 422, "invalid_spec", {
        "detail": "invalid job spec (1 field error: privacy.target_epsilon)",
        "errors": [{"loc": ["body", "finetune", "privacy", "target_epsilon"],
                    "field": "privacy.target_epsilon",
                    "msg": "Input should be greater than or equal to 0.001"}]})
    spec = tmp_path / "job.yaml"
    spec.write_text("type: finetune\ndataset_id: ds_1\n")
    result = runner.invoke(app, ["jobs", "submit", str(spec)])
    assert result.exit_code == 2
    assert (f"  privacy.target_epsilon in {spec}: Input should be greater than or equal to "
            "0.001") in result.output
    assert result.output.count("greater than or equal to 0.001") == 1


def test_over_limit_names_the_spec_key_and_the_admissible_target(api: FakeApi,
                                                                  tmp_path: Path) -> None:
    _answer(api, "POST", "/v1/jobs", 409, "privacy_budget_exhausted", OVER_LIMIT)
    spec = tmp_path / "job.yaml"
    spec.write_text("type: finetune\ndataset_id: ds_1\n")
    result = runner.invoke(app, ["jobs", "submit", str(spec)])
    assert result.exit_code == 2
    first = result.output.splitlines()[0]
    assert first.startswith("error [409] privacy_budget_exhausted: this job would need ε 8; "
                            "at most 1.75 is admissible on this dataset now (lower "
                            f"privacy.target_epsilon in {spec} to ≤ 1.75)")
    assert "rdp_" not in result.output and "admission_order" not in result.output
    assert "max_admissible_target_epsilon: 1.7599" in result.output
    assert "--set privacy.target_epsilon=1.75" in result.output


def test_not_configured_prints_no_status(monkeypatch: pytest.MonkeyPatch,
                                         tmp_path: Path) -> None:
    for name in ("DPSYNTH_API_URL", "DPSYNTH_API_KEY", "DPSYNTH_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["datasets", "list"])
    assert result.exit_code == 2
    assert result.output.startswith("error: no ")
    assert "[" not in result.output.splitlines()[0].split(":")[0]
    assert "401" not in result.output and "unauthenticated" not in result.output


def test_other_errors_keep_status_and_code(api: FakeApi) -> None:
    api.route("GET", "/v1/jobs/j1", lambda r: problem(503, "ledger_unavailable", "down"))
    result = runner.invoke(app, ["jobs", "show", "j1"])
    assert result.exit_code == 1
    assert result.output.startswith("error [503] ledger_unavailable: down")


def test_the_upload_flag_map_is_the_upload_commands() -> None:
    command = get_command(resources.datasets).commands["upload"]  # type: ignore[attr-defined]
    flags = Vocabulary.of(type("Ctx", (), {"command": command, "params": {}})()).flags
    for field, opts in UPLOAD_FLAGS.items():
        assert flags[field][:len(opts)] == opts, field
    vocab = Vocabulary(flags=flags)
    assert vocab.text("declare partitions_disjoint false, or privacy_unit 'subject'") == \
        "declare --partitions-overlap, or --privacy-unit subject"


def test_plain_words_stay_words() -> None:
    vocab = Vocabulary(flags={"name": ("--name",), "delta": ("--delta",),
                              "epsilon_limit": ("--epsilon-limit",)})
    assert vocab.text("the name of the delta") == "the name of the delta"
    assert vocab.text("epsilon_limit 12 exceeds your policy") == \
        "--epsilon-limit 12 exceeds your policy"
    assert vocab.text("declared_size_source stays") == "declared_size_source stays"


def test_raw_errors_of_an_older_api_still_print_once() -> None:
    err = common.DpsynthError("invalid_request", "invalid request", errors=[
        {"loc": ["body", "x"], "msg": "bad"}, {"loc": ["body", "x"], "msg": "bad"}])
    assert common.error_lines(err) == ["[400] invalid_request: invalid request", "  x: bad"]


def test_a_refusal_without_a_figure_points_at_the_dry_run(api: FakeApi, tmp_path: Path) -> None:
    _answer(api, "POST", "/v1/jobs", 409, "privacy_budget_exhausted", {
        "detail": "this job would need ε 8, more than is admissible on this dataset now; the "
                  "ledger was too busy to compute the largest admissible "
                  "privacy.target_epsilon: a dry run (dry_run) names it",
        "refusal": "exceeds_admissible", "field": "privacy.target_epsilon"})
    spec = tmp_path / "job.yaml"
    spec.write_text("type: finetune\ndataset_id: ds_1\n")
    result = runner.invoke(app, ["jobs", "submit", str(spec)])
    assert "a dry run (--dry-run) names it" in result.output
    assert "to follow it" not in result.output  # no figure, no advice made up


def test_every_alias_names_an_option_of_its_command() -> None:
    root = get_command(app)
    commands = {"evaluate": root.commands["evaluate"],  # type: ignore[attr-defined]
                **{name: root.commands["datasets"].commands[name]  # type: ignore[attr-defined]
                   for name in ("derive", "release-class-sizes")}}
    assert set(ALIASES) == set(commands)
    for name, aliases in ALIASES.items():
        options = {p.name for p in commands[name].params if p.param_type_name == "option"}
        assert set(aliases.values()) <= options, name
