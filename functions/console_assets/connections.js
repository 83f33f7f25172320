// Settings -> Connections: the storage picker and its form, a form per compute provider, each check's
// result per item, and the organization's Hugging Face token and limits. Every form is built from the
// API document's schema for its body (forms.js): fields, bounds, help and secrets are the API's to say.
import { api, get, post } from "./api.js";
import { apiDocument, invalidMessage, resolve, schemaFields } from "./forms.js";
import { badge, busy, confirmAction, errorBox, h, say, when, fill } from "./ui.js";

const LABEL = { connected: "Connected", checking: "Checking…", failed: "Check failed" };
const PROVIDER_TITLE = { aws: "AWS", azure: "Azure", runpod: "RunPod", local: "Local (this host's CPU)" };
const STORAGE_CHOICE = {
  s3: ["Connect S3 storage", "An S3 bucket (AWS, or any S3-compatible endpoint over https)."],
  runpod_volume: ["Use RunPod volume", "A RunPod network volume, through RunPod's S3 API: pods run in its datacenter."],
  local: ["Use local storage", "A directory on the control plane's own host (development only)."],
};

// What the API document says about the connection bodies.
async function meta() {
  const doc = await apiDocument();
  const put = doc.paths["/api/connections/compute/{provider}"].put;
  const body = put.requestBody.content["application/json"];
  const param = put.parameters.find((p) => p.name === "provider");
  const storage = doc.paths["/api/connections/storage"].put.requestBody.content["application/json"];
  const bySchema = body.schema["x-provider-schemas"] || {};
  const examples = Object.fromEntries(Object.entries(body.examples || {}).map(([k, v]) => [k, v.value]));
  const storageExamples = Object.fromEntries(Object.values(storage.examples || {}).map((e) => [e.value.kind, e.value]));
  const limits = doc.paths["/api/org/limits"] && doc.paths["/api/org/limits"].put;
  const hf = doc.paths["/api/org/secrets/huggingface-token"] && doc.paths["/api/org/secrets/huggingface-token"].put;
  return {
    doc, providers: param.schema.enum, bySchema, examples,
    storageKinds: storage.schema.discriminator.mapping, storageExamples,
    limitsSchema: limits ? limits.requestBody.content["application/json"].schema : null,
    hfSchema: hf ? hf.requestBody.content["application/json"].schema : null,
  };
}

function checksList(conn) {
  if (!conn || !conn.checks.length) return null;
  return h("ul", { class: "checks" }, conn.checks.map((c) =>
    h("li", {}, badge(c.status), " ", h("strong", {}, c.name), ": ", c.message)));
}

// The status part of a card, redrawn on each refresh (the form itself is not, so typing is never lost).
function statusNodes(conn) {
  return [
    conn ? h("p", { class: "hint" }, `saved ${when(conn.saved_at)}`, conn.checked_at ? `, checked ${when(conn.checked_at)}` : "") : null,
    checksList(conn),
    conn ? conn.warnings.map((w) => h("div", { class: "warning" }, w)) : null,
  ];
}

function statusBadge(key, conn) {
  return h("span", { class: `badge ${conn ? conn.status : ""}`, "data-status": conn ? conn.status : "none", id: `status-${key}` },
    conn ? LABEL[conn.status] || conn.status : "Not connected");
}

// One form: fields from the schema, a save button, and what the API answered.
function formFor({ key, title, doc, schema, saved, examples, extra = {}, save, submitLabel, skip }) {
  const out = h("div");
  const built = schemaFields(doc, schema, { idBase: key, saved, examples, skip });
  const submit = h("button", { type: "submit", class: "primary", id: `save-${key}` }, submitLabel);
  const form = h("form", { novalidate: true, "aria-label": `${title} settings` }, built.nodes,
    h("div", { class: "buttons" }, submit), out);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    busy(submit, async () => {
      const bad = invalidMessage(form);
      if (bad) throw new Error(bad);
      await save(built.body(extra));
    }, out);
  });
  return { form, out, built };
}

