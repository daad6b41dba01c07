"""Snapshots of the grad_fn graph: nodes, edges and saved tensors, as plain tuples.

The walk is iterative (graphs of 100,000 nodes are deep chains) and holds node objects only
while it runs: a strong reference to a grad_fn keeps its saved tensors alive.
Staleness is decided by PyTorch's own check (reading `_saved_<name>` raises exactly when
backward would), so the prediction cannot drift from what backward does.
"""
from __future__ import annotations

import gc
import re

import torch

from .records import NODE_CHILDREN, NODE_LEAF, NODE_NAME, NODE_RUNS, NODE_SEEN, OP_OUT, Snapshot
from .tensors import META_ALIAS, META_BASE, META_SHAPE, byte_range, shape_of

_STALE = re.compile(r"is at version (\d+); expected version (\d+) instead")
_saved_names_by_type = {}


_ACCUMULATE_GRAD = torch._C._functions.AccumulateGrad


class GraphRecord:
    """The nodes of the block's graphs as walks met them: key -> (name, input keys, leaf tid,
    backward op indices that ran it, op index of the last checkpoint that saw it); and the
    recorded tensors by data pointer, which finds the tensor behind a saved output (extended with
    the tensors registered since its last use, so a long loop under one capture stays linear)."""

    __slots__ = ("nodes", "pointer_index", "pointer_indexed")

    def __init__(self):
        self.nodes = {}
        self.pointer_index = {}   # data pointer -> a tid, or a list of tids (_PointerIndex)
        self.pointer_indexed = 0  # tids below this are in pointer_index

    def forget(self, first, end):
        """Drop the nodes with keys in [first, end) (folding.py)."""
        nodes = self.nodes
        for key in range(first, end):
            nodes.pop(key, None)  # an outer custom Function's range holds its inner ops' ranges

    def shifted(self, start):
        """As a capture nested in this block sees it: the nodes its checkpoints saw, op indices from `start`."""
        part = GraphRecord()
        part.nodes = {key: [e[NODE_NAME], e[NODE_CHILDREN], e[NODE_LEAF], [b - start for b in e[NODE_RUNS] if b >= start],
                            e[NODE_SEEN] - start]
                      for key, e in self.nodes.items() if e[NODE_SEEN] >= start}
        return part


def node_key(node, tensors):
    """A stable integer for a node across snapshots: its sequence number, or for a leaf's
    AccumulateGrad (which has none) a negative number derived from the leaf's tid."""
    if type(node) is _ACCUMULATE_GRAD:
        return -1 - tensors.tid(node.variable)
    return node._sequence_nr()


def node_name(node):
    """MulBackward0, AccumulateGrad, ...: one string per node type, shared by all its nodes (a
    long loop makes millions of nodes)."""
    cls = type(node)
    name = _node_names.get(cls)
    if name is None:
        name = _node_names[cls] = node.name().rpartition("::")[2]
    return name


_node_names = {}


def saved_names(node):
    """Per node type: (slot name, attribute with the raw saved tensor, attribute that checks it)."""
    cls = type(node)
    names = _saved_names_by_type.get(cls)
    if names is None:
        slots = [n[len("_raw_saved_"):] for n in dir(cls) if n.startswith("_raw_saved_")]
        # Custom Functions check through `saved_tensors`, built-in nodes through `_saved_<slot>`.
        names = _saved_names_by_type[cls] = tuple(
            (s, "_raw_saved_" + s, "_saved_" + s if hasattr(cls, "_saved_" + s) else "saved_" + s) for s in slots)
    return names


