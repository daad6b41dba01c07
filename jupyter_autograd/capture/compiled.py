"""Compiled regions: a torch.compile'd function or module recorded as the ops of its own lines.

What runs of a compiled region is the backend's code (Inductor's kernels, the AOTAutograd
wrappers), one `CompiledFunction.apply` for its autograd, placed at the line that called it. Its
graph, as Dynamo traced it, still says which op each line made: each FX node keeps the user's
stack trace (compiled_graph.py reads it). So where a region's CompiledFunction runs (the custom
Function apply that switches.py records), it runs with the recorder paused, as the user's backend
made it, and its one record is replaced by one op per node of the graph: at the node's line, on
the real tensors the region was given and returned, with a tensor of the tool's own (a row and no
weak reference, like a tensor that is gone) for each value made inside. A cut (`h.detach()`, a
`no_grad` block, an integer result), a parameter starved by it and the line that made a NaN are
then named inside the compiled function, by the rules that name them in plain code.

The region's autograd node (CompiledFunctionBackward) is the node of the op that made its last
output. A region whose graph cannot be found or read is recorded as before, as one op at the call.
"""
from __future__ import annotations

import sys
import weakref

import torch

from ..model import CompiledCall
from ..model.queries import reachable
from .compiled_graph import region_of, running_graph
from .compiled_nan import KEEP, NanReplays, RegionInputs, replayable
from .frames import USER, frame_kind
from .records import NODE_CHILDREN, NODE_NAME, OP_CODE, OP_ERR, OP_FUNC, OP_GRAD, OP_IN, OP_LINE, OP_OUT, OP_SEQ, OP_VA, OP_VB, OP_WR
from .state import State, thread_state
from .tensors import META_CREATED

_Tensor = torch.Tensor
_Module = torch.nn.Module
_original_apply = torch.autograd.function.Function.__dict__["apply"]
NOT_HANDLED = object()
_UNKNOWN = object()
_regions = weakref.WeakKeyDictionary()  # CompiledFunction class -> its Region, or None (not readable)


class CompiledRegions:
    """The calls of compiled regions recorded as their ops: (first op, end op, the Region (plain
    data), the grad_fn sequence numbers its apply made or None, the positions among its tensor
    arguments of those whose gradient the region cuts, how many modules were running at the
    call, the name of what was compiled), in call order. With check_nan: the hooks on the regions' nodes of the backward call
    running (compiled_nan.py), and where inside a region the first NaN/Inf was made (node key,
    graph node, the autograd node plain PyTorch runs there, facts)."""

    __slots__ = ("calls", "replays", "nan_place", "remembered", "mutations")

    def __init__(self, calls=()):
        self.calls = list(calls)
        # An input the region writes in place is written after it, by AOTAutograd's `inp.copy_(new)`
        # at the calling line: tid of the new value -> (tid of the input, the op of the write inside)
        self.mutations = {}
        self.replays = None
        self.nan_place = None
        self.remembered = {}  # with check_nan: node key -> RegionInputs of the call that made it

    def add(self, first, end, region, seq, cut, depth, name):
        self.calls.append((first, end, region, seq, cut, depth, name))

    def remember(self, seq, entry):
        remembered = self.remembered
        for key in range(seq[0], seq[1]):
            remembered[key] = entry
        while len(remembered) > KEEP:
            del remembered[next(iter(remembered))]

    def watch_nan(self, nodes, fail, backward_index):
        """Before a backward call that the NaN watch follows: hooks on the regions' nodes it will run."""
        if self.remembered and any(type(fn).__name__ == "CompiledFunctionBackward" for fn in nodes):
            self.replays = NanReplays(fail, backward_index)
            self.replays.attach(nodes, self.remembered)

    def unwatch_nan(self, origin):
        """The call is over; `origin`, the NaN watch's (backward, node key, ...), or None."""
        replays, self.replays = self.replays, None
        if replays is None:
            return
        replays.detach()
        place = replays.found.get(origin[1]) if origin is not None else None
        if place is not None and self.nan_place is None:
            self.nan_place = (origin[1],) + tuple(place)

    def shifted(self, start):
        """As a capture nested in this block sees it, whose op indices start again at 0 at op `start`."""
        part = CompiledRegions((a - start, b - start) + tuple(rest) for a, b, *rest in self.calls if a >= start)
        part.nan_place = self.nan_place
        part.mutations = {new: (inp, at - start) for new, (inp, at) in self.mutations.items() if at >= start}
        return part


