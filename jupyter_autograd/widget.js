// Front end of AutogradWidget. Draws the traits the Python side computes and sets three
// inputs: `selected` (a click on a node of the SVG), `selected_diagnosis`, `step`.
// Every string goes into the page with textContent; the SVG comes from matplotlib, which
// escapes its text.

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function nodeIdOf(target) {
  const g = target.closest && target.closest('[id^="ja-"]');
  if (!g) return null;
  return g.id.slice(3).replace(/-(t|s)$/, "");
}

function render({ model, el: root }) {
  root.classList.add("ja-root");
  const header = el("div", "ja-header");
  const title = el("span", "ja-title", "jupyter-autograd");
  const summary = el("span", "ja-summary");
  header.append(title, summary);
  const error = el("div", "ja-error");
  const diagList = el("div", "ja-diagnoses");
  const main = el("div", "ja-main");
  const graph = el("div", "ja-graph");
  const details = el("div", "ja-details");
  main.append(graph, details);
  const timeline = el("div", "ja-timeline");
  const slider = el("input", "ja-slider");
  slider.type = "range";
  slider.min = "0";
  const stepLabel = el("div", "ja-step");
  timeline.append(el("span", "ja-caption", "timeline"), slider, stepLabel);
  const source = el("div", "ja-source");
  root.append(header, error, diagList, main, timeline, source);

  graph.addEventListener("click", (event) => {
    const id = nodeIdOf(event.target);
    if (id === null) return;
    model.set("selected", id);
    model.save_changes();
  });
  slider.addEventListener("input", () => {
    model.set("step", Number(slider.value));
    model.save_changes();
  });

  function drawSummary() {
    summary.textContent = model.get("summary");
    error.textContent = model.get("error") ? "The cell raised " + model.get("error").split("\n")[0] : "";
    error.style.display = model.get("error") ? "" : "none";
  }

  function drawDiagnoses() {
    diagList.replaceChildren();
    const items = model.get("diagnoses");
    if (!items.length) diagList.append(el("div", "ja-ok", "No problems found."));
    items.forEach((d, i) => {
      const card = el("div", "ja-diagnosis ja-kind-" + d.kind);
      card.dataset.index = String(i);
      if (i === model.get("selected_diagnosis")) card.classList.add("ja-active");
      card.append(el("div", "ja-diag-title", d.title));
      const where = el("div", "ja-diag-where");
      if (d.line) where.append(el("span", "ja-line-ref", "line " + d.line + ": "), el("code", null, d.source));
      if (d.saved_line) where.append(el("br"), el("span", "ja-line-ref", "saved on line " + d.saved_line + ": "),
                                     el("code", null, d.saved_source));
      card.append(where, el("div", "ja-diag-message", d.message));
      const fix = el("div", "ja-diag-fix");
      fix.append(el("span", "ja-fix-label", "Fix: "), el("pre", null, d.fix));
      card.append(fix);
      card.addEventListener("click", () => {
        model.set("selected_diagnosis", i);
        model.save_changes();
      });
      diagList.append(card);
    });
  }

  function drawGraph() {
    graph.innerHTML = model.get("svg");
    const count = model.get("node_count");
    if (model.get("grouped")) {
      graph.prepend(el("div", "ja-note", count + " nodes, grouped by module (or by the line that made them): click a dashed box to expand it."));
    }
    markNodes();
  }

  function markNodes() {
    const marks = [["ja-selected", [model.get("selected")]], ["ja-highlight", model.get("highlight_nodes")],
                   ["ja-step-node", model.get("step_nodes")]];
    for (const [cls] of marks) graph.querySelectorAll("." + cls).forEach((n) => n.classList.remove(cls));
    for (const [cls, ids] of marks) {
      for (const id of ids) {
        if (!id) continue;
        const node = graph.querySelector('[id="' + CSS.escape("ja-" + id) + '"]');
        if (node) node.classList.add(cls);
      }
    }
  }

  function drawDetails() {
    details.replaceChildren();
    const d = model.get("details");
    if (!d || !d.title) {
      details.append(el("div", "ja-hint", "Click a node of the graph to inspect it."));
      return;
    }
    details.append(el("div", "ja-details-title", d.title));
    const table = el("table", "ja-rows");
    for (const [k, v] of d.rows || []) {
      const tr = el("tr");
      tr.append(el("th", null, k), el("td", null, v));
      table.append(tr);
    }
    details.append(table);
    for (const t of d.tables || []) {
      if (!t.rows.length) continue;
      details.append(el("div", "ja-caption", t.caption));
      const tab = el("table", "ja-table");
      const head = el("tr");
      for (const c of t.columns) head.append(el("th", null, c));
      tab.append(head);
      for (const row of t.rows) {
        const tr = el("tr");
        if (row.some((cell) => String(cell).startsWith("STALE"))) tr.classList.add("ja-stale");
        for (const cell of row) tr.append(el("td", null, cell));
        tab.append(tr);
      }
      details.append(tab);
    }
  }

  function drawSource() {
    source.replaceChildren();
    const hl = new Set(model.get("highlight_lines"));
    const current = model.get("current_line");
    for (const { line, text } of model.get("source")) {
      const row = el("div", "ja-src-line");
      row.dataset.line = String(line);
      if (hl.has(line)) row.classList.add("ja-src-highlight");
      if (line === current) row.classList.add("ja-src-current");
      row.append(el("span", "ja-lineno", line), el("span", "ja-code", text));
      source.append(row);
    }
  }

  function drawStep() {
    slider.max = String(Math.max(0, model.get("n_steps") - 1));
    slider.disabled = model.get("n_steps") === 0;
    const info = model.get("step_info");
    stepLabel.replaceChildren();
    if (!info || info.index === undefined) {
      stepLabel.append(el("span", "ja-hint", model.get("n_steps") + " operations: move the slider to replay them."));
      return;
    }
    slider.value = String(info.index);
    stepLabel.append(el("span", "ja-step-index", "step " + (info.index + 1) + "/" + model.get("n_steps") + " "),
                     el("code", "ja-step-op", info.op),
                     el("span", "ja-line-ref", " line " + info.line + ": "), el("code", "ja-step-source", info.source));
    if (!info.grad_mode) stepLabel.append(el("span", "ja-badge", "no_grad"));
    if (info.error) stepLabel.append(el("span", "ja-badge ja-badge-error", info.error.split("\n")[0]));
    const versions = el("div", "ja-versions");
    for (const [name, version, written] of info.versions) {
      const chip = el("span", "ja-chip" + (written ? " ja-chip-written" : ""), name + " v" + version);
      versions.append(chip);
    }
    stepLabel.append(versions);
  }

  drawSummary();
  drawDiagnoses();
  drawGraph();
  drawDetails();
  drawStep();
  drawSource();
  model.on("change:summary", drawSummary);
  model.on("change:error", drawSummary);
  model.on("change:diagnoses", drawDiagnoses);
  model.on("change:selected_diagnosis", drawDiagnoses);
  model.on("change:svg", drawGraph);
  model.on("change:selected", markNodes);
  model.on("change:highlight_nodes", markNodes);
  model.on("change:step_nodes", markNodes);
  model.on("change:details", drawDetails);
  model.on("change:step_info", drawStep);
  model.on("change:n_steps", drawStep);
  model.on("change:highlight_lines", drawSource);
  model.on("change:current_line", drawSource);
  model.on("change:source", drawSource);
}

export default { render };
