// One dataset: its budget's figures (shared with the datasets that charge the same budget),
// the chart of spent epsilon, the per-partition figures and the dataset's jobs.

import { api, allPages, budgetPath } from "./api.js";
import { chartPoints, drawChart, pointLabel } from "./chart.js";
import {
  byId, clear, datasetLink, el, fmt, fmtTime, jobLabel, labelled, numCell, ready, setStatus,
  show, stateCell,
} from "./dom.js";

function summaryRow(label, value, field, note) {
  return el("tr", {}, el("th", { scope: "row" }, label), numCell(value, field),
            el("td", { class: "note" }, note || ""));
}

function renderMeta(dataset) {
  byId("detail-title").textContent = dataset.name;
  const meta = [dataset.dataset_id, dataset.visibility];
  if (dataset.privacy_unit) {
    meta.push("unit: " + dataset.privacy_unit);
  }
  if (dataset.neighbouring) {
    meta.push("neighbouring: " + dataset.neighbouring);
  }
  byId("detail-meta").textContent = meta.join(" · ");
  const deleted = byId("detail-deleted");
  deleted.hidden = !dataset.deleted_at;
  deleted.textContent = dataset.deleted_at
    ? "Deleted " + fmtTime(dataset.deleted_at) + ": its data is gone; its budget and its " +
      "ledger stay (every charge below still counts)."
    : "";
}

// which budget this dataset charges, and which other datasets share it
function renderGroup(dataset, budget, datasets) {
  const note = byId("detail-budget");
  clear(note);
  const ids = budget && Array.isArray(budget.budget_dataset_ids) ? budget.budget_dataset_ids : [];
  note.hidden = ids.length < 2;
  if (note.hidden) {
    return;
  }
  const owner = datasets.get(budget.budget_id);
  note.setAttribute("data-budget-id", budget.budget_id);
  note.append(budget.budget_id === dataset.dataset_id
    ? "This dataset owns a budget shared with "
    : "This dataset charges the budget of ");
  if (budget.budget_id !== dataset.dataset_id) {
    note.append(owner ? datasetLink(owner) : budget.budget_id, ", shared with ");
  }
  const others = ids.filter((id) => id !== dataset.dataset_id && id !== budget.budget_id);
  others.forEach((id, i) => {
    const other = datasets.get(id);
    note.append(i ? ", " : "", other ? datasetLink(other) : id);
  });
  if (!others.length) {
    note.append("no other dataset");
  }
  note.append(". The figures, the chart and the partitions are that one budget's: every " +
              "charge of every dataset that shares it. The jobs below are this dataset's.");
}

// every dataset that charges the budget is deleted: the budget is kept, not "ok"
function allDeleted(dataset, budget, datasets) {
  const ids = budget && Array.isArray(budget.budget_dataset_ids) && budget.budget_dataset_ids.length
    ? budget.budget_dataset_ids : [dataset.dataset_id];
  return ids.every((id) => {
    const d = id === dataset.dataset_id ? dataset : datasets.get(id);
    return Boolean(d && d.deleted_at);
  });
}

function renderSummary(budget, deleted) {
  const summary = byId("detail-summary").querySelector("tbody");
  clear(summary);
  if (budget === null) {
    summary.append(el("tr", {}, el("td", { class: "public-note" }, "public, no budget")));
    return;
  }
  summary.append(summaryRow("Limit ε", budget.epsilon_limit, "epsilon_limit", "δ = " + budget.delta));
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
  summary.append(el("tr", {}, el("th", { scope: "row" }, "State"), stateCell(budget, deleted),
                    el("td", {}, "")));
}

function renderPoints(budget, jobs, datasets) {
  const pointsBody = byId("points-table").querySelector("tbody");
  clear(pointsBody);
  const chart = byId("chart");
  clear(chart);
  if (budget === null) {
    return [];
  }
  const points = chartPoints(budget.history || []);
  drawChart(chart, budget, points, jobs, datasets);
  for (const p of points) {
    const label = pointLabel(p, jobs, datasets);
    pointsBody.append(el("tr", { class: "point-row", "data-job-id": p.job_id, "data-kind": p.kind },
                         el("td", {}, fmtTime(p.at)),
                         el("td", { class: "point-charge", "data-label": label.short }, label.long),
                         numCell(p.value, "dataset_epsilon_spent_after")));
  }
  return points;
}

