// Drives the console's Webhooks page and a budget refusal in headless Chromium for
// tests/test_console_webhooks_browser.py (same conventions as driver.mjs: labels, buttons; common.mjs runs the
// scenario to one JSON line out).
import { args, runScenario, scenario, shot, signIn } from "./common.mjs";

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

// The budget scenario's launch is refused with a 409 on purpose; every other failed request is a problem.
function expected(r) {
  return scenario === "budget" && r.status() === 409 && r.request().method() === "POST" && r.url().endsWith("/launch");
}

await runScenario({ webhooks, budget }, expected);
