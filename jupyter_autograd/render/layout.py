"""What to draw and where: the view graph (grouped when large) laid out in layers.

The view graph is the trace's autograd graph plus one node per culprit write. Above
`max_nodes` nodes, nodes are grouped by the source line that created them, so that a
100,000-node graph still draws as a few dozen boxes; a group can be expanded. Problem nodes
and their neighbours are never hidden inside a group.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, List, Optional, Tuple

import networkx as nx

from ..model import Trace, to_networkx

DEFAULT_MAX_NODES = 250


@dataclass
class ViewNode:
    id: str
    kind: str                  # fn, leaf, saved, tensor, write, group
    label: str
    sublabel: str = ""
    problem: bool = False
    members: int = 1
    x: float = 0.0
    y: float = 0.0


@dataclass
class View:
    nodes: Dict[str, ViewNode] = field(default_factory=dict)
    edges: List[Tuple[str, str, str]] = field(default_factory=list)  # (source, target, kind)
    grouped: bool = False
    total_nodes: int = 0
    width: int = 1             # the widest layer, in nodes
    depth: int = 1             # number of layers


def write_id(op_index: int) -> str:
    return "op%d" % op_index


def full_graph(trace: Trace) -> nx.DiGraph:
    """The autograd graph with the culprit writes added as nodes pointing at what they changed."""
    g = to_networkx(trace)
    for d in trace.diagnoses:
        if d.op_index is None or d.kind == "accumulated-graph":
            continue
        wid = write_id(d.op_index)
        label = "line %s: %s" % (d.line, d.source) if d.line else trace.ops[d.op_index].name
        g.add_node(wid, kind="write", label=label, problem=True, op=d.op_index)
        for tid in d.tids:
            if "t%d" % tid in g:
                g.add_edge(wid, "t%d" % tid, kind="overwrote")
                break
        else:
            if d.node_key is not None and "fn%d" % d.node_key in g:
                g.add_edge(wid, "fn%d" % d.node_key, kind="overwrote")
    return g


def group_key(trace: Trace, g: nx.DiGraph, node: str, expanded: FrozenSet[str] = frozenset()) -> Optional[str]:
    """The group a node is drawn in: the outermost nn.Module (not yet expanded) whose forward
    made it, else the source line that made it. None: drawn on its own (inside an expanded module)."""
    data = g.nodes[node]
    op_index = None
    if data["kind"] == "fn":
        op_index = data.get("created_by")
    elif "tid" in data:
        info = trace.tensors.get(data["tid"])
        op_index = info.created_by if info is not None else None
        if info is not None and info.is_leaf:
            op_index = None
    if op_index is None or op_index >= len(trace.ops):
        return "g:inputs"  # leaves with their AccumulateGrad nodes, and what came from before the block
    op = trace.ops[op_index]
    if op.module:
        for name in op.module:
            if "m:" + name not in expanded:
                return "m:" + name
        return None
    if op.location is None:
        return "g:other"
    return "g:%s:%d" % (op.location.filename, op.location.line)


def build_view(trace: Trace, max_nodes: int = DEFAULT_MAX_NODES,
               expanded: FrozenSet[str] = frozenset(), graph: Optional[nx.DiGraph] = None) -> View:
    g = graph if graph is not None else full_graph(trace)
    view = View(total_nodes=g.number_of_nodes())
    if g.number_of_nodes() <= max_nodes:
        for n, data in g.nodes(data=True):
            view.nodes[n] = _view_node(trace, n, data)
        view.edges = [(u, v, d.get("kind", "")) for u, v, d in g.edges(data=True)]
    else:
        _grouped(trace, g, view, max_nodes, expanded)
    _layout(view)
    return view


def _view_node(trace: Trace, n: str, data: dict) -> ViewNode:
    kind = data["kind"]
    sub = ""
    if kind in ("leaf", "saved", "tensor"):
        shape = data.get("shape", ())
        sub = "[%s]" % ", ".join(str(s) for s in shape) if shape else "scalar"
    elif kind == "fn" and data.get("created_by") is not None and data["created_by"] < len(trace.ops):
        loc = trace.ops[data["created_by"]].location
        sub = "line %d" % loc.line if loc else ""
    return ViewNode(id=n, kind=kind, label=str(data.get("label", n)), sublabel=sub, problem=bool(data.get("problem")))


def _grouped(trace, g, view, max_nodes, expanded):
    view.grouped = True
    keep = set()
    for n, data in g.nodes(data=True):
        if data.get("problem") or data["kind"] == "write":
            keep.add(n)
            keep.update(g.predecessors(n))
            keep.update(g.successors(n))
    expanded = set(expanded)
    for _ in range(8):
        owner: Dict[str, str] = {}
        members: Dict[str, List[str]] = defaultdict(list)
        for n in g.nodes:
            key = group_key(trace, g, n, frozenset(expanded))
            if n in keep or key is None or key in expanded:
                owner[n] = n
            else:
                owner[n] = key
                members[key].append(n)
        # One model holding everything says nothing: open it until its parts show.
        big = [k for k, ms in members.items() if k.startswith("m:") and len(ms) > max_nodes / 2]
        if not big:
            break
        expanded.update(big)
    for n, o in owner.items():
        if o == n:
            view.nodes[n] = _view_node(trace, n, g.nodes[n])
    for key, ms in members.items():
        if key.startswith("m:"):  # the end of the dotted name, the class below it
            name = key[2:]
            label = name if len(name) <= 24 else "..." + ".".join(name.split(".")[-2:])
            sub = "%s, %d nodes" % (trace.modules.get(name, "module"), len(ms))
        else:
            kinds = Counter(g.nodes[m].get("label", "") for m in ms if g.nodes[m]["kind"] == "fn")
            top = ", ".join("%s x%d" % (k, c) for k, c in kinds.most_common(2))
            label, sub = _group_label(trace, key), "%d nodes%s" % (len(ms), ": " + top if top else "")
        view.nodes[key] = ViewNode(id=key, kind="group", label=label, members=len(ms), sublabel=sub)
    seen = set()
    for u, v, d in g.edges(data=True):
        a, b = owner[u], owner[v]
        if a != b and (a, b) not in seen:
            seen.add((a, b))
            view.edges.append((a, b, d.get("kind", "")))


def _group_label(trace: Trace, key: str) -> str:
    if key.startswith("m:"):
        name = key[2:]
        cls = trace.modules.get(name)
        return "%s (%s)" % (name, cls) if cls and cls != name else name
    if key == "g:inputs":
        return "inputs and parameters"
    if key == "g:other":
        return "operations without a source line"
    filename, _, line = key[2:].rpartition(":")
    text = trace.source_line(filename, int(line)).strip()
    return "line %s: %s" % (line, text) if text else "line %s" % line


def _layout(view: View) -> None:
    """Layers from the roots down (longest path), then a few barycenter sweeps against crossings."""
    g = nx.DiGraph()
    g.add_nodes_from(view.nodes)
    g.add_edges_from((u, v) for u, v, _ in view.edges if u in view.nodes and v in view.nodes)
    # Grouping can make cycles (group A feeds B feeds A): layer the condensation instead.
    cond = nx.condensation(g)
    layer_of_scc = {}
    for depth, generation in enumerate(nx.topological_generations(cond)):
        for scc in generation:
            layer_of_scc[scc] = depth
    mapping = cond.graph["mapping"]
    layers: Dict[int, List[str]] = defaultdict(list)
    beside: Dict[str, str] = {}
    for n in sorted(g.nodes, key=_natural):  # sorted: deterministic order for golden tests
        targets = list(g.successors(n))
        if view.nodes[n].kind == "write" and len(targets) == 1:
            beside[n] = targets[0]  # drawn next to what it overwrote, not above the whole graph
            continue
        layers[layer_of_scc[mapping[n]]].append(n)
    order = {}
    for depth in sorted(layers):
        for i, n in enumerate(layers[depth]):
            order[n] = i
    for _ in range(4):
        for depth in sorted(layers)[1:]:
            def bary(n):
                ps = [order[p] for p in g.predecessors(n) if p in order]
                return sum(ps) / len(ps) if ps else order[n]
            layers[depth].sort(key=bary)
            for i, n in enumerate(layers[depth]):
                order[n] = i
    for n, target in beside.items():
        depth = layer_of_scc[mapping[target]]
        layers[depth].insert(layers[depth].index(target), n)
    view.width = max((len(v) for v in layers.values()), default=1)
    view.depth = max(len(layers), 1)
    for depth, nodes in layers.items():
        offset = (view.width - len(nodes)) / 2.0
        for i, n in enumerate(nodes):
            view.nodes[n].x = offset + i
            view.nodes[n].y = -float(depth)


def _natural(node_id: str):
    head = node_id.rstrip("-0123456789")
    tail = node_id[len(head):]
    try:
        return (head, int(tail))
    except ValueError:
        return (node_id, 0)
