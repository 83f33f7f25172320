// Drives the console's Webhooks page and a budget refusal in headless Chromium for
// tests/test_console_webhooks_browser.py (same conventions as driver.mjs: labels, buttons, one JSON line out).
import { chromium } from "playwright-core";

import { args, problems, scenario, shot, shots, signIn } from "./common.mjs";

async function webhooks(page) {
  await signIn(page);
  await page.getByRole("link", { name: "Webhooks" }).click();
  await page.getByRole("heading", { name: "Webhooks", level: 1 }).waitFor();
  await page.getByLabel("URL").fill(args.receiver);
  await page.getByRole("button", { name: "Add webhook" }).click();
  await page.locator("#webhook-secret").waitFor();
  const secret = await page.locator("#webhook-secret code").textContent();
  await shot(page, "w1-webhook-added");
  await page.getByRole("button", { name: "Send test event" }).click();
  let log = "";
  for (let i = 0; i < 120 && !log.includes("delivered"); i++) {
    await page.waitForTimeout(250);
    await page.getByRole("button", { name: "Delivery log" }).click();
    log = (await page.locator("section.webhook").textContent()) || "";
  }
  await shot(page, "w2-delivery-log");
  if (!log.includes("delivered")) throw new Error(`no delivery in the log: ${await page.locator("main").textContent()}`);
  // Shown once: the page drawn again has no secret.
  await page.getByRole("link", { name: "Usage" }).click();
  await page.getByRole("link", { name: "Webhooks" }).click();
  await page.locator("section.webhook").waitFor();
  const again = await page.locator("main").textContent();
  return { secret, log, secretShownAgain: again.includes(secret) };
}

async function budget(page) {
  await signIn(page);
  await page.goto(`${args.url}/api/console#/runs/${args.run_id}`);
  await page.locator("#act-launch").click();
  await page.locator("#confirm-yes").click();
  const alert = page.locator('.action [role="alert"]');
  await alert.waitFor();
  const refusal = await alert.textContent();
  await shot(page, "w3-budget-refusal");
  await page.getByRole("link", { name: "Usage" }).click();
  await page.locator("#budgets").waitFor();
  const usage = await page.locator("#budgets").textContent();
  await shot(page, "w4-usage-budgets");
  return { refusal, usage };
}

const browser = await chromium.launch({ executablePath: args.chromium, args: ["--no-sandbox"] });
let result;
let page;
try {
  page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  // A refused launch is a 409 the browser logs as a failed resource: expected here, every other error is not.
  page.on("console", (m) => { if (m.type() === "error" && !/status of 409/.test(m.text())) problems.push(m.text()); });
  page.on("pageerror", (e) => problems.push(String(e)));
  page.setDefaultTimeout(20000);
  const out = await (scenario === "webhooks" ? webhooks(page) : budget(page));
  result = { ok: true, ...out, shots, problems };
} catch (err) {
  if (page) await shot(page, `failed-${scenario}`).catch(() => {});
  result = { ok: false, error: String(err && err.stack || err), shots, problems };
} finally {
  await browser.close();
}
console.log(JSON.stringify(result));