export async function connectionsPage() {
  const m = await meta();
  let timer = null;
  let stopped = false;
  const cards = {}; // key -> { statusBox, badgeBox, draw(conn) }
  let by = {};

  async function load() {
    const { items } = await get("/api/connections");
    by = Object.fromEntries(items.map((c) => [c.slot, c]));
    return items;
  }

  // ---- compute: a card per provider
  function computeCard(provider) {
    const key = provider;
    const title = PROVIDER_TITLE[provider] || provider;
    const card = h("section", { class: "card", id: `card-${key}`, "aria-labelledby": `title-${key}` });
    const badgeBox = h("span");
    const statusBox = h("div");
    const body = h("div");
    function draw() {
      const conn = by[`compute:${provider}`];
      fill(badgeBox, statusBadge(key, conn));
      fill(statusBox, statusNodes(conn));
    }
    function drawForm() {
      const conn = by[`compute:${provider}`];
      const { form, out } = formFor({
        key, title, doc: m.doc, schema: m.bySchema[provider], saved: conn ? conn.config : null,
        examples: m.examples[provider] || {}, submitLabel: conn ? "Save and check again" : "Connect",
        save: async (b) => {
          await api("PUT", `/api/connections/compute/${encodeURIComponent(provider)}`, { json: b });
          say(`${title}: saved; checking`);
          await refresh(key);
        },
      });
      const buttons = h("div", { class: "buttons" });
      if (conn) {
        const again = h("button", { type: "button", id: `check-${key}` }, "Check again");
        again.addEventListener("click", () => busy(again, async () => {
          await post(`/api/connections/compute/${encodeURIComponent(provider)}/check`);
          await refresh();
        }, out));
        const drop = h("button", { type: "button", class: "danger", id: `disconnect-${key}` }, "Disconnect");
        drop.addEventListener("click", async () => {
          if (!await confirmAction({ title: `Disconnect ${title}?`, danger: true, confirm: "Disconnect",
            consequence: [`Deletes the saved ${title} connection and its secrets. Its offers are no longer shown and no run can start there.`,
              "It is refused while a run still holds a machine there: release or recover those runs first."] })) return;
          await busy(drop, async () => {
            await api("DELETE", `/api/connections/compute/${encodeURIComponent(provider)}`);
            say(`${title}: disconnected`);
            await refresh(key);
          }, out);
        });
        buttons.append(again, drop);
      }
      fill(body, form, conn ? buttons : null);
      card.dataset.drawn = String(Number(card.dataset.drawn || 0) + 1); // the form is drawn anew (tests wait on it)
    }
    fill(card, h("h3", { id: `title-${key}` }, title, " ", badgeBox), statusBox, body);
    cards[key] = { draw, drawForm };
    return card;
  }

  // ---- storage: a picker of the kind, then that kind's form
  function storageCard() {
    const key = "storage";
    const card = h("section", { class: "card wide", id: "card-storage", "aria-labelledby": "title-storage" });
    const badgeBox = h("span");
    const statusBox = h("div");
    const body = h("div");
    const order = Object.keys(STORAGE_CHOICE);
    const kinds = Object.keys(m.storageKinds).sort((a, b) => (order.indexOf(a) + 99) % 99 - (order.indexOf(b) + 99) % 99);
    const picker = h("div", { role: "radiogroup", "aria-label": "Storage kind", class: "picker" });
    let chosen = null;
    function choose(kind) {
      chosen = kind;
      for (const r of picker.querySelectorAll("input")) r.checked = r.value === kind;
      drawKind();
    }
    for (const kind of kinds) {
      const [label, hint] = STORAGE_CHOICE[kind] || [kind, ""];
      const radio = h("input", { type: "radio", name: "storage-kind", value: kind, id: `storage-kind-${kind}`,
        "aria-describedby": `storage-kind-${kind}-hint` });
      radio.addEventListener("change", () => choose(kind));
      picker.append(h("div", { class: "field check" }, radio, h("label", { for: radio.id }, label),
        h("span", { class: "hint", id: `storage-kind-${kind}-hint` }, hint)));
    }
    function drawKind() {
      const conn = by.storage;
      const saved = conn && conn.provider === chosen ? conn.config : null;
      const { form, out, built } = formFor({
        key: `storage-${chosen}`, title: (STORAGE_CHOICE[chosen] || [chosen])[0], doc: m.doc,
        schema: { $ref: m.storageKinds[chosen] }, saved, examples: m.storageExamples[chosen] || {},
        extra: { kind: chosen }, submitLabel: conn ? "Save storage" : "Connect storage",
        skip: chosen === "local" ? ["directory"] : [], // always empty: the operator's directory, per organization
        save: async (b) => {
          await api("PUT", "/api/connections/storage", { json: b });
          say("Storage: saved; checking");
          await refresh("storage");
        },
      });
      const parts = [form];
      if (chosen === "runpod_volume") parts.unshift(volumePicker(built, out));
      fill(body, parts);
      card.dataset.drawn = String(Number(card.dataset.drawn || 0) + 1);
    }
    function draw() {
      fill(badgeBox, statusBadge(key, by.storage));
      fill(statusBox, statusNodes(by.storage));
    }
    function drawForm() {
      choose(by.storage ? by.storage.provider : (kinds.includes("local") ? "local" : kinds[0]));
    }
    fill(card, h("h3", { id: "title-storage" }, "Storage ", badgeBox), statusBox,
      h("p", { class: "hint" }, "Where datasets, logs and adapters are kept: one per organization. Its location cannot change once the organization has projects."),
      picker, body);
    cards[key] = { draw, drawForm };
    return card;
  }

  // The RunPod network volumes of the RunPod compute connection: choosing one fills the volume's fields.
  function volumePicker(built, out) {
    const list = h("select", { id: "volume-list", disabled: true }, h("option", { value: "" }, "Find the volumes first"));
    const find = h("button", { type: "button", id: "find-volumes" }, "Find my network volumes");
    const note = h("p", { class: "hint", id: "volume-note" },
      "Lists the network volumes of the RunPod account connected under Compute; or type the volume's ID and datacenter below.");
    let volumes = [];
    find.addEventListener("click", () => busy(find, async () => {
      const got = await get("/api/connections/runpod/volumes");
      volumes = got.items;
      fill(list, h("option", { value: "" }, volumes.length ? "Choose a volume" : "No network volume in this account"),
        volumes.map((v) => h("option", { value: v.id }, `${v.name || v.id} (${v.id}, ${v.datacenter_id}, ${v.size_gb} GB)`)));
      list.disabled = !volumes.length;
      if (volumes.length) list.focus();
    }, out));
    list.addEventListener("change", () => {
      const v = volumes.find((x) => x.id === list.value);
      if (!v) return;
      if (built.fields.volume_id) built.fields.volume_id.el.value = v.id;
      if (built.fields.datacenter_id) built.fields.datacenter_id.el.value = v.datacenter_id;
    });
    return h("div", { class: "panel" }, h("label", { for: "volume-list" }, "Network volume"),
      h("div", { class: "buttons inline" }, list, find), note);
  }

  // ---- the organization: Hugging Face token and limits
  function hfCard() {
    const card = h("section", { class: "card", id: "card-hf", "aria-labelledby": "title-hf" });
    const body = h("div");
    async function drawForm() {
      let set = false;
      try {
        set = Boolean((await get("/api/org/secrets")).huggingface_token.set);
      } catch (err) {
        fill(body, errorBox(err));
        return;
      }
      const { form, out } = formFor({
        key: "hf", title: "Hugging Face token", doc: m.doc, schema: m.hfSchema,
        saved: { token: set ? { set: true } : undefined }, submitLabel: set ? "Replace token" : "Save token",
        save: async (b) => {
          if (!b.token || typeof b.token !== "string") throw new Error("Token: type the new token to replace the saved one.");
          await api("PUT", "/api/org/secrets/huggingface-token", { json: b });
          say("Hugging Face token: saved");
          await drawForm();
        },
      });
      const parts = [h("p", { class: "hint" }, "Needed for gated models (Llama); handed only to the trainer, never shown again."), form];
      if (set) {
        const remove = h("button", { type: "button", class: "danger", id: "remove-hf" }, "Remove token");
        remove.addEventListener("click", async () => {
          if (!await confirmAction({ title: "Remove the Hugging Face token?", danger: true, confirm: "Remove",
            consequence: "Runs launched from now on cannot load gated models." })) return;
          await busy(remove, async () => { await api("DELETE", "/api/org/secrets/huggingface-token"); await drawForm(); }, out);
        });
        parts.push(h("div", { class: "buttons" }, remove));
      }
      fill(body, parts);
    }
    fill(card, h("h3", { id: "title-hf" }, "Hugging Face token"), body);
    cards.hf = { draw: () => {}, drawForm };
    return card;
  }

  function limitsCard() {
    const card = h("section", { class: "card", id: "card-limits", "aria-labelledby": "title-limits" });
    const body = h("div");
    async function drawForm() {
      let current;
      try {
        current = await get("/api/org/limits");
      } catch (err) {
        fill(body, errorBox(err));
        return;
      }
      const schema = resolve(m.doc, m.limitsSchema);
      const { form } = formFor({
        key: "limits", title: "Limits", doc: m.doc, schema, saved: current, submitLabel: "Save limits",
        save: async (b) => {
          // Only what the schema knows is sent (the view may say more than the body takes).
          const known = Object.fromEntries(Object.entries(b).filter(([k]) => k in (schema.properties || {})));
          await api("PUT", "/api/org/limits", { json: known });
          say("Limits: saved");
          await drawForm();
        },
      });
      fill(body, h("p", { class: "hint" }, "What any run of the organization may ask for (owners set them)."), form);
    }
    fill(card, h("h3", { id: "title-limits" }, "Limits"), body);
    cards.limits = { draw: () => {}, drawForm };
    return card;
  }

  // `redraw`: the card whose form is drawn anew too (after its save: the saved values and "saved" secrets
  // show); true: every connection card's (the first draw). The others keep what is typed in them.
  async function refresh(redraw = null) {
    const items = await load();
    const focused = document.activeElement && document.activeElement.id;
    for (const [key, c] of Object.entries(cards)) {
      c.draw();
      if ((redraw === true && key !== "hf" && key !== "limits") || redraw === key) c.drawForm();
    }
    const again = redraw && focused && document.getElementById(focused);
    if (again) again.focus();
    // While a check runs, the statuses are refreshed until it has a verdict (the forms are left alone).
    clearTimeout(timer);
    if (!stopped && items.some((c) => c.status === "checking")) timer = setTimeout(() => refresh().catch(() => {}), 1000);
  }

  const storage = storageCard();
  const compute = m.providers.map(computeCard);
  const org = [m.hfSchema ? hfCard() : null, m.limitsSchema ? limitsCard() : null];
  const nodes = [
    h("h1", {}, "Connections"),
    h("h2", {}, "Storage"),
    h("div", { class: "cards" }, storage),
    h("h2", {}, "Compute"),
    h("p", { class: "hint" }, "A cloud account (or this host's CPU: local) where runs get their GPU. Saving runs its checks and fills its catalog."),
    h("div", { class: "cards" }, compute),
    h("h2", {}, "Organization"),
    h("div", { class: "cards" }, org),
  ];
  try {
    await refresh(true);
    await Promise.all(["hf", "limits"].filter((k) => cards[k]).map((k) => cards[k].drawForm()));
  } catch (err) {
    nodes.splice(1, 0, errorBox(err));
  }
  return { nodes, cleanup: () => { stopped = true; clearTimeout(timer); } };
}