def apply_paused(cls, *args):
    """The region's apply, run with the recorder paused: the backend's own calls are not the
    user's ops (its graph's nodes stand for them). The stand-in for the call in its op record."""
    __tracebackhide__ = True  # noqa: F841
    recorder = getattr(thread_state, "recorder", None)
    previous = recorder.pause() if recorder is not None and recorder.recording() else None
    try:
        return _original_apply.__get__(None, cls)(*args)
    finally:
        if previous is not None and recorder.state is State.PAUSED:
            recorder.resume(previous)


apply_paused.__qualname__, apply_paused.__name__, apply_paused.__module__ = (
    "CompiledFunction.apply", "apply", "")


def run(recorder, cls, args, kwargs):
    """Run a compiled region's apply for the user and record it as its graph's ops; NOT_HANDLED
    when its graph is not known (then it is recorded as any custom Function's apply)."""
    __tracebackhide__ = True  # noqa: F841
    if kwargs:
        return NOT_HANDLED
    region = _regions.get(cls, _UNKNOWN)
    if region is _UNKNOWN:
        region = _read_region(recorder, cls, len(args))
    if region is None:
        return NOT_HANDLED
    first, last_write = len(recorder.ops), recorder.last_write
    result = recorder.__torch_function__(apply_paused, (), (cls,) + args, None)
    try:
        ops = recorder.ops
        if len(ops) == first + 1 and ops[first][OP_FUNC] == recorder.func_ids.get(apply_paused) \
                and ops[first][OP_ERR] is None and recorder.recording():
            _replace(recorder, region, cls, first, last_write, args, result)
    except Exception as exc:  # never let the tool break the user's call; the call's record stays
        recorder.lose("recording the ops of the compiled function %s" % region.name, exc,
                      "its ops are shown as one call at the line that called it")
    return result


def _read_region(recorder, cls, n_args):
    region = None
    try:
        found = running_graph(sys._getframe(2), n_args)
        if found is not None:
            region = region_of(*found)
            if region is not None and len(cls.metadata.output_info) != len(region.outputs):
                region = None
            if region is not None and replayable(found[0]):
                region.graph = weakref.ref(found[0])
    except Exception as exc:
        recorder.lose("reading the graph of a compiled function", exc,
                      "its ops are shown as one call at the line that called it")
    _regions[cls] = region
    return region


def _replace(recorder, region, cls, first, last_write, args, result):
    """Put the region's ops where the record of its apply (op `first`) is."""
    rec = recorder.ops[first]
    table = recorder.tensors
    call_code, call_line, grad = rec[OP_CODE], rec[OP_LINE], rec[OP_GRAD]
    in_tids = iter(zip(rec[OP_IN], rec[OP_VB], rec[OP_VA]))
    slot_tid, version = {}, {}  # value slot -> tid; tid -> (version before, version after) of a real input
    arg_tids = {}  # argument position -> tid
    for i, a in enumerate(args):
        if isinstance(a, _Tensor):
            t_id, before, after = next(in_tids)
            slot_tid[i] = arg_tids[i] = t_id
            version[t_id] = (before, after)
    written = {w[0]: w for w in rec[OP_WR] or ()}
    real_out = _outputs(region, cls, result, rec[OP_OUT])
    made_here = [t for t in rec[OP_OUT] if table.meta[t][META_CREATED] == first]

    base = recorder.modules.op_modules.get(first, ())
    plans, rows = [], []  # the ops (as add_op's arguments), the tool's own tensor rows
    n_tids = len(table.refs)
    fake_versions = {}
    for k, node in enumerate(region.nodes):
        index = first + len(plans)
        inputs = tuple(slot_tid[s] for s in node.inputs if s in slot_tid)
        outputs = []
        for s in node.outputs:
            t_id = slot_tid.get(s)
            if t_id is None:
                t_id = real_out.get(s)
                if t_id is None:
                    shape, dtype, device, requires_grad = region.values[s]
                    t_id = n_tids + len(rows)
                    rows.append((shape, dtype, device, requires_grad, False, index, None, None))
                elif table.meta[t_id][META_CREATED] == first:
                    table.set_created_by(t_id, index)
                slot_tid[s] = t_id
            outputs.append(t_id)
        if node.switch is not None:
            grad = node.switch
        before, after, writes = [], [], None
        target = inputs[0] if node.writes and inputs else None
        for t_id in inputs:
            if t_id in version:  # a real input: the version the region found, and left if this op wrote it
                vb, va = version[t_id]
                if t_id == target and t_id in written:
                    writes = (written.pop(t_id),)
                    before.append(vb)
                    after.append(va)
                else:
                    before.append(va)
                    after.append(va)
            else:
                v = fake_versions.get(t_id, 0)
                before.append(v)
                if t_id == target:
                    v = fake_versions[t_id] = v + 1
                    writes = ((t_id, None),)
                after.append(v)
        code, line = (node.code, node.line) if node.code is not None else (call_code, call_line)
        seq = rec[OP_SEQ] if k == region.owner else None
        plans.append([node.func, code, line, inputs, tuple(before), tuple(after), tuple(outputs), seq, writes, grad,
                      _path(base, node.modules, region)])
    if written:  # a write of an input the graph's nodes do not show: the op that made its last output
        owner = plans[region.owner]
        owner[8] = (owner[8] or ()) + tuple(written.values())
    leftover = region.owner if 0 <= region.owner < len(plans) else len(plans) - 1
    for t_id in made_here:  # tensors the apply returned that no node stands for (mutated inputs' copies)
        if table.meta[t_id][META_CREATED] == first and t_id not in real_out.values():
            table.set_created_by(t_id, first + leftover)
    _note_mutations(recorder, region, cls, first, arg_tids, result, rec, version)
    graph = region.graph() if region.graph is not None else None
    if recorder.check_nan and graph is not None and rec[OP_SEQ] is not None:
        recorder.compiled.remember(rec[OP_SEQ], RegionInputs(graph, args, cls.metadata.num_mutated_inp_runtime_indices))
    cut = tuple(n for n, i in enumerate(arg_tids) if i in region.no_grad)  # arg_tids: the tensor arguments' positions
    _commit(recorder, region, first, last_write, rec, rows, plans, cut, base)


