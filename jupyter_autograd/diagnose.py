"""Rules that turn a Trace into Diagnoses, each with a plain-words message and a concrete fix.

Works on plain data only. The facts the rules rely on were established by the capture with
PyTorch's own checks (a saved slot is `stale` exactly when backward would raise), so the rules
only have to find *which* recorded write did it and say so in the user's terms.
"""
from __future__ import annotations

import ast
import bisect
import re
from typing import Dict, List, Optional, Tuple

from .model import Checkpoint, Diagnosis, OpRecord, SavedSlot, Trace

_LEAF_ERRORS = ("leaf Variable that requires grad is being used in an in-place operation",)
_ORDER = {"leaf-inplace": 0, "saved-tensor-modified": 1, "silent-data-mutation": 2, "accumulated-graph": 3}


def diagnose(trace: Trace) -> List[Diagnosis]:
    found = _leaf_inplace(trace) + _saved_tensor_writes(trace) + _accumulated_graphs(trace)
    # Within a kind, the problem backward meets first comes first (higher node sequence numbers
    # run earlier in backward).
    found.sort(key=lambda d: (_ORDER[d.kind], d.op_index if d.kind == "leaf-inplace" else 0,
                              -(d.node_key or 0)))
    return found


# -- leaf-inplace ---------------------------------------------------------------------------------

def _leaf_inplace(trace: Trace) -> List[Diagnosis]:
    out = []
    for op in trace.ops:
        if not op.error or not any(e in op.error for e in _LEAF_ERRORS):
            continue
        target = _leaf_input(trace, op)
        name = trace.tensor_label(target) if target is not None else None
        loc = op.location
        view = "a view of a leaf" in op.error
        text = loc.source if loc else ""
        message = (
            "`%s` is a leaf tensor that requires grad: backward() will store its gradient in `%s.grad`. "
            "%s changes %s in place (%s), which PyTorch forbids while it records the graph, because the "
            "gradient must be computed with respect to the value the tensor had when it was used. "
            "PyTorch raised: \"%s\"" % (name, name, _where(op), "a view of it" if view else "it",
                                         _describe_write(op), op.error.split(": ", 1)[-1].split("\n")[0]))
        if text:
            fix = ("Do the change without recording it, before the tensor is used:\n"
                   "    with torch.no_grad():\n        %s\n"
                   "or make the change before setting requires_grad=True (or on `%s.detach()`)." % (text, name))
        else:
            fix = "Wrap the in-place change in `with torch.no_grad():`, before the tensor is used."
        out.append(_diag(trace, "leaf-inplace", op, message, fix, tensor=name,
                         tids=(target,) if target is not None else ()))
    return out


def _leaf_input(trace: Trace, op: OpRecord) -> Optional[int]:
    for t_id in op.inputs:
        info = trace.tensors.get(t_id)
        if info is None:
            continue
        if info.is_leaf and info.requires_grad:
            return t_id
        base = trace.tensors.get(info.base) if info.base is not None else None
        if base is not None and base.is_leaf and base.requires_grad:
            return t_id
    return op.inputs[0] if op.inputs else None


# -- saved-tensor-modified and silent-data-mutation -----------------------------------------------

