// Forms built from the API's own document (GET /api/openapi.json): a field per property of a request
// body's schema, its type, bounds, enum and pattern as the input's, its description as the help.
// Secrets (format "password") are password fields that show "saved" and are kept when left empty.
import { h } from "./ui.js";

let documentPromise = null;

// The API document, fetched once per page load (it changes only with a deployment).
export function apiDocument() {
  documentPromise = documentPromise || fetch("/api/openapi.json", { cache: "no-store" }).then((r) => {
    if (!r.ok) throw new Error(`the API document could not be read (${r.status})`);
    return r.json();
  }).catch((err) => { documentPromise = null; throw err; });
  return documentPromise;
}

export function resolve(doc, schema) {
  if (schema && schema.$ref) return doc.components.schemas[schema.$ref.split("/").pop()];
  return schema;
}

// The saved value of a secret, as the API shows it; sending it back keeps the secret (the API's rule).
export const KEEP_SECRET = { set: true };
const ACRONYMS = { id: "ID", ids: "IDs", gb: "GB", arn: "ARN", ami: "AMI", api: "API", ssh: "SSH", s3: "S3", hf: "HF", url: "URL", s: "(seconds)" };

export function labelOf(name) {
  const words = name.split("_").map((w) => ACRONYMS[w] || w);
  const first = words[0];
  words[0] = first === first.toLowerCase() ? first[0].toUpperCase() + first.slice(1) : first;
  return words.join(" ");
}

// The property's own schema, an optional one ({anyOf: [X, null]}) unwrapped.
function plain(prop) {
  if (prop.anyOf) {
    const inner = prop.anyOf.find((s) => s.type !== "null");
    return { ...prop, ...inner, anyOf: undefined, nullable: true };
  }
  return prop;
}

function isSecret(p) {
  return p.format === "password" || p.writeOnly === true;
}

// A schema pattern as an input's pattern (anchored, read with the "v" flag): left out where the
// browser would not accept it; the API checks the value anyway.
function htmlPattern(pattern) {
  if (!pattern) return undefined;
  const inner = pattern.replace(/^\^/, "").replace(/\$$/, "");
  try {
    new RegExp(`^(?:${inner})$`, "v"); // eslint-disable-line no-new
    return inner;
  } catch {
    return undefined;
  }
}

function shown(value) {
  if (value === null || value === undefined) return "";
  return String(value);
}

// One input for one property: its value read back by `read()` (undefined: leave it out of the body).
function input(idBase, name, prop, saved, required) {
  const p = plain(prop);
  const id = `${idBase}-${name}`;
  const attrs = { id, name };
  if (required) { attrs.required = true; attrs["aria-required"] = "true"; }
  let el;
  let read;
  const savedSecret = isSecret(p) && saved && typeof saved === "object" && saved.set;
  if (p.enum) {
    el = h("select", attrs, p.nullable || !required ? h("option", { value: "" }, "(default)") : null,
      p.enum.map((v) => h("option", { value: v }, v)));
    el.value = shown(saved ?? p.default ?? (required ? p.enum[0] : ""));
    read = () => (el.value === "" ? undefined : el.value);
  } else if (p.type === "boolean") {
    el = h("input", { ...attrs, type: "checkbox" });
    el.checked = Boolean(saved ?? p.default);
    read = () => el.checked;
  } else if (p.type === "integer" || p.type === "number") {
    el = h("input", { ...attrs, type: "number", inputmode: p.type === "integer" ? "numeric" : "decimal",
      step: p.type === "integer" ? "1" : "any", min: p.minimum ?? p.exclusiveMinimum, max: p.maximum ?? p.exclusiveMaximum,
      placeholder: p.default !== undefined ? String(p.default) : undefined });
    el.value = shown(saved ?? p.default);
    read = () => (el.value.trim() === "" ? undefined : Number(el.value));
  } else if (p.type === "array") {
    // A list of plain values, comma-separated (budget thresholds: "50, 80, 100").
    const numeric = p.items && (p.items.type === "integer" || p.items.type === "number");
    el = h("input", { ...attrs, type: "text", spellcheck: "false", autocomplete: "off",
      placeholder: "comma-separated, e.g. " + (numeric ? "50, 80, 100" : "a, b") });
    el.value = Array.isArray(saved ?? p.default) ? (saved ?? p.default).join(", ") : "";
    read = () => {
      const items = el.value.split(",").map((v) => v.trim()).filter(Boolean);
      if (!items.length) return undefined;
      return numeric ? items.map(Number) : items;
    };
  } else if (p.type === "object") {
    // A map of names to values, as "name=value" pairs (per-project budgets: "proj-a=100, proj-b=50").
    const numeric = p.additionalProperties && (p.additionalProperties.type === "integer" || p.additionalProperties.type === "number");
    const current = saved && typeof saved === "object" ? saved : {};
    el = h("input", { ...attrs, type: "text", spellcheck: "false", autocomplete: "off", placeholder: "name=value, name=value" });
    el.value = Object.entries(current).map(([k, v]) => `${k}=${v}`).join(", ");
    read = () => {
      const pairs = el.value.split(",").map((v) => v.trim()).filter(Boolean).map((kv) => {
        const at = kv.indexOf("=");
        const k = (at < 0 ? kv : kv.slice(0, at)).trim();
        const v = at < 0 ? "" : kv.slice(at + 1).trim();
        return [k, numeric ? Number(v) : v];
      });
      if (!pairs.length) return Object.keys(current).length ? {} : undefined;
      return Object.fromEntries(pairs);
    };
  } else if (isSecret(p)) {
    el = h("input", { ...attrs, type: "password", autocomplete: "new-password", spellcheck: "false",
      placeholder: savedSecret ? "saved (type a new value to replace it)" : "" });
    if (savedSecret) el.required = false; // empty keeps the saved one
    read = () => {
      if (el.value !== "") return el.value;
      return savedSecret ? KEEP_SECRET : undefined;
    };
  } else {
    el = h("input", { ...attrs, type: "text", spellcheck: "false", autocomplete: "off",
      pattern: htmlPattern(p.pattern),
      minlength: p.minLength, maxlength: p.maxLength,
      placeholder: p.format === "date-time" ? "2026-12-31T23:59:00Z" : undefined });
    el.value = shown(saved ?? p.default);
    read = () => (el.value.trim() === "" ? (required ? "" : undefined) : el.value.trim());
  }
  return { el, read, secret: isSecret(p), savedSecret };
}

