// The runs list: newest first, a page at a time (GET /api/runs: items and the next page's cursor).
import { get } from "./api.js";
import { badge, duration, errorBox, field, h, money, when, fill } from "./ui.js";

const STATES = ["", "draft", "queued", "provisioning", "preparing", "training", "exporting", "verifying",
  "releasing", "retaining", "retained", "recovering", "succeeded", "failed", "cancelled"];
const PAGE = 20;

function refocus(id) {
  const el = document.getElementById(id);
  if (el && !el.disabled) el.focus();
  else document.getElementById("main").focus();
}

export async function runsPage() {
  const stateSelect = h("select", {}, STATES.map((s) => h("option", { value: s }, s || "any state")));
  const table = h("div");
  const pager = h("div", { class: "buttons" });
  const cursors = [""]; // the cursor of each page shown so far: "Previous" goes back one

  async function show(index) {
    const q = new URLSearchParams({ limit: String(PAGE) });
    if (cursors[index]) q.set("cursor", cursors[index]);
    if (stateSelect.value) q.set("state", stateSelect.value);
    let page;
    try {
      page = await get(`/api/runs?${q}`);
    } catch (err) {
      fill(table, errorBox(err));
      return;
    }
    cursors.length = index + 1;
    if (page.next) cursors.push(page.next);
    // The table scrolls inside its own box on a narrow screen, not the page.
    fill(table, page.items.length ? h("div", { class: "table-scroll", tabindex: "0", role: "region", "aria-label": "Runs table" }, h("table", {},
      h("caption", { class: "hint" }, `Page ${index + 1}, newest first`),
      h("thead", {}, h("tr", {}, ["Run", "State", "Kind", "Provider · GPU", "Base model", "Created", "Elapsed", "Cost"]
        .map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, page.items.map((r) => h("tr", {},
        h("td", {}, h("a", { href: `#/runs/${encodeURIComponent(r.id)}` }, r.id)),
        h("td", {}, badge(r.state)), h("td", {}, r.kind),
        h("td", {}, `${r.provider} · ${r.offer.gpu}`), h("td", {}, r.base_model), h("td", {}, when(r.created_at)),
        h("td", {}, duration(r.elapsed_s)), h("td", {}, money(r.final_cost ?? r.cost_so_far, r.offer.currency)))))))
      : h("p", {}, index ? "No more runs." : "No runs yet: configure one."));
    // The buttons are drawn anew with each page: the focus goes to the new one of the same id.
    const prev = h("button", { type: "button", id: "prev-page", disabled: index === 0 }, "Previous page");
    prev.addEventListener("click", () => show(index - 1).then(() => refocus("prev-page")));
    const next = h("button", { type: "button", id: "next-page", disabled: !page.next }, "Next page");
    next.addEventListener("click", () => show(index + 1).then(() => refocus("next-page")));
    fill(pager, prev, next);
  }
  stateSelect.addEventListener("change", () => { cursors.length = 1; show(0); });
  await show(0);
  return {
    nodes: [h("h1", {}, "Runs"), h("p", {}, h("a", { href: "#/configure" }, "Configure a new run")),
      field("Show runs in state", stateSelect), table, pager],
  };
}