def _saved_tensor_writes(trace: Trace) -> List[Diagnosis]:
    found: Dict[Tuple, Diagnosis] = {}
    write_index = _WriteIndex(trace)
    for cp in trace.checkpoints:
        for slot in cp.slots:
            if slot.freed or slot.byte_range is None:
                continue
            node = trace.nodes.get(slot.node)
            saved_op = node.created_by if node is not None else None
            if saved_op is None and not slot.stale:
                continue  # cannot order the writes against the save: say nothing rather than guess
            # PyTorch checks versions per counter, and every view of a tensor shares its base's
            # counter: a write to h[t + 1] makes a saved h[t] stale though their bytes differ.
            root = _root(trace, slot.tid) if slot.stale else None
            writes = _WriteIndex.between(trace, write_index, slot.byte_range, -1 if saved_op is None else saved_op,
                                         cp.op_index, root)
            if slot.stale:
                counted = [w for w in writes if not _is_data_alias(trace, w[1])]
                culprit = (counted or writes or [None])[0]
                kind = "saved-tensor-modified"
            elif writes:
                through_data = [w for w in writes if _is_data_alias(trace, w[1])]
                culprit = (through_data or writes)[0]
                kind = "silent-data-mutation"
            else:
                continue
            affected = slot.tid if slot.tid is not None else (culprit[1] if culprit else None)
            key = (kind, culprit[0].index if culprit else None, affected if affected is not None else slot.node)
            if key in found and (found[key].node_key or 0) >= slot.node:
                continue
            found[key] = _saved_diagnosis(trace, kind, cp, slot, node, saved_op, culprit, affected)
    return _merge_same_write(list(found.values()))


def _merge_same_write(diagnoses: List[Diagnosis]) -> List[Diagnosis]:
    """One line that breaks many saved tensors (optimizer.step() on a whole model, a write in a
    loop) is one problem: name the tensor backward meets first and list the others."""
    by_write: Dict[Tuple, List[Diagnosis]] = {}
    for d in diagnoses:
        # Per line, not per op: optimizer.step() writes each parameter with an op of its own.
        key = (d.kind, d.filename, d.line) if d.line is not None else (d.kind, id(d))
        by_write.setdefault(key, []).append(d)
    merged = []
    for group in by_write.values():
        group.sort(key=lambda d: -(d.node_key or 0))
        first = group[0]
        others = [d.tensor or "?" for d in group[1:]]
        if others:
            shown = ", ".join("`%s`" % o for o in others[:6]) + (", ..." if len(others) > 6 else "")
            first.message += " The same write also changed %d more saved tensor%s: %s." % (
                len(others), "" if len(others) == 1 else "s", shown)
            first.also = tuple(others)
            first.tids = tuple(dict.fromkeys(first.tids + tuple(t for d in group[1:] for t in d.tids)))
        merged.append(first)
    return merged


class _WriteIndex(list):
    """The ops that wrote something, in order: slots look up only those (graphs have 100,000
    saved tensors and ops; writes are few)."""

    def __init__(self, trace: Trace):
        super().__init__(op for op in trace.ops if op.writes)
        self.positions = [op.index for op in self]

    @staticmethod
    def between(trace: Trace, index: "_WriteIndex", byte_range, after: int, before: int,
                root: Optional[int] = None) -> List[Tuple[OpRecord, int]]:
        """Writes in ops after..before that overlap the bytes, or (with root) share its version counter."""
        lo, hi = byte_range
        hits = []
        start = bisect.bisect_right(index.positions, after)
        stop = bisect.bisect_left(index.positions, before)
        for op in index[start:stop]:
            for t_id, rng in zip(op.writes, op.write_ranges):
                if (rng is not None and rng[0] < hi and lo < rng[1]) or (
                        root is not None and _root(trace, t_id) == root and not _is_data_alias(trace, t_id)):
                    hits.append((op, t_id))
                    break
        return hits


def _root(trace: Trace, t_id: Optional[int]) -> Optional[int]:
    """The tensor whose version counter a view shares: the end of its chain of bases."""
    seen = set()
    while t_id is not None and t_id not in seen:
        seen.add(t_id)
        info = trace.tensors.get(t_id)
        if info is None or info.base is None:
            return t_id
        t_id = info.base
    return t_id


def _is_data_alias(trace: Trace, t_id: int) -> bool:
    seen = set()
    while t_id is not None and t_id not in seen:
        seen.add(t_id)
        info = trace.tensors.get(t_id)
        if info is None:
            return False
        if info.data_alias_of is not None:
            return True
        t_id = info.base
    return False