// A form's fields for an object schema. `saved`: the config the API shows (secrets as {"set": true}).
// `examples`: placeholders only (never values: an example key saved by mistake reads as real).
// Returns { nodes, body(), fields }.
export function schemaFields(doc, schemaRef, { idBase, saved = null, examples = {}, skip = [] } = {}) {
  const schema = resolve(doc, schemaRef);
  const required = new Set(schema.required || []);
  const fields = {};
  const main = [];
  const optional = [];
  for (const [name, raw] of Object.entries(schema.properties || {})) {
    if (skip.includes(name)) continue;
    const prop = resolve(doc, raw);
    if (prop.const !== undefined) continue; // a discriminator (kind): set by the form itself
    const f = input(idBase, name, prop, saved ? saved[name] : undefined, required.has(name));
    if (!f.el.placeholder && examples[name] !== undefined && examples[name] !== "" && !f.secret && typeof examples[name] !== "object") {
      f.el.placeholder = `e.g. ${examples[name]}`;
    }
    fields[name] = f;
    const hintId = `${f.el.id}-hint`;
    const help = [prop.description || plain(prop).description || "", f.savedSecret ? "Saved: leave empty to keep it." : ""]
      .filter(Boolean).join(" ");
    if (help) f.el.setAttribute("aria-describedby", hintId);
    const label = h("label", { for: f.el.id }, labelOf(name), required.has(name) ? "" : h("span", { class: "muted" }, " (optional)"),
      f.savedSecret ? h("span", { class: "badge ok saved", "data-saved": name }, "saved") : null);
    const row = h("div", { class: f.el.type === "checkbox" ? "field check" : "field" },
      f.el.type === "checkbox" ? [f.el, label] : [label, f.el], help ? h("p", { class: "hint", id: hintId }, help) : null);
    (required.has(name) ? main : optional).push(row);
  }
  // Optional fields fold away under the required ones; a form of optional fields only shows them all.
  const nodes = main.length ? [main, optional.length ? h("details", { class: "more" },
    h("summary", {}, `Optional settings (${optional.length})`), optional) : null] : optional;
  function body(extra = {}) {
    const out = { ...extra };
    for (const [name, f] of Object.entries(fields)) {
      const v = f.read();
      if (v !== undefined) out[name] = v;
    }
    return out;
  }
  return { nodes, body, fields };
}

// The first invalid input's message (the browser's own constraint check), focused; else "".
export function invalidMessage(form) {
  for (const el of form.querySelectorAll("input, select, textarea")) {
    if (!el.checkValidity()) {
      const label = form.querySelector(`label[for="${el.id}"]`);
      el.focus();
      return `${label ? label.firstChild.textContent : el.name}: ${el.validationMessage}`;
    }
  }
  return "";
}
