// dpsynth budget dashboard: the entry module (routing and the key form). Reads only the
// public REST endpoints with the key the user typed: the key lives in sessionStorage (this
// tab only) and travels only as an Authorization header. No inline script or style (the
// page's CSP forbids them); every value from the api is put in the DOM as text, never as
// markup. Modules: api.js (key, requests), dom.js (helpers), overview.js (budget groups),
// detail.js (one dataset), chart.js (the spent-epsilon chart).

import { forgetKey, getKey, setKey, Unauthorized } from "./api.js";
import { renderDetail } from "./detail.js";
import { byId, setStatus, show } from "./dom.js";
import { renderOverview } from "./overview.js";

let generation = 0; // a newer render makes an older one's results stale

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

function onUnauthorized() {
  forgetKey();
  showKeyForm("The api refused this key (401): enter a valid key with the read scope.");
}

async function route() {
  if (!getKey()) {
    showKeyForm("");
    return;
  }
  const mine = ++generation;
  const isCurrent = () => mine === generation;
  const match = /^#\/datasets\/([^/]+)$/.exec(window.location.hash);
  try {
    if (match) {
      await renderDetail(decodeURIComponent(match[1]), isCurrent);
    } else {
      await renderOverview(isCurrent);
    }
  } catch (error) {
    if (error instanceof Unauthorized) {
      onUnauthorized();
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
    setKey(key);
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

// a module runs after the document is parsed
start();
