"""Walks that several rules share, over plain data only: the order in which backward runs the
nodes, the grad_fn a tensor had at a given op, and where a chain of tensors stopped requiring grad.
"""
from __future__ import annotations

import bisect
import heapq
from typing import Dict, Iterable, List, Optional, Set, Tuple

from .records import GRAD_MODE_SWITCHES, Checkpoint, ModuleCall, OpRecord
from .trace import TraceData

# Ops that turn a tensor into Python values: the chain to the graph ends there.
_EXITS = {"item", "tolist", "numpy", "__float__", "__int__", "__index__", "__complex__", "__array__"}
# Recorded factories that make a tensor from the values they are given.
_FROM_VALUES = {"torch.tensor", "torch.as_tensor", "torch.asarray"}


def engine_order(trace: TraceData, cp: Checkpoint) -> List[int]:
    """The nodes a backward call runs, in the order PyTorch's engine runs them: only nodes
    reachable from its roots (and, for autograd.grad, on a path to its inputs); a node runs once
    every node that feeds it has run, the highest sequence number first among the ready ones
    (AccumulateGrad, which has none, first of all)."""
    nodes = trace.nodes
    reach = reachable(trace, cp.roots)
    if cp.inputs:
        reach = leading_to(trace, reach, cp.inputs)
    feeds: Dict[int, List[int]] = {}  # node -> the nodes it feeds within reach, each once
    waiting: Dict[int, int] = {}
    for key in reach:
        inputs = nodes[key].inputs
        children = [child for child in (set(inputs) if len(inputs) > 1 else inputs) if child in reach]
        feeds[key] = children
        for child in children:
            waiting[child] = waiting.get(child, 0) + 1
    ready = [(_NO_SEQUENCE if k < 0 else -k, k) for k in dict.fromkeys(cp.roots) if k in reach and not waiting.get(k)]
    heapq.heapify(ready)
    order = []
    while ready:
        _, key = heapq.heappop(ready)
        order.append(key)
        for child in feeds[key]:
            left = waiting[child] - 1
            waiting[child] = left
            if left == 0:
                heapq.heappush(ready, (_NO_SEQUENCE if child < 0 else -child, child))
    return order


_NO_SEQUENCE = -float("inf")  # the heap's key of a node with no sequence number (AccumulateGrad): first


def reachable(trace: TraceData, roots: Iterable[int]) -> Set[int]:
    """The nodes reachable from `roots` through next_functions (the roots included)."""
    nodes = trace.nodes
    seen: Set[int] = set()
    stack = [r for r in roots if r in nodes]
    while stack:
        key = stack.pop()
        if key not in seen:
            seen.add(key)
            for k in nodes[key].inputs:
                if k not in seen and k in nodes:
                    stack.append(k)
    return seen


def leading_to(trace: TraceData, within: Iterable[int], targets: Iterable[int]) -> Set[int]:
    """The nodes of `within` from which one of `targets` can be reached (the targets included)."""
    within = set(within)
    parents: Dict[int, List[int]] = {}
    for key in within:
        for child in trace.nodes[key].inputs:
            parents.setdefault(child, []).append(key)
    found: Set[int] = set()
    stack = [k for k in targets if k in within]
    while stack:
        key = stack.pop()
        if key not in found:
            found.add(key)
            stack.extend(parents.get(key, ()))
    return found


def node_at(trace: TraceData, tid: int, op_index: int,
            makers: Optional[Dict[int, List[int]]] = None) -> Optional[int]:
    """The key of the grad_fn that tensor `tid` had just before op `op_index` ran: for a leaf that
    requires grad, its AccumulateGrad's (-1 - tid); None when it required no grad then. A write that
    made no node (under no_grad: an optimizer step, an initialisation, `h.add_(1)`) leaves the tensor
    the node it had; a result that needs no grad of an op that made a node (max's indices) has none.
    `makers`: tid -> the indices, ascending, of the ops that made or wrote it, for a caller that asks
    often (and chooses which ops count); else every op before `op_index` is looked at."""
    info = trace.tensors.get(tid)
    requires = info is not None and info.first_requires_grad
    if requires and info.is_leaf:
        return -1 - tid  # a leaf that requires grad stays one: writes to it run under no_grad
    ops = trace.ops
    if makers is None:
        candidates = (op for op in reversed(ops[:op_index]) if tid in op.outputs or tid in op.writes)
    else:
        indices = makers.get(tid, ())
        candidates = (ops[k] for k in reversed(indices[:bisect.bisect_left(indices, op_index)]))
    for op in candidates:
        if op.node is not None and (tid in op.writes or tid in op.inputs or requires):
            return op.node  # made with a graph, or written in place by an op that recorded a node
        if tid in op.outputs and tid not in op.inputs and tid not in op.writes:
            return None  # made here without a graph
    return -1 - tid if requires else None