def _note_mutations(recorder, region, cls, first, arg_tids, result, rec, version):
    """The inputs the region writes in place and AOTAutograd writes back after it (their versions
    did not move inside): each new value (the first results of the apply), with the op inside that
    wrote it."""
    mutated = getattr(cls.metadata, "mutated_inp_runtime_indices", ())
    if not mutated:
        return
    results = result if isinstance(result, (tuple, list)) else (result,)
    tids = dict(zip([i for i, r in enumerate(results) if isinstance(r, _Tensor)], rec[OP_OUT]))
    for k, at in enumerate(mutated):
        if k not in tids or at not in arg_tids:
            continue
        inp = arg_tids[at]
        if version[inp][0] != version[inp][1]:
            continue  # written inside the apply: its op already says so
        writer = [i for i, node in enumerate(region.nodes) if node.writes and node.inputs and node.inputs[0] == at]
        if writer:
            recorder.compiled.mutations[tids[k]] = (inp, first + writer[-1])


def _commit(recorder, region, first, last_write, rec, rows, plans, cut, base):
    recorder.replace_last_op(last_write, rows, plans)
    recorder.compiled.add(first, len(recorder.ops), region, rec[OP_SEQ], cut, len(base), _call_name(region, base))


def _outputs(region, cls, result, out_tids):
    """Value slot -> tid of the real tensor the region returned for it: graph output j is the apply's
    result after its mutated inputs; one whose shape is not the traced one is not matched."""
    if not isinstance(result, (tuple, list)):
        result = (result,)
    tids, at = {}, iter(out_tids)
    for i, r in enumerate(result):
        if isinstance(r, _Tensor):
            tids[i] = next(at)
    offset = getattr(cls.metadata, "num_mutated_inp_runtime_indices", None)
    found = {}
    if offset is None:
        return found
    for j, slot in enumerate(region.outputs):
        if slot is None or slot < region.n_inputs or offset + j not in tids:
            continue
        shape = region.values[slot][0]
        r = result[offset + j]
        if all(type(s) is int for s in shape) and tuple(r.shape) != shape:
            continue
        found.setdefault(slot, tids[offset + j])
    return found


def _path(base, nested, region):
    """The module path of a node's op: the modules running at the call (for `torch.compile(model)`,
    the model inside its compiled wrapper too), then those the node ran in inside the region
    (Dynamo inlines them: no module hook sees them)."""
    path = list(base)
    compiled_module = base[-1] if base else None
    inner = _inner_module(compiled_module)
    if type(compiled_module).__name__ == "OptimizedModule" and inner is not None:
        compiled_module = inner  # torch.compile(model): the model's forward is the region
        path.append(inner)
    for root, names in nested:
        module = compiled_module if root == "self" else _global_module(region, root[1])
        for name in names:
            if module is None:
                break
            module = module.__dict__.get("_modules", {}).get(name)
        if isinstance(module, _Module) and not any(m is module for m in path):
            path.append(module)
    return tuple(path) if len(path) != len(base) else base