def take(recorder, roots, op_index, kind, inputs=(), retain=True):
    """The walk below, with the cyclic GC held off: it wraps thousands of nodes and saved tensors
    in Python objects, and the collections they set off cost more than the walk (a 6,000-node
    chain: 50 ms of walk, 20 to 50 ms of collections). No code of the user's runs meanwhile.
    Returns (snapshot, the tids of the leaves a backward's walk reached, the nodes it held when
    the recorder watches for NaN, else ())."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _walk(recorder, roots, op_index, kind, inputs, retain)
    finally:
        if enabled:
            gc.enable()


def _walk(recorder, roots, op_index, kind, inputs=(), retain=True):
    """Walk the graph from root tensors (or nodes); return ((op_index, kind, root keys, slots,
    input keys, retain), leaves, nodes) as take() says.

    Node structure is merged into recorder.graph.nodes (GraphRecord). Slots are tuples:
    (node key, slot, tid, shape, dtype, saved_version, current_version, stale, freed, byte range,
    is_output, hooked). `inputs` are the tensors a backward call differentiates for (autograd.grad's
    inputs, backward's inputs=); `retain` says whether that call keeps the graph's buffers.
    """
    nodes, tensors = recorder.graph.nodes, recorder.tensors
    stack, root_keys, held = [], [], {}
    for r in roots:
        fn = r.grad_fn if isinstance(r, torch.Tensor) else r
        if fn is not None:
            key = node_key(fn, tensors)
            stack.append((fn, key))
            root_keys.append(key)
    slots, leaves = [], []
    by_pointer = _PointerIndex(recorder.graph, tensors)
    backward = op_index if kind == "backward" else None
    last_write = recorder.last_write
    folded_runs = recorder.folding.node_runs if recorder.folding.nodes else None
    op_of_seq = recorder.node_ranges.op_of_seq
    tensor_tid = tensors.tid
    while stack:
        fn, key = stack.pop()
        if id(fn) in held:
            continue
        held[id(fn)] = fn
        entry = nodes.get(key)
        if entry is not None and backward is None and entry[NODE_SEEN] > last_write:
            continue  # walked before, and nothing was written since: the same subgraph, the same slots
        # Each child's key is computed once, here, and travels with it on the stack (a leaf's key
        # costs a tensor lookup).
        nexts = fn.next_functions
        keys = [None if c is None else c._sequence_nr() if type(c) is not _ACCUMULATE_GRAD
                else -1 - tensor_tid(c.variable) for c, _ in nexts]  # node_key, written out
        if entry is None:
            variable = tensor_tid(fn.variable) if type(fn) is _ACCUMULATE_GRAD else None
            child_keys = tuple(keys)
            name = _node_names.get(type(fn)) or node_name(fn)
            runs = folded_runs(key) if folded_runs is not None else ()
        else:
            name, child_keys, variable, runs = entry[NODE_NAME], entry[NODE_CHILDREN], entry[NODE_LEAF], entry[NODE_RUNS]
        if backward is not None and (not runs or runs[-1] != backward):  # indices only grow
            if type(runs) is list:
                runs.append(backward)
            else:
                runs = runs + (backward,)
        # A tuple of ints and strings leaves the cyclic GC (a list would be tracked, and walked by
        # every full collection, for every node of a long loop). A leaf's AccumulateGrad is run by
        # every backward of a training loop: its runs stay a list, one per leaf.
        if key < 0:
            entry = nodes[key] = [name, child_keys, variable, runs if type(runs) is list else list(runs), op_index]
            leaves.append(variable)
        else:
            entry = nodes[key] = (name, child_keys, None, tuple(runs), op_index)
        for (c, _), k in zip(nexts, keys):
            if c is not None and id(c) not in held:
                stack.append((c, k))
        names = _saved_names_by_type.get(type(fn))
        if names is None:
            names = saved_names(fn)
        if names:
            made_by = None if key < 0 else op_of_seq(key)
            # Only a write after the node was made can have changed what it saved.
            check = made_by is None or last_write > made_by
            for name, raw_attr, check_attr in names:
                slots.extend(_slots_of(fn, key, name, raw_attr, check_attr, recorder, by_pointer, check,
                                       entry, op_index, made_by))
    if len(held) > DEEP_GRAPH:
        _allow_deep_graph_deletion()
    walked = list(held.values()) if backward is not None and recorder.check_nan else ()
    held.clear()
    input_keys = []
    for t in inputs:
        fn = t.grad_fn
        tid = tensors.tid(t)
        # A leaf's key is the one its AccumulateGrad node gets.
        input_keys.append((tid, node_key(fn, tensors) if fn is not None else -1 - tid))
    return Snapshot(op_index, kind, root_keys, slots, input_keys, retain), leaves if backward is not None else (), walked


DEEP_GRAPH = 20_000


def _allow_deep_graph_deletion():
    """Work around a PyTorch 2.13 crash: once Python has wrapped the nodes of a graph (as any walk
    over next_functions does), freeing it recurses once per node and overflows an 8 MiB stack
    past ~40,000 nodes. The main thread's stack can grow up to the soft limit, so raise it."""
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
        want = 1 << 30 if hard == resource.RLIM_INFINITY else min(hard, 1 << 30)
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_STACK, (want, hard))
            STACK_RAISED[0] = (soft, want)
    except (ImportError, ValueError, OSError):
        pass


STACK_RAISED = [None]  # (old, new) soft stack limit, once raised


def _ran_before(entry, op_index, retained):
    """Whether a backward that did not retain the graph ran this node before op `op_index`."""
    return any(b < op_index and not retained.get(b, False) for b in entry[NODE_RUNS])


def _freed_slot(key, slot):
    return (key, slot, None, (), "", None, None, False, True, None, False, False)


