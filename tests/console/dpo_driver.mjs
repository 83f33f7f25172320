// Drives a DPO run's page in headless Chromium for tests/test_console_dpo_browser.py (same conventions as
// driver.mjs: labels, buttons, one JSON line out): the run launched from its page, followed to succeeded, its
// preference chart read back from the SVG, the page audited by axe-core at a desktop's and a phone's width.
import { chromium } from "playwright-core";
import fs from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";

const [scenario, raw] = process.argv.slice(2);
const args = JSON.parse(raw);
const shots = [];
const problems = [];

async function shot(page, name) {
  const file = path.join(args.shots, `${name}.png`);
  await page.screenshot({ path: file, fullPage: true });
  shots.push(file);
}

async function signIn(page) {
  await page.goto(`${args.url}/api/console`);
  await page.getByLabel("API token").fill(args.token);
  await page.keyboard.press("Enter");
  await page.getByRole("heading", { name: "Connections", level: 1 }).waitFor();
}

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
  const axeSource = fs.readFileSync(createRequire(import.meta.url).resolve("axe-core/axe.min.js"), "utf8");
  const got = await page.evaluate(() => {
    const view = window.innerWidth;
    const wide = [...document.querySelectorAll("body *")].filter((el) => el.getBoundingClientRect().right > view + 1
      && !el.closest(".table-scroll, pre, dialog:not([open])"))
      .slice(0, 5).map((el) => `${el.tagName.toLowerCase()}${el.id ? `#${el.id}` : ""}.${el.className}`);
    return { scroll: Math.max(document.documentElement.scrollWidth, document.body.scrollWidth), view, wide };
  });
  into.measured.push({ page: name, width, ...got });
  await shot(page, `dpo-w${width}-${name}`);
  await page.evaluate(axeSource);
  const found = await page.evaluate(async () => (await window.axe.run(document, {
    runOnly: { type: "tag", values: ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "best-practice"] },
  })).violations.map((v) => `${v.id}: ${v.nodes.slice(0, 3).map((n) => n.target.join(" ")).join(", ")}`));
  for (const v of found) into.violations.push(`${name} at ${width}: ${v}`);
}

async function dpo(page) {
  await signIn(page);
  await page.goto(`${args.url}/api/console#/runs/${args.run_id}`);
  await page.getByRole("heading", { level: 1, name: `Run ${args.run_id}` }).waitFor();
  // A draft has no curve yet.
  const draftChart = await page.locator("#preference-chart").count();
  await page.locator("#act-launch").click();
  await page.locator("#confirm-yes").click();
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
  return { draftChart, chart, words, section, probes, ...seen };
}

const browser = await chromium.launch({ executablePath: args.chromium, args: ["--no-sandbox"] });
let result;
let page;
try {
  page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  page.on("console", (m) => { if (m.type() === "error") problems.push(m.text()); });
  page.on("pageerror", (e) => problems.push(String(e)));
  page.setDefaultTimeout(20000);
  const scenarios = { dpo };
  const out = await scenarios[scenario](page);
  result = { ok: true, ...out, shots, problems };
} catch (err) {
  if (page) await shot(page, `failed-${scenario}`).catch(() => {});
  result = { ok: false, error: String(err && err.stack || err), shots, problems };
} finally {
  await browser.close();
}
console.log(JSON.stringify(result));