def _call_name(region, base):
    """The compiled function's name; for a module whose compiled code is torch's (its forward is
    torch's own, as nn.Sequential's), the module's class."""
    if frame_kind(region.code.co_filename) == USER or not base:
        return region.name
    module = base[-1]
    return type(_inner_module(module) or module).__name__


def _inner_module(module):
    """The model inside `torch.compile(model)`'s wrapper, read from its dict; None for another module."""
    inner = module.__dict__.get("_modules", {}).get("_orig_mod") if module is not None else None
    return inner if isinstance(inner, _Module) else None


def _global_module(region, name):
    """A module the compiled function reads as a global of its module (read from the module's dict)."""
    globals_ = region.globals_of()
    value = globals_.get(name) if globals_ is not None else None
    return value if isinstance(value, _Module) else None


# -- at the build ----------------------------------------------------------------------------------

def build_calls(recorder, trace):
    """trace.compiled, and the graph as the gradient flows: a region's autograd node has an edge to
    every input that requires grad, but a cut inside the region (`h.detach()`) sends none along
    some of them (their `.grad` stays None, as without torch.compile). Those edges are dropped,
    and a leaf reached by a backward only through them is not counted as reached by it."""
    dropped = set()
    for first, end, region, seq, cut, depth, name in recorder.compiled.calls:
        trace.compiled.append(CompiledCall(name, first, end, depth))
        if seq is None or not cut:
            continue
        for key in range(seq[0], seq[1]):
            entry, node = recorder.graph.nodes.get(key), trace.nodes.get(key)
            if entry is None or node is None or not str(entry[NODE_NAME]).startswith("CompiledFunctionBackward"):
                continue
            children = entry[NODE_CHILDREN]
            drop = {children[i] for i in cut if i < len(children) and children[i] is not None}
            if drop:
                node.inputs = tuple(k for k in node.inputs if k not in drop)
                dropped |= drop
    _nan_op(recorder, trace)
    _writes_back(recorder, trace)
    if not dropped:
        return
    # A leaf no edge leads to any more is not in the graph that backward runs (nor drawn in it).
    needed = set(trace.roots)
    for node in trace.nodes.values():
        needed.update(node.inputs)
    for cp in trace.checkpoints:
        needed.update(cp.roots)
        needed.update(cp.inputs)
    for key in dropped:
        if key < 0 and key not in needed:
            trace.nodes.pop(key, None)
    for cp in trace.checkpoints:
        if cp.kind != "backward":
            continue
        reached = reachable(trace, cp.roots)
        for key, node in trace.nodes.items():
            if key < 0 and cp.op_index in node.consumed_by and key not in reached:
                node.consumed_by = tuple(i for i in node.consumed_by if i != cp.op_index)


def _nan_op(recorder, trace):
    """With check_nan, where a region's node made the first NaN/Inf: the op of the graph node whose
    backward made it in the replay (trace.nan_origin["op"]), and the node plain PyTorch would have
    run there, with what it saved."""
    found, origin = recorder.compiled.nan_place, trace.nan_origin
    if found is None or origin is None or origin["node"] != found[0]:
        return
    key, graph_node, name, facts = found
    for first, end, region, seq, _, _, _ in recorder.compiled.calls:
        if seq is not None and seq[0] <= key < seq[1]:
            at = [i for i, node in enumerate(region.nodes) if node.name == graph_node]
            if at and first + at[0] < end:
                origin.update(op=first + at[0], name=name, facts=facts)
            return


def _writes_back(recorder, trace):
    """AOTAutograd's write-back of an input the region wrote in place (`inp.copy_(new)`, recorded at
    the calling line) is the write inside: it takes that op's line, name and modules."""
    mutations = dict(recorder.compiled.mutations)
    if not mutations:
        return
    for op in trace.ops:
        if op.name == "Tensor.copy_" and len(op.inputs) >= 2 and op.inputs[1] in mutations:
            inp, at = mutations.pop(op.inputs[1])
            if op.inputs[0] == inp and at < op.index:
                inside = trace.ops[at]
                op.location, op.name, op.module = inside.location, inside.name, inside.module
