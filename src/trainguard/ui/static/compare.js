/* Overlay the losses, metrics and norms of two or more runs: each series named "run · series". */
(function () {
  "use strict";
  const el = TG.el;
  const ids = (TG.param("ids") || "").split(",").filter(Boolean);
  const charts = new TG.ChartSet(document.getElementById("charts"));
  const GROUPS = ["losses", "metrics", "weight_norms", "gradient_norms", "update_ratios"];

  async function refresh() {
    const runs = await Promise.all(ids.map(async (id) => {
      const [detail, series] = await Promise.all([TG.get("api/runs/" + encodeURIComponent(id)), TG.get("api/runs/" + encodeURIComponent(id) + "/series")]);
      return { detail, series };
    }));
    TG.replace(document.getElementById("compared"), runs.map((r) => el("li", {},
      el("a", { href: "run.html?id=" + encodeURIComponent(r.detail.id) }, r.detail.name), " ",
      TG.statusBadge(r.detail.status, r.detail.status_text), " ", r.detail.primary || "")));
    const merged = new Map();
    for (const r of runs) {
      for (const chart of r.series.charts || []) {
        if (!GROUPS.includes(chart.group)) continue;
        const target = merged.get(chart.id) || { ...chart, id: "compare-" + chart.id, series: [] };
        for (const s of chart.series) target.series.push({ ...s, label: r.detail.name + " · " + s.label });
        target.log_y = target.log_y || chart.log_y;
        merged.set(chart.id, target);
      }
    }
    charts.update(Array.from(merged.values()), []);
  }
  TG.every(3, refresh);
})();
