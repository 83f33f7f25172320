// Configure a run: project and dataset, base model, provider and an eligible GPU offer, trial or full,
// price and runtime limits; "Save draft" shows the forecast, and the launch asks to confirm the price.
import { api, get } from "./api.js";
import { busy, confirmAction, consoleWords, duration, errorBox, field, h, money, fill } from "./ui.js";

const FORMAT_HELP = "One JSON object a line (.jsonl), each one of: "
  + '{"messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}]}, '
  + '{"prompt": "...", "completion": "..."}, or {"text": "..."}. Only the assistant turns (the completion) are trained on. '
  + 'For preference training (DPO), pairs: {"prompt": "...", "chosen": "...", "rejected": "..."}.';

function option(value, label, selected) {
  const o = h("option", { value }, label);
  o.selected = Boolean(selected);
  return o;
}

function params(model) {
  const n = Number(model.params || model.parameters || 0);
  if (!n) return "parameters unknown";
  return n >= 1e9 ? `${(n / 1e9).toFixed(1)} B parameters` : `${Math.round(n / 1e6)} M parameters`;
}

function forecastText(run) {
  const f = run.forecast;
  if (!f) return "no forecast";
  return `~${duration(f.training_s)} training + ${duration(f.startup_s)} start, ~${money(f.cost, run.offer.currency)}`;
}

