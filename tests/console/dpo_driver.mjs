// Drives a DPO run in headless Chromium for tests/test_console_dpo_browser.py (same conventions as driver.mjs:
// labels, buttons, one JSON line out): the run configured and launched in the console, followed to succeeded on
// its page, its preference chart read back from the SVG, the page audited by axe-core at two widths.
import { args, audit as auditPage, runScenario, shot, signIn } from "./common.mjs";

// What a chart shows, as the DOM holds it: its name, each polyline's points, its axis and key texts.
function readChart(id) {
  const svg = document.getElementById(id);
  if (!svg) return null;
  const lines = {};
  for (const l of svg.querySelectorAll("polyline")) {
    const cls = [...l.classList].filter((c) => c !== "line").join(" ") || "line";
    lines[cls] = l.getAttribute("points").trim().split(/\s+/).map((xy) => xy.split(",").map(Number));
  }
  return { label: svg.getAttribute("aria-label"), title: svg.querySelector("title")?.textContent || "",
    viewBox: svg.getAttribute("viewBox"), lines,
    circles: [...svg.querySelectorAll("circle")].map((c) => [c.getAttribute("class"), Number(c.getAttribute("cx")),
      Number(c.getAttribute("cy"))]),
    texts: [...svg.querySelectorAll("text")].map((t) => t.textContent) };
}

async function audit(page, name, width, into) {
  await auditPage(page, name, width, `dpo-w${width}-${name}`, into);
}

async function dpo(page) {
  await signIn(page);
  // Configure a run as a user does: a project, the pairs uploaded (the method follows), the model and the
  // local offer, the limits, DPO's settings in "More training settings"; the trial draft saved, launched.
  await page.getByRole("link", { name: "Configure a run" }).click();
  await page.getByRole("heading", { name: "Configure a run" }).waitFor();
  await page.getByLabel("New project name").fill("preferences");
  await page.getByRole("button", { name: "Create project" }).click();
  await page.getByLabel("Upload a dataset").setInputFiles(args.dataset);
  await page.getByRole("button", { name: "Upload dataset" }).click();
  await page.locator(`select:has(option:text-matches('${args.rows} rows'))`).waitFor();
  // The method follows the uploaded version's format (pairs: DPO), before any estimate is asked for: a pairs
  // version with sft is a 422, which the problems below would report.
  const method = await page.getByLabel("Method").inputValue();
  await page.getByLabel("Provider").selectOption("local");
  await page.getByLabel("Base model").selectOption(args.base_model);
  await page.locator(`input[name=offer][value="${args.offer}"]`).waitFor();
  await page.waitForLoadState("networkidle");
  await page.locator(`input[name=offer][value="${args.offer}"]`).check();
  await page.getByLabel("Price limit (per hour)").fill("1");
  await page.getByLabel("Learning rate").fill(String(args.learning_rate));
  await page.getByLabel("Max steps").fill(String(args.max_steps));
  await page.getByLabel("Max sequence length (tokens)").fill(String(args.max_seq_len));
  await page.getByLabel("More training settings (JSON)").fill(JSON.stringify(args.training));
  await page.getByRole("button", { name: "Save trial draft" }).click();
  await page.locator("#price-confirmation").waitFor();
  await page.getByRole("button", { name: "Launch…" }).click();
  const dialog = page.getByRole("dialog");
  await dialog.waitFor();
  await dialog.getByRole("button", { name: /^Launch at / }).click();
  await page.waitForURL(/#\/runs\//);
  const runId = page.url().split("#/runs/")[1];
  await page.locator('#run-state:text-is("succeeded")').waitFor({ timeout: 150000 });
  // The page polls on until the last log line is read: the chart is drawn again with every evaluation.
  await page.locator(`#preference-chart[aria-label$="(${args.evaluations} evaluations)"]`).waitFor({ timeout: 30000 });
  await page.locator("#loss-chart polyline").waitFor();
  const chart = await page.evaluate(readChart, "preference-chart");
  const words = await page.locator("#preference").textContent();
  const section = await page.getByRole("region", { name: "Loss" }).locator("svg").evaluateAll(
    (svgs) => svgs.map((s) => s.id));
  await shot(page, "dpo-run-succeeded");
  const seen = { measured: [], violations: [] };
  for (const width of [1280, 390]) {
    await page.setViewportSize({ width, height: 900 });
    await page.waitForTimeout(200);
    await audit(page, "dpo-run", width, seen);
  }
  // The chart's own drawing of chosen values (a negative margin, a lone evaluation, an SFT run's evals).
  const probes = [];
  for (const evals of args.probes) {
    const drawn = await page.evaluate(async (e) => {
      const run = await import("/api/console/run.js");
      const svg = run.preferenceChart(e);
      if (!svg) return false;
      const host = document.createElement("div");
      host.id = "probe";
      host.hidden = true;
      svg.id = "probe-chart";
      host.append(svg);
      document.body.append(host);
      return true;
    }, evals);
    probes.push(drawn ? await page.evaluate(readChart, "probe-chart") : null);
    await page.evaluate(() => document.getElementById("probe")?.remove());
  }
  return { runId, method, chart, words, section, probes, ...seen };
}

await runScenario({ dpo });
