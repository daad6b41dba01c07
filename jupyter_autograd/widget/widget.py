"""The interactive widget: graph (module boxes, zoom, find), details, timeline, diagnoses, source.

Python computes what to show (render.layout: nodes, edges, module boxes, layers) and sends
it as plain lists in the `scene` trait; widget.js places and draws it as SVG elements,
opens and closes boxes, zooms and pans locally. The kernel is asked only for what it must
compute: the details of a clicked node, a step of the timeline, a box that was not laid out
before the first screen (`expanded`). Every string reaches the page through textContent.

The widget keeps the Trace (for details and the timeline) and the synced lists, nothing
else: no matplotlib Figure, no networkx graph. The static pictures (SVG in text/html, PNG)
are drawn when the widget is displayed and not kept.

Without a widget front end (a notebook reopened without its kernel, GitHub, nbviewer,
nbconvert) the mimebundle's text/html, image/png and text/plain show the first view and the
diagnosis; `display_trace` puts them in an output of their own, shown only where the widget
cannot live. `save_html(trace, path)` writes the interactive view into one HTML file.
"""
from __future__ import annotations

import base64
import bisect
import html
import os
import pathlib
import secrets
import textwrap
import sys
import time
from typing import Callable, Dict, List, Optional

import anywidget
import traitlets as t

from ..model import TraceData
from ..render import health, layout, timeline
from ..render.text import INCOMPLETE, graph_summary, shows_only_text, terminal_hint, text_report, verdict
from ..stats import grad_stats

_HERE = pathlib.Path(__file__).parent


# Called with each AutogradWidget made. ipywidgets keeps every widget, and so its Trace, until it is
# closed, and a front end that replaces or clears an output never tells the kernel: the shell side
# (magic.py) watches here, to close the widgets that no output shows any more.
made: List[Callable[["AutogradWidget"], None]] = []