def _saved_diagnosis(trace, kind, cp: Checkpoint, slot: SavedSlot, node, saved_op, culprit, affected):
    name = trace.tensor_label(affected) if affected is not None else "a saved tensor"
    save = trace.ops[saved_op] if saved_op is not None else None
    node_name = node.name if node is not None else "a grad_fn node"
    saved_at = ("on %s (`%s`)" % (_line_ref(save), save.location.source)
                if save is not None and save.location else "before the recorded block")
    after = "backward() raised" if cp.kind == "backward" and _backward_failed(trace, cp) else "backward() will raise"
    if kind == "saved-tensor-modified":
        if culprit is not None:
            what = "%s then changed it in place with %s" % (_where(culprit[0]), _describe_write(culprit[0]))
        else:
            what = "it was then changed in place outside the recorded code"
        message = (
            "`%s` was saved for backward by %s, created %s, at version %s. %s, so it is now at version %s. "
            "%s \"one of the variables needed for gradient computation has been modified by an inplace "
            "operation\": the gradient needs the value `%s` had when it was saved."
            % (name, node_name, saved_at, slot.saved_version, what, slot.current_version, after, name))
        fix = _inplace_fix(trace, culprit[0] if culprit else None, name, save)
    else:
        alias = trace.tensor_label(culprit[1]) if culprit is not None else "an alias"
        message = (
            "`%s` was saved for backward by %s, created %s. %s then overwrote its memory through `%s`, "
            "an alias made with `.data`, which has a version counter of its own: PyTorch cannot see the write, "
            "so backward() raises no error but computes the gradients from the new values. The gradients "
            "are silently wrong." % (name, node_name, saved_at, _where(culprit[0]), alias))
        fix = _data_fix(trace, culprit, name, save)
    diag = _diag(trace, kind, culprit[0] if culprit else None, message, fix, tensor=(
        trace.tensors[affected].name if affected is not None and affected in trace.tensors else None),
        tids=tuple(t for t in (affected, culprit[1] if culprit else None) if t is not None))
    if save is not None and save.location is not None:
        diag.saved_line, diag.saved_filename, diag.saved_source = (save.location.line, save.location.filename,
                                                                    save.location.source)
    diag.saved_op_index = saved_op
    diag.node, diag.node_key = node_name, slot.node
    diag.saved_version, diag.current_version = slot.saved_version, slot.current_version
    diag.predicted = True
    return diag


def _backward_failed(trace: Trace, cp: Checkpoint) -> bool:
    return 0 <= cp.op_index < len(trace.ops) and trace.ops[cp.op_index].error is not None


# -- accumulated-graph ---------------------------------------------------------------------------

def _accumulated_graphs(trace: Trace) -> List[Diagnosis]:
    nodes = trace.nodes
    consumed = {k for k, n in nodes.items() if n.consumed_by}
    if not consumed:
        return []
    out, reported_ops = [], set()
    live = sorted((t for t in trace.tensors.values() if t.alive and t.node is not None and t.node not in consumed),
                  key=lambda t: (t.name is None, t.tid))
    for info in live:
        backward_runs, linking, seen, stack = set(), [], set(), [info.node]
        while stack:
            key = stack.pop()
            if key in seen or key not in nodes:
                continue
            seen.add(key)
            for child in nodes[key].inputs:
                if child in consumed:
                    backward_runs.update(nodes[child].consumed_by)
                    linking.append((key, child))
                elif child not in seen:
                    stack.append(child)
        if len(backward_runs) < 2:
            continue
        key, child = max(linking)
        op_index = nodes[key].created_by
        if op_index is None or op_index in reported_ops:
            continue
        reported_ops.add(op_index)
        op = trace.ops[op_index]
        linked = _tensor_with_node(trace, child, op)
        linked_name = trace.tensor_label(linked) if linked is not None else "the loss"
        name = info.name or trace.tensor_label(info.tid)
        message = (
            "`%s` still holds the autograd graphs of %d iterations that were already backpropagated: %s adds "
            "`%s` as a tensor, which links its whole graph into `%s`. Nothing will ever backpropagate through "
            "them, but none can be freed, so memory grows with every iteration."
            % (name, len(backward_runs), _where(op), linked_name, name))
        src = op.location.source if op.location else ""
        fixed = _replace_name(src, linked_name, linked_name + ".item()") if src and linked is not None else ""
        fix = ("Accumulate a Python number instead of the tensor: `%s`" % fixed if fixed and fixed != src
               else "Accumulate `%s.item()` (a Python number) or `%s.detach()` instead of the tensor."
               % (linked_name, linked_name))
        out.append(_diag(trace, "accumulated-graph", op, message, fix, tensor=info.name,
                         tids=(info.tid,) + ((linked,) if linked is not None else ())))
        out[-1].node_key, out[-1].node = key, nodes[key].name
    return out


