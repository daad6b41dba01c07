"""Turn a finished recorder into a plain-data TraceData: tensors, ops with their lines, module calls,
the graph and its checkpoints, names. Runs when the trace is first read (session.py), from the
records and what freeze.py took from the live objects when the block ended."""
from __future__ import annotations

import gc
import linecache
from typing import Dict, Optional

import torch

from ..model import (DATA_SWAP, FREEZE_SETTER, Checkpoint, GraphNode, Location, ModuleCall, OpRecord, SavedSlot,
                     TensorInfo, TraceData)
from ..source.alignment import Alignment
from ..source.naming import assignment_targets
from ..source.index import without_comment
from . import compiled, distributed
from . import graph as graph_snapshot
from .backward import BACKWARD_FUNCS
from .frames import call_columns, call_span
from .freeze import end_checkpoint, freeze, raised_at
from .mode import DATA_GETTER, DATA_SETTER, REQUIRES_GRAD_SETTER
from .records import (NODE_LEAF, OP_CODE, OP_ERR, OP_FUNC, OP_GRAD, OP_IN, OP_LINE, OP_OUT, OP_VA, OP_VB, OP_WR, SLOT_TID,
                      lost_part)
from .tensors import META_ALIAS, META_BASE, shape_of

_op_names = {}


def op_name(func) -> str:
    try:
        name = _op_names.get(func)
    except TypeError:
        name = None
    if name is not None:
        return name
    owner = getattr(func, "__self__", None)
    if func == DATA_GETTER:
        name = "Tensor.data"
    elif func == REQUIRES_GRAD_SETTER:
        name = FREEZE_SETTER
    elif func == DATA_SETTER:
        name = DATA_SWAP
    elif isinstance(owner, type):  # a classmethod such as MyFunction.apply
        name = "%s.%s" % (owner.__name__, getattr(func, "__name__", "?"))
    else:
        qual = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)
        module = getattr(func, "__module__", None) or ""
        head, _, tail = qual.rpartition(".")
        if head in ("TensorBase", "Tensor", "_TensorBase"):
            name = "Tensor." + tail
        elif head == "_VariableFunctionsClass" or module == "torch":
            name = "torch." + tail
        elif module in ("torch.nn.functional", "torch._C._nn") or module.startswith("torch.nn.functional"):
            name = "F." + tail
        elif module.startswith("torch.optim."):  # a whole optimizer step (steps.py): Adam.step
            name = qual
        elif module:
            name = module + "." + qual
        else:
            name = qual
    try:
        _op_names[func] = name
    except TypeError:
        pass
    return name


def finish(recorder, namespaces, exc, error, tool_warnings=()):
    """Take, now, what needs the user's live objects; return a function that builds the block's
    TraceData (all but the diagnoses) from plain records, with what the tool could not do in its
    warnings and what it did in its notes. Our reads of the user's tensors are hidden from their
    `__torch_function__` subclasses, now and at the build."""
    with torch._C.DisableTorchFunctionSubclass():
        try:
            end_checkpoint(recorder)
        except Exception as internal:
            recorder.lose("the graph walk at the end of the block", internal,
                          "the saved tensors of graphs that no backward ran were not checked")
        frozen = freeze(recorder, namespaces or [])
    error_at = None if exc is None else raised_at(exc)

    def build_data():
        """(the TraceData, the alignment of its ops with the user's source that naming read)."""
        # Not DisableTorchFunctionSubclass alone: read inside another capture, the build's reads
        # of gradients would be recorded there, at the line that read the trace.
        with torch._C.DisableTorchFunction():
            trace, source = build_trace(recorder, frozen, error, error_at)
        trace.warnings.extend(tool_warnings)
        for message, times in recorder.lost_parts.items():
            trace.warnings.append(message if times == 1 else "%s (%d times)" % (message, times))
        if recorder.failure:
            trace.warnings.append("recording stopped early after an internal error: " + recorder.failure)
        if recorder.steps.unrecorded_after is not None:
            code, line = recorder.steps.unrecorded_after
            trace.warnings.append("the optimizer step at %sline %d raised and the exception was caught: the "
                                  "tensor calls after it, up to the next module call or the end of the block, "
                                  "were not recorded" % ("" if code is None else code.co_filename + ", ", line))
        if recorder.too_deep:
            trace.warnings.append("%d calls ran too close to the recursion limit to be recorded" % recorder.too_deep)
        if recorder.folding.count:
            trace.notes.append("To keep memory bounded, the details of %d ops were folded: ops that wrote "
                               "nothing, whose results were gone and whose autograd nodes, if any, a "
                               "backward had already run and freed; they keep their name, line and "
                               "nodes, not their tensors." % recorder.folding.count)
        folded_backwards = recorder.folding.backwards
        if folded_backwards:
            trace.notes.append("The saved tensors of %d backward calls that found nothing (each freed its "
                               "graph, and nothing it saved was changed) were not kept; the first and the "
                               "latest calls keep theirs." % folded_backwards)
        if graph_snapshot.STACK_RAISED[0] and len(trace.nodes) > graph_snapshot.DEEP_GRAPH:
            trace.notes.append("This graph is deep: to keep PyTorch from crashing when it frees it, the "
                               "process's stack limit was raised from %d to %d bytes." % graph_snapshot.STACK_RAISED[0])
        return trace, source

    return build_data


