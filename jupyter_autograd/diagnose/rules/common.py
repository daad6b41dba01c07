"""What several rule families read of a trace the same way."""
from __future__ import annotations

import ast
import re
from typing import List, Optional

from ...model import GRAD_MODE_SWITCHES, Checkpoint, Location, OpRecord, TraceData
from ...model.queries import at_maker, engine_order
from ...source.index import without_comment
from ...source.naming import single_callee
from ...source.statements import dotted

# Ops whose only purpose is to drop the graph.
STOP_GRADIENT = {"detach", "detach_", "data"}
# A sum or difference of two values (a term added to a loss), by the op's short name.
ADDS = {"add", "add_", "sub", "sub_", "rsub", "__add__", "__radd__", "__iadd__", "__sub__", "__rsub__", "__isub__"}


def name(trace: TraceData, tid: Optional[int]) -> Optional[str]:
    """The tensor's name, or None (never a description)."""
    info = trace.tensors.get(tid) if tid is not None else None
    return info.name if info is not None else None


def label(trace: TraceData, tid: Optional[int]) -> Optional[str]:
    """The tensor's name, or a description of it; None for no recorded tensor."""
    return trace.tensor_label(tid) if tid is not None and tid in trace.tensors else None


def backward_checkpoints(trace: TraceData) -> List[Checkpoint]:
    return [cp for cp in trace.checkpoints if cp.kind == "backward" and cp.op_index < len(trace.ops)]



# -- the errors PyTorch raises ----------------------------------------------------------------------

def raised(error: str, whole: bool = False) -> str:
    """The words of the error as PyTorch wrote them: its first line, or of a long one (DDP's run to
    hundreds of words) its first sentence, unless the whole line is wanted."""
    line = error.split(": ", 1)[-1].split("\n")[0].strip()
    if whole or len(line) <= 240 or ". " not in line:
        return line
    return line[:line.index(". ") + 1]


def shown(label: Optional[str]) -> str:
    """A label in backticks when it is a name the user's code has, as it is when it describes."""
    return "`%s`" % label if label and re.fullmatch(r"[A-Za-z_]\w*(?:\.\w+)*", label) else (label or "")


def in_backticks(names, limit: int = 8) -> str:
    """Up to `limit` names, each in backticks, then how many more there are: `a`, `b` and 3 more."""
    said = ["`%s`" % n for n in names[:limit] if n]
    return ", ".join(said) + (" and %d more" % (len(names) - limit) if len(names) > limit else "")


def op_words(op: OpRecord, missing: str = "") -> str:
    """An op's name for a sentence: `torch.unique`; an op whose function has no name of its own (a
    dispatching wrapper) by PyTorch's internal name for it."""
    if "<" in op.name:
        return "PyTorch's `%s`" % missing if missing else "an operation"
    return "`%s`" % op.name


def made(trace: TraceData, tid: Optional[int]) -> Optional[OpRecord]:
    """The op that made a tensor, at its own line: the innermost line of the user's, where a fix goes."""
    info = trace.tensors.get(tid) if tid is not None else None
    if info is None or info.created_by is None or info.created_by >= len(trace.ops):
        return None
    return trace.ops[info.created_by]


def maker(trace: TraceData, tid: Optional[int]) -> Optional[OpRecord]:
    """The op that made a tensor, at the line that called the user-written module which returned it."""
    return at_maker(trace, tid, made(trace, tid))


def nodes_run(trace: TraceData, op: OpRecord) -> List[int]:
    """The nodes the backward call `op` runs, in the engine's order ([] when it was not walked)."""
    cp = next((cp for cp in trace.checkpoints if cp.kind == "backward" and cp.op_index == op.index), None)
    return engine_order(trace, cp) if cp is not None else []


def plain_node_name(name: str) -> str:
    """`Unique2Backward0`, `_unique2` and `Unique2` alike: how PyTorch's messages and nodes spell an op."""
    return re.sub(r"Backward\d*$", "", name).replace("_", "").lower()


def node_made(trace: TraceData, key: Optional[int]) -> Optional[OpRecord]:
    node = trace.nodes.get(key) if key is not None else None
    if node is None or node.created_by is None or node.created_by >= len(trace.ops):
        return None
    return trace.ops[node.created_by]


def output_of(op: Optional[OpRecord]) -> Optional[int]:
    return op.outputs[0] if op is not None and op.outputs else None


# -- where grad was switched off --------------------------------------------------------------------

def grad_off_decorator(trace: TraceData, source, op: OpRecord) -> Optional[Location]:
    """For an op that ran with grad off inside a call of a function decorated with `@torch.no_grad()`,
    `@torch.inference_mode()` or `@torch.set_grad_enabled(False)`: the decorator's line, where grad
    was switched off. torch's wrapper switches the mode at the line that calls the function and
    back when it returns, so the recorded switch is that call line (no `with` statement); the
    function is one that ran ops between the switch and `op` (its code's first line is its first
    decorator's), or the one the call line calls. None otherwise."""
    if op.grad_enabled or op.location is None or source is None:
        return None
    switch = next((o for o in reversed(trace.ops[:op.index]) if o.name in GRAD_MODE_SWITCHES), None)
    if switch is None or switch.grad_enabled or switch.location is None \
            or switch.location.source.startswith(("with ", "async with ")):
        return None
    ran = [(o.location.filename, o.location.scope) for o in trace.ops[switch.index + 1:op.index + 1]
           if o.location is not None and o.location.scope]
    for filename, first in dict.fromkeys(ran):
        found = _decorated(source, filename, lambda fn: first_line(fn) == first)
        if found is not None:
            return found
    callee = single_callee(switch.location.source)
    if callee is None:
        return None
    name = callee.rpartition(".")[2]
    found = [f for f in (_decorated(source, filename, lambda fn: fn.name == name, unique=True)
                         for filename, _ in source.index.trees()) if f is not None]
    return found[0] if len(found) == 1 else None


def line_text(source, filename: str, line: int) -> str:
    """The code of a line of the user's source, without its comment."""
    return without_comment(source.index.line(filename, line)).strip()


def first_line(function) -> int:
    """The first line of a function's definition: its first decorator's, where it has one."""
    return min([function.lineno] + [d.lineno for d in function.decorator_list])


def _decorated(source, filename: str, wanted, unique: bool = False) -> Optional[Location]:
    """The grad-off decorator of the function of `filename` that `wanted` picks (of the only one, with
    `unique`), as a Location."""
    tree = source.index.tree(filename)
    if tree is None:
        return None
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and wanted(n)]
    if not functions or (unique and len(functions) > 1):
        return None
    function = functions[0]
    decorator = next((d for d in function.decorator_list if _switches_grad_off(d)), None)
    if decorator is None:
        return None
    return Location(filename, decorator.lineno, function.name, line_text(source, filename, decorator.lineno),
                    first_line(function))


def _switches_grad_off(decorator) -> bool:
    """`@torch.no_grad()`, `@torch.no_grad`, `@torch.inference_mode()`, `@torch.set_grad_enabled(False)`."""
    call = decorator if isinstance(decorator, ast.Call) else None
    name = (dotted(call.func) if call is not None else dotted(decorator)) or ""
    short = name.rpartition(".")[2]
    args = call.args if call is not None else []
    if short == "no_grad":
        return True
    if short == "inference_mode":
        return not args or (isinstance(args[0], ast.Constant) and args[0].value is True)
    return short == "set_grad_enabled" and len(args) == 1 and isinstance(args[0], ast.Constant) and args[0].value is False