def _tensor_with_node(trace: Trace, key: int, op: OpRecord) -> Optional[int]:
    for t_id in op.inputs:
        info = trace.tensors.get(t_id)
        if info is not None and info.node == key:
            return t_id
    for t_id in op.inputs:
        info = trace.tensors.get(t_id)
        if info is not None and info.requires_grad and info.name:
            return t_id
    return None


# -- wording -----------------------------------------------------------------------------------

def _diag(trace, kind, op, message, fix, tensor=None, tids=()) -> Diagnosis:
    loc = op.location if op is not None else None
    return Diagnosis(kind=kind, message=message, fix=fix, filename=loc.filename if loc else None,
                     line=loc.line if loc else None, source=loc.source if loc else "", tensor=tensor,
                     op_index=op.index if op is not None else None, tids=tuple(tids))


def _line_ref(op: OpRecord) -> str:
    return "line %d" % op.location.line if op.location else "an unknown line"


def _where(op: OpRecord) -> str:
    if op.location is None:
        return "An operation"
    return "Line %d (`%s`)" % (op.location.line, op.location.source) if op.location.source else \
        "Line %d" % op.location.line


def _describe_write(op: OpRecord) -> str:
    name = op.name
    short = name.split(".")[-1]
    if short == "__setitem__":
        return "an indexed assignment (`t[...] = ...`)"
    if short.startswith("__i") and short.endswith("__"):
        return "an augmented assignment (`%s`)" % _AUG.get(short, short)
    if short.endswith("_"):
        return "`%s`" % name
    return "`%s(..., inplace=True)`" % name if name.startswith("F.") else "`%s` (which writes to its input)" % name


_AUG = {"__iadd__": "+=", "__isub__": "-=", "__imul__": "*=", "__itruediv__": "/=", "__ipow__": "**=",
        "__ifloordiv__": "//=", "__imod__": "%=", "__iand__": "&=", "__ior__": "|=", "__ixor__": "^=",
        "__imatmul__": "@=", "__ilshift__": "<<=", "__irshift__": ">>="}


def _inplace_fix(trace: Trace, op: Optional[OpRecord], name: str, save: Optional[OpRecord]) -> str:
    if op is None:
        return "Write to a copy (`%s = %s.clone()`) instead of the saved tensor." % (name, name)
    src = op.location.source if op.location else ""
    before = (" Or, if the new values were meant to be used, make the change before %s." % _line_ref(save)
              if save is not None and save.location else "")
    rewritten = out_of_place(src)
    if rewritten:
        return "Use the out-of-place form, which leaves the saved value intact:\n    %s\n%s" % (rewritten, before.strip())
    if src and "[" in src.split("=")[0] and "=" in src:
        target = src.split("[", 1)[0].strip()
        return ("Write to a copy, so the saved tensor keeps its value:\n    %s = %s.clone()\n    %s\n%s"
                % (target, target, src, before.strip()))
    short = op.name.split(".")[-1]
    if "step" in src or "optim" in op.name:
        return ("The optimizer changed parameters that a graph still needs. Call backward() for every loss that "
                "uses them before optimizer.step(), or run the forward pass again after the step (in GAN "
                "training: compute the generator's loss after the discriminator's step, or detach it).")
    if not short.endswith("_") and op.name.startswith("F."):
        return ("%s runs `%s(..., inplace=True)` inside this call. Use its out-of-place form "
                "(e.g. `nn.%s(inplace=False)` or `inplace=False`).%s"
                % (_where(op), op.name, _module_name(short), before))
    return ("%s changes the saved tensor in place with %s. Use the out-of-place form of that operation, "
            "or `.clone()` the tensor before changing it.%s" % (_where(op), _describe_write(op), before))


