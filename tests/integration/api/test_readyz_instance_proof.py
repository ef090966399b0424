"""Issue 14, item 3: ``/readyz?challenge=HEX`` of the api and of the ledger answers with the
HMAC of the challenge under the process's instance secret (header Dpsynth-Instance-Proof),
which is how ``dpsynth up`` tells its own process from a foreign server on the port; without
a challenge ``/readyz`` answers as before (compose, Kubernetes)."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable

import httpx
from dpsynth_ledger.app import create_app as create_ledger_app
from dpsynth_ledger.migrate import upgrade as upgrade_ledger
from dpsynth_shared.instance_proof import PROOF_HEADER, new_challenge, proves_instance
from fastapi.testclient import TestClient
from pydantic import SecretStr

from tests.integration.api.conftest import Api
from tests.integration.ledger.conftest import make_settings as ledger_settings

SECRET = "instance-secret-0123456789abcdef"


def _expected(secret: str, challenge: str) -> str:
    """The wire format, computed here on its own: HMAC-SHA256 over a domain tag + challenge."""
    return hmac.new(secret.encode(), b"dpsynth-readyz-instance-proof\x00" + challenge.encode(),
                    hashlib.sha256).hexdigest()


def _check_proofs(get: Callable[..., httpx.Response], ready_status: int) -> None:
    first, second = new_challenge(), new_challenge()
    r1 = get("/readyz", params={"challenge": first})
    r2 = get("/readyz", params={"challenge": second})
    for r, challenge in ((r1, first), (r2, second)):
        assert r.status_code == ready_status, r.text
        assert r.headers[PROOF_HEADER] == _expected(SECRET, challenge)
        assert proves_instance(SECRET, challenge, r.headers[PROOF_HEADER])
        assert SECRET not in r.text and SECRET not in str(r.headers)
    assert r1.headers[PROOF_HEADER] != r2.headers[PROOF_HEADER]  # no answer can be replayed
    assert not proves_instance("another-secret-0123456789abcdef", first, r1.headers[PROOF_HEADER])
    plain = get("/readyz")  # probes of compose and Kubernetes: unchanged, no proof
    assert plain.status_code == ready_status and PROOF_HEADER not in plain.headers
    for bad in ("xyz", "AB" * 20, "a" * 31, "a" * 129):
        refused = get("/readyz", params={"challenge": bad})
        assert refused.status_code == 400, (bad, refused.text)
        assert refused.headers["content-type"].startswith("application/problem+json")
        assert refused.json()["code"] == "invalid_request"


def test_the_api_proves_its_instance_secret_ready_or_not(make_api: Callable[..., Api]) -> None:
    api = make_api(instance_secret=SECRET)
    _check_proofs(api.client.get, 200)
    api.ledger.is_ready = False  # a 503 carries the proof too: `up` tells "ours, starting"
    _check_proofs(api.client.get, 503)
    unconfigured = make_api()
    r = unconfigured.client.get("/readyz", params={"challenge": new_challenge()})
    assert r.status_code == 200 and PROOF_HEADER not in r.headers


def test_the_ledger_proves_its_instance_secret(database_url: str) -> None:
    settings = ledger_settings(database_url, instance_secret=SecretStr(SECRET))
    upgrade_ledger(settings)
    with TestClient(create_ledger_app(settings)) as client:
        _check_proofs(client.get, 200)
    with TestClient(create_ledger_app(ledger_settings(database_url))) as client:
        r = client.get("/readyz", params={"challenge": new_challenge()})
        assert r.status_code == 200 and PROOF_HEADER not in r.headers