class AutogradWidget(anywidget.AnyWidget):
    # Their text, not their paths: anywidget ties every widget made with a file path to that file's
    # change signal with a strong reference, and no widget would ever be freed.
    _esm = (_HERE / "widget.js").read_text(encoding="utf-8")
    _css = (_HERE / "widget.css").read_text(encoding="utf-8")

    scene = t.Dict().tag(sync=True)
    summary = t.Unicode("").tag(sync=True)
    error = t.Unicode("").tag(sync=True)
    warnings = t.List(t.Unicode()).tag(sync=True)   # what a failed part of the analysis lost
    diagnoses = t.List(t.Dict()).tag(sync=True)
    selected = t.Unicode("").tag(sync=True)
    details = t.Dict().tag(sync=True)
    selected_diagnosis = t.Int(-1).tag(sync=True)
    highlight_nodes = t.List(t.Unicode()).tag(sync=True)
    # [file, line, role] of the lines the selected diagnosis is about (role: culprit, saved)
    highlight_places = t.List(t.List()).tag(sync=True)
    step = t.Int(-1).tag(sync=True)                 # a step of the timeline (timeline.steps_of), -1: none
    n_steps = t.Int(0).tag(sync=True)
    iterations = t.List(t.Int()).tag(sync=True)     # the first step of each iteration
    problem_step = t.Int(-1).tag(sync=True)         # the step of the first diagnosis's line
    step_info = t.Dict().tag(sync=True)
    step_nodes = t.List(t.Unicode()).tag(sync=True)
    current_file = t.Unicode("").tag(sync=True)
    current_line = t.Int(0).tag(sync=True)
    # file -> {"label": "In [2]", "lines": [...], "role": "culprit" | "saved" | "block"}: the files
    # the source panel can show (the culprit's, the saved line's, the block's own cell)
    sources = t.Dict().tag(sync=True)
    source_name = t.Unicode("").tag(sync=True)      # the file the source panel shows first
    grad_health = t.Dict().tag(sync=True)           # module name -> [norm, flags, tooltip] (render.health)
    expanded = t.List(t.Unicode()).tag(sync=True)   # boxes the front end opened that were not laid out
    grouped = t.Bool(False).tag(sync=True)          # the graph is drawn in boxes
    node_count = t.Int(0).tag(sync=True)
    render_ms = t.Float(0.0).tag(sync=True)

    def __init__(self, trace: TraceData, filename: Optional[str] = None, max_children: int = layout.MAX_CHILDREN,
                 **kwargs):
        if not isinstance(trace, TraceData):
            raise TypeError("AutogradWidget(trace) takes the Trace from `with jupyter_autograd.capture() as trace:`"
                            " or from `%%%%autograd -o NAME`; got %s" % type(trace).__name__)
        super().__init__(**kwargs)
        try:
            self._fill(trace, filename, max_children)
        except BaseException:  # an error or an interrupt: ipywidgets would keep the half-made widget for good
            self.close()
            raise
        for callback in list(made):
            try:
                callback(self)
            except Exception:  # whoever watches must never stop the widget from being made
                pass

    def _fill(self, trace: TraceData, filename: Optional[str], max_children: int) -> None:
        self._trace = trace
        self._max_children = max_children
        self._static_elsewhere = False   # display_trace shows the static pictures in an output of their own
        start = time.perf_counter()
        # The bars on module boxes take room in them: the scene's sizes need to know which have one.
        self.grad_health = health.module_health(_stats_of(trace))
        scene = layout.build_scene(trace, max_children, badges=self.grad_health)
        self.scene = scene.to_json()
        # Kept only while some boxes still have to be laid out on request (large graphs).
        self._scene = scene if len(scene.layers) < len(scene.boxes) + 1 else None
        self.grouped = bool(scene.boxes)
        self.node_count = scene.total_nodes
        self.render_ms = (time.perf_counter() - start) * 1000
        self.summary = graph_summary(trace)
        self.error = trace.error or ""
        self.warnings = list(trace.warnings)
        self.diagnoses = [_diagnosis_dict(trace, d) for d in trace.diagnoses]
        self.sources = _sources(trace, filename)
        # The culprit's file first (a module's bug is often in an earlier cell); else the block's.
        culprit = next((d.filename for d in trace.diagnoses if d.filename in self.sources), None)
        self.source_name = culprit or filename or layout.main_file(trace)
        self._steps = timeline.steps_of(trace)
        self.n_steps = len(self._steps)
        self.iterations = timeline.iterations_of(trace, self._steps)
        self.problem_step = self._step_of(trace.diagnoses[0].op_index) if trace.diagnoses else -1
        if trace.diagnoses:
            self.selected_diagnosis = 0

    def _step_of(self, op_index: Optional[int]) -> int:
        if op_index is None:
            return -1
        at = bisect.bisect_right([first for first, _ in self._steps], op_index) - 1
        return at if 0 <= at < len(self._steps) else -1

    def view_scene(self) -> layout.Scene:
        """The Scene behind the synced `scene`: the one kept for boxes still to lay out, else built
        again as it was (with every box the front end has laid out), for the static pictures and
        for asking where the front end places things (`layout.place`)."""
        if self._scene is not None:
            return self._scene
        scene = layout.build_scene(self._trace, self._max_children, badges=self.grad_health)
        layout.lay_out(scene, list(self.scene.get("rows", {})))
        return scene

    # -- static pictures ---------------------------------------------------------------------------
    def static_bundle(self) -> Dict[str, str]:
        """text/html (the first view as SVG and the diagnoses, escaped), image/png, text/plain."""
        return static_bundle(self._trace, self._scene)

    def _repr_mimebundle_(self, **kwargs):
        bundle = super()._repr_mimebundle_(**kwargs)
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        if self._static_elsewhere:  # the output before this one has the report and the pictures
            data["text/plain"] = "(jupyter-autograd: the interactive view of the report above)"
        else:
            data.update(static_bundle(self._trace, self._scene))
        return bundle

    def offline_state(self, max_steps: int = 3000) -> Dict:
        """Every trait, with the answers the kernel would give precomputed (for save_html)."""
        names = [n for n in self.trait_names(sync=True) if not n.startswith("_") and n not in (
            "layout", "tabbable", "tooltip", "comm", "keys", "log")]
        if self._scene is not None and len(self._scene.items) <= 20_000:  # a file holds every box laid out
            layout.lay_out(self._scene, list(self._scene.boxes))
            self.scene = self._scene.to_json()
        state = {n: getattr(self, n) for n in names}
        ids = [row[0] for row in self.scene.get("items", [])] + [row[0] for row in self.scene.get("boxes", [])]
        details = {i: self.details_for(i) for i in ids}
        steps = {}
        for i in range(min(self.n_steps, max_steps)):
            self.step = i
            steps[i] = {"step_info": self.step_info, "current_line": self.current_line,
                        "current_file": self.current_file, "step_nodes": self.step_nodes}
        self.step = -1
        marks = {}
        for i in range(len(self._trace.diagnoses)):
            self.selected_diagnosis = i
            marks[i] = {"highlight_nodes": self.highlight_nodes, "highlight_places": self.highlight_places,
                        "selected": self.selected}
        self.selected_diagnosis = 0 if self._trace.diagnoses else -1
        state["selected"] = self.selected
        state["details"] = self.details
        return {"state": state, "details": details, "steps": steps, "marks": marks}

    def __repr__(self) -> str:  # cheap: no trait serialisation
        return "<AutogradWidget: %d nodes, %d diagnoses>" % (self.node_count, len(self.diagnoses))

    # -- inputs from the front end ----------------------------------------------------------------
    def close(self) -> None:
        # ipywidgets gives every DOM widget a Layout widget of its own and keeps it open (with its
        # comm) until that one is closed too: each re-run of a cell would leave one behind.
        own_layout = self._trait_values.get("layout")
        super().close()
        if own_layout is not None:
            own_layout.close()

    @t.observe("expanded")
    def _on_expanded(self, change):
        if self._scene is None:
            return
        start = time.perf_counter()
        if layout.lay_out(self._scene, change["new"]):
            self.scene = self._scene.to_json()
            if len(self._scene.layers) >= len(self._scene.boxes) + 1:
                self._scene = None
        self.render_ms = (time.perf_counter() - start) * 1000

    @t.observe("selected")
    def _on_selected(self, change):
        node = change["new"]
        self.details = self.details_for(node) if node else {}

    @t.observe("selected_diagnosis")
    def _on_diagnosis(self, change):
        i = change["new"]
        if not 0 <= i < len(self._trace.diagnoses):
            self.highlight_nodes, self.highlight_places = [], []
            return
        d = self._trace.diagnoses[i]
        problems = self.scene.get("problems", [])
        self.highlight_nodes = list(problems[i]) if i < len(problems) else []
        places = []
        if d.line:
            places.append([d.filename or "", d.line, "culprit"])
        if d.saved_line:
            places.append([d.saved_filename or d.filename or "", d.saved_line, "saved"])
        self.highlight_places = places
        if self.highlight_nodes:
            self.selected = self.highlight_nodes[0]

    @t.observe("step")
    def _on_step(self, change):
        i = change["new"]
        if not 0 <= i < len(self._steps):
            self.step_info, self.current_file, self.current_line, self.step_nodes = {}, "", 0, []
            return
        self.step_info = timeline.step_info(self._trace, self._steps, self.iterations, i)
        first, last = self._steps[i]
        ops = self._trace.ops[first:last + 1]
        loc = ops[0].location
        self.current_file = loc.filename if loc is not None and loc.filename in self.sources else ""
        self.current_line = loc.line if self.current_file else 0
        nodes = []
        for op in ops:
            nodes.extend("t%d" % tid for tid in op.writes + op.outputs)
            if op.node is not None:
                nodes.append("fn%d" % op.node)
        self.step_nodes = list(dict.fromkeys(nodes))

    # -- what the panels show (plain dicts: the front end renders them as text) ------------------
    def details_for(self, node: str) -> Dict:
        trace = self._trace
        if node.startswith("t") and node[1:].isdigit():
            return self._tensor_details(int(node[1:]))
        if node.startswith("fn") and node[2:].lstrip("-").isdigit():
            key = int(node[2:])
            leaf = trace.nodes.get(key)
            if leaf is not None and leaf.variable is not None:  # a parameter: the tensor, not its AccumulateGrad
                return self._tensor_details(leaf.variable, accumulator=leaf)
            return self._node_details(key)
        if node.startswith("op") and node[2:].isdigit() and int(node[2:]) < len(trace.ops):
            return self._op_details(int(node[2:]))
        if node.startswith(("m:", "c:", "l:")):
            return self._group_details(node)
        if node == layout.FOLD:
            return {"kind": "group", "title": "other iterations (folded)",
                    "rows": [["", self.scene.get("note", "")],
                             ["", "the view shows one iteration: the one with the problem, else the last"]]}
        return {"title": node, "rows": [["", "nothing is known about this node"]]}

    def _tensor_details(self, tid: int, accumulator=None) -> Dict:
        trace = self._trace
        info = trace.tensors.get(tid)
        if info is None:
            return {"title": trace.tensor_label(tid), "rows": []}
        rows = [["name", trace.tensor_label(tid)], ["shape", str(list(info.shape))], ["dtype", info.dtype],
                ["device", info.device], ["requires_grad", str(info.requires_grad)], ["is_leaf", str(info.is_leaf)]]
        if not (info.is_leaf and info.requires_grad):  # a parameter has none: saying so says nothing
            rows.append(["grad_fn", info.grad_fn or "None"])
        if info.base is not None:
            rows.append(["view of", trace.tensor_label(info.base)])
        if info.data_alias_of is not None:
            rows.append([".data of", "%s (own version counter: writes are invisible to autograd)"
                         % trace.tensor_label(info.data_alias_of)])
        if info.version is not None:
            rows.append(["version now", str(info.version)])
        if info.is_leaf and info.requires_grad:
            rows.append(["grad", info.grad or "None"])
            backward_calls = trace.backward_calls()
            if info.nonfinite_after is not None:
                rows.append(["NaN/Inf in grad", "yes, from backward call %d on" % (info.nonfinite_after + 1)])
            elif info.grad is not None and backward_calls:
                rows.append(["NaN/Inf in grad", "none seen"])
            if info.optimized:
                rows.append(["optimizer", "stepped it" + ("" if info.stepped_with_grad else ", without a gradient")])
            rows.extend(health.parameter_health(_stats_of(trace), info.name or ""))
            if accumulator is not None:
                rows.append(["gradient", "flows in through %s into .grad" % accumulator.name])
        else:
            rows.append(["grad", info.grad or "None"])
        history = []
        for op_index, version in info.versions:
            op = trace.ops[op_index] if 0 <= op_index < len(trace.ops) else None
            history.append([str(version), self._line_of(op), op.location.source if op and op.location else "",
                            op.name if op else "(before the block)"])
        if len(history) > 8:  # a loop: the first and the last writes say it
            history = history[:3] + [["...", "", "%d more" % (len(history) - 6), ""]] + history[-3:]
        return {"kind": "tensor", "title": trace.tensor_label(tid), "rows": rows,
                "tables": [{"caption": "version history", "columns": ["version", "line", "source", "op"],
                            "rows": history}]}

    def _node_details(self, key: int) -> Dict:
        trace = self._trace
        node = trace.nodes.get(key)
        if node is None:
            return {"title": "node %d" % key, "rows": []}
        op = trace.ops[node.created_by] if node.created_by is not None and node.created_by < len(trace.ops) else None
        rows = [["grad_fn", node.name],
                ["created by", "%s: %s" % (self._line_of(op), op.location.source if op.location else op.name)
                 if op else "(outside the block)"]]
        shape = layout.node_shape(trace, key)
        if shape:
            rows.append(["gradient shape", shape])
        if node.variable is not None:
            rows.append(["accumulates into", trace.tensor_label(node.variable) + ".grad"])
        if node.consumed_by:
            rows.append(["backward() from", ", ".join(self._line_of(trace.ops[i]) for i in node.consumed_by
                                                        if i < len(trace.ops))])
        saved = []
        for slot in node.saved:
            status = "freed by backward" if slot.freed else ("STALE: modified in place" if slot.stale else "ok")
            saved.append([slot.slot, trace.tensor_label(slot.tid) if slot.tid is not None else "?",
                          "" if slot.saved_version is None else str(slot.saved_version),
                          "" if slot.current_version is None else str(slot.current_version), status])
        inputs = [[trace.nodes[k].name + (" (%s)" % trace.tensor_label(trace.nodes[k].variable)
                                          if trace.nodes[k].variable is not None else "")]
                  for k in node.inputs if k in trace.nodes]
        return {"kind": "fn", "title": node.name, "rows": rows,
                "tables": [{"caption": "saved tensors", "columns": ["slot", "tensor", "saved at", "now", "status"],
                            "rows": saved},
                           {"caption": "inputs (next_functions)", "columns": ["node"], "rows": inputs}]}

    def _op_details(self, index: int) -> Dict:
        trace = self._trace
        op = trace.ops[index]
        rows = [["operation", op.name], ["line", self._line_of(op)], ["source", op.location.source if op.location else ""],
                ["grad mode", "enabled" if op.grad_enabled else "disabled (torch.no_grad)"]]
        if op.error:
            rows.append(["raised", op.error.splitlines()[0]])
        if any(row[0] == "op%d" % index and row[1] == "cut" for row in self.scene.get("items", [])):
            cut_for = [d.tensor for d in trace.diagnoses if d.op_index == index and d.tensor and d.kind == "graph-cut"]
            rows.append(["chain cut", "its result has no grad_fn: backward%s stops here, and nothing before this "
                         "line gets a gradient through it" % (" from `%s`" % cut_for[0] if cut_for else "")])
        writes = [[trace.tensor_label(tid), str(op.versions_before[op.inputs.index(tid)]),
                   str(op.versions_after[op.inputs.index(tid)])] for tid in op.writes if tid in op.inputs]
        return {"kind": "op", "title": "%s (%s)" % (op.name, self._line_of(op)), "rows": rows,
                "tables": [{"caption": "tensors written", "columns": ["tensor", "version before", "after"],
                            "rows": writes}]}

    def _group_details(self, key: str) -> Dict:
        box = next((b for b in self.scene.get("boxes", []) if b[0] == key), None)
        if box is None:
            return {"kind": "group", "title": key, "rows": []}
        kind, label, sub, name, count = box[1], box[2], box[3], box[5], box[6]
        title = _group_title(self._trace, name) if kind == "module" else label
        rows = [["nodes", str(count)]]
        if kind == "line":
            rows.append(["line", name])
        elif sub:
            rows.append(["holds" if kind == "chunk" else "module", sub])
        tables = []
        if kind == "module":
            data = _stats_of(self._trace)
            rows.extend(health.module_rows(data, name))
            params = health.module_parameters(data, name)
            if params:
                tables.append({"caption": "gradient health of its parameters", "columns": ["parameter", "grad norm",
                                                                                            "health"], "rows": params})
        rows.append(["", "click the box to open or close it"])
        return {"kind": "group", "title": title, "rows": rows, "tables": tables}

    def _line_of(self, op) -> str:
        """`line 12` in the file the source panel shows first; `In [2], line 16` or `model.py, line 41`
        elsewhere (a line number alone says nothing there)."""
        if op is None or op.location is None:
            return "?"
        if op.location.filename == self.source_name and len(self.sources) <= 1:
            return "line %d" % op.location.line
        return self._trace.place(op.location.filename, op.location.line)


