// Front end of AutogradWidget. Python sends the scene (items, module boxes, the rows of each box
// laid out, the route points of long edges, edges with the shapes they carry) as plain lists,
// with its geometry: the size of every node and box (closed, and its title's width open, room
// for the gradient-health bar included) and the numbers to place and draw them with
// (scene.geometry; render/layout/sizes.py). This file has no sizing rules of its own: it places
// those sizes in rows as render/layout/geometry.py's `place` does, draws them as SVG elements,
// opens and closes boxes, zooms and pans (the viewBox), finds names, all without the kernel. It
// sets four inputs: `selected` (a click on a node), `selected_diagnosis`, `step`, and `expanded`
// (a box opened that Python has not laid out yet). Every string goes into the page with
// textContent.
//
// The first screen shows the problem: the pane is as tall as the screen has room for, and the
// view starts at 100% (the smallest text at 11 px) on the problem's nodes, with as much of the
// way up to the loss as fits, off the overview map, no node cut by the pane's edges
// (render/layout/view.py's first_view does the same). Nothing is drawn over a node: an open
// box's title stays in its own bar (the boxes the view is inside are named above the pane), and
// the overview map moves to another corner rather than cover the problem.

const SVG = "http://www.w3.org/2000/svg";
const ROUTE = "~"; // the prefix of route points' ids
const LEGEND = [["tensor", "named result"], ["fn", "backward op"], ["leaf", "parameter (gets .grad)"],
                ["saved", "tensor saved for backward"], ["write", "the line that broke it"],
                ["cut", "the line that cut the chain"], ["fold", "other iterations"],
                ["box", "module / line: click to open"], ["path", "way to the loss"],
                ["shape", "shape of the gradient"], ["health", "gradient health (red: flagged)"]];

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

// Prose wraps at spaces; code lines (indented by four) stay whole and scroll sideways.
function fixBlock(text) {
  const out = el("div", "ja-fix-body");
  let code = null;
  for (const line of String(text).split("\n")) {
    if (line.startsWith("    ")) {
      if (!code) { code = el("pre", "ja-fix-code"); out.append(code); code.textContent = line.slice(4); }
      else code.textContent += "\n" + line.slice(4);
      continue;
    }
    code = null;
    const para = el("div", "ja-fix-text");
    line.split("`").forEach((part, i) => { if (part) para.append(i % 2 ? inlineCode(part) : document.createTextNode(part)); });
    out.append(para);
  }
  return out;
}