def build_trace(recorder, frozen, error: Optional[str] = None, error_at=None):
    """(the TraceData, the alignment of its ops with the user's source, which naming read)."""
    # Tens of thousands of small objects, none of them in a cycle: the cyclic GC would rescan
    # the growing heap again and again while they are made (3x the build time).
    enabled = gc.isenabled()
    gc.disable()
    try:
        trace = TraceData()
        trace.error = error
        source = Alignment(trace)  # reads trace.sources as the build fills it
        # The ops, tensors and graph are what every diagnosis reads: without one of them nothing is
        # analysed (capture.finish says so). The other parts fail alone, and say what they lost.
        locations = {}
        _part(trace, "reading the source lines of the ops", "ops are shown without their lines",
              lambda: locations.update(_locations(recorder, trace)))
        if error_at is not None:
            trace.error_location = _location(trace, *error_at)
        trace.distributed = distributed.models_of(frozen.distributed)
        _tensors(recorder, trace, frozen)
        _ops(recorder, trace, locations, frozen)
        if not _part(trace, "linking the calls of your modules to their lines", "what a module you wrote returned "
                     "is not named by the line that called it", _calls, frozen.user_calls, trace):
            trace.calls = []
        _graph(recorder, trace)
        if not _part(trace, "naming the tensors", "tensors are described instead of named", _names, trace, source,
                     frozen.names, frozen.variables):
            for info in trace.tensors.values():
                info.name = None
        trace.kept = {t_id: (first, last) for t_id, (first, last) in recorder.backward.kept.seen.items()
                      if t_id in trace.tensors}
        trace.function_calls = recorder.function_calls.pairs()
        trace.notes.extend(frozen.module_notes)
        trace.backward_hooks = dict(frozen.backward_hooks)
        trace.roots_finite = dict(frozen.roots_finite)
        trace.nonfinite_forward = dict(recorder.backward.nonfinite_forward)
        if recorder.backward.nan_origin is not None:
            backward, key, name, facts = recorder.backward.nan_origin
            trace.nan_origin = {"backward": backward, "node": key, "name": name, "facts": facts}
        _part(trace, "reading the calls of compiled functions", "their cuts and NaN gradients are named at the "
              "line that called them", compiled.build_calls, recorder, trace)
        return trace, source
    finally:
        if enabled:
            gc.enable()


def _part(trace, what, lost, step, *args):
    """Run one part of the build that the rest can do without; False, and a warning, if it failed."""
    try:
        step(*args)
        return True
    except Exception as exc:
        trace.warnings.append(lost_part(what, exc, lost))
        return False


