// A run: its state and timeline, live logs, the loss curve, time and cost, its resources and their
// release, and what can be done now (each action says its consequence before it is done).
import { api, get, token } from "./api.js";
import { TERMINAL, badge, busy, confirmAction, consoleWords, duration, errorBox, field, h, money, say, when, fill } from "./ui.js";

const POLL_MS = 1500;
const ACTIVE = new Set(["queued", "provisioning", "preparing", "training", "exporting", "verifying"]);
const EARLY = new Set(["queued", "provisioning", "preparing"]); // nothing trained yet: nothing to keep

// What a retained run means, and what each way out of it does.
const NEXT_FOR_RETAINED = "The machine is stopped and its disk kept (the disk bills until the run ends). Recover the adapter "
  + "below: \"Verify the saved adapter\" (the final adapter, else the last checkpoint's when \"Accept the checkpoint\" is ticked), "
  + "\"Upload and verify\" an adapter.zip you fetched, or \"Resume training\" from the last checkpoint; or \"Discard the run\" "
  + "to release everything.";

// The trainer logs, after training, the base model's and the adapter's answers to a few held-out prompts,
// each as a Python literal: `sample prompt: '...'`, `sample base model: ...`, `sample with adapter: ...`,
// `sample dataset answer: ...`. They are gathered here for their own panel.
const SAMPLE_LINE = /sample (prompt|base model|with adapter|dataset answer): (.*)$/;
const SAMPLE_KEY = { prompt: "prompt", "base model": "base", "with adapter": "adapter", "dataset answer": "expected" };

// A Python str literal ('...' or "...") as its text; anything else as it is.
export function pyString(literal) {
  const q = literal[0];
  if ((q !== "'" && q !== '"') || literal[literal.length - 1] !== q) return literal;
  const body = literal.slice(1, -1);
  const simple = { n: "\n", t: "\t", r: "\r", "\\": "\\", "'": "'", '"': '"', 0: "\0" };
  return body.replace(/\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|.)/g, (m, e) => {
    if (e[0] === "x" || e[0] === "u" || e[0] === "U") return String.fromCodePoint(parseInt(e.slice(1), 16));
    return e in simple ? simple[e] : m;
  });
}

export function samplesFrom(lines, into) {
  for (const line of lines) {
    const m = SAMPLE_LINE.exec(typeof line === "string" ? line : "");
    if (!m) continue;
    const key = SAMPLE_KEY[m[1]];
    if (key === "prompt" || !into.length) into.push({});
    into[into.length - 1][key] = pyString(m[2].trim());
  }
  return into;
}

function samplesPanel(samples) {
  if (!samples.length) return h("p", { class: "hint", id: "samples-empty" }, "The base model's and the adapter's answers show here after training (the trainer writes them to the log).");
  const row = (label, text, cls) => [h("dt", {}, label), h("dd", { class: cls }, text === undefined ? "-" : (text || "(empty answer)"))];
  return h("div", { id: "samples" }, samples.map((x, i) => h("div", { class: "sample" },
    h("h3", {}, `Prompt ${i + 1}`),
    h("dl", { class: "facts" }, row("Prompt", x.prompt, "said"), row("Base model", x.base, "said"),
      row("With the adapter", x.adapter, "said adapter"), row("Dataset answer", x.expected, "said")))));
}

// The charts' frame (viewBox units): the plot lies inside the margins L, R, T, B.
const W = 600, H = 220, L = 48, T = 12, B = 30;

// Where a value lies across [lo, hi] on an axis of length span (one value: the middle).
function place(v, lo, hi, span) {
  return hi === lo ? span / 2 : ((v - lo) / (hi - lo)) * span;
}

