// The console's router (#/connections, #/configure, #/runs, #/runs/<id>, #/usage, #/webhooks) and its sign-in.
import { api, claims, token } from "./api.js";
import { connectionsPage } from "./connections.js";
import { configurePage } from "./configure.js";
import { runsPage } from "./runs.js";
import { runPage } from "./run.js";
import { usagePage } from "./usage.js";
import { webhooksPage } from "./webhooks.js";
import { errorBox, field, h, fill } from "./ui.js";

const main = document.getElementById("main");
let cleanup = null; // the page's pollers, stopped when another page is shown

function signInPage(message) {
  const input = h("input", { type: "password", autocomplete: "off", spellcheck: "false" });
  const out = h("div");
  const form = h("form", { "aria-labelledby": "signin-title" },
    field("API token", input, "Mint one on the control plane's host: tensorant dev-token --org demo --role owner. "
      + "It is kept in this tab only (sessionStorage) and sent as Authorization: Bearer."),
    h("div", { class: "buttons" }, h("button", { type: "submit", class: "primary" }, "Sign in")), out);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    token.set(input.value.trim());
    try {
      await api("GET", "/api/connections");
      const target = location.hash && location.hash !== "#/signin" ? location.hash : "#/connections";
      if (location.hash === target) render();
      else location.hash = target; // hashchange renders it
    } catch (err) {
      token.clear();
      fill(out, errorBox(err));
      input.focus();
    }
  });
  return [h("h1", { id: "signin-title" }, "Sign in"), message ? errorBox(message) : null, form];
}

function route() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").filter(Boolean).map(decodeURIComponent);
  if (parts[0] === "runs" && parts[1]) return [runPage, parts[1]];
  const pages = { connections: connectionsPage, configure: configurePage, runs: runsPage, usage: usagePage,
    webhooks: webhooksPage };
  return [pages[parts[0]] || connectionsPage];
}

let drawing = 0; // only the latest render may fill the page (two may overlap while one loads)

async function render(message) {
  const mine = ++drawing;
  if (cleanup) cleanup();
  cleanup = null;
  const signedIn = Boolean(token.get());
  document.getElementById("signout").hidden = !signedIn;
  const c = claims();
  document.getElementById("who").textContent = signedIn ? `${c.sub || "?"} · org ${c.org || "?"} · ${c.role || ""}` : "";
  const current = location.hash.split("/")[1] || "";
  for (const a of document.querySelectorAll(".top nav a")) {
    if (a.getAttribute("href") === `#/${current}`) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  if (!signedIn) {
    fill(main, ...signInPage(message));
    document.title = "Sign in · Tensorant console";
    main.querySelector("input").focus();
    return;
  }
  const [page, arg] = route();
  fill(main, h("p", { class: "muted" }, "Loading…"));
  try {
    const shown = await page(arg);
    if (mine !== drawing) {
      if (shown.cleanup) shown.cleanup();
      return;
    }
    fill(main, ...shown.nodes);
    cleanup = shown.cleanup || null;
  } catch (err) {
    if (mine !== drawing) return;
    fill(main, h("h1", {}, "Something went wrong"), errorBox(err));
  }
  const title = main.querySelector("h1");
  document.title = `${title ? title.textContent : "Console"} · Tensorant console`;
  main.focus();
}

window.addEventListener("hashchange", () => render());
window.addEventListener("tensorant:unauthorized", () => {
  token.clear();
  render("The token was refused (expired, or signed with another secret): paste a new one.");
});
document.getElementById("signout").addEventListener("click", () => {
  token.clear();
  location.hash = "#/signin";
  render();
});
render();