def _locations(recorder, trace) -> Dict[tuple, Location]:
    cache: Dict[tuple, Location] = {}  # (id(code), line): code objects do not cache their hash
    for rec in recorder.ops:
        code, line = rec[OP_CODE], rec[OP_LINE]
        if code is None or (id(code), line) in cache:
            continue
        filename = code.co_filename
        if filename not in trace.sources:
            trace.sources[filename] = list(linecache.getlines(filename))
        text = without_comment(trace.source_line(filename, line)).strip()
        cache[(id(code), line)] = Location(filename, line, code.co_name, text, code.co_firstlineno)
    return cache


def _location(trace, filename, line, function) -> Location:
    if filename not in trace.sources:
        trace.sources[filename] = list(linecache.getlines(filename))
    return Location(filename, line, function, without_comment(trace.source_line(filename, line)).strip())


def _calls(user_calls, trace):
    """trace.calls, from the recorded calls of user-written modules, in the order they began."""
    locations: Dict[tuple, Location] = {}
    for first in sorted(user_calls):
        for code, line, lasti, end, outputs, path, inputs in user_calls[first]:
            where = locations.get((id(code), line))
            if where is None:
                filename = code.co_filename
                if filename not in trace.sources:
                    trace.sources[filename] = list(linecache.getlines(filename))
                text = without_comment(trace.source_line(filename, line)).strip()
                where = locations[(id(code), line)] = Location(filename, line, code.co_name, text,
                                                               code.co_firstlineno)
            outputs = tuple(t if t in trace.tensors else None for t in outputs)
            trace.calls.append(ModuleCall(location=where, module=path, first_op=first, end_op=end,
                                          outputs=outputs, inputs=tuple(t for t in inputs if t in trace.tensors),
                                          columns=call_columns(code, line, lasti), span=call_span(code, lasti)))
    trace.calls.sort(key=lambda call: (call.first_op, -call.end_op))  # an enclosing call before those inside it


def _tensors(recorder, trace, frozen):
    names: Dict[object, str] = {}
    table, steps, live = recorder.tensors, recorder.steps, frozen.live
    metas = table.meta
    folded_created = len(table.folded_created)
    wanted = _referenced_tensors(recorder, frozen) if recorder.folding.count else None
    grads = []  # (info, its gradient): their first values are read together, at the end
    plain_shapes = _PlainShapes()
    for t_id, meta in enumerate(metas) if wanted is None else ((t, metas[t]) for t in sorted(wanted)):
        shape, dtype, device, requires_grad, is_leaf, created_by, base, alias_of = meta
        if created_by is None and folded_created:
            created_by = table.created_by(t_id)
        dtype_name = names.get(dtype) or names.setdefault(dtype, str(dtype).replace("torch.", ""))
        device_name = names.get(device) or names.setdefault(device, str(device))
        info = TensorInfo(tid=t_id, shape=plain_shapes.of(shape), dtype=dtype_name,
                          device=device_name, requires_grad=bool(requires_grad), is_leaf=bool(is_leaf),
                          created_by=created_by, base=base, data_alias_of=alias_of,
                          first_requires_grad=bool(requires_grad), owner=frozen.param_owner.get(t_id),
                          optimized=t_id in steps.optimized, is_parameter=t_id in table.parameters,
                          is_buffer=t_id in frozen.buffers,
                          stepped_with_grad=t_id in steps.stepped_with_grad, nonfinite_after=frozen.nonfinite.get(t_id),
                          grad_norms=tuple(frozen.grad_norms.get(t_id, ())), norm=frozen.leaf_norms.get(t_id))
        if t_id in live:
            info.alive = True
            info.requires_grad, info.is_leaf, info.grad_fn, info.node, ref, info.version, info.elements = live[t_id]
            t = ref()
            g = _grad_of(t) if t is not None else None
            if g is not None:
                grads.append((info, g))
        trace.tensors[t_id] = info
    _summarise_grads(grads)


