// Settings -> Connections: the storage card and a card per compute provider, with each check's status.
import { api, get, post } from "./api.js";
import { badge, busy, errorBox, field, h, say, when, fill } from "./ui.js";

const LABEL = { connected: "Connected", checking: "Checking…", failed: "Check failed" };

// Which providers exist and what each body looks like are the API document's to say.
async function document_() {
  const doc = await fetch("/api/openapi.json").then((r) => r.json());
  const put = doc.paths["/api/connections/compute/{provider}"].put;
  const param = put.parameters.find((p) => p.name === "provider");
  const examples = put.requestBody.content["application/json"].examples || {};
  const storage = doc.paths["/api/connections/storage"].put.requestBody.content["application/json"].examples || {};
  return { providers: param.schema.enum, examples, storage };
}

function checksList(conn) {
  if (!conn || !conn.checks.length) return null;
  return h("ul", { class: "checks" }, conn.checks.map((c) =>
    h("li", {}, badge(c.status), " ", h("strong", {}, c.name), ": ", c.message)));
}

function card({ title, provider, conn, example, save, check, refresh }) {
  const out = h("div");
  const status = conn ? LABEL[conn.status] || conn.status : "Not connected";
  const body = h("textarea", { rows: 5, spellcheck: "false" });
  body.value = JSON.stringify(conn ? conn.config : example, null, 2);
  const saveButton = h("button", { type: "button", class: "primary", id: `save-${provider}` },
    conn ? "Save and check again" : "Connect");
  saveButton.addEventListener("click", () => busy(saveButton, async () => {
    let parsed;
    try {
      parsed = JSON.parse(body.value || "{}");
    } catch (err) {
      throw new Error(`The settings are not valid JSON: ${err.message}`);
    }
    await save(parsed);
    say(`${title}: saved; checking`);
    await refresh();
  }, out));
  const buttons = [saveButton];
  if (conn && check) {
    const again = h("button", { type: "button", id: `check-${provider}` }, "Check again");
    again.addEventListener("click", () => busy(again, async () => { await check(); await refresh(); }, out));
    buttons.push(again);
  }
  return h("section", { class: "card", "aria-labelledby": `card-${provider}` },
    h("h3", { id: `card-${provider}` }, title, " ", h("span", { class: `badge ${conn ? conn.status : ""}`,
      "data-status": conn ? conn.status : "none" }, status)),
    conn ? h("p", { class: "hint" }, `saved ${when(conn.saved_at)}`, conn.checked_at ? `, checked ${when(conn.checked_at)}` : "") : null,
    checksList(conn),
    conn ? conn.warnings.map((w) => h("div", { class: "warning" }, w)) : null,
    field(`${title} settings (JSON)`, body, conn
      ? "Secrets are never shown again; leave them out to keep the saved ones."
      : "Fill in the example's fields; the API names any field it refuses."),
    h("div", { class: "buttons" }, buttons), out);
}

export async function connectionsPage() {
  const meta = await document_();
  const list = h("div");
  let timer = null;
  let stopped = false;

  async function refresh() {
    const { items } = await get("/api/connections");
    const focused = document.activeElement && document.activeElement.id;
    const by = Object.fromEntries(items.map((c) => [c.slot, c]));
    const storage = by.storage;
    fill(list,
      h("h2", {}, "Storage"),
      h("p", { class: "hint" }, "Where datasets, logs and adapters are kept: one per organization."),
      h("div", { class: "cards" }, card({
        title: "Storage", provider: "storage", conn: storage,
        example: (meta.storage.local || Object.values(meta.storage)[0] || { value: { kind: "local" } }).value,
        save: (body) => api("PUT", "/api/connections/storage", { json: body }), refresh,
      })),
      h("h2", {}, "Compute"),
      h("p", { class: "hint" }, "A cloud account (or this host's CPU: local) where runs get their GPU. Saving runs its checks and fills its catalog."),
      h("div", { class: "cards" }, meta.providers.map((p) => card({
        title: p, provider: p, conn: by[`compute:${p}`],
        example: p === "local" ? { price_per_hour: 0 } : (meta.examples[p] || { value: {} }).value,
        save: (body) => api("PUT", `/api/connections/compute/${p}`, { json: body }),
        check: () => post(`/api/connections/compute/${p}/check`), refresh,
      }))));
    // The page is drawn anew: the focus stays on the button that was pressed.
    const again = focused && document.getElementById(focused);
    if (again) again.focus();
    // While a check runs, its card is refreshed until it has a verdict.
    clearTimeout(timer);
    if (!stopped && items.some((c) => c.status === "checking")) timer = setTimeout(() => refresh().catch(() => {}), 1000);
  }

  try {
    await refresh();
  } catch (err) {
    fill(list, errorBox(err));
  }
  return {
    nodes: [h("h1", {}, "Connections"), list],
    cleanup: () => { stopped = true; clearTimeout(timer); },
  };
}
