"""Proof that the server answering ``/readyz`` is the process a launcher just started
(issue 14, item 3).

A port check and the bind that follows it race: another program can take the port in
between, and then a foreign ``/readyz`` answers in place of the process that died with
"address already in use". So ``dpsynth up`` gives each start of the api and the ledger a
fresh random *instance secret* (through the environment, never on a command line), sends
``GET /readyz?challenge=<random hex>`` and accepts only an answer whose
:data:`PROOF_HEADER` holds HMAC-SHA256(instance secret, challenge). The secret never
leaves the two processes; a fresh challenge per probe means a recorded answer cannot be
replayed. Without a challenge ``/readyz`` answers as before (compose, Kubernetes).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

from dpsynth_shared.errors import DpsynthError, ErrorCode

PROOF_HEADER = "Dpsynth-Instance-Proof"
"""Response header of ``/readyz?challenge=...`` holding the hex HMAC (only when a secret is
configured)."""
PROOF_SETTING_HELP = (
    "per-start secret: /readyz?challenge=HEX answers with its HMAC (header "
    "Dpsynth-Instance-Proof) so a launcher can tell this process from a foreign server on the "
    "port; `dpsynth up` sets a fresh one each start")
"""The description of the ``instance_secret`` setting of the api and the ledger."""

_CHALLENGE = re.compile(r"[0-9a-f]{32,128}")
# Domain separation: the MAC of a challenge cannot be mistaken for a MAC of anything else.
_DOMAIN = b"dpsynth-readyz-instance-proof\x00"


def new_instance_secret() -> str:
    """A fresh per-start secret (256 bits)."""
    return secrets.token_urlsafe(32)


def new_challenge() -> str:
    """A fresh challenge (256 bits, lower-case hex)."""
    return secrets.token_hex(32)


def instance_proof(secret: str, challenge: str) -> str:
    """HMAC-SHA256 of ``challenge`` under ``secret``, hex.

    Raises:
        DpsynthError: ``invalid_request`` when ``challenge`` is not 32 to 128 lower-case
            hex digits (bounded, so a probe cannot make the server hash large inputs).
    """
    if not _CHALLENGE.fullmatch(challenge):
        raise DpsynthError(ErrorCode.INVALID_REQUEST,
                           "challenge must be 32 to 128 lower-case hex digits")
    return hmac.new(secret.encode(), _DOMAIN + challenge.encode(), hashlib.sha256).hexdigest()


def proof_headers(secret: str | None, challenge: str | None) -> dict[str, str]:
    """The headers a ``/readyz`` answer carries: the proof when both a secret is configured
    and a challenge was sent, else none (an unconfigured server proves nothing)."""
    if secret is None or challenge is None:
        return {}
    return {PROOF_HEADER: instance_proof(secret, challenge)}


def proves_instance(secret: str, challenge: str, proof: str | None) -> bool:
    """Whether ``proof`` (the answer's :data:`PROOF_HEADER`) is the MAC of ``challenge``
    under ``secret`` (constant-time comparison)."""
    if not proof:
        return False
    return hmac.compare_digest(proof.strip().encode(), instance_proof(secret, challenge).encode())