export async function configurePage() {
  const [projects, models, conns] = await Promise.all([
    get("/api/projects?limit=200"), get("/api/base-models"), get("/api/connections")]);
  const connected = conns.items.filter((c) => c.slot.startsWith("compute:"));
  const out = h("div");

  // Project
  const projectSelect = h("select", {}, option("", "Choose a project"),
    projects.items.map((p) => option(p.id, `${p.name} (${p.id})`)));
  const newProject = h("input", { type: "text", placeholder: "demo" });
  const createProject = h("button", { type: "button" }, "Create project");
  createProject.addEventListener("click", () => busy(createProject, async () => {
    const p = await api("POST", "/api/projects", { json: { name: newProject.value.trim() } });
    projectSelect.append(option(p.id, `${p.name} (${p.id})`, true));
    newProject.value = "";
    await loadDatasets();
    projectSelect.focus();
  }, out));

  // Dataset
  const datasetSelect = h("select", {}, option("", "Choose a project first"));
  const formats = new Map(); // dataset version -> "examples" | "pairs"
  // The method follows the chosen version's format: pairs train with DPO, examples with SFT (the API
  // refuses the other way round).
  const method = h("select", {}, option("sft", "Supervised fine-tuning (examples)"),
    option("dpo", "Preference training, DPO (pairs)"));
  function followFormat() {
    const f = formats.get(datasetSelect.value);
    if (f) method.value = f === "pairs" ? "dpo" : "sft";
  }
  datasetSelect.addEventListener("change", followFormat);
  const file = h("input", { type: "file", accept: ".jsonl,.json,application/x-ndjson" });
  const upload = h("button", { type: "button" }, "Upload dataset");
  async function loadDatasets(select) {
    fill(datasetSelect, option("", projectSelect.value ? "Choose a dataset version" : "Choose a project first"));
    if (!projectSelect.value) return;
    const { items } = await get(`/api/projects/${encodeURIComponent(projectSelect.value)}/datasets?limit=200`);
    for (const d of items) {
      formats.set(d.id, d.format);
      datasetSelect.append(option(d.id, `${d.id}: ${d.rows} rows${d.format === "pairs" ? " (pairs)" : ""}, ${d.size_bytes} bytes`, d.id === select));
    }
    followFormat();
    estimateSoon(); // a dataset chosen here (an upload) fires no change event
  }
  projectSelect.addEventListener("change", () => loadDatasets().catch((e) => fill(out, errorBox(e))));
  upload.addEventListener("click", () => busy(upload, async () => {
    if (!projectSelect.value) throw new Error("Choose or create a project first (the dataset belongs to it).");
    if (!file.files.length) throw new Error("Choose a .jsonl file to upload.");
    const ds = await api("POST", `/api/projects/${encodeURIComponent(projectSelect.value)}/datasets`,
      { body: await file.files[0].arrayBuffer(), type: "application/x-ndjson" });
    await loadDatasets(ds.id);
    datasetSelect.focus();
  }, out));

  // Base model and provider, then the offers that fit them
  // The default is a real model (a test model, tensorant/*, is listed only where the operator allows
  // them, and a run of one "succeeds" with a random model's empty answers).
  const real = models.items.filter((m) => !m.id.startsWith("tensorant/"));
  const preferred = (real.find((m) => m.local_cpu) || real[0] || models.items[0] || {}).id;
  const modelSelect = h("select", {}, models.items.map((m) =>
    option(m.id, `${m.id} (${params(m)}${m.local_cpu ? ", trainable on the local CPU" : ", too large for the local CPU"})`, m.id === preferred)));
  const providerSelect = h("select", {}, connected.length
    ? connected.map((c) => option(c.provider, `${c.provider} (${c.status})`, c === (connected.find((x) => x.status === "connected") || connected[0])))
    : option("", "No compute connection: add one under Connections"));
  const offers = h("div", { role: "radiogroup", "aria-labelledby": "offers-legend" });
  const offersNote = h("p", { class: "hint" });
  // Also acceptable: further offers tried in order when the chosen one has no capacity (the run's candidates).
  const alsoBox = h("div", { id: "also-acceptable" });
  const fitting = h("input", { type: "checkbox", id: "fallback-fitting" });
  let loadingOffers = 0; // only the latest load may fill the list (a quick change of model starts another)
  let shownOffers = [];
  async function loadOffers() {
    const mine = ++loadingOffers;
    if (!providerSelect.value) { offers.replaceChildren(); alsoBox.replaceChildren(); return; }
    const q = new URLSearchParams({ provider: providerSelect.value, base_model: modelSelect.value });
    const cat = await get(`/api/catalog/gpus?${q}`);
    if (mine !== loadingOffers) return; // a newer load is under way: its answer is the one shown
    offers.replaceChildren();
    offersNote.textContent = cat.note || "";
    if (!cat.items.length) {
      const c = cat.catalogs.find((x) => x.provider === providerSelect.value);
      offers.append(h("p", {}, c && c.refreshing ? "The catalog is being fetched; refresh the offers in a moment."
        : `No offers${c && c.last_error ? `: ${c.last_error}` : ""}.`));
    }
    shownOffers = cat.items;
    let first = true;
    for (const o of cat.items) {
      const eligible = o.fits !== false;
      const radio = h("input", { type: "radio", name: "offer", value: o.offer_id, disabled: !eligible,
        "data-price": o.total_per_hour, "data-currency": o.currency || "USD" });
      if (eligible && first) { radio.checked = true; first = false; }
      radio.addEventListener("change", () => { drawAlso(); estimateSoon(); });
      offers.append(h("label", { class: "offer" }, radio, h("span", {},
        `${o.gpu} (${o.gpu_memory_gb ? `${o.gpu_memory_gb} GB GPU memory` : "no GPU: the host's CPU"}; ${o.offer_id}, ${o.region}): ${money(o.total_per_hour, o.currency)}/h`,
        h("span", { class: "hint" }, ` = compute ${money(o.compute_per_hour, o.currency)} + disk ${money(o.disk_per_hour, o.currency)}`),
        o.memory_needed_gb ? h("span", { class: "hint" }, `; the model needs about ${o.memory_needed_gb} GB`) : "",
        eligible ? "" : h("span", { class: "muted" }, ` — not eligible: ${o.fit_note || "the model does not fit"}`))));
    }
    drawAlso();
  }
  function drawAlso() {
    const chosen = offers.querySelector("input[name=offer]:checked");
    const others = shownOffers.filter((o) => o.fits !== false && (!chosen || o.offer_id !== chosen.value));
    const before = new Set([...alsoBox.querySelectorAll("input:checked")].map((c) => c.value));
    fill(alsoBox, others.length ? others.slice(0, 7).map((o) => {
      const box = h("input", { type: "checkbox", name: "also", value: o.offer_id, checked: before.has(o.offer_id) });
      box.addEventListener("change", estimateSoon);
      return h("label", { class: "offer" }, box,
        `${o.gpu} (${o.gpu_memory_gb} GB; ${o.offer_id}): ${money(o.total_per_hour, o.currency)}/h`);
    }) : h("p", { class: "hint" }, "No other offer of this provider fits."));
  }
  const reloadOffers = () => loadOffers().then(estimateSoon).catch((e) => fill(out, errorBox(e)));
  modelSelect.addEventListener("change", reloadOffers);
  providerSelect.addEventListener("change", reloadOffers);
  fitting.addEventListener("change", () => estimateSoon());
  const refreshOffers = h("button", { type: "button" }, "Refresh offers");
  refreshOffers.addEventListener("click", () => busy(refreshOffers, async () => { await loadOffers(); estimateSoon(); }, out));

  // Kind, limits, settings
  const trial = h("input", { type: "radio", name: "kind", value: "trial", checked: true });
  const full = h("input", { type: "radio", name: "kind", value: "full" });
  const price = h("input", { type: "number", min: "0.01", step: "0.01", value: "1" });
  const runtime = h("input", { type: "number", min: "1", step: "1", placeholder: "default" });
  const lr = h("input", { type: "text", placeholder: "0.0002" });
  const steps = h("input", { type: "number", min: "1", step: "1", placeholder: "from epochs" });
  const seq = h("input", { type: "number", min: "16", step: "1", placeholder: "1024" });
  const more = h("textarea", { rows: 3, spellcheck: "false" });
  more.value = "{}";

  const save = h("button", { type: "button", class: "primary", id: "save-draft" }, "Save trial draft");
  for (const r of [trial, full]) r.addEventListener("change", () => { save.textContent = trial.checked ? "Save trial draft" : "Save draft"; });
  const result = h("div", { "aria-live": "polite" });

  function trainingBody() {
    let extra;
    try {
      extra = JSON.parse(more.value || "{}");
    } catch (err) {
      throw new Error(`More training settings: not valid JSON (${err.message})`);
    }
    const t = { method: method.value, ...extra };
    if (lr.value.trim()) t.learning_rate = Number(lr.value);
    if (steps.value) t.max_steps = Number(steps.value);
    if (seq.value) t.max_seq_len = Number(seq.value);
    return t;
  }

  function requestBody() {
    const chosen = offers.querySelector("input[name=offer]:checked");
    const body = {
      project_id: projectSelect.value, dataset_version_id: datasetSelect.value, base_model: modelSelect.value,
      provider: providerSelect.value, offer_id: chosen ? chosen.value : "", kind: trial.checked ? "trial" : "full",
      price_limit_per_hour: Number(price.value), training: trainingBody(),
    };
    if (runtime.value) body.runtime_limit_s = Math.round(Number(runtime.value) * 60);
    // Candidates only when more than the chosen offer is acceptable (the API's default is that one alone).
    const also = [...alsoBox.querySelectorAll("input:checked")].map((c) => c.value);
    if (chosen && also.length) {
      body.candidates = [chosen.value, ...also].map((id) => ({ connection: providerSelect.value, offer_id: id }));
    }
    if (fitting.checked) body.fallback = "fitting";
    return body;
  }

  // The price and forecast as the form changes (POST /api/runs/forecast: checked as a create, not saved).
  const estimateBox = h("div", { class: "panel", id: "estimate", "aria-live": "polite" },
    h("p", { class: "hint" }, "Choose a project, a dataset and an offer: the price and forecast show here."));
  let estimating = 0;
  let estimateTimer = null;
  function estimateSoon() {
    clearTimeout(estimateTimer);
    estimateTimer = setTimeout(() => estimate().catch(() => {}), 350);
  }
  async function estimate() {
    const mine = ++estimating;
    let body;
    try {
      body = requestBody();
    } catch (err) {
      fill(estimateBox, errorBox(err));
      return;
    }
    if (!body.project_id || !body.dataset_version_id || !body.offer_id || !(body.price_limit_per_hour > 0)) return;
    let got;
    try {
      got = await api("POST", "/api/runs/forecast", { json: body });
    } catch (err) {
      if (mine === estimating) fill(estimateBox, errorBox(consoleWords(err.message)));
      return;
    }
    if (mine !== estimating) return; // an older answer after a newer question: dropped
    const cur = got.offer.currency;
    fill(estimateBox, h("dl", { class: "facts" },
      h("dt", {}, "Price"), h("dd", { id: "estimate-price" }, `${money(got.offer.total_per_hour, cur)}/h (compute ${money(got.offer.compute_per_hour, cur)} + disk ${money(got.offer.disk_per_hour, cur)})`),
      h("dt", {}, "Forecast"), h("dd", { id: "estimate-forecast" }, `~${duration(got.forecast.training_s)} training + ${duration(got.forecast.startup_s)} start, ~${money(got.forecast.cost, cur)}`),
      h("dt", {}, "Runtime limit"), h("dd", {}, `${duration(got.runtime_limit_s)}: at most ${money(got.max_cost, cur)}`)),
    got.limit_note ? h("p", { class: "hint" }, consoleWords(got.limit_note)) : null,
    got.warnings.map((w) => h("div", { class: "warning" }, consoleWords(w))));
  }
  for (const el of [projectSelect, datasetSelect, method, trial, full, price, runtime, lr, steps, seq, more]) {
    el.addEventListener("input", estimateSoon);
    el.addEventListener("change", estimateSoon);
  }

  save.addEventListener("click", () => busy(save, async () => {
    const run = await api("POST", "/api/runs", { json: requestBody() });
    fill(result, ...draftPanel(run));
    result.querySelector("button").focus();
  }, result));

  const nodes = [
    h("h1", {}, "Configure a run"),
    h("fieldset", {}, h("legend", {}, "Project and dataset"),
      field("Project", projectSelect),
      h("div", { class: "buttons" }, h("div", {}, field("New project name", newProject)), createProject),
      field("Dataset version", datasetSelect),
      field("Upload a dataset", file, FORMAT_HELP), h("div", { class: "buttons" }, upload)),
    h("fieldset", {}, h("legend", {}, "Model and GPU"),
      field("Base model", modelSelect, models.note),
      field("Provider", providerSelect, "Your connected compute accounts."),
      h("p", { id: "offers-legend" }, h("strong", {}, "GPU offer (eligible ones can be chosen)")), offers, offersNote,
      h("div", { class: "buttons" }, refreshOffers),
      h("fieldset", {}, h("legend", {}, "Also acceptable (tried in order when the chosen GPU has no capacity)"), alsoBox,
        h("div", { class: "field check" }, fitting, h("label", { for: "fallback-fitting" }, "Also any other fitting GPU of my connected accounts under the price limit")),
        h("p", { class: "hint" }, "The price limit, the forecast and the most a run can cost are those of the dearest one."))),
    h("fieldset", {}, h("legend", {}, "Training"),
      h("div", { role: "radiogroup", "aria-label": "Run kind" },
        h("label", { class: "offer" }, trial, "Training trial: at most 64 examples and 30 steps, a 20-minute default runtime limit"),
        h("label", { class: "offer" }, full, "Full run: the whole dataset")),
      field("Price limit (per hour)", price, "Launch is refused when the offer costs more per hour."),
      field("Runtime limit (minutes)", runtime, "Empty: the default (a trial: 20 minutes); the run is retained when it passes."),
      field("Method", method, "Follows the dataset version's format; DPO's settings (dpo_beta, dpo_loss) go in More training settings."),
      field("Learning rate", lr), field("Max steps", steps), field("Max sequence length (tokens)", seq),
      field("More training settings (JSON)", more, "Any training setting, e.g. {\"lora_r\": 8, \"epochs\": 2}; the API names a key it does not know.")),
    h("h2", {}, "Price and forecast"), estimateBox,
    h("div", { class: "buttons" }, save), out, result,
  ];
  await loadOffers().catch((e) => fill(out, errorBox(e)));
  estimateSoon();
  return { nodes };
}

