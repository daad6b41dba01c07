"""One self-contained HTML page with the interactive view: no server, no kernel, no network.

The page holds widget.js and widget.css inline and a small stand-in for the widget model that
answers from tables computed beforehand (the details of every node drawn, every step of the
timeline, the marks of every diagnosis), so clicking, the timeline, zoom, find and opening
boxes work from a file attached to a bug report.
"""
from __future__ import annotations

import html
import json
from typing import Dict

_SHIM = """
const data = JSON.parse(document.getElementById("ja-data").textContent);
const state = data.state, listeners = {}, pending = {};
function change(key, value) {
  state[key] = value;
  for (const fn of listeners["change:" + key] || []) fn();
}
function answer(key, value) {
  change(key, value);
  if (key === "selected") {
    change("details", data.details[value] || (value ? { title: value, rows: [["", "not recorded in this file"]] } : {}));
  } else if (key === "step") {
    const s = data.steps[String(value)] || { step_info: {}, current_line: 0, current_file: "", step_nodes: [] };
    change("step_info", s.step_info); change("current_file", s.current_file); change("current_line", s.current_line);
    change("step_nodes", s.step_nodes);
  } else if (key === "selected_diagnosis") {
    const m = data.marks[String(value)];
    if (!m) return;
    change("highlight_places", m.highlight_places); change("highlight_nodes", m.highlight_nodes);
    answer("selected", m.selected);
  }
}
const model = {
  get: (key) => state[key],
  set: (key, value) => { pending[key] = value; },
  save_changes: () => { for (const key of Object.keys(pending)) { const v = pending[key]; delete pending[key]; answer(key, v); } },
  on: (event, fn) => { (listeners[event] = listeners[event] || []).push(fn); },
  off: () => {},
};
const url = URL.createObjectURL(new Blob([data.esm], { type: "text/javascript" }));
const widget = (await import(url)).default;
const app = document.getElementById("ja-app");
app.replaceChildren();
widget.render({ model, el: app });
document.body.dataset.ready = "1";
"""


def _json_for_script(value) -> str:
    """JSON that cannot end the <script> element holding it."""
    return json.dumps(value, separators=(",", ":")).replace("<", "\\u003c").replace(">", "\\u003e").replace(
        "&", "\\u0026")


def page(offline: Dict, esm: str, css: str, static: str, title: str = "jupyter-autograd") -> str:
    data = dict(offline, esm=esm)
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>%s</title>" % html.escape(title),
        "<style>body { margin: 16px; font-family: sans-serif; background: #fff; }</style>",
        "<style>%s</style>" % css.replace("</", "<\\/"),
        "</head><body>",
        # Shown until the script runs (and where scripts do not run at all).
        '<div id="ja-app">%s</div>' % static,
        '<script type="application/json" id="ja-data">%s</script>' % _json_for_script(data),
        '<script type="module">%s</script>' % _SHIM,
        "</body></html>",
    ])
