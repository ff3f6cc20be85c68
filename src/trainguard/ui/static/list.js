/* The runs list: name, status, duration, rule summary and the primary finding; live, filterable. */
(function () {
  "use strict";
  const el = TG.el;
  const selected = new Set();
  const filter = document.getElementById("filter");
  const body = document.querySelector("#runs tbody");
  let rows = new Map();

  function rulesCell(counts) {
    if (!counts || !counts.rules) return el("td", { class: "muted" }, "no rule results");
    return el("td", {},
      el("span", { class: counts.issues ? "count issues" : "count" }, counts.issues + " issues"), " · ",
      el("span", { class: "count advice" }, counts.advice + " advice"), " · ",
      el("span", { class: "count" }, counts.not_evaluated + " not evaluated"),
      counts.not_applicable ? el("span", { class: "count muted" }, " · " + counts.not_applicable + " not applicable") : null);
  }

  function row(run) {
    const box = el("input", { type: "checkbox", "aria-label": "compare " + run.name, checked: selected.has(run.id),
      onchange: (event) => { if (event.target.checked) selected.add(run.id); else selected.delete(run.id); compareLink(); } });
    const job = run.job ? el("div", { class: "muted" }, "job " + run.job.name) : null;
    return el("tr", { "data-run": run.id, "data-status": run.status },
      el("td", {}, box),
      el("td", { class: "name" }, el("a", { href: "run.html?id=" + encodeURIComponent(run.id) }, run.name),
        el("div", { class: "muted path" }, run.path), job),
      el("td", {}, TG.statusBadge(run.status, run.status_text), el("div", { class: "muted" }, run.status_text)),
      el("td", {}, TG.duration(run.duration_s)),
      el("td", {}, run.last_step === null ? "–" : String(run.last_step), run.workers && run.workers.length > 1
        ? el("div", { class: "muted" }, run.workers.length + " workers") : null),
      rulesCell(run.rules),
      el("td", { class: "primary" }, run.primary || (run.problem ? el("span", { class: "muted" }, run.problem) : "")));
  }

  function compareLink() {
    const link = document.getElementById("compare");
    link.hidden = selected.size < 2;
    link.href = "compare.html?ids=" + Array.from(selected).map(encodeURIComponent).join(",");
  }

  async function refresh() {
    const query = filter.value.trim();
    const data = await TG.get("api/runs" + (query ? "?q=" + encodeURIComponent(query) : ""));
    TG.clearError();
    // rows are replaced only when their run changed: links and checkboxes stay put between polls
    const keep = new Map();
    for (const run of data.runs) {
      const key = JSON.stringify(run, (k, v) => (k === "duration_s" && run.status !== "running" ? undefined : v));
      const old = rows.get(run.id);
      const node = old && old.key === key ? old.node : row(run);
      if (old && old.node !== node) old.node.replaceWith(node);
      keep.set(run.id, { key, node });
    }
    for (const [id, old] of rows) if (!keep.has(id)) old.node.remove();
    rows = keep;
    for (const run of data.runs) body.appendChild(rows.get(run.id).node);
    document.getElementById("empty").hidden = data.runs.length > 0;
    TG.replace(document.getElementById("problems"), (data.problems || []).map((p) => el("li", {}, p)));
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
    document.body.dataset.runs = String(data.runs.length);
  }

  filter.addEventListener("input", () => refresh().catch(TG.showError));
  TG.every(1.5, refresh);
})();
