// Drives the web console in headless Chromium (playwright-core, the system's /usr/bin/chromium) for
// tests/test_console_browser.py. Usage: node driver.mjs <scenario> <json args>; prints one JSON line.
// A scenario acts only through the page, as a user would: labels, buttons, the keyboard.
import { args, audit, runScenario, scenario, shot } from "./common.mjs";

async function signIn(page) {
  await page.goto(`${args.url}/api/console`);
  await page.getByLabel("API token").waitFor();
  await shot(page, "01-sign-in");
  await page.getByLabel("API token").fill(args.token);
  await page.keyboard.press("Enter"); // the form submits from the keyboard
  await page.getByRole("heading", { name: "Connections", level: 1 }).waitFor();
}

// Clicks a form's submit button and returns the API's answer to the PUT it sends, once the card's form
// is drawn anew from what was saved (the card counts its draws in data-drawn).
async function submit(page, card, button, path) {
  const drawn = Number(await card.getAttribute("data-drawn"));
  const answer = page.waitForResponse((r) => r.request().method() === "PUT" && new URL(r.url()).pathname === path);
  await button.click();
  const r = await answer;
  const got = { path, status: r.status(), body: await r.json().catch(() => null) };
  if (r.status() < 300) await page.waitForFunction(([id, n]) => Number(document.getElementById(id).dataset.drawn) > n,
    [await card.getAttribute("id"), drawn]);
  return got;
}

// Settings -> Connections through the forms only (no JSON typed): every storage kind and every compute
// provider is filled by its labels, saved, then saved again unchanged (its secrets shown as "saved").
async function connectionForms(page) {
  const saves = [];
  for (const [provider, fields] of args.compute) {
    const card = page.locator(`#card-${provider}`);
    for (const [label, value] of Object.entries(fields)) await card.getByLabel(label).fill(value);
    saves.push(await submit(page, card, card.getByRole("button", { name: "Connect" }), `/api/connections/compute/${provider}`));
    // Drawn again from what was saved: the secrets say "saved", the button "Save and check again".
    const again = card.getByRole("button", { name: "Save and check again" });
    await again.waitFor();
    if (args.secrets[provider]) await card.locator(`[data-saved="${args.secrets[provider]}"]`).waitFor();
    saves.push(await submit(page, card, again, `/api/connections/compute/${provider}`));
  }
  await page.locator('#card-local [data-status="connected"]').waitFor({ timeout: 30000 });
  // Storage: the local kind last (a kind's location cannot change once the organization has projects).
  const storage = page.locator("#card-storage");
  let volumesAnswer = "";
  for (const [choice, kind, fields] of args.storage) {
    await storage.getByLabel(choice).check();
    if (kind === "runpod_volume") {
      // The volume picker asks the RunPod account (unreachable here): its refusal says to type the IDs.
      await storage.getByRole("button", { name: "Find my network volumes" }).click();
      volumesAnswer = await storage.getByRole("alert").textContent();
    }
    for (const [label, value] of Object.entries(fields)) await storage.getByLabel(label).fill(value);
    saves.push(await submit(page, storage, storage.getByRole("button", { name: /^(Connect|Save) storage$/ }), "/api/connections/storage"));
    await storage.getByRole("button", { name: "Save storage" }).waitFor();
    if (args.secrets[kind]) await storage.locator(`[data-saved="${args.secrets[kind]}"]`).waitFor();
    saves.push(await submit(page, storage, storage.getByRole("button", { name: "Save storage" }), "/api/connections/storage"));
  }
  await page.locator('#card-storage [data-status="connected"]').waitFor({ timeout: 30000 });
  // A provider disconnected: its card says so and offers "Connect" again.
  const runpod = page.locator("#card-runpod");
  await runpod.getByRole("button", { name: "Disconnect" }).click();
  const gone = page.waitForResponse((r) => r.request().method() === "DELETE" && r.url().endsWith("/api/connections/compute/runpod"));
  await page.getByRole("dialog").getByRole("button", { name: "Disconnect" }).click();
  saves.push({ path: "DELETE /api/connections/compute/runpod", status: (await gone).status(), body: null });
  await runpod.locator('[data-status="none"]').waitFor();
  // The Hugging Face token: a password field, "saved" once saved, then removed.
  const hf = page.locator("#card-hf");
  await hf.getByLabel("Token", { exact: true }).fill(args.hf_token);
  const putHf = page.waitForResponse((r) => r.request().method() === "PUT" && r.url().endsWith("/huggingface-token"));
  await hf.getByRole("button", { name: "Save token" }).click();
  saves.push({ path: "/api/org/secrets/huggingface-token", status: (await putHf).status(), body: await (await putHf).json() });
  await hf.locator('[data-saved="token"]').waitFor();
  const hfType = await hf.locator("input[name=token]").getAttribute("type");
  // The organization's limits, a form of its own.
  const limits = page.locator("#card-limits");
  await limits.getByLabel("Max active runs").fill("4");
  const put = page.waitForResponse((r) => r.request().method() === "PUT" && r.url().endsWith("/api/org/limits"));
  await limits.getByRole("button", { name: "Save limits" }).click();
  saves.push({ path: "/api/org/limits", status: (await put).status(), body: await (await put).json() });
  return { saves, hfType, volumesAnswer };
}