def _referenced_tensors(recorder, frozen) -> set:
    """After folding, the tensors anything kept still mentions. The others were made and used
    only by folded ops (whose records no longer list them): a long loop leaves millions."""
    wanted = set(frozen.live) | set(frozen.names) | set(frozen.param_owner) | set(recorder.steps.optimized)
    wanted |= set(frozen.nonfinite) | set(frozen.grad_norms)
    wanted |= set(recorder.backward.kept.seen)
    for rec in recorder.ops:
        if rec[OP_IN] or rec[OP_OUT]:
            wanted.update(rec[OP_IN])
            wanted.update(rec[OP_OUT])
    for cp in recorder.backward.checkpoints:
        wanted.update(s[SLOT_TID] for s in cp.slots if s[SLOT_TID] is not None)
        wanted.update(t for t, _ in cp.inputs)
    wanted.update(e[NODE_LEAF] for e in recorder.graph.nodes.values() if e[NODE_LEAF] is not None)
    metas, todo = recorder.tensors.meta, list(wanted)
    while todo:  # the bases and `.data` sources of those, and theirs
        meta = metas[todo.pop()]
        for other in (meta[META_BASE], meta[META_ALIAS]):
            if other is not None and other not in wanted:
                wanted.add(other)
                todo.append(other)
    return wanted


class _PlainShapes(dict):
    """_plain_shape of each distinct shape, worked out once: a model's thousand tensors share a few dozen."""

    def __missing__(self, shape):
        plain = self[shape] = _plain_shape(shape)
        return plain

    def of(self, shape) -> tuple:
        try:
            return self[shape]
        except TypeError:  # a size that cannot be hashed (a symbolic one)
            return _plain_shape(shape)


def _plain_shape(shape) -> tuple:
    """Sizes as ints; a symbolic size (a nested tensor's ragged dimension) as its text."""
    if type(shape) is tuple and all(type(size) is int for size in shape):
        return shape  # recorded shapes are plain tuples already
    out = []
    for size in shape:
        try:
            out.append(int(size))
        except Exception:
            out.append(str(size))
    return tuple(out)


def _grad_of(t):
    try:
        return t.grad if t.is_leaf else None
    except Exception:
        return None


_FIRST = 6  # values shown of a gradient


def _first_values(g):
    """The first values of a gradient, flat: for a plain contiguous one, one view op rather than three."""
    if type(g) is torch.Tensor and not g.requires_grad and g.is_contiguous():
        try:
            return g.as_strided((min(_FIRST, g.numel()),), (1,))
        except Exception:  # a dtype or backend without as_strided: the general way
            pass
    return g.detach().reshape(-1)[:_FIRST]


def _summarise_grads(grads) -> None:
    """Each gradient's first values, shape and size as text (info.grad). The values of the plain
    strided gradients of one device are read in one copy to the host (one sync on a GPU, where
    reading each parameter's took one sync apiece)."""
    batches = {}  # (device, complex) -> [(info, g, its first values flat)]
    for info, g in grads:
        try:
            if g.layout is not torch.strided or g.is_nested:
                raise ValueError
            first = _first_values(g)
        except Exception:  # layouts without a flat view (sparse, nested)
            info.grad = "tensor(shape=%s, layout=%s)" % (_plain_shape(shape_of(g)), str(g.layout).replace("torch.", ""))
            continue
        batches.setdefault((first.device, first.is_complex()), []).append((info, g, first))
    for (_, is_complex), batch in batches.items():
        wide = torch.complex128 if is_complex else torch.float64
        try:
            # Joined first, then widened: two kernels on a GPU, not one cast per gradient (cat promotes
            # float16 and bfloat16 to the widest float among them, which holds their values exactly).
            flat = torch.cat([first for _, _, first in batch]).to(wide).tolist()
        except Exception:  # a dtype with no such cast: one read each
            flat = [v for _, _, first in batch for v in first.tolist()]
        at = 0
        for info, g, first in batch:
            n = first.numel()
            values = flat[at:at + n]
            at += n
            if is_complex:
                text = ", ".join(_number(v) for v in values)
            elif first.is_floating_point():
                text = _FLOATS[n] % tuple(values)  # as _number writes each, in one format
            else:
                text = _INTS[n] % tuple([int(v) for v in values])
            info.grad = "tensor([%s%s]) shape=%s" % (text, ", ..." if g.numel() > _FIRST else "",
                                                     _plain_shape(tuple(g.shape)))


