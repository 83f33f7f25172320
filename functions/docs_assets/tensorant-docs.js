// Starts the vendored Swagger UI on /api/docs. Nothing here may reach the network beyond this
// host: validatorUrl null turns off the badge that would call validator.swagger.io.
window.addEventListener("load", function () {
  window.ui = SwaggerUIBundle({
    url: "/api/openapi.json",
    dom_id: "#swagger-ui",
    presets: [SwaggerUIBundle.presets.apis],
    layout: "BaseLayout",
    deepLinking: true,
    docExpansion: "list",
    defaultModelsExpandDepth: 0,
    displayRequestDuration: true,
    persistAuthorization: true,
    validatorUrl: null,
  });
});