async function quickstart(page) {
  await signIn(page);
  const { saves, hfType, volumesAnswer } = await connectionForms(page);
  await shot(page, "02-connections");

  // Configure a run: project, dataset, model, offer, trial, limits; save the draft, confirm the price.
  await page.getByRole("link", { name: "Configure a run" }).click();
  await page.getByRole("heading", { name: "Configure a run" }).waitFor();
  await page.getByLabel("New project name").fill("demo");
  await page.getByRole("button", { name: "Create project" }).click();
  await page.getByLabel("Upload a dataset").setInputFiles(args.dataset);
  await page.getByRole("button", { name: "Upload dataset" }).click();
  await page.locator("select:has(option:text-matches('40 rows'))").waitFor();
  await page.getByLabel("Provider").selectOption("local");
  // The base model changed quickly: each change starts a load of the offers, only the last one is shown.
  const models = await page.getByLabel("Base model").locator("option").evaluateAll((os) => os.map((o) => o.value));
  for (const m of [...models, ...models].slice(0, 6)) await page.getByLabel("Base model").selectOption(m);
  await page.getByLabel("Base model").selectOption(args.base_model);
  await page.locator('input[name=offer][value="local-smoke"]').waitFor();
  await page.waitForLoadState("networkidle");
  const offerCount = await page.locator("input[name=offer]").count();
  await page.locator('input[name=offer][value="local-smoke"]').check();
  await page.getByLabel("Price limit (per hour)").fill("1");
  await page.getByLabel("Learning rate").fill("0.001");
  await page.getByLabel("Max steps").fill("8");
  await page.getByLabel("Max sequence length (tokens)").fill("128");
  // The price and forecast show as the form changes, before any draft is saved.
  await page.locator("#estimate-forecast").waitFor();
  const estimate = await page.locator("#estimate").textContent();
  const offerText = await page.locator('label.offer:has(input[value="local-smoke"])').textContent();
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
  await page.locator("#samples .sample").first().waitFor();
  const samples = await page.locator("#samples").textContent();
  await page.locator('#timeline strong:text-is("succeeded")').waitFor();
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
  return { runId, forecast, consequence, timeline, cost, usage, saves, estimate, offerText, samples, offerCount, hfType, volumesAnswer };
}

