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
  return h("div", { class: "error", role: "alert" }, err && err.message ? err.message : String(err));
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
