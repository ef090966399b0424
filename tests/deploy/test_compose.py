"""Static checks of docker-compose.yml, .env.example and scripts/gen_secrets.py (seconds).

The compose file validates against the vendored, pinned compose-spec schema; its structure
(health checks, dependency conditions, the GPU reservation, the CPU profile, what is
published) is what docs/deploy.md promises; .env.example lists exactly the settings the
services read, with secrets empty; and what gen_secrets.py writes makes the three settings
classes load (strong secrets, valid Ed25519 keys, matching tokens).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from dpsynth_shared.grants import public_key_of
from pydantic import SecretStr

from tests.support.compose import (
    COMPOSE_FILE,
    ENV_EXAMPLE,
    REPO,
    SETTINGS_PREFIXES,
    commented_names,
    depends_on,
    generate_env,
    is_one_shot,
    load_compose,
    parse_env_file,
    service_environment,
    settings_fields,
    start_order,
)

SCHEMA = REPO / "deploy" / "schemas" / "compose-spec.json"
# deploy/schemas/README.md: check-jsonschema 0.39.0's vendored copy of compose-spec's schema.
COMPOSE_SCHEMA_SHA256 = "d549057ebc2925f39f62799eab0db7b9e2c18b35b6c00595199116da3ed10e64"
CHECK_JSONSCHEMA = Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin" / "check-jsonschema"

SERVICES = {"postgres", "redis", "minio", "minio-init", "ledger-migrate", "api-migrate",
            "ledger", "api", "worker", "worker-cpu", "prometheus", "grafana"}
ONE_SHOTS = {"minio-init", "ledger-migrate", "api-migrate"}
IMAGES = {"api": "ghcr.io/dpsynth/dpsynth-api", "api-migrate": "ghcr.io/dpsynth/dpsynth-api",
          "ledger": "ghcr.io/dpsynth/dpsynth-ledger",
          "ledger-migrate": "ghcr.io/dpsynth/dpsynth-ledger",
          "worker": "ghcr.io/dpsynth/dpsynth-worker",
          "worker-cpu": "ghcr.io/dpsynth/dpsynth-worker"}
COMMANDS = {"ledger-migrate": ["python", "-m", "dpsynth_ledger", "migrate"],
            "api-migrate": ["python", "-m", "dpsynth_api", "migrate"],
            "ledger": ["python", "-m", "dpsynth_ledger", "serve"],
            "api": ["python", "-m", "dpsynth_api"],
            "worker": ["python", "-m", "dpsynth_worker"],
            "worker-cpu": ["python", "-m", "dpsynth_worker"]}
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|SIGNING_KEY|HASH_KEY|ACCESS_KEY")
REFERENCE_ONLY = re.compile(r"^(\$\{[A-Za-z_][A-Za-z0-9_]*(:[?-][^}]*)?\})$")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_compose()


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    return compose["services"]


@pytest.fixture(scope="module")
def example() -> dict[str, str]:
    return parse_env_file(ENV_EXAMPLE)


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], str]:
    path = tmp_path_factory.mktemp("gen-secrets") / ".env"
    values, printed = generate_env(path)
    return path, values, printed


@pytest.fixture()
def settings_env(generated: tuple[Path, dict[str, str], str],
                 monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """The process environment a service container gets from .env, nothing else."""
    for name in list(os.environ):
        if name.startswith("DPSYNTH_"):
            monkeypatch.delenv(name)
    values = generated[1]
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    yield values


# -- the schema --------------------------------------------------------------------------

def test_the_vendored_schema_is_the_pinned_one() -> None:
    assert hashlib.sha256(SCHEMA.read_bytes()).hexdigest() == COMPOSE_SCHEMA_SHA256
    assert COMPOSE_SCHEMA_SHA256 in (SCHEMA.parent / "README.md").read_text()


def test_compose_file_validates_against_the_compose_spec_schema() -> None:
    done = subprocess.run([str(CHECK_JSONSCHEMA), "--schemafile", str(SCHEMA),
                           str(COMPOSE_FILE)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_schema_check_rejects_an_unknown_service_key(tmp_path: Path) -> None:
    """The schema is strict enough to catch a misspelt key (it is not a no-op)."""
    data = load_compose()
    data["services"]["worker"]["stop_grace_perod"] = "10m"
    bad = tmp_path / "docker-compose.yml"
    bad.write_text(yaml.safe_dump(data))
    done = subprocess.run([str(CHECK_JSONSCHEMA), "--schemafile", str(SCHEMA), str(bad)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "stop_grace_perod" in done.stdout


# -- structure -----------------------------------------------------------------------------

def test_the_agreed_services_and_images(services: dict[str, Any]) -> None:
    assert set(services) == SERVICES
    for name, repo in IMAGES.items():
        image = services[name]["image"]
        assert image.startswith(f"{repo}:"), (name, image)
        build = services[name]["build"]
        assert build["context"] == "."
        assert build["dockerfile"] == f"services/{repo.rsplit('-', 1)[1]}/Dockerfile"
        assert services[name]["command"] == COMMANDS[name]
    for name, service in services.items():
        if name not in IMAGES:
            # Third-party images are pinned to a release, never a floating tag.
            tag = service["image"].rsplit(":", 1)[1]
            assert re.search(r"\d", tag) and tag not in {"latest", "stable"}, service["image"]


def test_every_long_running_service_has_a_healthcheck_and_a_restart_policy(
        services: dict[str, Any]) -> None:
    for name, service in services.items():
        if name in ONE_SHOTS:
            assert is_one_shot(service), name
            continue
        assert service.get("restart") == "unless-stopped", name
        check = service.get("healthcheck")
        assert check and check.get("test") and not check.get("disable"), name


def test_dependencies_wait_for_health_or_completion(services: dict[str, Any]) -> None:
    for name, service in services.items():
        for dep, condition in depends_on(service).items():
            expected = ("service_completed_successfully" if dep in ONE_SHOTS
                        else "service_healthy")
            assert condition == expected, (name, dep, condition)
    deps = {name: set(depends_on(s)) for name, s in services.items()}
    assert {"ledger-migrate", "minio-init", "postgres"} <= deps["ledger"]
    assert {"api-migrate", "minio-init", "ledger", "redis"} <= deps["api"]
    for worker in ("worker", "worker-cpu"):
        assert {"api", "ledger", "redis", "minio-init"} <= deps[worker]
    assert deps["minio-init"] == {"minio"}
    assert deps["ledger-migrate"] == deps["api-migrate"] == {"postgres"}
    order = start_order(services, {"api", "worker"})
    assert order.index("minio-init") < order.index("ledger") < order.index("api")


def test_worker_reserves_gpus_and_the_cpu_worker_is_a_profile(services: dict[str, Any]) -> None:
    worker, cpu = services["worker"], services["worker-cpu"]
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)
    assert "profiles" not in worker
    assert cpu["profiles"] == ["cpu"]
    assert "deploy" not in cpu
    assert cpu["image"] == f"{worker['image']}-cpu"
    assert cpu["build"]["dockerfile"] == worker["build"]["dockerfile"]
    dockerfile = REPO / worker["build"]["dockerfile"]
    for arg in cpu["build"].get("args", {}):
        # The CPU variant's build argument must be one the worker's Dockerfile declares.
        assert re.search(rf"^ARG {arg}\b", dockerfile.read_text(), re.M), arg


def _seconds(duration: str) -> float:
    units = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)",
                                                         duration))


def test_workers_have_time_to_checkpoint_on_sigterm(services: dict[str, Any]) -> None:
    for name in ("worker", "worker-cpu"):
        assert services[name].get("stop_signal", "SIGTERM") == "SIGTERM"
        assert _seconds(services[name]["stop_grace_period"]) >= 300, name


def test_only_the_api_minio_and_grafana_are_published(compose: dict[str, Any],
                                                      services: dict[str, Any]) -> None:
    published = {name for name, s in services.items() if s.get("ports")}
    assert published == {"api", "minio", "grafana"}
    assert "ports" not in services["ledger"]
    assert compose["networks"]["backend"]["internal"] is True
    for name in ("ledger", "postgres", "redis", "prometheus", "worker"):
        assert set(services[name]["networks"]) == {"backend"}, name
    for name in published:
        for port in services[name]["ports"]:
            assert str(port).startswith("${PUBLISH_BIND:-127.0.0.1}:"), (name, port)


def test_mounted_files_and_dockerfiles_exist(services: dict[str, Any]) -> None:
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = str(volume).split(":", 1)[0]
            if source.startswith("./"):
                assert (REPO / source).exists(), (name, source)
        if "build" in service:
            assert (REPO / service["build"]["dockerfile"]).is_file(), name


def test_prometheus_scrapes_api_ledger_and_workers_where_compose_serves_them(
        services: dict[str, Any], example: dict[str, str]) -> None:
    config = yaml.safe_load((REPO / "deploy/prometheus/prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["dpsynth-api"]["static_configs"][0]["targets"] == [
        f"api:{example['DPSYNTH_API_PORT']}"]
    assert jobs["dpsynth-ledger"]["static_configs"][0]["targets"] == [
        f"ledger:{example['DPSYNTH_LEDGER_PORT']}"]
    sd = jobs["dpsynth-worker"]["dns_sd_configs"][0]
    assert sd["names"] == ["worker"] and sd["port"] == int(example["DPSYNTH_WORKER_METRICS_PORT"])
    # The CPU workers answer to the DNS name `worker` as well.
    assert "worker" in services["worker-cpu"]["networks"]["backend"]["aliases"]
    for name in ("api", "ledger", "worker"):
        assert "backend" in services[name]["networks"]
    assert "backend" in services["prometheus"]["networks"]


def test_prometheus_presents_the_generated_metrics_tokens(
        compose: dict[str, Any], services: dict[str, Any], example: dict[str, str]) -> None:
    """Issue 14, item 11: the api's and the ledger's /metrics need their metrics token; the
    scrape jobs read it from a compose secret made from the same .env variable."""
    from tests.support.compose import gen_secrets_module

    config = yaml.safe_load((REPO / "deploy/prometheus/prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    for job, variable in (("dpsynth-api", "DPSYNTH_API_METRICS_TOKEN"),
                          ("dpsynth-ledger", "DPSYNTH_LEDGER_METRICS_TOKEN")):
        auth = jobs[job]["authorization"]
        name = auth["credentials_file"].removeprefix("/run/secrets/")
        assert auth["type"] == "Bearer" and name in services["prometheus"]["secrets"]
        assert compose["secrets"][name] == {"environment": variable}
        assert variable in example and variable in gen_secrets_module().SECRETS


def test_grafana_is_provisioned_from_deploy_grafana(services: dict[str, Any]) -> None:
    mounts = {v.split(":")[1]: v.split(":")[0] for v in services["grafana"]["volumes"]}
    assert mounts["/etc/grafana/provisioning/datasources"] == \
        "./deploy/grafana/provisioning/datasources"
    assert mounts["/etc/grafana/provisioning/dashboards"] == \
        "./deploy/grafana/provisioning/dashboards"
    provider = yaml.safe_load(
        (REPO / "deploy/grafana/provisioning/dashboards/dpsynth.yaml").read_text())
    assert mounts[provider["providers"][0]["options"]["path"]] == "./deploy/grafana/dashboards"
    datasource = yaml.safe_load(
        (REPO / "deploy/grafana/provisioning/datasources/prometheus.yaml").read_text())
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"


def test_app_services_read_dot_env_and_infrastructure_gets_only_its_variables(
        services: dict[str, Any]) -> None:
    for name in IMAGES:
        assert services[name]["env_file"] == [{"path": ".env", "required": True}], name
    for name in SERVICES - set(IMAGES):
        assert "env_file" not in services[name], name


# -- secrets -------------------------------------------------------------------------------

def _environment_values(services: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    for name, service in services.items():
        env = service.get("environment") or {}
        for key, value in env.items():
            yield name, key, str(value)


def test_no_secret_value_is_written_in_the_compose_file(
        services: dict[str, Any], generated: tuple[Path, dict[str, str], str]) -> None:
    for name, key, value in _environment_values(services):
        if SECRET_NAME.search(key):
            assert REFERENCE_ONLY.match(value), (name, key, value)
    text = COMPOSE_FILE.read_text()
    _, values, _ = generated
    for secret in (values[n] for n in _generated_names(generated)):
        assert secret not in text


def _generated_names(generated: tuple[Path, dict[str, str], str]) -> list[str]:
    return [line.strip() for line in generated[2].splitlines()[1:] if line.strip()]


def test_env_example_lists_exactly_the_settings_the_services_read(
        example: dict[str, str]) -> None:
    fields = set(settings_fields())
    listed = set(example) | commented_names(ENV_EXAMPLE)
    assert fields - listed == set(), "settings missing from .env.example"
    stale = {n for n in listed if n.startswith(SETTINGS_PREFIXES)} - fields
    assert stale == set(), "names in .env.example that no settings class reads"
    # Required settings cannot be commented out.
    for name in commented_names(ENV_EXAMPLE):
        assert name not in example or name in fields


def test_secrets_in_env_example_are_empty_or_references(example: dict[str, str]) -> None:
    from tests.support.compose import gen_secrets_module

    gen = gen_secrets_module()
    fields = settings_fields()
    secret_fields = {n for n, ann in fields.items()
                     if ann is SecretStr or "SecretStr" in str(ann)}
    for name in secret_fields | set(gen.SECRETS) | set(gen.PUBLIC_KEYS):
        value = example.get(name, "")
        refs = re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}", "", value)
        # What is left besides references is JSON punctuation of a token list.
        assert re.fullmatch(r"[\[\]\",\s]*", refs), (name, value)
    for name in gen.SECRETS:
        assert example[name] == "", name
    for name in ("DPSYNTH_API_DATABASE__URL", "DPSYNTH_LEDGER_DATABASE__URL"):
        assert re.search(r"://[a-z_]+:\$\{POSTGRES_[A-Z_]+_PASSWORD\}@postgres:5432/",
                         example[name]), name


def test_gen_secrets_writes_a_private_file_and_never_overwrites(
        generated: tuple[Path, dict[str, str], str], tmp_path: Path) -> None:
    path, values, printed = generated
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    names = _generated_names(generated)
    from tests.support.compose import gen_secrets_module

    gen = gen_secrets_module()
    assert set(names) == set(gen.SECRETS) | set(gen.PUBLIC_KEYS)
    for name in names:
        assert values[name] and values[name] not in printed
    assert not [n for n, v in values.items() if "${" in v]
    again = subprocess.run([sys.executable, str(REPO / "scripts/gen_secrets.py"),
                            "--output", str(path)], capture_output=True, text=True)
    assert again.returncode != 0 and "--force" in again.stderr
    assert parse_env_file(path) == values
    forced = subprocess.run([sys.executable, str(REPO / "scripts/gen_secrets.py"),
                             "--output", str(path), "--force"], capture_output=True, text=True)
    assert forced.returncode == 0
    assert parse_env_file(path)["DPSYNTH_API_WORKER_TOKEN"] != values["DPSYNTH_API_WORKER_TOKEN"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_gen_secrets_keeps_secrets_already_set(tmp_path: Path) -> None:
    example = tmp_path / "example"
    example.write_text(ENV_EXAMPLE.read_text().replace(
        "\nDPSYNTH_API_RECORD_HASH_KEY=\n", "\nDPSYNTH_API_RECORD_HASH_KEY=kept-kept-kept-kept\n"))
    values, printed = generate_env(tmp_path / ".env", example=example)
    assert values["DPSYNTH_API_RECORD_HASH_KEY"] == "kept-kept-kept-kept"
    assert "DPSYNTH_API_RECORD_HASH_KEY" not in printed


def test_generated_env_loads_every_settings_class(settings_env: dict[str, str]) -> None:
    """Strong secrets, valid Ed25519 keys, and the pairs that must match do match."""
    from dpsynth_api.settings import ApiSettings
    from dpsynth_ledger.settings import LedgerSettings
    from dpsynth_worker.settings import WorkerSettings

    api = ApiSettings()  # type: ignore[call-arg]
    ledger = LedgerSettings()  # type: ignore[call-arg]
    worker = WorkerSettings()  # type: ignore[call-arg]
    tokens = [t.get_secret_value() for t in ledger.service_tokens]
    assert api.ledger.token.get_secret_value() in tokens
    assert worker.ledger.token.get_secret_value() in tokens
    assert api.ledger.token.get_secret_value() != worker.ledger.token.get_secret_value()
    assert worker.api.token.get_secret_value() == api.worker_token.get_secret_value()
    assert api.grant_public_key == worker.grant_public_key == ledger.grant_public_key
    assert ledger.grant_signing_key.get_secret_value() != \
        ledger.chain_signing_key.get_secret_value()
    env = settings_env
    assert public_key_of(env["DPSYNTH_LEDGER_GRANT_SIGNING_KEY"]) == api.grant_public_key
    assert f":{env['POSTGRES_API_PASSWORD']}@postgres:5432/" in api.database.url
    assert f":{env['POSTGRES_LEDGER_PASSWORD']}@postgres:5432/" in ledger.database.url
    for store in (api.object_store, worker.object_store):
        assert store.kind == "s3" and store.endpoint == "minio:9000"
        assert store.access_key.get_secret_value() == env["MINIO_APP_ACCESS_KEY"]
        assert store.secret_key.get_secret_value() == env["MINIO_APP_SECRET_KEY"]
    assert api.object_store.public_endpoint == "localhost:9000"
    assert ledger.anchor.kind == "s3"
    assert ledger.anchor.s3_access_key.get_secret_value() == env["MINIO_ANCHOR_ACCESS_KEY"]
    assert ledger.anchor.s3_secret_key.get_secret_value() == env["MINIO_ANCHOR_SECRET_KEY"]
    assert api.ledger_timeout_s > 0 and worker.metrics_port == 9100
    assert json.loads(env["DPSYNTH_LEDGER_SERVICE_TOKENS"]) == tokens


def test_infrastructure_gets_the_generated_passwords(
        services: dict[str, Any], generated: tuple[Path, dict[str, str], str]) -> None:
    _, values, _ = generated
    pg = service_environment(services["postgres"], values)
    assert pg["POSTGRES_PASSWORD"] == values["POSTGRES_PASSWORD"]
    init = service_environment(services["minio-init"], values)
    assert init["MINIO_APP_SECRET_KEY"] == values["DPSYNTH_API_OBJECT_STORE__SECRET_KEY"]
    assert init["MINIO_ANCHOR_SECRET_KEY"] == values["DPSYNTH_LEDGER_ANCHOR__S3_SECRET_KEY"]
    assert init["DPSYNTH_ANCHOR_BUCKET"] == values["DPSYNTH_LEDGER_ANCHOR__S3_BUCKET"]
    grafana = service_environment(services["grafana"], values)
    assert grafana["GF_SECURITY_ADMIN_PASSWORD"] == values["GF_SECURITY_ADMIN_PASSWORD"]
    with pytest.raises(KeyError, match="gen_secrets"):
        service_environment(services["postgres"], {})


def test_redis_requires_the_generated_password_and_the_brokers_use_it(
        services: dict[str, Any], example: dict[str, str],
        generated: tuple[Path, dict[str, str], str]) -> None:
    """Issue 14 item 17: compose's Redis runs with requirepass from .env, not a literal."""
    from tests.support.compose import gen_secrets_module, interpolate

    _, values, _ = generated
    assert gen_secrets_module().SECRETS["REDIS_PASSWORD"] == "password"
    assert example["REDIS_PASSWORD"] == "" and values["REDIS_PASSWORD"]
    redis = services["redis"]
    command = [str(arg) for arg in redis["command"]]
    assert "--requirepass" in command
    reference = command[command.index("--requirepass") + 1]
    assert REFERENCE_ONLY.match(reference) and "REDIS_PASSWORD:?" in reference, reference
    assert interpolate(reference, values) == values["REDIS_PASSWORD"]
    with pytest.raises(KeyError, match="gen_secrets"):
        interpolate(reference, {})
    # The health check authenticates (REDISCLI_AUTH), else it would see only NOAUTH.
    env = service_environment(redis, values)
    assert env["REDISCLI_AUTH"] == values["REDIS_PASSWORD"]
    assert "PONG" in json.dumps(redis["healthcheck"]["test"])
    for name in ("DPSYNTH_API_BROKER_URL", "DPSYNTH_WORKER_BROKER_URL"):
        assert example[name] == "redis://:${REDIS_PASSWORD}@redis:6379/0", name
        assert values[name] == f"redis://:{values['REDIS_PASSWORD']}@redis:6379/0", name


