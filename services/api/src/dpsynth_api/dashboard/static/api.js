// The key and the api. The key lives in sessionStorage (this tab only) and travels only as
// an Authorization header to this origin; nothing else is ever sent.

const KEY_NAME = "dpsynth.dashboard.apiKey";
const PAGE = 200;

export class Unauthorized extends Error {}

export function getKey() {
  return window.sessionStorage.getItem(KEY_NAME);
}

export function setKey(key) {
  window.sessionStorage.setItem(KEY_NAME, key);
}

export function forgetKey() {
  window.sessionStorage.removeItem(KEY_NAME);
}

export async function api(path) {
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

export async function allPages(path) {
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

export function budgetPath(datasetId) {
  return "/v1/datasets/" + encodeURIComponent(datasetId) + "/budget";
}
