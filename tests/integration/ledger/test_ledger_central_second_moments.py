"""Central images with second moments on the real ledger (PostgreSQL).

A release that also carries the class second moments (outer products scaled by 1/B, each
unit's bounded by B², docs/privacy.md "Central images") moves by at most √2·B per unit: the
Gaussian's sensitivity is √2·B (add/remove) or 2√2·B (replace-one), and subsampled queries
are a DP-SGD event whose noise std is z·√2·B. The chain's replay recomputes the sensitivity
from the recorded flag and checks the recorded noise std against the event, so neither can be
lowered afterwards.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from dpsynth_ledger.settings import LedgerSettings
from fastapi.testclient import TestClient

from .test_ledger_central_images import (
    BOUND,
    SHAPE,
    _audits_pass,
    _budget,
    _entries,
    _reserve,
    gaussian_rdp,
    subsampled_rdp,
)
from .test_ledger_tampering import _tamper


def _release(client: TestClient, rid: str, job_id: str, target: float, *,
             second_moments: bool = True, sample_rate: float | None = None, queries: int = 1,
             shape: dict[str, int] | None = None) -> Any:
    return client.post(f"/v1/reservations/{rid}/central-images", json={
        "job_id": job_id, "attempt": 1, "target_epsilon": target, **(shape or SHAPE),
        "sample_rate": sample_rate, "queries": queries, "second_moments": second_moments})


@pytest.mark.parametrize("neighbouring,factor", [("add_remove", 1.0), ("replace_one", 2.0)])
def test_one_query_with_second_moments_has_sqrt_two_times_the_sensitivity(
        client: TestClient, neighbouring: str, factor: float) -> None:
    ds = f"ds_sm_{neighbouring}"
    order = _budget(client, ds, neighbouring=neighbouring)["admission_order"]
    plain = _release(client, _reserve(client, "job_p_" + ds, ds)["reservation_id"],
                     "job_p_" + ds, 1.0, second_moments=False).json()
    r = _release(client, _reserve(client, "job_m_" + ds, ds)["reservation_id"],
                 "job_m_" + ds, 1.0)
    assert r.status_code == 201, r.text
    rel = r.json()
    ev = rel["event"]
    assert rel["second_moments"] is True and plain["second_moments"] is False
    assert rel["bound"] == BOUND
    assert ev["sensitivity"] == pytest.approx(factor * math.sqrt(2.0) * BOUND, rel=1e-15)
    # the same target: √2 times the noise; the same RDP charge (the multiplier meets it)
    assert rel["noise_std"] == ev["sigma"]
    assert rel["noise_std"] == pytest.approx(math.sqrt(2.0) * plain["noise_std"], rel=1e-12)
    assert rel["rdp_charge"] == pytest.approx(gaussian_rdp(order, ev["sigma"],
                                                           ev["sensitivity"]), rel=1e-12)
    assert rel["rdp_charge"] == pytest.approx(plain["rdp_charge"], rel=1e-12)
    payload = _entries(client, ds)[-1]["payload"]
    assert payload["second_moments"] is True and payload["noise_std"] == rel["noise_std"]
    _audits_pass(client, ds)


def test_subsampled_queries_with_second_moments_scale_the_noise_by_sqrt_two(
        client: TestClient) -> None:
    order = _budget(client, "ds_smq")["admission_order"]
    rid = _reserve(client, "job_smq", "ds_smq")["reservation_id"]
    plain = _release(client, rid, "job_smq", 1.0, second_moments=False, sample_rate=0.1,
                     queries=5).json()
    r = _release(client, rid, "job_smq", 1.0, sample_rate=0.1, queries=5)
    assert r.status_code == 201, r.text
    rel = r.json()
    z = rel["event"]["noise_multiplier"]
    assert rel["event"]["kind"] == "dp_sgd" and z == plain["event"]["noise_multiplier"]
    assert rel["noise_std"] == pytest.approx(z * math.sqrt(2.0) * BOUND, rel=1e-15)
    assert rel["rdp_charge"] == pytest.approx(subsampled_rdp(z, 0.1, 5, order), rel=1e-9)
    _audits_pass(client, "ds_smq")


def test_second_moments_of_too_many_coordinates_are_refused(client: TestClient) -> None:
    _budget(client, "ds_smbig")
    rid = _reserve(client, "job_smbig", "ds_smbig")["reservation_id"]
    big = {"image_size": 64, "channels": 3, "downsample": 1}  # 12,288 coordinates
    r = _release(client, rid, "job_smbig", 1.0, shape=big)
    assert r.status_code == 400, r.text
    assert r.json()["code"] == "invalid_request" and r.json()["dimension"] == 64 * 64 * 3
    assert _release(client, rid, "job_smbig", 1.0, second_moments=False,
                    shape=big).status_code == 201  # the means alone have no such cap
    assert not [e for e in _entries(client, "ds_smbig")
                if e["kind"] == "central_images_released" and e["payload"]["second_moments"]]


def test_verify_detects_a_dropped_second_moment_flag_and_a_lowered_noise(
        client: TestClient, settings: LedgerSettings) -> None:
    _budget(client, "ds_smt")
    rid = _reserve(client, "job_smt", "ds_smt")["reservation_id"]
    assert _release(client, rid, "job_smt", 1.0).status_code == 201
    assert _release(client, rid, "job_smt", 1.0, sample_rate=0.1, queries=3).status_code == 201
    _audits_pass(client, "ds_smt")
    gaussian, subsampled = [e for e in _entries(client, "ds_smt")
                            if e["kind"] == "central_images_released"]
    _tamper(settings, ("UPDATE ledger.entries SET payload = jsonb_set(payload, "
                       "'{second_moments}', 'false'::jsonb) WHERE seq = :seq",
                       {"seq": gaussian["seq"]}))
    _tamper(settings, ("UPDATE ledger.entries SET payload = jsonb_set(payload, '{noise_std}', "
                       "to_jsonb(CAST(:noise AS double precision))) WHERE seq = :seq",
                       {"noise": subsampled["payload"]["noise_std"] / 2,
                        "seq": subsampled["seq"]}))
    problems = client.get("/v1/chain/verify").json()["problems"]
    assert any(p.startswith(f"entry {gaussian['seq']}: a central-image release's sensitivity")
               for p in problems), problems
    assert any(p.startswith(f"entry {subsampled['seq']}: recorded noise std")
               for p in problems), problems
