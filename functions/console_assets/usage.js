// Usage: runs launched since a date, their GPU hours and cost, per provider and in total.
import { get } from "./api.js";
import { busy, errorBox, field, h, money, fill } from "./ui.js";

// This month's budgets: what is billed, what is committed (billed + the most active runs can still cost),
// what is left for launches, the forecast and the thresholds crossed.
function budgets(b) {
  const set = ((b && b.budgets) || []).filter((x) => x.budget_usd !== null && x.budget_usd !== undefined);
  if (!set.length) return h("p", { class: "hint" }, "No monthly budget is set (an owner sets one under /api/org/limits).");
  return h("table", { id: "budgets" },
    h("caption", { class: "hint" }, `Budgets for ${b.month} (UTC): a launch whose maximum cost would pass one is refused`
      + (b.stop_at_budget ? "; at 100 % active runs are retained" : "")),
    h("thead", {}, h("tr", {}, ["Budget", "Limit", "Billed", "Committed", "Left", "Forecast", "Crossed"].map((c) => h("th", { scope: "col" }, c)))),
    h("tbody", {}, set.map((x) => h("tr", {}, h("th", { scope: "row" }, x.name), h("td", {}, money(x.budget_usd)),
      h("td", {}, money(x.billed_usd)), h("td", {}, money(x.committed_usd)), h("td", {}, money(x.left_usd)),
      h("td", {}, money(x.forecast_usd)), h("td", {}, x.crossed_pct.length ? x.crossed_pct.map((p) => `${p} %`).join(", ") : "-")))));
}

export async function usagePage() {
  const since = h("input", { type: "date" });
  const start = new Date();
  start.setDate(1); // this month
  since.value = start.toISOString().slice(0, 10);
  const out = h("div", { "aria-live": "polite" });
  const show = h("button", { type: "button", class: "primary" }, "Show usage");

  async function load() {
    const u = await get(`/api/usage?since=${encodeURIComponent(since.value)}`);
    const cur = u.providers.length ? u.providers[0].currency : "USD";
    fill(out, u.providers.length ? h("table", { id: "usage" },
      h("caption", { class: "hint" }, `Runs launched since ${new Date(u.since).toLocaleDateString()}`),
      h("thead", {}, h("tr", {}, ["Provider", "Runs", "GPU hours", "Cost"].map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, u.providers.map((p) => h("tr", {}, h("td", {}, p.provider), h("td", {}, p.runs),
        h("td", {}, p.gpu_hours.toFixed(4)), h("td", {}, money(p.cost, p.currency))))),
      h("tfoot", {}, h("tr", {}, h("th", { scope: "row" }, "Total"), h("td", {}, u.total.runs),
        h("td", {}, u.total.gpu_hours.toFixed(4)), h("td", {}, money(u.total.cost, cur)))))
      : h("p", {}, "No runs launched since then."), budgets(u.budget));
  }
  show.addEventListener("click", () => busy(show, load, out));
  await load().catch((e) => fill(out, errorBox(e)));
  return { nodes: [h("h1", {}, "Usage"), field("Launched since", since), h("div", { class: "buttons" }, show), out] };
}
