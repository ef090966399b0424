"""Class sizes released by a charged DP histogram, through the api on the REAL ledger.

The api asks the ledger to admit and charge a Gaussian histogram (σ calibrated to the
target epsilon), then adds fresh OS-entropy noise of that σ to the true per-class counts it
recorded at ingest and stores max(1, ceil(noisy)) as the dataset's public class sizes
(``class_sizes_source: dp_histogram``), on the api's row and on the ledger's budget. Per-label
jobs then plan with those sizes exactly as with declared ones.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from dpsynth_api.datasets.class_sizes import noisy_class_sizes
from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.release_contract import HistogramRequest, SetClassSizes

from tests.integration.api.conftest import Api, auth
from tests.unit.api import builders as b

LABELS = ["x", "y", "z"]


def _private(api: Api, token: str, n: int = 12) -> str:
    r = api.upload(token, b.digits_npz(n, k=3), {
        "name": "priv", "visibility": "private", "epsilon_limit": 10.0,
        "label_domain": LABELS, "declared_size": n}, filename="d.npz")
    assert r.status_code == 201, r.text
    assert r.json()["class_sizes"] is None and r.json()["class_sizes_source"] is None
    return str(r.json()["dataset_id"])


def _release(api: Api, token: str, dataset: str, epsilon: float, dry_run: bool = False) -> Any:
    return api.client.post(f"/v1/datasets/{dataset}/class-sizes/release", headers=auth(token),
                           json={"target_epsilon": epsilon, "dry_run": dry_run})


def _verify(api: Api) -> dict:
    return api.ledger._call("GET", "/v1/chain/verify")  # type: ignore[attr-defined,no-any-return]


def test_released_sizes_drive_per_label_plans(real_ledger_api: Api) -> None:
    api = real_ledger_api
    _, token = api.tenant()
    dataset = _private(api, token)
    dry = _release(api, token, dataset, 1.0, dry_run=True)
    assert dry.status_code == 200, dry.text
    dry = dry.json()
    assert dry["dry_run"] is True and dry["charged"] is False and dry["class_sizes"] is None
    assert dry["sigma"] > 0 and dry["admissible"] is True and dry["sensitivity"] == 1.0
    budget = api.client.get(f"/v1/datasets/{dataset}/budget", headers=auth(token)).json()
    assert budget["dataset_epsilon_spent"] == 0.0 and budget["class_sizes"] is None

    r = _release(api, token, dataset, 1.0)
    assert r.status_code == 200, r.text
    rel = r.json()
    assert rel["charged"] is True and rel["class_sizes_source"] == "dp_histogram"
    assert rel["sigma"] == dry["sigma"] and rel["epsilon"] <= 1.0
    sizes = rel["class_sizes"]
    assert set(sizes) == set(LABELS) and all(1 <= n <= 12 for n in sizes.values())
    budget = api.client.get(f"/v1/datasets/{dataset}/budget", headers=auth(token)).json()
    assert budget["class_sizes"] == sizes  # the ledger computes q_c from its own copy
    assert budget["dataset_epsilon_spent"] == rel["dataset_epsilon_spent_after"] > 0
    for amount in budget["partitions"].values():  # every partition, once (rounded up)
        assert amount == pytest.approx(rel["rdp_charge"], rel=1e-12)
    view = api.client.get(f"/v1/datasets/{dataset}", headers=auth(token)).json()
    assert view["class_sizes"] == sizes and view["class_sizes_source"] == "dp_histogram"

    model = api.model(token)
    r = api.client.post("/v1/jobs?dry_run=true", headers=auth(token), json={
        "type": "finetune", "dataset_id": dataset, "base_model_id": model,
        "privacy": {"target_epsilon": 2.0},
        "training": {"per_label": True, "expected_batch_size": 5, "epochs": 2}})
    assert r.status_code == 200, r.text
    plan = r.json()["plan"]
    for name, part in plan["per_label"].items():
        assert part["class_size"] == sizes[name]
        assert part["sample_rate"] == min(5, sizes[name]) / sizes[name]

    again = _release(api, token, dataset, 1.0)
    assert again.status_code == 409 and again.json()["code"] == "conflict", again.text
    _, other = api.tenant("other")
    r = _release(api, other, dataset, 1.0)
    assert r.status_code == 404 and r.json()["code"] == "not_found"
    public = api.public_dataset(token)
    assert _release(api, token, public, 1.0).status_code == 400
    report = _verify(api)
    assert report["ok"], report["problems"]


def test_two_datasets_with_the_same_data_get_fresh_noise(real_ledger_api: Api) -> None:
    api = real_ledger_api
    _, token = api.tenant()
    _, other = api.tenant("other")  # one tenant's re-upload of the same records is refused
    first, second = _private(api, token, n=300), _private(api, other, n=300)
    a = _release(api, token, first, 0.2).json()
    c = _release(api, other, second, 0.2).json()
    assert a["sigma"] == c["sigma"] > 10  # same calibration ...
    assert a["class_sizes"] != c["class_sizes"]  # ... fresh noise (P(equal) ~ 1e-5)
    # far from the clamps, sizes scatter around the true counts (100 per class) with σ
    for sizes in (a["class_sizes"], c["class_sizes"]):
        assert all(abs(n - 100) < 6 * a["sigma"] for n in sizes.values())


def test_a_refused_release_stores_nothing(real_ledger_api: Api) -> None:
    api = real_ledger_api
    _, token = api.tenant()
    dataset = _private(api, token)
    r = _release(api, token, dataset, 50.0)  # a Gaussian of epsilon 50 exceeds a limit of 10
    assert r.status_code == 409 and r.json()["code"] == "privacy_budget_exhausted", r.text
    assert 0 < r.json()["max_admissible_target_epsilon"] < 10.0
    view = api.client.get(f"/v1/datasets/{dataset}", headers=auth(token)).json()
    assert view["class_sizes"] is None
    budget = api.client.get(f"/v1/datasets/{dataset}/budget", headers=auth(token)).json()
    assert budget["dataset_epsilon_spent"] == 0.0


def test_noisy_sizes_are_clamped_post_processing() -> None:
    counts = {"a": 0, "b": 5, "c": 1000}
    rng = np.random.default_rng(1)
    sizes = noisy_class_sizes(counts, 1e-9, 50, rng)
    assert sizes["a"] == 1 and sizes["c"] == 50  # at least 1, at most N̂
    assert sizes["b"] in (5, 6)  # ceil of 5 ± 1e-9
    draws = [noisy_class_sizes({"b": 500}, 3.0, 10_000)["b"] for _ in range(200)]
    assert len(set(draws)) > 5 and abs(np.mean(draws) - 500.5) < 1.5


def test_sizes_the_ledger_recorded_are_adopted_without_a_new_charge(
        real_ledger_api: Api) -> None:
    """The api failed to store sizes the ledger recorded: the next call adopts them."""
    api = real_ledger_api
    _, token = api.tenant()
    dataset = _private(api, token)
    release = api.ledger.release_histogram(dataset, HistogramRequest(target_epsilon=1.0))
    sizes = {"x": 3, "y": 5, "z": 4}
    api.ledger.set_class_sizes(dataset, SetClassSizes(class_sizes=sizes,
                                                      release_id=str(release.release_id)))
    spent = api.client.get(f"/v1/datasets/{dataset}/budget",
                           headers=auth(token)).json()["dataset_epsilon_spent"]
    r = _release(api, token, dataset, 1.0)
    assert r.status_code == 409 and r.json()["class_sizes"] == sizes, r.text
    view = api.client.get(f"/v1/datasets/{dataset}", headers=auth(token)).json()
    assert view["class_sizes"] == sizes and view["class_sizes_source"] == "dp_histogram"
    budget = api.client.get(f"/v1/datasets/{dataset}/budget", headers=auth(token)).json()
    assert budget["dataset_epsilon_spent"] == spent  # no second charge


def test_a_failure_after_the_charge_keeps_it_and_a_retry_is_a_new_release(api: Api) -> None:
    _, token = api.tenant()
    dataset = _private(api, token)
    real = api.ledger.set_class_sizes

    def unreachable(*args: Any, **kwargs: Any) -> Any:
        raise DpsynthError(ErrorCode.LEDGER_UNAVAILABLE, "down")

    api.ledger.set_class_sizes = unreachable  # type: ignore[method-assign]
    r = _release(api, token, dataset, 1.0)
    assert r.status_code == 503 and r.json()["code"] == "ledger_unavailable", r.text
    view = api.client.get(f"/v1/datasets/{dataset}", headers=auth(token)).json()
    assert view["class_sizes"] is None  # nothing stored ...
    assert len(api.ledger.releases[dataset]) == 1  # ... but the charge stays
    api.ledger.set_class_sizes = real  # type: ignore[method-assign]
    r = _release(api, token, dataset, 1.0)
    assert r.status_code == 200, r.text
    assert len(api.ledger.releases[dataset]) == 2  # the retry was a new, charged release
    budget = api.client.get(f"/v1/datasets/{dataset}/budget", headers=auth(token)).json()
    assert budget["dataset_epsilon_spent"] == 2.0  # the fake's additive figure: both count
