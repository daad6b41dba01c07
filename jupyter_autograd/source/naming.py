"""Names read off the user's source: what a statement assigns the result of its last op to
(`d = torch.matmul(x, w1)`), the operands that name the inputs of a statement's only op, what a
statement writes in place, what a call of a user-written module returns to (`fake = G(z)`), and
the module a call line calls (`logits = model(x)`). No torch here: ops are plain records."""
from __future__ import annotations

import ast
import functools
import re
from typing import Dict, List, Optional

from ..model import OpRecord, TraceData
from .alignment import BRANCHING, Alignment, Reading, windows
from .index import parse_statement, without_comment
from .statements import dotted, dunder, same_op
from .statements import element as element_expression

def assignment_targets(trace: TraceData, alignment: Alignment) -> Dict[int, str]:
    """Names read off the source: `d = torch.matmul(x, w1)` names the result of the last op that
    ran for that statement; when it is the only op of the statement, its operands name its inputs
    too; an in-place write names the tensor it writes (`self.freq` in `torch.arange(n, out=self.freq)`)."""
    names: Dict[int, str] = {}
    parsed: Dict[str, tuple] = {}
    ops = trace.ops
    tensors = trace.tensors
    statements = alignment.index

    def give(tid, name, text):
        # A parameter goes by its dotted path, or is described: `self.emb = nn.Embedding(10, 4)` ends
        # with an op on the embedding's weight, which is not what the line calls `self.emb`.
        info = tensors.get(tid)
        if info is not None and info.is_parameter and not _MAKES_PARAMETER.search(text):
            return
        names.setdefault(tid, name)

    units = alignment.units()
    # The next op of the same function: a statement that calls user code (a module's forward written
    # by the user, a forward hook) runs that code's lines in the middle of its own ops, so its last
    # op is the last before the function moves to another statement, not before any other line.
    # Functions are told apart by their code (two `forward`s of one file are two functions).
    later: Dict[tuple, int] = {}
    next_in_function: List[Optional[int]] = [None] * len(ops)
    for i in range(len(ops) - 1, -1, -1):
        unit = units[i]
        if unit is not None:
            next_in_function[i] = later.get(unit[:3])
            later[unit[:3]] = i
    # Calls of user-written modules by statement: when one ends after the statement's last op (a
    # Sequential whose last layer is the user's), what the statement assigns is what the call returned.
    calls_from: Dict[tuple, List[int]] = {}
    for call in trace.calls:
        where = call.location
        calls_from.setdefault(where.function_key + (statements.first_line(where),), []).append(call.first_op)
    previous = None
    for i, op in enumerate(ops):
        unit = units[i]
        if unit is None:
            continue
        prev, previous = previous, unit
        following = next_in_function[i]
        if following is not None and units[following] == unit:
            continue
        text = statements.text(op.location)
        if text not in parsed:
            parsed[text] = _read_statement(text)
        target, callee, operands, element, constructor = parsed[text]
        if constructor is not None and statements.facts(op.location.filename).is_class(constructor):
            target = element = None  # `dist = Categorical(logits=...)` is the object, not the last op's tensor
        if op.writes or op.error is not None:
            written = alignment.written(op)
            if written is not None:
                names.setdefault(*written)
        starts = calls_from.get(unit)
        if starts and any(i < first < (len(ops) if following is None else following) for first in starts):
            continue
        if isinstance(target, _LoopTarget):  # `for row in h.unbind(0):`: each element goes by the loop's name
            if not op.is_backward:
                for tid in op.outputs:
                    give(tid, target.name, text)
        elif isinstance(target, tuple):  # `out, self.hidden = self.rnn(x, self.hidden)`: one name per output
            if len(target) == len(op.outputs) and not op.is_backward:
                for tid, name in zip(op.outputs, target):
                    if name:
                        give(tid, name, text)
        elif target and op.outputs and not op.is_backward:
            give(op.outputs[0], target, text)
        elif element and op.outputs and op.name != "Tensor.__setitem__":  # `stats["loss"] = F.mse_loss(...)`
            give(op.outputs[0], element, text)
        # Operands name inputs only when the statement's call is this very op: `self.emb(ids)` runs
        # F.embedding(ids, weight), whose inputs are not (self, ids).
        if prev != unit and operands is not None and len(operands) == len(op.inputs) and same_op(callee, op.name):
            for tid, name in zip(op.inputs, operands):
                if name:
                    names.setdefault(tid, name)
    # What a user-written module returned, by the statement that called it (`fake = G(z)`: its ops ran
    # at the lines of G.forward, none at this one). After the names above: inside, it has its own.
    for call in trace.calls:
        if call.span is None or not call.outputs:
            continue
        text, first, indent = statements.text(call.location), statements.first_line(call.location), 0
        if first == call.location.line:
            full = trace.source_line(call.location.filename, first)
            indent = len(full.encode("utf-8")) - len(full.lstrip().encode("utf-8"))
        key = (text, first, indent, call.span)
        if key not in parsed:
            parsed[key] = _call_target(text, first, indent, call.span)
        target = parsed[key]
        if isinstance(target, tuple):
            if len(target) == len(call.outputs):
                for tid, name in zip(call.outputs, target):
                    if tid is not None and name:
                        give(tid, name, text)
        elif target and len(call.outputs) == 1 and call.outputs[0] is not None:
            give(call.outputs[0], target, text)
    return names