// The dearest candidate's price: what the price limit, the forecast and the most a run can cost use.
export function dearest(run) {
  const prices = (run.candidates || []).map((c) => c.total_per_hour).filter((p) => typeof p === "number");
  return prices.length ? Math.max(run.offer.total_per_hour, ...prices) : run.offer.total_per_hour;
}

export function candidatesList(run) {
  if (!run.candidates || run.candidates.length < 2) return null;
  return h("ol", { class: "candidates", id: "candidates" }, run.candidates.map((c) =>
    h("li", {}, `${c.gpu || c.offer_id} (${c.offer_id}) on ${c.connection || c.provider}: ${money(c.total_per_hour, run.offer.currency)}/h`)));
}

// The saved draft: its forecast and warnings, then the price confirmation before launch.
function draftPanel(run) {
  const cur = run.offer.currency;
  const limit = run.runtime_limit_s;
  const price = dearest(run);
  const atMost = (price * limit) / 3600;
  const several = run.candidates && run.candidates.length > 1;
  const out = h("div");
  const launch = h("button", { type: "button", class: "primary", id: "launch" }, "Launch…");
  const consequence = [
    several
      ? `This starts the first of ${run.candidates.length} acceptable GPUs that has capacity, at most ${money(price, cur)} per hour (the dearest).`
      : `This starts ${run.offer.gpu} (${run.offer.offer_id}) on ${run.provider} at ${money(price, cur)} per hour.`,
    `Forecast: ${forecastText(run)}.`,
    `The run is stopped at its runtime limit of ${duration(limit)}: at most ${money(atMost, cur)} of GPU time.`,
  ];
  launch.addEventListener("click", async () => {
    if (!await confirmAction({ title: "Launch this run?", consequence, confirm: `Launch at ${money(price, cur)}/h` })) return;
    await busy(launch, async () => {
      await api("POST", `/api/runs/${encodeURIComponent(run.id)}/launch`, { json: { confirm: true } });
      location.hash = `#/runs/${encodeURIComponent(run.id)}`;
    }, out);
  });
  return [
    h("h2", {}, `Draft ${run.id} saved`),
    h("div", { class: "panel", id: "price-confirmation" },
      h("dl", { class: "facts" },
        h("dt", {}, "Offer"), h("dd", {}, `${run.offer.gpu} (${run.offer.offer_id}), ${run.provider}`),
        h("dt", {}, "Price"), h("dd", {}, `${money(price, cur)}/h${several ? " (the dearest acceptable GPU)" : ""} (your limit ${money(run.price_limit_per_hour, cur)}/h)`),
        h("dt", {}, "Forecast"), h("dd", { id: "forecast" }, forecastText(run)),
        h("dt", {}, "Runtime limit"), h("dd", {}, `${duration(limit)} (at most ${money(atMost, cur)})`),
        run.forecast ? [h("dt", {}, "Basis"), h("dd", { class: "hint" }, consoleWords(run.forecast.basis))] : null),
      candidatesList(run),
      run.warnings.map((w) => h("div", { class: "warning" }, consoleWords(w)))),
    h("div", { class: "buttons" }, launch,
      h("a", { href: `#/runs/${encodeURIComponent(run.id)}` }, "Open the draft")),
    out,
  ];
}