def test_init_scripts_parse_and_make_what_the_services_expect(
        services: dict[str, Any], example: dict[str, str],
        generated: tuple[Path, dict[str, str], str]) -> None:
    scripts = {"minio-init": REPO / "deploy/minio/init.sh",
               "postgres": REPO / "deploy/postgres/init-databases.sh"}
    for path in scripts.values():
        done = subprocess.run(["sh", "-n", str(path)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    minio = scripts["minio-init"].read_text()
    assert re.search(r'mc mb --ignore-existing --with-lock local/"\$ANCHOR_BUCKET"', minio)
    assert 'mc version enable local/"$ANCHOR_BUCKET"' in minio
    env = service_environment(services["minio-init"], generated[1])
    assert env["DPSYNTH_BUCKET"] == example["DPSYNTH_API_OBJECT_STORE__BUCKET"] == \
        example["DPSYNTH_WORKER_OBJECT_STORE__BUCKET"] == "dpsynth"
    assert env["DPSYNTH_ANCHOR_BUCKET"] == "dpsynth-ledger-anchor"
    # The anchor user may not delete: the anchor is what a restored database is checked against.
    anchor_policy = minio.split("dpsynth-ledger-anchor.json\" <<JSON", 1)[1].split("JSON", 1)[0]
    assert "Delete" not in anchor_policy and "s3:*" not in anchor_policy
    postgres = scripts["postgres"].read_text()
    for role in ("dpsynth_api", "dpsynth_ledger"):
        assert f"CREATE DATABASE {role} OWNER {role};" in postgres
        assert re.search(rf"://{role}:\$\{{POSTGRES_\w+\}}@postgres:5432/{role}$",
                         example[f"DPSYNTH_{role.split('_')[1].upper()}_DATABASE__URL"])
