/* One run: diagnosis, stop, advice, rules, curves (live), histogram, profiler; logs and Stop for jobs. */
(function () {
  "use strict";
  const el = TG.el;
  const runId = TG.param("id") || (TG.embedded && TG.embedded.run_id);
  const base = "api/runs/" + encodeURIComponent(runId);
  const charts = new TG.ChartSet(document.getElementById("charts"));
  const profiler = new TG.ChartSet(document.getElementById("profiler"), { height: 200 });
  const histogramCharts = new TG.ChartSet(document.getElementById("histogram"), { height: 240 });
  let version = null;
  let events = [];
  let detail = null;
  let session = { can_stop: false };

  function finding(item, extra) {
    return el("li", { class: "finding", "data-rule": item.rule, "data-step": item.step },
      el("strong", {}, item.rule), " at ", el("span", { class: "where" }, TG.where(item)),
      item.certain ? el("span", { class: "badge certain" }, "certain") : null, ": ",
      el("span", { class: "message" }, item.message || ""), extra || null);
  }

  function renderDiagnosis(d) {
    const node = document.getElementById("diagnosis-body");
    const primary = (d.diagnosis.primary || [])[0];
    const parts = [];
    if (primary) {
      parts.push(el("div", { id: "primary", class: "primary-finding" },
        el("div", { class: "label" }, "Primary finding"),
        el("div", {}, el("strong", { id: "primary-rule" }, primary.rule), " at ", TG.where(primary)),
        el("p", { id: "primary-message" }, primary.message || ""),
        primary.fix_hint ? el("p", { id: "primary-fix", class: "fix" }, el("strong", {}, "Fix: "), primary.fix_hint) : null));
      const explains = d.diagnosis.consequences || [];
      if (explains.length) {
        parts.push(el("div", { class: "label" }, "It explains"),
          el("ul", { id: "explains" }, explains.map((c) => finding(c, c.why ? el("span", { class: "muted" }, " (" + c.why + ")") : null))));
      }
      const causes = d.diagnosis.possible_causes || [];
      if (causes.length) {
        parts.push(el("div", { class: "label" }, "Possible causes (advice the symptom makes relevant)"),
          el("ul", { id: "possible-causes" }, causes.map((c) => finding(c, c.fix_hint ? el("div", { class: "fix" }, "Fix: " + c.fix_hint) : null))));
      }
      const other = d.diagnosis.other || [];
      if (other.length) {
        parts.push(el("div", { class: "label" }, "Other findings"),
          el("ul", { id: "other" }, other.map((c) => finding(c, c.fix_hint ? el("div", { class: "fix" }, "Fix: " + c.fix_hint) : null))));
      }
    } else if (d.rules && d.rules.rules) {
      parts.push(el("p", { id: "no-findings" }, "No findings: " + d.rules.rules + " rule(s), " + d.rules.not_evaluated + " not evaluated" +
        (d.rules.not_applicable ? ", " + d.rules.not_applicable + " not applicable to this run" : "") + "."));
    } else {
      parts.push(el("p", { class: "muted" }, "No rule results in this run (trainguard run --rules writes them)."));
    }
    node.className = "";
    TG.replace(node, parts);
  }

  function renderStop(d) {
    const section = document.getElementById("stop");
    section.hidden = !d.stop;
    if (!d.stop) return;
    const s = d.stop;
    TG.replace(document.getElementById("stop-body"),
      el("span", { id: "stop-line" }, "Training was stopped by " + s.by + " at step " + s.step +
        (s.worker ? " (" + s.worker + ")" : "") +
        (s.delay_s !== null && s.delay_s !== undefined ? ", " + s.delay_s.toFixed(2) + " s after the finding" : "") + "."),
      s.message ? el("div", { class: "muted" }, s.message) : null);
  }

  function renderAdvice(d) {
    const items = d.advice || [];
    document.getElementById("advice").hidden = items.length === 0;
    TG.replace(document.getElementById("advice-body"), items.map((a) => finding(a, a.fix_hint ? el("div", { class: "fix" }, a.fix_hint) : null)));
  }

  function renderRules(d) {
    const rows = (d.rules_table || []).map((r) => el("tr", { "data-rule": r.configuration_name, "data-status": r.status },
      el("td", {}, r.configuration_name, r.rule !== r.configuration_name ? el("div", { class: "muted" }, r.rule) : null),
      el("td", {}, el("span", { class: "badge rule-" + r.status }, r.not_applicable ? "not applicable" : r.not_evaluated ? "not evaluated" : r.status)),
      el("td", {}, r.findings ? r.findings + " from step " + r.first_step : "–", r.advice ? el("div", { class: "muted" }, r.advice + " advice") : null,
        r.dropped ? el("div", { class: "muted" }, "+" + r.dropped + " more not kept by the runner") : null),
      el("td", {}, r.last_evaluated_step === null ? "–" : String(r.last_evaluated_step)),
      el("td", { class: "details" }, r.not_evaluated || r.status_details || "",
        (r.missing || []).length ? el("div", { class: "muted" }, "missing: " + r.missing.join("; ")) : null)));
    TG.replace(document.querySelector("#rules-table tbody"), rows.length ? rows : [el("tr", {}, el("td", { colspan: 5, class: "muted" }, "no rule results"))]);
  }

  function renderHead(d) {
    document.title = "trainguard · " + d.name;
    document.getElementById("name").textContent = d.name;
    TG.replace(document.getElementById("facts"),
      TG.statusBadge(d.status, d.status_text), el("span", { id: "status-text" }, d.status_text),
      el("span", {}, "steps: " + (d.last_step === null ? "–" : d.last_step)),
      el("span", {}, "workers: " + ((d.workers || []).join(", ") || "–")),
      el("span", {}, "duration: " + TG.duration(d.duration_s)),
      el("span", { class: "muted path" }, d.path),
      d.problem ? el("span", { class: "muted" }, d.problem) : null);
    const damage = d.damaged || [];
    const notes = d.notes || [];  // the report's sentences; the live page builds its own lines
    document.getElementById("damage-section").hidden = damage.length === 0 && !(d.capture_stopped || []).length && !notes.length;
    TG.replace(document.getElementById("damage"), notes.length ? notes.map((n) => el("li", {}, n)) : [
      damage.map((x) => el("li", {}, "step " + x.step + " of " + x.worker + ": " + x.file + ": " + x.problem)),
      (d.capture_stopped || []).map((x) => el("li", {}, "capture stopped early at step " + x.step + ": " + x.reason))]);
  }

  function renderJob(d) {
    const job = d.job;
    document.getElementById("job").hidden = !job;
    document.getElementById("logs-section").hidden = !job;
    if (!job) return;
    TG.replace(document.getElementById("job-facts"),
      el("span", {}, "job " + job.name), el("span", { id: "job-status", "data-status": job.status }, job.status),
      job.status_details && job.status_details !== job.status ? el("span", { class: "muted" }, job.status_details) : null);
    const button = document.getElementById("stop-button");
    button.hidden = !(session.can_stop && job.can_stop);
  }

  let histogramTensor = null;
  function setupHistogram(d) {
    const tensors = d.tensors || [];
    const section = document.getElementById("histogram-section");
    section.hidden = tensors.length === 0 || !!TG.embedded && !TG.embedded.histograms;
    if (!tensors.length) return;
    const select = document.getElementById("histogram-tensor");
    if (select.options.length !== tensors.length) {
      const current = select.value;
      TG.replace(select, tensors.map((t) => el("option", { value: t.name }, t.name)));
      if (current) select.value = current;
    }
    const tensor = tensors.find((t) => t.name === select.value) || tensors[0];
    const slider = document.getElementById("histogram-step");
    const atEnd = Number(slider.value) >= Number(slider.max);
    slider.max = String(tensor.steps.length - 1);
    if (histogramTensor !== tensor.name || atEnd) slider.value = slider.max;
    histogramTensor = tensor.name;
    slider.dataset.steps = JSON.stringify(tensor.steps);
  }

  async function drawHistogram() {
    const select = document.getElementById("histogram-tensor");
    const slider = document.getElementById("histogram-step");
    const steps = JSON.parse(slider.dataset.steps || "[]");
    const step = steps[Number(slider.value)];
    if (step === undefined || !select.value) return;
    document.getElementById("histogram-step-label").textContent = "step " + step;
    const key = "/histogram?tensor=" + encodeURIComponent(select.value) + "&step=" + step;
    const h = await TG.get(base + key);
    const nonfinite = [];
    if (h.nan) nonfinite.push([step, h.nan + " NaN"]);
    if (h.posinf) nonfinite.push([step, h.posinf + " +inf"]);
    if (h.neginf) nonfinite.push([step, h.neginf + " -inf"]);
    histogramCharts.update([{
      id: "chart-histogram", title: h.tensor + " at step " + h.step + " (" + h.size + " values)", kind: "histogram",
      x_label: "value", y_label: "count", log_y: false,
      note: nonfinite.length ? "Not binned: " + nonfinite.map((n) => n[1]).join(", ") : "",
      series: [{ label: h.tensor + " · step " + h.step, x: h.edges, y: h.counts.concat([h.counts.length ? h.counts[h.counts.length - 1] : 0]), nonfinite: [] }],
    }]);
  }

  async function refreshDetail() {
    detail = await TG.get(base);
    TG.clearError();
    events = detail.events || [];
    renderHead(detail);
    renderJob(detail);
    renderDiagnosis(detail);
    renderStop(detail);
    renderAdvice(detail);
    renderRules(detail);
    const firstHistogram = document.getElementById("histogram-tensor").options.length === 0;
    setupHistogram(detail);
    if (firstHistogram) drawHistogram().catch(TG.showError);
    const prof = detail.profiler || { charts: [] };
    document.getElementById("profiler-section").hidden = !(prof.charts || []).length;
    profiler.update(prof.charts || [], []);
    TG.replace(document.getElementById("profiler-notes"), (prof.charts || []).length ? (prof.notes || []).map((n) => el("li", {}, n)) : []);
    document.body.dataset.status = detail.status;
  }

  async function refreshSeries() {
    const data = await TG.get(base + "/series" + (version === null ? "" : "?since=" + version));
    if (!data.unchanged) {
      charts.update(data.charts, events);
      version = data.version;
      document.body.dataset.version = String(version);
      document.body.dataset.cursor = String(data.cursor);  // the last step read (bench/ui_speed.py)
    }
    document.getElementById("series-state").textContent = data.backlog ? "reading: " + data.backlog + " saved steps left" :
      (data.charts && !data.charts.length ? "no losses, metrics or tensors saved yet" : "");
  }

  async function refreshLogs() {
    if (!detail || !detail.job) return;
    const data = await TG.get(base + "/logs");
    const node = document.getElementById("logs");
    node.textContent = (data.lines || []).join("\n");
  }

  async function stopJob() {
    const button = document.getElementById("stop-button");
    button.disabled = true;
    const state = document.getElementById("stop-state");
    state.textContent = "asking the API to stop the job…";
    try {
      const response = await fetch(base + "/stop", { method: "POST", credentials: "same-origin",
        headers: { "X-CSRF-Token": session.csrf || "", "Content-Type": "application/json" }, body: "{}" });
      const answer = await response.json().catch(() => ({}));
      state.textContent = response.ok ? "stop requested: " + (answer.status || "Stopping") : "refused: " + (answer.error || response.status);
    } finally {
      button.disabled = false;
    }
  }

  async function start() {
    if (!TG.embedded) {
      try { session = await TG.get("api/session"); } catch (error) { session = { can_stop: false }; }
    }
    document.getElementById("stop-button").addEventListener("click", () => stopJob().catch(TG.showError));
    document.getElementById("histogram-tensor").addEventListener("change", () => { setupHistogram(detail); drawHistogram().catch(TG.showError); });
    document.getElementById("histogram-step").addEventListener("input", () => drawHistogram().catch(TG.showError));
    TG.every(2, refreshDetail);
    TG.every(1, refreshSeries);
    TG.every(2, refreshLogs);
  }
  start();
})();
