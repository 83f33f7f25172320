// Webhooks: the organization's signed endpoints, the secret shown once, each endpoint's delivery log.
import { api, get, post } from "./api.js";
import { badge, busy, confirmAction, errorBox, field, fill, h, say, when } from "./ui.js";

const TYPES = ["run.queued", "run.training", "run.succeeded", "run.failed", "run.cancelled", "run.retained",
  "run.retention_warning", "run.pace_warning", "run.attempt_refused", "budget.threshold", "connection.check_failed"];

function secretBox(w) {
  return h("div", { class: "notice", role: "status", id: "webhook-secret" },
    h("p", {}, h("strong", {}, "Signing secret, shown once: "), "store it with your receiver now; it is never shown again."),
    h("code", { class: "secret" }, w.secret),
    w.previous_secret_valid_until ? h("p", { class: "hint" },
      `The previous secret also signs until ${when(w.previous_secret_valid_until)}.`) : null);
}

async function deliveries(id, where) {
  const d = await get(`/api/org/webhooks/${encodeURIComponent(id)}/deliveries`);
  fill(where, d.items.length ? h("table", { class: "deliveries" },
    h("caption", { class: "hint" }, "Last 100 delivery attempts, newest first"),
    h("thead", {}, h("tr", {}, ["When", "Event id", "Type", "Try", "Outcome", "Status", "ms"].map((c) => h("th", { scope: "col" }, c)))),
    h("tbody", {}, d.items.map((a) => h("tr", {}, h("td", {}, when(a.at)), h("td", {}, h("code", {}, a.webhook_id)),
      h("td", {}, a.type), h("td", {}, a.attempt), h("td", {}, badge(a.outcome)),
      h("td", {}, a.status_code ?? a.error), h("td", {}, a.duration_ms)))))
    : h("p", { class: "muted" }, "No delivery attempts yet."));
}

export async function webhooksPage() {
  const list = h("div", { "aria-live": "polite" });
  const shown = h("div");
  const url = h("input", { type: "url", required: true, placeholder: "https://hooks.example.com/tensorant", maxlength: 2000 });
  const boxes = TYPES.map((t) => h("label", { class: "check" }, h("input", { type: "checkbox", value: t, checked: true }), ` ${t}`));
  const out = h("div");
  const add = h("button", { type: "submit", class: "primary" }, "Add webhook");

  async function load() {
    const data = await get("/api/org/webhooks");
    fill(list, data.items.length ? data.items.map((w) => {
      const log = h("div");
      const act = (label, fn) => { const b = h("button", { type: "button" }, label); b.addEventListener("click", () => busy(b, fn, out)); return b; };
      return h("section", { class: "card webhook", "aria-label": `Webhook ${w.id}` },
        h("h2", {}, w.url), h("p", {}, badge(w.enabled ? "enabled" : "disabled"), ` ${w.id} · ${w.types.join(", ")}`),
        w.notice ? h("p", { class: "error", role: "alert" }, w.notice) : null,
        w.failing_since ? h("p", { class: "hint" }, `Failing since ${when(w.failing_since)}.`) : null,
        h("div", { class: "buttons" },
          act("Send test event", async () => { await post(`/api/org/webhooks/${w.id}/test`); say("webhook.test queued"); }),
          act("Delivery log", () => deliveries(w.id, log)),
          act(w.enabled ? "Disable" : "Enable", async () => {
            await api("PATCH", `/api/org/webhooks/${w.id}`, { json: { enabled: !w.enabled } });
            await load();
          }),
          act("Rotate secret", async () => {
            if (!await confirmAction({ title: "Rotate the signing secret?", confirm: "Rotate",
              consequence: "A new secret signs from now on; the old one keeps signing for 24 hours." })) return;
            fill(shown, secretBox(await post(`/api/org/webhooks/${w.id}/rotate`)));
            await load();
          }),
          act("Delete", async () => {
            if (!await confirmAction({ title: "Delete this webhook?", confirm: "Delete", danger: true,
              consequence: "Nothing more is sent to it; its delivery log goes with it." })) return;
            await api("DELETE", `/api/org/webhooks/${w.id}`);
            await load();
          })),
        log);
    }) : h("p", {}, `No webhooks yet (at most ${data.limit}).`));
  }

  const form = h("form", { "aria-label": "Add a webhook" }, field("URL", url, "https:// on a public address; "
    + "each request is signed by the Standard Webhooks specification (webhook-id, webhook-timestamp, webhook-signature)."),
  h("fieldset", {}, h("legend", {}, "Events"), boxes), h("div", { class: "buttons" }, add), out);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    busy(add, async () => {
      const types = boxes.map((b) => b.querySelector("input")).filter((i) => i.checked).map((i) => i.value);
      fill(shown, secretBox(await post("/api/org/webhooks", { url: url.value.trim(), types })));
      url.value = "";
      await load();
    }, out);
  });
  await load().catch((e) => fill(list, errorBox(e)));
  return { nodes: [h("h1", {}, "Webhooks"), shown, list, h("h2", {}, "Add a webhook"), form] };
}
