// Usage: runs launched since a date, their GPU hours and cost, per provider and in total.
import { get } from "./api.js";
import { busy, errorBox, field, h, money, fill } from "./ui.js";

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
      : h("p", {}, "No runs launched since then."));
  }
  show.addEventListener("click", () => busy(show, load, out));
  await load().catch((e) => fill(out, errorBox(e)));
  return { nodes: [h("h1", {}, "Usage"), field("Launched since", since), h("div", { class: "buttons" }, show), out] };
}