def _slots_of(fn, key, name, raw_attr, check_attr, recorder, by_pointer, check, entry, op_index, made_by):
    """The slots of one saved attribute of node `fn` (made by op `made_by`). An empty slot is freed
    if a backward that did not retain the graph ran the node before; otherwise it was never saved
    (its input needed no gradient)."""
    try:
        raw = getattr(fn, raw_attr)
    except RuntimeError:  # lists of saved tensors raise once an earlier backward freed them
        return (_freed_slot(key, name),)
    if type(raw) is list or type(raw) is tuple:
        items = [("%s[%d]" % (name, i), r) for i, r in enumerate(raw)]
        hooked = any(saved.unpack_hook is not None for _, saved in items)
    else:  # one saved tensor: the usual case
        items = ((name, raw),)
        hooked = raw.unpack_hook is not None
    stale, versions = None, None
    out = []
    tensors = recorder.tensors
    tid_of, refs = tensors.tid_of, tensors.refs
    for slot, saved in items:
        if hooked:
            # Packed by a saved-tensor hook (checkpointing, save_on_cpu, the user's own): checking
            # it would run the unpack hook, which may recompute a forward or be single-use.
            # PyTorch checks such tensors when it unpacks them; we never do.
            out.append((key, slot, None, (), "", None, None, False, False, None, False, True))
            continue
        data = saved.data
        if data is None:
            if _ran_before(entry, op_index, recorder.backward.retained):
                out.append(_freed_slot(key, slot))
            continue  # never saved: that input needed no gradient
        if stale is None:
            stale, versions = _check(fn, check_attr) if check else (False, None)
        t_id = tid_of.get(id(data))  # tensors.known, written out
        if t_id is not None and refs[t_id]() is not data:
            t_id = None
        is_output = t_id is None
        if is_output:
            # Saved outputs and views made inside a call (weight.t() in F.linear) come back as
            # new tensor objects: find the recorded tensor they alias.
            base = data._base
            t_id = tensors.known(base) if base is not None else None
            if t_id is None:
                t_id = _match_output(recorder, made_by, data)
            if t_id is None:
                t_id = by_pointer(data)
        current = data._version
        # A list (a custom Function's saved_tensors) is checked as a whole, and PyTorch's error gives the
        # version of the one stale tensor it met: the others of the list are not stale for it.
        item_stale = bool(stale) and (len(items) == 1 or versions is None or current == versions[0])
        saved_version = versions[1] if item_stale and versions else current
        out.append((key, slot, t_id, shape_of(data), data.dtype, saved_version, current, item_stale, False,
                    byte_range(data) if check else None, is_output, False))
    return out


def _check(fn, attr):
    """Run PyTorch's own saved-variable check. Returns (stale, (current, expected) or None)."""
    try:
        getattr(fn, attr)
    except Exception as exc:
        m = _STALE.search(str(exc))
        if m:
            return True, (int(m.group(1)), int(m.group(2)))
        return False, None
    return False, None


class _PointerIndex:
    """The recorded tensor a saved tensor's memory belongs to (GraphRecord.pointer_index: data pointer
    -> a tid, or a list of the tids when several share it); entries of dead tensors are dropped when
    met."""

    def __init__(self, graph, tensors):
        self.graph, self.tensors = graph, tensors

    def __call__(self, data):
        graph, refs = self.graph, self.tensors.refs
        index = graph.pointer_index
        for t_id in range(graph.pointer_indexed, len(refs)):
            t = refs[t_id]()
            if t is not None:
                try:
                    ptr = t.data_ptr()
                except Exception:
                    continue
                # Most pointers belong to one tensor: a list for each would be one more object per
                # tensor for the cyclic GC.
                held = index.get(ptr)
                if held is None:
                    index[ptr] = t_id
                elif type(held) is int:
                    index[ptr] = [held, t_id]
                else:
                    held.append(t_id)
        graph.pointer_indexed = len(refs)
        try:
            ptr = data.data_ptr()
        except Exception:
            return None
        held = index.get(ptr)
        if held is None:
            return None
        candidates = []
        for t_id in ((held,) if type(held) is int else held):
            t = refs[t_id]()
            if t is not None and t.data_ptr() == ptr:
                candidates.append(t_id)
        if not candidates:
            del index[ptr]
            return None
        index[ptr] = candidates[0] if len(candidates) == 1 else candidates
        metas = self.tensors.meta
        # The original tensor rather than a `.data` alias or a view of it.
        plain = [t for t in candidates if metas[t][META_ALIAS] is None and metas[t][META_BASE] is None]
        return (plain or candidates)[0]


def _match_output(recorder, op_index, data):
    """A saved output comes back as a new tensor object: find the recorded tensor it aliases among the
    outputs of op `op_index` (the op that made its node)."""
    ptr, shape = data.data_ptr(), shape_of(data)
    candidates = recorder.ops[op_index][OP_OUT] if op_index is not None else ()
    refs, metas = recorder.tensors.refs, recorder.tensors.meta
    for t_id in candidates:
        t = refs[t_id]()
        if t is not None and t.data_ptr() == ptr and shape_of(t) == shape:
            return t_id
    for t_id in candidates:
        if tuple(metas[t_id][META_SHAPE]) == shape:
            return t_id
    return None
