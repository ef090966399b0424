// Starts ReDoc on /redoc. A file of its own (not an inline script), so the page's
// Content-Security-Policy allows scripts from this origin only. ReDoc injects its style
// sheets as <style> elements: they carry the page's per-response nonce (data-style-nonce),
// which the CSP's style-src names, so no 'unsafe-inline' is needed.
(function () {
  "use strict";
  var root = document.getElementById("redoc");
  Redoc.init(root.getAttribute("data-openapi-url"), {
    nonce: root.getAttribute("data-style-nonce"),
    expandResponses: "",
    hideDownloadButton: false,
    pathInMiddlePanel: true
  }, root);
})();
