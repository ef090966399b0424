"""Static checks of the Kubernetes manifests under k8s/ (seconds; needs `kubectl` for kustomize).

Every rendering (the base and both overlays) is built with `kubectl kustomize`; core kinds
validate strictly against Kubernetes 1.32's schemas (kubernetes-validate); custom resources
(KEDA, ServiceMonitor) validate against the schemas vendored in k8s/schemas/, with unknown
fields rejected as the API server's strict field validation does. Then the promises of
k8s/README.md are checked on the rendered objects: who may reach the ledger, GPU scheduling,
probes, resources and the restricted security context on every container, no Secret values,
PodDisruptionBudgets, autoscaling, a grace period above the worker's checkpoint budget, and
that the ConfigMap plus the Secrets k8s/create_secrets.py makes load each service's settings.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from types import ModuleType
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.support.compose import COMPOSE_FILE, REPO, generate_env, load_compose

K8S = REPO / "k8s"
SCHEMAS = K8S / "schemas"
README = K8S / "README.md"
RENDERINGS = {"base": K8S / "base", "dev": K8S / "overlays" / "dev",
              "gpu": K8S / "overlays" / "gpu"}
OVERLAYS = ("dev", "gpu")
# The Kubernetes version the core kinds are checked against (shipped by kubernetes-validate).
KUBERNETES_VERSION = "1.32.0"
# k8s/schemas/README.md records where each schema comes from; the digests pin the files.
CUSTOM_SCHEMAS = {
    ("keda.sh/v1alpha1", "ScaledObject"): (
        "keda.sh_v1alpha1_scaledobject.json",
        "d8dbeba8b31cc28e36a7398d3aa27b60765bf7a39c9a796454bfd4b5219c4f55"),
    ("keda.sh/v1alpha1", "TriggerAuthentication"): (
        "keda.sh_v1alpha1_triggerauthentication.json",
        "467a0adf07c13991d772e65e974845953cf117dbeb01d9506f0d7b9403f5a586"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"): (
        "monitoring.coreos.com_v1_servicemonitor.json",
        "ec16286edfc97846aa3c79dcd2fe855be901dac5098c367718e3db4e177f74d4"),
}
IMAGE_REPOS = {"api": "ghcr.io/dpsynth/dpsynth-api", "ledger": "ghcr.io/dpsynth/dpsynth-ledger",
               "worker": "ghcr.io/dpsynth/dpsynth-worker"}
NAME_LABEL = "app.kubernetes.io/name"
COMPONENT_LABEL = "app.kubernetes.io/component"

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None,
                                reason="kubectl (for `kubectl kustomize`) is not installed")

Obj = dict[str, Any]


@functools.cache
def _render(name: str) -> tuple[Obj, ...]:
    done = subprocess.run(["kubectl", "kustomize", str(RENDERINGS[name])], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return tuple(d for d in yaml.safe_load_all(done.stdout) if d)


def render(name: str) -> list[Obj]:
    """The objects `kubectl kustomize` renders for ``name`` (a fresh copy to inspect)."""
    return copy.deepcopy(list(_render(name)))


def one(objs: list[Obj], kind: str, name: str) -> Obj:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} objects"
    return found[0]


def pod_templates(objs: list[Obj]) -> Iterator[tuple[Obj, Obj]]:
    """``(workload, pod template)`` of every Deployment and Job."""
    for o in objs:
        if o["kind"] in ("Deployment", "Job"):
            yield o, o["spec"]["template"]


def _is_custom(obj: Obj) -> bool:
    return not re.match(r"^(v1|[a-z.]*k8s\.io/v\w+|apps/v1|batch/v1|policy/v1|autoscaling/v2)$",
                        obj["apiVersion"])


def _strict(schema: Any) -> Any:
    """The schema with unknown fields rejected wherever a CRD schema lists its properties
    (the API server prunes them silently; `kubectl apply --validate=strict` refuses them)."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        if "metadata" in out.get("properties", {}):
            out["properties"]["metadata"] = {"type": "object"}
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@functools.cache
def _custom_validator(api_version: str, kind: str) -> jsonschema.Draft7Validator:
    filename, _ = CUSTOM_SCHEMAS[(api_version, kind)]
    schema = json.loads((SCHEMAS / filename).read_text())
    return jsonschema.Draft7Validator(_strict(schema))