def _sources(trace: TraceData, filename: Optional[str] = None, max_lines: int = 5000) -> Dict[str, Dict]:
    """The files the source panel can show: the culprit's and the saved line's of each diagnosis
    and the block's own cell (or `filename`), each with the name a person knows it by."""
    wanted: Dict[str, str] = {}
    for d in trace.diagnoses:
        if d.filename:
            wanted.setdefault(d.filename, "culprit")
        if d.saved_line and (d.saved_filename or d.filename):
            wanted.setdefault(d.saved_filename or d.filename, "saved")
    block = filename or layout.block_file(trace)
    if block:
        wanted.setdefault(block, "block")
    out = {}
    for name, role in wanted.items():
        lines = trace.sources.get(name)
        if lines:
            out[name] = {"label": trace.file_label(name), "role": role,
                         "lines": [text.rstrip("\n") for text in lines[:max_lines]]}
    return out


def _group_title(trace: TraceData, name: str) -> str:
    return "%s (%s)" % (name, trace.modules[name]) if name in trace.modules else name




def fix_parts(fix: str):
    """A fix as its card shows it: what to do, then the other ways (folded). What to do runs to its
    last code block (the lines to write, and what it says between them); without code, it is the
    first paragraph. The rest (another place for the change, PyTorch's context manager that keeps
    a copy) is optional and stays one click away, so that the card does not push the graph off
    the first screen."""
    lines = (fix or "").split("\n")
    code = [i for i, line in enumerate(lines) if line.startswith("    ")]
    cut = code[-1] + 1 if code else 1
    return "\n".join(lines[:cut]), "\n".join(line for line in lines[cut:] if line.strip())