function chart(points) {
  const R = 12;
  if (!points.length) return h("p", { class: "hint", id: "loss-empty" }, "No loss reported yet.");
  const xs = points.map((p) => p.step), ys = points.map((p) => p.loss);
  const x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
  const sx = (x) => L + place(x, x0, x1, W - L - R);
  const sy = (y) => H - B - place(y, y0, y1, H - T - B);
  const first = points[0], last = points[points.length - 1];
  const label = `Training loss: ${first.loss.toFixed(4)} at step ${first.step}, ${last.loss.toFixed(4)} at step ${last.step} (${points.length} points)`;
  return h("svg", { class: "chart", id: "loss-chart", viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": label },
    h("title", {}, label),
    h("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }),
    h("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }),
    h("text", { x: L - 4, y: T + 10, "text-anchor": "end" }, y1.toFixed(3)),
    h("text", { x: L - 4, y: H - B, "text-anchor": "end" }, y0.toFixed(3)),
    h("text", { x: L, y: H - 10 }, `step ${x0}`),
    h("text", { x: W - R, y: H - 10, "text-anchor": "end" }, `step ${x1}`),
    h("polyline", { class: "line", points: points.map((p) => `${sx(p.step).toFixed(1)},${sy(p.loss).toFixed(1)}`).join(" ") }),
    points.length === 1 ? h("circle", { cx: sx(x0), cy: sy(y0), r: 3, fill: "currentColor" }) : null);
}

// A DPO run's evaluations: the held-out preference accuracy (left axis, 0 to 100 %) and the reward margin
// (right axis, from the lower of 0 and its least to the higher of 0 and its most, so its sign shows) per
// evaluated step. Steps run across as on the loss chart; a lone evaluation is drawn at mid-width.
export function preferenceChart(evals) {
  const dpo = evals.filter((p) => typeof p.preference_accuracy === "number" && typeof p.reward_margin === "number");
  if (!dpo.length) return null;
  const R = 56;
  const xs = dpo.map((p) => p.step), ms = dpo.map((p) => p.reward_margin);
  const x0 = Math.min(...xs), x1 = Math.max(...xs), m0 = Math.min(0, ...ms), m1 = Math.max(0, ...ms);
  const sx = (x) => L + place(x, x0, x1, W - L - R);
  const sa = (a) => H - B - a * (H - T - B);
  const sm = (m) => H - B - place(m, m0, m1, H - T - B);
  const line = (cls, y, key) => h("polyline", { class: `line ${cls}`, points: dpo.map((p) => `${sx(p.step).toFixed(1)},${y(p[key]).toFixed(1)}`).join(" ") });
  const dots = (cls, y, key) => dpo.length === 1 ? h("circle", { class: cls, cx: sx(x0), cy: y(dpo[0][key]), r: 3 }) : null;
  const first = dpo[0], last = dpo[dpo.length - 1];
  const pct = (a) => `${(100 * a).toFixed(0)} %`;
  const label = `Held-out preference accuracy: ${pct(first.preference_accuracy)} at step ${first.step}, `
    + `${pct(last.preference_accuracy)} at step ${last.step}; reward margin ${first.reward_margin.toFixed(4)} to `
    + `${last.reward_margin.toFixed(4)} (${dpo.length} evaluations)`;
  return h("svg", { class: "chart", id: "preference-chart", viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": label },
    h("title", {}, label),
    h("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }),
    h("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }),
    h("line", { class: "axis", x1: W - R, y1: T, x2: W - R, y2: H - B }),
    h("text", { x: L - 4, y: T + 10, "text-anchor": "end" }, "100 %"),
    h("text", { x: L - 4, y: H - B, "text-anchor": "end" }, "0 %"),
    h("text", { x: W - R + 4, y: T + 10 }, m1.toFixed(3)),
    h("text", { x: W - R + 4, y: H - B }, m0.toFixed(3)),
    h("text", { x: L, y: H - 10 }, `step ${x0}`),
    h("text", { x: W - R, y: H - 10, "text-anchor": "end" }, `step ${x1}`),
    // The key, between the step labels (inside the plot it would hide a curve at 100 %).
    h("text", { class: "key accuracy", x: W / 2 - 8, y: H - 10, "text-anchor": "end" }, "accuracy (left)"),
    h("text", { class: "key margin", x: W / 2 + 8, y: H - 10 }, "reward margin (right, dashed)"),
    line("accuracy", sa, "preference_accuracy"), line("margin", sm, "reward_margin"),
    dots("accuracy", sa, "preference_accuracy"), dots("margin", sm, "reward_margin"));
}

function candidateText(c, cur) {
  const price = c.total_per_hour ?? c.price_per_hour;
  return `${c.gpu || c.offer_id} (${c.offer_id}) on ${c.connection || c.provider}${price !== undefined && price !== null ? `, ${money(price, cur)}/h` : ""}`;
}

function facts(run) {
  const cur = run.offer.currency;
  const f = run.forecast, chk = run.forecast_check;
  return h("dl", { class: "facts" },
    h("dt", {}, "Provider · GPU"), h("dd", {}, `${run.provider} · ${run.offer.gpu} (${run.offer.offer_id}), ${money(run.estimate_per_hour, cur)}/h`),
    h("dt", {}, "Base model"), h("dd", {}, run.base_model),
    h("dt", {}, "Kind"), h("dd", {}, run.kind),
    h("dt", {}, "Elapsed"), h("dd", { id: "elapsed" }, duration(run.elapsed_s)),
    h("dt", {}, "Billed GPU time"), h("dd", { id: "billed" }, duration(run.billed_machine_s)
      + (run.billed_disk_only_s ? ` (+ ${duration(run.billed_disk_only_s)} disk only)` : "")),
    h("dt", {}, run.final_cost !== null && run.final_cost !== undefined ? "Final cost" : "Cost so far"),
    h("dd", { id: "cost" }, money(run.final_cost ?? run.cost_so_far, cur)),
    h("dt", {}, "Runtime limit"), h("dd", {}, duration(run.runtime_limit_s)),
    h("dt", {}, "Price limit"), h("dd", {}, `${money(run.price_limit_per_hour, cur)}/h`),
    f ? [h("dt", {}, "Forecast"), h("dd", {}, `~${duration(f.training_s)} training + ${duration(f.startup_s)} start, ~${money(f.cost, cur)}`)] : null,
    chk ? [h("dt", {}, "Measured"), h("dd", { id: "forecast-check" }, `${duration(chk.training_s)} training (forecast ${Math.abs(Math.round(chk.training_error * 100))} % ${chk.training_error >= 0 ? "long" : "short"})`)] : null,
    run.ran_on ? [h("dt", {}, "Ran on"), h("dd", { id: "ran-on" }, candidateText(run.ran_on, cur))] : null,
    run.candidates && run.candidates.length > 1 ? [h("dt", {}, "Acceptable GPUs"), h("dd", {}, h("ol", { class: "candidates" },
      run.candidates.map((c) => h("li", {}, candidateText(c, cur)))))] : null,
    run.adapter_sha256 ? [h("dt", {}, "Adapter sha256"), h("dd", {}, h("code", {}, run.adapter_sha256))] : null,
    h("dt", {}, "Created"), h("dd", {}, when(run.created_at)),
    run.released_at ? [h("dt", {}, "Released"), h("dd", {}, when(run.released_at))] : null);
}

function resources(run) {
  if (!run.resources.length) return h("p", { class: "hint" }, run.state === "draft" ? "Nothing yet: a draft holds no machine." : "No cloud resources recorded.");
  return h("div", { class: "table-scroll", tabindex: "0", role: "region", "aria-label": "Resources table" }, h("table", { id: "resources" },
    h("thead", {}, h("tr", {}, ["Kind", "Id", "Region", "State"].map((c) => h("th", { scope: "col" }, c)))),
    h("tbody", {}, run.resources.map((r) => h("tr", {},
      h("td", {}, r.kind), h("td", {}, h("code", {}, r.id)), h("td", {}, r.region || "-"), h("td", {}, r.state)))),
    run.release_error ? h("caption", { class: "error" }, `release: ${run.release_error} (attempt ${run.release_attempts})`) : null));
}

// The timeline: the run's events and, where the run tried several GPUs, a line per attempt, by time.
function timeline(run) {
  const events = run.events.filter((e) => e.kind !== "log");
  const attempts = run.attempts || [];
  if (!events.length && !attempts.length) return h("p", { class: "hint" }, "No events yet.");
  const cur = run.offer.currency;
  const lines = events.map((e) => ({ at: e.at, node: h("li", { class: e.kind }, h("time", { datetime: e.at }, when(e.at)),
    e.kind === "transition" ? h("strong", {}, e.state || "") : h("span", { class: "muted" }, `${e.kind}: `),
    " ", e.kind === "transition" ? `— ${consoleWords(e.message)}` : consoleWords(e.message)) }));
  for (const a of attempts) {
    const took = a.seconds !== undefined && a.seconds !== null ? `, ${duration(a.seconds)}` : "";
    lines.push({ at: a.started_at, node: h("li", { class: `attempt ${a.outcome}`, "data-outcome": a.outcome },
      h("time", { datetime: a.started_at || "" }, when(a.started_at)),
      h("strong", {}, `attempt ${(a.index ?? 0) + 1}: ${a.outcome}`), " — ",
      candidateText(a, cur), a.code ? ` (${a.code})` : "", a.message ? `: ${consoleWords(a.message)}` : "", took) });
  }
  lines.sort((x, y) => (Date.parse(x.at || 0) || 0) - (Date.parse(y.at || 0) || 0));
  return h("ol", { class: "timeline", id: "timeline" }, lines.map((l) => l.node));
}

// One action: what it does is said beside its button, and again in the confirmation.
function action({ id, label, consequence, confirm, danger, run: doIt, extra }) {
  const button = h("button", { type: "button", id, class: danger ? "danger" : "" }, label);
  const out = h("div");
  const text = Array.isArray(consequence) ? consequence : [consequence];
  button.addEventListener("click", async () => {
    if (!await confirmAction({ title: `${label}?`, consequence: text, confirm: confirm || label, danger })) return;
    await busy(button, async () => { await doIt(); say(`${label}: requested`); }, out);
  });
  return h("div", { class: "action" }, extra || null, h("div", { class: "buttons" }, button),
    text.map((t) => h("p", {}, t)), out);
}

function actions(run, refresh) {
  const id = encodeURIComponent(run.id);
  const path = `/api/runs/${id}`;
  const then = async (p) => { await p; await refresh(); };
  const cur = run.offer.currency;
  const list = [];
  if (run.state === "draft") {
    list.push(action({ id: "act-launch", label: "Launch", confirm: `Launch at ${money(run.offer.total_per_hour, cur)}/h`,
      consequence: [`Starts ${run.offer.gpu} on ${run.provider} at ${money(run.offer.total_per_hour, cur)} per hour`
        + (run.forecast ? `; forecast ~${duration(run.forecast.total_s)}, ~${money(run.forecast.cost, cur)}` : "") + ".",
        `It is stopped at its runtime limit of ${duration(run.runtime_limit_s)}.`],
      run: () => then(api("POST", `${path}/launch`, { json: { confirm: true } })) }));
    list.push(action({ id: "act-delete", label: "Delete draft", danger: true,
      consequence: "Deletes the draft; nothing was started, nothing is billed.",
      run: async () => { await api("DELETE", path); location.hash = "#/runs"; } }));
  } else if (EARLY.has(run.state)) {
    list.push(action({ id: "act-cancel", label: "Cancel run", danger: true,
      consequence: "Releases the machine (if one was started) and ends the run cancelled. Nothing has been trained yet, so nothing is lost.",
      run: () => then(api("POST", `${path}/cancel`, { json: {} })) }));
  } else if (ACTIVE.has(run.state)) {
    list.push(action({ id: "act-cancel-keep", label: "Cancel, keep the disk",
      consequence: "Stops the machine and keeps its disk (billed at the disk's rate) so its output can be recovered; the run becomes retained.",
      run: () => then(api("POST", `${path}/cancel`, { json: { discard: false } })) }));
    list.push(action({ id: "act-cancel-discard", label: "Cancel and discard", danger: true,
      consequence: "Releases the machine and its disk and deletes any output on them; the run ends cancelled. This cannot be undone.",
      run: () => then(api("POST", `${path}/cancel`, { json: { discard: true } })) }));
  } else if (run.state === "releasing") {
    list.push(action({ id: "act-release", label: "Retry the release",
      consequence: "Asks the cloud again to delete the machine, disk and network interface; the run ends once it confirms.",
      run: () => then(api("POST", `${path}/release`)) }));
  } else if (run.state === "retained") {
    // A checkpoint's adapter (training stopped before its planned steps) ends the run only when the owner says so.
    const accept = h("input", { type: "checkbox", id: "accept-checkpoint" });
    list.push(h("div", { class: "action" }, h("div", { class: "field check" }, accept,
      h("label", { for: "accept-checkpoint" }, "Accept the checkpoint as the run's adapter")),
      h("p", {}, "Tick it to let a verification below accept the last checkpoint's adapter (training stopped before its planned steps) as the run's adapter; untick it and only a completed adapter is accepted.")));
    list.push(action({ id: "act-verify-saved", label: "Verify the saved adapter",
      consequence: "Verifies the adapter already in storage (the final one, else the last checkpoint's, if accepted above). If it passes, the run succeeds and the machine and disk are released; if it is refused, the run stays retained.",
      run: () => then(api("POST", `${path}/recover`, { json: accept.checked
        ? { mode: "verify_saved", accept_checkpoint: true } : { mode: "verify_saved" } })) }));
    const file = h("input", { type: "file", accept: ".zip,application/zip", id: "adapter-file" });
    list.push(action({ id: "act-upload", label: "Upload and verify", extra: field("Adapter archive (adapter.zip)", file),
      consequence: "Uploads the adapter.zip you fetched from the machine and verifies it. If it passes, the run succeeds and the machine and disk are released; if it is refused, the run stays retained with the refusal said.",
      run: async () => {
        if (!file.files.length) throw new Error("Choose the adapter.zip to upload first.");
        await then(api("POST", `${path}/recover${accept.checked ? "?accept_checkpoint=true" : ""}`,
          { body: await file.files[0].arrayBuffer(), type: "application/zip" }));
      } }));
    list.push(action({ id: "act-resume", label: "Resume training",
      consequence: "Starts the machine and trains on from the last checkpoint to the planned steps. GPU billing resumes and the runtime limit counts again from now.",
      run: () => then(api("POST", `${path}/recover`, { json: { mode: "resume" } })) }));
    const running = run.resources.some((r) => r.state.startsWith("running"));
    if (running) {
      list.push(action({ id: "act-stop", label: "Stop the machine",
        consequence: "Stops the machine started for recovery (GPU billing stops); the disk is kept.",
        run: () => then(api("POST", `${path}/stop`)) }));
    } else {
      list.push(action({ id: "act-start", label: "Start the machine",
        consequence: "Starts the retained machine so you can fetch files from it: GPU billing resumes, training does not. It is stopped again after an hour idle.",
        run: () => then(api("POST", `${path}/recover`, { json: { mode: "start_machine" } })) }));
    }
    list.push(action({ id: "act-discard", label: "Discard the run", danger: true,
      consequence: "Releases the machine and its disk and deletes any output on them; the run ends cancelled. This cannot be undone.",
      run: () => then(api("POST", `${path}/cancel`, { json: { discard: true } })) }));
  } else if (run.state === "succeeded") {
    const out = h("div");
    const button = h("button", { type: "button", id: "act-download" }, "Download the adapter");
    button.addEventListener("click", () => busy(button, async () => {
      const resp = await fetch(`${path}/adapter`, { headers: { Authorization: `Bearer ${token.get()}` } });
      if (!resp.ok) throw new Error(`the adapter could not be fetched (${resp.status})`);
      const type = resp.headers.get("Content-Type") || "";
      if (type.startsWith("application/json")) {
        const body = await resp.json();
        if (body.url) { location.assign(body.url); return; }
      }
      const a = h("a", { href: URL.createObjectURL(await resp.blob()), download: `${run.id}-adapter.zip` });
      document.body.append(a);
      a.click();
      a.remove();
    }, out));
    list.push(h("div", { class: "action" }, h("div", { class: "buttons" }, button),
      h("p", {}, "The verified adapter (adapter_model.safetensors, adapter_config.json, manifest.json) as a zip."), out));
  }
  if (!list.length) return h("p", { class: "hint" }, run.state === "recovering" ? "The adapter is being verified; the verdict shows here." : "Nothing to do: the run has ended.");
  return list;
}

export async function runPage(runId) {
  const path = `/api/runs/${encodeURIComponent(runId)}`;
  let run = await get(path);
  const head = h("div"), factsBox = h("div"), resBox = h("div"), timeBox = h("div"), actBox = h("section", { "aria-labelledby": "actions-title" });
  const chartBox = h("div");
  const logs = h("pre", { class: "logs", id: "logs", tabindex: "0", "aria-label": "Training log" });
  const samplesBox = h("div");
  const samples = [];
  let shownSamples = -1;
  let afterEnd = 0;
  let cursor = "", logsDone = false, stopped = false, timer = null, shownState = "", shownEvents = -1, shownPoints = "";

  function drawHead() {
    fill(head,
      h("h1", {}, `Run ${run.id} `, h("span", { id: "run-state", class: `badge ${run.state}` }, run.state)),
      h("p", {}, ACTIVE.has(run.state) ? [`Phase: ${run.phase || run.state} `, h("progress", { max: 1, value: run.progress || 0, "aria-label": "Progress" }),
        ` ${Math.round((run.progress || 0) * 100)} %`] : null),
      run.reason ? h("div", { class: run.state === "failed" || run.state === "retained" ? "warning" : "panel", id: "reason" }, consoleWords(run.reason)) : null,
      run.state === "retained" ? h("div", { class: "panel", id: "next-steps" }, h("strong", {}, "What to do next: "), NEXT_FOR_RETAINED) : null,
      run.billing_note ? h("p", { class: "hint" }, run.billing_note) : null,
      run.warnings.map((w) => h("div", { class: "warning" }, consoleWords(w))));
  }

  function draw() {
    drawHead();
    fill(factsBox, facts(run));
    fill(resBox, resources(run));
    if (run.events.length !== shownEvents) {
      fill(timeBox, timeline(run));
      shownEvents = run.events.length;
    }
    // The actions are drawn again only when the state changes, so the focus stays where it is.
    if (run.state !== shownState) {
      const had = actBox.contains(document.activeElement);
      fill(actBox, h("h2", { id: "actions-title", tabindex: "-1" }, "Actions"), actions(run, refresh));
      shownState = run.state;
      if (had) actBox.querySelector("h2").focus();
    }
  }

  // New lines after the cursor, a page at a time; one reader at once (an action's refresh may overlap a tick).
  let reading = null;
  function pollLogs() {
    reading = reading || readLogs().finally(() => { reading = null; });
    return reading;
  }
  async function readLogs() {
    for (let page = 0; page < 20 && !logsDone; page++) {
      const got = await get(`${path}/logs${cursor ? `?after=${encodeURIComponent(cursor)}` : ""}`);
      if (got.lines.length) {
        const atEnd = logs.scrollTop + logs.clientHeight >= logs.scrollHeight - 8;
        logs.append(got.lines.map((l) => (typeof l === "string" ? l : JSON.stringify(l))).join("\n") + "\n");
        samplesFrom(got.lines, samples);
        if (atEnd) logs.scrollTop = logs.scrollHeight;
      }
      if (samples.length !== shownSamples) { fill(samplesBox, samplesPanel(samples)); shownSamples = samples.length; }
      if (got.next === null) { logsDone = true; break; }
      const moved = got.next !== cursor;
      cursor = got.next;
      if (!moved || !got.lines.length) break;
    }
  }

  // A DPO run's held-out preference accuracy per evaluation (its curve in words) and the last reward margin.
  function preference(points) {
    const dpo = points.filter((p) => typeof p.preference_accuracy === "number");
    if (!dpo.length) return null;
    const last = dpo[dpo.length - 1];
    const curve = dpo.map((p) => `step ${p.step}: ${(100 * p.preference_accuracy).toFixed(0)}%`).join(", ");
    return h("p", { class: "hint", id: "preference" }, `preference accuracy ${curve}; reward margin ${Number(last.reward_margin).toFixed(4)}`);
  }

  async function pollMetrics() {
    const m = await get(`${path}/metrics`);
    const evals = m.eval_points || [];
    // Drawn again when either curve has a new point (an evaluation may come without a new loss point).
    const seen = `${m.points.length}/${evals.length}`;
    if (seen !== shownPoints) {
      fill(chartBox, chart(m.points),
        m.eval_loss !== null && m.eval_loss !== undefined ? h("p", { class: "hint" }, `eval loss ${m.eval_loss.toFixed(4)}`) : null,
        preferenceChart(evals), preference(evals));
      shownPoints = seen;
    }
  }

  async function refresh() {
    run = await get(path);
    draw();
    if (run.state !== "draft") await Promise.all([pollLogs(), pollMetrics()]);
  }

  async function tick() {
    if (stopped) return;
    try {
      await refresh();
    } catch (err) {
      say(err.message);
    }
    // Polled until it has ended, its last log line is shown and its timeline has the last transition (the
    // state is written before its event: a read between the two has the state without it), a few polls at most.
    const settled = run.events.some((e) => e.kind === "transition" && e.state === run.state) || ++afterEnd > 5;
    if (!stopped && !(TERMINAL.has(run.state) && logsDone && settled) && run.state !== "draft") timer = setTimeout(tick, POLL_MS);
  }

  draw();
  fill(samplesBox, samplesPanel(samples));
  if (run.state !== "draft") await Promise.all([pollLogs(), pollMetrics()]).catch((e) => fill(chartBox, errorBox(e)));
  timer = setTimeout(tick, POLL_MS);
  return {
    nodes: [head, actBox,
      h("div", { class: "grid2" },
        h("section", { "aria-labelledby": "cost-title" }, h("h2", { id: "cost-title" }, "Time and cost"), factsBox),
        h("section", { "aria-labelledby": "res-title" }, h("h2", { id: "res-title" }, "Resources"), resBox)),
      h("section", { "aria-labelledby": "loss-title" }, h("h2", { id: "loss-title" }, "Loss"), chartBox),
      h("section", { "aria-labelledby": "samples-title" }, h("h2", { id: "samples-title" }, "Base model vs adapter"), samplesBox),
      h("section", { "aria-labelledby": "logs-title" }, h("h2", { id: "logs-title" }, "Training logs"), logs),
      h("section", { "aria-labelledby": "timeline-title" }, h("h2", { id: "timeline-title" }, "Timeline"), timeBox),
      h("p", {}, h("a", { href: "#/runs" }, "All runs"))],
    cleanup: () => { stopped = true; clearTimeout(timer); },
  };
}
