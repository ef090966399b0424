// dpsynth budget dashboard. Reads only the public REST endpoints with the key the user typed:
// the key lives in sessionStorage (this tab only) and travels only as an Authorization header.
// No inline script or style (the page's CSP forbids them); every value from the api is put in
// the DOM as text, never as markup. Every number shown carries its raw value in data-value.
"use strict";

(function () {
  const KEY_NAME = "dpsynth.dashboard.apiKey";
  const SVG_NS = "http://www.w3.org/2000/svg";
  const PAGE = 200;
  let generation = 0; // a newer render makes an older one's results stale

  class Unauthorized extends Error {}

  // ---- the key -------------------------------------------------------------------------
  function getKey() {
    return window.sessionStorage.getItem(KEY_NAME);
  }

  function forgetKey() {
    window.sessionStorage.removeItem(KEY_NAME);
  }

  // ---- the api -------------------------------------------------------------------------
  async function api(path) {
    const key = getKey();
    if (!key) {
      throw new Unauthorized("no key");
    }
    const response = await fetch(path, {
      method: "GET",
      headers: { Authorization: "Bearer " + key, Accept: "application/json" },
      credentials: "omit",
      cache: "no-store",
      referrerPolicy: "no-referrer",
    });
    if (response.status === 401) {
      throw new Unauthorized("the key was refused");
    }
    let body = null;
    try {
      body = await response.json();
    } catch (e) {
      body = null;
    }
    if (!response.ok) {
      const detail = body && (body.detail || body.title) ? body.detail || body.title : "";
      const code = body && body.code ? " (" + body.code + ")" : "";
      throw new Error(path + ": HTTP " + response.status + code + (detail ? ": " + detail : ""));
    }
    return body;
  }

  async function allPages(path) {
    const items = [];
    let cursor = null;
    for (;;) {
      const sep = path.includes("?") ? "&" : "?";
      const url = path + sep + "limit=" + PAGE + (cursor ? "&cursor=" + encodeURIComponent(cursor) : "");
      const page = await api(url);
      items.push(...page.items);
      if (!page.next_cursor) {
        return items;
      }
      cursor = page.next_cursor;
    }
  }

  // ---- formatting ----------------------------------------------------------------------
  function fmt(x) {
    if (x === null || x === undefined) {
      return "—";
    }
    if (typeof x !== "number") {
      return String(x);
    }
    if (!Number.isFinite(x)) {
      return String(x);
    }
    if (x === 0 || Math.abs(x) >= 1e-3) {
      return x.toFixed(4);
    }
    return x.toExponential(3);
  }

  function fmtTime(iso) {
    if (!iso) {
      return "—";
    }
    const d = new Date(iso);
    return Number.isNaN(d.getTime()) ? String(iso) : d.toISOString().replace("T", " ").slice(0, 19);
  }

  // ---- DOM helpers (text only) ---------------------------------------------------------
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value !== null && value !== undefined) {
        node.setAttribute(name, String(value));
      }
    }
    for (const child of children) {
      if (child === null || child === undefined) {
        continue;
      }
      node.append(typeof child === "string" ? document.createTextNode(child) : child);
    }
    return node;
  }

  // A count (steps, a class size) is shown whole; an epsilon to 4 decimals.
  function numCell(value, field, count) {
    const attrs = { class: "num", "data-field": field };
    if (typeof value === "number") {
      attrs["data-value"] = String(value);
    }
    const text = count && Number.isInteger(value) ? String(value) : fmt(value);
    return el("td", attrs, text);
  }

  // a figure that is not a guarantee (a model's composed lineage): its label on hover
  function labelled(cell, label) {
    if (label) {
      cell.title = label;
      cell.setAttribute("data-label", label);
    }
    return cell;
  }

  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value !== null && value !== undefined) {
        node.setAttribute(name, String(value));
      }
    }
    for (const child of children) {
      node.append(typeof child === "string" ? document.createTextNode(child) : child);
    }
    return node;
  }

  function byId(id) {
    return document.getElementById(id);
  }

  function setStatus(text, isError) {
    const status = byId("status");
    status.textContent = text || "";
    status.className = isError ? "error" : "";
  }

  function show(view) {
    for (const id of ["key-view", "overview-view", "detail-view"]) {
      byId(id).hidden = id !== view;
    }
    byId("forget-key").hidden = view === "key-view";
    document.body.setAttribute("data-view", view.replace("-view", ""));
    document.body.setAttribute("data-ready", "false");
  }

  function ready() {
    document.body.setAttribute("data-ready", "true");
    setStatus("");
  }

  function clear(node) {
    while (node.firstChild) {
      node.removeChild(node.firstChild);
    }
  }

  // ---- key view ------------------------------------------------------------------------
  function showKeyForm(message) {
    show("key-view");
    const error = byId("key-error");
    error.textContent = message || "";
    error.hidden = !message;
    byId("api-key").value = "";
    byId("api-key").focus();
    setStatus("");
    document.body.setAttribute("data-ready", "true");
  }

  function onUnauthorized(error) {
    forgetKey();
    showKeyForm("The api refused this key (401): enter a valid key with the read scope.");
    return error;
  }

  // ---- the chart's points --------------------------------------------------------------
  // A charge moves the filter figure: a granted DP-SGD lease (of a job) or a one-shot release
  // such as a class-size histogram. One point per job (its last charge) and one per other
  // charge, in time order.
  function isCharge(entry) {
    return entry.kind === "lease_granted" || entry.kind === "histogram_released" ||
      (typeof entry.rdp_delta === "number" && entry.rdp_delta > 0);
  }

  function chartPoints(history) {
    const points = [];
    const byJob = new Map();
    const entries = history.filter((e) => isCharge(e) && typeof e.dataset_epsilon_spent_after === "number");
    entries.sort((a, b) => a.seq - b.seq);
    for (const e of entries) {
      const point = { seq: e.seq, at: e.at, job_id: e.job_id || null, kind: e.kind,
                      value: e.dataset_epsilon_spent_after };
      if (e.job_id) {
        const previous = byJob.get(e.job_id);
        if (previous) {
          Object.assign(previous, point); // the job's last charge
          continue;
        }
        byJob.set(e.job_id, point);
      }
      points.push(point);
    }
    points.sort((a, b) => a.seq - b.seq);
    return points;
  }

  function drawChart(container, budget, points) {
    clear(container);
    const width = 720;
    const height = 280;
    const m = { left: 56, right: 150, top: 16, bottom: 36 };
    const limit = budget.epsilon_limit;
    const fraction = typeof budget.warning_fraction === "number" ? budget.warning_fraction : 0.8;
    const threshold = fraction * limit;
    const created = budget.history && budget.history.length ? budget.history[0].at : null;
    const times = points.map((p) => Date.parse(p.at));
    const t0 = created ? Math.min(Date.parse(created), ...times) : Math.min(...times, Date.now());
    let t1 = Math.max(t0, ...times);
    if (t1 === t0) {
      t1 = t0 + 1000;
    }
    const yMax = Math.max(limit, ...points.map((p) => p.value)) * 1.08 || 1;
    const x = (t) => m.left + ((t - t0) / (t1 - t0)) * (width - m.left - m.right);
    const y = (v) => height - m.bottom - (v / yMax) * (height - m.top - m.bottom);

    const root = svg("svg", { id: "epsilon-chart", viewBox: "0 0 " + width + " " + height,
                              width: width, height: height, role: "img",
                              "aria-label": "epsilon spent over time" });
    root.append(svg("line", { class: "axis", x1: m.left, y1: y(0), x2: width - m.right, y2: y(0) }));
    root.append(svg("line", { class: "axis", x1: m.left, y1: m.top, x2: m.left, y2: y(0) }));
    for (const v of [0, limit / 2, limit]) {
      root.append(svg("text", { class: "tick", x: m.left - 6, y: y(v) + 4, "text-anchor": "end" }, fmt(v)));
    }
    root.append(svg("text", { class: "tick", x: m.left, y: height - 12, "text-anchor": "start" },
                    fmtTime(new Date(t0).toISOString())));
    root.append(svg("text", { class: "tick", x: width - m.right, y: height - 12, "text-anchor": "end" },
                    fmtTime(new Date(t1).toISOString())));

    root.append(svg("line", { class: "limit-line", "data-value": String(limit),
                              x1: m.left, y1: y(limit), x2: width - m.right, y2: y(limit) }));
    root.append(svg("text", { class: "line-label", x: width - m.right + 6, y: y(limit) + 4 },
                    "limit " + fmt(limit)));
    root.append(svg("line", { class: "warning-line", "data-value": String(threshold),
                              x1: m.left, y1: y(threshold), x2: width - m.right, y2: y(threshold) }));
    root.append(svg("text", { class: "line-label", x: width - m.right + 6, y: y(threshold) + 4 },
                    "warning " + Math.round(fraction * 100) + "%"));

    if (points.length) {
      let d = "M " + x(t0) + " " + y(0);
      let last = 0;
      for (const p of points) {
        const px = x(Date.parse(p.at));
        d += " L " + px + " " + y(last) + " L " + px + " " + y(p.value);
        last = p.value;
      }
      root.append(svg("path", { class: "spent-line", d: d }));
    }
    let jobOrdinal = 0;
    points.forEach((p, i) => {
      const short = p.job_id ? "job " + (++jobOrdinal) : null;
      const label = p.job_id ? "job " + p.job_id : p.kind.replace(/_/g, " ");
      const circle = svg("circle", {
        class: "point" + (p.job_id ? " job-point" : " other-point"),
        cx: x(Date.parse(p.at)), cy: y(p.value), r: 5,
        "data-value": String(p.value), "data-job-id": p.job_id, "data-kind": p.kind,
        "data-at": p.at,
      }, svg("title", {}, label + ": spent ε " + fmt(p.value) + " at " + fmtTime(p.at)));
      root.append(circle);
      root.append(svg("text", { class: "point-label", x: x(Date.parse(p.at)) + 7,
                                y: y(p.value) - 7 - (i % 2) * 11 }, short || label));
    });
    if (!points.length) {
      root.append(svg("text", { class: "empty", x: m.left + 12, y: m.top + 24 }, "no charges yet"));
    }
    container.append(root);
  }

  // ---- overview ------------------------------------------------------------------------
  function stateCell(budget) {
    const exhausted = budget.dataset_epsilon_remaining <= 0;
    const text = exhausted ? "exhausted" : budget.warning ? "warning" : "ok";
    const pct = Math.round((budget.warning_fraction || 0.8) * 100);
    return el("td", { class: "warning-state state-" + text, "data-warning": String(Boolean(budget.warning)) },
              budget.warning ? "⚠ " + text + " (≥ " + pct + "% of the limit spent)" : text);
  }

  function nameCell(dataset) {
    const cell = el("td", { class: "dataset-name" },
                    el("a", { href: "#/datasets/" + encodeURIComponent(dataset.dataset_id),
                              class: "dataset-link" }, dataset.name),
                    el("div", { class: "dataset-id" }, dataset.dataset_id));
    if (dataset.deleted_at) {
      cell.append(el("span", { class: "badge deleted-badge", "data-deleted-at": dataset.deleted_at },
                     "deleted " + fmtTime(dataset.deleted_at) + " (ledger kept)"));
    }
    if (dataset.budget_id && dataset.budget_id !== dataset.dataset_id) {
      cell.append(el("div", { class: "note" }, "charges the budget of " + dataset.budget_id));
    }
    return cell;
  }

  async function renderOverview() {
    const mine = ++generation;
    show("overview-view");
    setStatus("Loading datasets…");
    const tbody = byId("datasets-table").querySelector("tbody");
    const datasets = await allPages("/v1/datasets");
    const budgets = await Promise.all(datasets.map((d) => (
      d.visibility === "private"
        ? api("/v1/datasets/" + encodeURIComponent(d.dataset_id) + "/budget").catch((e) => e)
        : Promise.resolve(null))));
    if (mine !== generation) {
      return;
    }
    clear(tbody);
    datasets.forEach((dataset, i) => {
      const budget = budgets[i];
      if (budget instanceof Unauthorized) {
        throw budget;
      }
      const row = el("tr", { class: "dataset-row" + (dataset.deleted_at ? " deleted" : ""),
                             "data-dataset-id": dataset.dataset_id,
                             "data-visibility": dataset.visibility });
      row.append(nameCell(dataset));
      row.append(el("td", { class: "unit" }, dataset.visibility === "private"
        ? (dataset.privacy_unit || "image") : "—"));
      if (budget === null) {
        row.append(el("td", { class: "public-note", colspan: 6 }, "public, no budget"));
      } else if (budget instanceof Error) {
        row.append(el("td", { class: "error", colspan: 6 }, budget.message));
      } else {
        row.append(numCell(budget.epsilon_limit, "epsilon_limit"));
        row.append(numCell(budget.dataset_epsilon_spent, "dataset_epsilon_spent"));
        row.append(numCell(budget.dataset_tight_epsilon, "dataset_tight_epsilon"));
        row.append(numCell(budget.dataset_epsilon_reserved, "dataset_epsilon_reserved"));
        row.append(numCell(budget.dataset_epsilon_remaining, "dataset_epsilon_remaining"));
        row.append(stateCell(budget));
        if (budget.warning) {
          row.classList.add("warning");
        }
      }
      tbody.append(row);
    });
    if (!datasets.length) {
      tbody.append(el("tr", {}, el("td", { colspan: 8, class: "empty" }, "no datasets")));
    }
    ready();
  }

  // ---- detail --------------------------------------------------------------------------
  function summaryRow(label, value, field, note) {
    return el("tr", {}, el("th", { scope: "row" }, label), numCell(value, field),
              el("td", { class: "note" }, note || ""));
  }

  async function renderDetail(datasetId) {
    const mine = ++generation;
    show("detail-view");
    setStatus("Loading dataset…");
    const path = "/v1/datasets/" + encodeURIComponent(datasetId);
    const dataset = await api(path);
    const budget = dataset.visibility === "private" ? await api(path + "/budget") : null;
    const jobs = (await allPages("/v1/jobs")).filter((j) => j.dataset_id === datasetId);
    if (mine !== generation) {
      return;
    }
    byId("detail-title").textContent = dataset.name;
    const meta = [dataset.dataset_id, dataset.visibility];
    if (dataset.privacy_unit) {
      meta.push("unit: " + dataset.privacy_unit);
    }
    if (dataset.neighbouring) {
      meta.push("neighbouring: " + dataset.neighbouring);
    }
    if (dataset.deleted_at) {
      meta.push("deleted " + fmtTime(dataset.deleted_at) + " (its ledger and budget remain)");
    }
    byId("detail-meta").textContent = meta.join(" · ");

    const summary = byId("detail-summary").querySelector("tbody");
    clear(summary);
    const pointsBody = byId("points-table").querySelector("tbody");
    clear(pointsBody);
    const chart = byId("chart");
    clear(chart);
    let points = [];
    if (budget === null) {
      summary.append(el("tr", {}, el("td", { class: "public-note" }, "public, no budget")));
    } else {
      summary.append(summaryRow("Limit ε", budget.epsilon_limit, "epsilon_limit",
                                "δ = " + budget.delta));
      summary.append(summaryRow("Spent ε (filter)", budget.dataset_epsilon_spent,
                                "dataset_epsilon_spent", "the guarantee the ledger enforces"));
      summary.append(summaryRow("Tight ε", budget.dataset_tight_epsilon, "dataset_tight_epsilon",
                                budget.dataset_tight_epsilon_label || "not a guarantee under adaptive use"));
      summary.append(summaryRow("Reserved ε", budget.dataset_epsilon_reserved,
                                "dataset_epsilon_reserved", "held by admitted jobs"));
      summary.append(summaryRow("Remaining ε", budget.dataset_epsilon_remaining,
                                "dataset_epsilon_remaining", ""));
      summary.append(summaryRow("Warning threshold", budget.warning_fraction, "warning_fraction",
                                budget.warning ? "⚠ reached" : "not reached"));
      summary.append(el("tr", {}, el("th", { scope: "row" }, "State"), stateCell(budget),
                        el("td", {}, "")));
      points = chartPoints(budget.history || []);
      drawChart(chart, budget, points);
      for (const p of points) {
        pointsBody.append(el("tr", { class: "point-row", "data-job-id": p.job_id, "data-kind": p.kind },
                             el("td", {}, fmtTime(p.at)),
                             el("td", {}, p.job_id ? "job " + p.job_id : p.kind.replace(/_/g, " ")),
                             numCell(p.value, "dataset_epsilon_spent_after")));
      }
    }

    // Per-partition figures: committed RDP at the admission order (always in the view) and
    // the filter epsilon of each partition (when the ledger reports it).
    const rdp = budget ? budget.partitions || {} : {};
    const eps = budget ? budget.partition_epsilon_spent || {} : {};
    const names = Array.from(new Set([...Object.keys(rdp), ...Object.keys(eps)]));
    const section = byId("partitions-section");
    const partBody = byId("partitions-table").querySelector("tbody");
    clear(partBody);
    // A per-label dataset: class sizes declared or released, or a class charged on its own.
    const rdpOf = (name) => (name in rdp ? rdp[name] : null);
    section.hidden = !(budget && (budget.class_sizes ||
      names.some((name) => name !== "*" && rdpOf(name) !== rdpOf("*"))));
    if (!section.hidden) {
      byId("partitions-note").textContent = (budget.partitions_disjoint
        ? "Per-label jobs charge only their class; '*' and every class are charged by each whole-dataset event; spent is the largest partition."
        : "The classes are not disjoint for this dataset's unit: per-label jobs are summed across classes.") +
        " RDP at the admission order α = " + budget.admission_order + ".";
      names.sort((a, b) => (a === "*" ? -1 : b === "*" ? 1 : a.localeCompare(b, undefined, { numeric: true })));
      for (const name of names) {
        const size = budget.class_sizes && name in budget.class_sizes ? budget.class_sizes[name] : null;
        partBody.append(el("tr", { class: "partition-row", "data-partition": name },
                           el("td", {}, name === "*" ? "* (whole dataset)" : name),
                           numCell(size, "class_size", true),
                           numCell(name in rdp ? rdp[name] : null, "partitions"),
                           numCell(name in eps ? eps[name] : null, "partition_epsilon_spent")));
      }
    }

    const jobsBody = byId("jobs-table").querySelector("tbody");
    clear(jobsBody);
    const after = new Map(points.filter((p) => p.job_id).map((p) => [p.job_id, p.value]));
    for (const job of jobs) {
      const privacy = job.privacy || {};
      const result = job.result || {};
      const target = job.spec && job.spec.privacy ? job.spec.privacy.target_epsilon : null;
      // granted so far: the worker's final figure, else the last heartbeat's
      const granted = typeof result.job_epsilon_granted === "number" ? result.job_epsilon_granted
        : (job.progress ? job.progress.epsilon_so_far : null);
      const stepsDone = Number.isInteger(result.steps_done) ? result.steps_done
        : (job.progress ? job.progress.step : null);
      jobsBody.append(el("tr", { class: "job-row state-" + job.state, "data-job-id": job.job_id,
                                 "data-state": job.state },
                         el("td", { class: "job-id" }, job.job_id),
                         el("td", {}, job.type),
                         el("td", { class: "job-state" }, job.state),
                         numCell(target, "target_epsilon"),
                         numCell(privacy.job_epsilon, "job_epsilon"),
                         numCell(privacy.steps, "steps", true),
                         numCell(granted, "job_epsilon_granted"),
                         numCell(stepsDone, "steps_done", true),
                         labelled(numCell(result.job_epsilon, "model_job_epsilon"),
                                  result.job_epsilon_label),
                         numCell(after.has(job.job_id) ? after.get(job.job_id) : null,
                                 "dataset_epsilon_spent_after"),
                         el("td", {}, fmtTime(job.created_at))));
    }
    if (!jobs.length) {
      jobsBody.append(el("tr", {}, el("td", { colspan: 11, class: "empty" }, "no jobs on this dataset")));
    }
    ready();
  }

  // ---- routing -------------------------------------------------------------------------
  async function route() {
    if (!getKey()) {
      showKeyForm("");
      return;
    }
    const match = /^#\/datasets\/([^/]+)$/.exec(window.location.hash);
    try {
      if (match) {
        await renderDetail(decodeURIComponent(match[1]));
      } else {
        await renderOverview();
      }
    } catch (error) {
      if (error instanceof Unauthorized) {
        onUnauthorized(error);
        return;
      }
      setStatus(error.message || String(error), true);
      document.body.setAttribute("data-ready", "error");
    }
  }

  function start() {
    byId("key-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const input = byId("api-key");
      const key = input.value.trim();
      input.value = "";
      if (!key) {
        return;
      }
      window.sessionStorage.setItem(KEY_NAME, key);
      route();
    });
    byId("forget-key").addEventListener("click", () => {
      generation++;
      forgetKey();
      window.history.replaceState(null, "", window.location.pathname); // no hashchange
      showKeyForm("The key was forgotten.");
    });
    window.addEventListener("hashchange", route);
    route();
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
