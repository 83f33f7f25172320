// DOM helpers: elements built with textContent only (never innerHTML), formatting, the confirm dialog.

export function h(tag, attrs = {}, ...children) {
  const svg = ["svg", "polyline", "line", "text", "g", "title", "circle"].includes(tag);
  const el = svg ? document.createElementNS("http://www.w3.org/2000/svg", tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.setAttribute("class", v);
    else if (k in el && !svg && typeof v !== "string") el[k] = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

export function duration(s) {
  if (s === null || s === undefined) return "-";
  s = Math.max(0, Math.round(s));
  const hours = Math.floor(s / 3600), min = Math.floor((s % 3600) / 60), sec = s % 60;
  if (hours) return `${hours} h ${String(min).padStart(2, "0")} min`;
  if (min) return `${min} min ${String(sec).padStart(2, "0")} s`;
  return `${sec} s`;
}

export function money(value, currency = "USD") {
  if (value === null || value === undefined) return "-";
  const digits = Math.abs(value) < 1 && value !== 0 ? 4 : 2;
  return `${Number(value).toFixed(digits)} ${currency}`;
}

export function when(iso) {
  if (!iso) return "-";
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : d.toLocaleString();
}

export function badge(text) {
  return h("span", { class: `badge ${text}` }, text);
}

export function errorBox(err) {
  return h("div", { class: "error", role: "alert" }, consoleWords(err && err.message ? err.message : String(err)));
}

export function say(text) {
  const el = document.getElementById("status");
  el.textContent = text;
  clearTimeout(say.timer);
  say.timer = setTimeout(() => { el.textContent = ""; }, 6000);
}

// Asks before an action: the consequence is said first, the focus goes back where it was.
export function confirmAction({ title, consequence, confirm, danger = false }) {
  const dialog = document.getElementById("confirm");
  const back = document.activeElement;
  document.getElementById("confirm-title").textContent = title;
  const body = document.getElementById("confirm-body");
  body.replaceChildren(...(Array.isArray(consequence) ? consequence : [consequence]).map((p) => h("p", {}, p)));
  const yes = document.getElementById("confirm-yes");
  const no = document.getElementById("confirm-no");
  yes.textContent = confirm;
  yes.className = danger ? "danger" : "primary";
  return new Promise((resolve) => {
    const done = (answer) => {
      yes.onclick = no.onclick = dialog.oncancel = null;
      dialog.close();
      if (back && back.focus) back.focus();
      resolve(answer);
    };
    yes.onclick = () => done(true);
    no.onclick = () => done(false);
    dialog.oncancel = (e) => { e.preventDefault(); done(false); };
    dialog.showModal();
    no.focus();
  });
}

// Runs `fn` with the button disabled; an error is shown in `where` (or said).
export async function busy(button, fn, where) {
  button.disabled = true;
  if (where) where.replaceChildren();
  try {
    return await fn();
  } catch (err) {
    if (where) where.replaceChildren(errorBox(err));
    else say(err.message);
    return undefined;
  } finally {
    button.disabled = false;
  }
}

export function field(label, input, hint) {
  const id = input.id || `f-${Math.random().toString(36).slice(2, 9)}`;
  input.id = id;
  const hintId = hint ? `${id}-hint` : undefined;
  if (hintId) input.setAttribute("aria-describedby", hintId);
  return h("div", {}, h("label", { for: id }, label), input, hint ? h("p", { class: "hint", id: hintId }, hint) : null);
}

export const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);

// replaceChildren with nested lists flattened and empty parts (null, false) left out.
export function fill(el, ...children) {
  el.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false)
    .map((c) => (c instanceof Node ? c : document.createTextNode(String(c)))));
  return el;
}

// The API's and the CLI's words in a message, as what to click or fill in the console (the API names
// its JSON fields, the CLI its flags: neither is on the page). Phrases first, then fields as whole words.
const CONSOLE_PHRASES = [
  ["raise price_limit_per_hour (PATCH the draft)", "raise the Price limit (edit the draft: configure it again)"],
  ["resume training from it (recover mode resume)", "resume training from it (the \"Resume training\" button)"],
  ["recover again with accept_checkpoint: true", "recover again with \"Accept the checkpoint as the run's adapter\" ticked"],
  ["Next time give it a longer limit (--runtime-limit) or fewer steps (--set-training max_steps=N)",
    "Next time give it a longer Runtime limit or fewer Max steps when you configure the run"],
  ["(--runtime-limit)", "(the Runtime limit when you configure a run)"],
  ["(--set-training max_steps=N)", "(Max steps)"],
  ["(training max_steps)", "(Max steps)"],
  ["send discard: true", "use \"Cancel and discard\""],
  ["accept_checkpoint", "\"Accept the checkpoint as the run's adapter\""],
  ["under /api/org/limits", "under Connections → Limits"],
];
const CONSOLE_FIELDS = {
  price_limit_per_hour: "the Price limit", runtime_limit_s: "the Runtime limit", max_steps: "Max steps",
  max_seq_len: "Max sequence length", offer_id: "the GPU offer", base_model: "the Base model",
  dataset_version_id: "the Dataset version", max_runtime_limit_s: "the organization's Max runtime limit (Connections → Limits)",
  max_price_limit_per_hour: "the organization's Max price limit per hour (Connections → Limits)",
  max_active_runs: "the organization's Max active runs (Connections → Limits)",
};
const CONSOLE_FIELD = new RegExp(`\\b(${Object.keys(CONSOLE_FIELDS).join("|")})\\b`, "g");

export function consoleWords(text) {
  let out = String(text ?? "");
  for (const [from, to] of CONSOLE_PHRASES) out = out.split(from).join(to);
  return out.replace(CONSOLE_FIELD, (m) => CONSOLE_FIELDS[m]);
}