# ---------------------------------------------------------------- rendering and schemas


@pytest.mark.parametrize("name", sorted(RENDERINGS))
def test_renders(name: str) -> None:
    kinds = {o["kind"] for o in render(name)}
    assert {"Namespace", "ConfigMap", "Deployment", "Service", "Ingress", "Job",
            "HorizontalPodAutoscaler", "PodDisruptionBudget", "NetworkPolicy",
            "ServiceMonitor"} <= kinds
    assert all(o["metadata"].get("namespace") == "dpsynth"
               for o in render(name) if o["kind"] != "Namespace")


@pytest.mark.parametrize("name", sorted(RENDERINGS))
def test_core_kinds_validate_strictly(name: str) -> None:
    errors = []
    for obj in render(name):
        if _is_custom(obj):
            continue
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = "/".join(str(p) for p in exc.path)
            errors.append(f"{obj['kind']}/{obj['metadata']['name']} {where}: {exc.message}")
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("name", sorted(RENDERINGS))
def test_custom_resources_validate_against_vendored_schemas(name: str) -> None:
    errors = []
    for obj in filter(_is_custom, render(name)):
        key = (obj["apiVersion"], obj["kind"])
        assert key in CUSTOM_SCHEMAS, f"no vendored schema for {key}"
        for err in _custom_validator(*key).iter_errors(obj):
            where = "/".join(str(p) for p in err.absolute_path)
            errors.append(f"{obj['kind']}/{obj['metadata']['name']} {where}: {err.message}")
    assert not errors, "\n".join(errors)


def test_custom_schema_validation_catches_mistakes() -> None:
    """The strict CRD check is not vacuous: a misspelt field and a wrong type fail."""
    scaled = one(render("gpu"), "ScaledObject", "worker")
    scaled["spec"]["maxReplicaCont"] = 3
    scaled["spec"]["minReplicaCount"] = "0"
    messages = [e.message for e in _custom_validator("keda.sh/v1alpha1",
                                                     "ScaledObject").iter_errors(scaled)]
    assert any("maxReplicaCont" in m for m in messages)
    assert any("is not of type 'integer'" in m for m in messages)
    monitor = one(render("gpu"), "ServiceMonitor", "ledger")
    monitor["spec"]["endpoints"][0]["intervall"] = "30s"
    del monitor["spec"]["selector"]
    messages = [e.message for e in _custom_validator("monitoring.coreos.com/v1",
                                                     "ServiceMonitor").iter_errors(monitor)]
    assert any("intervall" in m for m in messages)
    assert any("'selector' is a required property" in m for m in messages)
    auth = one(render("gpu"), "TriggerAuthentication", "dpsynth-redis")
    del auth["spec"]["secretTargetRef"][0]["parameter"]
    assert not _custom_validator("keda.sh/v1alpha1", "TriggerAuthentication").is_valid(auth)


def test_vendored_schemas_are_the_pinned_files() -> None:
    readme = (SCHEMAS / "README.md").read_text()
    for filename, digest in CUSTOM_SCHEMAS.values():
        data = (SCHEMAS / filename).read_bytes()
        assert hashlib.sha256(data).hexdigest() == digest, filename
        assert filename in readme and digest in readme, f"{filename} not recorded in README"
        jsonschema.Draft7Validator.check_schema(json.loads(data))


# ---------------------------------------------------------------- images and secrets


@pytest.mark.parametrize("name", sorted(RENDERINGS))
def test_images_are_pinned(name: str) -> None:
    for _, template in pod_templates(render(name)):
        for c in template["spec"]["containers"]:
            repo, _, tag = c["image"].rpartition(":")
            assert repo in IMAGE_REPOS.values(), c["image"]
            cpu_worker = name == "dev" and repo == IMAGE_REPOS["worker"]
            assert tag == ("0.1.0-cpu" if cpu_worker else "0.1.0"), c["image"]