// Every page at a desktop's and a phone's width: none wider than its viewport, a screenshot of each,
// and axe-core's audit (WCAG 2 A and AA) of each.
async function widths(page) {
  const pages = [["connections", "Connections"], ["configure", "Configure a run"], ["runs", "Runs"],
    [`runs/${args.run_id}`, `Run ${args.run_id}`], ["usage", "Usage"]];
  const measured = [];
  const violations = [];
  async function measure(name, width) {
    await page.waitForTimeout(300); // late parts of a page (offers, the estimate) are drawn
    await audit(page, name, width, `w${width}-${name.replace(/\W+/g, "-")}`, { measured, violations });
  }
  for (const width of [1280, 390]) {
    await page.setViewportSize({ width, height: 900 });
    // Signed out first (a page still loading with the token would have its requests refused midway).
    if (page.url().startsWith(args.url)) await page.evaluate(() => sessionStorage.clear());
    await page.goto(`${args.url}/api/console#/signin`);
    await page.reload();
    await page.getByLabel("API token").waitFor();
    await measure("sign-in", width);
    await page.getByLabel("API token").fill(args.token);
    await page.keyboard.press("Enter");
    for (const [hash, title] of pages) {
      await page.evaluate((h) => { location.hash = `#/${h}`; }, hash);
      await page.getByRole("heading", { level: 1, name: title }).waitFor();
      await page.locator("main p.muted:text-is('Loading…')").waitFor({ state: "detached" }).catch(() => {});
      await measure(hash.split("/")[0] + (hash.includes("/") ? "-page" : ""), width);
    }
  }
  // The console's words for the API's and the CLI's (ui.js), and the sample lines' reader (run.js).
  const words = await page.evaluate(async (texts) => {
    const ui = await import("/api/console/ui.js");
    const run = await import("/api/console/run.js");
    return { said: texts.map(ui.consoleWords),
      samples: run.samplesFrom(["sample prompt: 'Q?'", "sample base model: ''", "sample with adapter: \"it's A\\n\"",
        "sample dataset answer: 'A'", "progress=1.000 step=8"], []) };
  }, args.texts || []);
  return { measured, violations, words };
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

  // Then the good one, by keyboard only: focus the file's button, Enter, Tab to confirm, Enter; with the
  // checkpoint accepted (the query parameter the API reads with an upload).
  await page.getByLabel("Accept the checkpoint as the run's adapter").check();
  const upload = page.waitForRequest((r) => r.method() === "POST" && r.url().includes("/recover"));
  await page.getByLabel("Adapter archive (adapter.zip)").setInputFiles(args.good_zip);
  await page.getByRole("button", { name: "Upload and verify" }).focus();
  await page.keyboard.press("Enter");
  await page.getByRole("dialog").waitFor();
  const consequence = await page.getByRole("dialog").textContent();
  await shot(page, "09-recover-confirmation");
  await page.keyboard.press("Tab"); // "Go back" has the focus first: Tab moves to the action
  await page.keyboard.press("Enter");
  const uploadUrl = (await upload).url();
  await page.locator('#run-state:text-is("succeeded")').waitFor({ timeout: 60000 });
  await page.locator('#resources td:text-is("released")').first().waitFor();
  await shot(page, "10-run-recovered");
  return { next, reason, refused, consequence, uploadUrl };
}

// The run page of a run that tried several GPUs: the run's real view (its record holds issue 37's candidates
// and attempts, written by the test as the launch step writes them).
async function attempts(page) {
  await signIn(page);
  await page.goto(`${args.url}/api/console#/runs/${args.run_id}`);
  await page.locator("#timeline li.attempt").first().waitFor();
  await shot(page, "11-run-attempts");
  return { attemptLines: await page.locator("#timeline li.attempt").allTextContents(),
    ranOn: await page.locator("#ran-on").textContent() };
}

// Refusals a scenario provokes on purpose (the retained run's bad archive): said on the page, not a problem.
function expected(r) {
  if (scenario === "quickstart" && r.url().endsWith("/api/connections/runpod/volumes")) return true;
  return scenario === "retained" && r.request().method() === "POST" && r.url().includes("/recover");
}

await runScenario({ quickstart, retained, widths, attempts }, expected);
