"""The whole platform as real processes for end-to-end tests.

Starts ``python -m dpsynth_ledger``, ``python -m dpsynth_api`` and N ``python -m
dpsynth_worker`` processes against the session's real PostgreSQL, Redis and S3 server, with
the env documented in docs/architecture.md. Workers can be killed (SIGKILL) and started
again to exercise the reaper and resumption.
"""

from __future__ import annotations

import itertools
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from dpsynth_shared.grants import generate_signing_key, public_key_of
from dpsynth_shared.instance_proof import (
    PROOF_HEADER,
    new_challenge,
    new_instance_secret,
    proves_instance,
)

from tests.support.servers import free_port, stop_process_groups

_REDIS_DBS = itertools.cycle(range(12, 16))


@dataclass
class ServicePlatform:
    workdir: Path
    database_url: str
    broker_url: str
    s3_endpoint: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        # A Redis database of its own, so one platform's workers never see another's queue.
        self.broker_url = f"{self.broker_url.rsplit('/', 1)[0]}/{next(_REDIS_DBS)}"
        self.ledger_port = free_port()
        self.api_port = free_port()
        while self.api_port == self.ledger_port:  # two probes may be handed the same port
            self.api_port = free_port()
        # Each process proves it is ours on /readyz?challenge= (dpsynth_shared.instance_proof),
        # so a wait never mistakes another server on a reused port for it (issue 14, item 3).
        self.instance_secrets = {"ledger": new_instance_secret(), "api": new_instance_secret()}
        self.signing_key = generate_signing_key()
        self.public_key = public_key_of(self.signing_key)
        self.chain_signing_key = generate_signing_key()
        self.anchor_path = self.workdir / "ledger-anchor.jsonl"
        self.api_ledger_token = secrets.token_urlsafe(24)
        self.worker_ledger_token = secrets.token_urlsafe(24)
        self.worker_token = secrets.token_urlsafe(24)
        self.record_hash_key = secrets.token_urlsafe(32)
        self.credentials_file = self.workdir / "credentials.json"
        self.bucket = f"e2e-{secrets.token_hex(4)}"

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def ledger_url(self) -> str:
        return f"http://127.0.0.1:{self.ledger_port}"

    def _store_env(self, prefix: str) -> dict[str, str]:
        if self.s3_endpoint is None:
            return {f"{prefix}OBJECT_STORE__KIND": "local",
                    f"{prefix}OBJECT_STORE__ROOT": str(self.workdir / "objects")}
        return {
            f"{prefix}OBJECT_STORE__KIND": "s3",
            f"{prefix}OBJECT_STORE__ENDPOINT": self.s3_endpoint,
            f"{prefix}OBJECT_STORE__PUBLIC_ENDPOINT": self.s3_endpoint,
            f"{prefix}OBJECT_STORE__ACCESS_KEY": "dpsynth-e2e-access",
            f"{prefix}OBJECT_STORE__SECRET_KEY": "dpsynth-e2e-secret-key",
            f"{prefix}OBJECT_STORE__BUCKET": self.bucket,
        }

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DPSYNTH_")}
        env.update({
            "XDG_RUNTIME_DIR": os.environ.get("XDG_RUNTIME_DIR", "/tmp"),
            "DPSYNTH_LEDGER_DATABASE__URL": self.database_url,
            "DPSYNTH_LEDGER_SERVICE_TOKENS": json.dumps(
                [self.api_ledger_token, self.worker_ledger_token]),
            "DPSYNTH_LEDGER_ADMIN_TOKENS": json.dumps([self.api_ledger_token]),
            "DPSYNTH_LEDGER_GRANT_SIGNING_KEY": self.signing_key,
            "DPSYNTH_LEDGER_CHAIN_SIGNING_KEY": self.chain_signing_key,
            "DPSYNTH_LEDGER_ANCHOR__PATH": str(self.anchor_path),
            "DPSYNTH_LEDGER_HOST": "127.0.0.1",
            "DPSYNTH_LEDGER_PORT": str(self.ledger_port),
            "DPSYNTH_LEDGER_INSTANCE_SECRET": self.instance_secrets["ledger"],
            "DPSYNTH_API_INSTANCE_SECRET": self.instance_secrets["api"],
            "DPSYNTH_API_DATABASE__URL": self.database_url,
            "DPSYNTH_API_BROKER_URL": self.broker_url,
            "DPSYNTH_API_LEDGER__URL": self.ledger_url,
            "DPSYNTH_API_LEDGER__TOKEN": self.api_ledger_token,
            "DPSYNTH_API_WORKER_TOKEN": self.worker_token,
            "DPSYNTH_API_RECORD_HASH_KEY": self.record_hash_key,
            "DPSYNTH_API_BOOTSTRAP_CREDENTIALS_FILE": str(self.credentials_file),
            "DPSYNTH_API_HOST": "127.0.0.1",
            "DPSYNTH_API_PORT": str(self.api_port),
            "DPSYNTH_API_GRANT_PUBLIC_KEY": self.public_key,
            "DPSYNTH_WORKER_BROKER_URL": self.broker_url,
            "DPSYNTH_WORKER_API__URL": self.api_url,
            "DPSYNTH_WORKER_API__TOKEN": self.worker_token,
            "DPSYNTH_WORKER_LEDGER__URL": self.ledger_url,
            "DPSYNTH_WORKER_LEDGER__TOKEN": self.worker_ledger_token,
            "DPSYNTH_WORKER_GRANT_PUBLIC_KEY": self.public_key,
            "DPSYNTH_WORKER_WORK_DIR": str(self.workdir / "work"),
        })
        env.update(self._store_env("DPSYNTH_API_"))
        env.update(self._store_env("DPSYNTH_WORKER_"))
        env.update(self.extra_env)
        return env

    def _spawn(self, name: str, module: str) -> subprocess.Popen[bytes]:
        log = (self.workdir / f"{name}.log").open("ab")
        proc = subprocess.Popen([sys.executable, "-m", module], env=self.env(), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = proc
        return proc

    def start(self, *, workers: int = 1) -> None:
        self.start_ledger()
        self._spawn("api", "dpsynth_api")
        self._wait_ready(self.api_url, "api")
        for i in range(workers):
            self.start_worker(i)

    def start_ledger(self, *, wait: bool = True) -> subprocess.Popen[bytes]:
        """Start (or restart, after :meth:`kill`) the ledger; wait for ``/readyz`` if asked."""
        proc = self._spawn("ledger", "dpsynth_ledger")
        if wait:
            self._wait_ready(self.ledger_url, "ledger")
        return proc

    def start_worker(self, index: int = 0) -> subprocess.Popen[bytes]:
        return self._spawn(f"worker-{index}", "dpsynth_worker")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs[name]
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        proc.wait(30)

    def _wait_ready(self, url: str, name: str, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            proc = self.procs[name]
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.log(name)}")
            try:
                challenge = new_challenge()
                r = httpx.get(f"{url}/readyz", params={"challenge": challenge}, timeout=2)
                ours = proves_instance(self.instance_secrets[name], challenge,
                                       r.headers.get(PROOF_HEADER))
                if r.status_code == 200 and ours:
                    return
                last = r.text if ours else f"not our {name} answers on {url}: {r.text[:200]}"
            except httpx.HTTPError as exc:
                last = str(exc)
            time.sleep(0.3)
        raise TimeoutError(f"{name} not ready: {last}\n{self.log(name)}")

    def log(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace")[-5000:] if path.exists() else ""

    def all_logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in self.workdir.glob("*.log"))

    def admin_key(self) -> str:
        return str(json.loads(self.credentials_file.read_text())["api_key"])

    def stop(self) -> None:
        stop_process_groups(list(self.procs.values()), timeout=20)
