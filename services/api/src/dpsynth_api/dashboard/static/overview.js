// The overview: one group per privacy budget. Datasets that share a budget (derived with
// `datasets derive`, uploaded with `--on-overlap link`) are listed under the budget's owner
// (the upload whose id the budget bears), and the shared figures are shown ONCE, on the
// owner's row, from one budget view. Public datasets have no budget.

import { api, allPages, budgetPath, Unauthorized } from "./api.js";
import {
  byId, datasetLink, deletedBadge, el, numCell, ready, setStatus, show, stateCell,
} from "./dom.js";

export const BUDGET_COLUMNS = [
  ["epsilon_limit", "Limit ε"],
  ["dataset_epsilon_spent", "Spent ε"],
  ["dataset_tight_epsilon", "Tight ε*"],
  ["dataset_epsilon_reserved", "Reserved ε"],
  ["dataset_epsilon_remaining", "Remaining ε"],
];

// Private datasets by the budget they charge (first seen, first listed); public ones apart.
export function budgetGroups(datasets) {
  const groups = new Map();
  const publics = [];
  for (const dataset of datasets) {
    if (dataset.visibility !== "private") {
      publics.push(dataset);
      continue;
    }
    const budgetId = dataset.budget_id || dataset.dataset_id;
    if (!groups.has(budgetId)) {
      groups.set(budgetId, { budgetId: budgetId, owner: null, members: [] });
    }
    const group = groups.get(budgetId);
    if (dataset.dataset_id === budgetId) {
      group.owner = dataset;
    } else {
      group.members.push(dataset);
    }
  }
  return { groups: Array.from(groups.values()), publics: publics };
}

// the members in the budget view's order (oldest first), else the list's
function orderMembers(group, budget) {
  const order = budget && Array.isArray(budget.budget_dataset_ids) ? budget.budget_dataset_ids : [];
  const rank = (d) => (order.includes(d.dataset_id) ? order.indexOf(d.dataset_id) : order.length);
  group.members.sort((a, b) => rank(a) - rank(b));
}

function unitCell(dataset) {
  return el("td", { class: "unit" }, dataset.privacy_unit || "image");
}

function relation(member, ownerName) {
  const kind = member.derivation && member.derivation.kind;
  if (kind === "link") {
    return "linked to " + ownerName + " (overlapping records)";
  }
  return "derived from " + ownerName + (kind ? " (" + kind + ")" : "");
}

function ownerRow(group, budget) {
  const owner = group.owner;
  const members = group.members.length;
  const every = [owner, ...group.members].filter(Boolean);
  const allDeleted = every.every((d) => d.deleted_at);
  const row = el("tr", {
    class: "dataset-row budget-row" + (owner && owner.deleted_at ? " deleted" : "") +
      (allDeleted ? " group-deleted" : "") + (members ? " shared" : ""),
    "data-dataset-id": owner ? owner.dataset_id : null, "data-budget-id": group.budgetId,
    "data-members": String(members), "data-visibility": "private",
  });
  const name = el("td", { class: "dataset-name" },
                  owner ? datasetLink(owner) : el("span", { class: "dataset-link" }, "budget " + group.budgetId),
                  el("div", { class: "dataset-id" }, group.budgetId));
  if (owner && owner.deleted_at) {
    name.append(deletedBadge(owner));
  }
  if (members) {
    name.append(el("div", { class: "group-note" },
                   "budget shared by " + (members + (owner ? 1 : 0)) + " datasets: figures shown once"));
  }
  row.append(name, owner ? unitCell(owner) : el("td", { class: "unit" }, budget.privacy_unit || "image"));
  if (budget instanceof Error) {
    row.append(el("td", { class: "error", colspan: 6 }, budget.message));
    return row;
  }
  for (const [field, short] of BUDGET_COLUMNS) {
    row.append(numCell(budget[field], field, false, short));
  }
  row.append(stateCell(budget, allDeleted));
  if (budget.warning && !allDeleted) {
    row.classList.add("warning");
  }
  return row;
}

function memberRow(group, member) {
  const ownerName = group.owner ? group.owner.name : group.budgetId;
  const row = el("tr", {
    class: "dataset-row member-row" + (member.deleted_at ? " deleted" : ""),
    "data-dataset-id": member.dataset_id, "data-budget-id": group.budgetId,
    "data-visibility": "private",
  });
  const name = el("td", { class: "dataset-name member-name" },
                  el("span", { class: "member-mark", "aria-hidden": "true" }, "↳ "),
                  datasetLink(member), el("div", { class: "dataset-id" }, member.dataset_id),
                  el("div", { class: "group-note" }, relation(member, ownerName)));
  if (member.deleted_at) {
    name.append(deletedBadge(member));
  }
  row.append(name, unitCell(member),
             el("td", { class: "shared-note", colspan: 5 },
                "charges the budget of " + ownerName + " (its figures above)"));
  row.append(member.deleted_at
    ? el("td", { class: "warning-state state-deleted", "data-state": "deleted" }, "deleted")
    : el("td", { class: "warning-state state-shared", "data-state": "shared" }, "as above"));
  return row;
}

function publicRow(dataset) {
  const name = el("td", { class: "dataset-name" }, datasetLink(dataset),
                  el("div", { class: "dataset-id" }, dataset.dataset_id));
  if (dataset.deleted_at) {
    name.append(deletedBadge(dataset));
  }
  return el("tr", { class: "dataset-row public-row" + (dataset.deleted_at ? " deleted" : ""),
                    "data-dataset-id": dataset.dataset_id, "data-visibility": dataset.visibility },
            name, el("td", { class: "unit" }, "—"),
            el("td", { class: "public-note", colspan: 6 }, "public, no budget"));
}

export async function renderOverview(isCurrent) {
  show("overview-view");
  setStatus("Loading datasets…");
  const datasets = await allPages("/v1/datasets");
  const { groups, publics } = budgetGroups(datasets);
  // budgets still in use first; a budget whose every dataset is deleted after them
  const gone = (g) => [g.owner, ...g.members].filter(Boolean).every((d) => d.deleted_at);
  groups.sort((a, b) => Number(gone(a)) - Number(gone(b)));
  // one budget view per group: the shared figures come from one answer of the api
  const budgets = await Promise.all(groups.map((g) => (
    api(budgetPath(g.owner ? g.owner.dataset_id : g.members[0].dataset_id)).catch((e) => e))));
  if (!isCurrent()) {
    return;
  }
  const table = byId("datasets-table");
  for (const old of Array.from(table.querySelectorAll("tbody"))) {
    old.remove();
  }
  groups.forEach((group, i) => {
    const budget = budgets[i];
    if (budget instanceof Unauthorized) {
      throw budget;
    }
    orderMembers(group, budget instanceof Error ? null : budget);
    const body = el("tbody", { class: "budget-group", "data-budget-id": group.budgetId });
    body.append(ownerRow(group, budget));
    for (const member of group.members) {
      body.append(memberRow(group, member));
    }
    table.append(body);
  });
  const rest = el("tbody", { class: "public-group" });
  for (const dataset of publics) {
    rest.append(publicRow(dataset));
  }
  if (!datasets.length) {
    rest.append(el("tr", {}, el("td", { colspan: 8, class: "empty" }, "no datasets")));
  }
  table.append(rest);
  ready();
}
