"""The Grafana dashboard in deploy/: it loads, its panel ids are unique, and every metric its
PromQL uses is one the services export (collected from the api's, the ledger's and the
worker's registries; the ledger's scrape-time families from its collector's ``describe``).
The integration test tests/integration/ledger/test_ledger_metrics.py checks the ledger's
names against a real scrape as well."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy/grafana/dashboards/dpsynth.json"

SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "unknown": ("",),
}
PROMQL_WORDS = {
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
    "count_values", "group", "by", "without", "on", "ignoring", "group_left", "group_right",
    "and", "or", "unless", "bool", "offset", "rate", "irate", "increase", "delta", "idelta",
    "histogram_quantile", "label_values", "clamp_min", "clamp_max", "abs", "vector",
    "scalar", "time", "deriv", "predict_linear", "absent", "changes", "resets", "sort",
    "sort_desc", "avg_over_time", "max_over_time", "min_over_time", "sum_over_time",
    "last_over_time", "inf", "nan",
}


def exported_names(families: Iterable[Metric]) -> set[str]:
    """Every sample name a family can expose (by its type), and the samples it has."""
    names: set[str] = set()
    for fam in families:
        names |= {fam.name + suffix for suffix in SUFFIXES[fam.type]}
        names |= {s.name for s in fam.samples}
    return names


def _exprs(node: Any) -> Iterator[str]:
    """Every PromQL expression of a dashboard (panel targets and template queries)."""
    if isinstance(node, dict):
        for key, val in node.items():
            if key in ("expr", "definition") and isinstance(val, str):
                yield val
            elif key == "query" and isinstance(val, str) and "(" in val:
                yield val
            else:
                yield from _exprs(val)
    elif isinstance(node, list):
        for item in node:
            yield from _exprs(item)


def metric_names_of(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (labels, functions, keywords removed)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)             # string literals
    expr = re.sub(r"\{[^}]*\}", "", expr)                     # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)                    # range selectors
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"\$\w+", "", expr)                         # dashboard variables
    expr = re.sub(r"label_values\(\s*([A-Za-z_:][\w:]*)\s*,\s*\w+\s*\)", r"\1", expr)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][\w:]*", expr):
        word = match.group(0)
        following = expr[match.end():].lstrip()[:1]
        if word.lower() in PROMQL_WORDS or following == "(":
            continue
        names.add(word)
    return names


def dashboard_metric_names(dashboard: dict[str, Any]) -> set[str]:
    """Every metric name the dashboard's PromQL uses."""
    return {name for expr in _exprs(dashboard) for name in metric_names_of(expr)}


def services_exported_names() -> set[str]:
    """The names the api, the ledger and a worker export (no server needed)."""
    from dpsynth_api.metrics import ApiMetrics
    from dpsynth_ledger.metrics import BudgetCollector, LedgerMetrics
    from dpsynth_worker import metrics as worker_metrics

    api = ApiMetrics().registry.collect()
    ledger = LedgerMetrics()
    scrape_time = BudgetCollector(sessions=None, max_datasets=1).describe()  # type: ignore[arg-type]
    worker = [fam for obj in vars(worker_metrics).values()
              if isinstance(obj, MetricWrapperBase) for fam in obj.collect()]
    return exported_names([*api, *ledger.registry.collect(), *scrape_time, *worker])


def _panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def test_the_dashboard_loads_and_its_panel_ids_are_unique() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["schemaVersion"] >= 36 and dashboard["uid"] and dashboard["title"]
    ids = [p["id"] for p in _panels(dashboard)]
    assert len(ids) == len(set(ids)) and len(ids) >= 15
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    for panel in _panels(dashboard):
        if panel["type"] == "row":
            continue
        assert panel["title"] and panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24, panel["title"]


def test_the_json_is_what_the_dashboard_code_writes() -> None:
    spec = importlib.util.spec_from_file_location("dpsynth_dashboard",
                                                  ROOT / "deploy/grafana/dashboard.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.render() == DASHBOARD.read_text(), \
        "run python deploy/grafana/dashboard.py and commit the JSON"


def test_every_metric_the_dashboard_queries_is_exported() -> None:
    used = dashboard_metric_names(json.loads(DASHBOARD.read_text()))
    exported = services_exported_names()
    assert {"dpsynth_ledger_admissions_total", "dpsynth_ledger_leases_expired_total",
            "dpsynth_ledger_dataset_epsilon_spent", "dpsynth_api_requests_total",
            "jobs_started_total"} <= used
    assert used <= exported, sorted(used - exported)


def test_the_extractor_finds_metrics_not_functions_or_labels() -> None:
    expr = ('histogram_quantile(0.95, sum by (le, route) (rate(dpsynth_api_request_duration_'
            'seconds_bucket{route=~"$r", job="x"}[$__rate_interval]))) / on (job) up > bool 0')
    assert metric_names_of(expr) == {"dpsynth_api_request_duration_seconds_bucket", "up"}
    assert metric_names_of("label_values(dpsynth_ledger_dataset_epsilon_limit, dataset_id)") \
        == {"dpsynth_ledger_dataset_epsilon_limit"}


def test_the_provisioning_and_scrape_configs_load() -> None:
    prometheus = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    jobs = {c["job_name"] for c in prometheus["scrape_configs"]}
    assert jobs == {"dpsynth-api", "dpsynth-ledger", "dpsynth-worker"}
    dashboards = json.loads(DASHBOARD.read_text())
    assert any('job="dpsynth-worker"' in expr for expr in _exprs(dashboards))
    source = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/datasources/prometheus.yaml").read_text())
    assert source["datasources"][0]["uid"] == "prometheus"
    variables = {v["name"]: v for v in dashboards["templating"]["list"]}
    assert variables["datasource"]["current"]["value"] == "prometheus"
    provider = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/dashboards/dpsynth.yaml").read_text())
    assert provider["providers"][0]["type"] == "file"


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="promtool (Debian package prometheus) is not installed")
def test_promtool_accepts_every_query_and_the_scrape_config(tmp_path: Path) -> None:
    """Prometheus's own parser checks each panel's PromQL (as recording rules, with the
    dashboard's variables substituted) and the scrape configuration."""
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in _panels(dashboard) for t in panel.get("targets", [])]
    rules = [{"record": f"dpsynth:dashboard_check:{i}",
              "expr": e.replace("$__rate_interval", "1m").replace("$dataset", ".*")}
             for i, e in enumerate(exprs)]
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    for args in (["check", "rules", str(path)],
                 ["check", "config", "--syntax-only",
                  str(ROOT / "deploy/prometheus/prometheus.yml")]):
        done = subprocess.run(["promtool", *args], capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