def requires_grad(trace: TraceData, tid: int) -> bool:
    info = trace.tensors.get(tid)
    return info is not None and info.first_requires_grad


def is_cut(trace: TraceData, op: OpRecord) -> bool:
    """The op took a tensor that requires grad and gave back none that does: `.detach()`, `.data`,
    `.item()`, `.numpy()`, argmax, a comparison, an integer cast, any op under no_grad."""
    if op.error or op.is_backward or not any(requires_grad(trace, t) for t in op.inputs):
        return False
    if op.outputs:
        return not any(requires_grad(trace, t) for t in op.outputs + op.writes)
    return op.name.rpartition(".")[2] in _EXITS


def is_exit(op: OpRecord) -> bool:
    """The op turned a tensor into Python values (`.item()`, `.numpy()`, `float(t)`, ...)."""
    return not op.outputs and op.name.rpartition(".")[2] in _EXITS


def switch_left_on(trace: TraceData, op: OpRecord) -> Optional[OpRecord]:
    """For an op that ran with grad off: the grad-mode switch that turned it off, when that switch is
    not a scope around the op; else None. A scope's enter and exit are recorded at one line (a `with`
    statement; the call of a function decorated with `@torch.no_grad()`, entered and left in
    torch's wrapper), the exit putting back the mode the enter found. The op ran inside it when that
    line switched back after the op, and the op is in the same function as the `with`, or in a
    user-written module called from inside the `with` block (see scope_call), or the scope is a
    decorated call that had not returned. Anything else left the mode off behind it:
    `torch.set_grad_enabled(False)` never switched back (or switched back on another path),
    `no_grad().__enter__()`, a generator suspended at a `yield` inside `with torch.no_grad():`, a
    `with` block around the call of a plain function that made the op (nothing recorded tells it
    from the generator)."""
    found = _open_switch(trace, op)
    if found is None:
        return None
    switch, closed = found
    where, at = switch.location, op.location
    if closed and (not where.source.startswith(("with ", "async with "))
                   or where.function_key == at.function_key
                   or _call_from_block(trace, op, switch) is not None):
        return None
    return switch


def scope_call(trace: TraceData, op: OpRecord) -> Optional[OpRecord]:
    """For an op that ran with grad off inside a user-written module called from an open grad-off
    `with` block of another function (`with torch.no_grad(): logits = self.net(x)`): the op placed at
    that call, the line of the block that ran under grad off. Else None."""
    found = _open_switch(trace, op)
    if found is None or not found[1] or not found[0].location.source.startswith(("with ", "async with ")):
        return None
    call = _call_from_block(trace, op, found[0])
    return _placed(op, call) if call is not None else None


def _open_switch(trace: TraceData, op: OpRecord) -> Optional[Tuple[OpRecord, bool]]:
    """(the innermost grad-off switch still open when `op` ran, whether the same line put the mode back
    after it), or None (off since before the block, or in a way we did not see)."""
    if op.grad_enabled or op.location is None:
        return None
    open_switches: List[Tuple[OpRecord, bool]] = []  # (switch, the mode it found), innermost last
    mode = True
    for other in trace.ops[:op.index]:
        if other.name not in GRAD_MODE_SWITCHES or other.grad_enabled == mode:
            continue  # `with torch.set_grad_enabled(False)` sets the mode twice: once is the switch
        if (open_switches and open_switches[-1][0].location == other.location
                and open_switches[-1][1] == other.grad_enabled):
            open_switches.pop()  # the exit of a scope
        else:
            open_switches.append((other, mode))
        mode = other.grad_enabled
    if not open_switches or open_switches[-1][0].grad_enabled:
        return None
    switch, found = open_switches[-1]
    if switch.location is None:
        return None
    closed = any(o.name in GRAD_MODE_SWITCHES and o.location == switch.location and o.grad_enabled == found
                 for o in trace.ops[op.index + 1:])
    return switch, closed