def _diagnosis_dict(trace: TraceData, d) -> Dict:
    """What a diagnosis's card shows. `line`/`saved_line` number the lines to mark in the source
    pane; `place`/`saved_place` say where they are (`In [2], line 16`, `model.py, line 41`) and
    `saved_label` what the second line is ("saved", "freed by", ...)."""
    main, more = fix_parts(d.fix)
    return {"kind": d.kind, "title": d.title, "message": d.message, "fix": d.fix, "fix_main": main, "fix_more": more,
            "line": d.line or 0,
            "saved_line": d.saved_line or 0, "source": d.source, "saved_source": d.saved_source,
            "place": trace.place(d.filename, d.line) if d.line else "",
            "saved_place": trace.place(d.saved_filename or d.filename, d.saved_line) if d.saved_line else "",
            "saved_label": d.saved_label, "tensor": d.tensor or "", "node": d.node or ""}


# -- static pictures, for wherever the widget cannot live ------------------------------------------

def static_bundle(trace: TraceData, scene: Optional[layout.Scene] = None) -> Dict[str, str]:
    """The first view and the diagnoses without JavaScript: text/html, image/png, text/plain.

    `scene`: the widget's, when it still has it (large graphs); else built again (small ones)."""
    from ..render import draw

    scene = scene or layout.build_scene(trace)
    bundle = {"text/html": static_html(trace, scene), "text/plain": text_report(trace)}
    try:
        bundle["image/png"] = base64.b64encode(draw.to_png(scene, title=picture_title(trace))).decode("ascii")
    except Exception:  # the picture is a fallback: the HTML and the text still show
        pass
    return bundle


