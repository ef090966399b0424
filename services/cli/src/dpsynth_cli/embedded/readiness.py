"""Wait for a service ``dpsynth up`` started, trusting only answers that prove it is ours.

Issue 14, item 3: a port that was free when ``up`` checked it can be taken before the
service binds it. The service then dies with "address already in use" while a foreign
server answers ``/readyz`` on that port, and ``up`` used to report the platform running and
point the worker and the CLI at that server (with the admin key and private uploads). Here
every probe sends a fresh challenge and an answer counts only with the HMAC under the
service's per-start instance secret (dpsynth_shared.instance_proof); every poll also checks
that each service started so far is still alive, and names the one that died, its port and
the cause from its log.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from dpsynth_shared.instance_proof import PROOF_HEADER, new_challenge, proves_instance

from dpsynth_cli.embedded.processes import PlatformError, ProcessRecord, log_tail

HOST = "127.0.0.1"
_PORT_TAKEN = ("address already in use", "errno 98")


@dataclass(frozen=True)
class Service:
    """A service process of this start: its record, the port it was told to bind and the
    instance secret it was given (through its environment)."""

    record: ProcessRecord
    port: int
    secret: str

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"


def probe(url: str, secret: str, *, timeout: float = 2.0) -> tuple[httpx.Response | None, bool]:
    """``GET {url}/readyz?challenge=...`` with a fresh challenge.

    Returns:
        The answer (None when nothing answers) and whether it carries the proof of
        ``secret``, i.e. comes from the process that was given that instance secret.
    """
    challenge = new_challenge()
    try:
        response = httpx.get(f"{url}/readyz", params={"challenge": challenge}, timeout=timeout)
    except httpx.TransportError:
        return None, False
    return response, proves_instance(secret, challenge, response.headers.get(PROOF_HEADER))


def ensure_alive(services: Sequence[Service]) -> None:
    """Raise when a service of this start has exited (the cause from the end of its log).

    Raises:
        PlatformError: naming the service, its port and why it exited.
    """
    for service in services:
        if service.record.is_running():
            continue
        tail = log_tail(service.record.log)
        cause = ""
        if any(marker in tail.lower() for marker in _PORT_TAKEN):
            cause = (f": port {service.port} is taken by another process (address already "
                     f"in use); stop that process or choose another port "
                     f"(`dpsynth up --{service.name}-port`)")
        raise PlatformError(f"{service.name} (port {service.port}) exited during start"
                            f"{cause}. The end of {service.record.log}:\n{tail}")


def foreign_server(service: Service, status: int) -> PlatformError:
    """The error for an answer on the service's port that lacks its instance proof."""
    return PlatformError(
        f"the server answering on {HOST}:{service.port} (HTTP {status} on /readyz) is not "
        f"this platform's {service.name}: it did not prove this start's instance secret. "
        f"Another program holds port {service.port}; nothing was pointed at it. Stop that "
        f"program or choose another port (`dpsynth up --{service.name}-port`).")


def wait_ready(service: Service, *, watch: Sequence[Service], timeout: float,
               ledger_behind: bool = False) -> bool:
    """Wait until ``service`` answers ``/readyz`` with its proof.

    A ledger whose database is behind its anchor (a restored backup) serves reads and
    refuses admissions until ``dpsynth ledger reconcile-after-restore``: it counts as
    started (True is returned), and so does an api whose only failing check is that ledger
    (``ledger_behind``).

    An unproven 2xx fails at once: something else claims to be ready on our port. An
    unproven error answer is waited out (our process, unable to bind, exits and
    :func:`ensure_alive` says why), and named when the time is up.

    Raises:
        PlatformError: a service in ``watch`` exited, a foreign server answers, or
            ``timeout`` seconds passed.
    """
    deadline = time.monotonic() + timeout
    unproven: int | None = None
    while time.monotonic() < deadline:
        ensure_alive(watch)
        response, proven = probe(service.url, service.secret)
        if response is not None and not proven:
            if response.is_success:
                raise foreign_server(service, response.status_code)
            unproven = response.status_code
        elif response is not None:
            unproven = None
            verdict = _verdict(service.name, response, ledger_behind)
            if verdict is not None:
                return verdict
        time.sleep(0.3)
    ensure_alive(watch)
    if unproven is not None:
        raise foreign_server(service, unproven)
    raise PlatformError(f"{service.name} not ready after {timeout}s; the end of "
                        f"{service.record.log}:\n{log_tail(service.record.log)}")


def _verdict(name: str, response: httpx.Response, ledger_behind: bool) -> bool | None:
    """True: ledger behind its anchor; False: ready; None: not ready yet."""
    if response.status_code == 200:
        return False
    if response.status_code != 503:
        return None
    body = _json_or_empty(response)
    if name == "ledger" and body.get("code") == "ledger_behind_anchor":
        return True
    checks = body.get("checks")
    if ledger_behind and isinstance(checks, dict) and checks and all(
            ok for check, ok in checks.items() if check != "ledger"):
        return False
    return None


def _json_or_empty(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