_FLOATS = [", ".join(["%.4g"] * n) for n in range(_FIRST + 1)]
_INTS = [", ".join(["%d"] * n) for n in range(_FIRST + 1)]


def _number(v) -> str:
    if isinstance(v, complex):
        return "%.4g%+.4gj" % (v.real, v.imag)
    return "%.4g" % v if isinstance(v, float) else str(v)


def _ops(recorder, trace, locations, frozen):
    op_modules = frozen.op_modules
    trace.modules = dict(frozen.module_classes)
    funcs = recorder.funcs
    nodes_of = recorder.nodes_of
    tensors = trace.tensors
    versions: Dict[int, list] = {}  # tid -> [(op index, its version after that op)]
    for index, rec in enumerate(recorder.ops):
        func = funcs[rec[OP_FUNC]]
        written = rec[OP_WR] or ()
        err = rec[OP_ERR]
        before, after = rec[OP_VB], rec[OP_VA]
        if type(before) is not tuple:  # packed by _fold
            before, after = tuple(before), tuple(after)
        op = OpRecord(index=index, name=op_name(func), location=locations.get((id(rec[OP_CODE]), rec[OP_LINE])),
                      module=op_modules.get(index, ()),
                      inputs=rec[OP_IN], outputs=rec[OP_OUT], versions_before=before, versions_after=after,
                      writes=tuple(w[0] for w in written) if written else (),
                      write_ranges=tuple(w[1] for w in written) if written else (),
                      grad_enabled=rec[OP_GRAD], node=nodes_of(index, rec),
                      error=None if err is None else "%s: %s" % err[:2],
                      out=err[2] if err is not None and len(err) > 2 else (), is_backward=func in BACKWARD_FUNCS)
        trace.ops.append(op)
        for t_id, vb, va in zip(op.inputs, op.versions_before, op.versions_after):
            seen = versions.get(t_id)
            if seen is None:
                created_by = tensors[t_id].created_by
                seen = versions[t_id] = [(-1 if created_by is None else created_by, vb)]
            if va != vb:
                seen.append((index, va))
        for t_id in op.outputs:
            if t_id not in versions and tensors[t_id].created_by == index:
                versions[t_id] = [(index, 0)]
    for t_id, seen in versions.items():
        tensors[t_id].versions = tuple(seen)


def _made_by(recorder) -> Dict[int, int]:
    """Node key -> the op that made it: the recorder's node ranges and the sorted keys walked
    together (one bisect per node cost as much as the rest of the graph's build)."""
    ranges, made = recorder.node_ranges, {}
    keys = sorted(k for k in recorder.graph.nodes if k >= 0)
    if not ranges.in_order():
        # Not in order (a custom Function records its inner calls first): bisect as op_of_seq does.
        return {key: index for key in keys if (index := ranges.op_of_seq(key)) is not None}
    firsts, ends, indices = ranges.firsts, ranges.ends, ranges.indices
    at, n = -1, len(ranges)
    for key in keys:  # as op_of_seq: the last range starting at or before the key, if it holds it
        while at + 1 < n and firsts[at + 1] <= key:
            at += 1
        if at >= 0 and key < ends[at]:
            made[key] = indices[at]
    return made