def picture_title(trace: TraceData) -> str:
    """The PNG's caption: the first problem, and, when a part of the analysis failed, that it did
    and what was lost (one line each)."""
    lines = [trace.diagnoses[0].title] if trace.diagnoses else []
    if trace.warnings:
        lines = lines or [verdict(trace)]
        lines += textwrap.wrap("%s: %s" % (INCOMPLETE, "; ".join(trace.warnings)), 110, max_lines=4,
                               placeholder=" \u2026 (the text/html and text/plain outputs have it all)")
    return "\n".join(lines)


def static_html(trace: TraceData, scene: Optional[layout.Scene] = None) -> str:
    """The diagnoses and the first view as HTML with an inline SVG; every string escaped."""
    from ..render import draw

    scene = scene or layout.build_scene(trace)
    esc = html.escape
    parts = ['<div class="ja-static" style="font-family: var(--jp-ui-font-family, sans-serif); font-size: 13px;'
             ' color: var(--jp-ui-font-color1, #212529)">',
             # Reopened without a kernel, JupyterLab cannot draw the widget output that follows this one
             # and says so; this picture stands in for it, so hide that message (trusted notebooks only).
             '<style>.jp-OutputArea-child:has(.ja-static) + .jp-OutputArea-child:not(:has(.ja-root))'
             ' { display: none; }</style>',
             '<div style="font-weight: 700">jupyter-autograd: %s</div>' % esc(
                 verdict(trace) + ("; %s:" % INCOMPLETE if trace.warnings else ""))]
    if trace.warnings:
        parts.append('<ul style="margin: 2px 0 6px; color: var(--jp-error-color1, #c92a2a)">%s</ul>'
                     % "".join("<li>%s</li>" % esc(w) for w in trace.warnings))
    if trace.error:
        parts.append('<div style="color: #c92a2a; font-family: monospace">The cell raised %s</div>'
                     % esc(trace.error.splitlines()[0]))
    for d in trace.diagnoses:
        parts.append('<div style="border-left: 4px solid #e03131; padding: 4px 8px; margin: 6px 0">'
                     '<div style="font-weight: 700">%s</div>' % esc(d.title))
        card = _diagnosis_dict(trace, d)
        if d.line:
            parts.append('<div>%s: <code>%s</code></div>' % (esc(card["place"]), esc(d.source)))
        if d.saved_line:
            parts.append('<div>%s: %s: <code>%s</code></div>' % (esc(card["saved_label"]), esc(card["saved_place"]),
                                                                 esc(d.saved_source)))
        parts.append('<div>%s</div><div><b>Fix:</b><pre style="margin: 2px 0; white-space: pre-wrap">%s</pre></div>'
                     '</div>' % (esc(d.message), esc(d.fix)))
    parts.append('<div style="white-space: pre-line; color: var(--jp-ui-font-color2, #495057)">%s</div>'
                 % esc(graph_summary(trace)))
    if scene.note:
        parts.append('<div style="color: var(--jp-ui-font-color2, #495057)">%s</div>' % esc(scene.note))
    parts.append(_static_legend(scene))
    parts.append('<div style="overflow: auto; max-height: 640px; border: 1px solid var(--jp-border-color2, #dee2e6)">'
                 + draw.to_svg(scene) + "</div></div>")
    return "".join(parts)


