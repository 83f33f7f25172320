// What every console driver shares (driver.mjs, dpo_driver.mjs, webhooks_driver.mjs): its arguments, its
// screenshots, the problems the page reports, a page's width and axe-core audit, and one scenario run to one
// JSON line on stdout.
import { chromium } from "playwright-core";
import fs from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";

export const [scenario, raw] = process.argv.slice(2);
export const args = JSON.parse(raw);
export const shots = [];
export const problems = []; // console errors (a CSP violation is one), uncaught page errors, failed requests

export async function shot(page, name) {
  const file = path.join(args.shots, `${name}.png`);
  await page.screenshot({ path: file, fullPage: true });
  shots.push(file);
}

export async function signIn(page) {
  await page.goto(`${args.url}/api/console`);
  await page.getByLabel("API token").fill(args.token);
  await page.keyboard.press("Enter");
  await page.getByRole("heading", { name: "Connections", level: 1 }).waitFor();
}

// The page at its current width: no element wider than the viewport, a screenshot (shotName), and axe-core's
// audit (WCAG 2 A and AA), into {measured, violations}.
export async function audit(page, name, width, shotName, into) {
  const axeSource = fs.readFileSync(createRequire(import.meta.url).resolve("axe-core/axe.min.js"), "utf8");
  const got = await page.evaluate(() => {
    const view = window.innerWidth;
    const wide = [...document.querySelectorAll("body *")].filter((el) => el.getBoundingClientRect().right > view + 1
      && !el.closest(".table-scroll, pre, dialog:not([open])"))
      .slice(0, 5).map((el) => `${el.tagName.toLowerCase()}${el.id ? `#${el.id}` : ""}.${el.className}`);
    return { scroll: Math.max(document.documentElement.scrollWidth, document.body.scrollWidth), view, wide };
  });
  into.measured.push({ page: name, width, ...got });
  await shot(page, shotName);
  await page.evaluate(axeSource);
  const found = await page.evaluate(async () => (await window.axe.run(document, {
    runOnly: { type: "tag", values: ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "best-practice"] },
  })).violations.map((v) => `${v.id}: ${v.nodes.slice(0, 3).map((n) => n.target.join(" ")).join(", ")}`));
  for (const v of found) into.violations.push(`${name} at ${width}: ${v}`);
}

// Runs scenarios[scenario] on a fresh page and prints its result as one JSON line. A failed request is named
// by the response listener (the console's own "Failed to load resource" line does not say which), unless
// expected(response): a refusal the scenario provokes on purpose.
export async function runScenario(scenarios, expected = () => false) {
  const browser = await chromium.launch({ executablePath: args.chromium, args: ["--no-sandbox"] });
  let result;
  let page;
  try {
    page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    page.on("console", (m) => {
      if (m.type() === "error" && !m.text().startsWith("Failed to load resource")) problems.push(m.text());
    });
    page.on("pageerror", (e) => problems.push(String(e)));
    page.on("response", async (r) => {
      if (r.status() < 400 || expected(r)) return;
      const body = await r.text().catch(() => "");
      problems.push(`HTTP ${r.status()} ${r.request().method()} ${r.url()}: ${body.slice(0, 300)}`);
    });
    page.setDefaultTimeout(20000);
    const out = await scenarios[scenario](page);
    result = { ok: true, ...out, shots, problems };
  } catch (err) {
    if (page) await shot(page, `failed-${scenario}`).catch(() => {});
    result = { ok: false, error: String(err && err.stack || err), shots, problems };
  } finally {
    await browser.close();
  }
  console.log(JSON.stringify(result));
}