def _call_from_block(trace: TraceData, op: OpRecord, switch: OpRecord) -> Optional[ModuleCall]:
    """The outermost call of a user-written module that ran `op`, made from the function of the `with`
    statement `switch`, below it and after it was entered."""
    where = switch.location
    for call in trace.calls:  # an enclosing call before those inside it
        at = call.location
        if call.first_op <= op.index < call.end_op and switch.index < call.first_op and at.line > where.line \
                and at.function_key == where.function_key:
            return call
    return None


def ancestors(trace: TraceData, tids: Iterable[int], before: int) -> Set[int]:
    """Every tensor the given ones were computed from, through recorded ops before `before`. A
    tensor made from Python values (torch.tensor(x), or from_numpy, which is not recorded) is
    linked to the tensor those values were taken out of (see exit_before)."""
    found = set(tids)
    bridged: Set[int] = set()
    ops = [op for op in trace.ops[:before] if not op.is_backward]
    while True:
        size = len(found)
        for op in reversed(ops):
            if not any(t in found for t in op.outputs + op.writes):
                continue
            if op.inputs:
                found.update(op.inputs)
            else:
                _bridge(trace, op, made_from_values(trace, op), found)
        for t in list(found):  # first seen as an input, made from Python values we did not see
            info = trace.tensors.get(t)
            if t not in bridged and info is not None and info.created_by is None and not info.first_requires_grad:
                bridged.add(t)
                use = next((op for op in ops if t in op.inputs), None)
                if use is not None:
                    _bridge(trace, use, t, found)
        if len(found) == size:
            return found


def _bridge(trace: TraceData, op: OpRecord, made: Optional[int], found: Set[int]) -> None:
    exit_op = exit_before(trace, op, made)
    if exit_op is not None:
        found.update(exit_op.inputs)


def made_from_values(trace: TraceData, op: OpRecord) -> Optional[int]:
    """The tensor that `op` made from given values (`torch.tensor(v)`, not `torch.zeros(n)`, which is made
    from sizes), or first used when its maker was not recorded (torch.from_numpy, torch.Tensor(list)),
    if any."""
    if not op.inputs:
        return op.outputs[0] if op.outputs and op.name in _FROM_VALUES else None
    for t in op.inputs:
        info = trace.tensors.get(t)
        if info is not None and info.created_by is None and not info.first_requires_grad \
                and next((o for o in trace.ops if t in o.inputs), None) is op:
            return t
    return None


def exit_before(trace: TraceData, op: OpRecord, made: Optional[int] = None, lines: int = 3) -> Optional[OpRecord]:
    """The op that turned a tensor into the Python values that tensor `made` was built from, `op`
    being the one that made it or first used it: the latest exit since the last backward call that
    took out values of the very shape `made` has (a round trip keeps it: `.numpy()` then
    `torch.from_numpy`, `.tolist()` then `torch.tensor`, `.item()` for one value), wherever it ran
    (a helper that returns the array); or, for values gathered from several exits
    (`torch.tensor([a.item(), b.item()])`), one at that line (a comprehension on it included) or in
    op's function at most `lines` above it."""
    loc = op.location
    info = trace.tensors.get(made) if made is not None else None
    for other in reversed(trace.ops[:op.index]):
        if other.is_backward:
            return None  # values of an earlier step's forward are not this one's
        if other.outputs or other.name.rpartition(".")[2] not in _EXITS or not other.inputs:
            continue
        taken = trace.tensors.get(other.inputs[0])
        if info is not None and taken is not None and _same_values_shape(taken.shape, info.shape):
            return other
        there = other.location
        if loc is None or there is None or there.filename != loc.filename:
            continue
        if there.line == loc.line or (there.function == loc.function and 0 <= loc.line - there.line <= lines):
            return other
    return None


def _same_values_shape(taken: Tuple[int, ...], made: Tuple[int, ...]) -> bool:
    """Values taken out of a tensor of shape `taken` can make one of shape `made`: the same shape, or
    one value made into a tensor of one element."""
    return tuple(taken) == tuple(made) or (_numel(taken) == 1 and _numel(made) == 1)


def _numel(shape) -> int:
    n = 1
    for size in shape:
        n *= size
    return n