def _stats_of(trace: TraceData) -> Optional[Dict]:
    """The trace's gradient statistics (its own `grad_stats()` where it has one), or None where
    reading them fails: a bar is a nicety, the diagnosis is what matters."""
    try:
        read = getattr(trace, "grad_stats", None)
        return read() if read is not None else grad_stats(trace)
    except Exception:
        return None


def _static_legend(scene: layout.Scene) -> str:
    """One line: a swatch and a few words for each colour and line the picture draws."""
    from ..render import draw

    entries = []
    for kind, words in draw.legend(scene):
        fill, stroke = draw.STYLE.get(kind, draw.STYLE["box"])
        if kind == "path":
            swatch = '<span style="display:inline-block;width:14px;border-top:2px solid %s"></span>' % draw.PROBLEM
        elif kind == "shape":
            swatch = '<span style="font-size:10px">[2, 8]</span>'
        else:
            swatch = ('<span style="display:inline-block;width:14px;height:10px;background:%s;border:1px %s %s">'
                      '</span>' % (fill, "dashed" if kind in ("box", "fold", "cut") else "solid", stroke))
        entries.append('<span style="margin-right:12px;white-space:nowrap">%s %s</span>' % (swatch, html.escape(words)))
    return '<div class="ja-static-legend" style="font-size:11px; color: var(--jp-ui-font-color2, #495057)">%s</div>' \
        % "".join(entries)