def _graph(recorder, trace):
    # A call cut off at the recursion limit (its record raised RecursionError after registering
    # its results and nodes, before appending its op) leaves them pointing past the last op.
    n_ops = len(trace.ops)
    made_by = {key: index for key, index in _made_by(recorder).items() if index < n_ops}
    orphans = [info for info in trace.tensors.values() if info.created_by is not None and info.created_by >= n_ops]
    for info in orphans:
        info.created_by = None
    if orphans:
        trace.warnings.append("%d tensor%s made by calls cut off at the recursion limit: shown without the "
                              "line and the op that made them" % (len(orphans), "" if len(orphans) == 1 else "s"))
    for key, (name, inputs, variable, consumed, _seen) in recorder.graph.nodes.items():
        if type(inputs) is not tuple or None in inputs:  # most nodes have no empty input: their tuple is kept
            inputs = tuple(k for k in inputs if k is not None)
        trace.nodes[key] = GraphNode(key=key, name=name, created_by=made_by.get(key), inputs=inputs, variable=variable,
                                     consumed_by=consumed if type(consumed) is tuple else tuple(consumed))
    # The node an op made for its result: the live tensor's grad_fn where known, else the
    # last node of the op's range that is in the graph (F.linear makes TBackward, then Addmm).
    for op in trace.ops:
        if op.node is None:
            continue
        first, end = op.node
        result = None
        for tid in op.outputs + op.writes:
            info = trace.tensors[tid]
            if info.node is not None and first <= info.node < end:
                result = info.node
        if result is None:
            # A node no checkpoint walked (a graph dropped before the end) is still the last one made.
            result = end - 1
            if result not in trace.nodes:
                result = next((k for k in range(end - 2, first - 1, -1) if k in trace.nodes), end - 1)
        op.node = result
    for info in trace.tensors.values():
        if info.grad_fn is None and info.created_by is not None and info.requires_grad and not info.is_leaf:
            key = trace.ops[info.created_by].node
            if key in trace.nodes:
                info.grad_fn = trace.nodes[key].name
    latest: Dict[tuple, SavedSlot] = {}
    dtype_names: Dict[object, str] = {}
    plain_shapes = _PlainShapes()
    for op_index, kind, roots, raw_slots, inputs, retain in recorder.backward.checkpoints:
        cp = Checkpoint(op_index=op_index, kind=kind, roots=list(roots), inputs=[k for _, k in inputs],
                        input_tids=[t for t, _ in inputs], retain=retain)
        for raw in raw_slots:
            slot = SavedSlot(*raw)
            slot.shape = plain_shapes.of(slot.shape)
            dtype = dtype_names.get(slot.dtype)
            if dtype is None:
                dtype = dtype_names[slot.dtype] = str(slot.dtype).replace("torch.", "")
            slot.dtype = dtype
            cp.slots.append(slot)
            prev = latest.get((slot.node, slot.slot))
            if prev is None or not prev.stale or slot.stale:
                if not (slot.freed and prev is not None):
                    latest[(slot.node, slot.slot)] = slot
        trace.checkpoints.append(cp)
        for r in roots:
            if r not in trace.roots:
                trace.roots.append(r)
    saved: Dict[int, list] = {}
    for (key, _), slot in latest.items():
        if key in trace.nodes:
            saved.setdefault(key, []).append(slot)
    for key, slots in saved.items():
        trace.nodes[key].saved = tuple(slots)


def _names(trace, source, found: Dict[int, str], variables: Dict[int, str]):
    found = dict(found)
    for t_id, name in assignment_targets(trace, source).items():
        found.setdefault(t_id, name)
    for t_id, info in trace.tensors.items():
        info.name = found.get(t_id)
        info.by_variable = info.name is not None and variables.get(t_id) == info.name
    # A detached alias shares its source's memory and version counter, as a view shares its base's.
    # One that torch made by calling the aten op (the output a compiled function saved for backward)
    # was never the user's: it is that tensor. (The user's own `x.detach()` is a tensor of its own.)
    detached_from = {op.outputs[0]: op.inputs[0] for op in trace.ops
                     if len(op.inputs) == 1 and len(op.outputs) == 1 and op.name.endswith("aten::detach")}
    # Views and aliases without a name of their own go by their base's name.
    for info in trace.tensors.values():
        if info.name is None:
            seen, cur = set(), info
            while cur.name is None and cur.tid not in seen:
                seen.add(cur.tid)
                nxt = cur.base if cur.base is not None else cur.data_alias_of
                if nxt is None:
                    nxt = detached_from.get(cur.tid)
                if nxt is None or nxt not in trace.tensors:
                    break
                cur = trace.tensors[nxt]
            if cur.name is not None and cur is not info:
                info.name = cur.name + (".data" if info.data_alias_of == cur.tid else "")
