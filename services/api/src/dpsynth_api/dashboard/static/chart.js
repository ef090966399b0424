// The chart of the filter's spent epsilon over time: one point per job (its last charge) and
// one per other charge (such as a class-size histogram release), each labelled with the
// job's name (or id) or the kind of charge.

import { fmt, fmtTime, svg, clear, jobLabel, truncate } from "./dom.js";

const LABEL_CHARS = 18;

// A charge moves the filter figure: a granted DP-SGD lease (of a job) or a one-shot release.
function isCharge(entry) {
  return entry.kind === "lease_granted" || entry.kind === "histogram_released" ||
    (typeof entry.rdp_delta === "number" && entry.rdp_delta > 0);
}

export function chartPoints(history) {
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

// What a point is, in words: the job's name (or id), or the kind of charge; the long form
// adds the job's id and the dataset it ran on.
export function pointLabel(p, jobs, datasets) {
  if (!p.job_id) {
    return { short: p.kind.replace(/_/g, " "), long: p.kind.replace(/_/g, " ") };
  }
  const job = jobs.get(p.job_id);
  const label = jobLabel(job, p.job_id);
  let long = label === p.job_id ? "job " + p.job_id : label + " (job " + p.job_id + ")";
  const dataset = job ? datasets.get(job.dataset_id) : null;
  if (dataset) {
    long += " on " + dataset.name;
  }
  return { short: label, long: long };
}

function axes(root, m, width, height, y, limit, t0, t1) {
  root.append(svg("line", { class: "axis", x1: m.left, y1: y(0), x2: width - m.right, y2: y(0) }));
  root.append(svg("line", { class: "axis", x1: m.left, y1: m.top, x2: m.left, y2: y(0) }));
  for (const v of [0, limit / 2, limit]) {
    root.append(svg("text", { class: "tick", x: m.left - 6, y: y(v) + 4, "text-anchor": "end" }, fmt(v)));
  }
  root.append(svg("text", { class: "tick", x: m.left, y: height - 12, "text-anchor": "start" },
                  fmtTime(new Date(t0).toISOString())));
  root.append(svg("text", { class: "tick", x: width - m.right, y: height - 12, "text-anchor": "end" },
                  fmtTime(new Date(t1).toISOString())));
}

function lines(root, m, width, y, limit, fraction) {
  const threshold = fraction * limit;
  root.append(svg("line", { class: "limit-line", "data-value": String(limit),
                            x1: m.left, y1: y(limit), x2: width - m.right, y2: y(limit) }));
  root.append(svg("text", { class: "line-label", x: width - m.right + 6, y: y(limit) + 4 },
                  "limit " + fmt(limit)));
  root.append(svg("line", { class: "warning-line", "data-value": String(threshold),
                            x1: m.left, y1: y(threshold), x2: width - m.right, y2: y(threshold) }));
  root.append(svg("text", { class: "line-label", x: width - m.right + 6, y: y(threshold) + 4 },
                  "warning " + Math.round(fraction * 100) + "%"));
}

export function drawChart(container, budget, points, jobs, datasets) {
  clear(container);
  const width = 720;
  const height = 280;
  const m = { left: 56, right: 150, top: 16, bottom: 36 };
  const limit = budget.epsilon_limit;
  const fraction = typeof budget.warning_fraction === "number" ? budget.warning_fraction : 0.8;
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
  axes(root, m, width, height, y, limit, t0, t1);
  lines(root, m, width, y, limit, fraction);
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
  points.forEach((p, i) => {
    const label = pointLabel(p, jobs, datasets);
    const px = x(Date.parse(p.at));
    // close points' labels are staggered over three lines; a label never runs past the plot
    const anchor = px > width - m.right - 60 ? "end" : "start";
    root.append(svg("circle", {
      class: "point" + (p.job_id ? " job-point" : " other-point"),
      cx: px, cy: y(p.value), r: 5, "data-value": String(p.value), "data-job-id": p.job_id,
      "data-kind": p.kind, "data-at": p.at, "data-label": label.short,
    }, svg("title", {}, label.long + ": spent ε " + fmt(p.value) + " at " + fmtTime(p.at))));
    root.append(svg("text", { class: "point-label", "data-job-id": p.job_id,
                              x: anchor === "end" ? px - 7 : px + 7,
                              y: y(p.value) - 7 - (i % 3) * 11, "text-anchor": anchor },
                    truncate(label.short, LABEL_CHARS)));
  });
  if (!points.length) {
    root.append(svg("text", { class: "empty", x: m.left + 12, y: m.top + 24 }, "no charges yet"));
  }
  container.append(root);
}