def display_trace(trace: TraceData, filename: Optional[str] = None) -> None:
    """Show the static pictures and the widget as two outputs: the first stands in for the
    second wherever the widget cannot be drawn (no kernel, GitHub, nbconvert); where it can,
    the widget's CSS hides the first. In a marimo notebook the same two, through marimo's own
    output and its anywidget wrapper; with neither IPython nor marimo running (a script, a
    terminal, a CI log), the text report."""
    marimo = _running_marimo()
    if marimo is not None:
        widget = AutogradWidget(trace, filename=filename)
        marimo.output.append(marimo.Html(static_html(trace)))
        marimo.output.append(marimo.ui.anywidget(widget))
        return
    shell = _running_ipython()
    if shell is None:
        print(text_report(trace))
        return
    from IPython.display import display

    if shows_only_text(shell):  # terminal IPython: the widget would be one line about a view it lacks
        display({"text/plain": text_report(trace) + "\n" + terminal_hint()}, raw=True)
        return
    widget = AutogradWidget(trace, filename=filename)
    widget._static_elsewhere = True
    try:
        display(widget.static_bundle(), raw=True)
        display(widget)
    except BaseException:  # never shown: ipywidgets would keep it, and the trace, for good
        widget.close()
        raise


def trace_mimebundle(trace: TraceData, include=None, exclude=None):
    """A Trace as a cell's value: the widget and its static pictures; where the front end shows only
    text (terminal IPython), the text report and what the terminal lacks, with no widget made."""
    shell = _running_ipython()
    if shell is not None and shows_only_text(shell):
        return {"text/plain": text_report(trace) + "\n" + terminal_hint()}
    return AutogradWidget(trace)._repr_mimebundle_(include=include, exclude=exclude)


