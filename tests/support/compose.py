"""docker-compose.yml and .env.example as data, for the static checks (tests/deploy) and the
test that starts the compose processes natively (tests/e2e/test_compose_native.py).

Compose semantics implemented here, and only these: YAML anchors and merge keys (PyYAML),
``${VAR}``, ``${VAR:-default}``, ``${VAR-default}`` and ``${VAR:?message}`` interpolation from
the project's .env, ``env_file`` then ``environment`` (the latter wins), and the dependency
order of ``depends_on``.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import subprocess
import sys
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml
from pydantic import BaseModel

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
ENV_EXAMPLE = REPO / ".env.example"
GEN_SECRETS = REPO / "scripts" / "gen_secrets.py"
SETTINGS_PREFIXES = ("DPSYNTH_API_", "DPSYNTH_LEDGER_", "DPSYNTH_WORKER_")

_INTERPOLATION = re.compile(
    r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:-|-|:\?|\?)(?P<arg>[^}]*))?\}")
_COMMENTED = re.compile(r"^#\s*(?P<name>[A-Z][A-Z0-9_]*)=")


def load_compose(path: Path = COMPOSE_FILE) -> dict[str, Any]:
    """The compose file with anchors and merge keys resolved."""
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict)
    return data


def gen_secrets_module() -> ModuleType:
    """scripts/gen_secrets.py as a module (its env-file parser is the one compose reads)."""
    spec = importlib.util.spec_from_file_location("gen_secrets", GEN_SECRETS)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_env_file(path: Path) -> dict[str, str]:
    """``NAME=value`` lines of a .env file (quotes removed, comments skipped)."""
    result: dict[str, str] = gen_secrets_module().parse_env(path.read_text())
    return result


def commented_names(path: Path) -> set[str]:
    """Names that appear only as ``# NAME=...`` (optional settings, unset by default)."""
    return {m["name"] for line in path.read_text().splitlines()
            if (m := _COMMENTED.match(line.strip()))}


def generate_env(dest: Path, *, example: Path = ENV_EXAMPLE) -> tuple[dict[str, str], str]:
    """Run ``scripts/gen_secrets.py`` (the documented command) into ``dest``; return the
    values it wrote and what it printed."""
    done = subprocess.run([sys.executable, str(GEN_SECRETS), "--example", str(example),
                           "--output", str(dest)], capture_output=True, text=True, check=True)
    return parse_env_file(dest), done.stdout


def interpolate(value: str, variables: Mapping[str, str]) -> str:
    """Compose's ``${...}`` interpolation of one string."""
    def one(match: re.Match[str]) -> str:
        name, op, arg = match["name"], match["op"], match["arg"]
        current = variables.get(name)
        if op == ":-":
            return current if current else arg
        if op == "-":
            return current if current is not None else arg
        if op in (":?", "?"):
            if current is None or (op == ":?" and not current):
                raise KeyError(f"{name}: {arg}")
            return current
        return current or ""

    return _INTERPOLATION.sub(one, value)


def _environment_items(service: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        for item in env:
            name, _, value = str(item).partition("=")
            yield name, value
    else:
        for name, value in env.items():
            yield name, "" if value is None else str(value)


def service_environment(service: Mapping[str, Any], dotenv: Mapping[str, str]) -> dict[str, str]:
    """The variables compose gives a service's container: its env_file(s), read as .env
    (the project's .env is the only env_file here), then ``environment``, interpolated."""
    env: dict[str, str] = {}
    env_files = service.get("env_file") or []
    if isinstance(env_files, str | dict):
        env_files = [env_files]
    for entry in env_files:
        path = entry["path"] if isinstance(entry, dict) else entry
        assert path in (".env", "./.env"), f"unexpected env_file {path}"
        env.update(dotenv)
    for name, value in _environment_items(service):
        env[name] = interpolate(value, dotenv)
    return env


def start_order(services: Mapping[str, Any], wanted: set[str]) -> list[str]:
    """``wanted`` and everything they depend on, dependencies first (compose's order)."""
    order: list[str] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"dependency cycle {(*path, name)}"
        if name in order:
            return
        for dep in depends_on(services[name]):
            visit(dep, (*path, name))
        order.append(name)

    for name in sorted(wanted):
        visit(name, ())
    return order


def depends_on(service: Mapping[str, Any]) -> dict[str, str]:
    """``{dependency: condition}`` (the short list form means ``service_started``)."""
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return {d: "service_started" for d in deps}
    return {name: (spec or {}).get("condition", "service_started")
            for name, spec in deps.items()}


def is_one_shot(service: Mapping[str, Any]) -> bool:
    return str(service.get("restart", "no")) == "no"


def settings_fields() -> dict[str, type[Any] | Any]:
    """Every environment variable the api, ledger and worker settings read, with the
    annotation of its field (nested blocks flattened with ``__``)."""
    from dpsynth_api.settings import ApiSettings
    from dpsynth_ledger.settings import LedgerSettings
    from dpsynth_worker.settings import WorkerSettings

    fields: dict[str, Any] = {}

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            args = typing.get_args(field.annotation) or (field.annotation,)
            nested = [a for a in args if inspect.isclass(a) and issubclass(a, BaseModel)]
            if nested:
                walk(nested[0], f"{prefix}{name.upper()}__")
            else:
                fields[f"{prefix}{name.upper()}"] = field.annotation

    for cls in (ApiSettings, LedgerSettings, WorkerSettings):
        walk(cls, str(cls.model_config["env_prefix"]))
    return fields
