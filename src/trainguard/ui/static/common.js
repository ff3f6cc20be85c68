/* trainguard dashboard: helpers shared by the pages (data access, DOM, charts with uPlot). */
(function () {
  "use strict";
  const TG = (window.TG = {});

  // The static report (trainguard report) inlines every document the pages would fetch.
  const embedded = document.getElementById("tg-data");
  TG.embedded = embedded ? JSON.parse(embedded.textContent) : null;

  TG.get = async function (path) {
    if (TG.embedded) {
      if (path in TG.embedded) return TG.embedded[path];
      const key = path.split("?")[0];
      if (key in TG.embedded) return TG.embedded[key];
      throw new Error("not part of this report: " + key);
    }
    const response = await fetch(path, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (!response.ok) {
      let detail = "";
      try { detail = (await response.json()).error || ""; } catch (e) { /* not JSON */ }
      throw new Error(path + ": HTTP " + response.status + (detail ? " " + detail : ""));
    }
    return response.json();
  };

  TG.param = function (name) {
    return new URLSearchParams(window.location.search).get(name);
  };

  // Elements are built with textContent only: run names, messages and log lines never become markup.
  TG.el = function (tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      node.appendChild(typeof child === "string" || typeof child === "number" ? document.createTextNode(String(child)) : child);
    }
    return node;
  };

  TG.replace = function (node, ...children) {
    while (node.firstChild) node.removeChild(node.firstChild);
    for (const child of children.flat(Infinity)) if (child) node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
    return node;
  };

  TG.duration = function (seconds) {
    if (seconds === null || seconds === undefined) return "–";
    if (seconds < 60) return seconds.toFixed(seconds < 10 ? 1 : 0) + " s";
    if (seconds < 3600) return Math.floor(seconds / 60) + " min " + Math.round(seconds % 60) + " s";
    return Math.floor(seconds / 3600) + " h " + Math.round((seconds % 3600) / 60) + " min";
  };

  TG.time = function (epoch) {
    return epoch ? new Date(epoch * 1000).toLocaleString() : "–";
  };

  TG.statusBadge = function (status, text) {
    return TG.el("span", { class: "badge status-" + status, title: text || status, "data-status": status }, status);
  };

  TG.where = function (finding) {
    const workers = finding.workers || (finding.worker ? [finding.worker] : []);
    return "step " + finding.step + (workers.length ? " · " + workers.join(", ") : "");
  };

  const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
    "#7f7f7f", "#393b79", "#637939", "#843c39", "#7b4173", "#3182bd", "#e6550d", "#31a354"];
  TG.color = function (i) {
    return i < PALETTE.length ? PALETTE[i] : "hsl(" + ((i * 137.5) % 360) + ",60%,45%)";
  };

  function markerY(chart) {
    let top = null;
    for (const s of chart.series) for (const y of s.y) if (y !== null && (top === null || y > top)) top = y;
    if (top === null) return 1;
    return chart.log_y ? top * 1.5 : top + Math.abs(top) * 0.05 + (top === 0 ? 1 : 0);
  }

  // uPlot wants one shared x array: join the series, then the non-finite markers as one more series.
  function tables(chart) {
    const out = chart.series.map((s) => [s.x, s.y]);
    const marks = [];
    for (const s of chart.series) for (const [x] of s.nonfinite || []) marks.push(x);
    if (!marks.length) return out;
    const unique = Array.from(new Set(marks)).sort((a, b) => a - b);
    const top = markerY(chart);
    out.push([unique, unique.map(() => top)]);
    return out;
  }

  function eventLines(events) {
    return {
      hooks: {
        draw: [
          (u) => {
            const ctx = u.ctx;
            ctx.save();
            ctx.lineWidth = 1.5 * devicePixelRatio;
            ctx.font = 10 * devicePixelRatio + "px sans-serif";
            for (const event of events || []) {
              const x = u.valToPos(event.step, "x", true);
              if (!isFinite(x) || x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
              ctx.strokeStyle = event.kind === "stop" ? "#b00020" : "#e69500";
              ctx.setLineDash(event.kind === "stop" ? [] : [6, 4]);
              ctx.beginPath();
              ctx.moveTo(x, u.bbox.top);
              ctx.lineTo(x, u.bbox.top + u.bbox.height);
              ctx.stroke();
              ctx.fillStyle = ctx.strokeStyle;
              // labels go left of a line in the right half, so they stay inside the plot
              const right = x > u.bbox.left + u.bbox.width / 2;
              ctx.textAlign = right ? "right" : "left";
              ctx.fillText(event.label, x + (right ? -3 : 3) * devicePixelRatio, u.bbox.top + 12 * devicePixelRatio);
            }
            ctx.restore();
          },
        ],
      },
    };
  }

  // The x range covers the data and every finding/stop line, with a margin so a line at the last
  // step is not drawn on the plot's edge.
  function xRange(events) {
    return (u, min, max) => {
      for (const event of events || []) {
        if (min === null || event.step < min) min = event.step;
        if (max === null || event.step > max) max = event.step;
      }
      if (min === null || max === null) return [0, 1];
      const span = Math.max(1, max - min);
      return [min - span * 0.02, max + span * 0.04];
    };
  }

  function describeNonFinite(chart) {
    const items = [];
    for (const s of chart.series) for (const [x, kind] of s.nonfinite || []) items.push({ x, kind, label: s.label });
    items.sort((a, b) => a.x - b.x);
    if (!items.length) return null;
    const shown = items.slice(0, 8).map((m) => m.label + " " + m.kind + " at step " + m.x).join("; ");
    return "Non-finite values: " + shown + (items.length > 8 ? "; … (" + items.length + " markers)" : "");
  }

  // A chart card: title, the uPlot canvas, its full-name legend, the non-finite line and a note.
  TG.Chart = class {
    constructor(parent, chart, events, options) {
      this.options = options || {};
      this.card = TG.el("div", { class: "chart", id: chart.id, "data-title": chart.title });
      this.title = TG.el("h3", { text: chart.title });
      this.plotNode = TG.el("div", { class: "plot" });
      this.nonfinite = TG.el("p", { class: "nonfinite" });
      this.note = TG.el("p", { class: "note" });
      this.card.append(this.title, this.plotNode, this.nonfinite, this.note);
      parent.appendChild(this.card);
      this.events = events || [];
      this.plot = null;
      this.update(chart);
    }

    shape(chart) {
      return chart.series.map((s) => s.label).join("\u0000") + "|" + chart.log_y + "|" + (chart.kind || "line");
    }

    update(chart, events) {
      if (events) this.events = events;
      const eventsKey = JSON.stringify(this.events);
      const data = uPlot.join(tables(chart));
      const finite = chart.series.reduce((n, s) => n + s.y.filter((y) => y !== null).length, 0);
      const markers = chart.series.reduce((n, s) => n + (s.nonfinite || []).length, 0);
      this.card.dataset.points = String(finite);
      this.card.dataset.nonfinite = String(markers);
      this.card.dataset.series = String(chart.series.length);
      this.card.dataset.lastX = String(Math.max(-1, ...chart.series.map((s) => (s.x.length ? s.x[s.x.length - 1] : -1))));
      const text = describeNonFinite(chart);
      this.nonfinite.textContent = text || "";
      this.nonfinite.hidden = !text;
      this.note.textContent = chart.note || "";
      this.note.hidden = !chart.note;
      const shape = this.shape(chart) + "|" + eventsKey + "|" + (markers > 0);
      // when this chart last drew (epoch ms): bench/ui_speed.py times a step from written to drawn
      this.card.dataset.drawnAt = String(performance.timeOrigin + performance.now());
      if (this.plot && this.plotShape === shape) {
        this.plot.setData(data);
        return;
      }
      if (this.plot) this.plot.destroy();
      this.plotShape = shape;
      const width = Math.max(320, (this.plotNode.clientWidth || this.card.clientWidth || 900) - 10);
      const series = [{ label: chart.x_label || "step" }];
      chart.series.forEach((s, i) => series.push({
        label: s.label, stroke: TG.color(i), width: 1.5, spanGaps: true, points: { show: s.x.length < 60 && chart.kind !== "histogram" },
        ...(chart.kind === "histogram" ? { paths: uPlot.paths.stepped({ align: 1 }), fill: TG.color(i) + "33" } : {}),
      }));
      if (markers) series.push({ label: "non-finite (NaN/inf)", stroke: "#d0021b", width: 0, paths: () => null,
        points: { show: true, size: 10, width: 2, fill: "#d0021b", stroke: "#d0021b" } });
      const opts = {
        width, height: this.options.height || 260,
        series,
        scales: { x: { time: false, range: xRange(this.events) }, y: { distr: chart.log_y ? 3 : 1 } },
        axes: [{ label: chart.x_label || "global step" }, { label: chart.y_label || "", size: 70 }],
        legend: { live: true },
        cursor: { drag: { x: true, y: false } },
        plugins: [eventLines(this.events)],
      };
      this.plot = new uPlot(opts, data, this.plotNode);
    }
  };

  // A set of charts by id, created, updated in place or removed as documents come in.
  TG.ChartSet = class {
    constructor(parent, options) {
      this.parent = parent;
      this.options = options;
      this.charts = new Map();
    }
    update(charts, events) {
      const seen = new Set();
      for (const chart of charts) {
        seen.add(chart.id);
        const existing = this.charts.get(chart.id);
        if (existing) existing.update(chart, events);
        else this.charts.set(chart.id, new TG.Chart(this.parent, chart, events, this.options));
      }
      for (const [id, chart] of this.charts) {
        if (!seen.has(id)) { chart.card.remove(); this.charts.delete(id); }
      }
    }
  };

  TG.every = function (seconds, task) {
    let stopped = false;
    async function loop() {
      if (stopped) return;
      try { await task(); } catch (error) { TG.showError(error); }
      if (!TG.embedded && !stopped) setTimeout(loop, seconds * 1000);
    }
    loop();
    return () => { stopped = true; };
  };

  TG.showError = function (error) {
    const node = document.getElementById("error");
    if (node) { node.textContent = String(error.message || error); node.hidden = false; }
  };
  TG.clearError = function () {
    const node = document.getElementById("error");
    if (node) node.hidden = true;
  };
})();
