"""The ``dpsynth`` commands against the in-process fake api (no network)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from dpsynth_cli.main import app
from dpsynth_cli.views import budget_lines, budget_warning, progress_text
from typer.testing import CliRunner

from tests.unit.cli.fake_api import FakeApi, problem

BUDGET = {"dataset_id": "ds_1", "epsilon_limit": 8.0, "delta": 1e-6,
          "dataset_epsilon_spent": 3.5, "dataset_tight_epsilon": 2.9,
          "dataset_epsilon_reserved": 1.0, "dataset_epsilon_remaining": 3.5,
          "admission_order": 12, "accountant": "rdp-filter"}


runner = CliRunner()


def test_budget_shows_every_figure_named_apart(api: FakeApi) -> None:
    api.route("GET", "/v1/datasets/ds_1/budget", BUDGET)
    result = runner.invoke(app, ["budget", "ds_1"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "spent (RDP filter)" in out and "3.5000" in out
    assert "not a guarantee under adaptive use" in out and "2.9000" in out
    assert "reserved" in out and "1.0000" in out
    assert "admission order" in out and "12" in out
    assert "1.000e-06" in out


def test_budget_lines_and_warning() -> None:
    labels = [label for label, _ in budget_lines(BUDGET)]
    assert labels[:8] == ["dataset", "epsilon limit", "spent (RDP filter)", "tight (PLD)",
                          "reserved", "remaining", "admission order", "delta"]
    assert budget_warning(BUDGET) is None
    assert "exhausted" in str(budget_warning({**BUDGET, "dataset_epsilon_remaining": 0.0}))
    assert "10%" in str(budget_warning({**BUDGET, "dataset_epsilon_remaining": 0.5}))
    assert budget_warning({**BUDGET, "warning": "server says"}) == "server says"
    assert ("warning", "server says") in budget_lines({**BUDGET, "warning": "server says"})


def test_progress_text_is_data_independent_fields_only() -> None:
    text = progress_text({"state": "running", "progress": {"step": 40, "total": 100,
                                                           "epsilon_so_far": 1.23456,
                                                           "eta_s": 61.7}})
    assert text == "running  step 40/100  epsilon so far 1.235  ETA 62s"


def test_client_error_exits_2_with_code_and_detail(api: FakeApi, tmp_path: Path) -> None:
    api.route("POST", "/v1/jobs", lambda r: problem(
        409, "privacy_budget_exhausted", "no budget", max_admissible_target_epsilon=0.5))
    spec = tmp_path / "job.yaml"
    spec.write_text("type: finetune\ndataset_id: ds_1\n")
    result = runner.invoke(app, ["jobs", "submit", str(spec)])
    assert result.exit_code == 2
    assert "privacy_budget_exhausted" in result.output and "no budget" in result.output
    assert "max_admissible_target_epsilon: 0.5" in result.output


def test_server_error_exits_1(api: FakeApi) -> None:
    api.route("GET", "/v1/jobs/j1", lambda r: problem(503, "ledger_unavailable", "down"))
    result = runner.invoke(app, ["jobs", "show", "j1"])
    assert result.exit_code == 1
    assert "ledger_unavailable" in result.output


def test_submit_json_spec_dry_run(api: FakeApi, tmp_path: Path) -> None:
    api.route("POST", "/v1/jobs", lambda r: httpx.Response(
        200, json={"dry_run": r.url.params.get("dry_run"), "spec": json.loads(r.content)}))
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps({"type": "generate", "model_id": "m1"}))
    result = runner.invoke(app, ["jobs", "submit", str(spec), "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert body == {"dry_run": "true", "spec": {"type": "generate", "model_id": "m1"}}


def test_bad_spec_file_is_invalid_spec(api: FakeApi, tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("- just\n- a list\n")
    result = runner.invoke(app, ["jobs", "submit", str(spec)])
    assert result.exit_code == 2
    assert "invalid_spec" in result.output
    assert api.requests == []


@pytest.mark.parametrize(("final", "code"), [("succeeded", 0), ("failed", 1), ("cancelled", 1)])
def test_jobs_watch_exit_code_follows_the_final_state(api: FakeApi, final: str,
                                                      code: int) -> None:
    states = iter([{"state": "running", "progress": {"step": 1, "total": 4}},
                   {"state": final, "progress": {"step": 4, "total": 4}}])
    api.route("GET", "/v1/jobs/j1", lambda r: httpx.Response(200, json=next(states)))
    result = runner.invoke(app, ["jobs", "watch", "j1", "--poll", "0"])
    assert result.exit_code == code, result.output
    assert f"ended {final}" in result.output or final == "succeeded"


def test_datasets_upload_splits_label_domain(api: FakeApi, tmp_path: Path) -> None:
    captured: dict[str, bytes] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        captured["body"] = request.content
        return httpx.Response(201, json={"dataset_id": "ds_2"})

    api.route("POST", "/v1/datasets", handler)
    data = tmp_path / "d.npz"
    data.write_bytes(b"x")
    result = runner.invoke(app, ["datasets", "upload", str(data), "--name", "n",
                                 "--visibility", "private", "--epsilon-limit", "4",
                                 "--label-domain", "cat, dog", "--declared-size", "20"])
    assert result.exit_code == 0, result.output
    assert b'"label_domain": ["cat", "dog"]' in captured["body"]
    assert b'"epsilon_limit": 4.0' in captured["body"]
    assert b"class_sizes" not in captured["body"]
    result = runner.invoke(app, ["datasets", "upload", str(data), "--name", "n",
                                 "--visibility", "private", "--epsilon-limit", "4",
                                 "--label-domain", "cat,dog", "--class-sizes", "cat=5, dog=7",
                                 "--declared-size", "20"])
    assert result.exit_code == 0, result.output
    assert b'"class_sizes": {"cat": 5, "dog": 7}' in captured["body"]
    result = runner.invoke(app, ["datasets", "upload", str(data), "--name", "n",
                                 "--visibility", "private", "--class-sizes", "cat:5",
                                 "--declared-size", "20"])
    assert result.exit_code != 0 and "NAME=COUNT" in result.output


def test_a_private_upload_states_its_public_size(api: FakeApi, tmp_path: Path) -> None:
    """Issue 13, item 2: the CLI tells the user what to declare (N̂ or a DP count) instead
    of letting the platform publish the true count; the declarations reach the metadata."""
    captured: dict[str, bytes] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        captured["body"] = request.content
        return httpx.Response(201, json={"dataset_id": "ds_3"})

    api.route("POST", "/v1/datasets", handler)
    data = tmp_path / "d.npz"
    data.write_bytes(b"x")
    base = ["datasets", "upload", str(data), "--name", "n", "--visibility", "private",
            "--epsilon-limit", "4", "--label-domain", "cat,dog"]
    sent = len(api.requests)
    result = runner.invoke(app, base)
    assert result.exit_code != 0 and len(api.requests) == sent
    assert "--declared-size" in result.output and "--size-epsilon" in result.output
    result = runner.invoke(app, [*base, "--size-epsilon", "0.5", "--partitions-overlap"])
    assert result.exit_code == 0, result.output
    assert b'"size_epsilon": 0.5' in captured["body"]
    assert b'"partitions_disjoint": false' in captured["body"]
    assert b"declared_size" not in captured["body"]
    result = runner.invoke(app, [*base, "--declared-size", "500", "--partitions-disjoint"])
    assert result.exit_code == 0, result.output
    assert b'"declared_size": 500' in captured["body"]
    assert b'"partitions_disjoint": true' in captured["body"]


def test_bad_visibility_is_refused_before_any_request(api: FakeApi, tmp_path: Path) -> None:
    data = tmp_path / "d.npz"
    data.write_bytes(b"x")
    result = runner.invoke(app, ["datasets", "upload", str(data), "--name", "n",
                                 "--visibility", "secret"])
    assert result.exit_code == 2
    assert api.requests == []


def test_admin_key_create_parses_scopes(api: FakeApi) -> None:
    api.route("POST", "/v1/tenants/t1/keys",
              lambda r: httpx.Response(201, json=json.loads(r.content)))
    result = runner.invoke(app, ["admin", "key", "create", "--tenant", "t1",
                                 "--scopes", "read,submit", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"scopes": ["read", "submit"]}


def test_download_writes_the_file(api: FakeApi, tmp_path: Path) -> None:
    api.route("GET", "/v1/artifacts/a1/download", lambda r: httpx.Response(200, content=b"ZIP"))
    out = tmp_path / "c.zip"
    result = runner.invoke(app, ["download", "a1", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_bytes() == b"ZIP"


def test_status_of_a_home_without_platform_exits_3(tmp_path: Path) -> None:
    result = runner.invoke(app, ["status", "--home", str(tmp_path), "--json"])
    assert result.exit_code == 3
    assert json.loads(result.stdout)["running"] is False
    result = runner.invoke(app, ["status", "--home", str(tmp_path)])
    assert result.exit_code == 3 and "not running (dpsynth up starts it)" in result.stdout


def test_submit_watch_and_lists_read_the_ids_the_api_returns(api: FakeApi,
                                                             tmp_path: Path) -> None:
    """The api names ids `job_id`, `dataset_id`, `model_id` (its response schemas); the CLI
    crashed with KeyError 'id' after `jobs submit --watch` and printed empty id columns."""
    from dpsynth_api.datasets.schemas import DatasetSummary
    from dpsynth_api.jobs.schemas import JobOut
    from dpsynth_api.models.schemas import ModelOut

    assert {"job_id"} <= set(JobOut.model_fields) and "id" not in JobOut.model_fields
    assert "dataset_id" in DatasetSummary.model_fields and "model_id" in ModelOut.model_fields
    job = {"job_id": "job_w", "type": "finetune", "state": "queued", "created_at": "t0"}
    api.route("POST", "/v1/jobs", lambda r: httpx.Response(201, json=job))
    api.route("GET", "/v1/jobs/job_w", {**job, "state": "succeeded",
                                        "progress": {"step": 2, "total": 2}})
    api.route("GET", "/v1/jobs", {"items": [job], "next_cursor": None})
    api.route("GET", "/v1/datasets", {"items": [{"dataset_id": "ds_7", "name": "d",
                                                 "visibility": "public", "declared_size": 3,
                                                 "created_at": "t0"}], "next_cursor": None})
    api.route("GET", "/v1/models", {"items": [{"model_id": "mdl_5", "name": "m",
                                               "source": "upload", "created_at": "t0"}],
                                    "next_cursor": None})
    spec = tmp_path / "job.yaml"
    spec.write_text("type: pretrain\ndataset_id: ds_7\n")
    result = runner.invoke(app, ["jobs", "submit", str(spec), "--watch"])
    assert result.exit_code == 0, result.output
    assert "succeeded" in result.output
    for command, wanted in ((["jobs", "list"], "job_w"), (["datasets", "list"], "ds_7"),
                            (["models", "list"], "mdl_5")):
        listed = runner.invoke(app, command)
        assert listed.exit_code == 0 and wanted in listed.output, (command, listed.output)
