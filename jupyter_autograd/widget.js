// Front end of AutogradWidget. Python sends the scene (items, module boxes, the layers of each
// box laid out, edges) as plain lists; this file places and draws it as SVG elements, opens and
// closes boxes, zooms and pans (the viewBox), finds names, all without the kernel. It sets four
// inputs: `selected` (a click on a node), `selected_diagnosis`, `step`, and `expanded` (a box
// opened that Python has not laid out yet). Every string goes into the page with textContent.

const SVG = "http://www.w3.org/2000/svg";
// The same numbers as render/layout.py, so the static picture looks like this one.
const NODE_H = 36, BOX_H = 40, HEADER_H = 22, PAD = 10, GAP_X = 16, GAP_Y = 30, ROW_MAX = 8;
const CHAR_W = 7, MIN_W = 64, MAX_W = 250;
const MIN_READABLE = 1; // the first view's scale: 11 px sublabels stay at 11 px (the minimum)

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function sv(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function textWidth(label, sub) {
  return Math.max(MIN_W, Math.min(MAX_W, Math.max(label.length * CHAR_W, (sub || "").length * CHAR_W * 0.9) + 20));
}

function parseScene(raw) {
  const items = new Map(), boxes = new Map();
  for (const [id, kind, label, sub, parent, name, problem] of raw.items || []) {
    items.set(id, { id, kind, label, sub, parent, name, problem: !!problem });
  }
  for (const [id, kind, label, sub, parent, name, count, laid] of raw.boxes || []) {
    boxes.set(id, { id, kind, label, sub, parent, name, count, laid: !!laid });
  }
  return { items, boxes, layers: raw.layers || {}, edges: raw.edges || [], open: raw.open || [],
           focus: raw.focus || [], path: raw.path || [], note: raw.note || "" };
}

function render({ model, el: root }) {
  const uid = "ja" + Math.random().toString(36).slice(2, 10);
  root.classList.add("ja-root");
  // JupyterLab's command-mode shortcuts must not eat the keys typed in the widget. Lumino stops
  // looking at the first element that carries the mark or matches a shortcut's selector, and
  // Notebook 7's selectors match any focused element (`... :focus`): so the focusable elements
  // carry it too (below).
  root.setAttribute("data-lm-suppress-shortcuts", "true");
  const header = el("div", "ja-header");
  header.append(el("span", "ja-title", "jupyter-autograd"), el("span", "ja-summary"));
  const summary = header.lastChild;
  const error = el("div", "ja-error");
  const lost = el("div", "ja-warnings"); // what a failed part of the analysis lost
  const diagList = el("div", "ja-diagnoses");
  const main = el("div", "ja-main");
  const graphCol = el("div", "ja-graph-col");
  const toolbar = el("div", "ja-toolbar");
  const find = el("input", "ja-find");
  find.type = "search";
  find.placeholder = "find a variable, parameter or module";
  find.setAttribute("aria-label", "find in the graph");
  const findInfo = el("span", "ja-find-info");
  const buttons = {};
  for (const [key, label, title] of [["fit", "Fit", "fit the graph to the pane (key 0)"],
                                     ["one", "100%", "actual size (key 1)"],
                                     ["in", "+", "zoom in (key +)"], ["out", "\u2212", "zoom out (key -)"],
                                     ["focus", "Problem", "back to the first view"]]) {
    const b = el("button", "ja-btn ja-btn-" + key, label);
    b.type = "button";
    b.title = title;
    buttons[key] = b;
  }
  toolbar.append(find, findInfo, buttons.fit, buttons.one, buttons.in, buttons.out, buttons.focus);
  const note = el("div", "ja-note");
  const pane = el("div", "ja-graph");
  pane.tabIndex = 0;
  const svg = sv("svg", { class: "ja-svg", width: "100%", height: "100%" });
  const defs = sv("defs");
  const marker = sv("marker", { id: uid + "-arrow", viewBox: "0 0 8 8", refX: 7, refY: 4, markerWidth: 7,
                                markerHeight: 7, orient: "auto-start-reverse" });
  marker.append(sv("path", { d: "M0 0L8 4L0 8z", class: "ja-arrow" }));
  defs.append(marker);
  const content = sv("g", { id: uid + "-content" });
  svg.append(defs, content);
  const mini = sv("svg", { class: "ja-minimap" });
  const miniUse = sv("use", { href: "#" + uid + "-content" });
  const miniView = sv("rect", { class: "ja-minimap-view" });
  mini.append(miniUse, miniView);
  pane.append(svg, mini);
  graphCol.append(toolbar, note, pane);
  const details = el("div", "ja-details");
  main.append(graphCol, details);
  const timeline = el("div", "ja-timeline");
  const slider = el("input", "ja-slider");
  slider.type = "range";
  slider.min = "-1"; // -1: before the first operation, so the thumb never sits at a random place
  slider.value = "-1";
  for (const focusable of [find, pane, slider]) focusable.setAttribute("data-lm-suppress-shortcuts", "true");
  const stepLabel = el("div", "ja-step");
  timeline.append(el("span", "ja-caption", "timeline"), slider, stepLabel);
  const source = el("div", "ja-source");
  root.append(header, lost, error, diagList, main, timeline, source);

  // -- the scene and what is open ------------------------------------------------------------------
  let scene = parseScene(model.get("scene"));
  const openSet = new Set(scene.open);
  let placed = new Map();
  let contentW = 1, contentH = 1;
  const view = { x: 0, y: 0, k: 1 };
  let positioned = false;
  let pendingReveal = null;
  let found = [], foundAt = -1;

  function isBox(id) { return scene.boxes.has(id); }
  function parentOf(id) {
    const t = scene.items.get(id) || scene.boxes.get(id);
    return t ? t.parent : null;
  }
  function isOpen(id) { const b = scene.boxes.get(id); return !!(b && b.laid && openSet.has(id)); }
  function children(box) {
    const rows = [];
    for (const layer of scene.layers[box] || []) {
      for (let i = 0; i < layer.length; i += ROW_MAX) rows.push(layer.slice(i, i + ROW_MAX));
    }
    return rows;
  }
  // What stands for `id` on screen: itself, or the outermost closed box holding it.
  function stand(id) {
    if (!scene.items.has(id) && !scene.boxes.has(id)) return null;
    let best = isBox(id) && !isOpen(id) ? id : null;
    let p = parentOf(id);
    while (p) {
      if (!isOpen(p)) best = p;
      p = parentOf(p);
    }
    return best || id;
  }

  function place() {
    const sizes = new Map();
    placed = new Map();
    function size(id) {
      if (sizes.has(id)) return sizes.get(id);
      let s;
      const it = scene.items.get(id);
      if (it) s = [textWidth(it.label, it.sub), NODE_H];
      else {
        const b = scene.boxes.get(id);
        if (isOpen(id)) {
          const [w, h] = contentSize(id);
          s = [Math.max(w + 2 * PAD, textWidth(b.label + "  " + b.sub)), h + HEADER_H + 2 * PAD];
        } else s = [textWidth(b.label + " +", b.sub), BOX_H];
      }
      sizes.set(id, s);
      return s;
    }
    function contentSize(box) {
      let w = 0, h = 0;
      for (const r of children(box)) {
        w = Math.max(w, r.reduce((a, c) => a + size(c)[0], 0) + GAP_X * (r.length - 1));
        h += Math.max(...r.map((c) => size(c)[1])) + GAP_Y;
      }
      return [w, Math.max(0, h - GAP_Y)];
    }
    function put(box, x0, y0, width) {
      let y = y0;
      for (const r of children(box)) {
        const rowW = r.reduce((a, c) => a + size(c)[0], 0) + GAP_X * (r.length - 1);
        const rowH = Math.max(...r.map((c) => size(c)[1]));
        let x = x0 + (width - rowW) / 2;
        for (const c of r) {
          const [w, h] = size(c);
          const open = isOpen(c);
          placed.set(c, { x, y, w, h, box: isBox(c), open });
          if (open) put(c, x + PAD, y + HEADER_H + PAD, w - 2 * PAD);
          x += w + GAP_X;
        }
        y += rowH + GAP_Y;
      }
    }
    [contentW, contentH] = contentSize("");
    put("", 0, 0, contentW);
  }

  function curve(a, b) {
    let x1 = a.x + a.w / 2, y1 = a.y + a.h, x2 = b.x + b.w / 2, y2 = b.y;
    if (y2 <= y1) {
      const right = b.x > a.x;
      x1 = right ? a.x + a.w : a.x; y1 = a.y + a.h / 2;
      x2 = right ? b.x : b.x + b.w; y2 = b.y + b.h / 2;
      return `M${x1} ${y1}L${x2} ${y2}`;
    }
    const dy = Math.max(12, (y2 - y1) / 2);
    return `M${x1} ${y1}C${x1} ${y1 + dy} ${x2} ${y2 - dy} ${x2} ${y2}`;
  }

  function drawGraph() {
    const started = performance.now();
    place();
    const boxLayer = sv("g", { class: "ja-boxes" });
    const edgeLayer = sv("g", { class: "ja-edges" });
    const nodeLayer = sv("g", { class: "ja-nodes" });
    for (const [id, p] of placed) {
      if (!p.box) continue;
      const b = scene.boxes.get(id);
      const g = sv("g", { class: "ja-box" + (p.open ? " ja-open" : " ja-closed") + (b.kind === "chunk" ? " ja-chunk" : "") });
      g.dataset.id = id;
      g.append(sv("title", {}, (b.name || b.label) + (b.sub ? " (" + b.sub + ")" : "") +
                               (p.open ? ": click the title to close" : ": click to open")));
      g.append(sv("rect", { x: p.x, y: p.y, width: p.w, height: p.h, rx: 6, class: "ja-box-rect" }));
      if (p.open) {
        g.append(sv("rect", { x: p.x, y: p.y, width: p.w, height: HEADER_H, rx: 6, class: "ja-box-header" }));
        const t = sv("text", { x: p.x + 8, y: p.y + HEADER_H - 6, class: "ja-box-label" }, "\u2212 " + b.label);
        t.append(sv("tspan", { class: "ja-box-sub" }, "  " + b.sub));
        g.append(t);
      } else {
        g.append(sv("text", { x: p.x + 8, y: p.y + BOX_H / 2 - 2, class: "ja-box-label" }, "+ " + b.label));
        g.append(sv("text", { x: p.x + 8, y: p.y + BOX_H - 7, class: "ja-box-sub" }, b.sub));
      }
      boxLayer.append(g);
    }
    const pathPairs = new Set();
    const pathStands = scene.path.map(stand).filter((s) => s !== null);
    for (let i = 0; i + 1 < pathStands.length; i++) pathPairs.add(pathStands[i] + "\u0000" + pathStands[i + 1]);
    const seen = new Set();
    for (const [u, v, kind] of scene.edges) {
      const a = stand(u), b = stand(v);
      if (a === null || b === null || a === b) continue;
      const key = a + "\u0000" + b;
      if (seen.has(key)) continue;
      seen.add(key);
      const pa = placed.get(a), pb = placed.get(b);
      if (!pa || !pb) continue;
      const cls = "ja-edge ja-edge-" + kind + (pathPairs.has(key) ? " ja-path" : "");
      edgeLayer.append(sv("path", { d: curve(pa, pb), class: cls, "marker-end": `url(#${uid}-arrow)` }));
    }
    for (const [id, p] of placed) {
      if (p.box) continue;
      const it = scene.items.get(id);
      const g = sv("g", { class: "ja-node ja-kind-" + it.kind + (it.problem ? " ja-problem" : "") });
      g.dataset.id = id;
      g.append(sv("title", {}, it.name && it.name !== it.label ? it.name : it.label + (it.sub ? " (" + it.sub + ")" : "")));
      g.append(sv("rect", { x: p.x, y: p.y, width: p.w, height: p.h, rx: it.kind === "leaf" ? 10 : 3, class: "ja-node-rect" }));
      g.append(sv("text", { x: p.x + p.w / 2, y: p.y + 15, class: "ja-node-label" }, it.label));
      if (it.sub) g.append(sv("text", { x: p.x + p.w / 2, y: p.y + 29, class: "ja-node-sub" }, it.sub));
      nodeLayer.append(g);
    }
    content.replaceChildren(boxLayer, edgeLayer, nodeLayer);
    note.textContent = placed.size ? scene.note : "No autograd graph was recorded: nothing in the block required grad.";
    note.style.display = note.textContent ? "" : "none";
    markNodes();
    applyView();
    const ms = performance.now() - started;
    root.dataset.renderMs = ms.toFixed(1);
    if (!root.dataset.firstRenderMs) root.dataset.firstRenderMs = ms.toFixed(1);
  }

  // -- zoom and pan: the viewBox -------------------------------------------------------------------
  function paneSize() { return [pane.clientWidth || 800, pane.clientHeight || 480]; }
  function applyView() {
    const [w, h] = paneSize();
    svg.setAttribute("viewBox", `${view.x} ${view.y} ${w / view.k} ${h / view.k}`);
    root.dataset.zoom = view.k.toFixed(3);
    const overview = contentH * view.k > h * 1.05 || contentW * view.k > w * 1.05;
    mini.style.display = overview ? "" : "none";
    if (overview) {
      const m = 8;
      mini.setAttribute("viewBox", `${-m} ${-m} ${contentW + 2 * m} ${contentH + 2 * m}`);
      miniView.setAttribute("x", view.x); miniView.setAttribute("y", view.y);
      miniView.setAttribute("width", w / view.k); miniView.setAttribute("height", h / view.k);
    }
  }
  function zoomAt(factor, px, py) {
    const [w, h] = paneSize();
    if (px === undefined) { px = w / 2; py = h / 2; }
    const k = Math.max(0.05, Math.min(4, view.k * factor));
    const gx = view.x + px / view.k, gy = view.y + py / view.k;
    view.k = k;
    view.x = gx - px / k;
    view.y = gy - py / k;
    applyView();
  }
  function fit() {
    const [w, h] = paneSize();
    const m = 16;
    view.k = Math.min(2, (w - 2 * m) / Math.max(contentW, 1), (h - 2 * m) / Math.max(contentH, 1));
    view.x = (contentW - w / view.k) / 2;
    view.y = (contentH - h / view.k) / 2;
    applyView();
  }
  function centerOn(ids, k) {
    const [w, h] = paneSize();
    const boxes = ids.map((id) => placed.get(stand(id))).filter(Boolean);
    if (!boxes.length) return false;
    const x0 = Math.min(...boxes.map((b) => b.x)), x1 = Math.max(...boxes.map((b) => b.x + b.w));
    const y0 = Math.min(...boxes.map((b) => b.y)), y1 = Math.max(...boxes.map((b) => b.y + b.h));
    view.k = k;
    view.x = (x0 + x1) / 2 - w / k / 2;
    view.y = y0 + (y1 - y0) / 2 - h / k / 2;
    if (y1 - y0 > h / k) view.y = y0 - 16; // taller than the pane: its top first
    applyView();
    return true;
  }
  // The first view: all of it when it fits with readable text, else the problem (or the root)
  // at 100%. The pane first grows with the graph, up to a limit; then it is the user's to resize.
  function firstView() {
    if (!pane.style.height) pane.style.height = Math.round(Math.max(220, Math.min(720, contentH + 40))) + "px";
    const [w, h] = paneSize();
    const fitK = Math.min((w - 32) / Math.max(contentW, 1), (h - 32) / Math.max(contentH, 1));
    if (fitK >= MIN_READABLE) {
      fit();
      if (view.k > 1) { view.k = 1; view.x = (contentW - w) / 2; view.y = (contentH - h) / 2; applyView(); }
    } else if (!(model.get("diagnoses").length && centerOn(scene.focus, 1))) {
      centerOn(scene.focus.length ? scene.focus : [], 1);
      view.k = 1; view.y = -16;
      if (!scene.focus.length) view.x = (contentW - w) / 2;
      applyView();
    }
  }

  let drag = null;
  pane.addEventListener("pointerdown", (e) => {
    if (e.button !== 0) return;
    drag = { x: e.clientX, y: e.clientY, vx: view.x, vy: view.y, moved: false };
  });
  const onMove = (e) => {
    if (!drag) return;
    const dx = e.clientX - drag.x, dy = e.clientY - drag.y;
    if (!drag.moved && Math.abs(dx) + Math.abs(dy) < 4) return;
    drag.moved = true;
    pane.classList.add("ja-dragging");
    view.x = drag.vx - dx / view.k;
    view.y = drag.vy - dy / view.k;
    applyView();
  };
  const onUp = () => {
    if (drag && drag.moved) pane.dataset.justDragged = "1";
    drag = null;
    pane.classList.remove("ja-dragging");
  };
  window.addEventListener("pointermove", onMove);
  window.addEventListener("pointerup", onUp);
  pane.addEventListener("wheel", (e) => {
    if (!(e.ctrlKey || e.metaKey)) return; // a plain wheel scrolls the notebook
    e.preventDefault();
    const r = pane.getBoundingClientRect();
    zoomAt(Math.exp(-e.deltaY / 300), e.clientX - r.left, e.clientY - r.top);
  }, { passive: false });
  pane.addEventListener("keydown", (e) => {
    const step = 60 / view.k;
    const keys = { "+": () => zoomAt(1.25), "=": () => zoomAt(1.25), "-": () => zoomAt(0.8), "0": fit,
                   "1": () => zoomAt(1 / view.k), ArrowLeft: () => { view.x -= step; applyView(); },
                   ArrowRight: () => { view.x += step; applyView(); }, ArrowUp: () => { view.y -= step; applyView(); },
                   ArrowDown: () => { view.y += step; applyView(); } };
    if (keys[e.key]) { keys[e.key](); e.preventDefault(); e.stopPropagation(); }
  });
  mini.addEventListener("click", (e) => {
    e.stopPropagation();
    const r = mini.getBoundingClientRect();
    const vb = mini.viewBox.baseVal;
    const s = Math.min(r.width / vb.width, r.height / vb.height);
    const ox = (r.width - vb.width * s) / 2, oy = (r.height - vb.height * s) / 2;
    const gx = vb.x + (e.clientX - r.left - ox) / s, gy = vb.y + (e.clientY - r.top - oy) / s;
    const [w, h] = paneSize();
    view.x = gx - w / view.k / 2; view.y = gy - h / view.k / 2;
    applyView();
  });
  buttons.fit.addEventListener("click", fit);
  buttons.one.addEventListener("click", () => zoomAt(1 / view.k));
  buttons.in.addEventListener("click", () => zoomAt(1.25));
  buttons.out.addEventListener("click", () => zoomAt(0.8));
  buttons.focus.addEventListener("click", () => {
    openSet.clear();
    for (const b of scene.open) openSet.add(b);
    drawGraph();
    firstView();
  });

  // -- opening boxes, selecting nodes -------------------------------------------------------------
  function toggle(id) {
    const b = scene.boxes.get(id);
    if (!b) return;
    if (openSet.has(id) && b.laid) openSet.delete(id);
    else {
      openSet.add(id);
      if (!b.laid) { requestLayout([id]); return; }
    }
    const before = placed.get(id);
    drawGraph();
    const after = placed.get(id);
    if (before && after) { view.x += after.x - before.x; view.y += after.y - before.y; applyView(); } // keep it still
  }
  function requestLayout(ids) {
    const want = ids.filter((id) => scene.boxes.has(id) && !scene.boxes.get(id).laid);
    if (!want.length) return false;
    model.set("expanded", [...new Set([...model.get("expanded"), ...want])]);
    model.save_changes();
    return true;
  }
  pane.addEventListener("click", (event) => {
    if (pane.dataset.justDragged) { delete pane.dataset.justDragged; return; }
    const target = event.target.closest && event.target.closest("[data-id]");
    if (!target) return;
    const id = target.dataset.id;
    if (target.classList.contains("ja-box")) {
      const p = placed.get(id);
      const r = svg.getBoundingClientRect();
      const gy = view.y + (event.clientY - r.top) / view.k;
      if (p && p.open && gy > p.y + HEADER_H) return; // inside an open box, not on its title
      toggle(id);
    }
    model.set("selected", id);
    model.save_changes();
  });

  function reveal(ids) {
    const missing = [];
    for (const id of ids) {
      let p = parentOf(id);
      while (p) {
        openSet.add(p);
        if (!scene.boxes.get(p).laid) missing.push(p);
        p = parentOf(p);
      }
    }
    return missing;
  }

  function markNodes() {
    const marks = [["ja-selected", [model.get("selected")]], ["ja-highlight", model.get("highlight_nodes")],
                   ["ja-step-node", model.get("step_nodes")], ["ja-found", found.length ? [found[foundAt]] : []]];
    for (const [cls] of marks) content.querySelectorAll("." + cls).forEach((n) => n.classList.remove(cls));
    for (const [cls, ids] of marks) {
      for (const id of ids || []) {
        const s = id ? stand(id) : null;
        if (s === null) continue;
        const node = content.querySelector(`[data-id="${CSS.escape(s)}"]`);
        if (node) node.classList.add(cls);
      }
    }
  }

  // -- find ---------------------------------------------------------------------------------------
  function runFind(next) {
    const q = find.value.trim().toLowerCase();
    if (!q) { found = []; foundAt = -1; findInfo.textContent = ""; markNodes(); return; }
    if (!next || !found.length) {
      const exact = [], partial = [];
      for (const t of [...scene.boxes.values(), ...scene.items.values()]) {
        const names = [t.name || "", t.label || ""].map((s) => s.toLowerCase());
        if (names.some((s) => s === q || s.endsWith("." + q))) exact.push(t.id);
        else if (names.some((s) => s.includes(q))) partial.push(t.id);
      }
      found = [...exact, ...partial];
      foundAt = found.length ? 0 : -1;
    } else foundAt = (foundAt + 1) % found.length;
    findInfo.textContent = found.length ? `${foundAt + 1}/${found.length}` : "not found";
    if (!found.length) { markNodes(); return; }
    const id = found[foundAt];
    const missing = reveal([id]);
    if (missing.length) { pendingReveal = id; requestLayout(missing); return; }
    drawGraph();
    centerOn([id], Math.max(view.k, 1));
  }
  let findTimer = null;
  find.addEventListener("input", () => { clearTimeout(findTimer); findTimer = setTimeout(() => runFind(false), 150); });
  find.addEventListener("keydown", (e) => {
    if (e.key === "Enter") { clearTimeout(findTimer); runFind(found.length > 0 && find.value.trim() !== ""); e.preventDefault(); }
    e.stopPropagation();
  });

  // -- the other panels ----------------------------------------------------------------------------
  function drawSummary() {
    summary.textContent = model.get("summary");
    error.textContent = model.get("error") ? "The cell raised " + model.get("error").split("\n")[0] : "";
    error.style.display = model.get("error") ? "" : "none";
    const warnings = model.get("warnings") || [];
    const list = el("ul");
    for (const w of warnings) list.append(el("li", null, w));
    lost.replaceChildren(el("div", "ja-warnings-title", "The analysis is incomplete:"), list);
    lost.style.display = warnings.length ? "" : "none";
  }

  function drawDiagnoses() {
    diagList.replaceChildren();
    const items = model.get("diagnoses");
    if (!items.length) {
      diagList.append((model.get("warnings") || []).length
        ? el("div", "ja-ok ja-partial", "No problems found in what was analysed (the analysis is incomplete: see above).")
        : el("div", "ja-ok", "No problems found."));
    }
    items.forEach((d, i) => {
      const card = el("div", "ja-diagnosis ja-kind-" + d.kind);
      card.dataset.index = String(i);
      if (i === model.get("selected_diagnosis")) card.classList.add("ja-active");
      card.append(el("div", "ja-diag-title", d.title));
      const where = el("div", "ja-diag-where");
      if (d.line) where.append(el("span", "ja-line-ref", d.place + ": "), el("code", null, d.source));
      if (d.saved_line) where.append(el("br"), el("span", "ja-line-ref", d.saved_label + ": " + d.saved_place + ": "),
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

  function drawDetails() {
    details.replaceChildren();
    const d = model.get("details");
    if (!d || !d.title) {
      details.append(el("div", "ja-hint", "Click a node of the graph to inspect it; click a box to open it."));
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
      const wrap = el("div", "ja-table-wrap");
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
      wrap.append(tab);
      details.append(wrap);
    }
  }

  function drawSource() {
    source.replaceChildren();
    const hl = new Set(model.get("highlight_lines"));
    const current = model.get("current_line");
    let target = null;
    for (const { line, text } of model.get("source")) {
      const row = el("div", "ja-src-line");
      row.dataset.line = String(line);
      if (hl.has(line)) { row.classList.add("ja-src-highlight"); target = target || row; }
      if (line === current) { row.classList.add("ja-src-current"); target = row; }
      row.append(el("span", "ja-lineno", line), el("span", "ja-code", text));
      source.append(row);
    }
    source.style.display = model.get("source").length ? "" : "none";
    // Scroll the panel only, never the page.
    if (target) source.scrollTop = Math.max(0, target.offsetTop - source.offsetTop - source.clientHeight / 3);
  }

  function drawStep() {
    const n = model.get("n_steps");
    slider.max = String(Math.max(0, n - 1));
    slider.disabled = n === 0;
    const info = model.get("step_info");
    stepLabel.replaceChildren();
    if (!info || info.index === undefined) {
      slider.value = "-1";
      stepLabel.append(el("span", "ja-hint", n + " operations: move the slider to replay them."));
      return;
    }
    slider.value = String(info.index);
    stepLabel.append(el("span", "ja-step-index", "step " + (info.index + 1) + "/" + n + " "),
                     el("code", "ja-step-op", info.op),
                     el("span", "ja-line-ref", " line " + info.line + ": "), el("code", "ja-step-source", info.source));
    if (!info.grad_mode) stepLabel.append(el("span", "ja-badge", "no_grad"));
    if (info.error) stepLabel.append(el("span", "ja-badge ja-badge-error", info.error.split("\n")[0]));
    const versions = el("div", "ja-versions");
    for (const [name, version, written] of info.versions) {
      versions.append(el("span", "ja-chip" + (written ? " ja-chip-written" : ""), name + " v" + version));
    }
    stepLabel.append(versions);
  }
  slider.addEventListener("input", () => {
    model.set("step", Number(slider.value));
    model.save_changes();
  });

  function onScene() {
    scene = parseScene(model.get("scene"));
    for (const b of [...openSet]) if (!scene.boxes.has(b)) openSet.delete(b);
    drawGraph();
    if (pendingReveal !== null) {
      const id = pendingReveal;
      const missing = reveal([id]);
      if (missing.length && requestLayout(missing)) return;
      pendingReveal = null;
      drawGraph();
      centerOn([id], Math.max(view.k, 1));
    }
  }
  // Another diagnosis picked: open the way to its nodes and bring them into view.
  function onHighlight() {
    const ids = model.get("highlight_nodes").filter((id) => scene.items.has(id));
    const missing = reveal(ids);
    if (missing.length) requestLayout(missing);
    drawGraph();
    if (positioned && ids.length) centerOn(ids, Math.max(view.k, MIN_READABLE));
  }

  drawSummary();
  drawDiagnoses();
  drawGraph();
  drawDetails();
  drawStep();
  drawSource();
  // The pane has no size until it is in the page: place the first view once it has one.
  const sizeWatch = new ResizeObserver(() => {
    if (!pane.clientWidth) return;
    if (!positioned) { positioned = true; firstView(); } else applyView();
  });
  sizeWatch.observe(pane);
  model.on("change:summary", drawSummary);
  model.on("change:error", drawSummary);
  model.on("change:warnings", () => { drawSummary(); drawDiagnoses(); });
  model.on("change:diagnoses", drawDiagnoses);
  model.on("change:selected_diagnosis", drawDiagnoses);
  model.on("change:scene", onScene);
  model.on("change:selected", markNodes);
  model.on("change:highlight_nodes", onHighlight);
  model.on("change:step_nodes", markNodes);
  model.on("change:details", drawDetails);
  model.on("change:step_info", drawStep);
  model.on("change:n_steps", drawStep);
  model.on("change:highlight_lines", drawSource);
  model.on("change:current_line", drawSource);
  model.on("change:source", drawSource);
  return () => {
    sizeWatch.disconnect();
    window.removeEventListener("pointermove", onMove);
    window.removeEventListener("pointerup", onUp);
  };
}

export default { render };
