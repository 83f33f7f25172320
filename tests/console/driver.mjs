// Drives the web console in headless Chromium (playwright-core, the system's /usr/bin/chromium) for
// tests/test_console_browser.py. Usage: node driver.mjs <scenario> <json args>; prints one JSON line.
// A scenario acts only through the page, as a user would: labels, buttons, the keyboard.
import { chromium } from "playwright-core";
import path from "node:path";

const [scenario, raw] = process.argv.slice(2);
const args = JSON.parse(raw);
const shots = [];
const problems = []; // console errors (a CSP violation is one) and uncaught page errors

async function shot(page, name) {
  const file = path.join(args.shots, `${name}.png`);
  await page.screenshot({ path: file, fullPage: true });
  shots.push(file);
}

async function signIn(page) {
  await page.goto(`${args.url}/api/console`);
  await page.getByLabel("API token").waitFor();
  await shot(page, "01-sign-in");
  await page.getByLabel("API token").fill(args.token);
  await page.keyboard.press("Enter"); // the form submits from the keyboard
  await page.getByRole("heading", { name: "Connections", level: 1 }).waitFor();
}

async function quickstart(page) {
  await signIn(page);
  // Settings -> Connections: local storage, then the local compute card until it says Connected.
  await page.locator("#save-storage").click();
  await page.locator('#card-storage [data-status="connected"]').waitFor();
  await page.getByLabel("local settings (JSON)").fill('{"price_per_hour": 0}');
  await page.locator("#save-local").click();
  await page.locator('#card-local [data-status="connected"]').waitFor({ timeout: 30000 });
  await shot(page, "02-connections");

  // Configure a run: project, dataset, model, offer, trial, limits; save the draft, confirm the price.
  await page.getByRole("link", { name: "Configure a run" }).click();
  await page.getByRole("heading", { name: "Configure a run" }).waitFor();
  await page.getByLabel("New project name").fill("demo");
  await page.getByRole("button", { name: "Create project" }).click();
  await page.getByLabel("Upload a dataset").setInputFiles(args.dataset);
  await page.getByRole("button", { name: "Upload dataset" }).click();
  await page.locator("select:has(option:text-matches('40 rows'))").waitFor();
  await page.getByLabel("Base model").selectOption(args.base_model);
  await page.locator('input[name=offer][value="local-smoke"]').check();
  await page.getByLabel("Price limit (per hour)").fill("1");
  await page.getByLabel("Learning rate").fill("0.001");
  await page.getByLabel("Max steps").fill("8");
  await page.getByLabel("Max sequence length (tokens)").fill("128");
  await page.getByRole("button", { name: "Save trial draft" }).click();
  await page.locator("#price-confirmation").waitFor();
  const forecast = await page.locator("#forecast").textContent();
  await shot(page, "03-configure-draft");
  await page.getByRole("button", { name: "Launch…" }).click();
  const dialog = page.getByRole("dialog");
  await dialog.waitFor();
  const consequence = await dialog.textContent();
  await shot(page, "04-launch-confirmation");
  await dialog.getByRole("button", { name: /^Launch at / }).click();
  await page.waitForURL(/#\/runs\//);

  // The run page follows the run to its end: timeline, logs, loss curve, cost, released resources.
  await page.locator('#run-state:text-is("succeeded")').waitFor({ timeout: 150000 });
  await page.locator("#loss-chart polyline").waitFor();
  await page.locator('#resources td:text-is("released")').first().waitFor();
  await page.locator('#logs:has-text("progress=")').waitFor();
  const runId = page.url().split("#/runs/")[1];
  const timeline = await page.locator("#timeline").textContent();
  const cost = await page.locator("#cost").textContent();
  await shot(page, "05-run-succeeded");

  await page.getByRole("link", { name: "Runs", exact: true }).click();
  await page.locator(`a:text-is("${runId}")`).waitFor();
  await shot(page, "06-runs-list");
  await page.getByRole("link", { name: "Usage" }).click();
  await page.locator("#usage").waitFor();
  const usage = await page.locator("#usage").textContent();
  await shot(page, "07-usage");
  return { runId, forecast, consequence, timeline, cost, usage };
}

async function retained(page) {
  await signIn(page);
  await page.goto(`${args.url}/api/console#/runs/${args.run_id}`);
  await page.locator('#run-state:text-is("retained")').waitFor();
  const next = await page.locator("#next-steps").textContent();
  const reason = await page.locator("#reason").textContent();
  await shot(page, "08-run-retained");

  // A refused archive first: the run stays retained and says why.
  await page.getByLabel("Adapter archive (adapter.zip)").setInputFiles(args.bad_zip);
  await page.getByRole("button", { name: "Upload and verify" }).click();
  await page.getByRole("dialog").getByRole("button", { name: "Upload and verify" }).click();
  await page.locator('#timeline:has-text("recovering")').waitFor({ timeout: 30000 });
  await page.locator('#run-state:text-is("retained")').waitFor({ timeout: 30000 });
  const refused = await page.locator("#reason").textContent();

  // Then the good one, by keyboard only: focus the file's button, Enter, Tab to confirm, Enter.
  await page.getByLabel("Adapter archive (adapter.zip)").setInputFiles(args.good_zip);
  await page.getByRole("button", { name: "Upload and verify" }).focus();
  await page.keyboard.press("Enter");
  await page.getByRole("dialog").waitFor();
  const consequence = await page.getByRole("dialog").textContent();
  await shot(page, "09-recover-confirmation");
  await page.keyboard.press("Tab"); // "Go back" has the focus first: Tab moves to the action
  await page.keyboard.press("Enter");
  await page.locator('#run-state:text-is("succeeded")').waitFor({ timeout: 60000 });
  await page.locator('#resources td:text-is("released")').first().waitFor();
  await shot(page, "10-run-recovered");
  return { next, reason, refused, consequence };
}

const browser = await chromium.launch({ executablePath: args.chromium, args: ["--no-sandbox"] });
let result;
let page;
try {
  page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  page.on("console", (m) => { if (m.type() === "error") problems.push(m.text()); });
  page.on("pageerror", (e) => problems.push(String(e)));
  page.setDefaultTimeout(20000);
  const out = await (scenario === "quickstart" ? quickstart(page) : retained(page));
  result = { ok: true, ...out, shots, problems };
} catch (err) {
  if (page) await shot(page, `failed-${scenario}`).catch(() => {});
  result = { ok: false, error: String(err && err.stack || err), shots, problems };
} finally {
  await browser.close();
}
console.log(JSON.stringify(result));
