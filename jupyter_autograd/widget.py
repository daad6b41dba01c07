"""The interactive widget: graph (click a node), details, timeline, diagnoses, source.

All state lives in synced traits computed here from the Trace, so the widget is testable
without a browser: set `selected`, `step` or `selected_diagnosis` and read `details`,
`step_info`, `highlight_lines`. The front end (widget.js) only draws those traits and sets
the three inputs; it writes every string with textContent, and the SVG comes from
matplotlib, which escapes text.
"""
from __future__ import annotations

import base64
import pathlib
import time
from collections import Counter
from typing import Dict, List, Optional

import anywidget
import traitlets as t

from .model import Trace
from .render import draw, layout
from .render.text import graph_summary, text_report

_HERE = pathlib.Path(__file__).parent


class AutogradWidget(anywidget.AnyWidget):
    _esm = _HERE / "widget.js"
    _css = _HERE / "widget.css"

    svg = t.Unicode("").tag(sync=True)
    summary = t.Unicode("").tag(sync=True)
    error = t.Unicode("").tag(sync=True)
    diagnoses = t.List(t.Dict()).tag(sync=True)
    selected = t.Unicode("").tag(sync=True)
    details = t.Dict().tag(sync=True)
    selected_diagnosis = t.Int(-1).tag(sync=True)
    highlight_nodes = t.List(t.Unicode()).tag(sync=True)
    highlight_lines = t.List(t.Int()).tag(sync=True)
    step = t.Int(-1).tag(sync=True)
    n_steps = t.Int(0).tag(sync=True)
    step_info = t.Dict().tag(sync=True)
    step_nodes = t.List(t.Unicode()).tag(sync=True)
    current_line = t.Int(0).tag(sync=True)
    source = t.List(t.Dict()).tag(sync=True)
    source_name = t.Unicode("").tag(sync=True)
    expanded = t.List(t.Unicode()).tag(sync=True)
    grouped = t.Bool(False).tag(sync=True)
    node_count = t.Int(0).tag(sync=True)
    render_ms = t.Float(0.0).tag(sync=True)

    def __init__(self, trace: Trace, filename: Optional[str] = None, max_nodes: int = layout.DEFAULT_MAX_NODES,
                 **kwargs):
        if not isinstance(trace, Trace):
            raise TypeError("AutogradWidget(trace) takes the Trace from `with jupyter_autograd.capture() as trace:`"
                            " or from `%%%%autograd -o NAME`; got %s" % type(trace).__name__)
        super().__init__(**kwargs)
        self._trace = trace
        self._max_nodes = max_nodes
        self._graph = layout.full_graph(trace)
        self._view: Optional[layout.View] = None
        self._figure = None
        self.summary = graph_summary(trace)
        self.error = trace.error or ""
        self.diagnoses = [_diagnosis_dict(d) for d in trace.diagnoses]
        self.source_name = filename or _main_file(trace)
        self.source = [{"line": i, "text": text.rstrip("\n")}
                       for i, text in enumerate(trace.sources.get(self.source_name, []), 1)]
        self.n_steps = len(trace.ops)
        self._render()
        if trace.diagnoses:
            self.selected_diagnosis = 0

    # -- rendering -----------------------------------------------------------------------------
    def _render(self):
        start = time.perf_counter()
        self._view = layout.build_view(self._trace, self._max_nodes, frozenset(self.expanded), self._graph)
        title = self._trace.diagnoses[0].title if self._trace.diagnoses else ""
        self._figure = draw.figure(self._view, title)
        self.svg = draw.to_svg(self._figure)
        self.grouped = self._view.grouped
        self.node_count = self._view.total_nodes
        self.render_ms = (time.perf_counter() - start) * 1000

    def _repr_mimebundle_(self, **kwargs):
        bundle = super()._repr_mimebundle_(**kwargs)
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        try:
            data["image/png"] = base64.b64encode(draw.to_png(self._figure)).decode("ascii")
        except Exception:
            pass  # the picture is a fallback; the widget and the text still show
        data["text/plain"] = text_report(self._trace)
        return bundle

    def __repr__(self) -> str:  # cheap: no trait serialisation
        return "<AutogradWidget: %d nodes, %d diagnoses>" % (self.node_count, len(self.diagnoses))

    # -- inputs from the front end ----------------------------------------------------------------
    @t.observe("selected")
    def _on_selected(self, change):
        node = change["new"]
        if not node:
            self.details = {}
            return
        if node.startswith(("g:", "m:")) and node not in self.expanded:
            self.details = self._group_details(node)
            self.expanded = self.expanded + [node]
            self._render()
            return
        self.details = self.details_for(node)

    @t.observe("selected_diagnosis")
    def _on_diagnosis(self, change):
        i = change["new"]
        if not 0 <= i < len(self._trace.diagnoses):
            self.highlight_nodes, self.highlight_lines = [], []
            return
        d = self._trace.diagnoses[i]
        nodes = ["t%d" % tid for tid in d.tids]
        if d.node_key is not None:
            nodes.append("fn%d" % d.node_key)
        if d.op_index is not None:
            nodes.append(layout.write_id(d.op_index))
        nodes = list(dict.fromkeys(nodes))
        self.highlight_nodes = [n for n in nodes if self._view is not None and n in self._view.nodes] or nodes
        self.highlight_lines = [n for n in (d.line, d.saved_line) if n]
        if nodes:
            self.selected = nodes[0]

    @t.observe("step")
    def _on_step(self, change):
        i = change["new"]
        if not 0 <= i < len(self._trace.ops):
            self.step_info, self.current_line, self.step_nodes = {}, 0, []
            return
        self.step_info = self.step_details(i)
        op = self._trace.ops[i]
        here = op.location is not None and op.location.filename == self.source_name
        self.current_line = op.location.line if here else 0
        nodes = ["t%d" % tid for tid in op.writes + op.outputs]
        if op.node is not None:
            nodes.append("fn%d" % op.node)
        self.step_nodes = list(dict.fromkeys(nodes))

    # -- what the panels show (plain dicts: the front end renders them as text) ------------------
    def details_for(self, node: str) -> Dict:
        trace = self._trace
        if node.startswith("t") and node[1:].isdigit():
            return self._tensor_details(int(node[1:]))
        if node.startswith("fn") and node[2:].lstrip("-").isdigit():
            return self._node_details(int(node[2:]))
        if node.startswith("op") and node[2:].isdigit() and int(node[2:]) < len(trace.ops):
            return self._op_details(int(node[2:]))
        if node.startswith(("g:", "m:")):
            return self._group_details(node)
        return {"title": node, "rows": [["", "nothing is known about this node"]]}

    def _tensor_details(self, tid: int) -> Dict:
        trace = self._trace
        info = trace.tensors.get(tid)
        if info is None:
            return {"title": "tensor#%d" % tid, "rows": []}
        rows = [["name", info.label], ["shape", str(list(info.shape))], ["dtype", info.dtype],
                ["device", info.device], ["requires_grad", str(info.requires_grad)], ["is_leaf", str(info.is_leaf)],
                ["grad_fn", info.grad_fn or "None"]]
        if info.base is not None:
            rows.append(["view of", trace.tensor_label(info.base)])
        if info.data_alias_of is not None:
            rows.append([".data of", "%s (own version counter: writes are invisible to autograd)"
                         % trace.tensor_label(info.data_alias_of)])
        if info.version is not None:
            rows.append(["version now", str(info.version)])
        rows.append(["grad", info.grad or "None"])
        history = []
        for op_index, version in info.versions:
            op = trace.ops[op_index] if 0 <= op_index < len(trace.ops) else None
            history.append([str(version), _line_of(op), op.location.source if op and op.location else "",
                            op.name if op else "(before the block)"])
        return {"kind": "tensor", "title": info.label, "rows": rows,
                "tables": [{"caption": "version history", "columns": ["version", "line", "source", "op"],
                            "rows": history}]}

    def _node_details(self, key: int) -> Dict:
        trace = self._trace
        node = trace.nodes.get(key)
        if node is None:
            return {"title": "node %d" % key, "rows": []}
        op = trace.ops[node.created_by] if node.created_by is not None and node.created_by < len(trace.ops) else None
        rows = [["grad_fn", node.name],
                ["created by", "%s: %s" % (_line_of(op), op.location.source if op.location else op.name)
                 if op else "(outside the block)"]]
        if node.variable is not None:
            rows.append(["accumulates into", trace.tensor_label(node.variable) + ".grad"])
        if node.consumed_by:
            rows.append(["backward() from", ", ".join(_line_of(trace.ops[i]) for i in node.consumed_by
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
        rows = [["operation", op.name], ["line", _line_of(op)], ["source", op.location.source if op.location else ""],
                ["grad mode", "enabled" if op.grad_enabled else "disabled (torch.no_grad)"]]
        if op.error:
            rows.append(["raised", op.error.splitlines()[0]])
        writes = [[trace.tensor_label(tid), str(op.versions_before[op.inputs.index(tid)]),
                   str(op.versions_after[op.inputs.index(tid)])] for tid in op.writes if tid in op.inputs]
        return {"kind": "op", "title": "%s (%s)" % (op.name, _line_of(op)), "rows": rows,
                "tables": [{"caption": "tensors written", "columns": ["tensor", "version before", "after"],
                            "rows": writes}]}

    def _group_details(self, key: str) -> Dict:
        count = self._view.nodes[key].members if self._view and key in self._view.nodes else 0
        label = (_group_title(self._trace, key) if key.startswith("m:") else
                 self._view.nodes[key].label if self._view and key in self._view.nodes else key)
        return {"kind": "group", "title": label,
                "rows": [["nodes", str(count)], ["", "expanded in the graph; click its nodes to inspect them"]]}

    def step_details(self, i: int) -> Dict:
        trace = self._trace
        op = trace.ops[i]
        involved = list(dict.fromkeys(op.inputs + op.outputs))
        others = [tid for tid, info in trace.tensors.items() if info.name and tid not in involved
                  and info.versions and info.versions[0][0] <= i]
        versions = []
        for tid in (involved + others)[:24]:
            info = trace.tensors.get(tid)
            if info is None:
                continue
            known = [v for at, v in info.versions if at <= i]
            if known or tid in involved:
                versions.append([info.label, str(known[-1]) if known else "0", "written" if tid in op.writes else ""])
        return {"index": i, "op": op.name, "line": op.location.line if op.location else 0,
                "file": op.location.filename if op.location else "", "source": op.location.source if op.location else "",
                "grad_mode": op.grad_enabled, "error": op.error or "",
                "writes": [trace.tensor_label(tid) for tid in op.writes], "versions": versions}


def _group_title(trace: Trace, key: str) -> str:
    name = key[2:]
    return "%s (%s)" % (name, trace.modules[name]) if name in trace.modules else name


def _line_of(op) -> str:
    return "line %d" % op.location.line if op is not None and op.location else "?"


def _main_file(trace: Trace) -> str:
    files = Counter(op.location.filename for op in trace.ops if op.location)
    for d in trace.diagnoses:
        if d.filename:
            return d.filename
    return files.most_common(1)[0][0] if files else ""


def _diagnosis_dict(d) -> Dict:
    return {"kind": d.kind, "title": d.title, "message": d.message, "fix": d.fix, "line": d.line or 0,
            "saved_line": d.saved_line or 0, "source": d.source, "saved_source": d.saved_source,
            "tensor": d.tensor or "", "node": d.node or ""}
