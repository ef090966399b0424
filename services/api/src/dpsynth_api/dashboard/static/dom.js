// DOM and formatting helpers. Every value from the api goes into the DOM as text, never as
// markup; every number shown carries its raw value in data-value.

const SVG_NS = "http://www.w3.org/2000/svg";

export function fmt(x) {
  if (x === null || x === undefined) {
    return "—";
  }
  if (typeof x !== "number" || !Number.isFinite(x)) {
    return String(x);
  }
  if (x === 0 || Math.abs(x) >= 1e-3) {
    return x.toFixed(4);
  }
  return x.toExponential(3);
}

export function fmtTime(iso) {
  if (!iso) {
    return "—";
  }
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? String(iso) : d.toISOString().replace("T", " ").slice(0, 19);
}

function build(node, attrs, children) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value !== null && value !== undefined) {
      node.setAttribute(name, String(value));
    }
  }
  for (const child of children) {
    if (child !== null && child !== undefined) {
      node.append(typeof child === "string" ? document.createTextNode(child) : child);
    }
  }
  return node;
}

export function el(tag, attrs, ...children) {
  return build(document.createElement(tag), attrs, children);
}

export function svg(tag, attrs, ...children) {
  return build(document.createElementNS(SVG_NS, tag), attrs, children);
}

// A count (steps, a class size) is shown whole; an epsilon to 4 decimals. ``short`` is the
// column's name shown above the figure on a narrow screen (the header row is hidden there).
export function numCell(value, field, count, short) {
  const attrs = { class: "num", "data-field": field, "data-short": short || null };
  if (typeof value === "number") {
    attrs["data-value"] = String(value);
  }
  const text = count && Number.isInteger(value) ? String(value) : fmt(value);
  return el("td", attrs, text);
}

// a figure that is not a guarantee (a model's composed lineage): its label on hover
export function labelled(cell, label) {
  if (label) {
    cell.title = label;
    cell.setAttribute("data-label", label);
  }
  return cell;
}

export function byId(id) {
  return document.getElementById(id);
}

export function clear(node) {
  while (node.firstChild) {
    node.removeChild(node.firstChild);
  }
}

export function setStatus(text, isError) {
  const status = byId("status");
  status.textContent = text || "";
  status.className = isError ? "error" : "";
}

export function show(view) {
  for (const id of ["key-view", "overview-view", "detail-view"]) {
    byId(id).hidden = id !== view;
  }
  byId("forget-key").hidden = view === "key-view";
  document.body.setAttribute("data-view", view.replace("-view", ""));
  document.body.setAttribute("data-ready", "false");
}

export function ready() {
  document.body.setAttribute("data-ready", "true");
  setStatus("");
}

export function datasetLink(dataset, cls) {
  return el("a", { href: "#/datasets/" + encodeURIComponent(dataset.dataset_id),
                   class: cls || "dataset-link" }, dataset.name);
}

// The budget's state: exhausted, warning or ok; a group whose every dataset is deleted is
// "deleted" (its budget and ledger stay), never a green "ok".
export function stateCell(budget, allDeleted) {
  const pct = Math.round((budget.warning_fraction || 0.8) * 100);
  if (allDeleted) {
    return el("td", { class: "warning-state state-deleted", "data-state": "deleted",
                      "data-warning": String(Boolean(budget.warning)) },
              "deleted: budget and ledger kept");
  }
  const exhausted = budget.dataset_epsilon_remaining <= 0;
  const text = exhausted ? "exhausted" : budget.warning ? "warning" : "ok";
  return el("td", { class: "warning-state state-" + text, "data-state": text,
                    "data-warning": String(Boolean(budget.warning)) },
            budget.warning ? "⚠ " + text + " (≥ " + pct + "% of the limit spent)" : text);
}

export function deletedBadge(dataset) {
  return el("span", { class: "badge deleted-badge", "data-deleted-at": dataset.deleted_at },
            "deleted " + fmtTime(dataset.deleted_at) + " · budget and ledger kept");
}

// A job in the user's words: its name when it has one, else its id.
export function jobLabel(job, jobId) {
  return (job && job.name) || jobId;
}

export function truncate(text, n) {
  return text.length > n ? text.slice(0, n - 1) + "…" : text;
}
