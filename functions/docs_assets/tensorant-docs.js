// Starts the vendored Swagger UI on /api/docs. Nothing here may reach the network beyond this
// host: validatorUrl null turns off the badge that would call validator.swagger.io.
//
// The bearer token pasted into "Authorize" is kept in sessionStorage (this tab only, gone when it
// closes), never in localStorage, where Swagger UI's own persistAuthorization would keep it for every
// later visitor of this browser profile and every script of this origin (issue 28.17).
const AUTH_KEY = "tensorant.docs.authorized";

function saveAuthorization(system) {
  const authorized = system.authSelectors.authorized().toJS();
  if (Object.keys(authorized).length) {
    sessionStorage.setItem(AUTH_KEY, JSON.stringify(authorized));
  } else {
    sessionStorage.removeItem(AUTH_KEY);
  }
}

// authorize and logout wrapped: the session copy follows each change.
const SessionAuthorization = () => ({
  statePlugins: {
    auth: {
      wrapActions: {
        authorize: (action, system) => (payload) => {
          const result = action(payload);
          saveAuthorization(system);
          return result;
        },
        logout: (action, system) => (payload) => {
          const result = action(payload);
          saveAuthorization(system);
          return result;
        },
      },
    },
  },
});

window.addEventListener("load", function () {
  window.ui = SwaggerUIBundle({
    url: "/api/openapi.json",
    dom_id: "#swagger-ui",
    presets: [SwaggerUIBundle.presets.apis],
    plugins: [SessionAuthorization],
    layout: "BaseLayout",
    deepLinking: true,
    docExpansion: "list",
    defaultModelsExpandDepth: 0,
    displayRequestDuration: true,
    persistAuthorization: false,
    validatorUrl: null,
    onComplete: function () {
      const saved = sessionStorage.getItem(AUTH_KEY);
      if (saved) {
        try {
          window.ui.authActions.authorize(JSON.parse(saved));
        } catch (e) {
          sessionStorage.removeItem(AUTH_KEY);
        }
      }
    },
  });
});
