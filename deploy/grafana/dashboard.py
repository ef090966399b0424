"""The Grafana dashboard of dpsynth as code: ``python deploy/grafana/dashboard.py`` writes
``deploy/grafana/dashboards/dpsynth.json`` (what Grafana provisions). Edit this file, rerun
it, and commit both; tests/unit/test_grafana_dashboard.py checks that they agree and that
every metric the queries use is exported by the services."""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).resolve().parent / "dashboards" / "dpsynth.json"

DS = {"type": "prometheus", "uid": "${datasource}"}
panels = []
pid = [0]
y = [0]


def nid():
    pid[0] += 1
    return pid[0]


def row(title):
    panels.append({"type": "row", "title": title, "id": nid(), "collapsed": False,
                   "gridPos": {"h": 1, "w": 24, "x": 0, "y": y[0]}, "panels": []})
    y[0] += 1


def target(expr, legend="", ref="A", instant=False, fmt=None):
    t = {"datasource": DS, "refId": ref, "expr": expr, "legendFormat": legend,
         "range": not instant, "instant": instant}
    if fmt:
        t["format"] = fmt
    return t


def panel(kind, title, desc, targets, x, w, h, unit=None, extra=None, defaults=None,
          options=None, newline=False):
    p = {"type": kind, "title": title, "description": desc, "id": nid(), "datasource": DS,
         "gridPos": {"h": h, "w": w, "x": x, "y": y[0]}, "targets": targets,
         "fieldConfig": {"defaults": {}, "overrides": []}, "options": options or {}}
    if unit:
        p["fieldConfig"]["defaults"]["unit"] = unit
    if defaults:
        p["fieldConfig"]["defaults"].update(defaults)
    if extra:
        p.update(extra)
    panels.append(p)
    if x + w >= 24:
        y[0] += h
    return p


def refs(exprs):
    return [target(e, legend, chr(ord("A") + i)) for i, (e, legend) in enumerate(exprs)]


TS = {"legend": {"displayMode": "table", "placement": "right", "showLegend": True,
                 "calcs": ["lastNotNull"]}, "tooltip": {"mode": "multi", "sort": "desc"}}
STATE_COLORS = [
    {"matcher": {"id": "byName", "options": "ok"},
     "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": "green"}}]},
    {"matcher": {"id": "byName", "options": "warning"},
     "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": "orange"}}]},
    {"matcher": {"id": "byName", "options": "exhausted"},
     "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": "red"}}]},
]
SEL = '{dataset_id=~"$dataset"}'

row("Privacy budgets (ledger, filter figures read from its database at scrape time)")
p = panel("stat", "Datasets by budget state",
          "ok; warning: epsilon spent >= the dataset's warning fraction (default 0.8) of its "
          "limit; exhausted: nothing remains for a new admission.",
          [target("sum by (state) (dpsynth_ledger_datasets)", "{{state}}")], 0, 8, 6,
          options={"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                   "colorMode": "background", "graphMode": "none", "textMode": "value_and_name",
                   "orientation": "horizontal"})
p["fieldConfig"]["overrides"] = STATE_COLORS
panel("timeseries", "Datasets by budget state over time", "Counts of datasets per state.",
      [target("sum by (state) (dpsynth_ledger_datasets)", "{{state}}")], 8, 8, 6,
      defaults={"custom": {"stacking": {"mode": "normal"}, "fillOpacity": 30}},
      options=TS)["fieldConfig"]["overrides"] = STATE_COLORS