// Per-partition figures: committed RDP at the admission order (always in the view) and the
// filter epsilon of each partition (when the ledger reports it).
function renderPartitions(budget) {
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
  if (section.hidden) {
    return;
  }
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

function jobCell(job) {
  const label = jobLabel(job, job.job_id);
  const cell = el("td", { class: "job-name", "data-label": label });
  if (job.name) {
    cell.append(el("div", { class: "job-title" }, job.name));
  }
  cell.append(el("div", { class: "job-id" }, job.job_id));
  return cell;
}

// A finetune's recipe family, the key its privacy audits are filed under (the same string
// as dpsynth_shared.audit_specs.recipe_family and GET /v1/jobs/{id}'s "audit").
function recipeFamily(spec) {
  const t = (spec && spec.training) || {};
  const parts = ["trainable=" + (t.trainable || "full"), "K=" + (t.noise_multiplicity || 1)];
  if (t.max_physical_batch_size) {
    parts.push("physical<=" + t.max_physical_batch_size);
  }
  return parts.join(",");
}

// The latest succeeded audit of this finetune or of its recipe family ("audits": newest
// first), as the job view shows it; a cell saying "not audited" without one.
function auditCell(job, audits) {
  const cell = el("td", { class: "job-audit" });
  if (job.type !== "finetune") {
    return cell;
  }
  const family = recipeFamily(job.spec);
  const candidates = audits.filter((a) => {
    const result = a.result || {};
    const view = result.audit_result || {};
    return (result.audit || {}).audited_job_id === job.job_id
      || (view.key || {}).recipe_family === family;
  });
  // the newest of the finetune's own key (its device kind and ranks) first, as
  // GET /v1/jobs/{id} (the page does not know the server's code version)
  const device = (job.result || {}).device;
  const ranks = (job.result || {}).world_size;
  const where = (kind, n) => kind + (n && n > 1 ? " x " + n + " ranks" : "");
  const sameKey = (a) => {
    const key = (a.result.audit_result || {}).key || {};
    return (!device || key.device === device) && (!ranks || (key.world_size || 1) === ranks);
  };
  const match = candidates.find(sameKey) || candidates[0];
  if (!match) {
    cell.setAttribute("data-audit", "not_audited");
    cell.append("not audited");
    return cell;
  }
  const view = match.result.audit_result;
  const key = view.key || {};
  cell.setAttribute("data-audit", view.verdict);
  cell.setAttribute("data-audit-job-id", match.job_id);
  cell.setAttribute("title", "audit " + match.job_id + " (" + (key.engine || "?") + ", "
                    + where(key.device || "?", key.world_size) + ", version "
                    + (key.code_version || "?") + ")"
                    + (sameKey(match) ? "" : "; the finetune ran on "
                       + where(device || "?", ranks) + ": no audit of that key yet"));
  cell.append(view.verdict + ": ε ≥ " + fmt(view.epsilon_lower_bound) + " vs "
              + fmt(view.claimed_epsilon) + ", " + fmtTime(match.finished_at));
  return cell;
}

function renderJobs(jobs, points, audits) {
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
                       jobCell(job),
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
                       auditCell(job, audits),
                       el("td", {}, fmtTime(job.created_at))));
  }
  if (!jobs.length) {
    jobsBody.append(el("tr", {}, el("td", { colspan: 12, class: "empty" }, "no jobs on this dataset")));
  }
}

export async function renderDetail(datasetId, isCurrent) {
  show("detail-view");
  setStatus("Loading dataset…");
  const dataset = await api("/v1/datasets/" + encodeURIComponent(datasetId));
  const budget = dataset.visibility === "private" ? await api(budgetPath(datasetId)) : null;
  const [allJobs, allDatasets] = await Promise.all([allPages("/v1/jobs"), allPages("/v1/datasets")]);
  if (!isCurrent()) {
    return;
  }
  // every job and dataset by id: a shared budget's chart names jobs of its other datasets
  const jobs = new Map(allJobs.map((j) => [j.job_id, j]));
  const datasets = new Map(allDatasets.map((d) => [d.dataset_id, d]));
  renderMeta(dataset);
  renderGroup(dataset, budget, datasets);
  renderSummary(budget, allDeleted(dataset, budget, datasets));
  const points = renderPoints(budget, jobs, datasets);
  renderPartitions(budget);
  const audits = allJobs.filter((j) => j.type === "audit" && j.state === "succeeded")
    .sort((a, b) => String(b.finished_at).localeCompare(String(a.finished_at)));
  renderJobs(allJobs.filter((j) => j.dataset_id === datasetId), points, audits);
  ready();
}