_MAKES_PARAMETER = re.compile(r"\bParameter\s*\(")


def _call_target(text: str, first_line: int, indent: int, span) -> Optional[object]:
    """The name (or tuple of names) a statement assigns the result of the call at `span` to (lines
    and UTF-8 columns in the file; the statement starts at `first_line`, indented by `indent`), when
    the call is the whole value: `fake = G(z)`, `out, self.hidden = self.rnn(x, self.hidden)`. Else None."""
    tree = parse_statement(text)
    if tree is None or len(tree.body) != 1 or not isinstance(tree.body[0], (ast.Assign, ast.AnnAssign)):
        return None
    stmt = tree.body[0]
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
    value = stmt.value
    if len(targets) != 1 or not isinstance(value, ast.Call):
        return None
    at = (value.lineno + first_line - 1, value.col_offset + (indent if value.lineno == 1 else 0),
          value.end_lineno + first_line - 1, value.end_col_offset + (indent if value.end_lineno == 1 else 0))
    if at != tuple(span):
        return None
    return dotted(targets[0]) or _dotted_tuple(targets[0])


class _LoopTarget(str):
    """The name a `for` line gives, in turn, to each element of what it iterates."""

    @property
    def name(self) -> str:
        return str(self)


def _read_statement(text: str):
    """(assigned name or None, name of its one operation or None, operand names or None, the element
    of a list or dict it stores into or None, the callee of its value when that may be a class or None)."""
    if text.startswith("for ") and text.endswith(":"):
        tree = parse_statement(text + " pass")
        if tree is None:
            return None, None, None, None, None
        loop = tree.body[0]
        name = dotted(loop.target) if isinstance(loop, ast.For) else None
        return (_LoopTarget(name) if name else None), None, None, None, None
    tree = parse_statement(text)
    if tree is None or len(tree.body) != 1:
        return None, None, None, None, None
    stmt = tree.body[0]
    target, value, element = None, None, None
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        # A name or an attribute (`self.hidden = ...`: what the user's code calls it there).
        target = dotted(stmt.targets[0]) or _dotted_tuple(stmt.targets[0])
        value = stmt.value
        if isinstance(stmt.targets[0], ast.Subscript):  # t[i] = v: Tensor.__setitem__(t, i, v); or a dict's item
            element = None if isinstance(value, _NOT_ONE_VALUE) else element_expression(stmt.targets[0], text)
            return None, "__setitem__", _operands([stmt.targets[0].value, stmt.value]), element, _constructor(value)
    elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)) and dotted(stmt.target):
        target = dotted(stmt.target)
        value = stmt.value
        if isinstance(stmt, ast.AugAssign):
            return target, dunder(stmt.op, inplace=True), _operands([stmt.target, stmt.value]), None, None
    elif isinstance(stmt, ast.Expr):
        value = stmt.value
    if isinstance(value, _NOT_ONE_VALUE) and not isinstance(target, tuple):
        target = None  # `scales = [torch.ones(3)]`: the list is `scales`, the tensor in it is not
    return (target,) + _operands_of(value) + (None, _constructor(value))