def _running_marimo():
    """The marimo module when this runs in a marimo notebook, else None (never imported here)."""
    marimo = sys.modules.get("marimo")
    try:
        return marimo if marimo is not None and marimo.running_in_notebook() else None
    except Exception:  # another marimo than the one we know: not ours to show in
        return None


def _running_ipython():
    """The running IPython shell, or None (IPython is not imported here when it is not loaded)."""
    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None else None


def save_html(trace: TraceData, path, filename: Optional[str] = None) -> pathlib.Path:
    """Write one self-contained HTML file with the interactive view (no server, no kernel)."""
    from ..render.standalone import page

    widget = AutogradWidget(trace, filename=filename)
    try:
        state = widget.offline_state()
    finally:
        widget.close()
    out = pathlib.Path(path)
    _write_whole(out, page(state, (_HERE / "widget.js").read_text(), (_HERE / "widget.css").read_text(),
                           static_html(trace)))
    return out


def _write_whole(path: pathlib.Path, text: str) -> None:
    """The file holds the whole text or stays as it was: a full disk never leaves half a report.
    Written beside it (same file system, so the rename is atomic), then renamed over it. A symlink
    stays one: the rename goes over the file it points to (a rename over the link would replace
    the link and leave its target stale)."""
    data = text.encode("utf-8")
    path = pathlib.Path(os.path.realpath(path))
    temporary = path.with_name(".%s.%s.tmp" % (path.name, secrets.token_hex(4)))
    # os.open with 0o666, as open() does: the file gets the user's umask, not mkstemp's 0o600.
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # a full disk may only say so when the data is written out
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