def descendants(trace: TraceData, tid: int, after: int = -1) -> Tuple[Set[int], List[OpRecord]]:
    """Tensors computed from `tid` by ops after `after`, and the cuts met on the way."""
    found, cuts = {tid}, []
    for op in trace.ops[after + 1:]:
        if op.is_backward or not any(t in found for t in op.inputs):
            continue
        if is_cut(trace, op):
            cuts.append(op)
        found.update(op.outputs)
        found.update(op.writes)
    return found, cuts


def first_use(trace: TraceData, tid: int, grad_enabled: bool = True) -> Optional[OpRecord]:
    for op in trace.ops:
        if tid in op.inputs and not op.is_backward and (op.grad_enabled or not grad_enabled):
            return op
    return None


def at_caller(trace: TraceData, op: OpRecord, tid: Optional[int]) -> OpRecord:
    """`op` placed at the user's line that called the module it ran in, when it ran inside a
    user-written module that got tensor `tid` as an argument (`D(fake)`, not the `self.net(x)` in
    D.forward that used it); else `op` itself. The outermost such call."""
    if tid is None:
        return op
    for call in trace.calls:  # ordered by first op, an enclosing call before those inside it
        if call.first_op <= op.index < call.end_op and tid in call.inputs:
            return _placed(op, call)
    return op


def at_maker(trace: TraceData, tid: Optional[int], op: Optional[OpRecord]) -> Optional[OpRecord]:
    """The op that made tensor `tid`, placed at the line that called the user-written module which
    returned it (`fake = G(z)`, not the last line of G.forward), if one did."""
    if op is None or tid is None:
        return op
    for call in trace.calls:
        if tid in call.outputs and call.first_op <= op.index < call.end_op:
            return _placed(op, call)
    return op


def _placed(op: OpRecord, call: ModuleCall) -> OpRecord:
    moved = OpRecord(**{name: getattr(op, name) for name in OpRecord.__slots__})
    moved.location = call.location
    return moved


def cut_outputs(trace: TraceData, op: OpRecord) -> Tuple[int, ...]:
    """The results of `op` on which a chain stopped requiring grad: it took a tensor that requires
    grad and gave back these without. All of them for `.detach()`, argmax, a comparison, an integer
    cast or an op under no_grad; only the indices of `torch.max(y, 1)`, whose values keep theirs."""
    if op.error or op.is_backward or not any(requires_grad(trace, t) for t in op.inputs):
        return ()
    return tuple(t for t in op.outputs if not requires_grad(trace, t))


class FunctionCalls:
    """The calls of custom autograd.Functions (trace.function_calls): their forward runs with grad
    off because the call runs it, so an op in there ran in the grad mode of the call, as the user's
    code sees it (a parameter used inside `checkpoint(block, x)` is used with grad on)."""

    def __init__(self, trace: TraceData):
        self.trace = trace
        self.spans = sorted(trace.function_calls)
        self.firsts = [first for first, _ in self.spans]

    def enclosing(self, op: OpRecord) -> Optional[OpRecord]:
        """The outermost call whose forward ran `op`, if it ran with grad on and `op` with grad off."""
        if op.grad_enabled or not self.spans:
            return None
        ops = self.trace.ops
        outer = None
        for i in range(bisect.bisect_right(self.firsts, op.index) - 1, -1, -1):
            first, call = self.spans[i]
            if first <= op.index < call and call < len(ops) and ops[call].grad_enabled:
                outer = ops[call]
        return outer

    def grad_enabled(self, op: OpRecord) -> bool:
        return op.grad_enabled or self.enclosing(op) is not None


def stops_after(trace: TraceData, tid: int, after: int, before: int) -> Tuple[Set[int], List[Tuple[OpRecord, Tuple[int, ...]]]]:
    """Tensors computed from `tid` by ops in (after, before), and the ops met on the way where the chain
    stopped requiring grad, with the results on which it did (an op that turned tensors into Python
    values has none: it is listed with ())."""
    found, stops = {tid}, []
    for op in trace.ops[after + 1:before]:
        if op.is_backward or not any(t in found for t in op.inputs):
            continue
        cut = cut_outputs(trace, op)
        if cut or (not op.outputs and is_cut(trace, op)):
            stops.append((op, cut))
        found.update(op.outputs)
        found.update(op.writes)
    return found, stops