# Values that are never the result of their statement's last op: containers built on the line.
_NOT_ONE_VALUE = (ast.List, ast.Tuple, ast.Set, ast.Dict, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _constructor(value) -> Optional[str]:
    """The callee of a value that may construct an object, by its capitalised name (`Slot`,
    `torch.distributions.Categorical`), except the classes that make tensors; else None."""
    if not isinstance(value, ast.Call):
        return None
    callee = dotted(value.func)
    last = callee.rpartition(".")[2] if callee else ""
    if not last[:1].isupper() or last.endswith(("Tensor", "Parameter", "Variable", "Buffer")):
        return None
    return callee


def _operands_of(node):
    """(the call's name, operand names) of an expression that is one operation, else (None, None)."""
    if isinstance(node, ast.BinOp):
        return dunder(node.op), _operands([node.left, node.right])
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return "__neg__", _operands([node.operand])
    if isinstance(node, ast.Call) and not node.keywords and isinstance(node.func, ast.Attribute):
        owner = node.func.value
        if isinstance(owner, ast.Name) and owner.id in ("torch", "F", "nn", "np"):
            return node.func.attr, _operands(list(node.args))
        if dotted(owner):  # a method call: the receiver (`x`, `m.weight`) is the first input
            return node.func.attr, _operands([owner] + list(node.args))
    return None, None


def _dotted_tuple(node) -> Optional[tuple]:
    """`h, c` or `out, self.hidden` (a tuple of names or attributes, `_` for one not kept), else None."""
    if not isinstance(node, (ast.Tuple, ast.List)) or not node.elts:
        return None
    names = tuple(dotted(e) for e in node.elts)
    if None in names:
        return None
    return tuple(None if n == "_" else n for n in names)


def _operands(nodes):
    """Names of the tensor-like operands; None when one is an expression we cannot place."""
    out = []
    for n in nodes:
        name = dotted(n)  # `x`, `self.w`: the value of that name or attribute is the operand
        if name:
            out.append(name)
        elif isinstance(n, ast.Constant) or (isinstance(n, ast.UnaryOp) and isinstance(n.operand, ast.Constant)):
            continue  # a Python number (-0.1 too): not among the op's tensor inputs
        else:
            return None
    return out


def callee_of_call(text: str) -> Optional[str]:
    """The module a call expression calls: `dec` for `dec(torch.relu(enc(x)))`, `net.0` for
    `net[0](x)`; None when the text is not one call of a name, an attribute or an element."""
    tree = parse_statement(without_comment(text), mode="eval")
    call = tree.body if tree is not None else None
    if not isinstance(call, ast.Call):
        return None
    callee = _module_path(call.func)
    if not callee or callee.partition(".")[0] in _NOT_MODULES or callee.rpartition(".")[2].endswith("_"):
        return None
    return callee


def _module_path(node) -> Optional[str]:
    """`self.encoder`, `net.0` for `net[0]`: a name with attributes and integer indexes, as dotted
    module paths are written; None for anything else."""
    parts = []
    while True:
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
                and type(node.slice.value) is int and node.slice.value >= 0:
            parts.append(str(node.slice.value))
            node = node.value
        else:
            break
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id] + parts[::-1])


_NOT_MODULES = {"torch", "F", "nn", "np", "math", "len", "print", "float", "int", "sum", "max", "min", "abs",
                "list", "tuple", "range", "zip", "enumerate", "isinstance", "super", "str", "repr", "dict"}