@pytest.mark.parametrize("name", sorted(RENDERINGS))
def test_no_secret_values_in_the_manifests(name: str) -> None:
    objs = render(name)
    assert not [o for o in objs if o["kind"] == "Secret"]
    config = one(objs, "ConfigMap", "dpsynth-config")["data"]
    secret_like = re.compile(r"TOKEN|SECRET|PASSWORD|SIGNING_KEY|HASH_KEY|ACCESS_KEY|DATABASE__URL"
                             r"|BROKER_URL")
    assert not [k for k in config if secret_like.search(k)]


# ---------------------------------------------------------------- workloads


def _containers(name: str) -> Iterator[tuple[Obj, Obj, Obj]]:
    for workload, template in pod_templates(render(name)):
        for c in template["spec"].get("initContainers", []) + template["spec"]["containers"]:
            yield workload, template, c


@pytest.mark.parametrize("name", sorted(RENDERINGS))
def test_every_container_is_restricted_and_bounded(name: str) -> None:
    for workload, template, c in _containers(name):
        what = f"{workload['kind']}/{workload['metadata']['name']}/{c['name']}"
        pod_sc = template["spec"]["securityContext"]
        assert pod_sc["runAsNonRoot"] is True and pod_sc["runAsUser"] == 10001, what
        assert pod_sc["seccompProfile"] == {"type": "RuntimeDefault"}, what
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True, what
        assert sc["allowPrivilegeEscalation"] is False, what
        assert sc["capabilities"]["drop"] == ["ALL"], what
        assert template["spec"]["automountServiceAccountToken"] is False, what
        for section in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(c["resources"][section]), f"{what} {section}"
        # A read-only root needs a writable /tmp (uploads, caches): an emptyDir.
        volumes = {v["name"]: v for v in template["spec"]["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert "emptyDir" in volumes[mounts["/tmp"]], what


@pytest.mark.parametrize("name", sorted(RENDERINGS))
def test_every_long_running_container_has_probes(name: str) -> None:
    """Deployments only: a Job's container runs to completion and has nothing to probe."""
    for workload, _, c in _containers(name):
        if workload["kind"] != "Deployment":
            continue
        what = f"{workload['metadata']['name']}/{c['name']}"
        for probe in ("livenessProbe", "readinessProbe"):
            assert probe in c, f"{what}: no {probe}"
        if workload["metadata"]["name"] == "api":
            assert c["livenessProbe"]["httpGet"]["path"] == "/healthz", what
            assert c["readinessProbe"]["httpGet"]["path"] == "/readyz", what
        elif workload["metadata"]["name"] == "ledger":
            # ready or behind its anchor (reconciliation after a restore must reach it)
            assert c["livenessProbe"]["httpGet"]["path"] == "/healthz", what
            assert c["readinessProbe"]["exec"]["command"] == [
                "python", "-m", "dpsynth_ledger.probe", "http://127.0.0.1:8100/readyz"], what
        else:  # the worker serves only metrics: liveness through its metrics port
            assert c["livenessProbe"]["httpGet"]["port"] == "metrics", what


def test_worker_has_its_work_dir_on_an_empty_dir() -> None:
    worker = one(render("gpu"), "Deployment", "worker")["spec"]["template"]
    c = worker["spec"]["containers"][0]
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in worker["spec"]["volumes"]}
    config = one(render("gpu"), "ConfigMap", "dpsynth-config")["data"]
    assert "emptyDir" in volumes[mounts[config["DPSYNTH_WORKER_WORK_DIR"]]]


@pytest.mark.parametrize("name", sorted(RENDERINGS))
def test_migrations_are_jobs(name: str) -> None:
    objs = render(name)
    for job, service in (("api-migrate", "api"), ("ledger-migrate", "ledger")):
        spec = one(objs, "Job", job)["spec"]
        assert spec["backoffLimit"] >= 1 and spec["ttlSecondsAfterFinished"] > 0
        c = spec["template"]["spec"]["containers"][0]
        # As compose's `command`: replaces the image's CMD, keeps its ENTRYPOINT.
        assert c["args"] == ["python", "-m", f"dpsynth_{service}", "migrate"]
        assert "command" not in c
        assert c["image"].rpartition(":")[0] == IMAGE_REPOS[service]
        assert spec["template"]["metadata"]["labels"][COMPONENT_LABEL] == "migration"


@pytest.mark.skipif(not COMPOSE_FILE.exists(), reason="docker-compose.yml not present")
def test_commands_are_the_compose_commands() -> None:
    """The same process in both deployments: `args` here is compose's `command` there."""
    services = load_compose()["services"]
    objs = render("gpu")
    for kind, name, compose_name in (("Deployment", "api", "api"),
                                     ("Deployment", "ledger", "ledger"),
                                     ("Deployment", "worker", "worker"),
                                     ("Job", "api-migrate", "api-migrate"),
                                     ("Job", "ledger-migrate", "ledger-migrate")):
        c = one(objs, kind, name)["spec"]["template"]["spec"]["containers"][0]
        assert c["args"] == services[compose_name]["command"], name


@pytest.mark.parametrize("name", sorted(RENDERINGS))
def test_services_do_not_select_migration_pods(name: str) -> None:
    objs = render(name)
    job_labels = [t["metadata"]["labels"] for w, t in pod_templates(objs) if w["kind"] == "Job"]
    for svc in (o for o in objs if o["kind"] == "Service" and o["spec"].get("selector")):
        sel = svc["spec"]["selector"]
        assert not any(sel.items() <= labels.items() for labels in job_labels), svc


@pytest.mark.parametrize("name", sorted(RENDERINGS))
def test_services_and_monitors_point_at_named_ports(name: str) -> None:
    """Each Service's target port is a named port of the pods it selects, and each
    ServiceMonitor's port is a port of a Service it selects."""
    objs = render(name)
    pods = [t for w, t in pod_templates(objs) if w["kind"] == "Deployment"]
    services = [o for o in objs if o["kind"] == "Service" and o["spec"].get("selector")]
    for svc in services:
        selected = [t for t in pods
                    if svc["spec"]["selector"].items() <= t["metadata"]["labels"].items()]
        assert selected, f"Service {svc['metadata']['name']} selects no pods"
        for port in svc["spec"]["ports"]:
            for t in selected:
                names = {p["name"] for c in t["spec"]["containers"] for p in c.get("ports", [])}
                assert port["targetPort"] in names, (svc["metadata"]["name"], port)
    for monitor in (o for o in objs if o["kind"] == "ServiceMonitor"):
        want = monitor["spec"]["selector"]["matchLabels"]
        selected = [s for s in services if want.items() <= s["metadata"]["labels"].items()]
        assert len(selected) == 1, monitor["metadata"]["name"]
        ports = {p["name"] for p in selected[0]["spec"]["ports"]}
        assert {e["port"] for e in monitor["spec"]["endpoints"]} <= ports


@pytest.mark.parametrize("name", sorted(RENDERINGS))
def test_autoscaled_deployments_leave_replicas_to_the_autoscaler(name: str) -> None:
    """A `replicas` in the manifest would be re-applied over the autoscaler's count on every
    `kubectl apply` (for workers: SIGTERM to busy pods)."""
    objs = render(name)
    targets = {o["spec"]["scaleTargetRef"]["name"] for o in objs
               if o["kind"] in ("HorizontalPodAutoscaler", "ScaledObject")}
    assert "api" in targets and (name == "base" or "worker" in targets)
    for target in targets | {"worker"}:
        assert "replicas" not in one(objs, "Deployment", target)["spec"], target


@pytest.mark.parametrize("name", sorted(RENDERINGS))
def test_pod_disruption_budgets_cover_each_deployment(name: str) -> None:
    objs = render(name)
    for deployment in ("api", "ledger", "worker"):
        labels = one(objs, "Deployment", deployment)["spec"]["template"]["metadata"]["labels"]
        pdb = one(objs, "PodDisruptionBudget", deployment)
        assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert ("minAvailable" in pdb["spec"]) != ("maxUnavailable" in pdb["spec"])


def test_api_is_autoscaled_and_exposed_with_tls() -> None:
    objs = render("gpu")
    hpa = one(objs, "HorizontalPodAutoscaler", "api")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": "api"}
    ingresses = [o for o in objs if o["kind"] == "Ingress"]
    assert [i["metadata"]["name"] for i in ingresses] == ["api"]
    ingress = ingresses[0]
    assert ingress["spec"]["ingressClassName"] and ingress["spec"]["tls"][0]["secretName"]
    backends = {p["backend"]["service"]["name"] for r in ingress["spec"]["rules"]
                for p in r["http"]["paths"]}
    assert backends == {"api"}
    body = ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/proxy-body-size"]
    config = one(objs, "ConfigMap", "dpsynth-config")["data"]
    assert int(body.rstrip("m")) * 1024 * 1024 >= int(config["DPSYNTH_API_MAX_UPLOAD_BYTES"])


# ---------------------------------------------------------------- network policies


def _matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    assert selector is None or set(selector) <= {"matchLabels"}, "only matchLabels is modelled"
    return selector is not None and dict(selector.get("matchLabels", {})).items() <= labels.items()


def allowed(objs: list[Obj], *, to: Mapping[str, str], src_ns: str,
            src_labels: Mapping[str, str], port: int) -> bool:
    """Whether the policies of namespace dpsynth admit a TCP connection to pods labelled
    ``to`` on ``port`` (the semantics of networking.k8s.io/v1 ingress rules)."""
    policies = [p for p in objs if p["kind"] == "NetworkPolicy"
                and "Ingress" in p["spec"]["policyTypes"]
                and _matches(p["spec"]["podSelector"], to)]
    assert policies, f"no ingress policy selects {to}: traffic would be unrestricted"
    for policy in policies:
        for rule in policy["spec"].get("ingress", []):
            ports = rule.get("ports")
            if ports and not any(p.get("protocol", "TCP") == "TCP" and p["port"] == port
                                 for p in ports):
                continue
            for peer in rule.get("from", []):
                ns_sel, pod_sel = peer.get("namespaceSelector"), peer.get("podSelector")
                ns_labels = {"kubernetes.io/metadata.name": src_ns}
                if ns_sel is None:  # a bare podSelector means the policy's own namespace
                    if src_ns == "dpsynth" and _matches(pod_sel, src_labels):
                        return True
                elif _matches(ns_sel, ns_labels) and (pod_sel is None
                                                      or _matches(pod_sel, src_labels)):
                    return True
    return False


API = {NAME_LABEL: "dpsynth-api", COMPONENT_LABEL: "server"}
LEDGER = {NAME_LABEL: "dpsynth-ledger", COMPONENT_LABEL: "server"}
WORKER = {NAME_LABEL: "dpsynth-worker", COMPONENT_LABEL: "worker"}


@pytest.mark.parametrize("name", sorted(RENDERINGS))
def test_ledger_is_reachable_only_from_api_workers_and_monitoring(name: str) -> None:
    objs = render(name)
    default_deny = one(objs, "NetworkPolicy", "default-deny")["spec"]
    assert default_deny["podSelector"] == {} and "ingress" not in default_deny
    assert {"Ingress", "Egress"} <= set(default_deny["policyTypes"])
    reach = functools.partial(allowed, objs, to=LEDGER)
    assert reach(src_ns="dpsynth", src_labels=API, port=8100)
    assert reach(src_ns="dpsynth", src_labels=WORKER, port=8100)
    assert reach(src_ns="monitoring", src_labels={"app": "prometheus"}, port=8100)
    assert not reach(src_ns="monitoring", src_labels={"app": "prometheus"}, port=5432)
    assert not reach(src_ns="ingress-nginx", src_labels={}, port=8100)
    assert not reach(src_ns="dpsynth", src_labels={NAME_LABEL: "something-else"}, port=8100)
    assert not reach(src_ns="dpsynth", src_labels={NAME_LABEL: "dpsynth-api",
                                                   COMPONENT_LABEL: "migration"}, port=8100)
    assert not reach(src_ns="other", src_labels=API, port=8100)
    # The api: the ingress controller, the workers and Prometheus; the workers: Prometheus.
    assert allowed(objs, to=API, src_ns="ingress-nginx", src_labels={}, port=8000)
    assert allowed(objs, to=API, src_ns="dpsynth", src_labels=WORKER, port=8000)
    assert not allowed(objs, to=API, src_ns="other", src_labels={}, port=8000)
    assert allowed(objs, to=WORKER, src_ns="monitoring", src_labels={}, port=9100)
    assert not allowed(objs, to=WORKER, src_ns="dpsynth", src_labels=API, port=9100)


# ---------------------------------------------------------------- workers and autoscaling


def test_gpu_workers_request_a_gpu_on_gpu_nodes() -> None:
    pod = one(render("gpu"), "Deployment", "worker")["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert str(c["resources"]["limits"]["nvidia.com/gpu"]) == "1"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists",
            "effect": "NoSchedule"} in pod["tolerations"]
    dev = one(render("dev"), "Deployment", "worker")["spec"]["template"]["spec"]
    assert "nvidia.com/gpu" not in dev["containers"][0]["resources"]["limits"]
    assert "nodeSelector" not in dev


@pytest.mark.parametrize(("name", "min_replicas", "max_replicas"), [("dev", 0, 1),
                                                                     ("gpu", 0, 8)])
def test_workers_scale_on_the_celery_queue(name: str, min_replicas: int, max_replicas: int,
                                           generated_env: dict[str, str]) -> None:
    objs = render(name)
    scaled = one(objs, "ScaledObject", "worker")["spec"]
    assert scaled["scaleTargetRef"]["name"] == "worker"
    assert (scaled["minReplicaCount"], scaled["maxReplicaCount"]) == (min_replicas, max_replicas)
    redis = [t for t in scaled["triggers"] if t["type"] == "redis"]
    assert len(redis) == 1 and redis[0]["metadata"]["listName"] == "dpsynth"
    auth = one(objs, "TriggerAuthentication", redis[0]["authenticationRef"]["name"])
    refs = {(r["name"], r["key"]) for r in auth["spec"]["secretTargetRef"]}
    assert ("dpsynth-redis", "password") in refs
    assert "password" in _create_secrets().secret_data(generated_env, "p" * 20)["dpsynth-redis"]
    # Busy workers are counted too, so an empty queue does not scale away running jobs.
    assert any(t["type"] == "prometheus" and "running" in t["metadata"]["query"]
               for t in scaled["triggers"])
    down = scaled["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
    assert down["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 300}]


@pytest.mark.parametrize("name", sorted(RENDERINGS))
def test_worker_grace_period_covers_the_checkpoint_budget(name: str) -> None:
    template = one(render(name), "Deployment", "worker")["spec"]["template"]
    budget = int(template["metadata"]["annotations"]["dpsynth.io/checkpoint-budget-seconds"])
    assert template["spec"]["terminationGracePeriodSeconds"] >= budget
    readme = README.read_text()
    assert f"checkpoint budget of {budget} s" in readme


# ---------------------------------------------------------------- settings wiring


def _create_secrets() -> ModuleType:
    spec = importlib.util.spec_from_file_location("create_secrets", K8S / "create_secrets.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def generated_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An env file as the documented command writes it (scripts/gen_secrets.py)."""
    values, _ = generate_env(tmp_path_factory.mktemp("k8s-env") / ".env")
    return values


def container_env(objs: list[Obj], template: Obj, c: Obj,
                  secrets: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """What the container's process sees: envFrom ConfigMaps, then env (secretKeyRef values
    from ``secrets``, fieldRef metadata.name as a pod name)."""
    env: dict[str, str] = {}
    for source in c.get("envFrom", []):
        env.update(one(objs, "ConfigMap", source["configMapRef"]["name"])["data"])
    for item in c.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        elif "secretKeyRef" in item["valueFrom"]:
            ref = item["valueFrom"]["secretKeyRef"]
            assert ref["key"] in secrets.get(ref["name"], {}), f"{c['name']}: no {ref}"
            env[item["name"]] = secrets[ref["name"]][ref["key"]]
        else:
            assert item["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
            env[item["name"]] = "worker-7d9f8-abcde"
    return env


SETTINGS = {"dpsynth-api": ("DPSYNTH_API_", "dpsynth_api.settings", "ApiSettings"),
            "dpsynth-ledger": ("DPSYNTH_LEDGER_", "dpsynth_ledger.settings", "LedgerSettings"),
            "dpsynth-worker": ("DPSYNTH_WORKER_", "dpsynth_worker.settings", "WorkerSettings")}


@pytest.mark.parametrize("name", OVERLAYS)
def test_settings_load_from_the_config_map_and_secrets(name: str, generated_env: dict[str, str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Each container's env (ConfigMap + the Secrets create_secrets.py makes from a
    gen_secrets.py env file) names only real settings and makes its settings class load."""
    secrets = _create_secrets().secret_data(generated_env, "redis-password-for-tests")
    objs = render(name)
    for workload, template, c in _containers(name):
        service = template["metadata"]["labels"][NAME_LABEL]
        prefix, module_name, class_name = SETTINGS[service]
        settings_class = getattr(importlib.import_module(module_name), class_name)
        env = container_env(objs, template, c, secrets)
        fields = set(settings_class.model_fields)
        unknown = [k for k in env if k.startswith(prefix)
                   and k[len(prefix):].lower().split("__")[0] not in fields]
        assert not unknown, f"{workload['metadata']['name']}: not settings: {unknown}"
        for key in [k for k in os.environ if k.startswith("DPSYNTH_")]:
            monkeypatch.delenv(key)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        settings = settings_class()
        if service == "dpsynth-worker":
            assert settings.grant_public_key and settings.api.url == "http://api:8000"
        if service == "dpsynth-ledger":
            assert settings.anchor.kind == "s3"



@pytest.mark.parametrize("name", OVERLAYS)
def test_metrics_need_a_token_that_the_service_monitors_present(
        name: str, generated_env: dict[str, str]) -> None:
    """Issue 14, item 11: the api's and the ledger's /metrics require a bearer token, and
    the ServiceMonitor of each presents the same Secret key the container reads."""
    secrets = _create_secrets().secret_data(generated_env, "redis-password-for-tests")
    objs = render(name)
    monitors = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ServiceMonitor"}
    read: dict[str, str] = {}
    for _, template, c in _containers(name):
        service = template["metadata"]["labels"][NAME_LABEL]
        env = container_env(objs, template, c, secrets)
        for prefix in ("DPSYNTH_API_", "DPSYNTH_LEDGER_"):
            if f"{prefix}METRICS_TOKEN" in env:
                read[service] = env[f"{prefix}METRICS_TOKEN"]
    assert set(read) >= {"dpsynth-api", "dpsynth-ledger"}
    for monitor, service in (("api", "dpsynth-api"), ("ledger", "dpsynth-ledger")):
        auth = monitors[monitor]["spec"]["endpoints"][0]["authorization"]
        ref = auth["credentials"]
        assert auth["type"] == "Bearer"
        assert secrets[ref["name"]][ref["key"]] == read[service]
    # The Secret Prometheus reads holds the two metrics tokens and nothing else.
    assert set(secrets["dpsynth-metrics"]) == {"api-token", "ledger-token"}
