"""With check_nan, the line inside a compiled region whose backward made the first NaN or Inf.

A region's backward is one node (CompiledFunctionBackward) running the backend's compiled code:
the NaN watch (nan_watch.py) can tell that this node made the first non-finite gradient, not which
of the region's lines did. Dynamo's graph of the region can: when the node's post-hook sees that it
turned finite incoming gradients into non-finite ones, the graph is run once more, op by op as
plain PyTorch runs it, on detached copies of the region's inputs (as they were when it ran: weak
references, and their versions must not have moved since), then differentiated with the node's
incoming gradients under a NaN watch of its own. The node of the replay where the first NaN/Inf
appeared, and the graph node that made it, give the line inside the region, the autograd node
plain PyTorch would have named (PowBackward0) and what its saved inputs held. The replay runs
torch's ops only (a graph calling anything else is not replayed), records nothing, touches no
`.grad`, and leaves the random number generators as they were. Where it cannot run, the region's
own node is what is named, at the line that made its last output.
"""
from __future__ import annotations

import weakref

import torch

from . import nan_watch
from .compiled_graph import is_compiled_function

_Tensor = torch.Tensor
_all_torch_function_off = torch._C.DisableTorchFunction
_next_seq = torch._C._autograd._get_sequence_nr
KEEP = 64  # region calls whose inputs are remembered for a replay (a training loop makes one per step)


class RegionInputs:
    """What a replay of one region call needs, without keeping anything alive: the graph and the
    inputs by weak reference, each tensor's version when the region ran, and the region's output
    offset among its apply's results (the inputs it mutated come first)."""

    __slots__ = ("graph", "inputs", "offset")

    def __init__(self, graph, args, offset):
        self.graph = weakref.ref(graph)
        self.inputs = [(weakref.ref(a), a._version) if isinstance(a, _Tensor) else (None, a) for a in args]
        self.offset = offset

    def values(self):
        """The inputs, or None if one is gone or was written since."""
        out = []
        for ref, kept in self.inputs:
            if ref is None:
                out.append(kept)
                continue
            t = ref()
            if t is None or t._version != kept:
                return None
            out.append(t)
        return out


def replayable(graph) -> bool:
    """A graph of torch's own ops (a user's autograd.Function or custom op inside would run the
    user's code again)."""
    for node in graph.graph.nodes:
        if node.op == "call_function":
            module = getattr(node.target, "__module__", None) or ""
            if not (module.startswith(("torch", "_operator")) or type(node.target).__name__ ==
                    "builtin_function_or_method") or module.startswith("torch._higher_order_ops"):
                return False
        elif node.op in ("call_module", "get_attr"):
            return False
    return True


class NanReplays:
    """Post-hooks on the region nodes of one backward call, and what they found: node key -> (the
    graph node, the autograd node's name, facts) of the first NaN/Inf made inside the region."""

    __slots__ = ("handles", "found", "fail", "index")

    def __init__(self, fail, backward_index):
        self.fail = fail  # the recorder's: an internal error switches recording off
        self.index = backward_index
        self.handles = []
        self.found = {}

    def attach(self, nodes, remembered):
        for fn in nodes:
            cls = getattr(fn, "_forward_cls", None)
            if cls is not None and is_compiled_function(cls):
                entry = remembered.get(fn._sequence_nr())
                if entry is not None:
                    self.handles.append(fn.register_hook(self._after(fn, entry)))

    def detach(self):
        handles, self.handles = self.handles, []
        for handle in handles:
            handle.remove()

    def _after(self, fn, entry):
        def hook(grad_inputs, grad_outputs):
            try:
                if self.found:
                    return None
                with _all_torch_function_off():
                    if _finite(grad_outputs) and not _finite(grad_inputs):
                        place = replay(entry, grad_outputs, self.index, self.fail)
                        if place is not None:
                            self.found[fn._sequence_nr()] = place
            except Exception as exc:  # never let the tool break the user's backward
                self.fail(exc)
            return None
        return hook


def _finite(tensors):
    with torch.no_grad():
        return all(not isinstance(g, _Tensor) or not (g.is_floating_point() or g.is_complex())
                   or bool(torch.isfinite(g).all()) for g in tensors)


def replay(entry, grad_outputs, backward_index, fail):
    """(the name of the graph node, the name of the autograd node, facts) of the first NaN/Inf of the
    region's graph run again and differentiated with `grad_outputs`; None when it cannot be run or
    finds none."""
    graph, values = entry.graph(), entry.values()
    if graph is None or values is None:
        return None
    devices = sorted({v.device.index for v in values if isinstance(v, _Tensor) and v.is_cuda})
    with torch.random.fork_rng(devices=devices), torch.enable_grad():
        inputs = [v.detach().requires_grad_(v.requires_grad) if isinstance(v, _Tensor) else v for v in values]
        runner = _Run(graph)
        outputs = runner.run(*inputs)
        outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
        roots, grads = [], []
        for j, out in enumerate(outputs):
            at = entry.offset + j
            g = grad_outputs[at] if at < len(grad_outputs) else None
            if isinstance(out, _Tensor) and out.requires_grad and isinstance(g, _Tensor):
                roots.append(out)
                grads.append(g)
        leaves = [t for t in inputs if isinstance(t, _Tensor) and t.requires_grad]
        if not roots or not leaves:
            return None
        watch = nan_watch.NanWatch(fail, backward_index)
        watch.attach(_nodes_of(roots))
        try:
            torch.autograd.grad(roots, leaves, grads, allow_unused=True)
        finally:
            watch.detach()
    if watch.origin is None:
        return None
    _, key, name, facts = watch.origin
    node = runner.node_of(key)
    return None if node is None else (node.name, name, facts)


class _Run(torch.fx.Interpreter):
    """Runs a graph op by op, noting the autograd nodes each op made (by sequence number)."""

    def __init__(self, graph):
        super().__init__(graph)
        self.made = []  # (first, end) sequence numbers, fx node

    def run_node(self, n):
        first = _next_seq()
        result = super().run_node(n)
        end = _next_seq()
        if end != first:
            self.made.append((first, end, n))
        return result

    def node_of(self, key):
        for first, end, n in self.made:
            if first <= key < end:
                return n
        return None


def _nodes_of(roots):
    """Every node of the graphs behind `roots`, once."""
    seen, stack, out = set(), [t.grad_fn for t in roots if t.grad_fn is not None], []
    while stack:
        fn = stack.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        out.append(fn)
        stack.extend(c for c, _ in fn.next_functions if c is not None)
    return out
