"""Selection with evaluations, through the api joined to the REAL ledger (issue 13, item 6).

* an evaluate job with ``dp`` needs a private, non-derived, image-unit reference; its privacy
  block (dry run and job) shows the DP plan with the PUBLIC held-out size N̂_h = N̂·f/(1−f),
  and its claim hands that plan to the worker;
* the worker's DP release reaches the ledger's held-out partition (charged once, the training
  partitions untouched) and the released numbers are in the job result the readers see;
* every corpus release states the selection caveat and lists the DP evaluations as inside
  the guarantee.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dpsynth_shared.release_contract import DpEvaluationRequest
from fastapi.testclient import TestClient

from tests.integration.api.conftest import LEDGER_TOKEN, Api, api_with_real_ledger, auth
from tests.integration.api.test_evaluate import (
    _corpus,
    _dp_model,
    _evaluate,
    _manifest,
    _private,
    _public,
    _reader,
    _run,
)


@pytest.fixture()
def joined(migrated_url: str, pg: Any, tmp_path: Path) -> Iterator[tuple[Api, TestClient]]:
    with api_with_real_ledger(migrated_url, pg, tmp_path) as pair:
        yield pair


def test_a_dp_evaluation_from_submission_to_the_corpus_manifest(
        joined: tuple[Api, TestClient]) -> None:
    api, ledger = joined
    owner, reader, _ = _reader(api)
    private = _private(api, owner, holdout_fraction=0.2).json()["dataset_id"]  # N̂ = 30
    public = _public(api, owner)
    corpus, _, _ = _corpus(api, owner, _dp_model(api, owner, private))
    dp = {"dp": {"target_epsilon": 1.0}, "classifiers": ["cnn", "logreg"]}

    refused = _evaluate(api, owner, corpus, public, **dp)
    assert refused.status_code == 422 and refused.json()["code"] == "invalid_spec"
    assert "public" in refused.json()["detail"]

    plan = _evaluate(api, owner, corpus, private, dry_run=True, **dp)
    assert plan.status_code == 200, plan.text
    block = plan.json()["plan"]["dp"]
    assert block["holdout_size"] == 8  # round(30 · 0.2 / 0.8): public values only
    assert block["metrics"] == ["tstr_accuracy/cnn", "tstr_accuracy/logreg"]
    assert block["partition"] == "*holdout" and block["target_epsilon"] == 1.0
    assert any("does not cover that choice" in n for n in plan.json()["plan"]["notes"])

    job = _evaluate(api, owner, corpus, private, **dp)
    assert job.status_code == 201, job.text
    job_id, evaluation_id = job.json()["job_id"], job.json()["privacy"]["evaluation_id"]
    claim = _run(api, job_id)
    assert claim["dp_evaluation"]["holdout_size"] == 8
    assert claim["evaluation_id"] == evaluation_id

    # the worker's release (what DpLedger fakes in the unit tests) on the REAL ledger
    before = api.ledger.get_budget(private)
    r = ledger.post(f"/v1/evaluations/{evaluation_id}/dp-releases",
                    headers={"Authorization": f"Bearer {LEDGER_TOKEN}"},
                    json=DpEvaluationRequest(job_id=job_id, attempt=1, target_epsilon=1.0,
                                             metrics=block["metrics"], holdout_size=8
                                             ).model_dump(mode="json"))
    assert r.status_code == 201, r.text
    release = r.json()
    after = api.ledger.get_budget(private)
    assert after.partitions["*holdout"] == pytest.approx(release["rdp_charge"], rel=1e-12)
    assert {p: v for p, v in after.partitions.items() if p != "*holdout"} == before.partitions

    released = {"label": "DP", "budget_id": private, "partition": "*holdout",
                "epsilon": release["epsilon"], "delta": release["delta"],
                "sigma": release["event"]["sigma"], "holdout_size": 8,
                "sensitivity": release["event"]["sensitivity"],
                "release_id": release["release_id"],
                "metrics": {"tstr_accuracy/cnn": {"accuracy": 0.71, "accuracy_clipped": 0.71},
                            "tstr_accuracy/logreg": {"accuracy": 0.52,
                                                     "accuracy_clipped": 0.52}}}
    done = api.worker(f"{job_id}/transition", {"attempt": 1, "to_state": "succeeded", "result": {
        "report_artifact_id": None, "non_dp": True, "contains_private_images": False,
        "dp_evaluation": released, "accuracy": 0.99}})
    assert done.status_code == 200, done.text
    seen = api.client.get(f"/v1/jobs/{job_id}", headers=auth(reader)).json()
    assert seen["result"]["dp_evaluation"] == released  # the DP numbers: readers see them
    assert "accuracy" not in seen["result"]  # a non-DP metric never passes the allow-list

    manifest = _manifest(api.client.get(f"/v1/artifacts/{corpus}/download",
                                        headers=auth(reader)).content)
    assert "does not cover that choice" in manifest["selection_caveat"]
    [entry] = manifest["dp_evaluations"]
    assert entry["job_id"] == job_id and entry["inside_guarantee"] is True
    assert entry["released"] == released["metrics"] and entry["partition"] == "*holdout"
    assert entry["relation"] == "this corpus"
    assert [e["job_id"] for e in manifest["non_dp_evaluations"]] == [job_id]