@functools.lru_cache(maxsize=1024)  # the same call line, block after block of a training loop
def single_callee(text: str) -> Optional[str]:
    tree = parse_statement(without_comment(text))
    if tree is None:
        return None
    callees = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            callee = dotted(node.func)
            if callee and callee.partition(".")[0] not in _NOT_MODULES:
                callees.append(callee)
    # `[model(a).sum(), model(b).sum()]` calls one thing twice: it is still one candidate.
    candidates = list(dict.fromkeys(c for c in callees if not c.rpartition(".")[2].endswith("_")))
    return candidates[0] if len(candidates) == 1 else None


def construction(text: str, columns) -> tuple:
    """(the dotted name passed as the module, the dotted name the line assigns to) of the call at
    `columns` ((first, end) UTF-8 columns on the line `text`) that built a wrapper such as
    DistributedDataParallel: `ddp = DDP(model)`; (None, None) when it cannot be read."""
    text = without_comment(text)
    if columns is None or not text.strip():
        return None, None
    indent = len(text.encode("utf-8")) - len(text.lstrip().encode("utf-8"))
    tree = parse_statement(text.strip())
    if tree is None:
        return None, None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and (node.col_offset + indent, node.end_col_offset + indent) == tuple(columns):
            given = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "module"), None)
            target = None
            stmt = tree.body[0] if len(tree.body) == 1 else None
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and stmt.value is node:
                target = dotted(stmt.targets[0])
            return (dotted(given) if given is not None else None), target
    return None, None


def names_at_culprits(trace: TraceData, alignment: Alignment, claims) -> Dict[int, str]:
    """tid -> the expression a culprit line uses for the tensor a diagnosis names, where that is
    certain and goes before the tensor's name. `claims`: (culprit op index, (filename, line) of the
    culprit line, tid), in the diagnoses' order: the first to name a tensor decides. A culprit placed
    at another line than its op's (the line that called a module) names nothing."""
    renamed = {}
    for op_index, where, tid in claims:
        op = trace.ops[op_index] if op_index is not None and op_index < len(trace.ops) else None
        if op is None or op.location is None or where != (op.location.filename, op.location.line):
            continue
        if tid is None or tid not in trace.tensors or tid in renamed:
            continue
        info = trace.tensors[tid]
        if info.is_parameter:  # a parameter goes by its dotted path
            continue
        name = spelled(trace, alignment, op, tid)
        if name is None or name == info.name:
            continue
        if info.is_buffer and name.isidentifier():
            continue  # a module's buffer by a loop's name for it (`for buf in bn.buffers()`): its path says more
        if info.by_variable and _indexed_by_a_variable(name):
            continue  # `xs[i]` says less than the variable of the user's that holds it
        renamed[tid] = name
    return renamed


def _indexed_by_a_variable(expression: str) -> bool:
    """Whether an expression picks its tensor by an index that is not written out (`xs[i]`, `d[key]`)."""
    tree = parse_statement(expression)
    return tree is not None and any(isinstance(node, ast.Subscript) and not isinstance(node.slice, ast.Constant)
                                    for node in ast.walk(tree))


def spelled(trace: TraceData, alignment: Alignment, op: OpRecord, tid: int) -> Optional[str]:
    """The expression op's statement uses for tensor `tid`, which the op wrote, made or took, when
    certain; else None."""
    text = alignment.text(op.location)
    tree = parse_statement(text)
    if tree is None or len(tree.body) != 1 or any(isinstance(node, BRANCHING) for node in ast.walk(tree)):
        return None
    stmt = tree.body[0]
    nearby = alignment.same_statement(op)
    written = alignment.written(op)
    if written is not None and written[0] == tid:
        return written[1]
    reading = Reading(stmt, text)
    if not reading.nodes:
        return None
    said = set()
    for window in windows(nearby, op, len(reading.nodes)):
        readings = reading.alignments(window)
        if readings is None:
            return None
        for matched in readings:
            if not reading.consistent(window, matched):
                continue
            said.add(reading.name_of(op, matched[op.index], tid, window, matched))
            if len(said) > 1:
                return None
    return said.pop() if said else None