// Inline code may break after a dot, an opening bracket or a comma (a long dotted name), never
// elsewhere where it can help it; so may a line of the source panel.
function inlineCode(text, tag = "code", cls = null) {
  const code = el(tag, cls);
  text.split(/(?<=[.(\[,])/).forEach((piece, i) => {
    if (i) code.append(el("wbr"));
    code.append(document.createTextNode(piece));
  });
  return code;
}

// The wire format of layout.Scene.to_json: each item with its size, each box with its size closed,
// its title's width open and whether it has a health bar; the rows of each box laid out.
function parseScene(raw) {
  const items = new Map(), boxes = new Map();
  for (const [id, kind, label, sub, parent, name, problem, w, h] of raw.items || []) {
    items.set(id, { id, kind, label, sub, parent, name, problem: !!problem, w, h });
  }
  for (const [id, kind, label, sub, parent, name, count, laid, w, h, titleW, badge] of raw.boxes || []) {
    boxes.set(id, { id, kind, label, sub, parent, name, count, laid: !!laid, w, h, titleW, badge: !!badge });
  }
  const routes = new Map();
  for (const [box, list] of Object.entries(raw.routes || {})) {
    for (const [u, v, chain] of list) routes.set(u + "\u0000" + v, chain);
  }
  return { items, boxes, rows: raw.rows || {}, edges: raw.edges || [], open: raw.open || [], routes,
           core: raw.core || [], focus: raw.focus || [], path: raw.path || [], note: raw.note || "",
           names: raw.names || [], geometry: raw.geometry || {} };
}

// Where a window of `size` starts along one axis (render/layout/view.py's snap): the point nearest
// `want`, within [lo, hi], not below `floor`, at which neither of its edges falls inside a span or
// `clear` from it; else the same within `room` more; else, there, the one cutting the fewest spans.
function snap(want, lo, hi, size, spans, floor, clear, room) {
  const near = spans.map(([a, b]) => [a - clear, b + clear]);
  const cuts = near.concat(near.map(([a, b]) => [a - size, b - size]));
  const starts = cuts.map((c) => c[0]).sort((p, q) => p - q), ends = cuts.map((c) => c[1]).sort((p, q) => p - q);
  // how many (a, b) hold c: those starting before it less those ended by it (binary searches)
  const below = (list, c, orEqual) => {
    let l = 0, h = list.length;
    while (l < h) { const m = (l + h) >> 1; if (list[m] < c || (orEqual && list[m] === c)) l = m + 1; else h = m; }
    return l;
  };
  const cut = (c) => below(starts, c, false) - below(ends, c, true);
  const byDistance = (p, q) => Math.abs(p - want) - Math.abs(q - want) || p - q;
  function candidates(l, h) {
    l = Math.max(l, floor);
    if (l > h) { l = Math.max(want, floor); h = l; }
    const out = new Set([Math.min(Math.max(want, l), h), l, h]);
    for (const [a, b] of cuts) for (const p of [a, b]) if (l <= p && p <= h) out.add(p);
    return [...out].sort(byDistance);
  }
  for (const extra of [0, room]) for (const c of candidates(lo - extra, hi + extra)) if (!cut(c)) return c;
  return candidates(lo - room, hi + room).sort((p, q) => cut(p) - cut(q) || byDistance(p, q))[0];
}

// How tall the part of the page is that the notebook shows at once: its scrolling panel (the
// outermost ancestor that scrolls: an output area may scroll too), within the window.
function visibleHeight(node) {
  let scroller = null;
  for (let p = node.parentElement; p && p !== document.body; p = p.parentElement) {
    const oy = getComputedStyle(p).overflowY;
    if (oy === "auto" || oy === "scroll") scroller = p;
  }
  const inner = window.innerHeight || 800;
  if (!scroller) return inner;
  const r = scroller.getBoundingClientRect();
  return Math.max(200, Math.min(r.bottom, inner) - Math.max(r.top, 0));
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
  const title = el("div", "ja-title");
  const summaryBox = el("details", "ja-summary");
  const summaryHead = el("summary", "ja-summary-head");
  const summaryRest = el("div", "ja-summary-rest");
  summaryBox.append(summaryHead, summaryRest);
  header.append(title, summaryBox);
  const error = el("div", "ja-error");
  const lost = el("div", "ja-warnings"); // what a failed part of the analysis lost
  const errorText = el("span", "ja-error-text"), errorWhy = el("span", "ja-error-why");
  error.append(errorText, errorWhy);
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
  for (const [key, label, tip] of [["fit", "Fit", "the whole graph, or the problem's neighbourhood where the whole is too large (key 0)"],
                                   ["one", "100%", "actual size (key 1)"],
                                   ["in", "+", "zoom in (key +)"], ["out", "\u2212", "zoom out (key -)"],
                                   ["focus", "Problem", "back to the first view"]]) {
    const b = el("button", "ja-btn ja-btn-" + key, label);
    b.type = "button";
    b.title = tip;
    buttons[key] = b;
  }
  // The open boxes the view is inside, whose titles are above it: named here, never over the graph.
  const crumbs = el("span", "ja-crumbs");
  toolbar.append(find, findInfo, buttons.fit, buttons.one, buttons.in, buttons.out, buttons.focus, crumbs);
  const legend = el("div", "ja-legend");
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
  graphCol.append(toolbar, legend, note, pane);
  const side = el("div", "ja-side");
  const sourceBox = el("div", "ja-source-box");
  const sourceTabs = el("div", "ja-source-tabs");
  const source = el("div", "ja-source");
  sourceBox.append(sourceTabs, source);
  const details = el("div", "ja-details");
  side.append(sourceBox, details);
  main.append(graphCol, side);
  const timeline = el("div", "ja-timeline");
  const timeHead = el("div", "ja-time-head");
  const iterPrev = el("button", "ja-btn ja-iter-prev", "\u2039"), iterNext = el("button", "ja-btn ja-iter-next", "\u203a");
  iterPrev.type = iterNext.type = "button";
  iterPrev.title = "the iteration before"; iterNext.title = "the next iteration";
  const iterLabel = el("span", "ja-iter-label");
  const iterBox = el("span", "ja-iter");
  iterBox.append(iterPrev, iterLabel, iterNext);
  const slider = el("input", "ja-slider");
  slider.type = "range";
  slider.min = "0"; // one slider over every step of the block: its thumb is where the label says
  slider.value = "0";
  slider.setAttribute("aria-label", "step of the timeline");
  for (const focusable of [find, pane, slider]) focusable.setAttribute("data-lm-suppress-shortcuts", "true");
  const stepLabel = el("div", "ja-step");
  timeHead.append(el("span", "ja-caption", "timeline"), iterBox, slider);
  timeline.append(timeHead, stepLabel);
  root.append(header, lost, error, diagList, main, timeline);

  // -- the scene and what is open ------------------------------------------------------------------
  let scene = parseScene(model.get("scene"));
  let G = scene.geometry; // the numbers to place and draw with (render/layout/sizes.py)
  const openSet = new Set(scene.open);
  let placed = new Map();
  let contentW = 1, contentH = 1;
  const view = { x: 0, y: 0, k: 1 };
  let positioned = false;
  let pendingReveal = null;
  let found = [], foundAt = -1;
  let titles = [], crumbKey = "";
  const health = model.get("grad_health") || {};

  function isBox(id) { return scene.boxes.has(id); }
  function parentOf(id) {
    const t = scene.items.get(id) || scene.boxes.get(id);
    return t ? t.parent : null;
  }
  function isOpen(id) { const b = scene.boxes.get(id); return !!(b && b.laid && openSet.has(id)); }
  function rows(box) { return scene.rows[box] || []; }
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
  function ancestry(id) { const out = [id]; for (let p = parentOf(id); p; p = parentOf(p)) out.push(p); return out; }

  // Where everything shown goes (render/layout/geometry.py's place, over the same sizes and rows):
  // a box's rows centred in it, gap_x apart in a row, gap_y between rows; an open box is its title
  // bar over its contents with pad around them, as wide as the wider of the two.
  function place() {
    const sizes = new Map();
    placed = new Map();
    function size(id) {
      if (sizes.has(id)) return sizes.get(id);
      let s;
      const it = scene.items.get(id);
      if (id.startsWith(ROUTE)) s = [G.route_w, 0];
      else if (it) s = [it.w, it.h];
      else {
        const b = scene.boxes.get(id);
        if (isOpen(id)) {
          const [w, h] = contentSize(id);
          s = [Math.max(w + 2 * G.pad, b.titleW), h + G.header_h + 2 * G.pad];
        } else s = [b.w, b.h];
      }
      sizes.set(id, s);
      return s;
    }
    function contentSize(box) {
      let w = 0, h = 0;
      for (const r of rows(box)) {
        w = Math.max(w, r.reduce((a, c) => a + size(c)[0], 0) + G.gap_x * (r.length - 1));
        h += Math.max(...r.map((c) => size(c)[1])) + G.gap_y;
      }
      return [w, Math.max(0, h - G.gap_y)];
    }
    function put(box, x0, y0, width) {
      let y = y0;
      for (const r of rows(box)) {
        const rowW = r.reduce((a, c) => a + size(c)[0], 0) + G.gap_x * (r.length - 1);
        const rowH = Math.max(...r.map((c) => size(c)[1]));
        let x = x0 + (width - rowW) / 2;
        for (const c of r) {
          const [w, h] = size(c);
          if (c.startsWith(ROUTE)) placed.set(c, { x, y, w, h: rowH, route: true });
          else {
            const open = isOpen(c);
            placed.set(c, { x, y, w, h, box: isBox(c), open });
            if (open) put(c, x + G.pad, y + G.header_h + G.pad, w - 2 * G.pad);
          }
          x += w + G.gap_x;
        }
        y += rowH + G.gap_y;
      }
    }
    [contentW, contentH] = contentSize("");
    put("", 0, 0, contentW);
  }

  // The route points of the edge from the drawn thing a down to b (layout.route_of): out of each
  // open box holding a, between the two siblings holding them, into each open box holding b.
  function routeOf(a, b) {
    const upA = ancestry(a), upB = ancestry(b);
    const inB = new Set(upB);
    const i = upA.findIndex((x) => !parentOf(x) || inB.has(parentOf(x)));
    if (i < 0) return [];
    const parent = parentOf(upA[i]) || "";
    const j = upB.findIndex((y) => (parentOf(y) || "") === parent);
    if (j < 0) return [];
    const lane = (u, v) => scene.routes.get(u + "\u0000" + v) || [];
    const chain = [];
    for (const x of upA.slice(0, i)) chain.push(...lane(x, ""));
    chain.push(...lane(upA[i], upB[j]));
    for (const y of upB.slice(0, j).reverse()) chain.push(...lane("", y));
    return chain;
  }
  function edgePoints(a, b, ida, idb) {
    const pts = [[a.x + a.w / 2, a.y + a.h]];
    for (const r of routeOf(ida, idb)) {
      const p = placed.get(r);
      if (p) pts.push([p.x + p.w / 2, p.y], [p.x + p.w / 2, p.y + p.h]);
    }
    pts.push([b.x + b.w / 2, b.y]);
    return pts;
  }
  function curve(pts) {
    let d = `M${pts[0][0]} ${pts[0][1]}`;
    for (let i = 1; i < pts.length; i++) {
      const [xa, ya] = pts[i - 1], [xb, yb] = pts[i];
      if (xa === xb || yb <= ya) d += `L${xb} ${yb}`;
      else { const dy = Math.max(6, (yb - ya) / 2); d += `C${xa} ${ya + dy} ${xb} ${yb - dy} ${xb} ${yb}`; }
    }
    return d;
  }

  // Shapes on edges, where they fit: in the gap between two rows, clear of nodes and of each other.
  function shapeLabels(edges) {
    const cell = 120, grid = new Map();
    const key = (x, y) => Math.floor(x / cell) + ":" + Math.floor(y / cell);
    function add(r) {
      for (let gx = Math.floor(r[0] / cell); gx <= Math.floor(r[2] / cell); gx++) {
        for (let gy = Math.floor(r[1] / cell); gy <= Math.floor(r[3] / cell); gy++) {
          const k = gx + ":" + gy;
          if (!grid.has(k)) grid.set(k, []);
          grid.get(k).push(r);
        }
      }
    }
    function free(r) {
      for (let gx = Math.floor(r[0] / cell); gx <= Math.floor(r[2] / cell); gx++) {
        for (let gy = Math.floor(r[1] / cell); gy <= Math.floor(r[3] / cell); gy++) {
          for (const o of grid.get(gx + ":" + gy) || []) {
            if (r[0] < o[2] && o[0] < r[2] && r[1] < o[3] && o[1] < r[3]) return false;
          }
        }
      }
      return true;
    }
    for (const [id, p] of placed) if (!p.route && !(p.box && p.open)) add([p.x, p.y, p.x + p.w, p.y + p.h]);
    for (const [id, p] of placed) if (p.box && p.open) add([p.x, p.y, p.x + p.w, p.y + G.header_h]);
    const out = [];
    for (const { pts, shape, shapeW } of edges) {
      if (!shape) continue;
      // the segment that leaves the upper node: the gap under it
      const [x1, y1] = pts[0], [x2, y2] = pts[1];
      if (y2 - y1 < 20) continue;
      const w = shapeW, h = G.edge_label_h;
      const x = (x1 + x2) / 2 + 4, y = y1 + Math.min(18, (y2 - y1) / 2) - h / 2;
      const r = [x - 2, y, x + w, y + h];
      if (!free(r)) continue;
      add(r);
      out.push([x, y + h - 3, shape]);
    }
    return out;
  }

  function drawGraph() {
    const started = performance.now();
    place();
    const boxLayer = sv("g", { class: "ja-boxes" });
    const edgeLayer = sv("g", { class: "ja-edges" });
    const labelLayer = sv("g", { class: "ja-edge-labels" });
    const nodeLayer = sv("g", { class: "ja-nodes" });
    const titleLayer = sv("g", { class: "ja-titles" });
    titles = [];
    crumbKey = null;
    const healthy = Object.values(health).map((h) => h[0]).filter((v) => v > 0).map(Math.log10);
    const lo = Math.min(...healthy, 0), hi = Math.max(...healthy, lo + 1);
    for (const [id, p] of placed) {
      if (!p.box) continue;
      const b = scene.boxes.get(id);
      const g = sv("g", { class: "ja-box" + (p.open ? " ja-open" : " ja-closed") + " ja-box-" + b.kind });
      g.dataset.id = id;
      g.append(sv("title", {}, (b.name || b.label) + (b.sub ? " (" + b.sub + ")" : "") +
                               (p.open ? ": click the title to close" : ": click to open")));
      g.append(sv("rect", { x: p.x, y: p.y, width: p.w, height: p.h, rx: 6, class: "ja-box-rect" }));
      let titleGroup = null;
      if (p.open) {
        g.append(sv("rect", { x: p.x, y: p.y, width: p.w, height: G.header_h, rx: 6, class: "ja-box-header" }));
        // The title is drawn above the contents, in its own bar (nothing of the box's is under it);
        // its text slides along the bar to stay in sight.
        const t = sv("g", { class: "ja-box-title" });
        t.dataset.id = id;
        const bg = sv("rect", { x: p.x, y: p.y, width: p.w, height: G.header_h, rx: 6, class: "ja-title-bg" });
        const label = sv("text", { x: p.x + G.text_x, y: p.y + G.title_y, class: "ja-box-label" }, "\u2212 " + b.label);
        label.append(sv("tspan", { class: "ja-box-sub" }, "  " + b.sub));
        t.append(sv("title", {}, (b.name || b.label) + ": click to close"), bg, label);
        titleLayer.append(t);
        titleGroup = t;
        titles.push({ id, p, b, label, depth: ancestry(id).length });
      } else {
        g.append(sv("text", { x: p.x + G.text_x, y: p.y + G.box_label_y, class: "ja-box-label" }, "+ " + b.label));
        g.append(sv("text", { x: p.x + G.text_x, y: p.y + G.box_sub_y, class: "ja-box-sub" }, b.sub));
      }
      const h = b.badge ? health[b.name] : null;
      if (h) { // in the room the scene's size keeps for it, at the right of the label's line
        const [, barW, barH, right, top] = G.badge;
        const flagged = h[1] && h[1].length;
        const frac = h[0] > 0 ? Math.max(0.08, (Math.log10(h[0]) - lo) / (hi - lo)) : 0;
        const bar = sv("g", { class: "ja-health" + (flagged ? " ja-health-flagged" : "") });
        const bx = p.x + p.w - right - barW, by = p.y + top;
        bar.append(sv("title", {}, h[2]), sv("rect", { x: bx, y: by, width: barW, height: barH, rx: 2, class: "ja-health-track" }),
                   sv("rect", { x: bx, y: by, width: Math.max(2, barW * frac), height: barH, rx: 2, class: "ja-health-bar" }));
        if (flagged) bar.append(sv("text", { x: bx - 3, y: by + barH, class: "ja-health-mark" }, "!"));
        (titleGroup || g).append(bar);
      }
      boxLayer.append(g);
    }
    const pathPairs = new Set();
    const pathStands = scene.path.map(stand).filter((s) => s !== null);
    for (let i = 0; i + 1 < pathStands.length; i++) pathPairs.add(pathStands[i] + "\u0000" + pathStands[i + 1]);
    const seen = new Set(), drawn = [];
    for (const [u, v, kind, shape, shapeW] of scene.edges) {
      const a = stand(u), b = stand(v);
      if (a === null || b === null || a === b) continue;
      const key = a + "\u0000" + b;
      if (seen.has(key)) continue;
      seen.add(key);
      const pa = placed.get(a), pb = placed.get(b);
      if (!pa || !pb) continue;
      const pts = pb.y > pa.y ? edgePoints(pa, pb, a, b) : null;
      const d = pts ? curve(pts) : sideways(pa, pb);
      const cls = "ja-edge ja-edge-" + kind + (pathPairs.has(key) ? " ja-path" : "");
      edgeLayer.append(sv("path", { d, class: cls, "marker-end": `url(#${uid}-arrow)` }));
      if (pts && kind === "next") drawn.push({ pts, shape, shapeW });
    }
    for (const [x, y, text] of shapeLabels(drawn)) labelLayer.append(sv("text", { x, y, class: "ja-edge-label" }, text));
    for (const [id, p] of placed) {
      if (p.box || p.route) continue;
      const it = scene.items.get(id);
      const g = sv("g", { class: "ja-node ja-kind-" + it.kind + (it.problem ? " ja-problem" : "") });
      g.dataset.id = id;
      g.append(sv("title", {}, it.name && it.name !== it.label ? it.name : it.label + (it.sub ? " (" + it.sub + ")" : "")));
      g.append(sv("rect", { x: p.x, y: p.y, width: p.w, height: p.h, rx: it.kind === "leaf" ? 10 : 3, class: "ja-node-rect" }));
      g.append(sv("text", { x: p.x + p.w / 2, y: p.y + G.label_y, class: "ja-node-label" }, it.label));
      if (it.sub) g.append(sv("text", { x: p.x + p.w / 2, y: p.y + G.sub_y, class: "ja-node-sub" }, it.sub));
      nodeLayer.append(g);
    }
    content.replaceChildren(boxLayer, edgeLayer, labelLayer, nodeLayer, titleLayer);
    note.textContent = placed.size ? scene.note : "No autograd graph was recorded: nothing in the block required grad.";
    note.style.display = note.textContent ? "" : "none";
    drawLegend();
    markNodes();
    applyView();
    const ms = performance.now() - started;
    root.dataset.renderMs = ms.toFixed(1);
    if (!root.dataset.firstRenderMs) root.dataset.firstRenderMs = ms.toFixed(1);
  }
  function sideways(a, b) {
    const right = b.x > a.x;
    return `M${right ? a.x + a.w : a.x} ${a.y + a.h / 2}L${right ? b.x : b.x + b.w} ${b.y + b.h / 2}`;
  }

  function drawLegend() {
    const kinds = new Set([...scene.items.values()].map((x) => x.kind));
    if (scene.boxes.size) kinds.add("box");
    if (scene.path.length) kinds.add("path");
    if (scene.edges.some((e) => e[3])) kinds.add("shape");
    if (Object.keys(health).length) kinds.add("health");
    legend.replaceChildren();
    for (const [kind, text] of LEGEND) {
      if (!kinds.has(kind)) continue;
      const entry = el("span", "ja-legend-entry ja-legend-" + kind);
      entry.append(el("span", "ja-swatch"), document.createTextNode(text));
      legend.append(entry);
    }
  }

  // -- zoom and pan: the viewBox -------------------------------------------------------------------
  function paneSize() { return [pane.clientWidth || 800, pane.clientHeight || 480]; }
  function overview() {
    const [w, h] = paneSize();
    return contentH * view.k > h * 1.05 || contentW * view.k > w * 1.05;
  }
  function applyView() {
    const [w, h] = paneSize();
    svg.setAttribute("viewBox", `${view.x} ${view.y} ${w / view.k} ${h / view.k}`);
    root.dataset.zoom = view.k.toFixed(3);
    svg.classList.toggle("ja-no-text", view.k < G.text_zoom);
    const shown = overview();
    if (shown) {
      const m = 8;
      mini.setAttribute("viewBox", `${-m} ${-m} ${contentW + 2 * m} ${contentH + 2 * m}`);
      miniView.setAttribute("x", view.x); miniView.setAttribute("y", view.y);
      miniView.setAttribute("width", w / view.k); miniView.setAttribute("height", h / view.k);
    }
    placeMinimap(shown);
    followTitles();
  }
  // The overview map sits in a corner of the pane: the bottom right one, else the first corner
  // where it covers none of the problem's nodes (nor the one selected); hidden where every corner would.
  function placeMinimap(shown) {
    const [mw, mh, inset] = G.minimap || [0, 0, 0];
    const [w, h] = paneSize();
    const ids = new Set([...scene.core, ...(model.get("highlight_nodes") || []), model.get("selected")]);
    const keep = [];
    for (const id of ids) {
      const s = id ? stand(id) : null;
      const p = s === null ? null : placed.get(s);
      if (p) keep.push([(p.x - view.x) * view.k, (p.y - view.y) * view.k, (p.x + p.w - view.x) * view.k, (p.y + p.h - view.y) * view.k]);
    }
    let corner = null;
    if (shown) {
      for (const [right, bottom] of [[true, true], [false, true], [true, false], [false, false]]) {
        const x = right ? w - inset - mw : inset, y = bottom ? h - inset - mh : inset;
        if (keep.every((r) => r[2] <= x || x + mw <= r[0] || r[3] <= y || y + mh <= r[1])) { corner = [right, bottom]; break; }
      }
    }
    mini.style.display = corner ? "" : "none";
    if (!corner) return;
    mini.style.width = mw + "px"; mini.style.height = mh + "px";
    mini.style.left = corner[0] ? "" : inset + "px"; mini.style.right = corner[0] ? inset + "px" : "";
    mini.style.top = corner[1] ? "" : inset + "px"; mini.style.bottom = corner[1] ? inset + "px" : "";
  }
  // An open box's title stays in its bar; its text slides along the bar to stay in sight when the
  // box's left edge is out of view. The open boxes whose bars are above the view, while the view
  // is inside them, are named above the pane (never drawn over the graph).
  function followTitles() {
    const [w, h] = paneSize();
    const vw = w / view.k;
    const inside = [];
    for (const t of titles) {
      const { p, b, label } = t;
      const x = Math.max(p.x + G.text_x, Math.min(view.x + G.text_x / view.k, p.x + p.w - b.titleW + G.text_x));
      label.setAttribute("x", x);
      if (p.y < view.y && p.y + p.h > view.y + G.header_h / view.k && p.x < view.x + vw && p.x + p.w > view.x) inside.push(t);
    }
    inside.sort((a, b) => a.depth - b.depth);
    const key = inside.map((t) => t.id).join("\u0000");
    if (key === crumbKey) return;
    crumbKey = key;
    crumbs.replaceChildren();
    if (!inside.length) return;
    crumbs.append(el("span", "ja-crumbs-head", "in"));
    for (const t of inside) {
      const c = el("button", "ja-crumb", t.b.label);
      c.type = "button";
      c.title = (t.b.name || t.b.label) + ": show its title";
      c.addEventListener("click", () => { view.y = t.p.y - G.margin / view.k; applyView(); });
      crumbs.append(c);
    }
  }
  function zoomAt(factor, px, py) {
    const [w, h] = paneSize();
    if (px === undefined) { px = w / 2; py = h / 2; }
    const k = Math.max(G.min_zoom, Math.min(G.max_zoom, view.k * factor));
    const gx = view.x + px / view.k, gy = view.y + py / view.k;
    view.k = k;
    view.x = gx - px / k;
    view.y = gy - py / k;
    applyView();
  }
  // The view nearest (x, y) with no node or closed box cut by its edges, `keep` inside it with the
  // margin, x or y not below `least` (render/layout/view.py's uncut).
  function uncut(keep, x, y, vw, vh, least) {
    const M = G.margin, clear = G.cut_margin;
    const solid = [...placed.values()].filter((p) => !p.route && !(p.box && p.open));
    const floorX = least && least[0] === "x" ? least[1] : -Infinity, floorY = least && least[0] === "y" ? least[1] : -Infinity;
    for (const axis of ["x", "y", "x"]) {
      if (axis === "x") {
        const spans = solid.filter((p) => p.y < y + vh && y < p.y + p.h).map((p) => [p.x, p.x + p.w]);
        x = snap(x, keep[2] + M - vw, keep[0] - M, vw, spans, floorX, clear, M);
      } else {
        const spans = solid.filter((p) => p.x < x + vw && x < p.x + p.w).map((p) => [p.y, p.y + p.h]);
        y = snap(y, keep[3] + M - vh, keep[1] - M, vh, spans, floorY, clear, M);
      }
    }
    return [x, y];
  }
  // Fit: the whole graph, down to fit_min_zoom (a map of it); where it is larger, the problem's
  // neighbourhood (its nodes, the way to the loss, what is around them) as large as fits, at 100%
  // at most; no node cut by the pane's edges.
  function fit() {
    const [w, h] = paneSize();
    const M = G.margin;
    const whole = Math.min(G.fit_max_zoom, (w - 2 * M) / Math.max(contentW, 1), (h - 2 * M) / Math.max(contentH, 1));
    if (whole >= G.fit_min_zoom) {
      view.k = whole;
      view.x = (contentW - w / whole) / 2; view.y = (contentH - h / whole) / 2;
      applyView();
      return;
    }
    const box = rectOf([...scene.core, ...scene.path, ...scene.focus]) || [0, 0, contentW, contentH];
    view.k = Math.max(G.fit_min_zoom, Math.min(G.readable_zoom, (w - 2 * M) / Math.max(box[2] - box[0], 1),
                                               (h - 2 * M) / Math.max(box[3] - box[1], 1)));
    const vw = w / view.k, vh = h / view.k;
    const fits = box[2] - box[0] <= vw - 2 * M && box[3] - box[1] <= vh - 2 * M;
    const keep = fits ? box : (rectOf(scene.core.slice(0, 1)) || box);
    [view.x, view.y] = uncut(keep, (keep[0] + keep[2]) / 2 - vw / 2, fits ? (box[1] + box[3]) / 2 - vh / 2 : keep[1] - M, vw, vh, null);
    applyView();
  }
  function rectOf(ids) {
    const rs = ids.map((id) => stand(id)).filter((s) => s !== null).map((s) => placed.get(s)).filter(Boolean);
    if (!rs.length) return null;
    return [Math.min(...rs.map((r) => r.x)), Math.min(...rs.map((r) => r.y)),
            Math.max(...rs.map((r) => r.x + r.w)), Math.max(...rs.map((r) => r.y + r.h))];
  }
  function centerOn(ids, k) {
    const [w, h] = paneSize();
    const box = rectOf(ids);
    if (!box) return false;
    view.k = k;
    const vw = w / k, vh = h / k;
    let x = (box[0] + box[2]) / 2 - vw / 2, y = (box[1] + box[3]) / 2 - vh / 2;
    if (box[3] - box[1] > vh) y = box[1] - G.margin; // taller than the pane: its top first
    else if (box[2] - box[0] <= vw - 2 * G.margin) [x, y] = uncut(box, x, y, vw, vh, null);
    view.x = x; view.y = y;
    applyView();
    return true;
  }
  // The pane's height: the graph's, up to what the screen has room for under the widget's top
  // part (the diagnosis): the problem must be on the first screen, not below it.
  function sizePane() {
    if (pane.dataset.userSized) return;
    const above = pane.getBoundingClientRect().top - root.getBoundingClientRect().top;
    const room = visibleHeight(root) - above - 28;
    pane.style.height = Math.round(Math.max(260, Math.min(room, contentH + 2 * G.margin))) + "px";
  }
  // Off the overview map in the bottom right corner: (x, y) moved left or up if it must, and what
  // keeps it clear (render/layout/view.py's _clear_of_minimap).
  function clearOfMinimap(box, x, y, vw, vh, k) {
    const [mw, mh, inset, gap] = G.minimap;
    const mapX = vw - (mw + inset + gap) / k, mapY = vh - (mh + inset + gap) / k;
    const right = box[2] - x, bottom = box[3] - y;
    if (right <= mapX) return [x, y, ["x", box[2] - mapX]];
    if (bottom <= mapY) return [x, y, ["y", box[3] - mapY]];
    if (box[0] - x - (right - mapX) >= G.margin / k) return [x + (right - mapX), y, ["x", box[2] - mapX]];
    if (box[1] - y - (bottom - mapY) >= G.margin / k) return [x, y + (bottom - mapY), ["y", box[3] - mapY]];
    return [x, y, null];
  }
  // The first view (render/layout/view.py's first_view): all of it when it fits at 100%; else at
  // 100% the core, then the path to the root and the focus as far as they fit, off the overview
  // map, no node cut by the pane's edges.
  function firstView() {
    sizePane();
    const [w, h] = paneSize();
    const M = G.margin, k = G.readable_zoom, vw = w / k, vh = h / k;
    view.k = k;
    if (contentW <= w - 2 * M && contentH <= h - 2 * M) {
      view.x = (contentW - vw) / 2; view.y = (contentH - vh) / 2;
      applyView();
      return;
    }
    const fits = (r) => r[2] - r[0] <= vw - 2 * M && r[3] - r[1] <= vh - 2 * M;
    const core = rectOf(scene.core.slice(0, 1));
    let box = core;
    if (box) {
      for (const [group, strict] of [[scene.core.slice(1), true], [scene.path.slice().reverse(), true], [scene.focus, false]]) {
        for (const id of group) {
          const more = rectOf([id]);
          if (!more) continue;
          const grown = [Math.min(box[0], more[0]), Math.min(box[1], more[1]), Math.max(box[2], more[2]), Math.max(box[3], more[3])];
          if (fits(grown)) box = grown;
          else if (strict) break;
        }
      }
    } else {
      const top = rectOf(scene.focus) || [0, 0, contentW, 0];
      box = [top[0], 0, top[2], Math.min(contentH, vh - 2 * M)];
    }
    let x = (box[0] + box[2]) / 2 - vw / 2, y = (box[1] + box[3]) / 2 - vh / 2, keep;
    if (fits(box)) {
      x = contentW + 2 * M > vw ? Math.min(Math.max(x, -M), Math.max(-M, contentW + M - vw)) : (contentW - vw) / 2;
      x = Math.max(Math.min(x, box[0] - M), box[2] + M - vw);
      y = contentH + 2 * M > vh ? Math.min(Math.max(y, -M), Math.max(-M, contentH + M - vh)) : (contentH - vh) / 2;
      y = Math.max(Math.min(y, box[1] - M), box[3] + M - vh);
      keep = box;
    } else {
      y = box[1] - M;
      keep = core || box;
    }
    let least;
    [x, y, least] = clearOfMinimap(box, x, y, vw, vh, k);
    [view.x, view.y] = uncut(keep, x, y, vw, vh, least);
    applyView();
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
  // A pane the user resized keeps its height.
  pane.addEventListener("pointerup", () => {
    if (positioned && pane.style.height && Math.abs(pane.offsetHeight - parseFloat(pane.style.height)) > 2) {
      pane.dataset.userSized = "1";
    }
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
    root.dataset.ready = "0";
    model.set("expanded", [...new Set([...model.get("expanded"), ...want])]);
    model.save_changes();
    return true;
  }
  pane.addEventListener("click", (event) => {
    if (pane.dataset.justDragged) { delete pane.dataset.justDragged; return; }
    const target = event.target.closest && event.target.closest("[data-id]");
    if (!target) return;
    const id = target.dataset.id;
    if (target.classList.contains("ja-box-title")) toggle(id);
    else if (target.classList.contains("ja-box")) {
      const p = placed.get(id);
      if (p && p.open) return; // inside an open box, not on its title
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
    placeMinimap(overview()); // off the node just selected too
  }

  // -- find ---------------------------------------------------------------------------------------
  function runFind(next) {
    const q = find.value.trim().toLowerCase();
    if (!q) { found = []; foundAt = -1; findInfo.textContent = ""; markNodes(); return; }
    if (!next || !found.length) {
      const exact = [], partial = [];
      const candidates = [...scene.boxes.values(), ...scene.items.values()].map((t) => [t.id, [t.name || "", t.label || ""]]);
      for (const [name, target] of scene.names) candidates.push([target, [name]]);
      for (const [id, names] of candidates) {
        const lower = names.map((s) => s.toLowerCase());
        if (lower.some((s) => s === q || s.endsWith("." + q))) exact.push(id);
        else if (lower.some((s) => s.includes(q))) partial.push(id);
      }
      found = [...new Set([...exact, ...partial])];
      foundAt = found.length ? 0 : -1;
    } else foundAt = (foundAt + 1) % found.length;
    findInfo.textContent = found.length ? `${foundAt + 1}/${found.length}` : "not found";
    if (!found.length) { markNodes(); return; }
    const id = found[foundAt];
    const missing = reveal([id]);
    if (missing.length) { pendingReveal = id; requestLayout(missing); return; }
    drawGraph();
    centerOn([id], Math.max(view.k, G.readable_zoom));
  }
  let findTimer = null;
  find.addEventListener("input", () => { clearTimeout(findTimer); findTimer = setTimeout(() => runFind(false), 150); });
  find.addEventListener("keydown", (e) => {
    if (e.key === "Enter") { clearTimeout(findTimer); runFind(found.length > 0 && find.value.trim() !== ""); e.preventDefault(); }
    e.stopPropagation();
  });

  // -- the other panels ----------------------------------------------------------------------------
  function drawSummary() {
    const n = model.get("diagnoses").length;
    const partial = (model.get("warnings") || []).length > 0; // never "no problems" beside a failed analysis
    title.textContent = "jupyter-autograd: " + (n ? n + (n === 1 ? " problem" : " problems") + " found"
      : partial ? "no problems found in what was analysed (the analysis is incomplete)" : "no problems found");
    const lines = model.get("summary").split("\n");
    summaryHead.textContent = lines[0] || "";
    summaryRest.textContent = lines.slice(1).join("\n");
    summaryBox.classList.toggle("ja-no-more", lines.length < 2);
    // Said once: the first line of the cell's error, which the diagnosis explains; the traceback
    // under the widget has the whole message.
    const err = model.get("error");
    errorText.textContent = err ? "The cell raised " + err.split("\n")[0] : "";
    error.title = err ? err.split("\n")[0] : "";
    errorWhy.textContent = err && n ? "explained below" : "";
    error.style.display = err ? "" : "none";
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
      // What to do first; the other ways (another place for the change, PyTorch's copy-keeping
      // context manager) folded, so that the card leaves the graph on the first screen.
      const fix = el("div", "ja-diag-fix");
      fix.append(el("div", "ja-fix-label", "Fix"), fixBlock(d.fix_main !== undefined ? d.fix_main : d.fix));
      if (d.fix_more) {
        const more = el("details", "ja-fix-more");
        more.append(el("summary", "ja-fix-more-head", "other ways to fix it"), fixBlock(d.fix_more));
        fix.append(more);
      }
      card.append(fix);
      card.addEventListener("click", () => {
        model.set("selected_diagnosis", i);
        model.save_changes();
      });
      diagList.append(card);
    });
    drawSummary();
  }

  function drawDetails() {
    details.replaceChildren();
    const d = model.get("details");
    if (!d || !d.title) {
      details.append(el("div", "ja-hint", "Click a node of the graph to inspect it; click a box to open it."));
      layoutSide();
      return;
    }
    details.append(el("div", "ja-details-title", d.title));
    const table = el("table", "ja-rows");
    for (const [k, v] of d.rows || []) {
      const tr = el("tr");
      tr.append(el("th", null, k), el("td", null, v));
      if (k === "health" && v !== "ok") tr.classList.add("ja-flagged");
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
    layoutSide();
  }

  // -- the source panel: the culprit's cell (or file) first, a tab for each other one ---------------
  const ROLE = { culprit: "culprit", saved: "saved line", block: "this cell" };
  let shownFile = null;
  function sourceFiles() {
    const files = Object.entries(model.get("sources") || {});
    const order = { culprit: 0, saved: 1, block: 2 };
    return files.sort((a, b) => (order[a[1].role] ?? 3) - (order[b[1].role] ?? 3));
  }
  function drawSource() {
    const files = sourceFiles();
    if (shownFile === null || !files.some(([f]) => f === shownFile)) {
      const wanted = model.get("source_name");
      shownFile = files.some(([f]) => f === wanted) ? wanted : (files[0] ? files[0][0] : null);
    }
    sourceTabs.replaceChildren();
    source.replaceChildren();
    const places = model.get("highlight_places") || [];
    for (const [file, info] of files) {
      const lines = places.filter(([f]) => f === file).map(([, line, role]) => "line " + line + " (" + role + ")");
      const tab = el("button", "ja-source-tab" + (file === shownFile ? " ja-active" : ""));
      tab.type = "button";
      tab.append(el("b", null, info.label), document.createTextNode(" " + (lines.length ? lines.join(", ") : ROLE[info.role])));
      tab.title = file;
      tab.addEventListener("click", () => { shownFile = file; drawSource(); });
      sourceTabs.append(tab);
    }
    sourceBox.style.display = files.length ? "" : "none";
    if (shownFile === null) { layoutSide(); return; }
    const info = model.get("sources")[shownFile];
    const marks = new Map();
    for (const [f, line, role] of places) if (f === shownFile && !marks.has(line)) marks.set(line, role);
    const current = model.get("current_file") === shownFile ? model.get("current_line") : 0;
    let target = null;
    info.lines.forEach((text, i) => {
      const line = i + 1;
      const row = el("div", "ja-src-line");
      row.dataset.line = String(line);
      if (marks.has(line)) {
        row.classList.add("ja-src-highlight", "ja-src-" + marks.get(line));
        row.title = marks.get(line);
        target = target || row;
      }
      if (line === current) { row.classList.add("ja-src-current"); target = row; }
      row.append(el("span", "ja-lineno", line), inlineCode(text, "span", "ja-code"));
      source.append(row);
    });
    layoutSide();
    sourceTarget = target;
    scrollSource();
  }
  // Scroll the panel only, never the page; again once the panel has its size.
  let sourceTarget = null;
  function scrollSource() {
    if (!sourceTarget || !source.clientHeight) return;
    const at = sourceTarget.getBoundingClientRect().top - source.getBoundingClientRect().top;
    source.scrollTop = Math.max(0, source.scrollTop + at - source.clientHeight / 3);
  }
  function onPlaces() {
    const places = model.get("highlight_places") || [];
    if (places.length && model.get("sources")[places[0][0]]) shownFile = places[0][0];
    drawSource();
  }
  function onCurrent() {
    const f = model.get("current_file");
    if (f && model.get("sources")[f]) shownFile = f;
    drawSource();
  }
  // The side column takes room only when it has something to show; beside the graph it is as tall
  // as the graph's column (its own contents scroll), under it on a narrow page.
  function layoutSide() {
    const has = sourceBox.style.display !== "none" || (model.get("details") || {}).title;
    side.style.display = has ? "" : "none";
    main.classList.toggle("ja-narrow", root.clientWidth > 0 && root.clientWidth < 760);
    root.classList.toggle("ja-narrow-cards", root.clientWidth > 0 && root.clientWidth < 700);
  }

  // -- the timeline: steps (one run of a line), grouped by iteration -------------------------------------
  let iteration = 0;
  function iterationOf(step) {
    const its = model.get("iterations") || [0];
    let i = 0;
    while (i + 1 < its.length && its[i + 1] <= step) i++;
    return i;
  }
  function iterationRange(i) {
    const its = model.get("iterations") || [0];
    return [its[i] || 0, i + 1 < its.length ? its[i + 1] : model.get("n_steps")];
  }
  // One slider over the whole timeline; the label names the iteration its thumb is in. With no
  // step chosen the thumb waits at the problem's step (in the iteration shown), else at the
  // iteration's first step.
  function drawIteration() {
    const its = model.get("iterations") || [0];
    iterBox.style.display = its.length > 1 ? "" : "none";
    iterLabel.textContent = "iteration " + (iteration + 1) + " of " + its.length;
    iterPrev.disabled = iteration === 0;
    iterNext.disabled = iteration + 1 >= its.length;
  }
  function drawStep() {
    const n = model.get("n_steps");
    const its = model.get("iterations") || [0];
    const info = model.get("step_info");
    const chosen = model.get("step");
    const shown = !!info && info.index !== undefined && info.index === chosen && chosen >= 0 && chosen < n;
    if (shown) iteration = iterationOf(info.index);
    const [first, end] = iterationRange(iteration);
    slider.max = String(Math.max(0, n - 1));
    slider.disabled = n === 0;
    drawIteration();
    stepLabel.replaceChildren();
    const problem = model.get("problem_step");
    if (!shown) {
      slider.value = String(problem >= first && problem < end ? problem : first);
      let hint = (end - first) + " steps (one per line run" + (its.length > 1 ? ", " + its.length + " iterations" : "") +
                 "): move the slider to replay them.";
      if (problem >= first && problem < end) hint += " The problem is at step " + (problem - first + 1) + ".";
      stepLabel.append(el("span", "ja-hint", hint));
      return;
    }
    slider.value = String(info.index);
    const ops = info.ops.map(([name, count]) => count > 1 ? name + " \u00d7" + count : name).join(", ");
    stepLabel.append(el("span", "ja-step-index", "step " + (info.index - first + 1) + " of " + (end - first) + " "),
                     el("span", "ja-line-ref", (info.where || "line " + info.line) + ": "),
                     el("code", "ja-step-source", info.source), el("span", "ja-step-op", " " + ops));
    if (!info.grad_mode) stepLabel.append(el("span", "ja-badge", "no_grad"));
    if (info.error) stepLabel.append(el("span", "ja-badge ja-badge-error", info.error.split("\n")[0]));
    if (info.note) stepLabel.append(el("div", "ja-step-note", info.note));
    const chips = el("div", "ja-versions");
    for (const [label, role, tip] of info.chips) {
      const chip = el("span", "ja-chip ja-chip-" + role, label);
      chip.title = tip;
      chips.append(chip);
    }
    stepLabel.append(chips);
  }
  function setStep(index) {
    model.set("step", index);
    model.save_changes();
  }
  slider.addEventListener("input", () => {
    const v = Number(slider.value);
    iteration = iterationOf(v);
    drawIteration();
    setStep(v);
  });
  function goIteration(i) {
    const its = model.get("iterations") || [0];
    iteration = Math.max(0, Math.min(its.length - 1, i));
    setStep(-1);
    drawStep();
  }
  iterPrev.addEventListener("click", () => goIteration(iteration - 1));
  iterNext.addEventListener("click", () => goIteration(iteration + 1));

  function onScene() {
    scene = parseScene(model.get("scene"));
    G = scene.geometry;
    for (const b of [...openSet]) if (!scene.boxes.has(b)) openSet.delete(b);
    drawGraph();
    if (pendingReveal !== null) {
      const id = pendingReveal;
      const missing = reveal([id]);
      if (missing.length && requestLayout(missing)) return;
      pendingReveal = null;
      drawGraph();
      centerOn([id], Math.max(view.k, G.readable_zoom));
    }
    root.dataset.ready = "1";
  }
  // Another diagnosis picked: open the way to its nodes and bring them into view.
  function onHighlight() {
    const ids = model.get("highlight_nodes").filter((id) => scene.items.has(id));
    const missing = reveal(ids);
    if (missing.length) requestLayout(missing);
    drawGraph();
    if (positioned && ids.length) centerOn(ids, Math.max(view.k, G.readable_zoom));
  }

  const problem = model.get("problem_step");
  iteration = problem >= 0 ? iterationOf(problem) : Math.max(0, (model.get("iterations") || [0]).length - 1);
  drawDiagnoses();
  drawGraph();
  drawDetails();
  drawStep();
  drawSource();
  // The pane has no size until it is in the page: place the first view once it has one.
  const sizeWatch = new ResizeObserver(() => {
    if (!pane.clientWidth) return;
    layoutSide();
    if (!positioned) {
      positioned = true;
      firstView();
      root.dataset.ready = "1"; // the first screen is drawn: what tests and screenshots wait for
    } else applyView();
  });
  sizeWatch.observe(pane);
  const sourceWatch = new ResizeObserver(scrollSource);
  sourceWatch.observe(source);
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
  model.on("change:highlight_places", onPlaces);
  model.on("change:current_line", onCurrent);
  model.on("change:current_file", onCurrent);
  model.on("change:sources", drawSource);
  return () => {
    sizeWatch.disconnect();
    sourceWatch.disconnect();
    window.removeEventListener("pointermove", onMove);
    window.removeEventListener("pointerup", onUp);
  };
}

export default { render };
