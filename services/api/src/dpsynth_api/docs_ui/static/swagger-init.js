// Starts Swagger UI on /docs. A file of its own (not an inline script), so the page's
// Content-Security-Policy allows scripts from this origin only (dpsynth_api.docs_ui.router).
(function () {
  "use strict";
  var root = document.getElementById("swagger-ui");
  window.ui = SwaggerUIBundle({
    url: root.getAttribute("data-openapi-url"),
    dom_id: "#swagger-ui",
    layout: "BaseLayout",
    presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
    deepLinking: true,
    showExtensions: true,
    showCommonExtensions: true,
    displayRequestDuration: true,
    docExpansion: "list",
    filter: true,
    // Never send the document to validator.swagger.io (the default off localhost): the
    // badge would be a request to another origin, which the CSP refuses anyway.
    validatorUrl: null,
    // The key the user types under "Authorize" stays in this tab's memory: not in
    // localStorage, where it would outlive the tab (the dashboard keeps it the same way).
    persistAuthorization: false
  });
})();