panel("bargauge", "Datasets by fraction of the limit spent",
      "How many datasets have spent each band of their epsilon limit (the gauge histogram's "
      "cumulative buckets shown per band, labelled by the band's upper bound; all datasets, "
      "not only those with per-dataset series).",
      [{**target("sum by (le) (dpsynth_ledger_datasets_spent_fraction_bucket)", "<= {{le}}",
                 instant=True), "format": "heatmap"}], 16, 8, 6,
      options={"displayMode": "gradient", "orientation": "horizontal",
               "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}})
panel("timeseries", "Epsilon spent vs limit per dataset",
      "Filter epsilon spent (solid) against the limit (dashed), for the datasets with "
      "per-dataset series (the DPSYNTH_LEDGER_METRICS_MAX_DATASETS nearest their limits). "
      "Empty unless the ledger runs with DPSYNTH_LEDGER_METRICS_PER_DATASET=true: by "
      "default /metrics names no dataset, only the aggregates.",
      refs([(f"dpsynth_ledger_dataset_epsilon_spent{SEL}", "{{dataset_id}} spent"),
            (f"dpsynth_ledger_dataset_epsilon_limit{SEL}", "{{dataset_id}} limit")]),
      0, 16, 9, options=TS,
      extra={"fieldConfig": {"defaults": {"unit": "none", "decimals": 3}, "overrides": [
          {"matcher": {"id": "byRegexp", "options": ".* limit"},
           "properties": [{"id": "custom.lineStyle",
                           "value": {"fill": "dash", "dash": [10, 10]}}]}]}})
panel("bargauge", "Fraction of the limit spent per dataset",
      "epsilon spent / limit; the bar turns orange at 0.8 (the default warning fraction; "
      "each dataset's own is dpsynth_ledger_dataset_warning_fraction) and red at 1.",
      [target(f"dpsynth_ledger_dataset_epsilon_spent{SEL} / "
              f"dpsynth_ledger_dataset_epsilon_limit{SEL}", "{{dataset_id}}", instant=True)],
      16, 8, 9, unit="percentunit",
      defaults={"min": 0, "max": 1, "thresholds": {"mode": "absolute", "steps": [
          {"color": "green", "value": None}, {"color": "orange", "value": 0.8},
          {"color": "red", "value": 1}]}},
      options={"displayMode": "lcd", "orientation": "horizontal",
               "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}})
tbl = panel("table", "Budgets per dataset",
            "Limit, spent, reserved (open reservations' holds) and remaining filter epsilon, "
            "the warning fraction and whether the warning is on (one row per dataset).",
            [target(f"max by (dataset_id) (dpsynth_ledger_dataset_{name}{SEL})", "", ref, True,
                    "table")
             for ref, name in zip("ABCDEF", ("epsilon_limit", "epsilon_spent",
                                             "epsilon_reserved", "epsilon_remaining",
                                             "warning_fraction", "budget_warning"),
                                  strict=True)],
            0, 16, 9, options={"showHeader": True,
                               "sortBy": [{"displayName": "remaining", "desc": False}]})
tbl["transformations"] = [
    {"id": "merge", "options": {}},
    {"id": "organize", "options": {
        "excludeByName": {"Time": True, "__name__": True, "instance": True, "job": True},
        "renameByName": {"dataset_id": "dataset", "Value #A": "limit", "Value #B": "spent",
                         "Value #C": "reserved", "Value #D": "remaining",
                         "Value #E": "warning fraction", "Value #F": "warning"}}}]
tbl["fieldConfig"]["defaults"]["decimals"] = 4
panel("stat", "Ledger health",
      "Writes refused because the chain is behind or diverged from its anchor, or the anchor "
      "is unreadable (operator: dpsynth ledger reconcile-after-restore); datasets beyond the "
      "per-dataset cap (their figures count only in the states and the spent-fraction "
      "distribution); whether the last scrape could read the ledger's database.",
      refs([('sum(dpsynth_ledger_anchor_state{state=~"behind|diverged|unreadable"})',
             "anchor: writes refused"),
            ("dpsynth_ledger_datasets_omitted", "omitted by the cap"),
            ("dpsynth_ledger_metrics_scrape_error", "scrape error")]), 16, 8, 9,
      options={"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
               "colorMode": "value", "graphMode": "none", "textMode": "value_and_name"})

row("Admissions and leases (ledger)")
panel("timeseries", "Admissions by decision and reason",
      "Admissions per second: accepted, and refused by reason (budget_exhausted: the RDP "
      "filter; unsupported_neighbouring; behind_anchor: the ledger is behind its anchored "
      "head; other: policy refusals).",
      [target("sum by (decision, reason) "
              "(rate(dpsynth_ledger_admissions_total[$__rate_interval]))",
              "{{decision}} {{reason}}")], 0, 12, 8, unit="ops", options=TS)
panel("timeseries", "Admissions by kind",
      "Reservations, extensions and class-size histograms admitted or refused.",
      [target("sum by (kind, decision) "
              "(rate(dpsynth_ledger_admissions_total[$__rate_interval]))",
              "{{kind}} {{decision}}")], 12, 12, 8, unit="ops", options=TS)
panel("timeseries", "Leases granted and expired",
      "Step leases granted (each charged when granted), leases whose TTL passed before they "
      "were ended (a worker stopped heartbeating), read grants, histogram releases.",
      refs([("sum(increase(dpsynth_ledger_leases_granted_total[$__rate_interval]))",
             "leases granted"),
            ("sum(increase(dpsynth_ledger_leases_expired_total[$__rate_interval]))",
             "leases expired"),
            ("sum(increase(dpsynth_ledger_read_grants_total[$__rate_interval]))",
             "read grants"),
            ("sum(increase(dpsynth_ledger_histogram_releases_total[$__rate_interval]))",
             "histogram releases")]), 0, 12, 8, options=TS)
panel("timeseries", "Active leases and open reservations", "Now, from the database.",
      refs([("sum(dpsynth_ledger_leases_active)", "active leases"),
            ("sum(dpsynth_ledger_reservations_open)", "open reservations")]), 12, 12, 8,
      options=TS)

row("API")
panel("timeseries", "API requests by route and status",
      "Requests per second by route template and status code.",
      [target("sum by (route, status) (rate(dpsynth_api_requests_total[$__rate_interval]))",
              "{{route}} {{status}}")], 0, 12, 8, unit="reqps", options=TS)
panel("timeseries", "API latency (p50, p95)",
      "Quantiles of request duration over all routes, and p95 per route.",
      refs([("histogram_quantile(0.5, sum by (le) "
             "(rate(dpsynth_api_request_duration_seconds_bucket[$__rate_interval])))", "p50"),
            ("histogram_quantile(0.95, sum by (le) "
             "(rate(dpsynth_api_request_duration_seconds_bucket[$__rate_interval])))", "p95"),
            ("histogram_quantile(0.95, sum by (le, route) "
             "(rate(dpsynth_api_request_duration_seconds_bucket[$__rate_interval])))",
             "p95 {{route}}")]), 12, 12, 8, unit="s", options=TS)
panel("timeseries", "Jobs by state", "Jobs in the api's database by state.",
      [target("sum by (state) (dpsynth_api_jobs)", "{{state}}")], 0, 12, 8,
      defaults={"custom": {"stacking": {"mode": "normal"}, "fillOpacity": 30}}, options=TS)
panel("timeseries", "Uploads by kind and outcome", "Dataset and model uploads per second.",
      [target("sum by (kind, outcome) (rate(dpsynth_api_uploads_total[$__rate_interval]))",
              "{{kind}} {{outcome}}")], 12, 12, 8, unit="ops", options=TS)
panel("timeseries", "Jobs reaped and re-sent",
      "What the api's reaper did per interval. re-sent: the task of a queued job no worker "
      "claimed within DPSYNTH_API_QUEUED_RESEND_S was sent again (its message was lost: a "
      "broker restart, a worker that could not reach the api); a steady rate means tasks are "
      "being lost. reaped: jobs whose worker stopped heartbeating, by outcome (interrupted, "
      "then requeued or failed too_many_attempts; cancelling ones end cancelled).",
      refs([("sum(increase(dpsynth_api_jobs_resent_total[$__rate_interval]))", "re-sent"),
            ("sum by (outcome) (increase(dpsynth_api_jobs_reaped_total[$__rate_interval]))",
             "reaped {{outcome}}")]), 0, 24, 8, options=TS)

row("Workers")
W = '{job="dpsynth-worker"}'
panel("timeseries", "Job attempts started and finished",
      "Attempts claimed by workers, and finished by outcome.",
      refs([(f"sum by (type) (rate(jobs_started_total{W}[$__rate_interval]))",
             "started {{type}}"),
            (f"sum by (type, outcome) (rate(jobs_finished_total{W}[$__rate_interval]))",
             "finished {{type}} {{outcome}}"),
            (f"sum(rate(claims_refused_total{W}[$__rate_interval]))", "claims refused")]),
      0, 12, 8, unit="ops", options=TS)
panel("timeseries", "Running job progress per worker",
      "Current step over total steps of each worker's running attempt (data-independent).",
      [target(f"job_step{W} / (job_total_steps{W} > 0)", "{{instance}}")], 12, 12, 8,
      unit="percentunit", defaults={"min": 0, "max": 1}, options=TS)

dashboard = {
    "__inputs": [], "__requires": [
        {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.4.0"},
        {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"}],
    "annotations": {"list": []},
    "description": "dpsynth: privacy budgets (ledger), admissions and leases, api and worker "
                   "health. Budget figures are the ledger's filter figures, read from its "
                   "database at each scrape.",
    "editable": True, "graphTooltip": 1, "id": None, "links": [], "panels": panels,
    "refresh": "30s", "schemaVersion": 39, "tags": ["dpsynth", "privacy"],
    "templating": {"list": [
        {"name": "datasource", "label": "Prometheus", "type": "datasource",
         "query": "prometheus", "current": {"text": "Prometheus", "value": "prometheus"},
         "hide": 0, "refresh": 1, "regex": "", "options": []},
        {"name": "dataset", "label": "Dataset", "type": "query", "datasource": DS,
         "definition": "label_values(dpsynth_ledger_dataset_epsilon_limit, dataset_id)",
         "query": {"query": "label_values(dpsynth_ledger_dataset_epsilon_limit, dataset_id)",
                   "refId": "dataset"},
         "includeAll": True, "multi": True, "allValue": ".*", "refresh": 2, "sort": 1,
         "current": {"text": ["All"], "value": ["$__all"]}, "hide": 0, "options": []}]},
    "time": {"from": "now-6h", "to": "now"}, "timepicker": {}, "timezone": "utc",
    "title": "dpsynth: privacy budgets and platform", "uid": "dpsynth-overview", "version": 1,
    "weekStart": ""}


def render() -> str:
    """The dashboard's JSON text."""
    return json.dumps(dashboard, indent=2) + "\n"


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT} ({len(panels)} panels)")