def _module_name(fn: str) -> str:
    return {"relu": "ReLU", "leaky_relu": "LeakyReLU", "elu": "ELU", "selu": "SELU", "celu": "CELU",
            "hardtanh": "Hardtanh", "relu6": "ReLU6", "dropout": "Dropout", "silu": "SiLU",
            "hardswish": "Hardswish", "hardsigmoid": "Hardsigmoid", "threshold": "Threshold",
            "mish": "Mish", "rrelu": "RReLU", "alpha_dropout": "AlphaDropout"}.get(fn, fn)


def _data_fix(trace: Trace, culprit, name: str, save: Optional[OpRecord]) -> str:
    alias = trace.tensor_label(culprit[1]) if culprit else "the alias"
    made = None
    if culprit is not None:
        info = trace.tensors.get(culprit[1])
        while info is not None and info.data_alias_of is None and info.base is not None:
            info = trace.tensors.get(info.base)
        if info is not None and info.created_by is not None:
            made = trace.ops[info.created_by]
    where = (" (made on %s: `%s`)" % (_line_ref(made), made.location.source)
             if made is not None and made.location else "")
    moved = " or make the change before %s," % _line_ref(save) if save is not None and save.location else ""
    return ("Never write through `.data` into a tensor that backward still needs. Use `.detach()` instead of "
            "`.data` for `%s`%s, so PyTorch checks the write; then write to a copy (`%s.detach().clone()`),%s "
            "or do the update after backward()." % (alias, where, name, moved))


def out_of_place(src: str) -> Optional[str]:
    """The out-of-place form of a line that writes in place, or None when there is no simple one.

    `y += 1` -> `y = y + 1`; `x.add_(b)` -> `x = x.add(b)`; `nn.ReLU(inplace=True)` -> inplace=False.
    """
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return None
    if len(tree.body) != 1:
        return None
    stmt = tree.body[0]
    if isinstance(stmt, ast.AugAssign) and not isinstance(stmt.target, ast.Subscript):
        target = ast.unparse(stmt.target)
        return "%s = %s %s %s" % (target, target, _OPS.get(type(stmt.op), "?"), ast.unparse(stmt.value))
    if "inplace=True" in src:
        return src.replace("inplace=True", "inplace=False")
    if isinstance(stmt, (ast.Expr, ast.Assign)):
        call = stmt.value
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr.endswith("_") \
                and not call.func.attr.startswith("_"):
            receiver = ast.unparse(call.func.value)
            new_call = "%s.%s(%s)" % (receiver, call.func.attr[:-1], ", ".join(
                [ast.unparse(a) for a in call.args] + [ast.unparse(k) for k in call.keywords]))
            if isinstance(stmt, ast.Expr) and re.fullmatch(r"[\w.]+", receiver):
                return "%s = %s" % (receiver, new_call)
            if isinstance(stmt, ast.Assign):
                return "%s = %s" % (" = ".join(ast.unparse(t) for t in stmt.targets), new_call)
    return None


_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Pow: "**", ast.FloorDiv: "//",
        ast.Mod: "%", ast.MatMult: "@", ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^",
        ast.LShift: "<<", ast.RShift: ">>"}


def _replace_name(src: str, name: str, replacement: str) -> str:
    if not re.fullmatch(r"[A-Za-z_]\w*", name or ""):
        return ""
    head, sep, tail = src.partition("+=")
    if sep:
        return head + sep + re.sub(r"\b%s\b" % re.escape(name), replacement, tail)
    return re.sub(r"(?<![\w.])%s\b(?!\s*=[^=])" % re.escape(name), replacement, src)
